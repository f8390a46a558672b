//! Segmented write-ahead log shared by every Raft group of a node, with group commit.
//!
//! See the crate documentation for the on-disk format and the recovery rules.

mod prepare;
mod recovery;
mod segment;
mod spare;
mod writer;

use std::collections::VecDeque;
use std::io;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};

use crate::format::MAX_PAYLOAD_LEN;
use crate::fs::{FileSystem, OpenMode, RealFs};
use crate::health::StorageHealth;
use recovery::{Recovered, recover};
pub use recovery::{RepairAction, RepairReport, repair};
use segment::{ActiveSegment, create_segment, ensure_dir, lock_dir, preallocate_active};
use writer::{INITIAL_BUF_CAPACITY, Writer};

/// Log sequence number. Assigned by the WAL, strictly increasing by one from 1, survives restart.
pub type Lsn = u64;

/// Tuning knobs for [`Wal::open`].
#[derive(Clone, Debug)]
pub struct WalOptions {
    /// A segment is rotated before an append would grow it past this many bytes (an append is
    /// never split across segments, so one larger than this gets a segment of its own).
    /// Default 64 MiB.
    pub segment_bytes: u64,
    /// Whether to `fdatasync` data and `fsync` directories. Default `true`; `false` only for tests.
    pub fsync: bool,
    /// Where completion callbacks run. `None` (the default): on the writer thread, one after
    /// another. `Some(runtime)`: the writer hands each committed batch to one task on that
    /// runtime, which runs the batch's callbacks in order.
    ///
    /// Callbacks that wake async tasks should use a runtime: each wake from the writer thread
    /// can unpark an idle runtime (a syscall and, on a busy core, a switch to the woken thread
    /// before the writer gets to the next callback), once per callback. Handing over the batch
    /// wakes the runtime once per sync, and the writer is free to take the next batch.
    pub deliver_on: Option<tokio::runtime::Handle>,
    /// The filesystem under the WAL (and the node's snapshot files). Default [`RealFs`];
    /// tests pass a [`crate::fs::FaultyFs`].
    pub fs: Arc<dyn FileSystem>,
    /// Free space the WAL never takes for preallocation, and below which
    /// [`Wal::check_space`] reports the disk full (writes are then refused with `507` until
    /// space is free again). Default 32 MiB.
    pub reserve_bytes: u64,
}

impl Default for WalOptions {
    fn default() -> Self {
        WalOptions {
            segment_bytes: 64 << 20,
            fsync: true,
            deliver_on: None,
            fs: Arc::new(RealFs),
            reserve_bytes: 32 << 20,
        }
    }
}

/// One log record. The payload is opaque to the WAL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalRecord {
    /// Raft group the record belongs to.
    pub group: u32,
    /// Caller-defined record type.
    pub kind: u8,
    /// Caller-defined bytes (at most [`MAX_PAYLOAD_LEN`]).
    pub payload: Vec<u8>,
}

