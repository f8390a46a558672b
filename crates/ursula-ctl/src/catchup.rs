//! `wait --node N` and `verify-cluster` (cluster.md §10): whether nodes are voters of every
//! group and caught up with its leader, by the nodes' metrics.
//!
//! "Caught up" compares log positions: a node is within `tolerance` of a group's leader when
//! the leader's last log index is at most `tolerance` above the node's. The leader is the
//! node that says it leads (`Sample::leader_of`), and its own view of the voter set counts.

use std::time::{Duration, Instant};

use crate::view::Sample;
use crate::{CtlError, Ctx, Out};

/// How often both verbs sample the nodes.
const POLL: Duration = Duration::from_millis(250);

/// How far one node is from caught up in one sample.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lag {
    /// What keeps it from caught up (empty: caught up).
    pub why: Vec<String>,
    /// Whether the node answered.
    pub reachable: bool,
    /// Entries in its logs, summed over the groups (grows as it catches up).
    pub log_total: u64,
    /// Entries it is behind the leaders, summed over the groups it can be compared in.
    pub lag_total: u64,
}

fn entries(index: Option<u64>) -> u64 {
    index.map_or(0, |i| i + 1)
}

/// Node `node` in sample `s`: a voter of every group any node reports, and at most
/// `tolerance` entries behind each group's leader.
pub fn node_lag(s: &Sample, node: u64, tolerance: u64) -> Lag {
    let mut lag = Lag::default();
    let Some(m) = s.of(node) else {
        lag.why.push(format!("node {node} did not answer"));
        return lag;
    };
    lag.reachable = true;
    let groups = s.group_ids();
    if groups.is_empty() {
        lag.why.push("no node reports any group".into());
    }
    for g in groups {
        let Some(mine) = m.groups.iter().find(|v| v.id == g) else {
            lag.why
                .push(format!("node {node} does not report group {g}"));
            continue;
        };
        lag.log_total += entries(mine.last_log_index);
        let Some((leader, lv)) = s.leader_view(g) else {
            lag.why.push(format!("group {g} has no known leader"));
            continue;
        };
        if !lv.voters.contains(&node) {
            lag.why.push(format!(
                "node {node} is not a voter of group {g} (voters {:?}, by node {leader})",
                lv.voters
            ));
            continue;
        }
        if leader == node {
            continue;
        }
        let behind = entries(lv.last_log_index).saturating_sub(entries(mine.last_log_index));
        lag.lag_total += behind;
        if behind > tolerance {
            lag.why.push(format!(
                "node {node} is {behind} entries behind node {leader} in group {g}"
            ));
        }
    }
    lag
}

/// Progress of a waiting node: the most log it had and the least lag, and when either last
/// improved.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    best_log: u64,
    best_lag: u64,
    pub last: Instant,
}

impl Progress {
    pub fn new(now: Instant) -> Self {
        Progress {
            best_log: 0,
            best_lag: u64::MAX,
            last: now,
        }
    }

    /// Takes one sample's lag; returns whether it moved (a longer log or a smaller lag than
    /// ever before). An unreachable node makes no progress.
    pub fn observe(&mut self, lag: &Lag, now: Instant) -> bool {
        if !lag.reachable {
            return false;
        }
        let moved = lag.log_total > self.best_log || lag.lag_total < self.best_lag;
        self.best_log = self.best_log.max(lag.log_total);
        self.best_lag = self.best_lag.min(lag.lag_total);
        if moved {
            self.last = now;
        }
        moved
    }
}

