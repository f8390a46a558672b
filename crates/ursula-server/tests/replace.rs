//! Node replacement over real processes (cluster.md §5.3): a node SIGKILLed and restarted on a
//! wiped data directory stays out of every group (readiness and metrics say why) while the
//! cluster keeps acknowledging writes; after `ursulactl allow-rejoin` it rehydrates and serves
//! every acknowledged byte.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod common;
mod ops_cluster;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::cluster::{CLUSTER_T as T, Cluster};
use ops_cluster::{bootstrap_done, ctl, get, logs, metrics};

const STREAMS: usize = 8;
const REC: usize = 8;

fn record(i: u64) -> Vec<u8> {
    format!("w{i:07}").into_bytes()
}

/// Node `i`'s own applied copy of `path` equals `want` (all but the last record: a follower
/// serves what it applied without stating tail facts).
fn serves(c: &Cluster, i: usize, path: &str, want: &[u8]) -> bool {
    let part = want.len().saturating_sub(REC);
    part == 0 || c.nodes[i].read_local(path, part).as_deref() == Some(&want[..part])
}

#[test]
fn a_wiped_node_stays_out_until_allowed_then_rehydrates() {
    let mut c = ops_cluster::start(3, 4);
    let o = ctl(&c, &["wait-ready", "--expected-groups", "4"]);
    assert_eq!(o.code, 0, "{o:?}\n{}", logs(&c));
    bootstrap_done(&c);
    let client = c.client();
    let ct = [("content-type", "application/octet-stream")];

    // Data in (very likely) every group.
    let mut want: Vec<Vec<u8>> = vec![Vec::new(); STREAMS];
    for (s, w) in want.iter_mut().enumerate() {
        let path = format!("/repl/s{s}");
        let r = send(&client, "PUT", &path, &ct, b"", Instant::now() + T).unwrap();
        assert_eq!(r.status, 201, "{}", r.describe());
        for i in 0..5 {
            let rec = record(i);
            let r = send(&client, "POST", &path, &ct, &rec, Instant::now() + T).unwrap();
            assert_eq!(r.status / 100, 2, "{}", r.describe());
            w.extend(rec);
        }
    }

    // A writer with an idempotent producer, for the whole test.
    let path = "/repl/live";
    let r = send(&client, "PUT", path, &ct, b"", Instant::now() + T).unwrap();
    assert_eq!(r.status, 201);
    let acked: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (acked, stop) = (Arc::clone(&acked), Arc::clone(&stop));
        // Starts at node 1; node 3 is reached only by a redirect once it leads a group.
        let client = c.client();
        std::thread::spawn(move || {
            let mut seq = 0u64;
            while !stop.load(Ordering::SeqCst) && seq < 100_000 {
                let s = seq.to_string();
                let h = [
                    ("content-type", "application/octet-stream"),
                    ("producer-id", "repl"),
                    ("producer-epoch", "0"),
                    ("producer-seq", s.as_str()),
                ];
                let r = send(&client, "POST", path, &h, &record(seq), Instant::now() + T)
                    .expect("a write was never acknowledged");
                assert!(r.status / 100 == 2, "write {seq}: {}", r.describe());
                seq += 1;
                acked.lock().unwrap().push(Instant::now());
            }
        })
    };
    let acked_now = || acked.lock().unwrap().len() as u64;

    // SIGKILL node 3, wipe its disk, start it again with the same configuration.
    c.nodes[2].kill9();
    let dir = c.nodes[2].dir.clone();
    std::fs::remove_dir_all(&dir).unwrap();
    c.nodes[2].start();

    // It stays out: not ready (and says why), nothing in its log, no leader known.
    let reasons = || {
        get(&c.nodes[2], "/__ursula/ready")
            .map(|r| (r.status, r.text()))
            .unwrap_or_default()
    };
    let (status, why) = reasons();
    assert_eq!(status, 503, "{why}");
    assert!(
        why.contains("permission to rejoin") && why.contains("allow-rejoin --node 3"),
        "{why}"
    );
    let m = metrics(&c.nodes[2]).unwrap();
    assert_eq!(
        m["rejoin"]["awaiting_permission"],
        serde_json::json!([0, 1, 2, 3]),
        "{m}"
    );
    let status = ctl(&c, &["status"]);
    assert!(
        status.stdout.contains("awaiting-permission=[0,1,2,3]"),
        "{status:?}"
    );
    // Writes go on meanwhile (over a balancer tick or two, which must not stall them on the
    // node that cannot take a leadership), and the node takes none of them.
    let from = acked_now() as usize;
    let t0 = Instant::now();
    assert!(
        common::wait_until(T, || t0.elapsed() >= Duration::from_secs(6)
            && acked_now() as usize >= from + 20),
        "writes stalled"
    );
    let gap = {
        let a = acked.lock().unwrap();
        a[from..].windows(2).map(|w| w[1] - w[0]).max().unwrap()
    };
    assert!(
        gap < Duration::from_secs(1),
        "writes stalled for {gap:?} while node 3 awaited permission"
    );
    let m = metrics(&c.nodes[2]).unwrap();
    for g in m["raft_groups"].as_array().unwrap() {
        assert!(
            g["last_log_index"].is_null(),
            "an awaiting node took entries: {g}"
        );
    }
    assert_eq!(reasons().0, 503);

    // The operator allows it; it rehydrates every group and becomes ready.
    let o = ctl(&c, &["allow-rejoin", "--node", "3"]);
    assert_eq!(o.code, 0, "{o:?}\n{}", logs(&c));
    assert!(o.stdout.contains("allowed in 4 of 4 groups"), "{o:?}");
    assert!(
        common::wait_until(T, || c.nodes[2].ready()),
        "the replaced node never became ready: {:?}\n{}",
        reasons(),
        logs(&c)
    );
    let m = metrics(&c.nodes[2]).unwrap();
    assert_eq!(
        m["rejoin"]["awaiting_permission"],
        serde_json::json!([]),
        "{m}"
    );
    assert_eq!(m["rejoin"]["rehydrating"], serde_json::json!([]), "{m}");
    // A second allow-rejoin has nothing to do.
    let o = ctl(&c, &["allow-rejoin", "--node", "3"]);
    assert_eq!(o.code, 0, "{o:?}");
    assert!(o.stdout.contains("awaits no permission"), "{o:?}");

    // Writes never stopped; then every acknowledged byte is on the replaced node.
    let before = acked_now();
    assert!(
        common::wait_until(T, || acked_now() >= before + 20),
        "writes stalled"
    );
    stop.store(true, Ordering::SeqCst);
    writer.join().unwrap();
    let n = acked_now();
    let live: Vec<u8> = (0..n).flat_map(record).collect();
    let r = send(
        &client,
        "GET",
        &format!("{path}?offset=-1"),
        &[],
        b"",
        Instant::now() + T,
    )
    .unwrap();
    assert!(
        r.body == live,
        "the leader's copy differs from the acknowledged writes"
    );
    for (s, w) in want.iter().enumerate() {
        let p = format!("/repl/s{s}");
        assert!(
            common::wait_until(T, || serves(&c, 2, &p, w)),
            "the replaced node does not serve {p}"
        );
    }
    assert!(
        common::wait_until(T, || serves(&c, 2, path, &live)),
        "the replaced node does not serve the live stream"
    );
}

/// [`common::cluster::Client::send`] from node 0, the answer only.
fn send(
    client: &common::cluster::Client,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    deadline: Instant,
) -> Option<common::Response> {
    client
        .send(0, method, path, headers, body, deadline)
        .map(|(_, r)| r)
}