/// Errors from the WAL and from [`crate::snapshot_file`].
#[derive(Debug, thiserror::Error)]
pub enum WalError {
    /// An I/O error from the operating system.
    #[error("wal I/O error: {0}")]
    Io(#[from] io::Error),
    /// On-disk data is damaged in a way that is not a torn tail; acknowledged data may be lost.
    #[error("wal corrupt: {file}: offset {offset}: {reason}")]
    Corrupt {
        file: PathBuf,
        offset: u64,
        reason: String,
    },
    /// The sync (or write) of the batch holding this append failed. Its outcome is unknown:
    /// the bytes may or may not be on disk after a restart. The WAL refuses every later append.
    #[error("wal sync failed; the outcome of this append is unknown: {0}")]
    SyncFailed(String),
    /// The WAL was closed (or its writer thread has stopped).
    #[error("wal is closed")]
    Closed,
    /// A record payload is larger than [`MAX_PAYLOAD_LEN`].
    #[error("record payload of {len} bytes exceeds the limit of {max} bytes")]
    RecordTooLarge { len: usize, max: usize },
    /// Another `Wal` (in this or another process) has the directory open.
    #[error("wal directory {0} is locked by another open Wal")]
    Locked(PathBuf),
    /// An earlier write or sync failed; the file state is unknown, so the WAL refuses further
    /// appends (this one was not written). Close it and reopen: recovery re-reads the disk.
    #[error("wal failed earlier and must be reopened: {0}")]
    Poisoned(String),
}

type DoneCallback = Box<dyn FnOnce(Result<Lsn, WalError>) + Send>;

enum Done {
    Channel(tokio::sync::oneshot::Sender<Result<Lsn, WalError>>),
    Callback(DoneCallback),
}

/// Completes an append exactly once; if dropped uncompleted (writer gone), reports `Closed`.
struct Completion(Option<Done>);

impl Completion {
    fn complete(mut self, result: Result<Lsn, WalError>) {
        if let Some(done) = self.0.take() {
            deliver(done, result);
        }
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        if let Some(done) = self.0.take() {
            deliver(done, Err(WalError::Closed));
        }
    }
}

fn deliver(done: Done, result: Result<Lsn, WalError>) {
    match done {
        Done::Channel(tx) => {
            // The receiver may have been dropped (cancelled append); nothing to do then.
            let _ = tx.send(result);
        }
        Done::Callback(cb) => {
            // A panicking callback must not take the writer thread (and every other group) down.
            if catch_unwind(AssertUnwindSafe(move || cb(result))).is_err() {
                tracing::error!("wal append callback panicked");
            }
        }
    }
}

/// A synced batch's requests with their results, handed to `deliver_batches`.
type CommittedBatch = Vec<(Completion, Result<Lsn, WalError>)>;

enum Msg {
    Append {
        records: Vec<WalRecord>,
        done: Completion,
    },
    Close,
}

/// A sealed (no longer written) segment that `remove_segments_before` may delete.
#[derive(Debug)]
struct SealedSegment {
    /// One past the LSN of its last record (= first LSN of the next segment).
    end_lsn: Lsn,
    path: PathBuf,
    bytes: u64,
}

struct Shared {
    dir: PathBuf,
    fsync: bool,
    fs: Arc<dyn FileSystem>,
    health: Arc<StorageHealth>,
    reserve_bytes: u64,
    sealed: Mutex<VecDeque<SealedSegment>>,
    /// Held for the whole of `remove_segments_before`.
    removal: Mutex<()>,
    /// Released segments kept to become later ones (`spare`).
    spares: Mutex<Vec<PathBuf>>,
    disk_bytes: AtomicU64,
    /// Bytes the writer has written since the WAL opened (paces the next segment's fill).
    written_bytes: AtomicU64,
    /// Set by a rotation that needs the next segment now: its fill stops pausing.
    hurry_prepare: AtomicBool,
    /// [`prepare::MIN_RATE`] (tests lower it).
    prepare_min_rate: AtomicU64,
    sync_count: AtomicU64,
    /// Segments made of spares since the WAL opened.
    reused: AtomicU64,
    closed: AtomicBool,
    /// The groups (bit `group % 64`) of the last batch whose next request the writer awaits
    /// before its next sync (see `Writer::gather`); a request clears its groups' bits, and
    /// the one that clears the last wakes the writer.
    awaited: AtomicU64,
    /// The groups (bit `group % 64`) whose proposer announced that it sends a group's next
    /// entry as soon as the current one is answered ([`Wal::expect_next`]); only these are
    /// awaited.
    awaitable: AtomicU64,
    /// [`writer::AWAIT_GROUPS`] in microseconds (tests lengthen it).
    await_groups_us: AtomicU64,
    /// The writer thread, to wake it.
    writer_thread: std::sync::OnceLock<thread::Thread>,
    /// Test hook: held by a test to stop the writer between receiving the first request of a
    /// batch and draining the rest, making group commit deterministic.
    #[cfg(test)]
    gate: Mutex<()>,
}

impl Shared {
    fn sealed(&self) -> MutexGuard<'_, VecDeque<SealedSegment>> {
        self.sealed.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn spares(&self) -> MutexGuard<'_, Vec<PathBuf>> {
        self.spares.lock().unwrap_or_else(|e| e.into_inner())
    }
}

struct Inner {
    shared: Arc<Shared>,
    tx: Sender<Msg>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        close_inner(self);
    }
}

fn close_inner(inner: &Inner) {
    inner.shared.closed.store(true, Ordering::SeqCst);
    // Fails only if the writer already exited.
    let _ = inner.tx.send(Msg::Close);
    let handle = inner
        .writer
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    if let Some(handle) = handle {
        // `close` may be called from an append callback, i.e. on the writer thread itself.
        if handle.thread().id() != thread::current().id() && handle.join().is_err() {
            tracing::error!("wal writer thread panicked");
        }
    }
}

