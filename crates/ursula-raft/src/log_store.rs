//! Per-group Raft log storage over the node's one shared WAL.
//!
//! Every group keeps its non-purged entries in memory (for reads) and writes every change as a
//! WAL record: entries, votes, truncations and purges. Appends complete through the WAL's
//! group-commit callback, so concurrent appends of all groups share fsyncs.
//!
//! For segment GC every group reports a *pin*: the lowest LSN of a record it still needs to
//! recover (its first retained entry, its latest durable vote record, its latest durable purge
//! record). Records below every group's pin are dead, and so are segments holding only such
//! records. Recovery replays whatever suffix of the WAL survives; the rules in
//! [`LogInner::replay`] make any suffix that starts at or before every pin rebuild the same log.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{
    AnyError, ErrorSubject, ErrorVerb, LogState, OptionalSend, RaftLogReader, StorageIOError,
};
use ursula_storage::{Lsn, Wal, WalError, WalRecord};

use crate::codec::{self, KIND_ENTRY, KIND_PURGE, KIND_TRUNCATE, KIND_VOTE};
use crate::types::{Entry, LogId, StorageError, TypeConfig, Vote};

/// One retained entry, kept encoded: a decoded entry holds every command's allocations, which
/// costs several times the encoded size while the entry waits for the next snapshot.
#[derive(Clone)]
struct Stored {
    log_id: LogId,
    payload: Arc<[u8]>,
    /// The entry as appended, until its first read, which takes it instead of decoding
    /// `payload`; later reads decode. On a single node, and on a follower, the first read is
    /// the apply, moments after the entry became durable; on a multi-node leader it is
    /// replication, and apply decodes. Until then the entry is held twice (not counted in
    /// `bytes`), for as long as the commit takes.
    fresh: Option<Entry>,
    /// The entry's WAL LSN, or a lower bound of it while the append is in flight.
    lsn: Lsn,
    /// Encoded size (for the size-based snapshot trigger).
    bytes: u64,
}

/// The in-memory log of one group.
#[derive(Default)]
pub(crate) struct LogInner {
    /// The latest vote submitted to the WAL.
    vote: Option<Vote>,
    /// Entries up to this are gone from memory (set once the purge record is durable).
    last_purged: Option<LogId>,
    /// The latest purge point submitted to the WAL (ahead of `last_purged` while a purge is in
    /// flight). Marker re-writes use it, so the purge record with the highest LSN always holds
    /// the highest purge point.
    purge_marker: Option<LogId>,
    entries: VecDeque<Stored>,
    bytes: u64,
}

impl LogInner {
    pub(crate) fn last_purged(&self) -> Option<LogId> {
        self.last_purged
    }

    fn first_index(&self) -> Option<u64> {
        self.entries.front().map(|s| s.log_id.index)
    }

    fn last_log_id(&self) -> Option<LogId> {
        self.entries.back().map(|s| s.log_id).or(self.last_purged)
    }

    /// Removes every entry with index >= `index`.
    fn truncate_from(&mut self, index: u64) {
        while let Some(last) = self.entries.back() {
            if last.log_id.index < index {
                break;
            }
            self.bytes -= last.bytes;
            self.entries.pop_back();
        }
    }

    /// Removes every entry with index <= `upto.index` and remembers the purge point.
    fn purge_upto(&mut self, upto: LogId) {
        while let Some(first) = self.entries.front() {
            if first.log_id.index > upto.index {
                break;
            }
            self.bytes -= first.bytes;
            self.entries.pop_front();
        }
        if self.last_purged.is_none_or(|p| p.index < upto.index) {
            self.last_purged = Some(upto);
        }
        self.mark_purge(upto);
    }

    fn mark_purge(&mut self, upto: LogId) {
        if self.purge_marker.is_none_or(|p| p.index < upto.index) {
            self.purge_marker = Some(upto);
        }
    }

    /// Adds an entry, replacing any entry at or after its index. Refuses to leave a hole.
    fn insert(&mut self, stored: Stored) -> Result<(), String> {
        let index = stored.log_id.index;
        if let Some(p) = self.last_purged
            && index <= p.index
        {
            return Err(format!(
                "entry {} is at or below the purge point {}",
                stored.log_id, p
            ));
        }
        self.truncate_from(index);
        let expected = match self.entries.back() {
            Some(last) => Some(last.log_id.index + 1),
            None => self.last_purged.map(|p| p.index + 1),
        };
        if let Some(e) = expected
            && e != index
        {
            return Err(format!(
                "entry {} would leave a hole (expected index {e})",
                stored.log_id
            ));
        }
        self.bytes += stored.bytes;
        self.entries.push_back(stored);
        Ok(())
    }

