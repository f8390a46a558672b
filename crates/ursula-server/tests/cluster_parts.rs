//! A multi-part snapshot upload across leadership changes on three processes sharing one
//! `local` cold dir: parts staged through one leader, more through the next, committed after
//! the leadership came back, from a node that leads nothing; every node serves the snapshot
//! and the spent parts are deleted.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod common;

use common::cluster::{CLUSTER_T as T, Cluster, ClusterSpec};
use std::net::SocketAddr;
use std::path::Path;

const OCTETS: &str = "application/octet-stream";
const DOC: &str = "/cparts/doc";

/// The snapshot digest of extensions.md §6.3.
fn digest(blob: &[u8]) -> String {
    let mut h = blake3::Hasher::new();
    h.update(&(OCTETS.len() as u64).to_le_bytes());
    h.update(OCTETS.as_bytes());
    h.update(blob);
    h.finalize().to_hex().to_string()
}

/// Staged part files under the shared cold dir.
fn parts_in(dir: &Path) -> usize {
    fn walk(d: &Path, n: &mut usize) {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, n);
            } else if p.to_string_lossy().ends_with(".part") {
                *n += 1;
            }
        }
    }
    let mut n = 0;
    walk(dir, &mut n);
    n
}

fn transfer(admin: SocketAddr, to: u64) {
    let r = common::request(
        admin,
        "POST",
        &format!("/__ursula/raft/0/leader/transfer/{to}"),
        &[],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.describe());
}

#[test]
fn parts_staged_through_two_leaders_commit_after_the_leadership_returns() {
    let mut spec = ClusterSpec::new(3);
    spec.group_count = 1;
    spec.top_toml = "[governance.leadership_balance]\ninterval = \"0s\"\n".into();
    spec.args = vec!["--admin-listen".into(), "127.0.0.1:0".into()];
    let mut c = Cluster::start(spec);
    c.wait_ready();
    let client = c.client();
    let admins: Vec<SocketAddr> = c.nodes.iter().map(|n| n.admin_addr().unwrap()).collect();
    let r = client.must(0, "PUT", DOC, &[("content-type", OCTETS)], b"0123456789");
    assert_eq!(r.status, 201, "{}", r.describe());
    let first = c.group_leader(0);
    let second = (first + 1) % 3;
    let stage = |from: usize, body: &[u8]| {
        let r = client.must(from, "POST", &format!("{DOC}/snapshot/0/parts"), &[], body);
        assert_eq!(r.status, 201, "{}", r.describe());
        r.header("stream-snapshot-part").unwrap().to_owned()
    };
    let a: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
    let b = b"the second part, staged through the second leader".to_vec();
    // Through a follower: redirected to the first leader.
    let pa = stage(second, &a);
    transfer(admins[first], c.nodes[second].id);
    assert_eq!(c.group_leader(0), second);
    // Through the first leader, now a follower: redirected to the second.
    let pb = stage(first, &b);
    transfer(admins[second], c.nodes[first].id);
    assert_eq!(c.group_leader(0), first);
    let cold = c.root().join("cold");
    assert_eq!(parts_in(&cold), 2, "both parts staged in the shared store");

    // Committed from the node that leads nothing now.
    let third = (first + 2) % 3;
    let whole = [a, b].concat();
    let d = digest(&whole);
    let manifest = format!("{pa}\n{pb}\n");
    let commit = |from: usize| {
        client.must(
            from,
            "PUT",
            &format!("{DOC}/snapshot/10"),
            &[
                ("content-type", OCTETS),
                ("stream-snapshot-parts", "2"),
                ("stream-snapshot-digest", d.as_str()),
            ],
            manifest.as_bytes(),
        )
    };
    let r = commit(third);
    assert_eq!(r.status, 204, "{}", r.describe());
    assert_eq!(r.header("stream-snapshot-digest"), Some(d.as_str()));
    for i in 0..3 {
        let got = client.must(i, "GET", &format!("{DOC}/snapshot/10"), &[], b"");
        assert_eq!(got.status, 200, "node {i}: {}", got.describe());
        assert!(got.body == whole, "node {i} serves other snapshot bytes");
    }
    assert!(
        common::wait_until(T, || parts_in(&cold) == 0),
        "the spent parts were not deleted"
    );
    // A repeat answers by its key, the parts long gone.
    assert_eq!(commit(second).status, 204);
}
