//! A cluster of in-process nodes over [`TestNetwork`], and what the cluster tests share.

#![allow(dead_code, reason = "each test file uses part of it")]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use openraft::{LogId, ServerState};
use ursula_core::command::{AppendReq, CreateReq};
use ursula_core::{Command, Op, Response, StreamKey};
use ursula_raft::testing::TestNetwork;
use ursula_raft::{Node, NodeConfig, ProposeError, Transport, WalOptions};
use ursula_storage::fs::FaultyFs;

/// Wraps a node's transport (fault injection beyond what [`TestNetwork`] offers).
pub type WrapTransport = Arc<dyn Fn(u64, Arc<dyn Transport>) -> Arc<dyn Transport> + Send + Sync>;

pub const T: Duration = Duration::from_secs(30);
/// Bytes per append in these tests, so a stream's bytes split back into its appends.
pub const REC: usize = 8;

pub struct Cluster {
    pub net: TestNetwork,
    pub groups: u32,
    pub snapshot_logs: u64,
    dirs: BTreeMap<u64, tempfile::TempDir>,
    pub nodes: BTreeMap<u64, Arc<Node>>,
    peers: BTreeMap<u64, String>,
    wrap: Option<WrapTransport>,
    /// Each node's file system: the real one, with faults to inject on demand.
    pub fs: BTreeMap<u64, FaultyFs>,
}

impl Cluster {
    /// Opens `n` fresh nodes (ids 1..=n) that bootstrap together, and waits for every group to
    /// have a leader known to every node.
    pub async fn start(n: u64, groups: u32, snapshot_logs: u64) -> Cluster {
        Cluster::start_wrapped(n, groups, snapshot_logs, None).await
    }

    /// [`Cluster::start`] with every node's transport passed through `wrap`.
    pub async fn start_wrapped(
        n: u64,
        groups: u32,
        snapshot_logs: u64,
        wrap: Option<WrapTransport>,
    ) -> Cluster {
        let peers: BTreeMap<u64, String> = (1..=n)
            .map(|id| (id, format!("http://node-{id}")))
            .collect();
        let mut c = Cluster {
            net: TestNetwork::new(),
            groups,
            snapshot_logs,
            dirs: (1..=n)
                .map(|id| (id, tempfile::tempdir().unwrap()))
                .collect(),
            nodes: BTreeMap::new(),
            peers,
            wrap,
            fs: (1..=n).map(|id| (id, FaultyFs::new())).collect(),
        };
        for id in 1..=n {
            c.open(id, true).await;
        }
        for g in 0..groups {
            c.leader(g, &c.ids()).await;
        }
        c
    }

    pub fn ids(&self) -> Vec<u64> {
        self.nodes.keys().copied().collect()
    }

    fn config(&self, id: u64, init: bool) -> NodeConfig {
        let dir: &Path = self.dirs[&id].path();
        NodeConfig {
            node_id: id,
            group_count: self.groups,
            wal: WalOptions {
                segment_bytes: 1 << 20,
                fsync: false,
                fs: Arc::new(self.fs.get(&id).cloned().unwrap_or_else(FaultyFs::new)),
                ..Default::default()
            },
            snapshot_logs: self.snapshot_logs,
            peers: self.peers.clone(),
            transport: Some(match &self.wrap {
                Some(w) => w(id, self.net.transport(id)),
                None => self.net.transport(id),
            }),
            init_membership: init,
            cluster_id: Some("test-cluster".into()),
            ..NodeConfig::new(dir)
        }
    }

    /// Opens node `id` (again) and makes it reachable.
    pub async fn open(&mut self, id: u64, init: bool) {
        let node = tokio::time::timeout(T, Node::open(self.config(id, init)))
            .await
            .expect("open timed out")
            .expect("open failed");
        self.net.register(&node);
        self.nodes.insert(id, node);
    }

    /// Stops node `id` as if it died: unreachable at once, then shut down.
    pub async fn kill(&mut self, id: u64) {
        self.net.unregister(id);
        if let Some(node) = self.nodes.remove(&id) {
            node.shutdown().await;
        }
    }

    /// Shuts every node down (the end of a test).
    pub async fn shutdown(&self) {
        for n in self.nodes.values() {
            n.shutdown().await;
        }
    }

    /// Node `id`'s data directory.
    pub fn dir(&self, id: u64) -> &Path {
        self.dirs[&id].path()
    }

