//! Three `ursula` processes sharing one bucket and prefix of a real S3-compatible server
//! (`[storage.cold] backend = "s3"`): writers with idempotent producers write enough that the
//! groups flush to the bucket, the leader of one stream's group is SIGKILLed mid-way (the new
//! leader goes on flushing), the killed node restarts, and every node, followers included,
//! serves catch-up reads of the cold bytes from its own replica and the shared bucket that are
//! exactly the acknowledged bytes.
//!
//! `scripts/s3-suite.sh` starts moto and runs this test with `URSULA_TEST_S3_ENDPOINT` set
//! (and `URSULA_TEST_S3_BUCKET`, `AWS_*` credentials); it is ignored otherwise, and fails
//! loudly when run without the endpoint, like the other S3 tests.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::cluster::{CLUSTER_T as T, Cluster, ClusterSpec, ColdStore, spawn_writers};
use common::wait_until;

const STREAMS: [&str; 2] = ["/clus3/a", "/clus3/b"];
/// Bytes of one record: 16 KiB, so a few dozen fill the 512 KiB hot bound of a group.
const REC: usize = 16 * 1024;
/// Records per stream before the kill, and at least as many after it.
const PHASE: usize = 40;

fn record(stream: usize, i: u64) -> Vec<u8> {
    let head = format!("<{stream}:{i:08}>");
    head.bytes().cycle().take(REC).collect()
}

#[test]
#[ignore = "needs an S3-compatible server: run scripts/s3-suite.sh"]
fn a_cluster_shares_one_s3_bucket_across_a_leader_kill() {
    let endpoint = std::env::var("URSULA_TEST_S3_ENDPOINT").expect("URSULA_TEST_S3_ENDPOINT");
    let bucket = std::env::var("URSULA_TEST_S3_BUCKET").unwrap_or("ursula-test".into());
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let mut spec = ClusterSpec::new(3);
    spec.group_count = 2;
    spec.cold = ColdStore::S3 {
        endpoint,
        bucket,
        root: format!("cluster-{millis}"),
    };
    spec.cold_toml = "flush_size = \"64KiB\"\nmax_hot_size_per_group = \"512KiB\"\n\
                      flush_interval = \"50ms\"\ngc_interval = \"100ms\"\n"
        .into();
    let mut c = Cluster::start(spec);
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
    let (acked, writers) = spawn_writers(&client, &STREAMS, "cs3", 10_000, record, &stop);
    let count = |s: usize| acked[s].lock().unwrap().len();

    // Enough for a flush, then the leader of stream a's group dies while writes go on.
    let lead = c.stream_leader(STREAMS[0]);
    let flushed = wait_until(T, || {
        count(0) >= PHASE && count(1) >= PHASE && c.nodes[lead].metric("cold_bytes") > 0
    });
    assert!(flushed, "nothing was flushed to S3:\n{}", c.log_tails(20));
    c.nodes[lead].kill9();
    let before = [count(0), count(1)];
    let more = wait_until(T, || {
        count(0) >= before[0] + PHASE && count(1) >= before[1] + PHASE
    });
    assert!(
        more,
        "writes did not go on after the kill:\n{}",
        c.log_tails(20)
    );
    stop.store(true, Ordering::SeqCst);
    for w in writers {
        w.join().unwrap();
    }
    let want: Vec<Vec<u8>> = (0..2)
        .map(|s| (0..count(s) as u64).flat_map(|i| record(s, i)).collect())
        .collect();

    // The new leaders flush what was written after the kill too: most bytes end up cold.
    let total: usize = want.iter().map(Vec::len).sum();
    let lead_now = c.stream_leader(STREAMS[0]);
    let cold = wait_until(T, || {
        c.nodes[lead_now].metric("cold_bytes") as usize >= total - 4 * 512 * 1024
    });
    assert!(cold, "the new leader did not flush to S3");

    eprintln!(
        "acknowledged: {:?} records, {total} bytes",
        [count(0), count(1)]
    );
    c.nodes[lead].start();
    c.wait_ready();
    // Every node, followers and the restarted one included, serves the acknowledged bytes
    // from its replica and the shared bucket; the full read (ending on the leader) agrees.
    for (i, node) in c.nodes.iter().enumerate() {
        let reads_before = node.metric("cold_reads_total");
        for (s, stream) in STREAMS.iter().enumerate() {
            let part = want[s].len() - REC;
            let mut got = None;
            let caught_up = wait_until(T, || {
                got = node.read_local(stream, part);
                got.is_some()
            });
            assert!(caught_up, "node {} never served {stream}", node.id);
            assert!(
                got.unwrap() == want[s][..part],
                "node {} serves other bytes of {stream}",
                node.id
            );
            let all = client.read_all(i, stream);
            assert_eq!(all.len(), want[s].len(), "node {}: {stream}", node.id);
            assert!(
                all == want[s],
                "node {}: the full read of {stream} differs",
                node.id
            );
        }
        eprintln!(
            "node {}: cold_bytes {} hot_bytes {} cold_reads_total {reads_before} -> {}",
            node.id,
            node.metric("cold_bytes"),
            node.metric("hot_bytes"),
            node.metric("cold_reads_total")
        );
        assert!(
            node.metric("cold_reads_total") > reads_before,
            "node {} read nothing from S3",
            node.id
        );
    }

    // Deleting the streams, whose bytes are cold (flushed partly by a leader that has died
    // since; objects may hold bytes of both): the groups' current leaders delete every object
    // from the bucket.
    let gc_before: u64 = c
        .nodes
        .iter()
        .map(|n| n.metric("cold_gc_deleted_total"))
        .sum();
    for (i, s) in STREAMS.iter().enumerate() {
        let r = client.must(i, "DELETE", s, &[], b"");
        assert_eq!(r.status, 204, "{}", r.describe());
    }
    let collected = wait_until(T, || {
        let deleted: u64 = c
            .nodes
            .iter()
            .map(|n| n.metric("cold_gc_deleted_total"))
            .sum();
        let left: u64 = c.nodes.iter().map(|n| n.metric("cold_objects")).sum();
        deleted > gc_before && left == 0
    });
    assert!(
        collected,
        "the streams' cold objects were not all deleted:\n{}",
        c.log_tails(20)
    );
}
