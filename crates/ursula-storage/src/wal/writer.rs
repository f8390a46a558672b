//! The WAL's writer thread: group commit, rotation, and the storage-fault policies.
//!
//! * A failed **sync** (or a write that fails with anything but a full disk) poisons the WAL:
//!   the batch it covered completes with [`WalError::SyncFailed`] (its outcome is unknown: the
//!   bytes may or may not be on disk), every later append with [`WalError::Poisoned`], and
//!   [`StorageHealth::failed`] is set. The writer never retries a failed sync: after a failed
//!   `fsync` the kernel may have dropped the dirty pages, so a retry that succeeds proves
//!   nothing. The node fails stop and recovery re-reads the disk.
//! * A write, allocation or file creation that fails because the **disk is full** holds the
//!   batch and retries it (the same bytes at the same offset) with backoff until it succeeds,
//!   with [`StorageHealth::disk_full`] set meanwhile so that the node refuses new writes with
//!   `507` before they reach the log. The prepared next segment is deleted on the first
//!   failure, to give its space back.

use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::thread;
use std::time::{Duration, Instant};

use super::prepare::Next;
use super::segment::{
    ActiveSegment, PREPARED_SEGMENT_NAME, adopt_segment, create_segment, has_room,
    preallocate_active,
};
use super::{CommittedBatch, Completion, Lsn, Msg, SealedSegment, Shared, WalError, WalRecord};
use crate::format::{
    BATCH_HEADER_LEN, SEGMENT_HEADER_LEN, encode_record, encoded_len, finish_batch_header,
};
use crate::fs::is_no_space;

/// Initial capacity of the writer's batch buffer.
pub(super) const INITIAL_BUF_CAPACITY: usize = 1 << 20;
/// The writer stops draining the queue once a batch holds this many bytes, and commits.
const MAX_BATCH_BYTES: usize = 16 << 20;
/// A batch buffer that grew beyond this (one huge record) is released after the commit.
const MAX_RETAINED_BUF_CAPACITY: usize = 32 << 20;
/// First and longest pause between retries of a write that found the disk full.
const NO_SPACE_FIRST_RETRY: Duration = Duration::from_millis(20);
const NO_SPACE_MAX_RETRY: Duration = Duration::from_millis(500);

/// The longest the writer waits after a commit for the next entries of that batch's groups
/// (see [`Writer::gather`]). Long enough for a saturated worker to answer four groups' batches
/// of 64 appends (measured: 500 µs cut appends at 1,000 streams × 256 connections by a sixth,
/// 2 and 5 ms were level); a group with nothing queued is not waited for at all.
pub(super) const AWAIT_GROUPS: Duration = Duration::from_millis(2);

/// A batch larger than this is followed by a yield, not a wait for its groups: it carried
/// many requests per group, so the worker is saturated and the next batch gathers anyway
/// (measured at 1,000 streams × 256 connections: waiting cost 15 % more CPU per append).
const AWAIT_BELOW_BYTES: usize = 32 << 10;

/// A failed storage operation, and whether it was a sync (which is never retried).
#[derive(Debug)]
pub(super) struct Failure {
    err: io::Error,
    sync: bool,
}

impl Failure {
    fn write(err: io::Error) -> Self {
        Failure { err, sync: false }
    }
    fn sync(err: io::Error) -> Self {
        Failure { err, sync: true }
    }
    fn no_space(&self) -> bool {
        !self.sync && is_no_space(&self.err)
    }
}

impl From<io::Error> for Failure {
    fn from(err: io::Error) -> Self {
        Failure::write(err)
    }
}

/// The Raft groups that wrote to a batch, as bits `group % 64` (two groups 64 apart count
/// as one: the set only decides how the writer gathers its next batch).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Groups(u64);

impl Groups {
    pub(super) fn bit(group: u32) -> u64 {
        1 << (group % 64)
    }
    fn with(self, group: u32) -> Groups {
        Groups(self.0 | Self::bit(group))
    }
    fn one(self) -> bool {
        self.0.count_ones() == 1
    }
    fn several(self) -> bool {
        self.0.count_ones() > 1
    }
}

