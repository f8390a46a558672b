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

use crate::error::{ProposeError, RaftError};
use crate::identity::{self, Identity};
use crate::listener::ApplyListener;
use crate::log_store::{GroupLog, LogInner, LogStore, Marks};
use crate::network::SingleNodeNetwork;
use crate::state_machine::{self, Loaded, SnapshotStore, StateMachine};
use crate::types::{Batch, Raft};

/// How long `open` waits for this node to lead (and catch up) every group.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// Upper bounds of one proposal batch (one Raft entry).
const MAX_BATCH_COMMANDS: usize = 4096;
const MAX_BATCH_BYTES: usize = 8 << 20;
/// Largest command accepted (its approximate encoded size); a batch stays far below the WAL's
/// record limit.
const MAX_COMMAND_BYTES: usize = ursula_storage::MAX_PAYLOAD_LEN / 4;
/// Batches of one group submitted to openraft and not yet answered. One is enough: the next
/// batch gathers everything queued while the current one is being made durable.
const MAX_INFLIGHT_BATCHES: usize = 1;
/// Proposals queued per group before `propose` waits (back-pressure).
const QUEUE_CAPACITY: usize = 16 * 1024;
/// How often upkeep (segment GC, snapshot triggers) runs, besides right after a purge.
const UPKEEP_INTERVAL: Duration = Duration::from_millis(500);
/// A group whose retained log exceeds max(this, its last snapshot's size) is snapshotted.
const SNAPSHOT_MIN_LOG_BYTES: u64 = 64 << 20;
/// Upkeep triggers at most one snapshot per group per this interval.
const SNAPSHOT_TRIGGER_BACKOFF: Duration = Duration::from_secs(1);
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
    /// Hears which streams each applied batch may have changed (live readers).
    pub listener: Option<Arc<dyn ApplyListener>>,
}

impl std::fmt::Debug for NodeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeConfig")
            .field("data_dir", &self.data_dir)
            .field("node_id", &self.node_id)
            .field("group_count", &self.group_count)
            .field("wal", &self.wal)
            .field("snapshot_logs", &self.snapshot_logs)
            .field("listener", &self.listener.is_some())
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
            listener: None,
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
    log: Arc<GroupLog>,
    snapshots: Arc<SnapshotStore>,
}

