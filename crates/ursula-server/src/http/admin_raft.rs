//! Admin-plane Raft operations (cluster.md §5.3, §9.6):
//! `POST /__ursula/raft/{group}/snapshot` snapshots a group on this node, and
//! `POST /__ursula/raft/{group}/nodes/{node}/allow-next-revert` on a group's leader lets a
//! wiped node take part in the group again (see `ursula-raft/src/node/rejoin.rs`).
//!
//! `200 {"raft_group_id", "node", "commit_index", "state"}` (`state`: `armed`,
//! `rehydrating`, or `not-awaiting` when the node needed nothing); `409 NOT_LEADER` naming the
//! leader on a non-leader; `400 INVALID_ADMIN_TARGET` for a group or node that is not one;
//! `503 LEADER_UNAVAILABLE` when the wiped node did not take the permission.

use super::ApiResult;
use super::error::ApiError;
use crate::app::App;
use axum::body::Body;
use http::{HeaderValue, Response, StatusCode};
use std::sync::Arc;
use std::time::Duration;
use ursula_core::ErrorCode;
use ursula_raft::AllowError;

/// How long `POST /__ursula/raft/{group}/snapshot` waits for the snapshot.
const SNAPSHOT_WAIT: Duration = Duration::from_secs(30);

/// Whether `segs` (the path after `/__ursula/`) is a route of this file (method `POST`).
pub fn handles(segs: &[String]) -> bool {
    matches!(segs, [r, _, n, _, a] if r == "raft" && n == "nodes" && a == "allow-next-revert")
        || matches!(segs, [r, _, s] if r == "raft" && s == "snapshot")
}

/// A group id of this node's groups, from a path segment.
pub fn group_id(app: &App, raw: &str) -> Result<u32, ApiError> {
    let bad = |m: String| ApiError::new(ErrorCode::INVALID_ADMIN_TARGET, m);
    let group: u32 = raw
        .parse()
        .map_err(|_| bad(format!("raft group {raw:?} is not a number")))?;
    if group >= app.node.group_count() {
        return Err(bad(format!(
            "no raft group {group} (there are {})",
            app.node.group_count()
        )));
    }
    Ok(group)
}

/// `409 NOT_LEADER` naming the leader (also as `X-Ursula-Raft-Leader-Id`).
pub fn not_leader(app: &App, group: u32, leader: Option<u64>) -> Response<Body> {
    let msg = match leader {
        Some(l) => format!(
            "node {} does not lead raft group {group}; node {l} does",
            app.node.node_id()
        ),
        None => format!(
            "node {} does not lead raft group {group}; no leader is known (retry)",
            app.node.node_id()
        ),
    };
    let mut r = super::error::render(ApiError::new(ErrorCode::NOT_LEADER, msg));
    if let Some(l) = leader
        && let Ok(v) = HeaderValue::from_str(&l.to_string())
    {
        r.headers_mut().insert("x-ursula-raft-leader-id", v);
    }
    r
}

pub async fn handle(app: &Arc<App>, segs: &[String]) -> ApiResult {
    if let [_, group, _] = segs {
        return snapshot(app, group).await;
    }
    let (Some(group), Some(node)) = (segs.get(1), segs.get(3)) else {
        return Err(super::not_found());
    };
    let group = group_id(app, group)?;
    let Ok(node) = node.parse::<u64>() else {
        return Err(ApiError::new(
            ErrorCode::INVALID_ADMIN_TARGET,
            format!("node {node:?} is not a number"),
        ));
    };
    match app.node.allow_next_revert(group, node).await {
        Ok(a) => Ok(json(
            StatusCode::OK,
            serde_json::json!({
                "raft_group_id": group, "node": node,
                "commit_index": a.commit_index, "state": a.state,
            }),
        )),
        Err(AllowError::NotLeader(leader)) => Ok(not_leader(app, group, leader)),
        Err(e @ (AllowError::BadNode(_) | AllowError::NoSuchGroup(_))) => Err(ApiError::new(
            ErrorCode::INVALID_ADMIN_TARGET,
            e.to_string(),
        )),
        Err(AllowError::Unavailable(m)) => Err(ApiError::new(
            ErrorCode::LEADER_UNAVAILABLE,
            format!("node {node} did not take the permission: {m}"),
        )),
    }
}

/// `POST /__ursula/raft/{group}/snapshot`: a Raft snapshot of the group covering everything
/// it applied, on this node (any role); `200 {"raft_group_id", "snapshot_index"}`.
async fn snapshot(app: &Arc<App>, group: &str) -> ApiResult {
    let group = group_id(app, group)?;
    let upto = *app.node.applied(group).borrow();
    match app.node.snapshot_covering(group, upto, SNAPSHOT_WAIT).await {
        Some(index) => Ok(json(
            StatusCode::OK,
            serde_json::json!({ "raft_group_id": group, "snapshot_index": index }),
        )),
        None => Err(ApiError::new(
            ErrorCode::STORAGE_UNAVAILABLE,
            format!(
                "no snapshot of raft group {group} covered index {upto} within {SNAPSHOT_WAIT:?}"
            ),
        )),
    }
}

fn json(status: StatusCode, v: serde_json::Value) -> Response<Body> {
    let mut r = Response::new(Body::from(v.to_string()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/json"));
    r
}
