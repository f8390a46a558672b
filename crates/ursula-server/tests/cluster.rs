//! Three `ursula` processes on loopback ports forming one cluster: one config file for all
//! (`--node-id` per process), temp data dirs, one shared `local` cold dir. Redirects to the
//! leader, follower reads, ten SIGKILLs of a group's leader under a writer with an idempotent
//! producer (failover time measured: median <= 1.5 s, worst <= 3 s), each killed node's
//! restart and catch-up, and a frozen (SIGSTOP) leader that resumes.
//!
//! Debugging: `CLUSTER_TEST_LOG=info,openraft=info` sets the nodes' log filter and
//! `CLUSTER_TEST_KEEP_LOGS=/some/dir` copies their logs there at the end.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::cluster::{CLUSTER_T as T, Cluster, ClusterSpec};
use common::try_request;

const STREAM: &str = "/clus/failover";
const REC: usize = 8;
/// SIGKILLs of a group's leader per run (then one SIGSTOP).
const KILL_CYCLES: usize = 10;

fn record(i: u64) -> Vec<u8> {
    format!("w{i:07}").into_bytes()
}

#[test]
fn three_processes_redirect_fail_over_and_catch_up() {
    let mut c = Cluster::start(ClusterSpec::new(3));
    c.wait_ready();
    let client = c.client();

    // Create on node 1 (redirected if it does not lead) and find the leader.
    let ct = [("content-type", "application/octet-stream")];
    let r = client.must(0, "PUT", STREAM, &ct, b"");
    assert_eq!(r.status, 201, "{}", r.describe());
    let lead = c.stream_leader(STREAM);
    let follower = (lead + 1) % 3;
    let direct = c.nodes[follower]
        .request("POST", STREAM, &ct, b"x", T)
        .unwrap();
    assert_eq!(
        direct.status,
        307,
        "a follower took a write: {}",
        direct.describe()
    );
    assert_eq!(
        direct.header("location"),
        Some(format!("{}{STREAM}", c.nodes[lead].url()).as_str())
    );
    assert_eq!(
        direct.header("x-ursula-raft-leader-id"),
        Some(c.nodes[lead].id.to_string().as_str())
    );

    // Per-group Raft metrics: the leader reports itself leader of some group, and the lag of
    // both peers there; a follower reports who leads.
    let lead_text = c.nodes[lead].prometheus().unwrap();
    assert!(
        lead_text.contains("ursula_raft_group_role{group="),
        "{lead_text}"
    );
    assert!(
        lead_text
            .lines()
            .any(|l| l.starts_with("ursula_raft_group_role{") && l.ends_with(" 2")),
        "the leader leads no group: {lead_text}"
    );
    let peers_lagged = lead_text
        .lines()
        .filter(|l| l.starts_with("ursula_raft_group_replication_lag{"))
        .count();
    assert!(
        peers_lagged >= 2,
        "no replication lag per peer: {lead_text}"
    );
    let id = c.nodes[lead].id.to_string();
    assert!(
        c.nodes[follower]
            .prometheus()
            .unwrap()
            .lines()
            .any(|l| l.starts_with("ursula_raft_group_leader{") && l.ends_with(&format!(" {id}"))),
        "the follower does not know the leader"
    );

    // A bucket is replicated to every group, whatever node leads each: any node creates it.
    let r = c.nodes[follower]
        .request("PUT", "/clusbucket", &[], b"", T)
        .unwrap();
    assert_eq!(
        r.status / 100,
        2,
        "bucket create on a follower: {}",
        r.describe()
    );
    for n in &c.nodes {
        let seen = common::wait_until(T, || {
            n.request("GET", "/clusbucket", &[], b"", Duration::from_secs(2))
                .is_ok_and(|r| r.status == 200)
        });
        assert!(seen, "node {} never saw the bucket", n.id);
    }

    // A writer with an idempotent producer appends record after record through whichever
    // node answers; a retried record is deduplicated, so each is in the stream exactly once.
    let acked: Arc<Mutex<Vec<(u64, Instant)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (acked, stop, client) = (Arc::clone(&acked), Arc::clone(&stop), client.clone());
        std::thread::spawn(move || {
            let mut seq = 0u64;
            let mut at = 0;
            while !stop.load(Ordering::SeqCst) && seq < 100_000 {
                let s = seq.to_string();
                let h = [
                    ("content-type", "application/octet-stream"),
                    ("producer-id", "writer"),
                    ("producer-epoch", "0"),
                    ("producer-seq", s.as_str()),
                ];
                let (i, r) = client
                    .send(at, "POST", STREAM, &h, &record(seq), Instant::now() + T)
                    .expect("a write never succeeded");
                assert!(r.status / 100 == 2, "append {seq}: {}", r.describe());
                at = i;
                acked.lock().unwrap().push((seq, Instant::now()));
                seq += 1;
            }
        })
    };
    let acked_len = |a: &Arc<Mutex<Vec<(u64, Instant)>>>| a.lock().unwrap().len();
    assert!(common::wait_until(T, || acked_len(&acked) >= 20));

    // Kill the group's leader again and again; each time measure how long until the next
    // write is acknowledged, then restart the node and let it catch up.
    let mut gaps = Vec::new();
    for cycle in 0..KILL_CYCLES + 1 {
        let lead = c.stream_leader(STREAM);
        let before = acked_len(&acked);
        // The last cycle freezes the leader (SIGSTOP) instead: when it resumes it must not
        // acknowledge anything without a quorum (checked below with every other ack).
        let freeze = cycle == KILL_CYCLES;
        let killed_at = Instant::now();
        if freeze {
            c.nodes[lead].sigstop();
        } else {
            c.nodes[lead].kill9();
        }
        assert!(
            common::wait_until(T, || acked_len(&acked) > before + 5),
            "writes did not resume after the leader was stopped (cycle {cycle})"
        );
        // The longest time without an acknowledged write around the kill.
        let resumed = {
            let a = acked.lock().unwrap();
            a[before.saturating_sub(1)..]
                .windows(2)
                .filter(|w| w[1].1 > killed_at)
                .map(|w| w[1].1 - w[0].1)
                .max()
                .unwrap()
        };
        if freeze {
            eprintln!("write gap after SIGSTOP of the leader: {resumed:?}");
            c.nodes[lead].sigcont();
        } else {
            gaps.push(resumed);
            c.nodes[lead].start();
        }
        c.wait_ready();
        // As an operator would (verify-cluster), let it catch up before the next kill: it
        // serves, from its own replica, what was acknowledged a moment ago.
        let upto = (acked_len(&acked) * REC) as u64;
        let path = format!("{STREAM}?offset=-1&max_bytes={upto}");
        let caught_up = common::wait_until(T, || {
            c.nodes[lead]
                .request("GET", &path, &[], b"", Duration::from_secs(2))
                .is_ok_and(|r| r.status == 200 && r.body.len() as u64 == upto)
        });
        assert!(caught_up, "node {} never caught up", c.nodes[lead].id);
    }
    stop.store(true, Ordering::SeqCst);
    writer.join().unwrap();
    gaps.sort();
    eprintln!("write gaps after SIGKILL of the leader: {gaps:?}");
    let median = gaps[gaps.len() / 2];
    assert!(
        median <= Duration::from_millis(1500),
        "median failover {median:?} (all: {gaps:?})"
    );
    assert!(
        gaps[gaps.len() - 1] <= Duration::from_secs(3),
        "worst failover {:?} (all: {gaps:?})",
        gaps[gaps.len() - 1]
    );

    // The elections of the last cycle (the frozen leader's) show in the survivors' metrics.
    let elections: u64 = (0..c.nodes.len())
        .filter_map(|i| c.nodes[i].prometheus())
        .flat_map(|text| {
            text.lines()
                .filter(|l| l.starts_with("ursula_raft_group_elections{"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum();
    assert!(
        elections > 0,
        "no election counted in ursula_raft_group_elections"
    );

    // Every acknowledged append exactly once, in order, on every node: a follower serves what
    // it applied (all but the tail byte, so it states no tail fact), the full read is
    // redirected to the leader.
    let n = acked_len(&acked) as u64;
    let want: Vec<u8> = (0..n).flat_map(record).collect();
    for (i, node) in c.nodes.iter().enumerate() {
        let r = client.must(i, "GET", &format!("{STREAM}?offset=-1"), &[], b"");
        assert_eq!(r.status, 200, "node {}: {}", node.id, r.text());
        assert_eq!(r.body.len(), want.len(), "node {}", node.id);
        assert!(r.body == want, "node {} holds other bytes", node.id);
        let part = want.len() - REC;
        let path = format!("{STREAM}?offset=-1&max_bytes={part}");
        let local = common::wait_until(T, || {
            try_request(node.addr(), "GET", &path, &[], b"", Duration::from_secs(2))
                .is_ok_and(|r| r.status == 200 && r.body == want[..part])
        });
        assert!(local, "node {} did not serve its applied bytes", node.id);
    }
}
