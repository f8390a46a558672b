//! Cluster-plane egress probes on three real processes (cluster.md §5.4, §9.6): the probe
//! route, per-peer probe metrics with a stopped peer, and the `EGRESS` health gate.
//!
//! A node cannot tell its own broken egress from its peers being unreachable, and neither
//! can this test make one node's outgoing packets vanish without root; so the gate is
//! tripped the way a node sees it: the probes to both of its peers fail (both peers are
//! SIGSTOPped), it reports the `egress-unhealthy` shed state and is not ready, and it heals
//! once the peers answer again for `heal_ticks` ticks.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod common;

use std::time::Duration;

use common::cluster::{CLUSTER_T as T, Cluster, ClusterSpec, Node};
use serde_json::Value;

fn json(n: &Node, path: &str) -> Option<Value> {
    n.request("GET", path, &[], b"", Duration::from_secs(2))
        .ok()
        .map(|r| r.json())
}

/// Node `n`'s probe record of `peer`.
fn probe_of(n: &Node, peer: u64) -> Option<Value> {
    let m = json(n, "/__ursula/metrics")?;
    m["cluster_probe"]["peers"]
        .as_array()?
        .iter()
        .find(|p| p["peer"] == peer)
        .cloned()
}

fn shed_state(n: &Node) -> Option<String> {
    json(n, "/__ursula/leadership-shed").and_then(|j| j["state"].as_str().map(str::to_owned))
}

#[test]
fn probes_measure_every_peer_and_trip_the_egress_gate() {
    let mut spec = ClusterSpec::new(3);
    spec.group_count = 2;
    spec.top_toml = "[governance.cluster_probe]\ninterval = \"100ms\"\ntimeout = \"300ms\"\n\
                     unhealthy_ticks = 2\nheal_ticks = 3\nprobe_size = \"32KiB\"\n"
        .into();
    let mut c = Cluster::start(spec);
    c.wait_ready();

    // The route: drains the body, says how much; other methods and oversized bodies get
    // the spec's JSON errors.
    let n1 = &c.nodes[0];
    let r = n1
        .request("POST", "/__ursula/cluster-probe", &[], &[7u8; 1000], T)
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["received"], 1000);
    let r = n1
        .request("GET", "/__ursula/cluster-probe", &[], b"", T)
        .unwrap();
    assert_eq!(r.status, 405);
    assert_eq!(
        r.json()["error"]["code"],
        "METHOD_NOT_ALLOWED",
        "{}",
        r.text()
    );
    let r = n1
        .request(
            "POST",
            "/__ursula/cluster-probe",
            &[],
            &vec![0u8; 2 << 20],
            T,
        )
        .unwrap();
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(r.json()["error"]["code"].is_string(), "{}", r.text());

    // Healthy: node 1 has a round trip for both peers and no failures in a row.
    let healthy = common::wait_until(T, || {
        [2, 3].iter().all(|&p| {
            probe_of(&c.nodes[0], p)
                .is_some_and(|p| p["last_rtt_us"].is_u64() && p["consecutive_failures"] == 0)
        })
    });
    assert!(healthy, "{:?}", json(&c.nodes[0], "/__ursula/metrics"));
    assert_eq!(shed_state(&c.nodes[0]).as_deref(), Some("normal"));

    // One peer stopped: its probes fail, the other's do not, and one peer of two is no
    // majority: the gate stays open.
    c.nodes[2].sigstop();
    let seen = common::wait_until(T, || {
        probe_of(&c.nodes[0], 3).is_some_and(|p| p["consecutive_failures"].as_u64() >= Some(4))
    });
    assert!(seen, "{:?}", probe_of(&c.nodes[0], 3));
    assert_eq!(probe_of(&c.nodes[0], 2).unwrap()["consecutive_failures"], 0);
    assert!(probe_of(&c.nodes[0], 3).unwrap()["last_error"].is_string());
    let m = json(&c.nodes[0], "/__ursula/metrics").unwrap();
    assert_eq!(m["cluster_probe"]["egress_unhealthy"], false);
    // The commit-stall watchdog runs too, and has had nothing to do.
    assert_eq!(m["commit_stall_transfers_total"], 0);
    assert_eq!(shed_state(&c.nodes[0]).as_deref(), Some("normal"));
    let prom = c.nodes[0].prometheus().unwrap();
    assert!(
        prom.contains("ursula_cluster_probe_failures_total{peer=\"3\"}"),
        "{prom}"
    );

    // Both peers stopped: the probes to a majority fail, node 1 sheds and is not ready.
    c.nodes[1].sigstop();
    let tripped = common::wait_until(T, || {
        shed_state(&c.nodes[0]).as_deref() == Some("egress-unhealthy")
    });
    assert!(
        tripped,
        "{:?}",
        json(&c.nodes[0], "/__ursula/leadership-shed")
    );
    let r = c.nodes[0]
        .request("GET", "/__ursula/ready", &[], b"", T)
        .unwrap();
    assert_eq!(r.status, 503);
    assert!(r.text().contains("egress unhealthy"), "{}", r.text());
    let shed = json(&c.nodes[0], "/__ursula/leadership-shed").unwrap();
    assert_eq!(shed["should_campaign"], false);
    assert_eq!(shed["should_accept_transfer"], false);
    assert_eq!(c.nodes[0].metric("cluster_egress_unhealthy"), 1);
    assert_eq!(c.nodes[0].metric("leadership_shed_bits"), 16);
    assert_eq!(shed["bits"], 16);
    let prom = c.nodes[0].prometheus().unwrap();
    assert!(prom.contains("ursula_cluster_egress_unhealthy 1"), "{prom}");

    // The peers answer again: after `heal_ticks` good ticks the gate clears.
    c.nodes[1].sigcont();
    c.nodes[2].sigcont();
    let healed = common::wait_until(T, || shed_state(&c.nodes[0]).as_deref() == Some("normal"));
    assert!(
        healed,
        "{:?}\n{}",
        json(&c.nodes[0], "/__ursula/leadership-shed"),
        c.log_tails(20)
    );
    c.wait_ready();
    assert!(
        c.nodes[0]
            .log_tail(200)
            .contains("cluster-plane egress unhealthy")
    );
}

#[test]
fn the_probe_route_lives_on_the_cluster_listener() {
    let mut spec = ClusterSpec::new(3);
    spec.group_count = 1;
    spec.cluster_listen = true;
    let mut c = Cluster::start(spec);
    c.wait_ready();
    // With a cluster listener of its own, probes reach the peer URLs (the cluster ports),
    // and every peer gets a round trip.
    let ok = common::wait_until(T, || {
        [2, 3]
            .iter()
            .all(|&p| probe_of(&c.nodes[0], p).is_some_and(|p| p["last_rtt_us"].is_u64()))
    });
    assert!(ok, "{:?}", json(&c.nodes[0], "/__ursula/metrics"));
    // The client plane does not serve it then.
    let r = c.nodes[0]
        .request("POST", "/__ursula/cluster-probe", &[], b"x", T)
        .unwrap();
    assert_eq!(r.status, 404, "{}", r.text());
}