/// Handle to the node's write-ahead log. Cheap to clone; all clones share one writer thread.
#[derive(Clone)]
pub struct Wal {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal")
            .field("dir", &self.inner.shared.dir)
            .field("closed", &self.inner.shared.closed.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Wal {
    /// Opens (creating if needed) the WAL in `dir`, recovers, and returns every surviving record
    /// in log order with its LSN.
    ///
    /// A torn tail of the last segment is truncated away; any other damage is reported as
    /// [`WalError::Corrupt`]. Blocking; call from a blocking context.
    pub fn open(dir: &Path, opts: WalOptions) -> Result<(Wal, Vec<(Lsn, WalRecord)>), WalError> {
        let fs = Arc::clone(&opts.fs);
        ensure_dir(fs.as_ref(), dir, opts.fsync)?;
        let lock = lock_dir(dir)?;
        let Recovered {
            segments,
            records,
            next_lsn,
            torn: _,
        } = recover(fs.as_ref(), dir, opts.fsync, true)?;

        let mut sealed = VecDeque::with_capacity(segments.len());
        let mut disk_bytes = 0u64;
        let mut iter = segments.into_iter().peekable();
        let mut last = None;
        while let Some(seg) = iter.next() {
            disk_bytes += seg.bytes;
            match iter.peek() {
                Some(next) => sealed.push_back(SealedSegment {
                    end_lsn: next.first_lsn,
                    path: seg.path,
                    bytes: seg.bytes,
                }),
                None => last = Some(seg),
            }
        }
        let active = match last {
            Some(seg) => ActiveSegment {
                file: fs.open(&seg.path, OpenMode::Write)?,
                path: seg.path,
                len: seg.bytes,
                // A version-1 segment is continued in version-1 framing until it is sealed.
                batched: seg.version >= 2,
            },
            None => {
                let seg = create_segment(fs.as_ref(), dir, next_lsn, opts.fsync)?;
                disk_bytes += seg.len;
                seg
            }
        };
        if opts.fsync {
            // The replayed tail was synced by recovery; make the directory entries durable too.
            fs.sync_dir(dir)?;
        }
        tracing::info!(
            dir = %dir.display(),
            records = records.len(),
            next_lsn,
            segments = sealed.len() + 1,
            "wal opened"
        );

        // Spares are only made (and used) when syncing: without syncs there is no stall to
        // spare.
        let spares = match opts.fsync {
            true => spare::keep(fs.as_ref(), spare::list(fs.as_ref(), dir)?),
            false => Vec::new(),
        };
        if opts.fsync {
            preallocate_active(
                fs.as_ref(),
                dir,
                &active,
                opts.segment_bytes,
                opts.reserve_bytes,
            )?;
        }
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            fsync: opts.fsync,
            fs,
            health: Arc::new(StorageHealth::default()),
            reserve_bytes: opts.reserve_bytes,
            sealed: Mutex::new(sealed),
            removal: Mutex::new(()),
            spares: Mutex::new(spares),
            disk_bytes: AtomicU64::new(disk_bytes),
            written_bytes: AtomicU64::new(0),
            hurry_prepare: AtomicBool::new(false),
            prepare_min_rate: AtomicU64::new(prepare::MIN_RATE),
            sync_count: AtomicU64::new(0),
            reused: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            awaited: AtomicU64::new(0),
            awaitable: AtomicU64::new(0),
            await_groups_us: AtomicU64::new(writer::AWAIT_GROUPS.as_micros() as u64),
            writer_thread: std::sync::OnceLock::new(),
            #[cfg(test)]
            gate: Mutex::new(()),
        });
        let (tx, rx) = mpsc::channel();
        let deliver = opts.deliver_on.as_ref().map(|rt| {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            rt.spawn(deliver_batches(rx));
            tx
        });
        let mut writer = Writer {
            shared: Arc::clone(&shared),
            rx,
            segment_bytes: opts.segment_bytes,
            reserve_bytes: opts.reserve_bytes,
            active,
            next_lsn,
            buf: Vec::with_capacity(INITIAL_BUF_CAPACITY),
            batch_count: 0,
            batch_first_lsn: next_lsn,
            batch_crc: 0,
            pending: Vec::with_capacity(256),
            deliver,
            poisoned: None,
            batch_failed: None,
            next_segment: None,
            groups: writer::Groups::default(),
            _lock: lock,
        };
        writer.prepare_before_serving();
        let handle = thread::Builder::new()
            .name("ursula-wal".into())
            .spawn(move || writer.run())?;
        let wal = Wal {
            inner: Arc::new(Inner {
                shared,
                tx,
                writer: Mutex::new(Some(handle)),
            }),
        };
        // A node started on a full disk refuses writes from its first request on.
        wal.check_space();
        Ok((wal, records))
    }

