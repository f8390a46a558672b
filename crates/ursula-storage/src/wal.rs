//! Segmented write-ahead log shared by every Raft group of a node, with group commit.
//!
//! See the crate documentation for the on-disk format and the recovery rules.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};

use crate::format::{
    MAX_PAYLOAD_LEN, SEGMENT_HEADER_LEN, decode_record, decode_segment_header, encode_record,
    encode_segment_header, encoded_len, find_valid_record_after,
};

/// Log sequence number. Assigned by the WAL, strictly increasing by one from 1, survives restart.
pub type Lsn = u64;

/// Initial capacity of the writer's batch buffer.
const INITIAL_BUF_CAPACITY: usize = 1 << 20;
/// The writer stops draining the queue once a batch holds this many bytes, and commits.
const MAX_BATCH_BYTES: usize = 16 << 20;
/// A batch buffer that grew beyond this (one huge record) is released after the commit.
const MAX_RETAINED_BUF_CAPACITY: usize = 32 << 20;
/// Name of the lock file that keeps two `Wal`s from opening the same directory.
const LOCK_FILE_NAME: &str = "LOCK";

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
}

impl Default for WalOptions {
    fn default() -> Self {
        WalOptions {
            segment_bytes: 64 << 20,
            fsync: true,
            deliver_on: None,
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
    /// appends. Close it and reopen (recovery truncates any partial write).
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
    sealed: Mutex<VecDeque<SealedSegment>>,
    /// Held for the whole of `remove_segments_before`.
    removal: Mutex<()>,
    disk_bytes: AtomicU64,
    sync_count: AtomicU64,
    closed: AtomicBool,
    /// Test hook: held by a test to stop the writer between receiving the first request of a
    /// batch and draining the rest, making group commit deterministic.
    #[cfg(test)]
    gate: Mutex<()>,
}

impl Shared {
    fn sealed(&self) -> MutexGuard<'_, VecDeque<SealedSegment>> {
        self.sealed.lock().unwrap_or_else(|e| e.into_inner())
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
        ensure_dir(dir, opts.fsync)?;
        let lock = lock_dir(dir)?;
        let Recovered {
            segments,
            records,
            next_lsn,
        } = recover(dir, opts.fsync)?;

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
            Some(seg) => {
                let file = OpenOptions::new().write(true).open(&seg.path)?;
                ActiveSegment {
                    file,
                    path: seg.path,
                    len: seg.bytes,
                }
            }
            None => {
                let seg = create_segment(dir, next_lsn, opts.fsync)?;
                disk_bytes += seg.len;
                seg
            }
        };
        tracing::info!(
            dir = %dir.display(),
            records = records.len(),
            next_lsn,
            segments = sealed.len() + 1,
            "wal opened"
        );

        if opts.fsync {
            preallocate_active(&active, opts.segment_bytes)?;
        }
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            fsync: opts.fsync,
            sealed: Mutex::new(sealed),
            removal: Mutex::new(()),
            disk_bytes: AtomicU64::new(disk_bytes),
            sync_count: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            #[cfg(test)]
            gate: Mutex::new(()),
        });
        let (tx, rx) = mpsc::channel();
        let deliver = opts.deliver_on.as_ref().map(|rt| {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            rt.spawn(deliver_batches(rx));
            tx
        });
        let writer = Writer {
            shared: Arc::clone(&shared),
            rx,
            segment_bytes: opts.segment_bytes,
            active,
            next_lsn,
            buf: Vec::with_capacity(INITIAL_BUF_CAPACITY),
            pending: Vec::with_capacity(256),
            deliver,
            poisoned: None,
            next_segment: None,
            _lock: lock,
        };
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
        // On failure the message comes back and is dropped, which completes it with `Closed`.
        let _ = self.inner.tx.send(Msg::Append { records, done });
    }

    /// Deletes whole segment files all of whose records have LSN < `lsn` (never the active
    /// segment). Returns bytes freed.
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
            let result = match fs::remove_file(&seg.path) {
                Ok(()) => Ok(()),
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
                && let Err(e) = sync_dir(&shared.dir)
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

    /// Number of segment files, including the active one.
    pub fn segment_count(&self) -> usize {
        self.inner.shared.sealed().len() + 1
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

// ---------------------------------------------------------------------------------------------
// Writer thread
// ---------------------------------------------------------------------------------------------

struct ActiveSegment {
    file: File,
    path: PathBuf,
    len: u64,
}

struct Writer {
    shared: Arc<Shared>,
    rx: Receiver<Msg>,
    segment_bytes: u64,
    active: ActiveSegment,
    /// LSN the next encoded record gets.
    next_lsn: Lsn,
    /// Encoded records not yet written to `active`.
    buf: Vec<u8>,
    /// Requests of the current batch with the LSN of their last record.
    pending: Vec<(Completion, Lsn)>,
    /// Committed batches go here when completions run on a runtime (`WalOptions::deliver_on`).
    deliver: Option<tokio::sync::mpsc::UnboundedSender<CommittedBatch>>,
    poisoned: Option<String>,
    /// A zero-filled file being prepared for the next segment (see `prepare_segment`).
    next_segment: Option<JoinHandle<io::Result<PathBuf>>>,
    /// Holds the directory lock for as long as the writer runs.
    _lock: File,
}

impl Writer {
    fn run(mut self) {
        self.prepare_next();
        loop {
            let Ok(first) = self.rx.recv() else {
                break; // every handle dropped
            };
            #[cfg(test)]
            let gate = Arc::clone(&self.shared);
            #[cfg(test)]
            let _gate = gate.gate.lock().unwrap_or_else(|e| e.into_inner());

            // Let the threads that feed us (on a busy core: the ones we just preempted) queue
            // what they have ready, so that one sync commits all of it.
            thread::yield_now();
            let mut closing = self.handle(first);
            while !closing && self.buf.len() < MAX_BATCH_BYTES {
                match self.rx.try_recv() {
                    Ok(msg) => closing = self.handle(msg),
                    Err(_) => break,
                }
            }
            self.commit();
            if closing {
                break;
            }
        }
        self.shared.closed.store(true, Ordering::SeqCst);
        // Requests still queued are dropped with the receiver and complete with `Closed`.
    }

    /// Encodes one request into the batch. Returns true on `Close`.
    fn handle(&mut self, msg: Msg) -> bool {
        let (records, done) = match msg {
            Msg::Close => return true,
            Msg::Append { records, done } => (records, done),
        };
        if let Some(reason) = &self.poisoned {
            done.complete(Err(WalError::Poisoned(reason.clone())));
            return false;
        }
        if records.is_empty() {
            self.pending.push((done, self.next_lsn.saturating_sub(1)));
            return false;
        }
        if self.next_lsn.checked_add(records.len() as u64).is_none() {
            done.complete(Err(WalError::Poisoned("LSN space exhausted".into())));
            return false;
        }
        let bytes: u64 = records
            .iter()
            .map(|r| encoded_len(r.payload.len()) as u64)
            .sum();
        let used = self.active.len + self.buf.len() as u64;
        if used > SEGMENT_HEADER_LEN as u64
            && used.saturating_add(bytes) > self.segment_bytes
            && let Err(e) = self.rotate()
        {
            self.pending.push((done, 0));
            self.fail(&e);
            return false;
        }
        self.buf.reserve(bytes as usize);
        for r in &records {
            encode_record(&mut self.buf, self.next_lsn, r.group, r.kind, &r.payload);
            self.next_lsn += 1;
        }
        self.pending.push((done, self.next_lsn - 1));
        false
    }

    /// Writes the buffered records to the active segment with one write and syncs it.
    fn flush(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let res = self.active.file.write_all_at(&self.buf, self.active.len);
        let written = self.buf.len() as u64;
        self.buf.clear();
        res?;
        self.active.len += written;
        self.shared.disk_bytes.fetch_add(written, Ordering::SeqCst);
        if self.shared.fsync {
            self.active.file.sync_data()?;
        }
        self.shared.sync_count.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// Seals the active segment (flushing what is buffered for it) and starts a new one whose
    /// first record is `next_lsn`.
    fn rotate(&mut self) -> io::Result<()> {
        self.flush()?;
        let ready = match self.next_segment.take() {
            Some(h) if h.is_finished() => h.join().ok().and_then(Result::ok),
            Some(h) => {
                self.next_segment = Some(h);
                None
            }
            None => None,
        };
        let new = match ready {
            Some(prepared) => adopt_segment(
                &self.shared.dir,
                &prepared,
                self.next_lsn,
                self.shared.fsync,
            )?,
            None => {
                let seg = create_segment(&self.shared.dir, self.next_lsn, self.shared.fsync)?;
                if self.shared.fsync {
                    preallocate_active(&seg, self.segment_bytes)?;
                }
                seg
            }
        };
        self.prepare_next();
        self.shared.disk_bytes.fetch_add(new.len, Ordering::SeqCst);
        let old = std::mem::replace(&mut self.active, new);
        // Give back the preallocated space the sealed segment did not use.
        if let Err(e) = old.file.set_len(old.len) {
            tracing::warn!(error = %e, path = %old.path.display(), "wal: could not trim a sealed segment");
        }
        self.shared.sealed().push_back(SealedSegment {
            end_lsn: self.next_lsn,
            path: old.path,
            bytes: old.len,
        });
        Ok(())
    }

    /// Starts zero-filling the next segment in the background, so that rotating to it is a
    /// rename and every later `fdatasync` only has data to flush: writing inside an allocated,
    /// already-written file changes no metadata, which halves the IOs per sync on ext4.
    fn prepare_next(&mut self) {
        if !self.shared.fsync || self.next_segment.is_some() {
            return;
        }
        let path = self.shared.dir.join(PREPARED_SEGMENT_NAME);
        let len = self.segment_bytes;
        self.next_segment = thread::Builder::new()
            .name("ursula-wal-prep".into())
            .spawn(move || prepare_segment(&path, len).map(|()| path))
            .ok();
    }

    /// Makes the batch durable and completes every request in it.
    fn commit(&mut self) {
        if self.poisoned.is_none()
            && let Err(e) = self.flush()
        {
            self.fail(&e);
        }
        if self.poisoned.is_some() {
            self.buf.clear();
        }
        let empty = self.pending.is_empty();
        let poisoned = &self.poisoned;
        let results = self.pending.drain(..).map(|(done, lsn)| {
            let res = match poisoned {
                Some(reason) => Err(WalError::Poisoned(reason.clone())),
                None => Ok(lsn),
            };
            (done, res)
        });
        match &self.deliver {
            Some(tx) if !empty => {
                if let Err(returned) = tx.send(results.collect()) {
                    // The runtime is gone: complete here, with the true results, from now on.
                    self.deliver = None;
                    for (done, res) in returned.0 {
                        done.complete(res);
                    }
                }
            }
            Some(_) => {} // nothing to hand over: don't wake the runtime
            None => results.for_each(|(done, res)| done.complete(res)),
        }
        if self.buf.capacity() > MAX_RETAINED_BUF_CAPACITY {
            self.buf = Vec::with_capacity(INITIAL_BUF_CAPACITY);
        }
    }

    fn fail(&mut self, e: &io::Error) {
        tracing::error!(error = %e, path = %self.active.path.display(), "wal write failed; refusing further appends");
        self.poisoned = Some(format!("{}: {e}", self.active.path.display()));
        self.buf.clear();
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

// ---------------------------------------------------------------------------------------------
// Files and recovery
// ---------------------------------------------------------------------------------------------

fn segment_file_name(first_lsn: Lsn) -> String {
    format!("wal-{first_lsn:020}.log")
}

fn parse_segment_file_name(name: &str) -> Option<Lsn> {
    let digits = name.strip_prefix("wal-")?.strip_suffix(".log")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn ensure_dir(dir: &Path, fsync: bool) -> io::Result<()> {
    match fs::metadata(dir) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::create_dir_all(dir)?;
            if fsync
                && let Some(parent) = dir.parent()
                && !parent.as_os_str().is_empty()
            {
                sync_dir(parent)?;
            }
            Ok(())
        }
        Err(e) => Err(e),
    }
}

fn lock_dir(dir: &Path) -> Result<File, WalError> {
    let path = dir.join(LOCK_FILE_NAME);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(fs::TryLockError::WouldBlock) => Err(WalError::Locked(dir.to_path_buf())),
        Err(fs::TryLockError::Error(e)) => Err(e.into()),
    }
}

/// Name of the zero-filled file prepared for the next segment.
const PREPARED_SEGMENT_NAME: &str = "wal-next.prepared";

/// Writes `len` zero bytes to `path` and syncs it. Runs beside live appends, so it syncs every
/// megabyte: tens of megabytes of dirty pages would make the WAL's next `fdatasync` (and every
/// acknowledgement waiting on it) wait for their writeback.
fn prepare_segment(path: &Path, len: u64) -> io::Result<()> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(path)?;
    zero_fill(&file, 0, len, true)?;
    file.sync_all()
}

/// Writes zeros over `[from, to)` of `file`, 1 MiB at a time; with `sync_each`, syncs the data
/// after every megabyte.
fn zero_fill(file: &File, from: u64, to: u64, sync_each: bool) -> io::Result<()> {
    let chunk = vec![0u8; 1 << 20];
    let mut at = from;
    while at < to {
        let n = chunk
            .len()
            .min(usize::try_from(to - at).unwrap_or(chunk.len()));
        file.write_all_at(&chunk[..n], at)?;
        at += n as u64;
        if sync_each {
            file.sync_data()?;
        }
    }
    Ok(())
}

/// Preallocates the rest of the active segment with zeros (durably), so appends overwrite
/// allocated blocks instead of growing the file.
fn preallocate_active(seg: &ActiveSegment, segment_bytes: u64) -> io::Result<()> {
    let file_len = seg.file.metadata()?.len();
    if file_len < segment_bytes {
        zero_fill(&seg.file, file_len.max(seg.len), segment_bytes, false)?;
        seg.file.sync_all()?;
    }
    Ok(())
}

/// Turns a prepared zero-filled file into the segment starting at `first_lsn`. A crash
/// before the header is durable leaves an all-zero segment, which recovery treats as torn
/// during creation; zeros after the last record are an unwritten tail, not corruption.
fn adopt_segment(
    dir: &Path,
    prepared: &Path,
    first_lsn: Lsn,
    fsync: bool,
) -> io::Result<ActiveSegment> {
    let path = dir.join(segment_file_name(first_lsn));
    fs::rename(prepared, &path)?;
    let file = OpenOptions::new().write(true).open(&path)?;
    file.write_all_at(&encode_segment_header(first_lsn), 0)?;
    if fsync {
        file.sync_data()?;
        sync_dir(dir)?;
    }
    Ok(ActiveSegment {
        file,
        path,
        len: SEGMENT_HEADER_LEN as u64,
    })
}

/// Creates a new segment file with its header, durably (file and directory entry).
fn create_segment(dir: &Path, first_lsn: Lsn, fsync: bool) -> io::Result<ActiveSegment> {
    let path = dir.join(segment_file_name(first_lsn));
    let mut file = OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(&path)?;
    file.write_all(&encode_segment_header(first_lsn))?;
    if fsync {
        file.sync_all()?;
        sync_dir(dir)?;
    }
    Ok(ActiveSegment {
        file,
        path,
        len: SEGMENT_HEADER_LEN as u64,
    })
}

struct SegmentMeta {
    first_lsn: Lsn,
    path: PathBuf,
    bytes: u64,
}

struct Recovered {
    segments: Vec<SegmentMeta>,
    records: Vec<(Lsn, WalRecord)>,
    next_lsn: Lsn,
}

fn list_segments(dir: &Path) -> io::Result<Vec<(Lsn, PathBuf)>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if let Some(lsn) = name.to_str().and_then(parse_segment_file_name) {
            out.push((lsn, entry.path()));
        }
    }
    out.sort_unstable_by_key(|(lsn, _)| *lsn);
    Ok(out)
}

