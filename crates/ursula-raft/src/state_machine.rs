//! Per-group state machine: applies committed batches to the shared [`GroupState`] and builds,
//! stores and installs snapshots.

use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use openraft::storage::RaftStateMachine;
use openraft::{
    AnyError, EntryPayload, OptionalSend, RaftSnapshotBuilder, Snapshot, StorageIOError,
};
use tokio::sync::watch;
use ursula_core::GroupState;
use ursula_core::command::Affects;
use ursula_storage::fs::FileSystem;
use ursula_storage::pace::Pace;
use ursula_storage::{StorageHealth, Wal, snapshot_file};

use crate::codec::{self, SNAPSHOT_FORMAT, SnapshotHeader};
use crate::listener::ApplyListener;
use crate::types::{
    BatchResponse, Entry, LogId, SnapshotMeta, StorageError, StoredMembership, TypeConfig,
};

/// The snapshot file of one group, and what was last written to it.
pub(crate) struct SnapshotStore {
    group: u32,
    path: PathBuf,
    file: Mutex<FileState>,
    /// Size of the snapshot on disk, in bytes.
    bytes: AtomicU64,
    /// The filesystem the WAL writes through, and where failures are reported.
    fs: Arc<dyn FileSystem>,
    health: Arc<StorageHealth>,
    /// Keeps the WAL (and so its directory lock) open while anything that may still write a
    /// snapshot lives, so that a node reopened on the same directory never races a snapshot
    /// write of a previous instance that was dropped without `shutdown`.
    _wal: Wal,
}

struct FileState {
    /// Last log id of the snapshot on disk; guards against an older one replacing a newer one.
    written: Option<LogId>,
    /// Set by `close`: no more writes.
    closed: bool,
}

impl SnapshotStore {
    pub(crate) fn new(
        group: u32,
        path: PathBuf,
        on_disk: Option<(Option<LogId>, u64)>,
        wal: Wal,
    ) -> Self {
        let (written, bytes) = on_disk.unwrap_or((None, 0));
        SnapshotStore {
            group,
            path,
            file: Mutex::new(FileState {
                written,
                closed: false,
            }),
            bytes: AtomicU64::new(bytes),
            fs: Arc::clone(wal.fs()),
            health: Arc::clone(wal.health()),
            _wal: wal,
        }
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Waits for a snapshot write in progress and refuses later ones (blocking).
    pub(crate) fn close(&self) {
        self.file.lock().unwrap_or_else(|e| e.into_inner()).closed = true;
    }

    fn is_closed(&self) -> bool {
        self.file.lock().unwrap_or_else(|e| e.into_inner()).closed
    }

    /// Durably replaces the snapshot file (blocking), written at `pace`.
    fn write(&self, last: Option<LogId>, payload: &[u8], pace: Pace) -> Result<(), String> {
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        if file.closed {
            return Err("the node is shutting down".into());
        }
        if file.written.is_some() && last < file.written {
            return Ok(());
        }
        snapshot_file::write_atomic(self.fs.as_ref(), &self.path, payload, pace)
            .map_err(|e| e.to_string())?;
        file.written = last;
        self.bytes.store(payload.len() as u64, Ordering::Relaxed);
        tracing::debug!(group = self.group, bytes = payload.len(), last = ?last, "snapshot written");
        Ok(())
    }

    /// Opens the snapshot file to send it (blocking): its header, and the file positioned at
    /// its start. The open descriptor keeps this version readable even if a newer snapshot
    /// replaces the file meanwhile; only a bounded prefix is read here.
    fn open_for_send(&self) -> Result<Option<(SnapshotHeader, std::fs::File)>, String> {
        let mut f = match std::fs::File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("{}: {e}", self.path.display())),
        };
        let mut head = [0u8; snapshot_file::HEADER_BYTES as usize];
        f.read_exact(&mut head).map_err(|e| e.to_string())?;
        let len = snapshot_file::parse_header(&head)?;
        let mut prefix = Vec::new();
        (&mut f)
            .take(len.min(SNAPSHOT_HEADER_PREFIX))
            .read_to_end(&mut prefix)
            .map_err(|e| e.to_string())?;
        let header = codec::decode_snapshot(&prefix)?.header;
        f.seek(SeekFrom::Start(0)).map_err(|e| e.to_string())?;
        Ok(Some((header, f)))
    }

    /// Where a snapshot from the leader is received, chunk by chunk.
    fn recv_path(&self) -> PathBuf {
        self.path.with_extension("recv")
    }
}

