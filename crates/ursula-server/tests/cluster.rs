//! Three `ursula` processes on loopback ports forming one cluster: one config file for all
//! (`--node-id` per process), temp data dirs, one shared `local` cold dir, `fsync = true`. Redirects to the
//! leader, follower reads, ten SIGKILLs of a group's leader under two concurrent writers with
//! idempotent producers (failover time measured: median <= 1.5 s, worst <= 3 s), each killed
//! node's restart and catch-up, and a frozen (SIGSTOP) leader that resumes with writes queued
//! at it: whatever it acknowledges is in the stream.
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

/// Record `i` of the writer tagged `tag` (one letter): `REC` bytes.
fn record(tag: char, i: u64) -> Vec<u8> {
    format!("{tag}{i:07}").into_bytes()
}

/// The writers' tags (each its own producer id, both on `STREAM`).
const WRITERS: [char; 2] = ['w', 'v'];
/// Direct appends queued at the frozen leader, one producer each.
const FROZEN_PROBES: u64 = 6;

type Acks = Arc<Mutex<Vec<(u64, Instant)>>>;

/// A writer with an idempotent producer: appends record after record through whichever node
/// answers, retrying each until it is acknowledged (a retried record is deduplicated), so
/// each acknowledged record is in the stream exactly once and in order.
fn spawn_writer(
    client: common::cluster::Client,
    tag: char,
    acked: Acks,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let producer = format!("writer-{tag}");
        let mut seq = 0u64;
        let mut at = 0;
        while !stop.load(Ordering::SeqCst) && seq < 100_000 {
            let s = seq.to_string();
            let h = [
                ("content-type", "application/octet-stream"),
                ("producer-id", producer.as_str()),
                ("producer-epoch", "0"),
                ("producer-seq", s.as_str()),
            ];
            let (i, r) = client
                .send(
                    at,
                    "POST",
                    STREAM,
                    &h,
                    &record(tag, seq),
                    Instant::now() + T,
                )
                .expect("a write never succeeded");
            assert!(r.status / 100 == 2, "append {tag}{seq}: {}", r.describe());
            at = i;
            acked.lock().unwrap().push((seq, Instant::now()));
            seq += 1;
        }
    })
}

/// Sends the frozen node `FROZEN_PROBES` appends straight to its port (no redirect
/// followed); they queue in its socket backlog and are answered once it resumes. Returns
/// the probes' threads, each answering `(record, acknowledged)`.
fn queue_at_frozen(addr: std::net::SocketAddr) -> Vec<std::thread::JoinHandle<(Vec<u8>, bool)>> {
    (0..FROZEN_PROBES)
        .map(|i| {
            std::thread::spawn(move || {
                let producer = format!("frozen-{i}");
                let h = [
                    ("content-type", "application/octet-stream"),
                    ("producer-id", producer.as_str()),
                    ("producer-epoch", "0"),
                    ("producer-seq", "0"),
                ];
                let body = record('z', i);
                let r = try_request(addr, "POST", STREAM, &h, &body, T);
                let acked = r.as_ref().is_ok_and(|r| r.status / 100 == 2);
                if let Ok(r) = &r {
                    eprintln!("frozen leader answered probe {i}: {}", r.status);
                }
                (body, acked)
            })
        })
        .collect()
}

