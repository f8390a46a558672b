//! The cold tier as the replicated state sees it (cluster.md §6).
//!
//! A stream's own bytes live in two places: the oldest ones in immutable objects of the cold
//! tier, described here by [`ChunkRef`]s, and the newest ones in memory (the hot ring, the
//! stream's [`ByteLog`](crate::bytelog::ByteLog)). Once flushed, bytes never enter this
//! crate's state again: the state holds where they are, not what they are, so a Raft snapshot
//! and a restart cost grows with the hot bytes and the metadata, not with the data held.
//!
//! The flow, every step a replicated command so that every replica agrees:
//! 1. the group's leader picks hot ranges ([`GroupState::pick_flush`]), packs their bytes
//!    into one object and uploads it (outside this crate, with a conditional create);
//! 2. it proposes [`FlushReq`]; applying it turns each still-hot range into a chunk
//!    reference and releases the hot bytes ([`GroupState::apply_flush`]);
//! 3. retention, deletion, expiry and purges drop chunk references; an object that no
//!    reference uses any more is queued in [`ColdState::gc`] (never earlier: a fork's pin
//!    keeps its source's references, so the object stays);
//! 4. the leader deletes queued objects and proposes [`Op::ColdGcDone`](crate::Op) to
//!    forget them.
//!
//! A read asks for a plan ([`StreamState::plan_own`]): which parts of a range are hot
//! (shared, zero-copy [`Bytes`]) and which are ranges of cold objects, so the caller can
//! fetch cold bytes without holding the group's lock.

use crate::ids::{Incarnation, StreamKey};
use crate::stream::StreamState;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// What a group holds, for a metrics scrape ([`crate::GroupState::sizes`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupSizes {
    pub streams: u64,
    /// Bytes not yet in the cold tier.
    pub hot_bytes: u64,
    /// Bytes of the streams that live in the cold tier (referenced, not deleted).
    pub cold_bytes: u64,
    pub cold_objects: u64,
    /// Objects queued for deletion.
    pub gc_queued: u64,
}

/// An object of the cold tier written by this group. Ids are assigned by the leader from
/// [`ColdState::next_object`] and are never reused: an upload is a conditional create, so a
/// leader that finds its id taken (an upload whose flush never committed) takes the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ObjectId(pub u64);

/// Bytes `[start, end)` of a stream, stored at payload position `pos` of `object`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkRef {
    pub start: u64,
    pub end: u64,
    pub object: ObjectId,
    pub pos: u64,
    /// Payload bytes of the whole object (a reader needs it to find the last block).
    pub object_len: u64,
}

/// A stream's bytes in the cold tier: chunk references in offset order, never overlapping.
/// Flushed ones are contiguous and end where the stream's hot bytes start; external payloads
/// (see [`crate::external`]) may also sit above that, between hot bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColdChunks {
    chunks: VecDeque<ChunkRef>,
}

impl ColdChunks {
    /// First flushed offset still referenced, if any.
    pub fn start(&self) -> Option<u64> {
        self.chunks.front().map(|c| c.start)
    }

    /// The references, in offset order.
    pub fn iter(&self) -> impl Iterator<Item = &ChunkRef> {
        self.chunks.iter()
    }

    /// Number of references.
    pub fn len(&self) -> usize {
        self.chunks.len()
    }

    /// Whether nothing is flushed.
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Inserts a reference where its offsets put it (references never overlap).
    pub(crate) fn push_ref(&mut self, c: ChunkRef) {
        let at = self.chunks.partition_point(|x| x.start < c.start);
        self.chunks.insert(at, c);
    }

    pub(crate) fn partition_point(&self, pred: impl FnMut(&ChunkRef) -> bool) -> usize {
        self.chunks.partition_point(pred)
    }

    pub(crate) fn get(&self, i: usize) -> Option<&ChunkRef> {
        self.chunks.get(i)
    }

    pub(crate) fn range_from(&self, i: usize) -> impl Iterator<Item = &ChunkRef> {
        self.chunks.range(i.min(self.chunks.len())..)
    }

    /// Drops every reference that ends at or below `keep`, reporting each one's object.
    fn drop_below(&mut self, keep: u64, released: &mut Vec<ObjectId>) {
        while let Some(c) = self.chunks.front() {
            if c.end > keep {
                break;
            }
            released.push(c.object);
            self.chunks.pop_front();
        }
    }

