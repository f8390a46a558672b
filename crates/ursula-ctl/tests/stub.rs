//! `ursulactl` (the real binary) against stub nodes: tiny HTTP servers on loopback ports that
//! answer the metrics, transfer, maintenance and allow-next-revert contracts from one shared
//! cluster state, so a transfer on one node shows in every node's metrics.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

#[derive(Default)]
struct State {
    /// `leaders[g]`: the leader of group g (0: none).
    leaders: Vec<u64>,
    voters: Vec<u64>,
    /// Nodes marked for maintenance.
    maintenance: BTreeSet<u64>,
    /// Nodes that do not answer at all.
    down: BTreeSet<u64>,
    /// Groups each node awaits permission in.
    awaiting: Vec<(u64, Vec<u32>)>,
    /// `(group, node)` permissions given.
    allowed: Vec<(u32, u64)>,
    /// Requests seen: "node METHOD path".
    log: Vec<String>,
    /// Each node's last log index in every group (default 100).
    logs: BTreeMap<u64, u64>,
    /// Each node's `wal_backend` (default "disk"; "" reports none).
    wal: BTreeMap<u64, String>,
}

type Shared = Arc<Mutex<State>>;

struct Stub {
    state: Shared,
    dir: tempfile::TempDir,
}

impl Stub {
    fn start(nodes: u64, leaders: Vec<u64>) -> Stub {
        let state = Arc::new(Mutex::new(State {
            leaders,
            voters: (1..=nodes).collect(),
            ..Default::default()
        }));
        let mut ports = Vec::new();
        for id in 1..=nodes {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            ports.push(l.local_addr().unwrap().port());
            let st = Arc::clone(&state);
            std::thread::spawn(move || {
                for conn in l.incoming().flatten() {
                    let st = Arc::clone(&st);
                    std::thread::spawn(move || serve(id, conn, &st));
                }
            });
        }
        let dir = tempfile::tempdir().unwrap();
        let mut text = String::new();
        for (i, p) in ports.iter().enumerate() {
            text.push_str(&format!(
                "[[nodes]]\nid = {}\nhost = \"127.0.0.1\"\nadmin_port = {p}\n",
                i + 1
            ));
        }
        std::fs::write(dir.path().join("cluster.toml"), text).unwrap();
        Stub { state, dir }
    }

    fn ctl(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_ursulactl"))
            .arg("--config")
            .arg(self.dir.path().join("cluster.toml"))
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn leaders(&self) -> Vec<u64> {
        self.state.lock().unwrap().leaders.clone()
    }
}

fn shed(st: &State, node: u64) -> serde_json::Value {
    let m = st.maintenance.contains(&node);
    json!({"bits": u32::from(m), "state": if m {"maintenance-drain"} else {"normal"},
           "should_accept_transfer": !m, "should_campaign": !m,
           "should_shed_current_leaders": m})
}

fn error(code: &str, msg: &str) -> serde_json::Value {
    json!({"error": {"code": code, "message": msg}})
}

fn route(node: u64, method: &str, path: &str, st: &mut State) -> (u16, serde_json::Value) {
    let segs: Vec<&str> = path.trim_start_matches("/__ursula/").split('/').collect();
    match (method, segs.as_slice()) {
        ("GET", ["metrics"]) => {
            let groups: Vec<_> = st
                .leaders
                .iter()
                .enumerate()
                .map(|(g, &l)| {
                    json!({"raft_group_id": g, "node_id": node, "current_term": 3,
                           "current_leader": if l == 0 { None } else { Some(l) },
                           "last_log_index": st.logs.get(&node).copied().unwrap_or(100),
                           "voter_ids": st.voters, "learner_ids": []})
                })
                .collect();
            let awaiting = st
                .awaiting
                .iter()
                .find(|(n, _)| *n == node)
                .map(|(_, g)| g.clone())
                .unwrap_or_default();
            let wal = match st.wal.get(&node).map(String::as_str) {
                None => Some("disk"),
                Some("") => None,
                Some(w) => Some(w),
            };
            (
                200,
                json!({"raft_node_id": node, "raft_group_count": st.leaders.len(),
                       "wal_backend": wal, "raft_groups": groups,
                       "rejoin": {"awaiting_permission": awaiting, "rehydrating": []}}),
            )
        }
        ("GET", ["leadership-shed"]) => (200, shed(st, node)),
        ("POST", ["leadership-shed", "maintenance"]) => {
            st.maintenance.insert(node);
            (200, shed(st, node))
        }
        ("DELETE", ["leadership-shed", "maintenance"]) => {
            st.maintenance.remove(&node);
            (200, shed(st, node))
        }
        ("POST", ["raft", g, "leader", "transfer", to]) => {
            let (g, to): (usize, u64) = (g.parse().unwrap(), to.parse().unwrap());
            if st.leaders[g] != node {
                return (
                    409,
                    error("NOT_LEADER", &format!("node {} leads", st.leaders[g])),
                );
            }
            if !st.voters.contains(&to) {
                return (
                    400,
                    error("BAD_REQUEST", &format!("node {to} is not a voter")),
                );
            }
            if st.maintenance.contains(&to) {
                return (503, error("LEADER_UNAVAILABLE", "target refused"));
            }
            st.leaders[g] = to;
            (200, json!({"raft_group_id": g, "leader": to}))
        }
        ("POST", ["raft", g, "nodes", n, "allow-next-revert"]) => {
            let (g, n): (u32, u64) = (g.parse().unwrap(), n.parse().unwrap());
            if st.leaders[g as usize] != node {
                return (409, error("NOT_LEADER", "not the leader"));
            }
            st.allowed.push((g, n));
            (
                200,
                json!({"raft_group_id": g, "node": n, "commit_index": 41}),
            )
        }
        _ => (404, error("NOT_FOUND", "no such route")),
    }
}

fn serve(node: u64, conn: TcpStream, st: &Shared) {
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut r = BufReader::new(conn.try_clone().unwrap());
    let mut w = conn;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let (method, path) = (
            parts.next().unwrap_or("").to_owned(),
            parts.next().unwrap_or("").to_owned(),
        );
        let mut len = 0usize;
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            if h.trim().is_empty() {
                break;
            }
            if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; len];
        let _ = r.read_exact(&mut body);
        let (status, json) = {
            let mut s = st.lock().unwrap();
            if s.down.contains(&node) {
                return;
            }
            s.log.push(format!("{node} {method} {path}"));
            route(node, &method, &path, &mut s)
        };
        let body = json.to_string();
        let resp = format!(
            "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        if w.write_all(resp.as_bytes()).is_err() {
            return;
        }
    }
}

