//! A cluster of real `ursula` processes on loopback ports, for black-box tests.
//!
//! ```ignore
//! let mut c = Cluster::start(ClusterSpec::new(3));   // 3 nodes, local shared cold dir
//! c.wait_ready();                                    // every group has a leader everywhere
//! let client = c.client();                           // Clone + Send: give it to a writer thread
//! let (_, r) = client.send(0, "PUT", "/a/b", &[], b"", Instant::now() + CLUSTER_T).unwrap();
//! let lead = c.stream_leader("/a/b");                // index into c.nodes
//! c.nodes[lead].kill9();                             // or sigstop()/sigcont()/sigterm()
//! c.nodes[lead].start();                             // same config, same data dir
//! ```
//!
//! * Every node uses one config file (written by [`ClusterSpec`]) and differs only in
//!   `--node-id`, `--listen` and `--data-dir`, as `docs/cluster.md` shows. Node `i` of
//!   `c.nodes` has Raft node id `i + 1`. Data dirs and logs live in one temp dir that is
//!   removed when the `Cluster` drops (the processes are SIGKILLed first).
//! * The cold store is shared: a `local` directory with `shared = true`, or an S3 bucket.
//! * Logs: `{root}/node{id}.log` (stderr of every start, appended). `CLUSTER_TEST_LOG` sets
//!   the nodes' log filter (default `info,openraft=error`); `CLUSTER_TEST_KEEP_LOGS=/dir`
//!   copies every node's log there when the `Cluster` drops.
//! * [`Client::send`] is the one HTTP helper that behaves like a cluster-aware client: it
//!   follows `307` redirects, retries `503` and connection failures (moving on to the next
//!   node), all within a deadline. Use [`Node::request`] for a single, unfollowed request.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::{Response, try_request, wait_until};

/// Default bound for anything a cluster test waits on (start-up, elections, catch-up).
pub const CLUSTER_T: Duration = Duration::from_secs(60);

/// The shared cold store of a cluster.
#[derive(Clone, Debug)]
pub enum ColdStore {
    /// `backend = "local"`, `shared = true`, in `{root}/cold`.
    Local,
    /// `backend = "s3"` at `endpoint` (path style), objects under `root` in `bucket`.
    /// Credentials come from the environment (`AWS_ACCESS_KEY_ID`, ...), as for any node.
    S3 {
        endpoint: String,
        bucket: String,
        root: String,
    },
}

/// What to start: node count, groups, cold store and extra config.
#[derive(Clone, Debug)]
pub struct ClusterSpec {
    pub nodes: usize,
    pub group_count: u32,
    pub cold: ColdStore,
    /// Extra lines for the `[storage.cold]` section, e.g. `flush_size = "64KiB"`.
    pub cold_toml: String,
    /// Extra top-level lines (before any section), e.g. `max_request_bytes = ...`.
    pub top_toml: String,
    /// Extra command-line arguments for every node.
    pub args: Vec<String>,
    /// Give every node a `--cluster-listen` port of its own; the peer URLs point at it.
    pub cluster_listen: bool,
    /// Extra lines for the `[raft]` section, e.g. `rpc_batching = false`.
    pub raft_toml: String,
    /// Sync the WAL before acknowledging (the product's default; off by default here to
    /// keep the many cluster tests quick on slow disks).
    pub fsync: bool,
}

impl ClusterSpec {
    /// `nodes` nodes, 4 groups, a shared local cold dir, `fsync = false` (see [`Self::fsync`]).
    pub fn new(nodes: usize) -> ClusterSpec {
        ClusterSpec {
            nodes,
            group_count: 4,
            cold: ColdStore::Local,
            cold_toml: String::new(),
            top_toml: String::new(),
            args: Vec::new(),
            cluster_listen: false,
            raft_toml: String::new(),
            fsync: false,
        }
    }

    fn toml(&self, root: &Path, ports: &[u16]) -> String {
        let mut t = format!(
            "fsync = {}\ngroup_count = {}\n{}\n[server]\ncluster_id = \"it\"\n\
             [raft]\ninit_membership_per_group = true\n{}\n[storage.cold]\n",
            self.fsync, self.group_count, self.top_toml, self.raft_toml
        );
        match &self.cold {
            ColdStore::Local => {
                t.push_str(&format!("backend = \"local\"\n{}\n", self.cold_toml));
                let dir = root.join("cold").display().to_string();
                t.push_str(&format!(
                    "[storage.cold.local]\npath = {dir:?}\nshared = true\n"
                ));
            }
            ColdStore::S3 {
                endpoint,
                bucket,
                root,
            } => {
                t.push_str(&format!(
                    "backend = \"s3\"\nroot = {root:?}\n{}\n[storage.cold.s3]\n\
                     bucket = {bucket:?}\nendpoint = {endpoint:?}\npath_style = true\n",
                    self.cold_toml
                ));
            }
        }
        for (i, p) in ports.iter().enumerate() {
            t.push_str(&format!(
                "[[raft.peers]]\nnode_id = {}\nurl = \"http://127.0.0.1:{p}\"\n",
                i + 1
            ));
        }
        t
    }
}