    /// Drops every reference, reporting each one's object.
    fn drain_into(&mut self, released: &mut Vec<ObjectId>) {
        released.extend(self.chunks.drain(..).map(|c| c.object));
    }
}

/// Where one part of a planned read lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Hot bytes, shared with the stream's memory (no copy was made).
    Hot(Bytes),
    /// `len` bytes at payload position `pos` of a cold object.
    Cold {
        object: ObjectId,
        pos: u64,
        len: u64,
        object_len: u64,
    },
}

impl Piece {
    /// Bytes this piece covers.
    pub fn len(&self) -> u64 {
        match self {
            Piece::Hot(b) => b.len() as u64,
            Piece::Cold { len, .. } => *len,
        }
    }

    /// Whether the piece covers nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How many chunk references use a live object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectUse {
    pub refs: u32,
}

/// A group's cold bookkeeping.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColdState {
    /// Objects that chunk references still use.
    pub objects: BTreeMap<ObjectId, ObjectUse>,
    /// Objects no reference uses: the leader deletes them, then forgets them with
    /// `ColdGcDone`.
    pub gc: BTreeSet<ObjectId>,
    /// The lowest id no flush has used.
    pub next_object: u64,
    /// The group's key namespace in the cold store, chosen at random by the leader of its
    /// first flush (`0`: none yet). Object keys include it, so two deployments sharing a
    /// bucket (or a data dir started afresh against an old store) never take each other's
    /// objects for their own orphans.
    pub namespace: u64,
}

impl ColdState {
    /// Forgets one reference to each of `released` (one entry per dropped reference);
    /// objects left without references are queued for deletion.
    pub(crate) fn release(&mut self, released: &[ObjectId]) {
        for id in released {
            let Some(u) = self.objects.get_mut(id) else {
                continue;
            };
            u.refs = u.refs.saturating_sub(1);
            if u.refs == 0 {
                self.objects.remove(id);
                self.gc.insert(*id);
            }
        }
    }
}

/// One stream's range inside a flush object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlushSlice {
    pub key: StreamKey,
    pub incarnation: Incarnation,
    pub start: u64,
    pub end: u64,
    /// Payload position of `start` in the object.
    pub pos: u64,
}

/// Publishes an uploaded object's slices as chunk references (cluster.md §6.2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlushReq {
    /// The group's namespace the object was written under (see [`ColdState::namespace`]).
    pub namespace: u64,
    pub object: ObjectId,
    /// Payload bytes of the object (the sum of its slices).
    pub object_len: u64,
    pub slices: Vec<FlushSlice>,
}

/// A range a flush may move to the cold tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlushCandidate {
    pub key: StreamKey,
    pub incarnation: Incarnation,
    pub start: u64,
    pub end: u64,
}

impl StreamState {
    /// The lowest own offset still held, in the cold tier or in memory.
    pub fn held_start(&self) -> u64 {
        // An external payload may be the first reference while hot bytes sit below it.
        self.cold
            .start()
            .map_or(self.data_start, |c| c.min(self.data_start))
    }

    /// Hot bytes held in memory.
    pub fn hot_len(&self) -> u64 {
        self.data.len() as u64
    }

    /// Plans a read of own bytes `[start, end)`: appends, in order, the pieces that cover
    /// it. Returns false (and appends nothing) when the stream no longer holds all of it.
    pub fn plan_own(&self, start: u64, end: u64, out: &mut Vec<Piece>) -> bool {
        if !(self.held_start() <= start && start <= end && end <= self.tail) {
            return false;
        }
        let mark = out.len();
        let mut at = start;
        let mut i = self.cold.partition_point(|c| c.end <= at);
        while at < end {
            match self.cold.get(i) {
                Some(c) if c.start <= at => {
                    let hi = end.min(c.end);
                    out.push(Piece::Cold {
                        object: c.object,
                        pos: c.pos + (at - c.start),
                        len: hi - at,
                        object_len: c.object_len,
                    });
                    at = hi;
                    i += 1;
                }
                next => {
                    // Hot bytes up to the next reference (an external payload) or the end.
                    let hi = end.min(next.map_or(self.tail, |c| c.start));
                    if at < self.data_start {
                        out.truncate(mark);
                        return false; // unreachable: flushed references are contiguous
                    }
                    let lo = self.hot_before(at);
                    let lo = usize::try_from(lo).unwrap_or(usize::MAX);
                    let n = usize::try_from(hi - at).unwrap_or(usize::MAX);
                    self.data
                        .share_into(lo, lo.saturating_add(n), |b| out.push(Piece::Hot(b)));
                    at = hi;
                }
            }
        }
        true
    }

