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

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Response, try_request};

const STREAM: &str = "/clus/failover";
const REC: usize = 8;
const T: Duration = Duration::from_secs(60);
/// SIGKILLs of a group's leader per run (then one SIGSTOP).
const KILL_CYCLES: usize = 10;

struct Proc {
    id: u64,
    port: u16,
    child: Option<Child>,
    dir: PathBuf,
    config: PathBuf,
}

impl Proc {
    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.with_extension("log"))
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_ursula"))
            .arg("server")
            .arg("--config")
            .arg(&self.config)
            .args(["--node-id", &self.id.to_string()])
            .args(["--listen", &self.addr().to_string()])
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

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.with_extension("log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

fn signal(p: &Proc, sig: &str) {
    let pid = p.child.as_ref().expect("running").id();
    let st = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(st.success(), "kill -{sig} {pid}");
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn cluster(root: &Path) -> Vec<Proc> {
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let cold = root.join("cold");
    let mut text = format!(
        "fsync = false\ngroup_count = 4\n[server]\ncluster_id = \"it\"\n\
         [raft]\ninit_membership_per_group = true\n\
         [storage.cold]\nbackend = \"local\"\n[storage.cold.local]\npath = {:?}\nshared = true\n",
        cold.display().to_string()
    );
    for (i, p) in ports.iter().enumerate() {
        text.push_str(&format!(
            "[[raft.peers]]\nnode_id = {}\nurl = \"http://127.0.0.1:{p}\"\n",
            i + 1
        ));
    }
    let config = root.join("cluster.toml");
    std::fs::write(&config, text).unwrap();
    let mut procs: Vec<Proc> = ports
        .iter()
        .enumerate()
        .map(|(i, &port)| Proc {
            id: i as u64 + 1,
            port,
            child: None,
            dir: root.join(format!("node{}", i + 1)),
            config: config.clone(),
        })
        .collect();
    for p in &mut procs {
        p.start();
    }
    procs
}

fn ready(p: &Proc) -> bool {
    try_request(
        p.addr(),
        "GET",
        "/__ursula/ready",
        &[],
        b"",
        Duration::from_secs(1),
    )
    .is_ok_and(|r| r.status == 200)
}

fn port_of(location: &str) -> Option<u16> {
    let rest = location.strip_prefix("http://127.0.0.1:")?;
    rest.split('/').next()?.parse().ok()
}

/// Sends a request starting at `port`, following 307s and retrying 503s and connection
/// failures (on the next of `ports`), until a final answer or `deadline`.
fn send(
    ports: &[u16],
    mut port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    deadline: Instant,
) -> Option<(u16, Response)> {
    let mut path = path.to_owned();
    while Instant::now() < deadline {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        match try_request(addr, method, &path, headers, body, Duration::from_secs(2)) {
            Ok(r) if r.status == 307 => {
                let loc = r.header("location").expect("Location on 307").to_owned();
                assert!(r.header("x-ursula-raft-leader-id").is_some());
                port = port_of(&loc).expect("a peer URL");
                path = loc[loc.find(&format!(":{port}")).unwrap() + port.to_string().len() + 1..]
                    .to_owned();
            }
            Ok(r) if r.status == 503 => {
                assert_eq!(r.header("retry-after"), Some("1"), "{}", r.describe());
                std::thread::sleep(Duration::from_millis(25));
            }
            Ok(r) => return Some((port, r)),
            Err(_) => {
                let i = ports.iter().position(|&p| p == port).unwrap_or(0);
                port = ports[(i + 1) % ports.len()];
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    None
}

fn record(i: u64) -> Vec<u8> {
    format!("w{i:07}").into_bytes()
}

/// The node that leads the stream's group: the one answering `HEAD` itself.
fn leader(procs: &[Proc]) -> usize {
    let mut found = None;
    let ok = common::wait_until(T, || {
        found = procs.iter().position(|p| {
            p.child.is_some()
                && try_request(p.addr(), "HEAD", STREAM, &[], b"", Duration::from_secs(1))
                    .is_ok_and(|r| r.status == 200)
        });
        found.is_some()
    });
    assert!(ok, "no node leads the stream's group");
    found.unwrap()
}

#[test]
fn three_processes_redirect_fail_over_and_catch_up() {
    let root = tempfile::tempdir().unwrap();
    let mut procs = cluster(root.path());
    let ports: Vec<u16> = procs.iter().map(|p| p.port).collect();
    assert!(
        common::wait_until(T, || procs.iter().all(ready)),
        "the cluster never became ready:\n{}",
        procs[0].log_tail()
    );

    // Create on node 1 (redirected if it does not lead) and find the leader.
    let ct = [("content-type", "application/octet-stream")];
    let (_, r) = send(
        &ports,
        ports[0],
        "PUT",
        STREAM,
        &ct,
        b"",
        Instant::now() + T,
    )
    .unwrap();
    assert_eq!(r.status, 201, "{}", r.describe());
    let lead = leader(&procs);
    let follower = (lead + 1) % 3;
    let direct = try_request(procs[follower].addr(), "POST", STREAM, &ct, b"x", T).unwrap();
    assert_eq!(
        direct.status,
        307,
        "a follower took a write: {}",
        direct.describe()
    );
    assert_eq!(
        direct.header("location"),
        Some(format!("http://127.0.0.1:{}{STREAM}", procs[lead].port).as_str())
    );
    assert_eq!(
        direct.header("x-ursula-raft-leader-id"),
        Some(procs[lead].id.to_string().as_str())
    );

    // Per-group Raft metrics: the leader reports itself leader of some group, and the lag of
    // both peers there; a follower reports who leads.
    let prom = |i: usize| {
        try_request(
            procs[i].addr(),
            "GET",
            "/__ursula/metrics/prometheus",
            &[],
            b"",
            T,
        )
        .unwrap()
        .text()
    };
    let lead_text = prom(lead);
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
    let id = procs[lead].id.to_string();
    assert!(
        prom(follower)
            .lines()
            .any(|l| l.starts_with("ursula_raft_group_leader{") && l.ends_with(&format!(" {id}"))),
        "the follower does not know the leader"
    );

    // A bucket is replicated to every group, whatever node leads each: any node creates it.
    let r = try_request(procs[follower].addr(), "PUT", "/clusbucket", &[], b"", T).unwrap();
    assert_eq!(
        r.status / 100,
        2,
        "bucket create on a follower: {}",
        r.describe()
    );
    for p in &procs {
        let seen = common::wait_until(T, || {
            try_request(
                p.addr(),
                "GET",
                "/clusbucket",
                &[],
                b"",
                Duration::from_secs(2),
            )
            .is_ok_and(|r| r.status == 200)
        });
        assert!(seen, "node {} never saw the bucket", p.id);
    }

    // A writer with an idempotent producer appends record after record through whichever
    // node answers; a retried record is deduplicated, so each is in the stream exactly once.
    let acked: Arc<Mutex<Vec<(u64, Instant)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (acked, stop, ports) = (Arc::clone(&acked), Arc::clone(&stop), ports.clone());
        std::thread::spawn(move || {
            let mut seq = 0u64;
            let mut port = ports[0];
            while !stop.load(Ordering::SeqCst) && seq < 100_000 {
                let s = seq.to_string();
                let h = [
                    ("content-type", "application/octet-stream"),
                    ("producer-id", "writer"),
                    ("producer-epoch", "0"),
                    ("producer-seq", s.as_str()),
                ];
                let (p, r) = send(
                    &ports,
                    port,
                    "POST",
                    STREAM,
                    &h,
                    &record(seq),
                    Instant::now() + T,
                )
                .expect("a write never succeeded");
                assert!(r.status / 100 == 2, "append {seq}: {}", r.describe());
                port = p;
                acked.lock().unwrap().push((seq, Instant::now()));
                seq += 1;
            }
        })
    };
    let acked_len = |a: &Arc<Mutex<Vec<(u64, Instant)>>>| a.lock().unwrap().len();
    assert!(common::wait_until(T, || acked_len(&acked) >= 20));

    // Kill the group's leader three times; each time measure how long until the next write
    // is acknowledged, then restart the node and let it catch up.
    let mut gaps = Vec::new();
    for cycle in 0..KILL_CYCLES + 1 {
        let lead = leader(&procs);
        let before = acked_len(&acked);
        // The last cycle freezes the leader (SIGSTOP) instead: when it resumes it must not
        // acknowledge anything without a quorum (checked below with every other ack).
        let freeze = cycle == KILL_CYCLES;
        let killed_at = Instant::now();
        if freeze {
            signal(&procs[lead], "STOP");
        } else {
            procs[lead].kill9();
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
            signal(&procs[lead], "CONT");
        } else {
            gaps.push(resumed);
            procs[lead].start();
        }
        assert!(
            common::wait_until(T, || procs.iter().all(ready)),
            "node {} never became ready again:\n{}",
            procs[lead].id,
            procs[lead].log_tail()
        );
        // As an operator would (verify-cluster), let it catch up before the next kill: it
        // serves, from its own replica, what was acknowledged a moment ago.
        let upto = (acked_len(&acked) * REC) as u64;
        let path = format!("{STREAM}?offset=-1&max_bytes={upto}");
        let caught_up = common::wait_until(T, || {
            try_request(
                procs[lead].addr(),
                "GET",
                &path,
                &[],
                b"",
                Duration::from_secs(2),
            )
            .is_ok_and(|r| r.status == 200 && r.body.len() as u64 == upto)
        });
        assert!(caught_up, "node {} never caught up", procs[lead].id);
    }
    stop.store(true, Ordering::SeqCst);
    writer.join().unwrap();
    if let Ok(dir) = std::env::var("CLUSTER_TEST_KEEP_LOGS") {
        for p in &procs {
            let _ = std::fs::copy(
                p.dir.with_extension("log"),
                format!("{dir}/node{}.log", p.id),
            );
        }
    }
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

    // Every acknowledged append exactly once, in order, on every node: a follower serves what
    // it applied (all but the tail byte, so it states no tail fact), the full read is
    // redirected to the leader.
    let n = acked_len(&acked) as u64;
    let want: Vec<u8> = (0..n).flat_map(record).collect();
    for p in &procs {
        let (_, r) = send(
            &ports,
            p.port,
            "GET",
            &format!("{STREAM}?offset=-1"),
            &[],
            b"",
            Instant::now() + T,
        )
        .unwrap();
        assert_eq!(r.status, 200, "node {}: {}", p.id, r.text());
        assert_eq!(r.body.len(), want.len(), "node {}", p.id);
        assert!(r.body == want, "node {} holds other bytes", p.id);
        let part = want.len() - REC;
        let path = format!("{STREAM}?offset=-1&max_bytes={part}");
        let local = common::wait_until(T, || {
            try_request(p.addr(), "GET", &path, &[], b"", Duration::from_secs(2))
                .is_ok_and(|r| r.status == 200 && r.body == want[..part])
        });
        assert!(local, "node {} did not serve its applied bytes", p.id);
    }
}
