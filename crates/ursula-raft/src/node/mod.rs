//! [`Node`]: every Raft group of this process over one WAL, and the proposal path.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use openraft::error::{ClientWriteError, Fatal, InitializeError};
use openraft::{BasicNode, ServerState, SnapshotPolicy};
use tokio::sync::{Notify, Semaphore, mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use ursula_core::{Command, GroupState, Response};
use ursula_storage::{Lsn, Wal, WalOptions};

use crate::coalesce::Coalescer;
use crate::error::{ProposeError, RaftError};
use crate::identity::{self, Identity};
use crate::listener::ApplyListener;
use crate::log_store::{GroupLog, LogInner, LogStore, Marks};
use crate::network::{Network, Transport};
use crate::state_machine::{self, Loaded, SnapshotStore, StateMachine};
use crate::types::{Batch, Raft};

mod batcher;
mod cluster;
mod heartbeat;
mod open;
mod rejoin;
mod rpc;
mod stall;
mod transfer;
mod upkeep;

pub use cluster::RaftTiming;
pub use rejoin::{AllowError, Allowed};
pub use stall::{StallClock, StallWatch, observe_stall, stalled_for};
pub use transfer::{ShedState, TransferError, shed};

use batcher::run_batcher;
use open::{recover, start_groups};
use upkeep::Upkeep;

/// How long `open` of a node without peers waits for it to lead (and catch up) every group.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// Upper bounds of one proposal batch (one Raft entry).
const MAX_BATCH_COMMANDS: usize = 4096;
const MAX_BATCH_BYTES: usize = 8 << 20;
/// Largest command accepted (its approximate encoded size); a batch stays far below the WAL's
/// record limit.
const MAX_COMMAND_BYTES: usize = ursula_storage::MAX_PAYLOAD_LEN / 4;
/// Batches of one group submitted to openraft and not yet answered. One is enough: the next
/// batch gathers everything queued while the current one is being made durable. (The batcher
/// answers a batch before it submits the next, so more would need it to await them apart.)
const MAX_INFLIGHT_BATCHES: usize = 1;
/// Proposals queued per group before `propose` waits (back-pressure).
const QUEUE_CAPACITY: usize = 16 * 1024;
/// How often upkeep (segment GC, snapshot triggers) runs, besides right after a purge.
const UPKEEP_INTERVAL: Duration = Duration::from_millis(500);
/// Upkeep triggers at most one snapshot per group per this interval.
const SNAPSHOT_TRIGGER_BACKOFF: Duration = Duration::from_secs(1);
/// Largest snapshot chunk per install-snapshot RPC.
const SNAPSHOT_CHUNK_BYTES: u64 = 1 << 20;
/// How long `shutdown` waits for queued proposals to drain.
const SHUTDOWN_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Configuration of a [`Node`].
#[derive(Clone)]
pub struct NodeConfig {
    /// Holds `node.toml`, `wal/` and `snapshots/`.
    pub data_dir: PathBuf,
    /// This node's Raft id (stable across restarts; recorded in `node.toml`).
    pub node_id: u64,
    /// Number of Raft groups; fixed for the life of the data directory.
    pub group_count: u32,
    /// WAL tuning.
    pub wal: WalOptions,
    /// A group snapshots (and then purges its log) once this many entries were applied since
    /// its last snapshot.
    pub snapshot_logs: u64,
    /// A group whose retained log holds more than max(this, its last snapshot's size) bytes
    /// is snapshotted, which purges its log: this bounds the WAL per group while keeping the
    /// bytes re-written per byte freed at most one. With a cold tier the snapshot holds only
    /// the hot tail, so a small value releases the log entries of flushed bytes soon after
    /// the flush. Default: 64 MiB.
    pub snapshot_min_log_bytes: u64,
    /// Hears which streams each applied batch may have changed (live readers).
    pub listener: Option<Arc<dyn ApplyListener>>,
    /// Every voter of the cluster, this node included: node id -> peer URL (client-facing
    /// redirect target). Empty (or only this node) = a one-voter cluster.
    pub peers: BTreeMap<u64, String>,
    /// Carries RPCs to the other peers; required when there are any.
    pub transport: Option<Arc<dyn Transport>>,
    /// Bootstrap every uninitialized group's voter set (all peers) on this start. Set on the
    /// first start of a fresh cluster only. A node without peers always bootstraps its groups.
    pub init_membership: bool,
    /// The cluster this data directory belongs to: recorded on first start, a mismatch refuses
    /// to open. `None` checks nothing (and records nothing).
    pub cluster_id: Option<String>,
    /// Election and heartbeat timing.
    pub timing: RaftTiming,
    /// Send the small RPCs of many groups to a peer in batches (`coalesce.rs`). Default: on.
    pub rpc_batching: bool,
    /// How long a one-voter group's next batch may wait for the writers its previous batch
    /// answered, so that one sync carries them all (`batcher.rs`). Zero: never. Default:
    /// [`COMMIT_LINGER`].
    pub commit_linger: Duration,
}

/// Default [`NodeConfig::commit_linger`]: about two fast syncs on the benchmark VM's disk.
pub const COMMIT_LINGER: Duration = Duration::from_micros(250);

impl std::fmt::Debug for NodeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeConfig")
            .field("data_dir", &self.data_dir)
            .field("node_id", &self.node_id)
            .field("group_count", &self.group_count)
            .field("wal", &self.wal)
            .field("snapshot_logs", &self.snapshot_logs)
            .field("snapshot_min_log_bytes", &self.snapshot_min_log_bytes)
            .field("listener", &self.listener.is_some())
            .field("peers", &self.peers)
            .field("transport", &self.transport.is_some())
            .field("init_membership", &self.init_membership)
            .field("cluster_id", &self.cluster_id)
            .field("timing", &self.timing)
            .field("rpc_batching", &self.rpc_batching)
            .field("commit_linger", &self.commit_linger)
            .finish()
    }
}