    /// Drops cold references wholly below `keep`; see [`StreamState::trim`].
    pub(crate) fn trim_cold(&mut self, keep: u64, released: &mut Vec<ObjectId>) {
        self.cold.drop_below(keep, released);
    }

    /// Turns hot bytes `[start, end)` into a reference to `object` at `pos`, if they are
    /// still the first hot bytes (retention may have dropped some of them since the leader
    /// looked; a stale or repeated flush changes nothing). Returns whether a reference was
    /// added.
    fn flush_hot(&mut self, start: u64, end: u64, at: (ObjectId, u64, u64)) -> bool {
        let (object, pos, object_len) = at;
        if start > self.data_start || end > self.tail || end <= self.data_start {
            return false;
        }
        let ahead = self.first_ahead();
        if self.cold.get(ahead).is_some_and(|c| end > c.start) {
            return false; // would cover an external payload: not what the leader planned
        }
        let from = self.data_start;
        let n = usize::try_from(end - from).unwrap_or(usize::MAX);
        self.cold.push_ref(ChunkRef {
            start: from,
            end,
            object,
            pos: pos + (from - start),
            object_len,
        });
        self.data.drop_front(n);
        self.data_start = end;
        self.settle_hot_start();
        true
    }

    /// Every reference this stream holds, released (the stream is going away).
    pub(crate) fn release_all_cold(&mut self, released: &mut Vec<ObjectId>) {
        self.cold.drain_into(released);
    }
}

impl crate::group::GroupState {
    /// Applies a flush (cluster.md §6.2): slices whose bytes are still hot become chunk
    /// references; an object none of whose slices applied is queued for deletion. A flush
    /// naming an object that is live or queued changes nothing (a repeated proposal), and
    /// one naming an id below those already handed out lost a race (a retry, or a former
    /// leader's upload): nothing can reference it, so it is queued for deletion. A flush
    /// without slices is how a leader hands over an object it found already uploaded by an
    /// attempt that never committed (an orphan) for deletion.
    pub(crate) fn apply_flush(&mut self, req: &FlushReq) {
        if self.cold.namespace == 0 {
            self.cold.namespace = req.namespace;
        } else if req.namespace != self.cold.namespace {
            // Written under a namespace this group does not use (a former leader's first
            // flush raced another's): not this group's object to reference or delete.
            return;
        }
        if self.cold.objects.contains_key(&req.object) || self.cold.gc.contains(&req.object) {
            return;
        }
        if req.object.0 < self.cold.next_object {
            self.cold.gc.insert(req.object);
            return;
        }
        self.cold.next_object = req.object.0.saturating_add(1);
        let mut refs = 0u32;
        for sl in &req.slices {
            if sl.start > sl.end {
                continue;
            }
            let Some(s) = self.streams.get_mut(&sl.key) else {
                continue;
            };
            if s.incarnation == sl.incarnation
                && s.flush_hot(sl.start, sl.end, (req.object, sl.pos, req.object_len))
            {
                refs += 1;
            }
        }
        if refs == 0 {
            self.cold.gc.insert(req.object);
        } else {
            self.cold.objects.insert(req.object, ObjectUse { refs });
        }
    }

    /// Forgets objects the leader deleted.
    pub(crate) fn apply_gc_done(&mut self, objects: &[ObjectId]) {
        for id in objects {
            self.cold.gc.remove(id);
        }
    }

    /// Hot bytes over all streams of the group.
    pub fn hot_bytes(&self) -> u64 {
        self.streams.values().map(StreamState::hot_len).sum()
    }

    /// The group's sizes for a metrics scrape, in one walk over its streams.
    pub fn sizes(&self) -> GroupSizes {
        let (mut hot, mut cold) = (0, 0);
        for s in self.streams.values() {
            hot += s.hot_len();
            cold += s.cold.iter().map(|c| c.end - c.start).sum::<u64>();
        }
        GroupSizes {
            streams: self.streams.len() as u64,
            hot_bytes: hot,
            cold_bytes: cold,
            cold_objects: self.cold.objects.len() as u64,
            gc_queued: self.cold.gc.len() as u64,
        }
    }

