//! `ursulactl` against three real `ursula` processes: `wait-ready` until every group has a
//! leader, `status` and the spec's metrics fields (cluster.md §9.1) on every node, and both
//! with a node down.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod common;
mod ops_cluster;

use common::cluster::{CLUSTER_T as T, Cluster};
use ops_cluster::{ctl, logs, metrics};
use serde_json::Value;

#[test]
fn status_and_wait_ready_on_three_processes() {
    let mut c = ops_cluster::start(3, 4);

    let o = ctl(
        &c,
        &[
            "wait-ready",
            "--expected-groups",
            "4",
            "--timeout-secs",
            "60",
        ],
    );
    assert_eq!(o.code, 0, "{o:?}\n{}", logs(&c));
    assert!(
        o.stdout.starts_with("ready: 3 nodes, 4 groups each"),
        "{o:?}"
    );

    // Every node reports the spec's per-group fields, and the node the others name as a
    // group's leader says so itself (sampled until one quiet sample shows it).
    let mut last = Vec::new();
    let agreed = common::wait_until(T, || {
        last = c.nodes.iter().filter_map(metrics).collect();
        last.len() == 3
            && (0..4).all(|g| {
                let l = last[0]["raft_groups"][g]["current_leader"].as_u64();
                l.is_some_and(|l| {
                    last.iter()
                        .all(|m| m["raft_groups"][g]["current_leader"] == l)
                        && last[l as usize - 1]["raft_groups"][g]["state"] == "leader"
                })
            })
    });
    assert!(agreed, "the nodes disagree on leaders: {last:?}");
    for (i, m) in last.iter().enumerate() {
        assert_eq!(m["raft_group_count"], 4, "{m}");
        assert_eq!(m["wal_backend"], "disk");
        let groups = m["raft_groups"].as_array().unwrap();
        assert_eq!(groups.len(), 4);
        for g in groups {
            assert_eq!(g["node_id"], i as u64 + 1, "{g}");
            assert_eq!(g["voter_ids"], serde_json::json!([1, 2, 3]), "{g}");
            assert_eq!(g["learner_ids"], serde_json::json!([]), "{g}");
            for k in [
                "current_term",
                "last_log_index",
                "committed_index",
                "last_applied_index",
            ] {
                assert!(g[k].as_u64().is_some(), "{k} in {g}");
            }
            assert!(g.get("snapshot_index").is_some() && g.get("purged_index").is_some());
        }
    }

    // status: every node reachable, the four leaderships spread over the nodes.
    let o = ctl(&c, &["status", "--json"]);
    assert_eq!(o.code, 0, "{o:?}");
    let j: Value = serde_json::from_str(o.stdout.trim()).unwrap();
    let led: usize = j["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            assert_eq!(n["reachable"], true, "{n}");
            assert_eq!(n["group_count"], 4, "{n}");
            n["led"].as_array().unwrap().len()
        })
        .sum();
    assert_eq!(led, 4, "{j}");
    assert_eq!(j["leaderless_groups"], serde_json::json!([]), "{j}");
    let text = ctl(&c, &["status"]);
    assert_eq!(text.code, 0);
    assert_eq!(text.stdout.lines().count(), 4, "{}", text.stdout);

    // The wrong group count never gets ready: exit 2, one line naming the cause.
    let o = ctl(
        &c,
        &[
            "wait-ready",
            "--expected-groups",
            "5",
            "--timeout-secs",
            "1",
        ],
    );
    assert_eq!(o.code, 2, "{o:?}");
    assert!(o.stderr.contains("reports 4 groups, expected 5"), "{o:?}");

    // A node down: status still answers (exit 0) and names it; wait-ready does not pass.
    c.nodes[2].kill9();
    let o = ctl(&c, &["status"]);
    assert_eq!(o.code, 0, "{o:?}");
    assert!(
        o.stdout
            .lines()
            .any(|l| l.starts_with("node 3 ") && l.contains("unreachable")),
        "{o:?}"
    );
    let o = ctl(
        &c,
        &[
            "wait-ready",
            "--expected-groups",
            "4",
            "--timeout-secs",
            "1",
        ],
    );
    assert_eq!(o.code, 2, "{o:?}");
    assert!(o.stderr.contains("node 3 unreachable"), "{o:?}");

    // Back up: ready again.
    c.nodes[2].start();
    let o = ctl(&c, &["wait-ready", "--expected-groups", "4"]);
    assert_eq!(o.code, 0, "{o:?}\n{}", logs(&c));
}

