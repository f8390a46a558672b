//! Retention routes (extensions.md §7): `PUT .../retention/{offset}` and
//! `PUT .../retention?record=n`. Every rule runs in the state machine; this layer checks
//! syntax and renders the answer.

use super::error::ApiError;
use super::snapshot::{path_offset, put_records, record_query};
use super::{ApiResult, headers as h, method_not_allowed, not_found, render};
use crate::app::App;
use axum::body::Body;
use http::{Method, Request, StatusCode};
use std::sync::Arc;
use std::time::Duration;
use ursula_core::ErrorCode;
use ursula_core::command::{At, Op, Reply};

/// A retention that freed at least this much asks for a Raft snapshot of its group at once,
/// so the log (and then the WAL on disk) sheds the trimmed appends without waiting for the
/// regular snapshot policy.
const COMPACT_AFTER_FREED_BYTES: u64 = 1 << 20;
/// How long, and how often, to ask until a snapshot covers the retention.
const COMPACT_DEADLINE: Duration = Duration::from_secs(60);

pub async fn handle(
    app: &Arc<App>,
    target: &super::path::Target,
    rest: &[String],
    req: Request<Body>,
) -> ApiResult {
    if rest.len() > 1 {
        return Err(not_found());
    }
    if req.method() != Method::PUT {
        return Err(method_not_allowed("PUT, OPTIONS"));
    }
    let at = match rest.first() {
        Some(o) => At::Offset(path_offset(o)?),
        None => At::Record(record_query(req.uri().query())?),
    };
    let incarnation = h::incarnation(req.headers())?;
    let op = Op::Retain {
        key: target.key.clone(),
        at,
        incarnation,
    };
    let group = app.group_of(&target.key);
    let Reply::Retained(r) = app.propose(group, op).await? else {
        return Err(ApiError::new(
            ErrorCode::INTERNAL_ERROR,
            "unexpected reply to a retention request",
        ));
    };
    if r.freed_bytes >= COMPACT_AFTER_FREED_BYTES {
        compact_soon(app, group);
    }
    let mut resp = render::empty(StatusCode::NO_CONTENT);
    let hm = resp.headers_mut();
    h::put_off(hm, &h::STREAM_RETAINED_OFFSET, r.retained);
    h::put_incarnation(hm, r.incarnation);
    put_records(hm, r.json, r.record_first, r.record_next);
    Ok(resp)
}

/// Asks, in the background, for a Raft snapshot of `group` that covers everything applied
/// so far (the retention's own entry included: the state machine's applied index counts it
/// before the client gets its answer). After the snapshot, openraft purges the log behind it
/// and WAL upkeep deletes the segments nothing pins.
fn compact_soon(app: &Arc<App>, group: u32) {
    let node = Arc::clone(&app.node);
    let upto = *app.node.applied(group).borrow();
    tokio::spawn(async move {
        if node
            .snapshot_covering(group, upto, COMPACT_DEADLINE)
            .await
            .is_none()
        {
            tracing::warn!(group, upto, "no snapshot covered a retention in time");
        }
    });
}