impl NodeConfig {
    /// Defaults: node 1, 16 groups, default WAL options, snapshot every 20 000 entries.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        NodeConfig {
            data_dir: data_dir.into(),
            node_id: 1,
            group_count: 16,
            wal: WalOptions::default(),
            snapshot_logs: 20_000,
            snapshot_min_log_bytes: 64 << 20,
            listener: None,
            peers: BTreeMap::new(),
            transport: None,
            init_membership: false,
            cluster_id: None,
            timing: RaftTiming::default(),
            rpc_batching: true,
            commit_linger: COMMIT_LINGER,
        }
    }
}

struct Pending {
    cmd: Command,
    size: usize,
    tx: oneshot::Sender<Result<Response, ProposeError>>,
}

struct Group {
    raft: Raft,
    state: Arc<RwLock<GroupState>>,
    applied: watch::Receiver<u64>,
    queue: mpsc::Sender<Pending>,
    /// The group's term when this process opened it (elections are counted from it).
    opened_term: u64,
    /// Batches submitted to openraft and not yet answered (at most
    /// [`MAX_INFLIGHT_BATCHES`]); a leadership transfer holds every permit to pause the group.
    inflight: Arc<Semaphore>,
    log: Arc<GroupLog>,
    snapshots: Arc<SnapshotStore>,
    /// When a leader's append-entries (or snapshot) last reached this node, in ms of
    /// [`Node::clock`] (0: at open): tells a live leader from a dead one (`cluster.rs`).
    heard_ms: AtomicU64,
}

/// A running node: one openraft instance per group, all logging to one WAL.
pub struct Node {
    node_id: u64,
    /// Voters other than this node's own entry included (id -> URL); empty without peers.
    peers: BTreeMap<u64, String>,
    /// Carries RPCs to peers, small ones in batches (cross-group proposals; openraft's
    /// networks hold clones).
    transport: Option<Arc<Coalescer>>,
    groups: Vec<Group>,
    /// Which groups the node-wide heartbeat clock heartbeats (`heartbeat.rs`).
    heartbeats: Arc<heartbeat::Heartbeats>,
    wal: Wal,
    closing: AtomicBool,
    /// Why this node sheds leadership, if it does (transfer.rs).
    shed: transfer::Shed,
    timing: RaftTiming,
    stop: watch::Sender<bool>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    shut_down: tokio::sync::Mutex<bool>,
    /// Groups a wiped data directory may not take part in yet (`rejoin.rs`).
    rejoin: Arc<rejoin::Rejoin>,
    /// The node's monotonic clock (since open), for [`Group::heard_ms`].
    clock: Instant,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("node_id", &self.node_id)
            .field("groups", &self.groups.len())
            .field("wal", &self.wal)
            .finish_non_exhaustive()
    }
}

