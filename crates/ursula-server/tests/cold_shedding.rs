//! Shedding leaderships while the cold store is unhealthy (cluster.md §5.4) on three real
//! processes: one node's cold store breaks, it reports `cold-store-unhealthy`, is not ready,
//! and hands every leadership away; once the store answers again the balancer gives it
//! leaderships back.
//!
//! How cold health is measured: a probe `head`s `_ursula/probe` in the store every 10 s
//! (`cold::spawn_probe`), and failed flushes or reads count until an operation succeeds;
//! the gate (`[governance.cold_health]`, here every 500 ms) trips after 3 bad ticks and
//! heals after 5 good ones.
//! This test breaks the probe: node 1 gets a cold directory of its own (no data is written,
//! so nothing is flushed there or missing from it), and a regular file at
//! `_ursula` in it makes the probe's `head` fail with "not a directory"; removing the file
//! heals it.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod common;

use std::time::Duration;

use common::cluster::{Cluster, ClusterSpec, Node};
use serde_json::Value;

/// Long enough for the 10 s cold probe to notice, a balancer tick, and the hand-overs.
const GATE_T: Duration = Duration::from_secs(60);

fn json(n: &Node, path: &str) -> Option<Value> {
    n.request("GET", path, &[], b"", Duration::from_secs(2))
        .ok()
        .map(|r| r.json())
}

fn led(n: &Node) -> usize {
    json(n, "/__ursula/metrics")
        .and_then(|m| m["raft_groups_led"].as_u64())
        .unwrap_or(0) as usize
}

fn shed_state(n: &Node) -> Option<String> {
    json(n, "/__ursula/leadership-shed").and_then(|j| j["state"].as_str().map(str::to_owned))
}

#[test]
fn an_unhealthy_cold_store_sheds_leaderships_until_it_heals() {
    let mut spec = ClusterSpec::new(3);
    spec.group_count = 4;
    spec.top_toml = "[governance.leadership_balance]\ninterval = \"1s\"\n\
                     [governance.cold_health]\ninterval = \"500ms\"\n"
        .into();
    let mut c = Cluster::start(spec);
    c.wait_ready();

    // Node 1 restarts with a cold directory of its own.
    let shared = c.root().join("cluster.toml");
    let text = std::fs::read_to_string(&shared).unwrap();
    let cold = c.root().join("cold").display().to_string();
    let own = c.root().join("cold-node1");
    std::fs::create_dir_all(&own).unwrap();
    let text = text
        .replace(
            &format!("path = {cold:?}"),
            &format!("path = {:?}", own.display().to_string()),
        )
        .replace(
            "init_membership_per_group = true",
            "init_membership_per_group = false",
        );
    assert!(text.contains("cold-node1"), "{text}");
    let cfg1 = c.root().join("node1.toml");
    std::fs::write(&cfg1, text).unwrap();
    c.nodes[0]
        .sigterm(Duration::from_secs(30))
        .expect("node 1 stops");
    c.nodes[0].set_config(cfg1);
    c.nodes[0].start();
    c.wait_ready();
    // The balancer gives it its share.
    assert!(
        common::wait_until(GATE_T, || led(&c.nodes[0]) >= 1),
        "node 1 never led a group\n{}",
        c.log_tails(20)
    );

    // Break its cold store: it sheds every leadership and says why.
    let blocker = own.join("_ursula");
    std::fs::write(&blocker, b"not a directory").unwrap();
    let shed = common::wait_until(GATE_T, || {
        shed_state(&c.nodes[0]).as_deref() == Some("cold-store-unhealthy") && led(&c.nodes[0]) == 0
    });
    assert!(
        shed,
        "shed={:?} led={}\n{}",
        json(&c.nodes[0], "/__ursula/leadership-shed"),
        led(&c.nodes[0]),
        c.log_tails(20)
    );
    let r = c.nodes[0]
        .request("GET", "/__ursula/ready", &[], b"", Duration::from_secs(2))
        .unwrap();
    assert_eq!(r.status, 503);
    assert!(r.text().contains("cold store unhealthy"), "{}", r.text());
    let st = json(&c.nodes[0], "/__ursula/leadership-shed").unwrap();
    assert_eq!(st["should_accept_transfer"], false);
    assert_eq!(st["bits"], 8);
    assert_eq!(c.nodes[0].metric("cold_health_gate_unhealthy"), 1);
    // It keeps campaigning (its peers share the store in production), and the others lead
    // every group.
    assert_eq!(st["should_campaign"], true);
    assert_eq!(led(&c.nodes[1]) + led(&c.nodes[2]), 4);
    // Healthy nodes stay normal.
    assert_eq!(shed_state(&c.nodes[1]).as_deref(), Some("normal"));

    // Heal: the probe answers again, the mark clears, and leaderships come back.
    std::fs::remove_file(&blocker).unwrap();
    let back = common::wait_until(GATE_T, || {
        shed_state(&c.nodes[0]).as_deref() == Some("normal") && led(&c.nodes[0]) >= 1
    });
    assert!(
        back,
        "shed={:?} led={}\n{}",
        json(&c.nodes[0], "/__ursula/leadership-shed"),
        led(&c.nodes[0]),
        c.log_tails(20)
    );
    assert!(c.nodes[0].ready());
}
