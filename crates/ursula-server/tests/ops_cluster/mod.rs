//! A cluster of real `ursula` processes for the operator tests (`ursulactl`, node
//! replacement): loopback client and admin ports per node, one config for all (`--node-id`
//! per process), temp data dirs, one shared `local` cold dir, and the `ursulactl` manifest.
//!
//! `ursulactl` runs in-process through `ursula_ctl::run_blocking` (the binary's own code path
//! minus `main`): the `ursula` binary is only reachable from this crate's tests
//! (`CARGO_BIN_EXE_ursula`), and the ctl binary itself is tested against stub nodes in
//! `crates/ursula-ctl/tests/stub.rs`.

#![allow(dead_code, reason = "each test file uses a part of the harness")]

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::common::{self, try_request};

/// Bound on every wait of these tests.
pub const T: Duration = Duration::from_secs(60);

pub struct Node {
    pub id: u64,
    pub port: u16,
    pub admin_port: u16,
    pub dir: PathBuf,
    config: PathBuf,
    child: Option<Child>,
}

impl Node {
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn admin_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.admin_port))
    }

    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// Starts the process and waits until it serves HTTP.
    pub fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.with_extension("log"))
            .expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_ursula"))
            .arg("server")
            .arg("--config")
            .arg(&self.config)
            .args(["--node-id", &self.id.to_string()])
            .args(["--listen", &self.addr().to_string()])
            .args(["--admin-listen", &self.admin_addr().to_string()])
            .arg("--data-dir")
            .arg(&self.dir)
            .env("NO_COLOR", "1")
            .env(
                "URSULA_LOG",
                std::env::var("CLUSTER_TEST_LOG").unwrap_or("info,openraft=error".into()),
            )
            .env_remove("URSULA_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn ursula");
        self.child = Some(child);
        let up = common::wait_until(T, || {
            try_request(
                self.addr(),
                "GET",
                "/__ursula/health",
                &[],
                b"",
                Duration::from_secs(1),
            )
            .is_ok_and(|r| r.status == 200)
        });
        assert!(up, "node {} never served: {}", self.id, self.log_tail());
    }

    /// SIGKILL, and reap.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.with_extension("log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// `GET path` on the client plane.
    pub fn get(&self, path: &str) -> Option<common::Response> {
        try_request(self.addr(), "GET", path, &[], b"", Duration::from_secs(5)).ok()
    }

    /// The JSON metrics, if the node answers.
    pub fn metrics(&self) -> Option<serde_json::Value> {
        let r = self.get("/__ursula/metrics")?;
        (r.status == 200).then(|| serde_json::from_slice(&r.body).ok())?
    }

    pub fn ready(&self) -> bool {
        self.get("/__ursula/ready").is_some_and(|r| r.status == 200)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

pub struct Cluster {
    pub nodes: Vec<Node>,
    /// The `ursulactl` manifest (TOML).
    pub manifest: PathBuf,
    config: PathBuf,
}

impl Cluster {
    /// `n` nodes with `groups` groups, started, not yet waited on for leaders.
    pub fn start(root: &Path, n: usize, groups: u32) -> Cluster {
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        let cold = root.join("cold");
        let mut text = format!(
            "fsync = false\ngroup_count = {groups}\n[server]\ncluster_id = \"ops\"\n\
             [raft]\ninit_membership_per_group = true\n\
             [storage.cold]\nbackend = \"local\"\n[storage.cold.local]\npath = {:?}\nshared = true\n",
            cold.display().to_string()
        );
        let mut manifest = String::new();
        for (i, (p, a)) in ports.iter().enumerate() {
            text.push_str(&format!(
                "[[raft.peers]]\nnode_id = {}\nurl = \"http://127.0.0.1:{p}\"\n",
                i + 1
            ));
            manifest.push_str(&format!(
                "[[nodes]]\nid = {}\nadmin_url = \"http://127.0.0.1:{a}\"\nhttp_url = \"http://127.0.0.1:{p}\"\n",
                i + 1
            ));
        }
        let config = root.join("cluster.toml");
        std::fs::write(&config, text).expect("config");
        let manifest_path = root.join("ursulactl.toml");
        std::fs::write(&manifest_path, manifest).expect("manifest");
        let mut nodes: Vec<Node> = ports
            .iter()
            .enumerate()
            .map(|(i, &(port, admin_port))| Node {
                id: i as u64 + 1,
                port,
                admin_port,
                dir: root.join(format!("node{}", i + 1)),
                config: config.clone(),
                child: None,
            })
            .collect();
        for node in &mut nodes {
            node.start();
        }
        Cluster {
            nodes,
            manifest: manifest_path,
            config,
        }
    }

    /// Turns `init_membership_per_group` off in the shared config, as an operator does after
    /// the first start (later starts of a node then never bootstrap a group).
    pub fn bootstrap_done(&self) {
        let text = std::fs::read_to_string(&self.config).expect("config");
        let text = text.replace(
            "init_membership_per_group = true",
            "init_membership_per_group = false",
        );
        std::fs::write(&self.config, text).expect("config");
    }

    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// Runs `ursulactl --config MANIFEST args...` in-process.
    pub fn ctl(&self, args: &[&str]) -> ursula_ctl::Outcome {
        let mut argv: Vec<String> = vec!["ursulactl".into(), "--config".into()];
        argv.push(self.manifest.display().to_string());
        argv.extend(args.iter().map(|a| (*a).to_owned()));
        ursula_ctl::run_blocking(argv)
    }

    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("--- node {}:\n{}", n.id, n.log_tail()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

fn port_of(location: &str) -> Option<u16> {
    let rest = location.strip_prefix("http://127.0.0.1:")?;
    rest.split('/').next()?.parse().ok()
}

/// Sends a request starting at `ports[0]`, following 307s to the leader and retrying 503s and
/// connection failures (on the next port), until a final answer or `deadline`.
pub fn send(
    ports: &[u16],
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    deadline: Instant,
) -> Option<common::Response> {
    let mut port = ports[0];
    let mut path = path.to_owned();
    while Instant::now() < deadline {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        match try_request(addr, method, &path, headers, body, Duration::from_secs(2)) {
            Ok(r) if r.status == 307 => {
                let loc = r.header("location")?.to_owned();
                port = port_of(&loc)?;
                let prefix = format!("http://127.0.0.1:{port}");
                path = loc.strip_prefix(&prefix)?.to_owned();
            }
            Ok(r) if r.status == 503 => std::thread::sleep(Duration::from_millis(25)),
            Ok(r) => return Some(r),
            Err(_) => {
                let i = ports.iter().position(|&p| p == port).unwrap_or(0);
                port = ports[(i + 1) % ports.len()];
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    None
}
