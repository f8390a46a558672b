//! Leadership routes (cluster.md §9.6): the shed state (`GET /__ursula/leadership-shed`, any
//! plane), the maintenance mark (`POST`/`DELETE /__ursula/leadership-shed/maintenance`, admin
//! plane) and a leadership transfer (`POST /__ursula/raft/{group}/leader/transfer/{node}`,
//! admin plane).

use super::ApiResult;
use super::error::ApiError;
use crate::app::App;
use axum::body::Body;
use http::{HeaderValue, Response, StatusCode};
use std::time::Duration;
use ursula_core::ErrorCode;
use ursula_raft::{ShedState, TransferError, shed};

/// How long a transfer request waits for the hand-over.
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(10);

fn json(status: StatusCode, body: serde_json::Value) -> ApiResult {
    let mut r = Response::new(Body::from(body.to_string()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/json"));
    Ok(r)
}

fn shed_body(st: ShedState) -> serde_json::Value {
    serde_json::json!({
        "bits": st.bits,
        "state": st.state(),
        "should_accept_transfer": st.should_accept_transfer(),
        "should_campaign": st.should_campaign(),
        "should_shed_current_leaders": st.should_shed_current_leaders(),
    })
}

/// `GET /__ursula/leadership-shed`.
pub fn shed_state(app: &App) -> ApiResult {
    json(StatusCode::OK, shed_body(app.node.shed_state()))
}

/// `POST` (`on`) or `DELETE` `/__ursula/leadership-shed/maintenance`. Marking hands this
/// node's leaderships away in the background (the balancer's next tick does it too).
pub fn maintenance(app: &App, on: bool) -> ApiResult {
    let st = app.node.set_shed(shed::MAINTENANCE, on);
    tracing::info!(on, state = st.state(), "maintenance mark changed");
    if on && app.node.has_peers() {
        let node = app.node.clone();
        tokio::spawn(async move {
            let left = node
                .shed_leaderships(crate::governance::SHUTDOWN_HANDOVER)
                .await;
            tracing::info!(still_led = left.len(), "maintenance drain pass done");
        });
    }
    json(StatusCode::OK, shed_body(st))
}

/// `POST /__ursula/raft/{group}/leader/transfer/{node}`.
pub async fn transfer(app: &App, group: &str, node: &str) -> ApiResult {
    let group = super::admin_raft::group_id(app, group)?;
    let target: u64 = node.parse().map_err(|_| {
        ApiError::new(
            ErrorCode::INVALID_ADMIN_TARGET,
            format!("node {node:?} is not a number"),
        )
    })?;
    match app
        .node
        .transfer_leader(group, target, TRANSFER_TIMEOUT)
        .await
    {
        Ok(leader) => json(
            StatusCode::OK,
            serde_json::json!({ "raft_group_id": group, "leader": leader }),
        ),
        Err(TransferError::NotLeader { leader }) => {
            Ok(super::admin_raft::not_leader(app, group, leader))
        }
        Err(e @ TransferError::NotVoter(_)) => {
            Err(ApiError::new(ErrorCode::NOT_A_VOTER, e.to_string()))
        }
        Err(e @ TransferError::Refused { .. }) => {
            Err(ApiError::new(ErrorCode::TRANSFER_REFUSED, e.to_string()))
        }
        Err(e @ TransferError::Timeout { .. }) => {
            Err(ApiError::new(ErrorCode::LEADER_UNAVAILABLE, e.to_string()))
        }
        Err(e @ TransferError::NoSuchGroup(_)) => Err(ApiError::new(
            ErrorCode::INVALID_ADMIN_TARGET,
            e.to_string(),
        )),
    }
}