/// One `ursula` process of a cluster (running or not).
pub struct Node {
    /// Raft node id (`index + 1`).
    pub id: u64,
    pub port: u16,
    /// The port of its peer URL: `port`, or its `--cluster-listen` port.
    pub cluster_port: u16,
    /// Data directory (kept across restarts).
    pub dir: PathBuf,
    config: PathBuf,
    log: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
}

impl Node {
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The admin listener's address of the latest start (from its "ursula listening" log
    /// line), when the node runs one (`--admin-listen 127.0.0.1:0`).
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        let log = std::fs::read_to_string(&self.log).ok()?;
        let line = log
            .lines()
            .rev()
            .map(super::strip_ansi)
            .find(|l| l.contains("ursula listening"))?;
        let rest = &line[line.find("admin_addr=")? + "admin_addr=".len()..];
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | ':')))
            .unwrap_or(rest.len());
        rest[..end].parse().ok()
    }

    /// `http://127.0.0.1:{port}`, the node's peer URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether this harness has a live process for the node (not killed, not exited).
    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Starts the process (same config and data dir as before) and waits until it answers
    /// `GET /__ursula/health` (not until it is ready: see [`Cluster::wait_ready`]).
    pub fn start(&mut self) {
        assert!(!self.is_running(), "node {} is already running", self.id);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_ursula"))
            .arg("server")
            .arg("--config")
            .arg(&self.config)
            .args(["--node-id", &self.id.to_string()])
            .args(["--listen", &self.addr().to_string()])
            .arg("--data-dir")
            .arg(&self.dir)
            .args(&self.args)
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
        let up = wait_until(CLUSTER_T, || {
            self.get_status("/__ursula/health") == Some(200) || !self.is_running()
        });
        assert!(
            up && self.is_running(),
            "node {} never served:\n{}",
            self.id,
            self.log_tail(40)
        );
    }

    /// Starts this node with its own config file from now on (the cluster's is
    /// `root/cluster.toml`).
    pub fn set_config(&mut self, path: PathBuf) {
        self.config = path;
    }

    /// SIGKILL, and reap the process. No-op if it is not running.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM (graceful shutdown) and wait for the exit, at most `timeout`; SIGKILLed if it
    /// takes longer. Returns the exit status of a process that exited by itself.
    pub fn sigterm(&mut self, timeout: Duration) -> Option<ExitStatus> {
        self.signal("TERM");
        let mut child = self.child.take()?;
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(st)) = child.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    /// SIGSTOP: the process freezes (its sockets stay open). Undo with [`Node::sigcont`].
    pub fn sigstop(&self) {
        self.signal("STOP");
    }

    pub fn sigcont(&self) {
        self.signal("CONT");
    }

    /// Sends `kill -{sig}` to the running process.
    pub fn signal(&self, sig: &str) {
        let pid = self
            .pid()
            .unwrap_or_else(|| panic!("node {} is not running", self.id));
        let st = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(pid.to_string())
            .status()
            .unwrap();
        assert!(st.success(), "kill -{sig} {pid}");
    }

    /// Kill (SIGKILL) if running, then [`Node::start`].
    pub fn restart(&mut self) {
        self.kill9();
        self.start();
    }

    /// `GET /__ursula/ready` answers 200 (every group has a known leader on this node).
    pub fn ready(&self) -> bool {
        self.get_status("/__ursula/ready") == Some(200)
    }

    /// One request to this node, no redirect followed, no retry.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout: Duration,
    ) -> std::io::Result<Response> {
        try_request(self.addr(), method, path, headers, body, timeout)
    }

    fn get_status(&self, path: &str) -> Option<u16> {
        self.request("GET", path, &[], b"", Duration::from_secs(1))
            .ok()
            .map(|r| r.status)
    }

    /// The node's Prometheus text (`/__ursula/metrics/prometheus`), if it answers.
    pub fn prometheus(&self) -> Option<String> {
        self.request(
            "GET",
            "/__ursula/metrics/prometheus",
            &[],
            b"",
            Duration::from_secs(2),
        )
        .ok()
        .filter(|r| r.status == 200)
        .map(|r| r.text())
    }

    /// Reads `path` from offset 0 up to `upto` bytes with catch-up reads served by this node
    /// alone (each asks `max_bytes` of what is missing, so none reaches a tail the node would
    /// redirect). `None` if an answer is not `200` (e.g. a `307`: the node lacks the bytes).
    pub fn read_local(&self, path: &str, upto: usize) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        let mut off = super::off20(0);
        for _ in 0..10_000 {
            if out.len() >= upto {
                return Some(out);
            }
            let q = format!("{path}?offset={off}&max_bytes={}", upto - out.len());
            let r = self
                .request("GET", &q, &[], b"", Duration::from_secs(5))
                .ok()?;
            if r.status != 200 || r.body.is_empty() {
                return None;
            }
            out.extend_from_slice(&r.body);
            off = r.header("stream-next-offset")?.to_owned();
        }
        None
    }

    /// A number of the node's JSON metrics (`/__ursula/metrics`), 0 if absent.
    pub fn metric(&self, name: &str) -> u64 {
        self.request("GET", "/__ursula/metrics", &[], b"", Duration::from_secs(2))
            .ok()
            .filter(|r| r.status == 200)
            .and_then(|r| r.json()[name].as_u64())
            .unwrap_or(0)
    }

    /// The last `n` lines of the node's log (every start appends to one file).
    /// The last `n` lines of the node's log; when the process panicked, the panic's message
    /// (and the lines around it) first, which a long backtrace would push out of the tail.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(n)..].join("\n");
        match lines.iter().position(|l| l.contains("panicked at")) {
            Some(at) => format!(
                "{}\n...\n{tail}",
                lines[at.saturating_sub(5)..(at + 12).min(lines.len())].join("\n")
            ),
            None => tail,
        }
    }

    /// Path of the node's log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// N processes of one cluster. `nodes[i]` has node id `i + 1`.