/// A running node: one openraft instance per group, all logging to one WAL.
pub struct Node {
    node_id: u64,
    groups: Vec<Group>,
    wal: Wal,
    closing: AtomicBool,
    stop: watch::Sender<bool>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    shut_down: tokio::sync::Mutex<bool>,
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

/// What the blocking part of `open` recovered.
struct Recovered {
    wal: Wal,
    head: Lsn,
    logs: Vec<(LogInner, Marks)>,
    snapshots: Vec<(Loaded, PathBuf)>,
}

fn snapshot_path(dir: &Path, group: u32) -> PathBuf {
    dir.join(format!("group-{group}.snap"))
}

fn dir_is_empty(dir: &Path) -> Result<bool, RaftError> {
    match fs::read_dir(dir) {
        Ok(mut it) => Ok(it.next().is_none()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(RaftError::io(dir, e)),
    }
}

fn sync_dir(dir: &Path) -> Result<(), RaftError> {
    fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(|e| RaftError::io(dir, e))
}

/// Opens the data directory, the WAL and the snapshots, and rebuilds every group's log
/// (blocking).
fn recover(cfg: &NodeConfig) -> Result<Recovered, RaftError> {
    let data = &cfg.data_dir;
    fs::create_dir_all(data).map_err(|e| RaftError::io(data, e))?;
    let wal_dir = data.join("wal");
    let snap_dir = data.join("snapshots");
    let fresh = dir_is_empty(&wal_dir)? && dir_is_empty(&snap_dir)?;
    identity::check_or_create(
        data,
        &Identity {
            node_id: cfg.node_id,
            group_count: cfg.group_count,
        },
        fresh,
    )?;
    if !snap_dir.exists() {
        fs::create_dir_all(&snap_dir).map_err(|e| RaftError::io(&snap_dir, e))?;
        sync_dir(data)?;
    }

    let mut wal_opts = cfg.wal.clone();
    if wal_opts.deliver_on.is_none() {
        // Completions wake Raft tasks: deliver each synced batch with one wake-up of the
        // runtime instead of one per group (see `WalOptions::deliver_on`).
        wal_opts.deliver_on = tokio::runtime::Handle::try_current().ok();
    }
    let (wal, records) = Wal::open(&wal_dir, wal_opts)?;
    let mut logs: Vec<(LogInner, Marks)> =
        (0..cfg.group_count).map(|_| Default::default()).collect();
    let mut head = 0;
    for (lsn, rec) in records {
        head = lsn;
        let Some((inner, marks)) = logs.get_mut(rec.group as usize) else {
            wal.close();
            return Err(RaftError::Corrupt(format!(
                "wal record {lsn} belongs to group {} but there are {} groups",
                rec.group, cfg.group_count
            )));
        };
        if let Err(e) = inner.replay(lsn, rec.kind, &rec.payload, marks) {
            wal.close();
            return Err(RaftError::Corrupt(format!(
                "wal record {lsn} of group {}: {e}",
                rec.group
            )));
        }
    }

    for (group, (inner, _)) in logs.iter().enumerate() {
        if let Err(e) = inner.check() {
            wal.close();
            return Err(RaftError::Corrupt(format!("group {group}: {e}")));
        }
    }

    let mut snapshots = Vec::with_capacity(cfg.group_count as usize);
    for group in 0..cfg.group_count {
        let path = snapshot_path(&snap_dir, group);
        match state_machine::load_snapshot(group, &path) {
            Ok(loaded) => {
                let purged = logs[group as usize].0.last_purged();
                if let Some(p) = purged
                    && loaded.last_applied.is_none_or(|l| l.index < p.index)
                {
                    wal.close();
                    return Err(RaftError::Corrupt(format!(
                        "group {group}: the log was purged up to {p} but {} covers only {:?}",
                        path.display(),
                        loaded.last_applied
                    )));
                }
                snapshots.push((loaded, path));
            }
            Err(e) => {
                wal.close();
                return Err(RaftError::Corrupt(format!(
                    "snapshot of group {group}: {e}"
                )));
            }
        }
    }
    Ok(Recovered {
        wal,
        head,
        logs,
        snapshots,
    })
}

fn raft_config(group: u32, snapshot_logs: u64) -> Result<openraft::Config, RaftError> {
    openraft::Config {
        cluster_name: format!("ursula-group-{group}"),
        heartbeat_interval: 50,
        election_timeout_min: 150,
        election_timeout_max: 300,
        install_snapshot_timeout: 10_000,
        max_payload_entries: 4096,
        replication_lag_threshold: snapshot_logs.saturating_mul(2),
        snapshot_policy: SnapshotPolicy::LogsSinceLast(snapshot_logs),
        max_in_snapshot_log_to_keep: 0,
        purge_batch_size: 1,
        ..Default::default()
    }
    .validate()
    .map_err(|e| RaftError::Config(e.to_string()))
}

fn group_err(group: u32, e: impl ToString) -> RaftError {
    RaftError::Group {
        group,
        message: e.to_string(),
    }
}

impl Node {
    /// Opens (or creates) the data directory, recovers every group from its snapshot and the
    /// WAL, starts the groups, initializes a single-voter membership on first boot, and waits
    /// until this node leads every group and has applied its whole log.
    pub async fn open(cfg: NodeConfig) -> Result<Arc<Node>, RaftError> {
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
        let mut started_groups = Vec::with_capacity(cfg.group_count as usize);
        let (purged, head) = match start_groups(&cfg, rec, &mut started_groups).await {
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
            tasks.push(tokio::spawn(run_batcher(
                group as u32,
                raft.clone(),
                rx,
                stop.subscribe(),
            )));
            groups.push(Group {
                raft,
                state: parts.state,
                applied: parts.applied,
                queue: tx,
                log: parts.log,
                snapshots: parts.snapshots,
            });
        }
        let upkeep = Upkeep {
            wal: wal.clone(),
            snapshot_logs: cfg.snapshot_logs,
            head,
            groups: groups
                .iter()
                .map(|g| (g.raft.clone(), Arc::clone(&g.log), Arc::clone(&g.snapshots)))
                .collect(),
            purged,
        };
        tasks.push(tokio::spawn(upkeep.run(stop.subscribe())));
        let node = Node {
            node_id: cfg.node_id,
            groups,
            wal,
            closing: AtomicBool::new(false),
            stop,
            tasks: Mutex::new(tasks),
            shut_down: tokio::sync::Mutex::new(false),
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

    /// The state of `group`, as last applied. Readers take the read lock; only the group's state
    /// machine writes.
    ///
    /// # Panics
    /// If `group >= self.group_count()`.
    pub fn state(&self, group: u32) -> &Arc<RwLock<GroupState>> {
        &self.groups[group as usize].state
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

    /// Number of WAL data syncs since open.
    pub fn wal_sync_count(&self) -> u64 {
        self.wal.sync_count()
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
            if let Err(e) = g.raft.shutdown().await {
                tracing::warn!(group, error = %e, "raft group did not shut down cleanly");
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

struct GroupParts {
    state: Arc<RwLock<GroupState>>,
    applied: watch::Receiver<u64>,
    log: Arc<GroupLog>,
    snapshots: Arc<SnapshotStore>,
}

/// Starts every group, pushing each started one to `out` (so that the caller can stop them on
/// failure), initializes fresh groups and waits for leadership. Returns the purge notifier and
/// the node-wide durable LSN head.
async fn start_groups(
    cfg: &NodeConfig,
    rec: Recovered,
    out: &mut Vec<(Raft, GroupParts)>,
) -> Result<(Arc<Notify>, Arc<AtomicU64>), RaftError> {
    let head = Arc::new(AtomicU64::new(rec.head));
    let purged = Arc::new(Notify::new());
    for (group, ((inner, marks), (loaded, path))) in
        rec.logs.into_iter().zip(rec.snapshots).enumerate()
    {
        let group = group as u32;
        let log = Arc::new(GroupLog::new(
            group,
            rec.wal.clone(),
            Arc::clone(&head),
            inner,
            marks,
            Arc::clone(&purged),
        ));
        let Loaded {
            state,
            last_applied,
            membership,
            applied_commands,
            file,
        } = loaded;
        let snapshots = Arc::new(SnapshotStore::new(group, path, file, rec.wal.clone()));
        let (applied_tx, applied) = watch::channel(last_applied.map_or(0, |l| l.index));
        let state = Arc::new(RwLock::new(state));
        let sm = StateMachine::new(
            group,
            last_applied,
            membership,
            applied_commands,
            Arc::clone(&state),
            applied_tx,
            Arc::clone(&snapshots),
        )
        .with_listener(cfg.listener.clone());
        let config = Arc::new(raft_config(group, cfg.snapshot_logs)?);
        let raft = Raft::new(
            cfg.node_id,
            config,
            SingleNodeNetwork,
            LogStore::new(Arc::clone(&log)),
            sm,
        )
        .await
        .map_err(|e| group_err(group, e))?;
        out.push((
            raft,
            GroupParts {
                state,
                applied,
                log,
                snapshots,
            },
        ));
    }

    for (group, (raft, _)) in out.iter().enumerate() {
        let group = group as u32;
        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| group_err(group, e))?;
        if !initialized {
            let members = BTreeMap::from([(cfg.node_id, BasicNode::new(""))]);
            match raft.initialize(members).await {
                Ok(()) => tracing::info!(group, "initialized single-voter membership"),
                Err(openraft::error::RaftError::APIError(InitializeError::NotAllowed(_))) => {}
                Err(e) => return Err(group_err(group, e)),
            }
        }
    }

    let me = cfg.node_id;
    for (group, (raft, _)) in out.iter().enumerate() {
        raft.wait(Some(STARTUP_TIMEOUT))
            .metrics(
                |m| {
                    m.state == ServerState::Leader
                        && m.current_leader == Some(me)
                        && m.last_applied.map(|l| l.index) >= m.last_log_index
                },
                "leader with the whole log applied",
            )
            .await
            .map_err(|e| group_err(group as u32, format!("did not become leader: {e}")))?;
    }
    Ok((purged, head))
}

/// Size used to bound batches: every command's variable-size data counts, including
/// snapshot blobs (up to 128 MiB) and the message index a fork inherits.
fn approx_size(cmd: &Command) -> usize {
    64 + cmd.op.payload_len()
}

fn fatal_error(e: &Fatal<u64>) -> ProposeError {
    match e {
        Fatal::Stopped => ProposeError::Unavailable("the raft group stopped".into()),
        Fatal::StorageError(e) => ProposeError::Storage(e.to_string()),
        Fatal::Panicked => ProposeError::Storage("the raft group panicked".into()),
    }
}

/// Why a group's core stopped, if it stopped with an error.
fn stopped_error(raft: &Raft) -> ProposeError {
    match &raft.metrics().borrow().running_state {
        Err(e) => fatal_error(e),
        Ok(()) => ProposeError::Unavailable("the raft group stopped".into()),
    }
}

/// Gathers a group's queued proposals into batches and submits them to openraft in order.
async fn run_batcher(
    group: u32,
    raft: Raft,
    mut rx: mpsc::Receiver<Pending>,
    mut stop: watch::Receiver<bool>,
) {
    let inflight = Arc::new(Semaphore::new(MAX_INFLIGHT_BATCHES));
    let mut stopping = false;
    // A proposal taken from the queue that did not fit in the previous batch.
    let mut carry: Option<Pending> = None;
    loop {
        let Ok(permit) = Arc::clone(&inflight).acquire_owned().await else {
            break;
        };
        let first = if carry.is_some() {
            carry.take()
        } else if stopping {
            rx.recv().await
        } else {
            tokio::select! {
                m = rx.recv() => m,
                _ = stop.changed() => {
                    // Refuse new proposals, but finish the queued ones.
                    stopping = true;
                    rx.close();
                    continue;
                }
            }
        };
        let Some(first) = first else { break };
        // Let every task that is ready to run (HTTP connections parsing their requests) queue
        // its proposal first, so that this batch carries all of them.
        tokio::task::yield_now().await;
        let mut bytes = first.size;
        let mut cmds = vec![first.cmd];
        let mut txs = vec![first.tx];
        while cmds.len() < MAX_BATCH_COMMANDS {
            match rx.try_recv() {
                Ok(p) if bytes + p.size > MAX_BATCH_BYTES => {
                    carry = Some(p);
                    break;
                }
                Ok(p) => {
                    bytes += p.size;
                    cmds.push(p.cmd);
                    txs.push(p.tx);
                }
                Err(_) => break,
            }
        }
        match raft.client_write_ff(Batch(cmds)).await {
            Ok(resp) => {
                let raft = raft.clone();
                tokio::spawn(async move {
                    let result = resp.await;
                    deliver(group, &raft, result, txs);
                    drop(permit);
                });
            }
            Err(e) => {
                let err = fatal_error(&e);
                for tx in txs {
                    let _ = tx.send(Err(err.clone()));
                }
            }
        }
    }
    // Wait for the batches still in flight.
    let _ = inflight.acquire_many(MAX_INFLIGHT_BATCHES as u32).await;
}

type WriteResult = Result<
    Result<
        openraft::raft::ClientWriteResponse<crate::types::TypeConfig>,
        ClientWriteError<u64, BasicNode>,
    >,
    oneshot::error::RecvError,
>;

fn deliver(
    group: u32,
    raft: &Raft,
    result: WriteResult,
    txs: Vec<oneshot::Sender<Result<Response, ProposeError>>>,
) {
    let err = match result {
        Ok(Ok(resp)) => {
            let responses = resp.data.0;
            if responses.len() == txs.len() {
                for (tx, r) in txs.into_iter().zip(responses) {
                    let _ = tx.send(Ok(r));
                }
                return;
            }
            tracing::error!(
                group,
                expected = txs.len(),
                got = responses.len(),
                "state machine answered a batch with the wrong number of responses"
            );
            ProposeError::Storage("the state machine answered the wrong number of responses".into())
        }
        Ok(Err(ClientWriteError::ForwardToLeader(f))) => {
            ProposeError::Unavailable(match f.leader_id {
                Some(l) => format!("this node does not lead group {group}; node {l} does"),
                None => format!("group {group} has no leader"),
            })
        }
        Ok(Err(e)) => ProposeError::Unavailable(e.to_string()),
        Err(_) => stopped_error(raft),
    };
    for tx in txs {
        let _ = tx.send(Err(err.clone()));
    }
}

/// Background upkeep: deletes WAL segments no group needs, and gets groups that hold old
/// segments (or a large log) to snapshot and purge.
struct Upkeep {
    wal: Wal,
    snapshot_logs: u64,
    head: Arc<AtomicU64>,
    groups: Vec<(Raft, Arc<GroupLog>, Arc<SnapshotStore>)>,
    purged: Arc<Notify>,
}

/// First LSNs of the WAL segment files in `dir`, ascending (named `wal-{first_lsn:020}.log`).
fn segment_starts(dir: &Path) -> Vec<Lsn> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<Lsn> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name();
            let digits = name.to_str()?.strip_prefix("wal-")?.strip_suffix(".log")?;
            if digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()) {
                digits.parse().ok()
            } else {
                None
            }
        })
        .collect();
    out.sort_unstable();
    out
}

impl Upkeep {
    async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut last_trigger: Vec<Option<Instant>> = vec![None; self.groups.len()];
        let mut round = 0usize;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(UPKEEP_INTERVAL) => {}
                _ = self.purged.notified() => {}
                _ = stop.changed() => break,
            }
            self.pass(&mut last_trigger, round).await;
            round = round.wrapping_add(1);
        }
    }