pub(super) struct Writer {
    pub shared: Arc<Shared>,
    pub rx: Receiver<Msg>,
    pub segment_bytes: u64,
    pub reserve_bytes: u64,
    pub active: ActiveSegment,
    /// LSN the next encoded record gets.
    pub next_lsn: Lsn,
    /// Encoded records not yet written to `active` (in a batched segment, after a reserved
    /// batch header).
    pub buf: Vec<u8>,
    /// Records in `buf`, the LSN of the first, and the running checksum of their prefixes.
    pub batch_count: u32,
    pub batch_first_lsn: Lsn,
    pub batch_crc: u32,
    /// Requests of the current batch with the LSN of their last record.
    pub pending: Vec<(Completion, Lsn)>,
    /// Committed batches go here when completions run on a runtime (`WalOptions::deliver_on`).
    pub deliver: Option<tokio::sync::mpsc::UnboundedSender<CommittedBatch>>,
    pub poisoned: Option<String>,
    /// Set when the current batch failed fatally: its requests complete with `SyncFailed`.
    pub batch_failed: Option<String>,
    /// The file the next segment is made of: a spare being readied or a zero-filled file
    /// (`prepare`).
    pub next_segment: Option<Next>,
    /// The groups that wrote to the current batch.
    pub groups: Groups,
    /// Holds the directory lock for as long as the writer runs.
    pub _lock: std::fs::File,
}

impl Writer {
    pub(super) fn run(mut self) {
        let _ = self.shared.writer_thread.set(thread::current());
        self.prepare_next();
        // The groups that wrote to the batch just committed, and when it was (see `gather`).
        let mut last = Groups::default();
        let mut awaited = 0u64;
        let mut committed = Instant::now();
        loop {
            let Ok(first) = self.rx.recv() else {
                break; // every handle dropped
            };
            #[cfg(test)]
            let gate = Arc::clone(&self.shared);
            #[cfg(test)]
            let _gate = gate.gate.lock().unwrap_or_else(|e| e.into_inner());

            self.groups = Groups::default();
            let closing = self.handle(first) || self.gather(last, awaited, committed);
            last = self.groups;
            // Before the sync: a group of this batch may send its next request during it.
            awaited = if last.several() && self.buf.len() <= AWAIT_BELOW_BYTES {
                last.0 & self.shared.awaitable.load(Ordering::Acquire)
            } else {
                0
            };
            self.shared.awaited.store(awaited, Ordering::Release);
            self.commit();
            committed = Instant::now();
            if closing {
                break;
            }
        }
        // A closed WAL touches no file any more: a WAL opened next on the same directory
        // (in this process) must not race a preparation of ours on `wal-next.prepared`.
        if let Some(next) = self.next_segment.take() {
            next.wait();
        }
        self.shared.closed.store(true, Ordering::SeqCst);
        // Requests still queued are dropped with the receiver and complete with `Closed`.
    }

    /// Adds what is queued to the batch, after waiting for the groups of the last batch that
    /// announced a next entry (`awaited`). Returns true on `Close`.
    ///
    /// Group commit on a busy core: when a sync ends, the Raft groups whose entries it carried
    /// are answered and each sends its next entry (gathered meanwhile) soon after, one after
    /// the other on the same worker. When the last batch had several groups, the writer waits
    /// for those whose proposer announced a next entry ([`super::Wal::expect_next`]; a
    /// proposer with nothing queued withdraws with [`super::Wal::release`]) until each has
    /// sent it, woken by the last, for at most [`AWAIT_GROUPS`] after the commit. One sync then
    /// carries every busy group, and it runs while the worker writes the answers: measured at
    /// 100 streams × 32 connections (four groups), a quarter more appends/s than yielding the
    /// core until the worker is idle, which made the sync wait for every HTTP answer too.
    /// Without announced groups (a cluster: their answers wait for a quorum), or after a
    /// batch over [`AWAIT_BELOW_BYTES`], it still yields after a batch of several groups (a
    /// writer that synced the first at once would leave the others for the next sync: a third
    /// more CPU per append). After a batch of one group,
    /// what it sends is all there is, and the writer syncs at once. A first request with no
    /// records or several groups' records lets the runtime run first.
    fn gather(&mut self, last: Groups, awaited: u64, committed: Instant) -> bool {
        if awaited != 0 {
            let bound = self.shared.await_groups_us.load(Ordering::Relaxed);
            let deadline = committed + Duration::from_micros(bound);
            loop {
                let done =
                    self.shared.awaited.load(Ordering::Acquire) == 0 || Instant::now() >= deadline;
                if self.drain() {
                    return true;
                }
                if done {
                    break;
                }
                thread::park_timeout(deadline.saturating_duration_since(Instant::now()));
            }
            self.shared.awaited.store(0, Ordering::Release);
            return false;
        }
        if last.several() || !self.groups.one() {
            thread::yield_now();
        }
        self.drain()
    }