fn corrupt(file: &Path, offset: usize, reason: impl Into<String>) -> WalError {
    WalError::Corrupt {
        file: file.to_path_buf(),
        offset: offset as u64,
        reason: reason.into(),
    }
}

/// Reads every segment in order, validating headers, checksums and LSN continuity, and
/// truncates a torn tail of the last segment.
fn recover(dir: &Path, fsync: bool) -> Result<Recovered, WalError> {
    let files = list_segments(dir)?;
    let count = files.len();
    let mut segments = Vec::with_capacity(count);
    let mut records = Vec::new();
    // LSN the next record must have; `None` until the first segment fixes it.
    let mut expected: Option<Lsn> = None;

    for (index, (name_lsn, path)) in files.into_iter().enumerate() {
        let is_last = index + 1 == count;
        if name_lsn == 0 {
            return Err(corrupt(&path, 0, "segment file name has first LSN 0"));
        }
        if let Some(exp) = expected
            && name_lsn != exp
        {
            return Err(corrupt(
                &path,
                0,
                format!("LSN gap: segment starts at LSN {name_lsn}, expected {exp}"),
            ));
        }
        let data = fs::read(&path)?;

        if is_last && is_torn_creation(&data) {
            // Crashed while creating this segment: its header never became durable, so no
            // record in it was ever acknowledged. Rewrite the header.
            tracing::warn!(path = %path.display(), len = data.len(), "wal: rewriting header of a segment torn during creation");
            let mut file = OpenOptions::new().write(true).truncate(true).open(&path)?;
            file.write_all(&encode_segment_header(name_lsn))?;
            if fsync {
                file.sync_all()?;
            }
            segments.push(SegmentMeta {
                first_lsn: name_lsn,
                path,
                bytes: SEGMENT_HEADER_LEN as u64,
            });
            expected = Some(name_lsn);
            break;
        }

        let first_lsn =
            decode_segment_header(&data).map_err(|e| corrupt(&path, 0, e.to_string()))?;
        if first_lsn != name_lsn {
            return Err(corrupt(
                &path,
                0,
                format!("header first LSN {first_lsn} does not match the file name"),
            ));
        }

        let mut lsn = first_lsn;
        let mut off = SEGMENT_HEADER_LEN;
        let mut end = data.len();
        while off < data.len() {
            match decode_record(&data, off) {
                Ok(rec) => {
                    if rec.lsn != lsn {
                        return Err(corrupt(
                            &path,
                            off,
                            format!("expected LSN {lsn}, found LSN {}", rec.lsn),
                        ));
                    }
                    records.push((
                        lsn,
                        WalRecord {
                            group: rec.group,
                            kind: rec.kind,
                            payload: rec.payload.to_vec(),
                        },
                    ));
                    lsn = lsn
                        .checked_add(1)
                        .ok_or_else(|| corrupt(&path, off, "LSN overflows u64"))?;
                    off += rec.frame_len;
                }
                Err(e) => {
                    if data[off..].iter().all(|b| *b == 0) {
                        // The unwritten part of a preallocated segment. For a sealed segment
                        // the next segment's first LSN proves nothing is missing.
                        end = off;
                        break;
                    }
                    if !is_last {
                        return Err(corrupt(&path, off, format!("{e} in a sealed segment")));
                    }
                    if let Some(next) = find_valid_record_after(&data, off, lsn) {
                        return Err(corrupt(
                            &path,
                            off,
                            format!("{e}, followed by a valid record at offset {next}"),
                        ));
                    }
                    tracing::warn!(
                        path = %path.display(),
                        offset = off,
                        dropped_bytes = data.len() - off,
                        reason = %e,
                        "wal: truncating torn tail"
                    );
                    let file = OpenOptions::new().write(true).open(&path)?;
                    file.set_len(off as u64)?;
                    if fsync {
                        file.sync_all()?;
                    }
                    end = off;
                    break;
                }
            }
        }
        segments.push(SegmentMeta {
            first_lsn,
            path,
            bytes: end as u64,
        });
        expected = Some(lsn);
    }

    Ok(Recovered {
        segments,
        records,
        next_lsn: expected.unwrap_or(1),
    })
}

/// A last segment whose header is missing, partial or still all zeros.
fn is_torn_creation(data: &[u8]) -> bool {
    data.len() < SEGMENT_HEADER_LEN || data.iter().all(|&b| b == 0)
}

#[cfg(test)]
mod tests;
