//! Per-group Raft metrics (cluster.md §13, issue 13): for every group this node runs, its
//! role, term, leader, log and apply positions, and on a leader the replication lag of each
//! peer. Prometheus gets them with `group` (and `peer`) labels; the JSON metrics a
//! `raft_group_metrics` array. A term that keeps rising counts elections.

use crate::app::App;
use std::fmt::Write;
use ursula_raft::GroupMetrics as GroupRow;

/// Every group's metrics, from the Raft facade.
pub fn rows(app: &App) -> Vec<GroupRow> {
    (0..app.node.group_count())
        .map(|g| app.node.group_metrics(g))
        .collect()
}

/// A per-group gauge: name, help, value (if the group has one).
type Gauge = (&'static str, &'static str, fn(&GroupRow) -> Option<u64>);

/// The rows in the Prometheus text format.
pub fn prometheus(rows: &[GroupRow]) -> String {
    let mut out = String::new();
    let gauges: [Gauge; 6] = [
        (
            "ursula_raft_group_role",
            "0 follower, 1 candidate, 2 leader, 3 learner, 4 shut down",
            |r| Some(r.role),
        ),
        ("ursula_raft_group_term", "current term", |r| Some(r.term)),
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

/// The rows as JSON.
pub fn json(rows: &[GroupRow]) -> serde_json::Value {
    rows.iter()
        .map(|r| {
            serde_json::json!({
                "group": r.group,
                "role": r.role,
                "term": r.term,
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
            role: 2,
            term: 7,
            leader: 1,
            last_log: 10,
            last_applied: 9,
            since_quorum_ack_ms: Some(12),
            replication: vec![(2, 0), (3, 4)],
        }];
        let text = prometheus(&rows);
        assert!(
            text.contains("ursula_raft_group_term{group=\"3\"} 7\n"),
            "{text}"
        );
        assert!(text.contains("ursula_raft_group_commit_lag{group=\"3\"} 1\n"));
        assert!(text.contains("ursula_raft_group_replication_lag{group=\"3\",peer=\"3\"} 4\n"));
        let j = json(&rows);
        assert_eq!(j[0]["replication_lag"][1]["lag"], 4);
    }
}
