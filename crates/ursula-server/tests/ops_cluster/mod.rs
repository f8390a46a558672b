//! The operator tests' additions to the cluster harness (`common::cluster`): every node runs
//! an admin plane (`--admin-listen 127.0.0.1:0`), and `ursulactl` runs against a manifest
//! written from the nodes' current admin and client addresses.
//!
//! `ursulactl` runs in-process through `ursula_ctl::run_blocking` (the binary's own code path
//! minus `main`): the `ursula` binary is only reachable from this crate's tests
//! (`CARGO_BIN_EXE_ursula`), and the ctl binary itself is tested against stub nodes in
//! `crates/ursula-ctl/tests/stub.rs`.

#![allow(dead_code, reason = "each test file uses a part of the harness")]

use std::path::PathBuf;
use std::time::Duration;

use super::common::Response;
use super::common::cluster::{Cluster, ClusterSpec, Node};

/// `nodes` nodes with `groups` groups and admin planes, started (not yet waited on).
pub fn start(nodes: usize, groups: u32) -> Cluster {
    let mut spec = ClusterSpec::new(nodes);
    spec.group_count = groups;
    spec.args = vec!["--admin-listen".into(), "127.0.0.1:0".into()];
    Cluster::start(spec)
}

/// Writes the `ursulactl` manifest for the nodes' latest starts.
pub fn manifest(c: &Cluster) -> PathBuf {
    let mut text = String::new();
    for n in &c.nodes {
        let admin = n
            .admin_addr()
            .unwrap_or_else(|| panic!("node {} has no admin listener", n.id));
        text.push_str(&format!(
            "[[nodes]]\nid = {}\nadmin_url = \"http://{admin}\"\nhttp_url = \"{}\"\n",
            n.id,
            n.url()
        ));
    }
    let path = c.root().join("ursulactl.toml");
    std::fs::write(&path, text).expect("manifest");
    path
}

/// Runs `ursulactl --config MANIFEST args...` in-process.
pub fn ctl(c: &Cluster, args: &[&str]) -> ursula_ctl::Outcome {
    let mut argv: Vec<String> = vec!["ursulactl".into(), "--config".into()];
    argv.push(manifest(c).display().to_string());
    argv.extend(args.iter().map(|a| (*a).to_owned()));
    ursula_ctl::run_blocking(argv)
}

/// Turns `init_membership_per_group` off in the shared config, as an operator does after
/// the first start (later starts of a node then never bootstrap a group).
pub fn bootstrap_done(c: &Cluster) {
    let path = c.root().join("cluster.toml");
    let text = std::fs::read_to_string(&path).expect("config");
    assert!(text.contains("init_membership_per_group = true"), "{text}");
    let text = text.replace(
        "init_membership_per_group = true",
        "init_membership_per_group = false",
    );
    std::fs::write(&path, text).expect("config");
}

/// `GET path` on a node's client plane, if it answers.
pub fn get(n: &Node, path: &str) -> Option<Response> {
    n.request("GET", path, &[], b"", Duration::from_secs(5))
        .ok()
}

/// A node's JSON metrics, if it answers.
pub fn metrics(n: &Node) -> Option<serde_json::Value> {
    get(n, "/__ursula/metrics")
        .filter(|r| r.status == 200)
        .and_then(|r| serde_json::from_slice(&r.body).ok())
}

/// Every node's log tail.
pub fn logs(c: &Cluster) -> String {
    c.log_tails(30)
}
