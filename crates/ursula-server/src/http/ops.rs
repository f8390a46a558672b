//! Operational routes on the client plane: metrics and health.

use super::{ApiResult, not_found};
use crate::app::App;
use axum::body::Body;
use http::{HeaderValue, Method, Response};
use std::sync::Arc;

pub async fn handle(app: &Arc<App>, method: &Method, segs: &[String]) -> ApiResult {
    if method != Method::GET && method != Method::HEAD {
        return Err(not_found());
    }
    let path: Vec<&str> = segs.iter().map(String::as_str).collect();
    let groups = u64::from(app.node.group_count());
    let streams: u64 = (0..app.node.group_count())
        .map(|g| app.with_group(g, |gs| gs.streams.len() as u64))
        .sum();
    let watched = app.watchers.watched_streams() as u64;
    let extra = [
        ("ursula_streams", "gauge", streams),
        ("ursula_raft_groups", "gauge", groups),
        ("ursula_live_watched_streams", "gauge", watched),
        (
            "ursula_wal_syncs_total",
            "counter",
            app.node.wal_sync_count(),
        ),
        ("ursula_wal_disk_bytes", "gauge", app.node.wal_disk_bytes()),
    ];
    let (body, ct) = match path.as_slice() {
        ["metrics"] => (app.metrics.json(&extra).to_string(), "application/json"),
        ["metrics", "prometheus"] => (app.metrics.prometheus(&extra), "text/plain; version=0.0.4"),
        ["health"] | ["ready"] => (r#"{"status":"ok"}"#.to_owned(), "application/json"),
        _ => return Err(not_found()),
    };
    let mut r = Response::new(Body::from(body));
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static(ct));
    Ok(r)
}