    /// Verifies the log rebuilt by [`LogInner::replay`]: the retained entries must start right
    /// after the purge point (or at index 0 when nothing was purged).
    pub(crate) fn check(&self) -> Result<(), String> {
        if let Some(first) = self.entries.front() {
            let want = self.last_purged.map_or(0, |p| p.index + 1);
            if first.log_id.index != want {
                return Err(format!(
                    "the log starts at entry {} but the purge point is {:?}",
                    first.log_id, self.last_purged
                ));
            }
        }
        Ok(())
    }

    /// Applies one replayed WAL record. Records arrive in LSN order; the first ones may be
    /// leftovers whose effect later records supersede (purged or truncated entries, older votes).
    pub(crate) fn replay(
        &mut self,
        lsn: Lsn,
        kind: u8,
        payload: &[u8],
        marks: &Marks,
    ) -> Result<(), String> {
        match kind {
            KIND_ENTRY => {
                let entry = codec::decode_entry(payload)?;
                let bytes = payload.len() as u64;
                // A surviving entry below the latest purge point was purged after it was written,
                // and the purge record is below us in the WAL; drop it.
                if let Some(p) = self.last_purged
                    && entry.log_id.index <= p.index
                {
                    return Ok(());
                }
                if self.entries.is_empty() {
                    // The first surviving entry may follow a gap: the entries before it were
                    // purged by a purge record that comes later in the WAL (the earlier purge
                    // records seen so far may be re-written, older markers). `check` verifies
                    // the end result.
                    self.bytes += bytes;
                    self.entries.push_back(Stored {
                        log_id: entry.log_id,
                        payload: Arc::from(payload),
                        fresh: None,
                        lsn,
                        bytes,
                    });
                    return Ok(());
                }
                self.insert(Stored {
                    log_id: entry.log_id,
                    payload: Arc::from(payload),
                    fresh: None,
                    lsn,
                    bytes,
                })
            }
            KIND_VOTE => {
                self.vote = Some(codec::decode_vote(payload)?);
                marks.vote_lsn.store(lsn, Ordering::SeqCst);
                Ok(())
            }
            KIND_TRUNCATE => {
                let since = codec::decode_log_id(payload)?;
                self.truncate_from(since.index);
                Ok(())
            }
            KIND_PURGE => {
                let upto = codec::decode_log_id(payload)?;
                self.purge_upto(upto);
                marks.purge_lsn.store(lsn, Ordering::SeqCst);
                Ok(())
            }
            other => Err(format!("unknown WAL record kind {other}")),
        }
    }
}

/// LSNs of a group's latest durable vote and purge records (0 = none).
#[derive(Default)]
pub(crate) struct Marks {
    vote_lsn: AtomicU64,
    purge_lsn: AtomicU64,
}

/// A group's log, shared by its [`LogStore`] (owned by openraft), log readers and node upkeep.
pub(crate) struct GroupLog {
    group: u32,
    wal: Wal,
    /// Highest LSN whose append callback has finished, node-wide. Every record with a lower LSN
    /// has had its callback (and its bookkeeping) run.
    durable_head: Arc<AtomicU64>,
    marks: Arc<Marks>,
    inner: Mutex<LogInner>,
    /// Woken after a purge so that segment GC runs soon.
    purged: Arc<tokio::sync::Notify>,
}

fn io_err(e: WalError) -> io::Error {
    io::Error::other(e.to_string())
}

impl GroupLog {
    pub(crate) fn new(
        group: u32,
        wal: Wal,
        durable_head: Arc<AtomicU64>,
        inner: LogInner,
        marks: Marks,
        purged: Arc<tokio::sync::Notify>,
    ) -> Self {
        GroupLog {
            group,
            wal,
            durable_head,
            marks: Arc::new(marks),
            inner: Mutex::new(inner),
            purged,
        }
    }