    /// Groups in the order pass `round` considers them: a different first group each pass, so
    /// the one snapshot a pass may trigger is not always offered to the same groups first.
    fn rotated(&self, round: usize) -> impl Iterator<Item = usize> + use<> {
        let n = self.groups.len().max(1);
        (0..self.groups.len()).map(move |k| (k + round) % n)
    }

    async fn pass(&self, last_trigger: &mut [Option<Instant>], round: usize) {
        // Every record at or below `durable` has had its bookkeeping done, so records above it
        // are never below a pin we fail to see.
        let durable = self.head.load(Ordering::SeqCst);
        let cutoff = self
            .groups
            .iter()
            .filter_map(|(_, log, _)| log.pin())
            .fold(durable + 1, Lsn::min);
        let wal = self.wal.clone();
        let gc = tokio::task::spawn_blocking(move || {
            let freed = wal.remove_segments_before(cutoff);
            let starts = if wal.segment_count() > 1 {
                segment_starts(wal.dir())
            } else {
                Vec::new()
            };
            (freed, starts)
        })
        .await;
        let starts = match gc {
            Ok((Ok(freed), starts)) => {
                if freed > 0 {
                    tracing::debug!(freed, cutoff, "deleted wal segments");
                }
                starts
            }
            Ok((Err(e), _)) => {
                tracing::warn!(error = %e, "deleting wal segments failed");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "wal gc task failed");
                return;
            }
        };

