//! `ursulactl`'s safe rolling restart of one node on three real `ursula` processes
//! (cluster.md §10): `drain` -> `prepare-restart` -> restart -> `wait` -> `verify-cluster` ->
//! `undrain`, with the gates failing while the node is down and behind.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod common;
mod ops_cluster;

use std::time::Duration;

use ops_cluster::{bootstrap_done, ctl, logs};

const STREAMS: [&str; 4] = ["/rest/r0", "/rest/r1", "/rest/r2", "/rest/r3"];

fn write_round(c: &common::cluster::Cluster, round: usize, n: usize) {
    let client = c.client();
    for (s, path) in STREAMS.iter().enumerate() {
        for i in 0..n {
            let body = format!("r{round}-{i};");
            let r = client.must(
                s % 2,
                "POST",
                path,
                &[("content-type", "application/octet-stream")],
                body.as_bytes(),
            );
            assert!(r.status / 100 == 2, "{}", r.describe());
        }
    }
}

#[test]
fn rolling_restart_of_one_node_through_the_cli_gates() {
    let mut c = ops_cluster::start(3, 4);
    let o = ctl(&c, &["wait-ready", "--expected-groups", "4"]);
    assert_eq!(o.code, 0, "{o:?}\n{}", logs(&c));
    let client = c.client();
    for (s, path) in STREAMS.iter().enumerate() {
        let r = client.must(
            s % 3,
            "PUT",
            path,
            &[("content-type", "application/octet-stream")],
            b"",
        );
        assert!(r.status / 100 == 2, "{}", r.describe());
    }
    write_round(&c, 0, 5);
    let o = ctl(&c, &["verify-cluster"]);
    assert_eq!(o.code, 0, "{o:?}\n{}", logs(&c));
    assert!(o.stdout.contains("all 3 voters present"), "{o:?}");

    let o = ctl(&c, &["drain", "--node", "3"]);
    assert_eq!(o.code, 0, "{o:?}\n{}", logs(&c));
    let o = ctl(&c, &["prepare-restart", "--node", "3"]);
    assert_eq!(o.code, 0, "{o:?}");
    assert!(
        o.stdout
            .contains("every node reports wal_backend = \"disk\""),
        "{o:?}"
    );
    assert!(!o.stdout.contains("still leads"), "drained: {o:?}");

    // Down, and the cluster moves on without it.
    bootstrap_done(&c);
    let status = c.nodes[2]
        .sigterm(Duration::from_secs(30))
        .expect("node 3 did not stop on SIGTERM");
    assert!(status.success(), "{status:?}");
    write_round(&c, 1, 30);
    // While it is down: prepare-restart fails closed, verify-cluster and wait abort with 2.
    let o = ctl(&c, &["prepare-restart", "--node", "3"]);
    assert_eq!(o.code, 2, "{o:?}");
    assert!(o.stderr.contains("node 3 did not answer"), "{o:?}");
    let o = ctl(&c, &["verify-cluster", "--timeout-secs", "1"]);
    assert_eq!(o.code, 2, "{o:?}");
    assert!(o.stderr.contains("node 3 did not answer"), "{o:?}");
    let o = ctl(&c, &["wait", "--node", "3", "--stall-timeout-secs", "1"]);
    assert_eq!(o.code, 2, "{o:?}");
    assert!(o.stderr.contains("no catch-up progress"), "{o:?}");

    // Back: `wait` returns once it is a voter everywhere and within 16 entries of every
    // leader (it missed 30 appends per stream), then verify and undrain.
    c.nodes[2].start();
    let o = ctl(&c, &["wait", "--node", "3", "--stall-timeout-secs", "60"]);
    assert_eq!(o.code, 0, "{o:?}\n{}", logs(&c));
    assert!(
        o.stdout
            .starts_with("node 3 caught up: a voter of all 4 groups"),
        "{o:?}"
    );
    let o = ctl(&c, &["verify-cluster"]);
    assert_eq!(o.code, 0, "{o:?}\n{}", logs(&c));
    let o = ctl(&c, &["undrain", "--node", "3"]);
    assert_eq!(o.code, 0, "{o:?}");
    // Nothing written was lost across the restart.
    for path in STREAMS {
        let text = String::from_utf8(c.client().read_all(0, path)).unwrap();
        assert_eq!(text.matches(';').count(), 35, "{path}: {text}");
    }
}