impl Node {
    /// Opens (or creates) the data directory, recovers every group from its snapshot and the
    /// WAL, starts the groups and bootstraps the voter set of fresh groups (always without
    /// peers, with `init_membership` with peers).
    ///
    /// Without peers it then waits until this node leads every group and has applied its whole
    /// log. With peers it returns as soon as the groups run: the peers' RPCs can only reach a
    /// node that serves them, so the caller starts serving and then waits as long as it likes
    /// ([`Node::wait_for_leaders`]); groups without a leader show in
    /// [`Node::leaderless_groups`].
    pub async fn open(cfg: NodeConfig) -> Result<Arc<Node>, RaftError> {
        cluster::validate(&cfg)?;
        if cfg.group_count == 0 {
            return Err(RaftError::Config("group_count must be at least 1".into()));
        }
        if cfg.snapshot_logs == 0 {
            return Err(RaftError::Config("snapshot_logs must be at least 1".into()));
        }
        let started = Instant::now();
        let cfg2 = cfg.clone();
        let rec = tokio::task::spawn_blocking(move || recover(&cfg2))
            .await
            .map_err(|e| RaftError::Internal(format!("recovery task failed: {e}")))??;
        let wal = rec.wal.clone();
        let rejoin = Arc::clone(&rec.rejoin);
        let transport = cfg.transport.clone().map(|t| {
            // Without batching, no peer gets a queue: every frame goes straight through.
            let peers = cfg.peers.keys().copied().filter(|&p| p != cfg.node_id);
            let peers = peers.filter(|_| cfg.rpc_batching);
            let heartbeat = Duration::from_millis(cfg.timing.heartbeat_ms);
            Arc::new(Coalescer::new(t, peers, heartbeat))
        });
        let mut started_groups = Vec::with_capacity(cfg.group_count as usize);
        let (purged, head) =
            match start_groups(&cfg, rec, transport.clone(), &mut started_groups).await {
                Ok(r) => r,
                Err(e) => {
                    for (raft, _) in &started_groups {
                        let _ = raft.shutdown().await;
                    }
                    let stores: Vec<_> = started_groups
                        .iter()
                        .map(|(_, p)| Arc::clone(&p.snapshots))
                        .collect();
                    let _ = tokio::task::spawn_blocking(move || {
                        stores.iter().for_each(|s| s.close());
                        wal.close();
                    })
                    .await;
                    return Err(e);
                }
            };

        let (stop, _) = watch::channel(false);
        let mut tasks = Vec::new();
        let mut groups = Vec::with_capacity(started_groups.len());
        for (group, (raft, parts)) in started_groups.into_iter().enumerate() {
            let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
            let inflight = Arc::new(Semaphore::new(MAX_INFLIGHT_BATCHES));
            tasks.push(tokio::spawn(run_batcher(
                group as u32,
                raft.clone(),
                rx,
                Arc::clone(&inflight),
                stop.subscribe(),
                wal.clone(),
                cfg.commit_linger,
            )));
            let opened_term = raft.metrics().borrow().current_term;
            groups.push(Group {
                opened_term,
                raft,
                state: parts.state,
                applied: parts.applied,
                queue: tx,
                inflight,
                log: parts.log,
                snapshots: parts.snapshots,
                heard_ms: AtomicU64::new(0),
            });
        }
        let upkeep = Upkeep {
            wal: wal.clone(),
            snapshot_logs: cfg.snapshot_logs,
            snapshot_min_log_bytes: cfg.snapshot_min_log_bytes,
            head,
            groups: groups
                .iter()
                .map(|g| (g.raft.clone(), Arc::clone(&g.log), Arc::clone(&g.snapshots)))
                .collect(),
            purged,
        };
        tasks.push(tokio::spawn(upkeep.run(stop.subscribe())));
        let heartbeats = Arc::new(heartbeat::Heartbeats::new(groups.len()));
        if transport.is_some() {
            tasks.push(tokio::spawn(heartbeat::run(
                groups.iter().map(|g| g.raft.clone()).collect(),
                Arc::clone(&heartbeats),
                Duration::from_millis(cfg.timing.heartbeat_ms),
                stop.subscribe(),
            )));
        }
        rejoin::start(&rejoin, &groups);
        let node = Node {
            node_id: cfg.node_id,
            peers: cfg.peers.clone(),
            transport,
            groups,
            heartbeats,
            wal,
            closing: AtomicBool::new(false),
            shed: transfer::Shed::default(),
            timing: cfg.timing,
            stop,
            tasks: Mutex::new(tasks),
            shut_down: tokio::sync::Mutex::new(false),
            rejoin,
            clock: Instant::now(),
        };
        tracing::info!(
            node_id = node.node_id,
            groups = node.groups.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "raft node open"
        );
        Ok(Arc::new(node))
    }

