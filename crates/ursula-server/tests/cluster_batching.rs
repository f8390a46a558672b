//! Three `ursula` processes with many Raft groups: the small RPCs of the groups a node leads
//! travel to each peer in shared requests (`[raft] rpc_batching`, on by default), the
//! metrics count them, and the cluster replicates the same with batching off.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod common;

use common::cluster::{CLUSTER_T as T, Cluster, ClusterSpec, Node};

const GROUPS: u32 = 24;
const STREAMS: usize = 24;

/// The node's `ursula_raft_rpc_{name}_total` counter.
fn rpc_counter(n: &Node, name: &str) -> u64 {
    let line = format!("ursula_raft_rpc_{name}_total ");
    n.prometheus()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix(line.as_str()).map(str::to_owned))
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn totals(c: &Cluster, name: &str) -> u64 {
    c.nodes.iter().map(|n| rpc_counter(n, name)).sum()
}

/// Writes two records to each of [`STREAMS`] streams (spread over the groups) through node
/// 0, then reads every stream's first record back from every node on its own (a follower
/// serves applied bytes short of the tail).
fn write_and_read_everywhere(c: &mut Cluster) {
    let client = c.client();
    let ct = [("content-type", "application/octet-stream")];
    for i in 0..STREAMS {
        let path = format!("/batching/s{i}");
        let r = client.must(0, "PUT", &path, &ct, b"");
        assert_eq!(r.status, 201, "{}", r.describe());
        for body in [format!("record {i}"), "tail".to_owned()] {
            let r = client.must(0, "POST", &path, &ct, body.as_bytes());
            assert_eq!(r.status / 100, 2, "{}", r.describe());
        }
    }
    for i in 0..STREAMS {
        let path = format!("/batching/s{i}");
        let want = format!("record {i}").into_bytes();
        for n in &c.nodes {
            let seen = common::wait_until(T, || {
                n.read_local(&path, want.len()).as_deref() == Some(want.as_slice())
            });
            assert!(seen, "node {} never served {path}", n.id);
        }
    }
}

#[test]
fn the_rpcs_of_many_groups_share_requests_and_batching_can_be_turned_off() {
    let mut spec = ClusterSpec::new(3);
    spec.group_count = GROUPS;
    let mut c = Cluster::start(spec);
    c.wait_ready();
    write_and_read_everywhere(&mut c);
    // Leaders heartbeat each of their groups every 100 ms; the heartbeats a node sends a peer
    // within 5 ms of each other share one request.
    let batched = common::wait_until(T, || {
        totals(&c, "batches") >= 10 && totals(&c, "batched_frames") >= 2 * totals(&c, "batches")
    });
    assert!(
        batched,
        "no batches: {} batches of {} frames, {} single frames",
        totals(&c, "batches"),
        totals(&c, "batched_frames"),
        totals(&c, "single_frames")
    );
    drop(c);

    let mut spec = ClusterSpec::new(3);
    spec.group_count = GROUPS;
    spec.raft_toml = "rpc_batching = false".into();
    let mut c = Cluster::start(spec);
    c.wait_ready();
    write_and_read_everywhere(&mut c);
    assert!(common::wait_until(T, || totals(&c, "single_frames") > 100));
    assert_eq!(totals(&c, "batches"), 0, "batching is off");
    assert_eq!(totals(&c, "batched_frames"), 0, "batching is off");
}