/// Bytes of a snapshot payload read to decode its header (membership, ids: far smaller).
const SNAPSHOT_HEADER_PREFIX: u64 = 1 << 20;

/// A group's state as loaded from its snapshot file at startup.
pub(crate) struct Loaded {
    pub state: GroupState,
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
    pub applied_commands: u64,
    pub file: Option<(Option<LogId>, u64)>,
}

/// Loads `{path}` (blocking). A missing file is a fresh group.
pub(crate) fn load_snapshot(
    fs: &dyn FileSystem,
    group: u32,
    path: &std::path::Path,
) -> Result<Loaded, String> {
    let Some(payload) = snapshot_file::read_checked(fs, path).map_err(|e| e.to_string())? else {
        return Ok(Loaded {
            state: GroupState::new(group),
            last_applied: None,
            membership: StoredMembership::default(),
            applied_commands: 0,
            file: None,
        });
    };
    let parts = codec::decode_snapshot(&payload)?;
    let state = parts.decode_state()?;
    let header = parts.header;
    if header.group != group {
        return Err(format!(
            "{} holds group {}, expected group {group}",
            path.display(),
            header.group
        ));
    }
    Ok(Loaded {
        state,
        last_applied: header.last_applied,
        membership: header.membership,
        applied_commands: header.applied_commands,
        file: Some((header.last_applied, payload.len() as u64)),
    })
}

fn sm_error(e: impl ToString) -> StorageError {
    StorageIOError::write_state_machine(AnyError::error(e.to_string())).into()
}

fn snapshot_error(meta: Option<&SnapshotMeta>, e: impl ToString) -> StorageError {
    StorageIOError::write_snapshot(meta.map(|m| m.signature()), AnyError::error(e.to_string()))
        .into()
}

/// openraft's handle on a group's state machine.
pub struct StateMachine {
    group: u32,
    state: Arc<RwLock<GroupState>>,
    applied_tx: watch::Sender<u64>,
    last_applied: Option<LogId>,
    membership: StoredMembership,
    /// Commands applied so far; command `n` is applied as `GroupState::apply(n, ..)`, so every
    /// command of a batch gets its own, deterministic index.
    applied_commands: u64,
    snapshots: Arc<SnapshotStore>,
    listener: Option<Arc<dyn ApplyListener>>,
}

impl StateMachine {
    pub(crate) fn new(
        group: u32,
        last_applied: Option<LogId>,
        membership: StoredMembership,
        applied_commands: u64,
        state: Arc<RwLock<GroupState>>,
        applied_tx: watch::Sender<u64>,
        snapshots: Arc<SnapshotStore>,
    ) -> Self {
        StateMachine {
            listener: None,
            group,
            state,
            applied_tx,
            last_applied,
            membership,
            applied_commands,
            snapshots,
        }
    }

    /// Reports each applied batch's changed streams to `listener`.
    pub(crate) fn with_listener(mut self, listener: Option<Arc<dyn ApplyListener>>) -> Self {
        self.listener = listener;
        self
    }

    fn header(&self, snapshot_id: String) -> SnapshotHeader {
        SnapshotHeader {
            format: SNAPSHOT_FORMAT,
            group: self.group,
            last_applied: self.last_applied,
            membership: self.membership.clone(),
            applied_commands: self.applied_commands,
            snapshot_id,
        }
    }
}

fn snapshot_id(group: u32, last: Option<LogId>) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    match last {
        Some(l) => format!("g{group}-{}-{}-{nanos}", l.leader_id.term, l.index),
        None => format!("g{group}-none-{nanos}"),
    }
}