pub struct Cluster {
    pub nodes: Vec<Node>,
    pub spec: ClusterSpec,
    root: tempfile::TempDir,
}

impl Cluster {
    /// Writes the config, picks free ports and starts every node (each answering health;
    /// call [`Cluster::wait_ready`] before sending requests).
    pub fn start(spec: ClusterSpec) -> Cluster {
        let root = tempfile::tempdir().unwrap();
        let ports = free_ports(spec.nodes);
        let cluster_ports = if spec.cluster_listen {
            free_ports(spec.nodes)
        } else {
            ports.clone()
        };
        let config = root.path().join("cluster.toml");
        std::fs::write(&config, spec.toml(root.path(), &cluster_ports)).unwrap();
        let nodes = ports
            .iter()
            .zip(&cluster_ports)
            .enumerate()
            .map(|(i, (&port, &cport))| {
                let mut args = spec.args.clone();
                if spec.cluster_listen {
                    args.extend(["--cluster-listen".into(), format!("127.0.0.1:{cport}")]);
                }
                Node {
                    id: i as u64 + 1,
                    port,
                    cluster_port: cport,
                    dir: root.path().join(format!("node{}", i + 1)),
                    log: root.path().join(format!("node{}.log", i + 1)),
                    config: config.clone(),
                    args,
                    child: None,
                }
            })
            .collect();
        let mut c = Cluster { nodes, spec, root };
        for n in &mut c.nodes {
            n.start();
        }
        c
    }

    /// The temp dir holding the config, data dirs, logs and (local) cold dir.
    pub fn root(&self) -> &Path {
        self.root.path()
    }

    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// A cluster-aware HTTP client over every node (also the stopped ones).
    pub fn client(&self) -> Client {
        Client {
            addrs: self.nodes.iter().map(Node::addr).collect(),
            timeout: Duration::from_secs(2),
        }
    }