    /// Kills node `id` and deletes everything in its data directory (a replaced disk).
    pub async fn wipe(&mut self, id: u64) {
        self.kill(id).await;
        let dir = self.dirs[&id].path().to_owned();
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                std::fs::remove_dir_all(&p).unwrap();
            } else {
                std::fs::remove_file(&p).unwrap();
            }
        }
    }

    /// Waits until one of `among` leads `group` (and the others of `among` that are reachable
    /// know it), returning it.
    pub async fn leader(&self, group: u32, among: &[u64]) -> u64 {
        let deadline = Instant::now() + T;
        loop {
            let leaders: Vec<u64> = among
                .iter()
                .filter(|id| {
                    let m = self.nodes[id].raft(group).metrics();
                    let m = m.borrow();
                    m.state == ServerState::Leader && m.current_leader == Some(**id)
                })
                .copied()
                .collect();
            if let [l] = leaders[..] {
                return l;
            }
            assert!(
                Instant::now() < deadline,
                "group {group} has no single leader among {among:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until every node of `among` names the same leader of `group`, which leads.
    pub async fn agreed_leader(&self, group: u32, among: &[u64]) -> u64 {
        let deadline = Instant::now() + T;
        loop {
            let l = self.leader(group, among).await;
            if among
                .iter()
                .all(|id| self.nodes[id].leader_of(group) == Some(l))
            {
                return l;
            }
            assert!(Instant::now() < deadline, "group {group}: no agreed leader");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Proposes on `among`, following `ForwardToLeader` answers (which log nothing) until a
    /// node accepts or `timeout` passes. Other errors are returned as they are.
    pub async fn propose(
        &self,
        among: &[u64],
        group: u32,
        cmd: Command,
        timeout: Duration,
    ) -> Result<Response, ProposeError> {
        let deadline = Instant::now() + timeout;
        let mut target = among[0];
        loop {
            let res = tokio::time::timeout(
                deadline.saturating_duration_since(Instant::now()),
                self.nodes[&target].propose(group, cmd.clone()),
            )
            .await
            .unwrap_or_else(|_| Err(ProposeError::Unavailable("timed out".into())));
            match res {
                Err(ProposeError::ForwardToLeader { leader }) if Instant::now() < deadline => {
                    target = match leader {
                        Some(l) if among.contains(&l) => l,
                        _ => {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            let i = among.iter().position(|&x| x == target).unwrap_or(0);
                            among[(i + 1) % among.len()]
                        }
                    };
                }
                other => return other,
            }
        }
    }

    /// The bytes of `key` on node `id`, as applied.
    pub fn bytes(&self, id: u64, key: &StreamKey) -> Option<Vec<u8>> {
        let group = key.group(self.groups);
        self.nodes[&id].read(group, |st| {
            st.streams.get(key).map(|s| {
                let mut out = Vec::new();
                s.copy_own_bytes(0, s.tail, &mut out);
                out
            })
        })
    }

    /// Waits until every node of `among` holds exactly `want` for `key`.
    pub async fn converged(&self, among: &[u64], key: &StreamKey, want: &[u8]) {
        let deadline = Instant::now() + T;
        for &id in among {
            loop {
                if self.bytes(id, key).as_deref() == Some(want) {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "node {id} did not converge on {key:?}: {:?} bytes, want {}",
                    self.bytes(id, key).map(|b| b.len()),
                    want.len()
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }

    /// Samples every node until `stop`, failing if two nodes ever applied different entries at
    /// one index of a group (Raft's state-machine safety).
    ///
    /// Two leaders in one *term* are not a violation here: openraft's default ("advanced") leader
    /// id is `(term, node id)`, totally ordered, so two candidates of one term may both win and
    /// the later one (the higher node id) deposes the other; every log id carries the node id, so
    /// their entries never collide. What must hold is that they never commit different entries.
    pub fn watch_safety(&self, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
        let nodes: Vec<Arc<Node>> = self.nodes.values().cloned().collect();
        let groups = self.groups;
        tokio::spawn(async move {
            let mut applied: BTreeMap<(u32, u64), (LogId<u64>, u64)> = BTreeMap::new();
            let deadline = Instant::now() + Duration::from_secs(300);
            while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                for n in &nodes {
                    for g in 0..groups {
                        let m = n.raft(g).metrics();
                        let m = m.borrow();
                        if let Some(at) = m.last_applied {
                            let (prev, by) = *applied.entry((g, at.index)).or_insert((at, m.id));
                            assert_eq!(
                                prev, at,
                                "group {g}: node {by} applied {prev} and node {} applied {at} at \
                                 index {}",
                                m.id, at.index
                            );
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    }
}

pub fn key_in_group(group: u32, groups: u32, n: usize) -> StreamKey {
    (0..)
        .map(|i| StreamKey::new("test", &format!("s{n}-{i}")))
        .find(|k| k.group(groups) == group)
        .unwrap()
}

pub fn create(key: &StreamKey) -> Command {
    Command {
        now_ms: 1_000,
        op: Op::Create(Box::new(CreateReq {
            content_type: Some("application/octet-stream".into()),
            ..CreateReq::new(key.clone())
        })),
    }
}

/// The append of record `i` (`REC` bytes).
pub fn append(key: &StreamKey, i: u32) -> Command {
    let payload = format!("w{i:07}");
    Command {
        now_ms: 2_000,
        op: Op::Append(Box::new(AppendReq {
            content_type: Some("application/octet-stream".into()),
            ..AppendReq::new(key.clone(), Bytes::from(payload.into_bytes()))
        })),
    }
}

/// An append of `payload`.
pub fn append_bytes(key: &StreamKey, payload: Vec<u8>) -> Command {
    Command {
        now_ms: 2_000,
        op: Op::Append(Box::new(AppendReq {
            content_type: Some("application/octet-stream".into()),
            ..AppendReq::new(key.clone(), Bytes::from(payload))
        })),
    }
}

pub fn record(i: u32) -> Vec<u8> {
    format!("w{i:07}").into_bytes()
}

/// Whether a response is a success (the state machine accepted the command).
pub fn ok(r: &Response) -> bool {
    r.is_ok()
}

/// The record numbers held in `bytes`, in order.
pub fn records(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks(REC)
        .map(|c| std::str::from_utf8(&c[1..]).unwrap().parse().unwrap())
        .collect()
}

/// Waits (bounded by [`T`]) until `cond` holds.
pub async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + T;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
