//! Per-group Raft metrics (cluster.md §13, issue 13): for every group this node runs, its
//! role, term, leader, log and apply positions, and on a leader the replication lag of each
//! peer. Prometheus gets them with `group` (and `peer`) labels; the JSON metrics the
//! `raft_groups` array of cluster.md §9.1 (what `ursulactl` reads) and the older, terser
//! `raft_group_metrics` array. `elections` counts the terms a group began since the process started.

use crate::app::App;
use std::fmt::Write;
use std::time::Duration;
use ursula_raft::GroupMetrics as GroupRow;

/// How long the JSON metrics wait for each group's Raft core to say what it has committed
/// (they ask every group at once); a core that does not answer in time reports its last
/// applied entry instead, a lower bound.
const COMMITTED_WAIT: Duration = Duration::from_millis(50);

/// Every group's metrics, from the Raft facade.
pub fn rows(app: &App) -> Vec<GroupRow> {
    (0..app.node.group_count())
        .map(|g| app.node.group_metrics(g))
        .collect()
}

/// [`rows`] with each group's committed entry filled in, asked of every group concurrently.
pub async fn rows_with_committed(app: &App) -> Vec<GroupRow> {
    let mut rows = rows(app);
    let asks = rows
        .iter()
        .map(|r| app.node.group_committed(r.group, COMMITTED_WAIT));
    let committed = futures::future::join_all(asks).await;
    for (r, c) in rows.iter_mut().zip(committed) {
        // Applied entries are committed: never report less than that.
        r.committed_id = c.max(r.applied_id);
    }
    rows
}

/// A per-group gauge: name, help, value (if the group has one).
type Gauge = (&'static str, &'static str, fn(&GroupRow) -> Option<u64>);

/// The rows in the Prometheus text format.
pub fn prometheus(rows: &[GroupRow]) -> String {
    let mut out = String::new();
    let gauges: [Gauge; 9] = [
        (
            "ursula_raft_group_role",
            "0 follower, 1 candidate, 2 leader, 3 learner, 4 shut down",
            |r| Some(r.role),
        ),
        ("ursula_raft_group_term", "current term", |r| Some(r.term)),
        (
            "ursula_raft_group_elections",
            "terms begun since this process started (elections, won or not)",
            |r| Some(r.elections),
        ),
        (
            "ursula_raft_group_leader",
            "leader's node id (0: none)",
            |r| Some(r.leader),
        ),
        (
            "ursula_raft_group_last_log_index",
            "entries in the log",
            |r| Some(r.last_log),
        ),
        (
            "ursula_raft_group_commit_lag",
            "entries logged but not yet applied",
            |r| Some(r.last_log.saturating_sub(r.last_applied)),
        ),
        (
            "ursula_raft_group_quorum_ack_age_ms",
            "leader only: ms since a quorum acknowledged it",
            |r| r.since_quorum_ack_ms,
        ),
        (
            "ursula_raft_group_snapshot_bytes",
            "bytes of the group's latest snapshot file",
            |r| Some(r.snapshot_bytes),
        ),
        (
            "ursula_raft_group_log_bytes",
            "encoded bytes of the log entries held after the snapshot",
            |r| Some(r.log_bytes),
        ),
    ];
    for (name, help, get) in gauges {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for r in rows {
            if let Some(v) = get(r) {
                let _ = writeln!(out, "{name}{{group=\"{}\"}} {v}", r.group);
            }
        }
    }
    let name = "ursula_raft_group_replication_lag";
    let _ = writeln!(
        out,
        "# HELP {name} leader only: entries each peer is behind\n# TYPE {name} gauge"
    );
    for r in rows {
        for (peer, lag) in &r.replication {
            let _ = writeln!(out, "{name}{{group=\"{}\",peer=\"{peer}\"}} {lag}", r.group);
        }
    }
    out
}

/// How this node's Raft RPCs to its peers travelled (`ursula_raft::coalesce`): requests
/// that carried several frames, the frames they carried, and frames sent on their own.
fn rpc_counts(node: &ursula_raft::Node) -> [(&'static str, &'static str, u64); 3] {
    use std::sync::atomic::Ordering::Relaxed;
    let (b, f, s) = node.rpc_batching().map_or((0, 0, 0), |st| {
        (
            st.batches.load(Relaxed),
            st.batched_frames.load(Relaxed),
            st.single_frames.load(Relaxed),
        )
    });
    [
        (
            "batches",
            "requests to peers that carried several raft rpcs",
            b,
        ),
        ("batched_frames", "raft rpcs those batches carried", f),
        (
            "single_frames",
            "raft rpcs sent in a request of their own",
            s,
        ),
    ]
}

/// [`rpc_counts`] as Prometheus counters `ursula_raft_rpc_{name}_total`.
pub fn rpc_prometheus(node: &ursula_raft::Node) -> String {
    let mut out = String::new();
    for (name, help, v) in rpc_counts(node) {
        let name = format!("ursula_raft_rpc_{name}_total");
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
        );
    }
    out
}