#[test]
fn three_processes_redirect_fail_over_and_catch_up() {
    // With the WAL synced before every acknowledgement, as a user runs it: the failover
    // times below include the synced votes and appends of the new term.
    let mut c = Cluster::start(ClusterSpec {
        fsync: true,
        ..ClusterSpec::new(3)
    });
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

    // Two writers, each with its own idempotent producer, on the same stream.
    let acks: Vec<Acks> = WRITERS.iter().map(|_| Acks::default()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = WRITERS
        .iter()
        .zip(&acks)
        .map(|(&tag, acked)| {
            spawn_writer(client.clone(), tag, Arc::clone(acked), Arc::clone(&stop))
        })
        .collect();
    let acked_len = |a: &Acks| a.lock().unwrap().len();
    let total = || acks.iter().map(acked_len).sum::<usize>();
    assert!(common::wait_until(T, || acks
        .iter()
        .all(|a| acked_len(a) >= 10)));
    let mut frozen_probes = Vec::new();

    // Kill the group's leader again and again; each time measure how long until the next
    // write is acknowledged, then restart the node and let it catch up.
    let mut gaps = Vec::new();
    for cycle in 0..KILL_CYCLES + 1 {
        let lead = c.stream_leader(STREAM);
        let before: Vec<usize> = acks.iter().map(acked_len).collect();
        // The last cycle freezes the leader (SIGSTOP) instead: when it resumes it must not
        // acknowledge anything without a quorum (checked below with every other ack).
        let freeze = cycle == KILL_CYCLES;
        let killed_at = Instant::now();
        if freeze {
            c.nodes[lead].sigstop();
            frozen_probes = queue_at_frozen(c.nodes[lead].addr());
        } else {
            c.nodes[lead].kill9();
        }
        assert!(
            common::wait_until(T, || acks
                .iter()
                .zip(&before)
                .all(|(a, &b)| acked_len(a) > b + 5)),
            "writes did not resume after the leader was stopped (cycle {cycle})"
        );
        // The longest time any writer went without an acknowledged write around the kill.
        let resumed = acks
            .iter()
            .zip(&before)
            .map(|(a, &b)| {
                let a = a.lock().unwrap();
                a[b.saturating_sub(1)..]
                    .windows(2)
                    .filter(|w| w[1].1 > killed_at)
                    .map(|w| w[1].1 - w[0].1)
                    .max()
                    .unwrap()
            })
            .max()
            .unwrap();
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
        let upto = (total() * REC) as u64;
        let path = format!("{STREAM}?offset=-1&max_bytes={upto}");
        let caught_up = common::wait_until(T, || {
            c.nodes[lead]
                .request("GET", &path, &[], b"", Duration::from_secs(2))
                .is_ok_and(|r| r.status == 200 && r.body.len() as u64 == upto)
        });
        assert!(caught_up, "node {} never caught up", c.nodes[lead].id);
    }
    stop.store(true, Ordering::SeqCst);
    for w in writers {
        w.join().unwrap();
    }
    let probes: Vec<(Vec<u8>, bool)> = frozen_probes
        .into_iter()
        .map(|p| p.join().unwrap())
        .collect();
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

    // Every acknowledged append exactly once, in order, on every node: the full read (through
    // the leader) splits into each writer's records 0..acked in order; what the frozen leader
    // acknowledged is there once; a follower serves what it applied (all but the tail record,
    // so it states no tail fact) and it is the same bytes.
    let full = client
        .must(0, "GET", &format!("{STREAM}?offset=-1"), &[], b"")
        .body;
    assert_eq!(full.len() % REC, 0);
    let records: Vec<&[u8]> = full.chunks(REC).collect();
    for (&tag, a) in WRITERS.iter().zip(&acks) {
        let n = acked_len(a) as u64;
        let mine: Vec<Vec<u8>> = records
            .iter()
            .filter(|r| r[0] == tag as u8)
            .map(|r| r.to_vec())
            .collect();
        let want: Vec<Vec<u8>> = (0..n).map(|i| record(tag, i)).collect();
        assert!(
            mine == want,
            "writer {tag}: {} records held, {n} acknowledged",
            mine.len()
        );
    }
    for (body, acked) in &probes {
        let held = records.iter().filter(|r| **r == body.as_slice()).count();
        assert!(held <= 1, "a probe is in the stream {held} times");
        assert!(
            !acked || held == 1,
            "the frozen leader acknowledged a write that was lost"
        );
    }
    let others = records
        .iter()
        .filter(|r| !WRITERS.contains(&(r[0] as char)) && r[0] != b'z')
        .count();
    assert_eq!(others, 0, "records nobody wrote");
    for (i, node) in c.nodes.iter().enumerate() {
        let r = client.must(i, "GET", &format!("{STREAM}?offset=-1"), &[], b"");
        assert_eq!(r.status, 200, "node {}: {}", node.id, r.text());
        assert!(r.body == full, "node {} holds other bytes", node.id);
        let part = full.len() - REC;
        let path = format!("{STREAM}?offset=-1&max_bytes={part}");
        let local = common::wait_until(T, || {
            try_request(node.addr(), "GET", &path, &[], b"", Duration::from_secs(2))
                .is_ok_and(|r| r.status == 200 && r.body == full[..part])
        });
        assert!(local, "node {} did not serve its applied bytes", node.id);
    }
}

/// A node that is left without a quorum answers writes `503 LEADER_UNAVAILABLE` with
/// `Retry-After: 1` (not a redirect to a dead leader, not a hang), and takes writes again once
/// a second node is back.
#[test]
fn without_a_quorum_writes_answer_503_until_a_majority_is_back() {
    let mut c = Cluster::start(ClusterSpec {
        group_count: 1,
        ..ClusterSpec::new(3)
    });
    c.wait_ready();
    let client = c.client();
    let ct = [("content-type", "application/octet-stream")];
    let path = "/clus/quorum";
    assert_eq!(client.must(0, "PUT", path, &ct, b"").status, 201);
    let lead = c.stream_leader(path);
    let gone = (lead + 1) % 3;
    let survivor = (lead + 2) % 3;
    c.nodes[lead].kill9();
    c.nodes[gone].kill9();
    // Once the survivor's lease of the dead leader has run out it campaigns and knows no
    // leader: every write gets a clear, retryable answer.
    let mut last = None;
    let unavailable = common::wait_until(T, || {
        last = c.nodes[survivor]
            .request("POST", path, &ct, b"x", Duration::from_secs(5))
            .ok();
        last.as_ref().is_some_and(|r| r.status == 503)
    });
    let r = last.unwrap();
    assert!(unavailable, "{}", r.describe());
    common::assert_error(&r, 503, "LEADER_UNAVAILABLE");
    assert_eq!(r.header("retry-after"), Some("1"), "{}", r.describe());
    // A majority again: writes go through (redirects followed).
    c.nodes[gone].start();
    let (_, r) = client
        .send(survivor, "POST", path, &ct, b"back", Instant::now() + T)
        .expect("no write succeeded after a majority came back");
    assert_eq!(r.status / 100, 2, "{}", r.describe());
}
