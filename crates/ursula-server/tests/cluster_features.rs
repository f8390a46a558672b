//! The protocol's extensions on a 3-node cluster whose streams' groups are led by different
//! nodes: a fork whose source's group another node leads (the pin crosses groups and nodes),
//! producers, snapshots, retention, bootstrap and soft delete, each reached through any node
//! (redirects followed), and read back from every node.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod common;

use common::cluster::{Client, Cluster, ClusterSpec};

const OCTET: (&str, &str) = ("content-type", "application/octet-stream");

/// The node leading the group of `path` (which need not exist): the one that does not
/// redirect a `HEAD`.
fn leader_of(c: &mut Cluster, path: &str) -> usize {
    let mut found = None;
    assert!(common::wait_until(common::cluster::CLUSTER_T, || {
        found = (0..c.nodes.len()).find(|&i| {
            c.nodes[i]
                .request("HEAD", path, &[], b"", std::time::Duration::from_secs(1))
                .is_ok_and(|r| r.status != 307 && r.status != 503)
        });
        found.is_some()
    }));
    found.unwrap()
}

fn ok(r: &common::Response) {
    assert!(r.status / 100 == 2, "{}", r.describe());
}

#[test]
fn forks_producers_snapshots_and_retention_across_nodes() {
    let mut spec = ClusterSpec::new(3);
    // Right after start one node may lead every group; the balancer spreads them.
    spec.top_toml = "[governance.leadership_balance]\ninterval = \"1s\"\n".into();
    let mut c = Cluster::start(spec);
    c.wait_ready();
    let client: Client = c.client();
    let src = "/feat/source";
    let mut src_leader = 0;
    let mut fork = None;
    let spread = common::wait_until(common::cluster::CLUSTER_T, || {
        src_leader = leader_of(&mut c, src);
        fork = (0..64)
            .map(|i| format!("/feat/fork{i}"))
            .find(|p| leader_of(&mut c, p) != src_leader);
        fork.is_some()
    });
    assert!(spread, "no fork path whose group another node leads");
    let fork = fork.unwrap();
    let fork_leader = leader_of(&mut c, &fork);
    assert_ne!(src_leader, fork_leader);
    // Every request starts at a node that leads neither stream, or at the other leader.
    let third = (0..3)
        .find(|&i| i != src_leader && i != fork_leader)
        .unwrap();

    // The source, written by an idempotent producer; a retried append lands once.
    ok(&client.must(third, "PUT", src, &[OCTET], b""));
    for seq in 0..4u32 {
        let s = seq.to_string();
        let h = [
            OCTET,
            ("producer-id", "p"),
            ("producer-epoch", "0"),
            ("producer-seq", s.as_str()),
        ];
        let body = format!("s{seq};");
        ok(&client.must(fork_leader, "POST", src, &h, body.as_bytes()));
        if seq == 2 {
            let again = client.must(third, "POST", src, &h, body.as_bytes());
            ok(&again);
        }
    }
    assert_eq!(client.read_all(third, src), b"s0;s1;s2;s3;");

    // A fork at offset 6 ("s0;s1;"), created through a node that leads neither group.
    let off = common::off20(6);
    let h = [
        OCTET,
        ("stream-forked-from", src),
        ("stream-fork-offset", off.as_str()),
    ];
    let r = client.must(third, "PUT", &fork, &h, b"");
    assert_eq!(r.status, 201, "{}", r.describe());
    ok(&client.must(src_leader, "POST", &fork, &[OCTET], b"f0;"));
    ok(&client.must(src_leader, "POST", src, &[OCTET], b"s4;"));
    for i in 0..3 {
        assert_eq!(
            client.read_all(i, &fork),
            b"s0;s1;f0;",
            "fork read from node {i}"
        );
        assert_eq!(
            client.read_all(i, src),
            b"s0;s1;s2;s3;s4;",
            "source from node {i}"
        );
    }

    // The source is soft-deleted while the fork pins it; the fork keeps its inherited bytes.
    let r = client.must(third, "DELETE", src, &[], b"");
    assert_eq!(r.status, 204, "{}", r.describe());
    let r = client.must(third, "GET", &format!("{src}?offset=-1"), &[], b"");
    assert!(matches!(r.status, 404 | 410), "{}", r.describe());
    for i in 0..3 {
        assert_eq!(
            client.read_all(i, &fork),
            b"s0;s1;f0;",
            "fork after the source's delete"
        );
    }

    // A snapshot of the fork, retention before it, and a bootstrap that starts there.
    let snap_at = common::off20(9);
    let r = client.must(
        third,
        "PUT",
        &format!("{fork}/snapshot/{snap_at}"),
        &[OCTET],
        b"STATE",
    );
    assert_eq!(r.status, 204, "{}", r.describe());
    ok(&client.must(third, "POST", &fork, &[OCTET], b"f1;"));
    let r = client.must(
        third,
        "GET",
        &format!("{fork}/snapshot/{snap_at}"),
        &[],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.describe());
    assert_eq!(r.body, b"STATE");
    let r = client.must(
        third,
        "PUT",
        &format!("{fork}/retention/{snap_at}"),
        &[],
        b"",
    );
    assert_eq!(r.status, 204, "{}", r.describe());
    let r = client.must(third, "GET", &format!("{fork}/bootstrap"), &[], b"");
    assert_eq!(r.status, 200, "{}", r.describe());
    let text = String::from_utf8_lossy(&r.body);
    assert!(text.contains("STATE") && text.contains("f1;"), "{text}");
    assert!(
        !text.contains("s0;"),
        "retained history in the bootstrap: {text}"
    );

    // The fork's delete releases the soft-deleted source (the pin crosses back).
    let r = client.must(third, "DELETE", &fork, &[], b"");
    assert_eq!(r.status, 204, "{}", r.describe());
    let gone = common::wait_until(common::cluster::CLUSTER_T, || {
        client.must(third, "HEAD", src, &[], b"").status == 404
    });
    assert!(
        gone,
        "the source stayed soft-deleted after its last fork was deleted"
    );
}