    /// One walk over the group's streams for a flush (cluster.md §6.2): counts the hot
    /// bytes, and those of the streams holding at least `rule.min_run`. When those reach
    /// `rule.min_ready`, the flush takes only such streams, so that an object is not a
    /// confetti of tiny slices (each of which costs a chunk reference for as long as the
    /// bytes live, and a ranged read to catch up on); otherwise, once the group's hot bytes
    /// reach `rule.any_at`, it takes any stream. Picks ranges for one object of at most
    /// `rule.max_bytes` (at least one range) and their bytes ([`FlushPick::bytes`]). When the
    /// object cannot take every eligible stream, the largest go first, so that one object
    /// moves the most memory, and a range larger than the room left is cut to it (its rest
    /// waits for the next flush); otherwise they come in no particular order.
    ///
    /// This runs under the group's read lock, which holds off its writes: at 25,000 small
    /// streams a pick that ordered them all by size (and by key on ties) and looked each up
    /// again to plan its bytes held appends for tens of milliseconds (docs/benchmarks.md,
    /// session 21).
    pub fn pick_flush(&self, rule: &FlushRule) -> FlushPick {
        let min_run = rule.min_run.max(1);
        let mut pick = FlushPick::default();
        let mut hot: Vec<(u64, &StreamKey, &StreamState)> = Vec::new();
        for (key, s) in &self.streams {
            let n = s.hot_len();
            if n == 0 {
                continue;
            }
            pick.hot += n;
            if n >= min_run {
                pick.ready += n;
            }
            hot.push((n, key, s));
        }
        let eligible = if pick.ready >= rule.min_ready.max(1) {
            hot.retain(|&(n, _, _)| n >= min_run);
            pick.ready
        } else if pick.hot >= rule.any_at.max(1) {
            pick.hot
        } else {
            return pick;
        };
        let mut room = rule.max_bytes.max(1);
        if eligible > room {
            hot.sort_unstable_by_key(|&(n, _, _)| std::cmp::Reverse(n));
        }
        pick.picked.reserve(hot.len());
        for (_, key, s) in hot {
            if room == 0 {
                break;
            }
            // The runs of hot bytes between external payloads, from the hot start.
            let mut at = s.data_start;
            let mut refs = s.cold.range_from(s.first_ahead());
            while room > 0 && at < s.tail {
                let next = refs.next();
                let run_end = next.map_or(s.tail, |c| c.start);
                let n = (run_end - at).min(room);
                if n > 0 && s.plan_own(at, at + n, &mut pick.bytes) {
                    pick.picked.push(FlushCandidate {
                        key: key.clone(),
                        incarnation: s.incarnation,
                        start: at,
                        end: at + n,
                    });
                    room -= n;
                }
                match next {
                    Some(c) if n == run_end - at => at = c.end,
                    _ => break,
                }
            }
        }
        pick
    }
}

/// Which hot bytes a flush may take ([`GroupState::pick_flush`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlushRule {
    /// Smallest hot run of a stream that a flush takes while enough such runs are hot.
    pub min_run: u64,
    /// Hot bytes in runs of at least `min_run` at which the group flushes them.
    pub min_ready: u64,
    /// Hot bytes of the group at which it flushes any stream, however small its run.
    pub any_at: u64,
    /// Largest object.
    pub max_bytes: u64,
}

impl FlushRule {
    /// Whatever is hot (a forced flush: memory pressure, a test).
    pub fn any(max_bytes: u64) -> Self {
        FlushRule {
            min_run: 1,
            min_ready: 1,
            any_at: 1,
            max_bytes,
        }
    }
}

/// What [`GroupState::pick_flush`] saw and chose.
#[derive(Debug, Clone, Default)]
pub struct FlushPick {
    /// Hot bytes over all streams of the group.
    pub hot: u64,
    /// Hot bytes of the streams holding at least `min_run`.
    pub ready: u64,
    /// Ranges for one flush object; empty when the rule says not yet.
    pub picked: Vec<FlushCandidate>,
    /// The bytes of `picked`, in order (all [`Piece::Hot`]: a picked range is hot).
    pub bytes: Vec<Piece>,
}
