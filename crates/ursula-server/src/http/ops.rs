//! Operational routes on the client plane: metrics, liveness and readiness.

use super::{ApiResult, not_found};
use crate::app::App;
use crate::raft_metrics;
use axum::body::Body;
use http::{HeaderValue, Method, Response, StatusCode};
use std::sync::Arc;
use ursula_core::cold::GroupSizes;

pub async fn handle(app: &Arc<App>, method: &Method, segs: &[String]) -> ApiResult {
    if method != Method::GET && method != Method::HEAD {
        return Err(not_found());
    }
    let path: Vec<&str> = segs.iter().map(String::as_str).collect();
    let (status, body, ct) = match path.as_slice() {
        ["metrics"] => {
            let sizes = group_sizes(app);
            let mut j = app.metrics.json(&extra_metrics(app, &sizes));
            let rows = raft_metrics::rows_with_committed(app).await;
            j["raft_group_count"] = rows.len().into();
            j["wal_backend"] = "disk".into();
            j["raft_groups"] = raft_metrics::spec_json(&rows);
            j["raft_group_metrics"] = raft_metrics::json(&rows);
            j["rejoin"] = raft_metrics::rejoin_json(&app.node);
            j["raft_rpc"] = raft_metrics::rpc_json(&app.node);
            j["cluster_probe"] = app.governance.probes.json();
            j["cold_store"] = crate::cold::describe(&app.cfg);
            j["hot_bytes_by_group"] = sizes
                .iter()
                .zip(0u32..)
                .map(|(s, group)| serde_json::json!({"group": group, "hot_bytes": s.hot_bytes}))
                .collect();
            for (k, v) in app.latency.json() {
                j[k] = v;
            }
            (StatusCode::OK, j.to_string(), "application/json")
        }
        ["metrics", "prometheus"] => {
            let sizes = group_sizes(app);
            (
                StatusCode::OK,
                app.metrics.prometheus(&extra_metrics(app, &sizes))
                    + &raft_metrics::prometheus(&raft_metrics::rows(app))
                    + &raft_metrics::rpc_prometheus(&app.node)
                    + &app.governance.probes.prometheus()
                    + &app.latency.prometheus()
                    + &hot_prometheus(&sizes),
                "text/plain; version=0.0.4",
            )
        }
        ["health"] => (
            StatusCode::OK,
            r#"{"status":"ok"}"#.to_owned(),
            "application/json",
        ),
        ["ready"] => ready(app),
        ["leadership-shed"] => return super::leadership::shed_state(app),
        _ => return Err(not_found()),
    };
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static(ct));
    Ok(r)
}

/// Each group's sizes, from one short read of its state per scrape.
fn group_sizes(app: &App) -> Vec<GroupSizes> {
    (0..app.node.group_count())
        .map(|g| app.with_group(g, |gs| gs.sizes()))
        .collect()
}

fn hot_prometheus(sizes: &[GroupSizes]) -> String {
    let mut out = String::from(
        "# HELP ursula_group_hot_bytes bytes a group holds in memory, not yet in the cold tier\n\
         # TYPE ursula_group_hot_bytes gauge\n",
    );
    for (s, g) in sizes.iter().zip(0u32..) {
        out.push_str(&format!(
            "ursula_group_hot_bytes{{group=\"{g}\"}} {}\n",
            s.hot_bytes
        ));
    }
    out
}

/// Why this node cannot do its job right now (cluster.md §9.2); empty when it can. Reads only
/// flags and Raft metrics: it never waits on storage.
pub fn not_ready_reasons(app: &App) -> Vec<String> {
    let mut reasons = app.node.storage_health().reasons();
    for g in app.node.leaderless_groups() {
        reasons.push(format!("raft group {g} has no known leader"));
    }
    reasons.extend(raft_metrics::rejoin_reasons(&app.node));
    if let Some(t) = &app.tiering
        && let Some(r) = t.health.reason()
    {
        reasons.push(format!("cold store unhealthy: {r}"));
    }
    if let Some(r) = app.governance.probes.reason() {
        reasons.push(r);
    }
    if let Some(r) = app.governance.cold.reason() {
        reasons.push(r);
    }
    if *app.shutdown.borrow() {
        reasons.push("shutting down".to_owned());
    }
    reasons
}