fn one_error_line(stderr: &str, what: &str) {
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    assert!(lines[0].starts_with("ursulactl: "), "{stderr}");
    assert!(lines[0].contains(what), "{what:?} in {stderr}");
}

#[test]
fn status_reports_unreachable_nodes_without_failing() {
    let s = Stub::start(3, vec![1, 2, 1, 0]);
    s.state.lock().unwrap().down.insert(3);
    let (code, out, err) = s.ctl(&["status"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("node 1 ") && out.contains("led=2 [0,2]"),
        "{out}"
    );
    assert!(
        out.contains("node 3 ") && out.contains("unreachable"),
        "{out}"
    );
    assert!(out.contains("leaderless groups: 3"), "{out}");
    let (code, out, _) = s.ctl(&["status", "--json"]);
    assert_eq!(code, 0);
    let j: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(j["nodes"][0]["led"], json!([0, 2]));
    assert_eq!(j["nodes"][2]["reachable"], false);
    assert_eq!(j["leaderless_groups"], json!([3]));
    assert_eq!(j["leaders_per_node"]["1"], 2);
}

#[test]
fn wait_ready_waits_for_every_leader_and_aborts_with_2() {
    let s = Stub::start(3, vec![1, 2, 0]);
    let (code, _, err) = s.ctl(&[
        "wait-ready",
        "--expected-groups",
        "3",
        "--timeout-secs",
        "1",
    ]);
    assert_eq!(code, 2, "{err}");
    one_error_line(&err, "no leader for groups 2");
    let (code, _, err) = s.ctl(&[
        "wait-ready",
        "--expected-groups",
        "4",
        "--timeout-secs",
        "1",
    ]);
    assert_eq!(code, 2);
    one_error_line(&err, "reports 3 groups, expected 4");
    // A leader appears while it waits.
    let st = Arc::clone(&s.state);
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(600));
        st.lock().unwrap().leaders[2] = 3;
    });
    let (code, out, err) = s.ctl(&[
        "wait-ready",
        "--expected-groups",
        "3",
        "--timeout-secs",
        "30",
    ]);
    t.join().unwrap();
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("ready: 3 nodes"), "{out}");
}