/// `wait --node N`: until node N is a voter of every group and within `tolerance` entries
/// of each leader. Exit 2 when it makes no progress for `stall_secs`, or after `max_secs`
/// whatever it does.
pub(crate) async fn wait(
    ctx: &Ctx,
    node: u64,
    tolerance: u64,
    stall_secs: u64,
    max_secs: u64,
    out: &mut Out,
) -> Result<(), CtlError> {
    ctx.manifest.node(node)?;
    let started = Instant::now();
    let backstop = started + Duration::from_secs(max_secs);
    let stall = Duration::from_secs(stall_secs);
    let mut progress = Progress::new(started);
    loop {
        let s = Sample::take(&ctx.client, &ctx.manifest).await;
        let lag = node_lag(&s, node, tolerance);
        if lag.why.is_empty() {
            out.line(format!(
                "node {node} caught up: a voter of all {} groups, within {tolerance} entries of every leader ({} ms)",
                s.group_ids().len(),
                started.elapsed().as_millis()
            ));
            return Ok(());
        }
        let now = Instant::now();
        progress.observe(&lag, now);
        if now.duration_since(progress.last) >= stall {
            return Err(CtlError::safety(format!(
                "node {node} made no catch-up progress for {stall_secs} s: {}",
                lag.why.join("; ")
            )));
        }
        if now + POLL > backstop {
            return Err(CtlError::safety(format!(
                "node {node} not caught up after {max_secs} s (backstop): {}",
                lag.why.join("; ")
            )));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// What keeps the cluster from verified in one sample: every node of the manifest present
/// and caught up, and no group with a voter the manifest does not name.
pub fn cluster_problems(s: &Sample, manifest_ids: &[u64], tolerance: u64) -> Vec<String> {
    let mut why = Vec::new();
    for &n in manifest_ids {
        why.extend(node_lag(s, n, tolerance).why);
    }
    for g in s.group_ids() {
        if let Some((leader, lv)) = s.leader_view(g) {
            for v in lv.voters.iter().filter(|v| !manifest_ids.contains(v)) {
                why.push(format!(
                    "group {g} has voter {v} (by node {leader}), which the manifest does not name"
                ));
            }
        }
    }
    why.sort();
    why.dedup();
    why
}

/// `verify-cluster`: two consecutive samples in which every configured voter is present and
/// caught up; exit 2 if that does not happen within `timeout_secs`.
pub(crate) async fn verify_cluster(
    ctx: &Ctx,
    tolerance: u64,
    timeout_secs: u64,
    out: &mut Out,
) -> Result<(), CtlError> {
    let ids: Vec<u64> = ctx.manifest.nodes.iter().map(|n| n.id).collect();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(timeout_secs);
    let mut good = 0;
    loop {
        let s = Sample::take(&ctx.client, &ctx.manifest).await;
        let why = cluster_problems(&s, &ids, tolerance);
        if why.is_empty() {
            good += 1;
            if good == 2 {
                out.line(format!(
                    "verified: all {} voters present and within {tolerance} entries of the leader in all {} groups, in two consecutive samples",
                    ids.len(),
                    s.group_ids().len()
                ));
                return Ok(());
            }
        } else {
            good = 0;
        }
        if Instant::now() + POLL > deadline {
            let last = if why.is_empty() {
                "only one good sample".to_owned()
            } else {
                why.join("; ")
            };
            return Err(CtlError::safety(format!(
                "verify-cluster failed after {timeout_secs} s: {last}"
            )));
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::NodeEntry;
    use crate::view::NodeMetrics;
    use serde_json::json;

    /// A node's metrics: for each group `(leader, last_log_index)`, voters 1..=3.
    fn node(id: u64, groups: &[(u64, Option<u64>)]) -> (NodeEntry, Result<NodeMetrics, String>) {
        let gs: Vec<_> = groups
            .iter()
            .enumerate()
            .map(|(g, (l, i))| {
                json!({"raft_group_id": g, "node_id": id, "current_term": 2,
                       "current_leader": l, "last_log_index": i, "voter_ids": [1, 2, 3]})
            })
            .collect();
        let j = json!({"raft_node_id": id, "raft_groups": gs});
        let e = NodeEntry {
            id,
            admin_url: String::new(),
            http_url: String::new(),
        };
        (e, NodeMetrics::parse(&j))
    }

    #[test]
    fn lag_is_measured_against_each_groups_leader() {
        let s = Sample {
            nodes: vec![
                node(1, &[(1, Some(100)), (2, Some(50))]),
                node(2, &[(1, Some(99)), (2, Some(50))]),
                node(3, &[(1, Some(80)), (2, Some(40))]),
            ],
        };
        assert!(node_lag(&s, 1, 16).why.is_empty());
        let l2 = node_lag(&s, 2, 16);
        assert!(l2.why.is_empty(), "{l2:?}");
        assert_eq!(l2.lag_total, 1);
        let l3 = node_lag(&s, 3, 16);
        assert_eq!(l3.lag_total, 30);
        assert_eq!(l3.log_total, 81 + 41);
        assert_eq!(
            l3.why,
            vec!["node 3 is 20 entries behind node 1 in group 0".to_owned()]
        );
        assert!(node_lag(&s, 3, 20).why.is_empty());
        assert!(cluster_problems(&s, &[1, 2, 3], 20).is_empty());
        // A voter the manifest does not name, and a manifest node that is not a voter.
        let p = cluster_problems(&s, &[1, 2, 3, 4], 20);
        assert!(
            p.iter().any(|w| w.contains("node 4 did not answer")),
            "{p:?}"
        );
        let p = cluster_problems(&s, &[1, 2], 20);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].contains("voter 3"), "{p:?}");
    }

    #[test]
    fn a_node_outside_the_voter_set_or_without_a_leader_is_not_caught_up() {
        let (e, m) = node(3, &[(1, Some(5))]);
        let mut m = m.unwrap();
        m.groups[0].voters = vec![1, 2];
        let s = Sample {
            nodes: vec![node(1, &[(1, Some(5))]), (e, Ok(m))],
        };
        // Node 1's view of the voters counts: node 3 is not among them.
        let mut s1 = s.clone();
        s1.nodes[0].1.as_mut().unwrap().groups[0].voters = vec![1, 2];
        assert!(node_lag(&s1, 3, 16).why[0].contains("not a voter"));
        assert!(node_lag(&s, 3, 16).why.is_empty());
        let s = Sample {
            nodes: vec![node(1, &[(0, Some(5))]), node(3, &[(0, Some(5))])],
        };
        assert_eq!(
            node_lag(&s, 3, 16).why,
            vec!["group 0 has no known leader".to_owned()]
        );
        assert!(!node_lag(&s, 9, 16).reachable);
    }

    #[test]
    fn progress_is_a_longer_log_or_a_smaller_lag() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut p = Progress::new(t0);
        let lag = |log, lag| Lag {
            why: vec!["x".into()],
            reachable: true,
            log_total: log,
            lag_total: lag,
        };
        assert!(!p.observe(&Lag::default(), t0 + s), "unreachable");
        assert_eq!(p.last, t0);
        assert!(p.observe(&lag(10, 90), t0 + s));
        assert!(!p.observe(&lag(10, 90), t0 + 2 * s));
        // The leader moved on as fast as the node: same lag, longer log.
        assert!(p.observe(&lag(20, 90), t0 + 3 * s));
        assert!(p.observe(&lag(20, 80), t0 + 4 * s));
        assert!(!p.observe(&lag(15, 85), t0 + 5 * s));
        assert_eq!(p.last, t0 + 4 * s);
    }
}