    /// This node's Raft id.
    pub fn node_id(&self) -> u64 {
        self.node_id
    }

    /// Number of Raft groups.
    pub fn group_count(&self) -> u32 {
        self.groups.len() as u32
    }

    /// Replicates `cmd` in `group` and returns what [`GroupState::apply`] answered, once the
    /// entry is durable, committed and applied.
    ///
    /// Concurrent proposals to a group are batched into one Raft entry (they share the WAL
    /// fsync with each other and with other groups' appends). If the returned future is dropped
    /// after the command was queued, the command may still be applied.
    pub async fn propose(&self, group: u32, cmd: Command) -> Result<Response, ProposeError> {
        let g = self
            .groups
            .get(group as usize)
            .ok_or(ProposeError::NoSuchGroup(group))?;
        if self.closing.load(Ordering::SeqCst) {
            return Err(ProposeError::Unavailable(
                "the node is shutting down".into(),
            ));
        }
        // Storage faults are refused here, before anything reaches the log: these writes
        // change nothing (see docs/storage.md).
        let health = self.wal.health();
        if let Some(reason) = health.failed() {
            return Err(ProposeError::StorageUnavailable(reason));
        }
        if health.disk_full() {
            return Err(ProposeError::InsufficientStorage(
                "the disk is full; writes resume by themselves once space is free".into(),
            ));
        }
        if let Some(leader) = self.not_leading(group) {
            return Err(ProposeError::ForwardToLeader { leader });
        }
        let size = approx_size(&cmd);
        if size > MAX_COMMAND_BYTES {
            return Err(ProposeError::TooLarge {
                size,
                max: MAX_COMMAND_BYTES,
            });
        }
        let (tx, rx) = oneshot::channel();
        g.queue
            .send(Pending { cmd, size, tx })
            .await
            .map_err(|_| ProposeError::Unavailable("the node is shutting down".into()))?;
        rx.await.unwrap_or_else(|_| {
            Err(ProposeError::Unavailable(
                "the group stopped before the proposal completed".into(),
            ))
        })
    }

    /// Runs `f` on the applied state of `group` under a short read lock, the only access
    /// readers get: the lock itself is never handed out, so no caller can hold it across an
    /// await or write through it. Keep `f` short (copy out what the answer needs; hot bytes
    /// are shared `Bytes`, not copies).
    ///
    /// # Panics
    /// If `group >= self.group_count()`.
    pub fn read<R>(&self, group: u32, f: impl FnOnce(&GroupState) -> R) -> R {
        let guard = self.groups[group as usize]
            .state
            .read()
            .unwrap_or_else(|e| e.into_inner());
        f(&guard)
    }