/// [`rpc_counts`] as the JSON metrics' `raft_rpc` object.
pub fn rpc_json(node: &ursula_raft::Node) -> serde_json::Value {
    rpc_counts(node)
        .into_iter()
        .map(|(name, _, v)| (name.to_owned(), serde_json::Value::from(v)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// Node replacement (cluster.md §5.3): `{"awaiting_permission": [groups],
/// "rehydrating": [groups], "rehydrating_until": {group: index}}`; what `ursulactl
/// allow-rejoin` reads.
pub fn rejoin_json(node: &ursula_raft::Node) -> serde_json::Value {
    let rehydrating = node.groups_rehydrating();
    serde_json::json!({
        "awaiting_permission": node.groups_awaiting_permission(),
        "rehydrating": rehydrating.iter().map(|(g, _)| g).collect::<Vec<_>>(),
        "rehydrating_until": rehydrating.iter()
            .map(|(g, u)| (g.to_string(), serde_json::Value::from(*u)))
            .collect::<serde_json::Map<_, _>>(),
    })
}

/// Readiness reasons of a replaced node's groups.
pub fn rejoin_reasons(node: &ursula_raft::Node) -> Vec<String> {
    let me = node.node_id();
    let mut out = Vec::new();
    let awaiting = node.groups_awaiting_permission();
    if !awaiting.is_empty() {
        out.push(format!(
            "raft groups {awaiting:?} await the leader's permission to rejoin (empty data              directory): run `ursulactl allow-rejoin --node {me}`"
        ));
    }
    for (g, until) in node.groups_rehydrating() {
        out.push(format!(
            "raft group {g} is rehydrating from its leader (votes once it applied index {until})"
        ));
    }
    out
}

/// `(term, index)` as the two spec fields `{prefix}_term` and `{prefix}_index` (null: none).
fn put_id(
    o: &mut serde_json::Map<String, serde_json::Value>,
    prefix: &str,
    id: Option<(u64, u64)>,
) {
    o.insert(format!("{prefix}_term"), id.map(|(t, _)| t).into());
    o.insert(format!("{prefix}_index"), id.map(|(_, i)| i).into());
}

/// The rows as cluster.md §9.1's `raft_groups[]`: indices are Raft log indices (null: none),
/// `current_leader` null when no leader is known.
pub fn spec_json(rows: &[GroupRow]) -> serde_json::Value {
    rows.iter()
        .map(|r| {
            let mut v = serde_json::json!({
                "raft_group_id": r.group,
                "node_id": r.node_id,
                "state": role_name(r.role),
                "current_term": r.term,
                "current_leader": (r.leader != 0).then_some(r.leader),
                "last_log_index": r.last_log_index,
                "voter_ids": r.voter_ids,
                "learner_ids": r.learner_ids,
                "millis_since_quorum_ack": r.since_quorum_ack_ms,
            });
            if let Some(o) = v.as_object_mut() {
                put_id(o, "committed", r.committed_id);
                put_id(o, "last_applied", r.applied_id);
                put_id(o, "snapshot", r.snapshot_id);
                put_id(o, "purged", r.purged_id);
            }
            v
        })
        .collect()
}

fn role_name(role: u64) -> &'static str {
    match role {
        0 => "follower",
        1 => "candidate",
        2 => "leader",
        3 => "learner",
        _ => "shutdown",
    }
}

/// The rows as the terse `raft_group_metrics` array (counts, not indices).
pub fn json(rows: &[GroupRow]) -> serde_json::Value {
    rows.iter()
        .map(|r| {
            serde_json::json!({
                "group": r.group,
                "role": r.role,
                "term": r.term,
                "elections": r.elections,
                "leader": r.leader,
                "last_log_index": r.last_log,
                "commit_lag": r.last_log.saturating_sub(r.last_applied),
                "quorum_ack_age_ms": r.since_quorum_ack_ms,
                "replication_lag": r.replication.iter()
                    .map(|(p, l)| serde_json::json!({"peer": p, "lag": l}))
                    .collect::<Vec<_>>(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_each_group_and_peer() {
        let rows = vec![GroupRow {
            group: 3,
            node_id: 1,
            role: 2,
            term: 7,
            leader: 1,
            last_log: 10,
            last_applied: 9,
            since_quorum_ack_ms: Some(12),
            replication: vec![(2, 0), (3, 4)],
            last_log_index: Some(9),
            applied_id: Some((7, 8)),
            committed_id: Some((7, 9)),
            voter_ids: vec![1, 2, 3],
            snapshot_bytes: 4096,
            ..Default::default()
        }];
        let text = prometheus(&rows);
        assert!(text.contains("ursula_raft_group_snapshot_bytes{group=\"3\"} 4096\n"));
        assert!(
            text.contains("ursula_raft_group_term{group=\"3\"} 7\n"),
            "{text}"
        );
        assert!(text.contains("ursula_raft_group_commit_lag{group=\"3\"} 1\n"));
        assert!(text.contains("ursula_raft_group_replication_lag{group=\"3\",peer=\"3\"} 4\n"));
        let j = json(&rows);
        assert_eq!(j[0]["replication_lag"][1]["lag"], 4);
        let s = spec_json(&rows);
        assert_eq!(s[0]["raft_group_id"], 3);
        assert_eq!(s[0]["current_leader"], 1);
        assert_eq!(s[0]["committed_index"], 9);
        assert_eq!(s[0]["last_applied_term"], 7);
        assert_eq!(s[0]["last_applied_index"], 8);
        assert!(s[0]["snapshot_index"].is_null());
        assert_eq!(s[0]["voter_ids"], serde_json::json!([1, 2, 3]));
        assert_eq!(s[0]["learner_ids"], serde_json::json!([]));
    }

    #[test]
    fn no_leader_is_null() {
        let s = spec_json(&[GroupRow::default()]);
        assert!(s[0]["current_leader"].is_null(), "{s}");
        assert!(s[0]["last_log_index"].is_null(), "{s}");
    }
}
