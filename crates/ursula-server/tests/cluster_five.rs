//! Five `ursula` processes surviving two killed: writers with idempotent producers keep
//! writing on two streams while the leader of one stream's group is SIGKILLed and then the
//! leader elected after it (4 nodes left, 3 votes needed); the three survivors hold every
//! acknowledged append exactly once, in order; the two restarted nodes catch up and hold the
//! same bytes. Each failover must leave no write gap over 3 s (issue #13's worst case).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::cluster::{CLUSTER_T as T, Cluster, ClusterSpec, Node, spawn_writers};
use common::wait_until;

const STREAMS: [&str; 2] = ["/five/a", "/five/b"];
/// Bytes of one record.
const REC: usize = 10;

fn record(stream: usize, i: u64) -> Vec<u8> {
    format!("{stream}:{i:07}\n").into_bytes()
}

/// The node serves from its own replica every acknowledged byte but the last record (a read
/// reaching the tail would be redirected to the leader), and the bytes are `want`'s.
fn holds_locally(node: &Node, stream: &str, want: &[u8]) -> bool {
    let part = want.len() - REC;
    let path = format!("{stream}?offset=-1&max_bytes={part}");
    wait_until(T, || {
        node.request("GET", &path, &[], b"", Duration::from_secs(2))
            .is_ok_and(|r| r.status == 200 && r.body == want[..part])
    })
}

#[test]
fn five_nodes_survive_two_killed_leaders() {
    let mut c = Cluster::start(ClusterSpec::new(5));
    c.wait_ready();
    let client = c.client();
    for s in STREAMS {
        let r = client.must(
            0,
            "PUT",
            s,
            &[("content-type", "application/octet-stream")],
            b"",
        );
        assert_eq!(r.status, 201, "{}", r.describe());
    }
    let stop = Arc::new(AtomicBool::new(false));
    let (acked, writers) = spawn_writers(&client, &STREAMS, "five", 100_000, record, &stop);
    let count = |s: usize| acked[s].lock().unwrap().len();
    assert!(wait_until(T, || count(0) >= 20 && count(1) >= 20));

    // Kill the leader of stream a's group, wait for writes to resume on both streams, then
    // kill the leader elected after it.
    let mut killed = Vec::new();
    for round in 0..2 {
        let lead = c.stream_leader(STREAMS[0]);
        // The node answering for the stream reports itself leader of some group.
        let groups = c.spec.group_count;
        assert!((0..groups).any(|g| c.group_leader(g) == lead));
        let before = [count(0), count(1)];
        let at = Instant::now();
        c.nodes[lead].kill9();
        killed.push(lead);
        let resumed = wait_until(T, || count(0) > before[0] + 10 && count(1) > before[1] + 10);
        assert!(
            resumed,
            "writes did not resume after kill {round} (node {}):\n{}",
            c.nodes[lead].id,
            c.log_tails(20)
        );
        let a = acked[0].lock().unwrap();
        let gap = a[before[0].saturating_sub(1)..]
            .windows(2)
            .filter(|w| w[1] > at)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap();
        eprintln!(
            "kill {round}: node {} killed, longest write gap {gap:?}",
            c.nodes[lead].id
        );
        assert!(gap <= Duration::from_secs(3), "failover took {gap:?}");
    }
    assert_ne!(killed[0], killed[1]);
    stop.store(true, Ordering::SeqCst);
    for w in writers {
        w.join().unwrap();
    }

    // Every acknowledged append once, in order: in full through the cluster (the tail read
    // ends on the leader), and from each survivor's own replica.
    let want: Vec<Vec<u8>> = (0..2)
        .map(|s| (0..count(s) as u64).flat_map(|i| record(s, i)).collect())
        .collect();
    let check = |c: &Cluster, nodes: &[usize]| {
        for &i in nodes {
            for (s, stream) in STREAMS.iter().enumerate() {
                let r = client.must(i, "GET", &format!("{stream}?offset=-1"), &[], b"");
                assert_eq!(r.status, 200, "{}", r.describe());
                assert_eq!(
                    r.body.len(),
                    want[s].len(),
                    "node {} {stream}",
                    c.nodes[i].id
                );
                assert!(
                    r.body == want[s],
                    "node {} {stream}: other bytes",
                    c.nodes[i].id
                );
                assert!(
                    holds_locally(&c.nodes[i], stream, &want[s]),
                    "node {} does not hold {stream}'s acknowledged bytes",
                    c.nodes[i].id
                );
            }
        }
    };
    let survivors: Vec<usize> = (0..5).filter(|i| !killed.contains(i)).collect();
    check(&c, &survivors);

    // The two killed nodes restart, catch up and hold the same bytes.
    for &i in &killed {
        c.nodes[i].start();
    }
    c.wait_ready();
    check(&c, &killed);
}