    /// Indices of the nodes with a live process.
    pub fn running(&mut self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].is_running())
            .collect()
    }

    /// Waits (at most [`CLUSTER_T`]) until every running node is ready; panics with the logs
    /// otherwise.
    pub fn wait_ready(&mut self) {
        let live = self.running();
        let ok = wait_until(CLUSTER_T, || live.iter().all(|&i| self.nodes[i].ready()));
        assert!(
            ok,
            "the cluster never became ready:\n{}",
            self.log_tails(20)
        );
    }

    /// The node leading the group of the stream at `path`: the running node that answers
    /// `HEAD` itself (`200`), the others redirect. Waits at most [`CLUSTER_T`]. The stream
    /// must exist.
    pub fn stream_leader(&mut self, path: &str) -> usize {
        let live = self.running();
        let mut found = None;
        let ok = wait_until(CLUSTER_T, || {
            found = live.iter().copied().find(|&i| {
                self.nodes[i]
                    .request("HEAD", path, &[], b"", Duration::from_secs(1))
                    .is_ok_and(|r| r.status == 200)
            });
            found.is_some()
        });
        assert!(ok, "no node leads the group of {path}");
        found.unwrap()
    }

    /// The node leading Raft group `group` by its own metrics (role leader; the highest term
    /// if a deposed leader has not noticed yet). Waits at most [`CLUSTER_T`].
    pub fn group_leader(&mut self, group: u32) -> usize {
        let live = self.running();
        let role = format!("ursula_raft_group_role{{group=\"{group}\"}} ");
        let term = format!("ursula_raft_group_term{{group=\"{group}\"}} ");
        let mut found = None;
        let ok = wait_until(CLUSTER_T, || {
            found = live
                .iter()
                .filter_map(|&i| {
                    let text = self.nodes[i].prometheus()?;
                    (gauge(&text, &role)? == 2).then(|| (gauge(&text, &term).unwrap_or(0), i))
                })
                .max()
                .map(|(_, i)| i);
            found.is_some()
        });
        assert!(ok, "no node leads group {group}");
        found.unwrap()
    }

    /// The last `n` log lines of every node, labelled.
    pub fn log_tails(&self, n: usize) -> String {
        self.nodes
            .iter()
            .map(|node| format!("--- node {} ---\n{}", node.id, node.log_tail(n)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            n.kill9();
        }
        if let Ok(dir) = std::env::var("CLUSTER_TEST_KEEP_LOGS") {
            for n in &self.nodes {
                let _ = std::fs::copy(&n.log, format!("{dir}/node{}.log", n.id));
            }
        }
    }
}

/// A value of one Prometheus line starting with `prefix` (name, labels and a space).
fn gauge(text: &str, prefix: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|v| v.trim().parse().ok())
}

/// `n` distinct free loopback ports, none handed out before in this process: the tests of a
/// binary run in parallel, and a port one cluster released could otherwise go to another
/// before the first cluster's node binds it (a request would then reach the other cluster).
pub fn free_ports(n: usize) -> Vec<u16> {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let mut held = Vec::new();
    let mut ports = Vec::new();
    while ports.len() < n {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        if !given.contains(&port) {
            given.push(port);
            ports.push(port);
        }
        held.push(l);
    }
    ports
}

/// A cluster-aware client: knows every node's address; cheap to clone and `Send`.
#[derive(Clone, Debug)]
pub struct Client {
    pub addrs: Vec<SocketAddr>,
    /// Socket timeout of each attempt (default 2 s): a frozen node costs this much.
    pub timeout: Duration,
}