/// The groups `node` (1-based) leads, by its own metrics.
fn led_by(c: &Cluster, node: u64) -> Vec<u64> {
    let Some(m) = metrics(&c.nodes[node as usize - 1]) else {
        return Vec::new();
    };
    m["raft_groups"]
        .as_array()
        .map(|gs| {
            gs.iter()
                .filter(|g| g["current_leader"] == node && g["state"] == "leader")
                .filter_map(|g| g["raft_group_id"].as_u64())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn transfer_leader_drain_and_undrain_on_three_processes() {
    let c = ops_cluster::start(3, 4);
    let o = ctl(&c, &["wait-ready", "--expected-groups", "4"]);
    assert_eq!(o.code, 0, "{o:?}\n{}", logs(&c));

    // Move group 0 to a node that does not lead it; the metrics then agree.
    let from = (1..=3).find(|&n| led_by(&c, n).contains(&0));
    let to = (1..=3).find(|&n| Some(n) != from).unwrap();
    let o = ctl(
        &c,
        &["transfer-leader", "--group", "0", "--to", &to.to_string()],
    );
    assert_eq!(o.code, 0, "{o:?}\n{}", logs(&c));
    assert!(o.stdout.contains(&format!("to node {to}")), "{o:?}");
    assert!(
        common::wait_until(T, || led_by(&c, to).contains(&0)),
        "node {to} does not lead group 0 after the transfer"
    );
    let o = ctl(
        &c,
        &["transfer-leader", "--group", "0", "--to", &to.to_string()],
    );
    assert_eq!(o.code, 0, "{o:?}");
    assert!(o.stdout.contains("already leads"), "{o:?}");
    // Not a voter: refused, exit 1, one line.
    let o = ctl(&c, &["transfer-leader", "--group", "0", "--to", "9"]);
    assert_eq!(o.code, 1, "{o:?}");
    assert_eq!(o.stderr.lines().count(), 1, "{o:?}");
    assert!(o.stderr.contains("refused"), "{o:?}");

    // Drain the node that now leads group 0: it ends up leading nothing, and stays so while
    // marked; the others lead every group.
    let o = ctl(&c, &["drain", "--node", &to.to_string()]);
    assert_eq!(o.code, 0, "{o:?}\n{}", logs(&c));
    assert!(o.stdout.contains("maintenance-drain"), "{o:?}");
    assert!(o.stdout.contains("leads no group"), "{o:?}");
    assert!(led_by(&c, to).is_empty());
    let o = ctl(&c, &["wait-ready", "--expected-groups", "4"]);
    assert_eq!(o.code, 0, "{o:?}");
    let shed = ops_cluster::get(&c.nodes[to as usize - 1], "/__ursula/leadership-shed").unwrap();
    assert!(
        shed.text().contains("\"should_accept_transfer\":false"),
        "{}",
        shed.text()
    );
    // A transfer to the drained node is refused.
    let o = ctl(
        &c,
        &["transfer-leader", "--group", "1", "--to", &to.to_string()],
    );
    assert_eq!(o.code, 1, "{o:?}");
    assert!(led_by(&c, to).is_empty());

    let o = ctl(&c, &["undrain", "--node", &to.to_string()]);
    assert_eq!(o.code, 0, "{o:?}");
    assert!(o.stdout.contains("shed state normal"), "{o:?}");
    // Accepting again: group 1 can move there.
    let o = ctl(
        &c,
        &["transfer-leader", "--group", "1", "--to", &to.to_string()],
    );
    assert_eq!(o.code, 0, "{o:?}\n{}", logs(&c));
}

#[test]
fn allow_next_revert_answers_per_contract() {
    let c = ops_cluster::start(3, 2);
    let o = ctl(&c, &["wait-ready", "--expected-groups", "2"]);
    assert_eq!(o.code, 0, "{o:?}\n{}", logs(&c));
    let post = |i: usize, path: &str| {
        let addr = c.nodes[i].admin_addr().unwrap();
        common::try_request(
            addr,
            "POST",
            path,
            &[],
            b"",
            std::time::Duration::from_secs(10),
        )
        .unwrap()
    };
    let path = |g: &str, n: &str| format!("/__ursula/raft/{g}/nodes/{n}/allow-next-revert");
    // Group 0's leader and a follower, re-sampled if leadership moves (the balancer may).
    let roles = || {
        let mut l = None;
        let found = common::wait_until(T, || {
            l = (1..=3).find(|&n| led_by(&c, n).contains(&0));
            l.is_some()
        });
        assert!(found, "group 0 has no leader");
        let l = l.unwrap();
        (l, (1..=3).find(|&n| n != l).unwrap())
    };
    let deadline = std::time::Instant::now() + T;
    let (leader, follower, r) = loop {
        let (l, f) = roles();
        let r = post(l as usize - 1, &path("0", &f.to_string()));
        if r.status != 409 || std::time::Instant::now() > deadline {
            break (l, f, r);
        }
    };
    // An intact node needs nothing: 200, state not-awaiting, the commit index sent along.
    assert_eq!(r.status, 200, "{}", r.describe());
    let j: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(j["state"], "not-awaiting", "{j}");
    assert_eq!(j["raft_group_id"], 0);
    assert!(j["commit_index"].as_u64().is_some(), "{j}");
    // A follower: 409 NOT_LEADER naming the leader.
    let r = post(follower as usize - 1, &path("0", &leader.to_string()));
    assert_eq!(r.status, 409, "{}", r.describe());
    assert!(r.text().contains("NOT_LEADER"), "{}", r.text());
    let li = leader as usize - 1;
    // Not a voter, the leader itself, no such group, not numbers: 400 JSON.
    for p in [
        path("0", "9"),
        path("0", &leader.to_string()),
        path("7", "2"),
        path("x", "2"),
        path("0", "two"),
    ] {
        let r = post(li, &p);
        assert_eq!(r.status, 400, "{p}: {}", r.describe());
        let j: Value = serde_json::from_slice(&r.body).unwrap();
        assert!(j["error"]["message"].as_str().is_some(), "{p}: {j}");
    }
}