    fn lock(&self) -> MutexGuard<'_, LogInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Lowest LSN this group still needs for recovery, if any (see the module docs).
    pub(crate) fn pin(&self) -> Option<Lsn> {
        let entries = self.lock().entries.front().map(|s| s.lsn);
        let marks = [
            self.marks.vote_lsn.load(Ordering::SeqCst),
            self.marks.purge_lsn.load(Ordering::SeqCst),
        ];
        marks.into_iter().filter(|&l| l != 0).chain(entries).min()
    }

    /// LSN (or lower bound) of the first retained entry.
    pub(crate) fn first_entry_lsn(&self) -> Option<Lsn> {
        self.lock().entries.front().map(|s| s.lsn)
    }

    /// Encoded bytes of the retained entries.
    pub(crate) fn retained_bytes(&self) -> u64 {
        self.lock().bytes
    }

    /// Submits records; `on_done` runs with the result (on the runtime's WAL completion task,
    /// see `WalOptions::deliver_on`, or on the WAL writer thread), after which the
    /// node-wide durable head advances. Must be called with the group lock held when ordering
    /// against other writes of the group matters.
    fn submit(
        &self,
        records: Vec<WalRecord>,
        on_done: impl FnOnce(&Result<Lsn, WalError>) + Send + 'static,
    ) {
        let head = Arc::clone(&self.durable_head);
        self.wal.append_with(
            records,
            Box::new(move |res| {
                on_done(&res);
                if let Ok(lsn) = res {
                    head.fetch_max(lsn, Ordering::SeqCst);
                }
            }),
        );
    }

    fn record(&self, kind: u8, payload: Vec<u8>) -> WalRecord {
        WalRecord {
            group: self.group,
            kind,
            payload,
        }
    }

    /// Writes a vote or purge marker and waits until it is durable; returns its LSN.
    async fn write_marker(
        &self,
        kind: u8,
        payload: Vec<u8>,
        before_submit: impl FnOnce(&mut LogInner),
    ) -> Result<Lsn, WalError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let marks = Arc::clone(&self.marks);
        {
            let mut inner = self.lock();
            before_submit(&mut inner);
            let rec = self.record(kind, payload);
            self.submit(vec![rec], move |res| {
                if let Ok(lsn) = res {
                    bump_mark(&marks, kind, *lsn);
                }
                let _ = tx.send(res.as_ref().map(|l| *l).map_err(|e| e.to_string()));
            });
        }
        match rx.await {
            Ok(Ok(lsn)) => Ok(lsn),
            Ok(Err(e)) => Err(WalError::Io(io::Error::other(e))),
            Err(_) => Err(WalError::Closed),
        }
    }

    /// Re-writes the group's vote and purge records if they are below `below`, so that the WAL
    /// segments holding them can be deleted. Fire-and-forget: the marks advance once durable.
    pub(crate) fn rewrite_markers_below(&self, below: Lsn) {
        let inner = self.lock();
        let mut records = Vec::new();
        let mut kinds = Vec::new();
        let vote_lsn = self.marks.vote_lsn.load(Ordering::SeqCst);
        if vote_lsn != 0
            && vote_lsn < below
            && let Some(v) = &inner.vote
            && let Ok(p) = codec::encode_vote(v)
        {
            records.push(self.record(KIND_VOTE, p));
            kinds.push(KIND_VOTE);
        }
        let purge_lsn = self.marks.purge_lsn.load(Ordering::SeqCst);
        if purge_lsn != 0
            && purge_lsn < below
            && let Some(p) = &inner.purge_marker
            && let Ok(p) = codec::encode_log_id(p)
        {
            records.push(self.record(KIND_PURGE, p));
            kinds.push(KIND_PURGE);
        }
        if records.is_empty() {
            return;
        }
        let n = records.len() as u64;
        let marks = Arc::clone(&self.marks);
        let group = self.group;
        self.submit(records, move |res| match res {
            Ok(last) => {
                for (i, kind) in kinds.iter().enumerate() {
                    bump_mark(&marks, *kind, last + 1 + i as u64 - n);
                }
            }
            Err(e) => tracing::warn!(group, error = %e, "re-writing raft log markers failed"),
        });
        drop(inner);
    }

    fn entries_in<RB: RangeBounds<u64>>(&self, range: RB) -> Result<Vec<Entry>, String> {
        let mut inner = self.lock();
        let Some(first) = inner.first_index() else {
            return Ok(Vec::new());
        };
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s.saturating_add(1),
            Bound::Unbounded => first,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e.saturating_add(1),
            Bound::Excluded(&e) => e,
            Bound::Unbounded => u64::MAX,
        };
        let len = inner.entries.len() as u64;
        let lo = start.max(first) - first;
        let hi = end.saturating_sub(first).min(len);
        if lo >= hi {
            return Ok(Vec::new());
        }
        let picked: Vec<Result<Entry, Arc<[u8]>>> = inner
            .entries
            .range_mut(lo as usize..hi as usize)
            .map(|s| s.fresh.take().ok_or_else(|| Arc::clone(&s.payload)))
            .collect();
        drop(inner);
        picked
            .into_iter()
            .map(|p| p.or_else(|encoded| codec::decode_entry(&encoded)))
            .collect()
    }
}