fn meta_of(header: &SnapshotHeader) -> SnapshotMeta {
    SnapshotMeta {
        last_log_id: header.last_applied,
        last_membership: header.membership.clone(),
        snapshot_id: header.snapshot_id.clone(),
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        Ok((self.last_applied, self.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<BatchResponse>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let mut out = Vec::with_capacity(entries.len());
        {
            let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
            for entry in &entries {
                self.last_applied = Some(entry.log_id);
                match &entry.payload {
                    EntryPayload::Blank => out.push(BatchResponse::default()),
                    EntryPayload::Normal(batch) => {
                        let mut responses = Vec::with_capacity(batch.0.len());
                        for cmd in &batch.0 {
                            self.applied_commands += 1;
                            responses.push(state.apply(self.applied_commands, cmd));
                        }
                        out.push(BatchResponse(responses));
                    }
                    EntryPayload::Membership(m) => {
                        self.membership = StoredMembership::new(Some(entry.log_id), m.clone());
                        out.push(BatchResponse::default());
                    }
                }
            }
        }
        if let Some(l) = self.last_applied {
            self.applied_tx.send_replace(l.index);
        }
        // After the write lock is released, so that woken readers see the new state; and only
        // now ask whether anyone listens, so a reader that registered before it looked is heard.
        if let Some(listener) = self.listener.as_ref().filter(|l| l.wanted(self.group)) {
            let mut changed = Vec::new();
            let mut everything = false;
            for entry in &entries {
                if let EntryPayload::Normal(batch) = &entry.payload {
                    for cmd in &batch.0 {
                        match cmd.op.affects() {
                            Affects::Nothing => {}
                            Affects::Stream(key) => changed.push(key),
                            Affects::Everything => everything = true,
                        }
                    }
                }
            }
            if everything || !changed.is_empty() {
                listener.applied(self.group, &changed, everything);
            }
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        // Take the view here, on the state machine task: it is consistent with `last_applied`
        // and no apply runs meanwhile. Cloning shares every stream's bytes (`ByteLog` chunks),
        // so it costs about the metadata; encoding and writing the file happen in
        // `build_snapshot`, on a blocking thread, while this group goes on applying.
        let header = self.header(snapshot_id(self.group, self.last_applied));
        let state = self.state.read().unwrap_or_else(|e| e.into_inner()).clone();
        SnapshotBuilder {
            meta: meta_of(&header),
            pending: Some((header, state)),
            snapshots: Arc::clone(&self.snapshots),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<tokio::fs::File>, StorageError> {
        let path = self.snapshots.recv_path();
        let f = tokio::fs::File::create(&path)
            .await
            .map_err(|e| snapshot_error(None, format!("{}: {e}", path.display())))?;
        Ok(Box::new(f))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<tokio::fs::File>,
    ) -> Result<(), StorageError> {
        // The received file is a copy of the leader's snapshot file (checksummed blob): let
        // every chunk reach it, then verify and decode it.
        let mut snapshot = snapshot;
        tokio::io::AsyncWriteExt::flush(&mut *snapshot)
            .await
            .map_err(|e| snapshot_error(Some(meta), e))?;
        drop(snapshot);
        let store = Arc::clone(&self.snapshots);
        let recv = store.recv_path();
        let payload = tokio::task::spawn_blocking(move || {
            snapshot_file::read_checked(store.fs.as_ref(), &recv)
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "the received snapshot file is gone".to_string())
        })
        .await
        .map_err(|e| snapshot_error(Some(meta), e))?
        .map_err(|e| snapshot_error(Some(meta), e))?;
        let parts = codec::decode_snapshot(&payload).map_err(|e| snapshot_error(Some(meta), e))?;
        let state = parts
            .decode_state()
            .map_err(|e| snapshot_error(Some(meta), e))?;
        let state_bytes = parts.state;
        let header = SnapshotHeader {
            // The state bytes are kept as they came, so the format they were written in is.
            format: parts.header.format,
            group: self.group,
            last_applied: meta.last_log_id,
            membership: meta.last_membership.clone(),
            applied_commands: parts.header.applied_commands,
            snapshot_id: meta.snapshot_id.clone(),
        };
        let file = codec::encode_snapshot(&header, state_bytes)
            .map_err(|e| snapshot_error(Some(meta), e))?;
        let store = Arc::clone(&self.snapshots);
        let last = meta.last_log_id;
        tokio::task::spawn_blocking(move || {
            // A follower does not apply until its snapshot is installed: written flat out.
            store.write(last, &file, Pace::FLAT)?;
            let _ = std::fs::remove_file(store.recv_path());
            Ok::<(), String>(())
        })
        .await
        .map_err(|e| snapshot_error(Some(meta), e))?
        .map_err(|e| snapshot_error(Some(meta), e))?;

        *self.state.write().unwrap_or_else(|e| e.into_inner()) = state;
        self.last_applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        self.applied_commands = header.applied_commands;
        self.applied_tx
            .send_replace(self.last_applied.map_or(0, |l| l.index));
        if let Some(listener) = self.listener.as_ref().filter(|l| l.wanted(self.group)) {
            listener.applied(self.group, &[], true);
        }
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let store = Arc::clone(&self.snapshots);
        let opened = tokio::task::spawn_blocking(move || store.open_for_send())
            .await
            .map_err(sm_error)?
            .map_err(|e| {
                StorageError::from(StorageIOError::read_snapshot(None, AnyError::error(e)))
            })?;
        Ok(opened.map(|(header, file)| Snapshot {
            meta: meta_of(&header),
            snapshot: Box::new(tokio::fs::File::from_std(file)),
        }))
    }
}

/// Encodes and writes the state taken by [`StateMachine::get_snapshot_builder`].
pub struct SnapshotBuilder {
    meta: SnapshotMeta,
    /// The file header and the state as of `meta.last_log_id`, until built.
    pending: Option<(SnapshotHeader, GroupState)>,
    snapshots: Arc<SnapshotStore>,
}

/// First and longest pause between attempts to write a snapshot file.
const SNAPSHOT_RETRY_FIRST: Duration = Duration::from_millis(200);
const SNAPSHOT_RETRY_MAX: Duration = Duration::from_secs(30);

impl SnapshotBuilder {
    /// Writes the snapshot file, retrying with backoff until it succeeds: a failed snapshot
    /// write (a full disk, a failed sync) must never stop the group (openraft treats a failed
    /// build as fatal). The log is not purged meanwhile, so nothing is lost and writes go on;
    /// the failure shows in readiness and metrics until a write succeeds. Gives up only when
    /// the node shuts down.
    async fn write_retrying(&self, payload: Vec<u8>) -> Result<Vec<u8>, StorageError> {
        let store = Arc::clone(&self.snapshots);
        let last = self.meta.last_log_id;
        let mut payload = payload;
        let mut delay = SNAPSHOT_RETRY_FIRST;
        loop {
            let s = Arc::clone(&store);
            let (back, res) = tokio::task::spawn_blocking(move || {
                // Built beside a live WAL: at the background pace.
                let res = s.write(last, &payload, Pace::BACKGROUND);
                (payload, res)
            })
            .await
            .map_err(|e| snapshot_error(Some(&self.meta), e))?;
            payload = back;
            match res {
                Ok(()) => {
                    store.health.snapshot_ok(store.group);
                    return Ok(payload);
                }
                Err(e) if store.is_closed() => return Err(snapshot_error(Some(&self.meta), e)),
                Err(e) => {
                    tracing::warn!(
                        group = store.group,
                        error = %e,
                        retry_in_ms = delay.as_millis() as u64,
                        "writing a snapshot failed; retrying (the log is kept meanwhile)"
                    );
                    store.health.snapshot_failed(store.group, e);
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(SNAPSHOT_RETRY_MAX);
                }
            }
        }
    }
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let (header, state) = self
            .pending
            .take()
            .ok_or_else(|| snapshot_error(Some(&self.meta), "snapshot already built"))?;
        let payload = tokio::task::spawn_blocking(move || {
            let payload = codec::encode_snapshot_of(&header, &state);
            drop(state);
            payload
        })
        .await
        .map_err(|e| snapshot_error(Some(&self.meta), e))?
        .map_err(|e| snapshot_error(Some(&self.meta), e))?;
        let payload = self.write_retrying(payload).await?;
        let bytes = payload.len();
        drop(payload);
        tracing::info!(
            group = self.snapshots.group,
            last = ?self.meta.last_log_id,
            bytes,
            "snapshot built"
        );
        // openraft keeps only the meta of a built snapshot; replication opens the current file
        // (`get_current_snapshot`). Hand back the file just written all the same.
        let store = Arc::clone(&self.snapshots);
        let opened = tokio::task::spawn_blocking(move || store.open_for_send())
            .await
            .map_err(|e| snapshot_error(Some(&self.meta), e))?
            .map_err(|e| snapshot_error(Some(&self.meta), e))?
            .ok_or_else(|| snapshot_error(Some(&self.meta), "the snapshot file is gone"))?;
        Ok(Snapshot {
            meta: self.meta.clone(),
            snapshot: Box::new(tokio::fs::File::from_std(opened.1)),
        })
    }
}