impl Client {
    /// Sends a request to node `from`, following `307` (to the `Location` peer, same method
    /// and body, at most 16 hops in a row), retrying `503` (after 25 ms) and connection
    /// failures or time-outs (on the next node), until a final answer or `deadline`.
    /// Returns the index of the node that answered and its answer; `None` at the deadline.
    pub fn send(
        &self,
        from: usize,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        deadline: Instant,
    ) -> Option<(usize, Response)> {
        let mut at = from;
        let mut path = path.to_owned();
        let mut hops = 0;
        while Instant::now() < deadline {
            match try_request(self.addrs[at], method, &path, headers, body, self.timeout) {
                Ok(r) if r.status == 307 => {
                    let loc = r.header("location").expect("Location on a 307");
                    assert!(
                        r.header("x-ursula-raft-leader-id").is_some(),
                        "a 307 without X-Ursula-Raft-Leader-Id"
                    );
                    let (addr, p) = split_location(loc).expect("Location is a peer URL");
                    at = self
                        .addrs
                        .iter()
                        .position(|a| *a == addr)
                        .unwrap_or_else(|| panic!("Location {loc} is not a peer"));
                    path = p;
                    hops += 1;
                    if hops > 16 {
                        // A redirect loop (stale leader hints): back off like a 503.
                        hops = 0;
                        std::thread::sleep(Duration::from_millis(25));
                    }
                }
                Ok(r) if r.status == 503 => {
                    assert!(
                        r.header("retry-after").is_some(),
                        "a 503 without Retry-After: {}",
                        r.describe()
                    );
                    std::thread::sleep(Duration::from_millis(25));
                }
                Ok(r) => return Some((at, r)),
                Err(_) => {
                    at = (at + 1) % self.addrs.len();
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
        None
    }

    /// [`Client::send`] that must answer within [`CLUSTER_T`].
    pub fn must(
        &self,
        from: usize,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Response {
        self.send(
            from,
            method,
            path,
            headers,
            body,
            Instant::now() + CLUSTER_T,
        )
        .unwrap_or_else(|| panic!("{method} {path}: no answer within {CLUSTER_T:?}"))
        .1
    }

    /// Reads `path` from offset 0 to its tail with catch-up reads starting at node `from`
    /// (each through [`Client::send`], so the read that reaches the tail ends on the leader).
    /// Panics on an answer other than `200` or at [`CLUSTER_T`].
    pub fn read_all(&self, from: usize, path: &str) -> Vec<u8> {
        let deadline = Instant::now() + CLUSTER_T;
        let mut out = Vec::new();
        let mut off = super::off20(0);
        let mut at = from;
        while Instant::now() < deadline {
            let q = format!("{path}?offset={off}");
            let (i, r) = self
                .send(at, "GET", &q, &[], b"", deadline)
                .unwrap_or_else(|| panic!("GET {q}: no answer"));
            assert_eq!(r.status, 200, "GET {q}: {}", r.describe());
            out.extend_from_slice(&r.body);
            if r.header("stream-up-to-date") == Some("true") {
                return out;
            }
            off = r
                .header("stream-next-offset")
                .expect("Stream-Next-Offset")
                .to_owned();
            at = i;
        }
        panic!("read_all {path}: not at the tail within {CLUSTER_T:?}");
    }
}

/// `http://host:port/path?query` into the address and the path with its query.
pub fn split_location(loc: &str) -> Option<(SocketAddr, String)> {
    let rest = loc.strip_prefix("http://")?;
    let slash = rest.find('/').unwrap_or(rest.len());
    let addr = rest[..slash].parse().ok()?;
    let path = if slash == rest.len() {
        "/".to_owned()
    } else {
        rest[slash..].to_owned()
    };
    Some((addr, path))
}

/// Acknowledgement times of one writer's appends, in order.
pub type Acked = std::sync::Arc<std::sync::Mutex<Vec<Instant>>>;

/// A writer thread that appends record after record to one stream with an idempotent
/// producer (epoch 0, `Producer-Seq` from 0) through whichever node answers
/// ([`Client::send`]), so a retried record lands once. Every append must be answered `2xx`
/// within [`CLUSTER_T`].
pub struct ProducerWriter {
    /// Stream path.
    pub path: String,
    pub producer: String,
    /// Node the first append goes to.
    pub from: usize,
    /// At most this many appends.
    pub max: u64,
}

impl ProducerWriter {
    /// Starts the thread: it appends `record(seq)` until `stop` (or `max`), pushing the time
    /// of each acknowledgement to `acked`.
    pub fn spawn(
        self,
        client: Client,
        record: impl Fn(u64) -> Vec<u8> + Send + 'static,
        acked: Acked,
        stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            let mut at = self.from;
            let mut seq = 0u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) && seq < self.max {
                let n = seq.to_string();
                let h = [
                    ("content-type", "application/octet-stream"),
                    ("producer-id", self.producer.as_str()),
                    ("producer-epoch", "0"),
                    ("producer-seq", n.as_str()),
                ];
                let deadline = Instant::now() + CLUSTER_T;
                let (i, r) = client
                    .send(at, "POST", &self.path, &h, &record(seq), deadline)
                    .expect("a write never succeeded");
                assert!(r.status / 100 == 2, "append {seq}: {}", r.describe());
                at = i;
                acked.lock().unwrap().push(Instant::now());
                seq += 1;
            }
        })
    }
}

/// One [`ProducerWriter`] per stream of `paths` (writer `i` starts at node `i`, appends
/// `record(i, seq)` as producer `producer`, at most `max` times); returns each one's
/// acknowledgement times and the threads.
pub fn spawn_writers(
    client: &Client,
    paths: &[&str],
    producer: &str,
    max: u64,
    record: fn(usize, u64) -> Vec<u8>,
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> (Vec<Acked>, Vec<std::thread::JoinHandle<()>>) {
    let acked: Vec<Acked> = paths.iter().map(|_| Acked::default()).collect();
    let threads = paths
        .iter()
        .enumerate()
        .map(|(s, path)| {
            ProducerWriter {
                path: (*path).to_owned(),
                producer: producer.to_owned(),
                from: s % client.addrs.len(),
                max,
            }
            .spawn(
                client.clone(),
                move |i| record(s, i),
                std::sync::Arc::clone(&acked[s]),
                std::sync::Arc::clone(stop),
            )
        })
        .collect();
    (acked, threads)
}