        // The oldest segment ends where the second one starts; move whatever pins it. A group
        // whose entries pin it is snapshotted only once the WAL outweighs its snapshot, which
        // bounds the bytes re-written per byte of WAL freed.
        //
        // At most one snapshot is triggered per pass: groups written at the same rate would
        // otherwise all snapshot at once, and writing all their state together stalls the WAL's
        // syncs (and so every acknowledgement) behind the disk.
        let mut triggered = false;
        if let Some(&target) = starts.get(1) {
            let wal_bytes = self.wal.disk_bytes();
            for i in self.rotated(round) {
                let (_, log, snapshots) = &self.groups[i];
                if log.pin().is_some_and(|p| p < target) {
                    log.rewrite_markers_below(target);
                    if !triggered
                        && log.first_entry_lsn().is_some_and(|l| l < target)
                        && wal_bytes >= snapshots.bytes()
                    {
                        triggered = self
                            .maybe_snapshot(i, last_trigger, "its log holds the oldest wal segment")
                            .await;
                    }
                }
            }
        }
        for i in self.rotated(round) {
            let (raft, log, snapshots) = &self.groups[i];
            if triggered {
                break;
            }
            if log.retained_bytes() > SNAPSHOT_MIN_LOG_BYTES.max(snapshots.bytes()) {
                triggered = self
                    .maybe_snapshot(i, last_trigger, "its log is large")
                    .await;
                continue;
            }
            // openraft checks its snapshot policy only when an entry commits, and drops the
            // trigger while a snapshot is being built; re-check for groups that went quiet.
            let due = {
                let m = raft.metrics();
                let m = m.borrow();
                let applied = m.last_applied.map_or(0, |l| l.index + 1);
                let snapshot = m.snapshot.map_or(0, |l| l.index + 1);
                applied.saturating_sub(snapshot) >= self.snapshot_logs
            };
            if due {
                triggered = self
                    .maybe_snapshot(i, last_trigger, "its snapshot policy is due")
                    .await;
            }
        }
    }

    /// Asks group `i` to snapshot unless it did recently or has nothing new; true if asked.
    async fn maybe_snapshot(
        &self,
        i: usize,
        last_trigger: &mut [Option<Instant>],
        why: &str,
    ) -> bool {
        let Some((raft, _, _)) = self.groups.get(i) else {
            return false;
        };
        if last_trigger[i].is_some_and(|t| t.elapsed() < SNAPSHOT_TRIGGER_BACKOFF) {
            return false;
        }
        let behind = {
            let m = raft.metrics();
            let m = m.borrow();
            m.last_applied > m.snapshot
        };
        if !behind {
            return false;
        }
        last_trigger[i] = Some(Instant::now());
        tracing::debug!(group = i, why, "triggering a snapshot");
        if let Err(e) = raft.trigger().snapshot().await {
            tracing::warn!(group = i, error = %e, "triggering a snapshot failed");
            return false;
        }
        true
    }
}