#[test]
fn transfer_leader_calls_the_leader() {
    let s = Stub::start(3, vec![1, 2]);
    let (code, out, err) = s.ctl(&["transfer-leader", "--group", "0", "--to", "3"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("moved from node 1 to node 3"), "{out}");
    assert_eq!(s.leaders(), vec![3, 2]);
    assert!(
        s.state
            .lock()
            .unwrap()
            .log
            .contains(&"1 POST /__ursula/raft/0/leader/transfer/3".to_owned())
    );
    let (code, out, _) = s.ctl(&["transfer-leader", "--group", "1", "--to", "2"]);
    assert_eq!(code, 0);
    assert!(out.contains("already leads"), "{out}");
    let (code, _, err) = s.ctl(&["transfer-leader", "--group", "1", "--to", "9"]);
    assert_eq!(code, 1);
    one_error_line(&err, "not a voter");
}

#[test]
fn drain_moves_every_leadership_and_undrain_clears_the_mark() {
    let s = Stub::start(3, vec![1, 1, 1, 2]);
    let (code, out, err) = s.ctl(&["drain", "--node", "1", "--dry-run"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("move 3 leaderships"), "{out}");
    assert_eq!(s.leaders(), vec![1, 1, 1, 2], "a dry run changes nothing");
    let (code, out, err) = s.ctl(&["drain", "--node", "1"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("maintenance-drain"), "{out}");
    assert!(out.contains("node 1 leads no group"), "{out}");
    let l = s.leaders();
    assert!(!l.contains(&1), "{l:?}");
    // Spread: node 3 led nothing, so it gets more of them than node 2.
    assert!(l.iter().filter(|&&x| x == 3).count() >= 2, "{l:?}");
    let (code, out, _) = s.ctl(&["undrain", "--node", "1"]);
    assert_eq!(code, 0);
    assert!(out.contains("normal"), "{out}");
    assert!(s.state.lock().unwrap().maintenance.is_empty());
}

#[test]
fn drain_skips_a_node_that_is_rejoining() {
    let s = Stub::start(3, vec![1, 1]);
    s.state.lock().unwrap().awaiting = vec![(3, vec![0, 1])];
    let (code, out, err) = s.ctl(&["drain", "--node", "1"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(s.leaders(), vec![2, 2]);
}

#[test]
fn drain_without_a_safe_target_is_a_safety_abort() {
    let s = Stub::start(2, vec![1, 1]);
    s.state.lock().unwrap().maintenance.insert(2);
    let (code, _, err) = s.ctl(&["drain", "--node", "1", "--timeout-secs", "1"]);
    assert_eq!(code, 2, "{err}");
    one_error_line(&err, "no safe target");
    assert_eq!(s.leaders(), vec![1, 1]);
}

#[test]
fn allow_rejoin_asks_each_groups_leader() {
    let s = Stub::start(3, vec![1, 2, 3]);
    let (code, out, _) = s.ctl(&["allow-rejoin", "--node", "3"]);
    assert_eq!(code, 0);
    assert!(out.contains("awaits no permission"), "{out}");
    assert!(s.state.lock().unwrap().allowed.is_empty());
    s.state.lock().unwrap().awaiting = vec![(3, vec![0, 1])];
    let (code, out, err) = s.ctl(&["allow-rejoin", "--node", "3"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("allowed in 2 of 2 groups"), "{out}");
    assert_eq!(s.state.lock().unwrap().allowed, vec![(0, 3), (1, 3)]);
    let (code, out, _) = s.ctl(&["allow-next-revert", "--group", "2", "--node", "1"]);
    assert_eq!(code, 0);
    assert!(out.contains("node 3 allows node 1"), "{out}");
}

#[test]
fn bad_input_is_one_greppable_line_and_exit_1() {
    let s = Stub::start(1, vec![1]);
    let (code, _, err) = s.ctl(&["transfer-leader", "--group", "x", "--to", "1"]);
    assert_eq!(code, 1);
    one_error_line(&err, "ursulactl: error:");
    let (code, _, err) = s.ctl(&["undrain", "--node", "7"]);
    assert_eq!(code, 1);
    one_error_line(&err, "node 7 is not in the manifest");
    let bad = s.dir.path().join("bad.yaml");
    std::fs::write(&bad, "nodes: []").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ursulactl"))
        .args(["status", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    one_error_line(
        &String::from_utf8_lossy(&out.stderr),
        "unsupported extension",
    );
}

#[test]
fn wait_follows_a_catching_up_node_and_aborts_a_stalled_one() {
    let s = Stub::start(3, vec![1, 2, 1]);
    s.state.lock().unwrap().logs.insert(3, 50);
    // It stays 50 entries behind: no progress, exit 2 once the stall timeout passes.
    let (code, _, err) = s.ctl(&["wait", "--node", "3", "--stall-timeout-secs", "1"]);
    assert_eq!(code, 2, "{err}");
    one_error_line(&err, "node 3 made no catch-up progress for 1 s");
    assert!(err.contains("50 entries behind node 1 in group 0"), "{err}");
    // The backstop ends even a node that keeps moving.
    let st = Arc::clone(&s.state);
    let mover = std::thread::spawn(move || {
        for _ in 0..30 {
            std::thread::sleep(Duration::from_millis(100));
            let mut st = st.lock().unwrap();
            let l = st.logs.get(&3).copied().unwrap_or(0);
            st.logs.insert(3, (l + 1).min(60));
        }
    });
    let (code, _, err) = s.ctl(&["wait", "--node", "3", "--max-wait-secs", "1"]);
    assert_eq!(code, 2, "{err}");
    one_error_line(&err, "not caught up after 1 s (backstop)");
    mover.join().unwrap();
    // Catching up, 10 entries per 100 ms: done once within the tolerance (16).
    let st = Arc::clone(&s.state);
    let mover = std::thread::spawn(move || {
        for _ in 0..100 {
            std::thread::sleep(Duration::from_millis(100));
            let mut st = st.lock().unwrap();
            let l = st.logs[&3];
            if l >= 100 {
                return;
            }
            st.logs.insert(3, l + 10);
        }
    });
    let (code, out, err) = s.ctl(&["wait", "--node", "3", "--stall-timeout-secs", "5"]);
    mover.join().unwrap();
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("node 3 caught up: a voter of all 3 groups"),
        "{out}"
    );
    let (code, _, err) = s.ctl(&["wait", "--node", "7"]);
    assert_eq!(code, 1);
    one_error_line(&err, "node 7 is not in the manifest");
}

#[test]
fn verify_cluster_needs_every_voter_present_and_caught_up() {
    let s = Stub::start(3, vec![1, 2, 3]);
    let (code, out, err) = s.ctl(&["verify-cluster"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("all 3 voters present"), "{out}");
    assert!(out.contains("two consecutive samples"), "{out}");
    s.state.lock().unwrap().logs.insert(2, 10);
    let (code, _, err) = s.ctl(&["verify-cluster", "--timeout-secs", "1"]);
    assert_eq!(code, 2, "{err}");
    one_error_line(&err, "node 2 is 90 entries behind");
    // Within a wider tolerance it passes.
    let (code, _, err) = s.ctl(&["verify-cluster", "--lag-tolerance", "100"]);
    assert_eq!(code, 0, "{err}");
    s.state.lock().unwrap().down.insert(3);
    let (code, _, err) = s.ctl(&[
        "verify-cluster",
        "--timeout-secs",
        "1",
        "--lag-tolerance",
        "100",
    ]);
    assert_eq!(code, 2, "{err}");
    one_error_line(&err, "node 3 did not answer");
}

#[test]
fn prepare_restart_checks_the_wal_backend_and_fails_closed() {
    let s = Stub::start(3, vec![1, 2, 3]);
    let (code, out, err) = s.ctl(&["prepare-restart", "--node", "3"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("every node reports wal_backend = \"disk\""),
        "{out}"
    );
    assert!(out.contains("nothing to prepare"), "{out}");
    assert!(out.contains("node 3 still leads groups [2]"), "{out}");
    assert!(s.state.lock().unwrap().allowed.is_empty());
    // Disagreeing, silent or unreachable nodes: exit 2, nothing done.
    s.state.lock().unwrap().wal.insert(2, "memory".into());
    let (code, _, err) = s.ctl(&["prepare-restart", "--node", "3"]);
    assert_eq!(code, 2, "{err}");
    one_error_line(&err, "disagree on wal_backend");
    s.state.lock().unwrap().wal.insert(2, String::new());
    let (code, _, err) = s.ctl(&["prepare-restart", "--node", "3"]);
    assert_eq!(code, 2, "{err}");
    one_error_line(&err, "node 2 reports no wal_backend");
    s.state.lock().unwrap().wal.clear();
    s.state.lock().unwrap().down.insert(1);
    let (code, _, err) = s.ctl(&["prepare-restart", "--node", "3"]);
    assert_eq!(code, 2, "{err}");
    one_error_line(&err, "node 1 did not answer");
    assert!(s.state.lock().unwrap().allowed.is_empty());
    // A memory-WAL cluster: every group's leader arms one rejoin (not node 3's own group).
    s.state.lock().unwrap().down.clear();
    for n in 1..=3 {
        s.state.lock().unwrap().wal.insert(n, "memory".into());
    }
    let (code, out, err) = s.ctl(&["prepare-restart", "--node", "3"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("armed one empty-log rejoin of node 3 in 2 of 3 groups"),
        "{out}"
    );
    assert_eq!(s.state.lock().unwrap().allowed, vec![(0, 3), (1, 3)]);
}