/// `GET /__ursula/ready`: `200 {"status":"ready"}`, or `503` with every reason (OQ-108).
fn ready(app: &App) -> (StatusCode, String, &'static str) {
    let reasons = not_ready_reasons(app);
    if reasons.is_empty() {
        return (
            StatusCode::OK,
            r#"{"status":"ready"}"#.to_owned(),
            "application/json",
        );
    }
    let body = serde_json::json!({ "status": "not_ready", "reasons": reasons }).to_string();
    (StatusCode::SERVICE_UNAVAILABLE, body, "application/json")
}

/// Metrics read at scrape time: sizes, and one gauge or counter per storage fault.
fn extra_metrics(app: &App, sizes: &[GroupSizes]) -> Vec<(&'static str, &'static str, u64)> {
    let groups = u64::from(app.node.group_count());
    let streams: u64 = sizes.iter().map(|s| s.streams).sum();
    let watched = app.watchers.watched_streams() as u64;
    let health = app.node.storage_health();
    let faults = health.counts();
    let reasons = not_ready_reasons(app);
    let snapshot_failing = reasons
        .iter()
        .filter(|r| r.starts_with("snapshot write"))
        .count() as u64;
    let mut out = vec![
        ("ursula_streams", "gauge", streams),
        (
            "ursula_raft_uncommitted_bytes",
            "gauge",
            app.uncommitted.held(),
        ),
        (
            "ursula_raft_uncommitted_backpressure_total",
            "counter",
            app.uncommitted.refused(),
        ),
        (
            "ursula_process_rss_bytes",
            "gauge",
            crate::memory::rss_bytes().unwrap_or(0),
        ),
        (
            "ursula_node_memory_abort_cap_bytes",
            "gauge",
            app.cfg.runtime.node_memory_abort_cap_size.unwrap_or(0),
        ),
        ("ursula_raft_groups", "gauge", groups),
        ("ursula_live_watched_streams", "gauge", watched),
        (
            "ursula_http_inflight_body_bytes",
            "gauge",
            app.body_budget.used(),
        ),
        (
            "ursula_wal_syncs_total",
            "counter",
            app.node.wal_sync_count(),
        ),
        ("ursula_wal_disk_bytes", "gauge", app.node.wal_disk_bytes()),
        (
            "ursula_wal_segments_reused_total",
            "counter",
            app.node.wal_segments_reused(),
        ),
        ("ursula_ready", "gauge", u64::from(reasons.is_empty())),
        (
            "ursula_storage_failed",
            "gauge",
            u64::from(health.failed().is_some()),
        ),
        ("ursula_disk_full", "gauge", u64::from(health.disk_full())),
        ("ursula_snapshot_failing_groups", "gauge", snapshot_failing),
        (
            "ursula_raft_groups_without_leader",
            "gauge",
            app.node.leaderless_groups().len() as u64,
        ),
        (
            "ursula_raft_groups_led",
            "gauge",
            app.node.led_groups().len() as u64,
        ),
        ("ursula_raft_node_id", "gauge", app.node.node_id()),
        (
            "ursula_commit_stall_transfers_total",
            "counter",
            app.governance.commit_stall_transfers(),
        ),
        (
            "ursula_cold_health_gate_unhealthy",
            "gauge",
            u64::from(app.governance.cold.unhealthy()),
        ),
        (
            "ursula_cold_hot_backlog",
            "gauge",
            u64::from(app.governance.cold.backlog()),
        ),
        (
            "ursula_cluster_egress_unhealthy",
            "gauge",
            u64::from(app.governance.probes.unhealthy()),
        ),
        (
            "ursula_leadership_shed_bits",
            "gauge",
            u64::from(app.node.shed_state().bits),
        ),
        (
            "ursula_raft_groups_awaiting_permission",
            "gauge",
            app.node.groups_awaiting_permission().len() as u64,
        ),
        (
            "ursula_raft_groups_rehydrating",
            "gauge",
            app.node.groups_rehydrating().len() as u64,
        ),
        (
            "ursula_raft_voters",
            "gauge",
            app.node.peers().len().max(1) as u64,
        ),
        (
            "ursula_wal_sync_failures_total",
            "counter",
            faults.sync_failures,
        ),
        (
            "ursula_wal_write_failures_total",
            "counter",
            faults.write_failures,
        ),
        ("ursula_disk_full_events_total", "counter", faults.no_space),
        (
            "ursula_snapshot_write_failures_total",
            "counter",
            faults.snapshot_failures,
        ),
    ];
    if let Some(t) = &app.tiering {
        out.extend(t.metrics(sizes));
    }
    out
}
