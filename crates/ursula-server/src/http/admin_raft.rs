//! Admin-plane Raft operations of node replacement (cluster.md §5.3, §9.6):
//! `POST /__ursula/raft/{group}/nodes/{node}/allow-next-revert` on a group's leader lets a
//! wiped node take part in the group again (see `ursula-raft/src/node/rejoin.rs`).
//!
//! `200 {"raft_group_id", "node", "commit_index", "state"}` (`state`: `armed`,
//! `rehydrating`, or `not-awaiting` when the node needed nothing); `409 NOT_LEADER` naming the
//! leader on a non-leader; `400` for a group or node that is not one; `503` when the wiped
//! node did not take the permission.

use super::ApiResult;
use crate::app::App;
use axum::body::Body;
use http::{HeaderValue, Response, StatusCode};
use std::sync::Arc;
use ursula_raft::AllowError;

/// Whether `segs` (the path after `/__ursula/`) is a route of this file (method `POST`).
pub fn handles(segs: &[String]) -> bool {
    matches!(segs, [r, _, n, _, a] if r == "raft" && n == "nodes" && a == "allow-next-revert")
}

pub async fn handle(app: &Arc<App>, segs: &[String]) -> ApiResult {
    let (Some(group), Some(node)) = (segs.get(1), segs.get(3)) else {
        return Ok(json_error(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            "no such route",
        ));
    };
    let Ok(group) = group.parse::<u32>() else {
        return Ok(bad(format!("raft group {group:?} is not a number")));
    };
    let Ok(node) = node.parse::<u64>() else {
        return Ok(bad(format!("node {node:?} is not a number")));
    };
    if group >= app.node.group_count() {
        return Ok(bad(format!(
            "no raft group {group} (there are {})",
            app.node.group_count()
        )));
    }
    Ok(match app.node.allow_next_revert(group, node).await {
        Ok(a) => json(
            StatusCode::OK,
            serde_json::json!({
                "raft_group_id": group, "node": node,
                "commit_index": a.commit_index, "state": a.state,
            }),
        ),
        Err(AllowError::NotLeader(leader)) => {
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
            let mut r = json_error(StatusCode::CONFLICT, "NOT_LEADER", &msg);
            if let Some(l) = leader
                && let Ok(v) = HeaderValue::from_str(&l.to_string())
            {
                r.headers_mut().insert("x-ursula-raft-leader-id", v);
            }
            r
        }
        Err(e @ (AllowError::BadNode(_) | AllowError::NoSuchGroup(_))) => bad(e.to_string()),
        Err(AllowError::Unavailable(m)) => json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "LEADER_UNAVAILABLE",
            &format!("node {node} did not take the permission: {m}"),
        ),
    })
}

fn bad(msg: String) -> Response<Body> {
    json_error(StatusCode::BAD_REQUEST, "BAD_REQUEST", &msg)
}

fn json_error(status: StatusCode, code: &str, message: &str) -> Response<Body> {
    json(
        status,
        serde_json::json!({"error": {"code": code, "message": message}}),
    )
}

fn json(status: StatusCode, v: serde_json::Value) -> Response<Body> {
    let mut r = Response::new(Body::from(v.to_string()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/json"));
    r
}