    /// Appends `records` contiguously and in order (no other append is interleaved); resolves
    /// only once they are durable (fsynced). Returns the LSN of the last record (for an empty
    /// `records`, the LSN of the last record appended before it, 0 if none).
    ///
    /// Dropping the future after it was first polled does not cancel the write.
    pub async fn append(&self, records: Vec<WalRecord>) -> Result<Lsn, WalError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.submit(records, Done::Channel(tx));
        rx.await.unwrap_or(Err(WalError::Closed))
    }

    /// Same as [`Wal::append`], but calls `done` once durable: from the writer thread, or
    /// from a task on the runtime given in [`WalOptions::deliver_on`].
    ///
    /// `done` is called exactly once. If the WAL is already closed or a payload is too large it
    /// is called immediately on the calling thread. It must not block for long: it delays every
    /// other group's commit.
    pub fn append_with(
        &self,
        records: Vec<WalRecord>,
        done: Box<dyn FnOnce(Result<Lsn, WalError>) + Send>,
    ) {
        self.submit(records, Done::Callback(done));
    }

    fn submit(&self, records: Vec<WalRecord>, done: Done) {
        let done = Completion(Some(done));
        if self.inner.shared.closed.load(Ordering::SeqCst) {
            done.complete(Err(WalError::Closed));
            return;
        }
        if let Some(r) = records.iter().find(|r| r.payload.len() > MAX_PAYLOAD_LEN) {
            done.complete(Err(WalError::RecordTooLarge {
                len: r.payload.len(),
                max: MAX_PAYLOAD_LEN,
            }));
            return;
        }
        let bits = records
            .iter()
            .fold(0u64, |b, r| b | writer::Groups::bit(r.group));
        // On failure the message comes back and is dropped, which completes it with `Closed`.
        let _ = self.inner.tx.send(Msg::Append { records, done });
        self.arrived(bits);
    }

    /// Clears `bits` from the groups the writer awaits, and wakes it if they were the last.
    fn arrived(&self, bits: u64) {
        let shared = &self.inner.shared;
        if shared.awaited.load(Ordering::Acquire) & bits != 0 {
            let before = shared.awaited.fetch_and(!bits, Ordering::AcqRel);
            if before & bits != 0
                && before & !bits == 0
                && let Some(t) = shared.writer_thread.get()
            {
                t.unpark();
            }
        }
    }

    /// Announces that `group`'s proposer sends the group's next entry as soon as the one it
    /// is appending now is durable and answered, for as long as it has proposals queued: the
    /// writer may then wait for that entry before its next sync, so that one sync carries
    /// every busy group (see the writer's `gather`). Undone by [`Wal::release`].
    pub fn expect_next(&self, group: u32) {
        let bit = writer::Groups::bit(group);
        let shared = &self.inner.shared;
        if shared.awaitable.load(Ordering::Relaxed) & bit == 0 {
            shared.awaitable.fetch_or(bit, Ordering::AcqRel);
        }
    }

    /// Whether the writer holds its next sync for `group`'s next entry (it does after a
    /// batch of several announced groups): that entry should then be sent without delay.
    pub fn awaits(&self, group: u32) -> bool {
        self.inner.shared.awaited.load(Ordering::Acquire) & writer::Groups::bit(group) != 0
    }

    /// `group`'s proposer has nothing queued: the writer does not wait for it.
    pub fn release(&self, group: u32) {
        let bit = writer::Groups::bit(group);
        let shared = &self.inner.shared;
        if shared.awaitable.load(Ordering::Relaxed) & bit != 0 {
            shared.awaitable.fetch_and(!bit, Ordering::AcqRel);
        }
        self.arrived(bit);
    }

    /// Releases whole segment files all of whose records have LSN < `lsn` (never the active
    /// segment): up to [`spare::MAX_SPARES`] are kept as spares to make later segments of, the
    /// others deleted. Returns bytes freed from the log.
    pub fn remove_segments_before(&self, lsn: Lsn) -> Result<u64, WalError> {
        let shared = &self.inner.shared;
        // Serializes removals so files always go oldest first, without holding `sealed` (which
        // the writer needs to rotate) across unlinks and directory syncs.
        let _removal = shared.removal.lock().unwrap_or_else(|e| e.into_inner());
        let mut doomed: VecDeque<SealedSegment> = {
            let mut sealed = shared.sealed();
            let n = sealed.iter().take_while(|s| s.end_lsn <= lsn).count();
            sealed.drain(..n).collect()
        };
        let mut freed = 0u64;
        while let Some(seg) = doomed.pop_front() {
            let keep = shared.fsync && shared.spares().len() < spare::MAX_SPARES;
            let released = match keep {
                true => {
                    let to = spare::spare_path(&seg.path);
                    shared.fs.rename(&seg.path, &to).map(|()| Some(to))
                }
                false => shared.fs.remove_file(&seg.path).map(|()| None),
            };
            let result = match released {
                Ok(Some(spare)) => {
                    shared.spares().push(spare);
                    Ok(())
                }
                Ok(None) => Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(e),
            };
            if let Err(e) = result {
                // Put back what is still on disk, in order, so a later call can retry.
                doomed.push_front(seg);
                let mut sealed = shared.sealed();
                while let Some(s) = doomed.pop_back() {
                    sealed.push_front(s);
                }
                return Err(e.into());
            }
            freed += seg.bytes;
            shared.disk_bytes.fetch_sub(seg.bytes, Ordering::SeqCst);
            // Make each deletion durable before the next one so a crash can never leave a
            // newer segment deleted but an older one present (an LSN gap on recovery).
            if shared.fsync
                && let Err(e) = shared.fs.sync_dir(&shared.dir)
            {
                let mut sealed = shared.sealed();
                while let Some(s) = doomed.pop_back() {
                    sealed.push_front(s);
                }
                return Err(e.into());
            }
        }
        Ok(freed)
    }

    /// Total bytes of segment files on disk (for metrics and tests).
    pub fn disk_bytes(&self) -> u64 {
        self.inner.shared.disk_bytes.load(Ordering::SeqCst)
    }

    /// Number of data syncs the writer has issued since open (counted even when
    /// `WalOptions::fsync` is false). With group commit this grows much more slowly than the
    /// number of appends under concurrency.
    pub fn sync_count(&self) -> u64 {
        self.inner.shared.sync_count.load(Ordering::SeqCst)
    }

    /// Segments made of spare segments since the WAL opened (`spare`).
    pub fn segments_reused(&self) -> u64 {
        self.inner.shared.reused.load(Ordering::Relaxed)
    }

    /// Number of segment files, including the active one.
    pub fn segment_count(&self) -> usize {
        self.inner.shared.sealed().len() + 1
    }

    /// What the storage is going through (faults, full disk), shared with the snapshot writers.
    pub fn health(&self) -> &Arc<StorageHealth> {
        &self.inner.shared.health
    }

    /// The filesystem this WAL writes through (snapshot files use it too).
    pub fn fs(&self) -> &Arc<dyn FileSystem> {
        &self.inner.shared.fs
    }

    /// Checks the free space of the WAL's filesystem: below the reserve, the disk counts as
    /// full ([`StorageHealth::disk_full`]) until space is free again. Blocking (one `statvfs`).
    pub fn check_space(&self) {
        let shared = &self.inner.shared;
        match shared.fs.available_bytes(&shared.dir) {
            Ok(avail) if avail < shared.reserve_bytes => {
                shared.health.set_low_space(Some(format!(
                    "{avail} bytes free, below the reserve of {} bytes",
                    shared.reserve_bytes
                )))
            }
            Ok(_) => shared.health.set_low_space(None),
            Err(e) => tracing::debug!(error = %e, "wal: could not read free space"),
        }
    }

    /// The directory this WAL lives in.
    pub fn dir(&self) -> &Path {
        &self.inner.shared.dir
    }

    /// Flushes and stops the writer thread; later appends fail with [`WalError::Closed`].
    ///
    /// Appends submitted before `close` are still committed. Blocks until the writer has
    /// exited (unless called from an append callback on the writer thread) and releases the
    /// directory lock. With [`WalOptions::deliver_on`], the last batches' callbacks may still
    /// be queued on the runtime when this returns.
    pub fn close(&self) {
        close_inner(&self.inner);
    }
}

/// Runs committed batches' completions, in commit order, on the runtime given in
/// `WalOptions::deliver_on`. Ends when the writer exits.
async fn deliver_batches(mut rx: tokio::sync::mpsc::UnboundedReceiver<CommittedBatch>) {
    while let Some(batch) = rx.recv().await {
        for (done, res) in batch {
            done.complete(res);
        }
    }
}

#[cfg(test)]
mod fault_tests;
#[cfg(test)]
mod spare_tests;
#[cfg(test)]
mod tests;