    /// Adds what is queued to the batch, up to [`MAX_BATCH_BYTES`]. Returns true on `Close`.
    fn drain(&mut self) -> bool {
        while self.buf.len() < MAX_BATCH_BYTES {
            match self.rx.try_recv() {
                Ok(msg) => {
                    if self.handle(msg) {
                        return true;
                    }
                }
                Err(_) => return false,
            }
        }
        false
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
            .sum::<u64>()
            + BATCH_HEADER_LEN as u64;
        let used = self.active.len + self.buf.len() as u64;
        if used > SEGMENT_HEADER_LEN as u64
            && used.saturating_add(bytes) > self.segment_bytes
            && let Err(f) = self.retry_no_space(Self::rotate)
        {
            self.pending.push((done, 0));
            self.fail(&f);
            return false;
        }
        for r in &records {
            self.groups = self.groups.with(r.group);
        }
        self.encode(&records, bytes as usize);
        self.pending.push((done, self.next_lsn - 1));
        false
    }

    /// Appends `records` (`bytes` long, with room for a batch header) to the batch.
    fn encode(&mut self, records: &[WalRecord], bytes: usize) {
        if self.batch_count == 0 {
            self.buf.clear();
            if self.active.batched {
                self.buf.resize(BATCH_HEADER_LEN, 0);
            }
            self.batch_first_lsn = self.next_lsn;
            self.batch_crc = 0;
        }
        self.buf.reserve(bytes);
        for r in records {
            let prefix = encode_record(&mut self.buf, self.next_lsn, r.group, r.kind, &r.payload);
            self.batch_crc = crc32c::crc32c_append(self.batch_crc, &prefix);
            self.next_lsn += 1;
            self.batch_count += 1;
        }
    }

    /// Runs `op` until it does not fail for lack of space: a full disk holds the writer (and
    /// the batch) instead of failing it. Gives up only when the WAL is being closed.
    fn retry_no_space(
        &mut self,
        op: impl Fn(&mut Self) -> Result<(), Failure>,
    ) -> Result<(), Failure> {
        let mut delay = NO_SPACE_FIRST_RETRY;
        let mut stalled = false;
        loop {
            match op(self) {
                Err(f) if f.no_space() && !self.shared.closed.load(Ordering::SeqCst) => {
                    if !stalled {
                        stalled = true;
                        tracing::warn!(error = %f.err, path = %self.active.path.display(), "wal: disk full; holding the batch and retrying until space is free");
                        self.shared.health.set_stalled(true);
                        self.discard_prepared();
                    }
                    thread::sleep(delay);
                    delay = (delay * 2).min(NO_SPACE_MAX_RETRY);
                }
                res => {
                    if stalled {
                        self.shared.health.set_stalled(false);
                        if res.is_ok() {
                            tracing::info!("wal: space is free again; writes resume");
                        }
                    }
                    return res;
                }
            }
        }
    }