    /// Role, term, leader, log positions and (on a leader) replication lag of `group`.
    ///
    /// # Panics
    /// If `group >= self.group_count()`.
    pub fn group_metrics(&self, group: u32) -> crate::GroupMetrics {
        let g = &self.groups[group as usize];
        let m = g.raft.metrics().borrow().clone();
        let mut row = crate::metrics::of(group, &m);
        row.elections = m.current_term.saturating_sub(g.opened_term);
        row.snapshot_bytes = g.snapshots.bytes();
        row.log_bytes = g.log.retained_bytes();
        row
    }

    /// The last applied log index of `group`; changes after every applied batch.
    ///
    /// # Panics
    /// If `group >= self.group_count()`.
    pub fn applied(&self, group: u32) -> watch::Receiver<u64> {
        self.groups[group as usize].applied.clone()
    }

    /// The openraft handle of `group` (metrics, and later membership changes and RPCs).
    ///
    /// # Panics
    /// If `group >= self.group_count()`.
    pub fn raft(&self, group: u32) -> &Raft {
        &self.groups[group as usize].raft
    }

    /// Bytes of WAL segment files on disk.
    pub fn wal_disk_bytes(&self) -> u64 {
        self.wal.disk_bytes()
    }

    /// What the node's storage is going through (faults, a full disk), for readiness and
    /// metrics.
    pub fn storage_health(&self) -> &Arc<ursula_storage::StorageHealth> {
        self.wal.health()
    }

    /// Whether this node leads `group` right now (leader-only work: cold flush and GC).
    pub fn leads(&self, group: u32) -> bool {
        self.groups
            .get(group as usize)
            .is_some_and(|g| g.raft.metrics().borrow().current_leader == Some(self.node_id()))
    }

    /// Groups that have no known leader right now (readiness).
    pub fn leaderless_groups(&self) -> Vec<u32> {
        self.groups
            .iter()
            .enumerate()
            .filter(|(_, g)| g.raft.metrics().borrow().current_leader.is_none())
            .map(|(i, _)| i as u32)
            .collect()
    }

    /// Number of WAL data syncs since open.
    pub fn wal_sync_count(&self) -> u64 {
        self.wal.sync_count()
    }

    /// WAL segments made of released ones since open.
    pub fn wal_segments_reused(&self) -> u64 {
        self.wal.segments_reused()
    }

    /// Stops accepting proposals, lets queued ones finish, stops every group and closes the WAL.
    /// Idempotent.
    pub async fn shutdown(&self) {
        let mut done = self.shut_down.lock().await;
        if *done {
            return;
        }
        self.closing.store(true, Ordering::SeqCst);
        self.stop.send_replace(true);
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|e| e.into_inner()));
        for task in tasks {
            if tokio::time::timeout(SHUTDOWN_DRAIN_TIMEOUT, task)
                .await
                .is_err()
            {
                tracing::warn!("a raft node task did not stop in time");
            }
        }
        for (group, g) in self.groups.iter().enumerate() {
            // Bounded: a core waiting on a WAL write that a full disk holds cannot stop until
            // the WAL is closed below (which fails that write).
            match tokio::time::timeout(SHUTDOWN_DRAIN_TIMEOUT, g.raft.shutdown()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(group, error = %e, "raft group did not shut down cleanly")
                }
                Err(_) => tracing::warn!(group, "raft group did not stop in time"),
            }
        }
        // A snapshot build may still be running (openraft spawns it); let it finish writing and
        // refuse later ones, so nothing touches the directory once `shutdown` returns.
        let stores: Vec<_> = self
            .groups
            .iter()
            .map(|g| Arc::clone(&g.snapshots))
            .collect();
        let wal = self.wal.clone();
        let closed = tokio::task::spawn_blocking(move || {
            for s in stores {
                s.close();
            }
            wal.close();
        });
        if let Err(e) = closed.await {
            tracing::warn!(error = %e, "closing the wal failed");
        }
        *done = true;
        tracing::info!(node_id = self.node_id, "raft node shut down");
    }
}

/// Size used to bound batches: every command's variable-size data counts, including
/// snapshot blobs (up to 128 MiB) and the message index a fork inherits.
fn approx_size(cmd: &Command) -> usize {
    64 + cmd.op.payload_len()
}