fn bump_mark(marks: &Marks, kind: u8, lsn: Lsn) {
    let slot = if kind == KIND_VOTE {
        &marks.vote_lsn
    } else {
        &marks.purge_lsn
    };
    slot.fetch_max(lsn, Ordering::SeqCst);
}

fn write_error(subject: ErrorSubject<u64>, e: impl ToString) -> StorageError {
    StorageIOError::new(subject, ErrorVerb::Write, AnyError::error(e.to_string())).into()
}

/// openraft's handle on a group's log. Cheap to clone (it is also the log reader).
#[derive(Clone)]
pub struct LogStore {
    log: Arc<GroupLog>,
}

impl LogStore {
    pub(crate) fn new(log: Arc<GroupLog>) -> Self {
        LogStore { log }
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        self.log.entries_in(range).map_err(|e| {
            StorageIOError::new(ErrorSubject::Logs, ErrorVerb::Read, AnyError::error(e)).into()
        })
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let inner = self.log.lock();
        Ok(LogState {
            last_purged_log_id: inner.last_purged,
            last_log_id: inner.last_log_id(),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let payload = codec::encode_vote(vote).map_err(|e| write_error(ErrorSubject::Vote, e))?;
        let v = *vote;
        self.log
            .write_marker(KIND_VOTE, payload, move |inner| inner.vote = Some(v))
            .await
            .map_err(|e| write_error(ErrorSubject::Vote, e))?;
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        Ok(self.log.lock().vote)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        // Encode outside the lock: readers (apply, replication) keep going meanwhile.
        let mut encoded = Vec::new();
        for entry in entries {
            let payload = codec::encode_entry(&entry)
                .map_err(|e| write_error(ErrorSubject::Log(entry.log_id), e))?;
            encoded.push((entry, payload));
        }
        if encoded.is_empty() {
            callback.log_io_completed(Ok(()));
            return Ok(());
        }
        let mut records = Vec::with_capacity(encoded.len());
        {
            let mut inner = self.log.lock();
            // Any record submitted now gets an LSN above every LSN already reported durable.
            let lsn_floor = self.log.durable_head.load(Ordering::SeqCst) + 1;
            for (entry, payload) in encoded {
                let log_id = entry.log_id;
                let bytes = payload.len() as u64;
                inner
                    .insert(Stored {
                        log_id,
                        payload: Arc::from(payload.as_slice()),
                        fresh: Some(entry),
                        lsn: lsn_floor,
                        bytes,
                    })
                    .map_err(|e| write_error(ErrorSubject::Log(log_id), e))?;
                records.push(self.log.record(KIND_ENTRY, payload));
            }
            self.log.submit(records, move |res| {
                let res = match res {
                    Ok(_) => Ok(()),
                    Err(e) => Err(io::Error::other(e.to_string())),
                };
                callback.log_io_completed(res);
            });
        }
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let payload =
            codec::encode_log_id(&log_id).map_err(|e| write_error(ErrorSubject::Logs, e))?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        {
            let mut inner = self.log.lock();
            inner.truncate_from(log_id.index);
            let rec = self.log.record(KIND_TRUNCATE, payload);
            self.log.submit(vec![rec], move |res| {
                let _ = tx.send(res.as_ref().map(|_| ()).map_err(|e| e.to_string()));
            });
        }
        match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(write_error(ErrorSubject::Logs, e)),
            Err(_) => Err(write_error(ErrorSubject::Logs, io_err(WalError::Closed))),
        }
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let payload =
            codec::encode_log_id(&log_id).map_err(|e| write_error(ErrorSubject::Logs, e))?;
        self.log
            .write_marker(KIND_PURGE, payload, move |inner| inner.mark_purge(log_id))
            .await
            .map_err(|e| write_error(ErrorSubject::Logs, e))?;
        // Only now, with the purge record durable, may the entries (and the segments they pin)
        // go.
        self.log.lock().purge_upto(log_id);
        self.log.purged.notify_one();
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;
    use crate::types::Batch;
    use openraft::{CommittedLeaderId, EntryPayload};

    fn entry(term: u64, index: u64) -> Entry {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
            payload: EntryPayload::Normal(Batch(Vec::new())),
        }
    }

    fn replay_all(records: &[(u8, Vec<u8>)]) -> LogInner {
        let mut inner = LogInner::default();
        let marks = Marks::default();
        for (i, (kind, payload)) in records.iter().enumerate() {
            inner.replay(i as u64 + 1, *kind, payload, &marks).unwrap();
        }
        inner
    }

    fn indexes(inner: &LogInner) -> Vec<(u64, u64)> {
        inner
            .entries
            .iter()
            .map(|s| (s.log_id.leader_id.term, s.log_id.index))
            .collect()
    }

    fn e(term: u64, index: u64) -> (u8, Vec<u8>) {
        (
            KIND_ENTRY,
            codec::encode_entry(&entry(term, index)).unwrap(),
        )
    }

    fn lid(kind: u8, term: u64, index: u64) -> (u8, Vec<u8>) {
        (
            kind,
            codec::encode_log_id(&LogId::new(CommittedLeaderId::new(term, 1), index)).unwrap(),
        )
    }

    #[test]
    fn replay_truncate_and_rewrite() {
        let recs = vec![
            e(1, 1),
            e(1, 2),
            e(1, 3),
            lid(KIND_TRUNCATE, 1, 2),
            e(2, 2),
            e(2, 3),
        ];
        let inner = replay_all(&recs);
        assert_eq!(indexes(&inner), vec![(1, 1), (2, 2), (2, 3)]);
        // An overwrite without an explicit truncate record also truncates.
        let recs = vec![e(1, 1), e(1, 2), e(1, 3), e(2, 2)];
        assert_eq!(indexes(&replay_all(&recs)), vec![(1, 1), (2, 2)]);
    }

    #[test]
    fn replay_purge_and_suffix() {
        let recs = vec![e(1, 1), e(1, 2), e(1, 3), lid(KIND_PURGE, 1, 2), e(1, 4)];
        let full = replay_all(&recs);
        assert_eq!(indexes(&full), vec![(1, 3), (1, 4)]);
        assert_eq!(full.last_purged.map(|p| p.index), Some(2));
        // Any suffix starting at or before the first retained entry rebuilds the same log.
        for start in 0..=2 {
            let inner = replay_all(&recs[start..]);
            assert_eq!(indexes(&inner), vec![(1, 3), (1, 4)], "start {start}");
            assert_eq!(inner.last_purged.map(|p| p.index), Some(2));
        }
        // A re-written purge marker after the retained entries changes nothing.
        let mut recs2 = recs[2..].to_vec();
        recs2.push(lid(KIND_PURGE, 1, 2));
        let inner = replay_all(&recs2);
        assert_eq!(indexes(&inner), vec![(1, 3), (1, 4)]);
        // Purging beyond the end empties the log; the next entry follows the purge point.
        let recs3 = vec![e(1, 1), lid(KIND_PURGE, 1, 5), e(1, 6)];
        let inner = replay_all(&recs3);
        assert_eq!(indexes(&inner), vec![(1, 6)]);
        assert_eq!(inner.last_log_id().map(|l| l.index), Some(6));
    }

    #[test]
    fn replay_gap_closed_by_a_later_purge() {
        // A re-written (older) purge marker, then the surviving entries, then the real purge.
        let recs = vec![
            lid(KIND_PURGE, 1, 97),
            e(1, 99),
            e(1, 100),
            lid(KIND_PURGE, 1, 98),
        ];
        let inner = replay_all(&recs);
        inner.check().unwrap();
        assert_eq!(indexes(&inner), vec![(1, 99), (1, 100)]);
        // Without the later purge the gap is reported.
        let inner = replay_all(&recs[..3]);
        assert!(inner.check().is_err());
        // A log that never purged must start at index 0.
        assert!(replay_all(&[e(1, 0), e(1, 1)]).check().is_ok());
        assert!(replay_all(&[e(1, 3)]).check().is_err());
    }

    #[test]
    fn reads_hand_out_the_appended_entry_once_then_decode() {
        let tmp = tempfile::tempdir().unwrap();
        let opts = ursula_storage::WalOptions {
            fsync: false,
            ..Default::default()
        };
        let (wal, _) = Wal::open(tmp.path(), opts).unwrap();
        let log = GroupLog::new(
            0,
            wal,
            Arc::new(AtomicU64::new(0)),
            LogInner::default(),
            Marks::default(),
            Arc::new(tokio::sync::Notify::new()),
        );
        let cmd = |i: u64| ursula_core::command::Command {
            now_ms: 7 + i,
            op: ursula_core::command::Op::Delete {
                key: ursula_core::StreamKey::new("bkt1", &format!("s{i}")),
                incarnation: None,
            },
        };
        for i in 0..3 {
            let entry = Entry {
                log_id: LogId::new(CommittedLeaderId::new(1, 1), i),
                payload: EntryPayload::Normal(Batch(vec![cmd(i), cmd(i + 10)])),
            };
            let payload = codec::encode_entry(&entry).unwrap();
            log.lock()
                .insert(Stored {
                    log_id: entry.log_id,
                    bytes: payload.len() as u64,
                    payload: Arc::from(payload),
                    fresh: Some(entry),
                    lsn: 1,
                })
                .unwrap();
        }
        let encoded = |entries: Vec<Entry>| -> Vec<Vec<u8>> {
            entries
                .iter()
                .map(|e| codec::encode_entry(e).unwrap())
                .collect()
        };
        // The first read of 1..=2 takes the appended entries; entry 0 is still fresh.
        let first = log.entries_in(1..=2).unwrap();
        assert!(
            log.lock()
                .entries
                .iter()
                .map(|s| s.fresh.is_some())
                .eq([true, false, false])
        );
        // A second read decodes and yields the same entries.
        let again = log.entries_in(1..=2).unwrap();
        assert_eq!(encoded(first), encoded(again));
        let all = log.entries_in(..).unwrap();
        assert_eq!(all.len(), 3);
        assert!(log.lock().entries.iter().all(|s| s.fresh.is_none()));
        assert_eq!(
            encoded(all)[1..],
            encoded(log.entries_in(1..3).unwrap())[..]
        );

        // An index overwritten (a new leader's entry) reads as the new entry, fresh or not.
        let replacement = Entry {
            log_id: LogId::new(CommittedLeaderId::new(2, 1), 1),
            payload: EntryPayload::Normal(Batch(vec![cmd(99)])),
        };
        let payload = codec::encode_entry(&replacement).unwrap();
        let expected = payload.clone();
        log.lock()
            .insert(Stored {
                log_id: replacement.log_id,
                bytes: payload.len() as u64,
                payload: Arc::from(payload),
                fresh: Some(replacement),
                lsn: 2,
            })
            .unwrap();
        assert_eq!(indexes(&log.lock()), vec![(1, 0), (2, 1)]);
        for _ in 0..2 {
            let read = log.entries_in(1..).unwrap();
            assert_eq!(encoded(read), vec![expected.clone()]);
        }
    }

    #[test]
    fn insert_refuses_holes() {
        let mut inner = LogInner::default();
        let s = |i| Stored {
            log_id: entry(1, i).log_id,
            payload: Arc::from(codec::encode_entry(&entry(1, i)).unwrap().as_slice()),
            fresh: None,
            lsn: 1,
            bytes: 1,
        };
        inner.insert(s(0)).unwrap();
        inner.insert(s(1)).unwrap();
        assert!(inner.insert(s(3)).is_err());
        inner.purge_upto(LogId::new(CommittedLeaderId::new(1, 1), 1));
        assert!(inner.insert(s(1)).is_err());
        inner.insert(s(2)).unwrap();
        assert_eq!(inner.bytes, 1);
    }
}