    /// Writes the buffered batch to the active segment with one write and syncs it. A failed
    /// write keeps the batch (a retry writes the same bytes at the same offset); after a
    /// successful write the batch is gone and a failed sync is final.
    fn flush(&mut self) -> Result<(), Failure> {
        if self.batch_count == 0 {
            self.buf.clear();
            return Ok(());
        }
        if self.active.batched {
            finish_batch_header(
                &mut self.buf,
                0,
                self.batch_first_lsn,
                self.batch_count,
                self.batch_crc,
            );
        }
        self.active
            .file
            .write_all_at(&self.buf, self.active.len)
            .map_err(Failure::write)?;
        let written = self.buf.len() as u64;
        self.buf.clear();
        self.batch_count = 0;
        self.active.len += written;
        self.shared.disk_bytes.fetch_add(written, Ordering::SeqCst);
        self.shared
            .written_bytes
            .fetch_add(written, Ordering::Relaxed);
        if self.shared.fsync {
            self.active.file.sync_data().map_err(Failure::sync)?;
        }
        self.shared.sync_count.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// Seals the active segment (flushing what is buffered for it) and starts a new one whose
    /// first record is `next_lsn`. Safe to repeat after a failure.
    fn rotate(&mut self) -> Result<(), Failure> {
        self.flush()?;
        let fs = Arc::clone(&self.shared.fs);
        let dir = self.shared.dir.clone();
        // A fill still running is told to go flat out: finishing it costs less than filling a
        // fresh segment here.
        self.shared.hurry_prepare.store(true, Ordering::Release);
        let ready = self.next_segment.take().and_then(Next::wait);
        if ready.as_deref().is_some_and(super::spare::is_spare) {
            self.shared.reused.fetch_add(1, Ordering::Relaxed);
        }
        let new = match ready {
            Some(prepared) => adopt_segment(
                fs.as_ref(),
                &dir,
                &prepared,
                self.next_lsn,
                self.shared.fsync,
            )?,
            None => {
                let seg = create_segment(fs.as_ref(), &dir, self.next_lsn, self.shared.fsync)?;
                if self.shared.fsync {
                    preallocate_active(
                        fs.as_ref(),
                        &dir,
                        &seg,
                        self.segment_bytes,
                        self.reserve_bytes,
                    )?;
                }
                seg
            }
        };
        self.shared.disk_bytes.fetch_add(new.len, Ordering::SeqCst);
        let old = std::mem::replace(&mut self.active, new);
        self.prepare_next();
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

    /// Makes the next segment before the WAL serves, flat out, when there is no spare to make
    /// it of: filled beside the live WAL, even paced, each piece of the fill stalls the syncs
    /// of the node's first segment of appends (docs/benchmarks.md, session 31). A WAL that has
    /// run long enough to release segments has spares and skips this. On failure (or when the
    /// fill would take the space kept in reserve) the next segment is left to `prepare_next`.
    pub(super) fn prepare_before_serving(&mut self) {
        if super::spare::any(&self.shared) || !self.may_prepare() {
            return;
        }
        let path = self.shared.dir.join(PREPARED_SEGMENT_NAME);
        match super::prepare::now(self.shared.fs.as_ref(), path, self.segment_bytes) {
            Ok(path) => self.next_segment = Some(Next::Ready(path)),
            Err(e) => {
                tracing::warn!(error = %e, "wal: could not prepare the next segment; it is prepared in the background")
            }
        }
    }

    /// Starts preparing the next segment in the background, so that rotating to it is a
    /// rename and every later `fdatasync` only has data to flush: writing inside an allocated,
    /// already-written file changes no metadata, which halves the IOs per sync on ext4. A
    /// spare segment (`spare`) is such a file already; else one is zero-filled at a pace
    /// that keeps out of the WAL's way (`prepare`). A fill is skipped when it would take the
    /// space kept in reserve: preallocation never takes the last free space.
    fn prepare_next(&mut self) {
        if !self.may_prepare() {
            return;
        }
        let len = self.segment_bytes;
        let path = self.shared.dir.join(PREPARED_SEGMENT_NAME);
        let room = self.segment_bytes.saturating_sub(self.active.len);
        self.next_segment = super::prepare::spawn(&self.shared, path, len, room).ok();
    }

    /// Whether to prepare a next segment now: syncing is on, none is under way, and there is
    /// a spare to make it of or room to fill one beside the space kept in reserve.
    fn may_prepare(&self) -> bool {
        if !self.shared.fsync || self.next_segment.is_some() {
            return false;
        }
        let room = super::spare::any(&self.shared)
            || has_room(
                self.shared.fs.as_ref(),
                &self.shared.dir,
                self.segment_bytes,
                self.reserve_bytes,
            );
        if !room {
            tracing::info!("wal: not preparing the next segment: free space is low");
        }
        room
    }

    /// Deletes the spare segments and the prepared next segment (if it is ready) to give
    /// their space back to a full disk.
    fn discard_prepared(&mut self) {
        super::spare::discard_all(&self.shared);
        match self.next_segment.take() {
            Some(next) if next.is_finished() => {
                if let Some(path) = next.wait() {
                    match self.shared.fs.remove_file(&path) {
                        Ok(()) => {
                            tracing::info!("wal: deleted the prepared next segment to free space")
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "wal: could not delete the prepared next segment")
                        }
                    }
                }
            }
            other => self.next_segment = other,
        }
    }

    /// Makes the batch durable and completes every request in it.
    fn commit(&mut self) {
        if self.poisoned.is_none()
            && let Err(f) = self.retry_no_space(Self::flush)
        {
            self.fail(&f);
        }
        if self.poisoned.is_some() {
            self.buf.clear();
            self.batch_count = 0;
        }
        let empty = self.pending.is_empty();
        let failed = self.batch_failed.take();
        let results = self.pending.drain(..).map(|(done, lsn)| {
            let res = match &failed {
                Some(reason) => Err(WalError::SyncFailed(reason.clone())),
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

    /// The WAL failed for good: refuse every later append and tell the node (fail-stop).
    fn fail(&mut self, f: &Failure) {
        let what = if f.sync { "sync" } else { "write" };
        let reason = format!("{what} of {} failed: {}", self.active.path.display(), f.err);
        tracing::error!(error = %f.err, path = %self.active.path.display(), "wal {what} failed; refusing further appends");
        self.shared.health.set_failed(reason.clone(), f.sync);
        self.poisoned = Some(reason.clone());
        self.batch_failed = Some(reason);
        self.buf.clear();
        self.batch_count = 0;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

    use super::super::{Wal, WalOptions, WalRecord};
    use super::Groups;
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};

    fn record(group: u32) -> WalRecord {
        WalRecord {
            group,
            kind: 0,
            payload: vec![group as u8; 8],
        }
    }

    /// A WAL whose writer waits up to a minute for announced groups.
    fn patient_wal(dir: &std::path::Path) -> Wal {
        let opts = WalOptions {
            fsync: false,
            ..Default::default()
        };
        let (wal, _) = Wal::open(dir, opts).unwrap();
        wal.inner
            .shared
            .await_groups_us
            .store(60_000_000, Ordering::Relaxed);
        wal
    }

    /// A patient WAL in which groups 1 and 2 announced their next entries and wrote one
    /// batch together.
    async fn after_a_batch_of_groups_1_and_2(dir: &std::path::Path) -> Wal {
        let wal = patient_wal(dir);
        wal.expect_next(1);
        wal.expect_next(2);
        wal.append(vec![record(1), record(2)]).await.unwrap();
        wal
    }

    #[tokio::test]
    async fn one_sync_carries_every_announced_group_of_the_last_batch() {
        let dir = tempfile::tempdir().unwrap();
        let wal = after_a_batch_of_groups_1_and_2(dir.path()).await;
        let before = wal.sync_count();
        // Group 1's next entry waits for group 2's, however late it comes.
        let first = tokio::spawn({
            let wal = wal.clone();
            async move { wal.append(vec![record(1)]).await }
        });
        tokio::task::yield_now().await;
        wal.append(vec![record(2)]).await.unwrap();
        first.await.unwrap().unwrap();
        assert_eq!(wal.sync_count() - before, 1);
    }

    #[tokio::test]
    async fn a_released_or_silent_group_is_not_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let wal = after_a_batch_of_groups_1_and_2(dir.path()).await;
        // Released after its batch: group 1's next entry syncs without group 2.
        wal.release(2);
        let started = Instant::now();
        tokio::time::timeout(Duration::from_secs(20), wal.append(vec![record(1)]))
            .await
            .expect("waited for a released group")
            .unwrap();
        // Never announced: group 3 is not waited for either.
        wal.append(vec![record(1), record(3)]).await.unwrap();
        tokio::time::timeout(Duration::from_secs(20), wal.append(vec![record(1)]))
            .await
            .expect("waited for a group that never announced a next entry")
            .unwrap();
        assert!(started.elapsed() < Duration::from_secs(40));
    }

    #[tokio::test]
    async fn the_wal_tells_which_groups_it_holds_its_next_sync_for() {
        let dir = tempfile::tempdir().unwrap();
        let wal = after_a_batch_of_groups_1_and_2(dir.path()).await;
        assert!(wal.awaits(1) && wal.awaits(2));
        assert!(!wal.awaits(3), "group 3 was not in the batch");
        wal.release(2);
        assert!(!wal.awaits(2), "a released group is not waited for");
        // A batch of one group: the writer holds nothing for the next.
        wal.append(vec![record(1)]).await.unwrap();
        assert!(!wal.awaits(1));
    }

    #[tokio::test]
    async fn a_batch_over_the_await_bound_is_not_waited_after() {
        let dir = tempfile::tempdir().unwrap();
        let wal = patient_wal(dir.path());
        wal.expect_next(1);
        wal.expect_next(2);
        let mut big = record(1);
        big.payload = vec![1; super::AWAIT_BELOW_BYTES + 1];
        wal.append(vec![big, record(2)]).await.unwrap();
        // Group 2 announced but never sends: after a large batch group 1 is not held for it.
        tokio::time::timeout(Duration::from_secs(20), wal.append(vec![record(1)]))
            .await
            .expect("waited for a group after a batch over the bound")
            .unwrap();
    }

    #[test]
    fn a_group_set_tells_one_from_several() {
        let none = Groups::default();
        assert!(!none.one() && !none.several());
        let one = none.with(3);
        assert!(one.one() && !one.several());
        assert_eq!(one.with(3), one);
        let several = one.with(4);
        assert!(several.several() && !several.one());
        assert_eq!(several.0, Groups::bit(3) | Groups::bit(4));
        // Groups 64 apart share a bit.
        assert_eq!(Groups::bit(3), Groups::bit(67));
    }
}
