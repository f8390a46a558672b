//! The state of one Raft group: its streams, buckets and fork outbox, and `apply`.

use crate::cold::{ColdState, ObjectId};
use crate::command::*;
use crate::content_type;
use crate::error::{ErrorCode, Rejection};
use crate::ids::{Incarnation, StreamKey};
use crate::producer::{self, Check, Receipt};
use crate::stream::{ForkLink, Pin, StreamState};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Recommended bound on fork chains (forks.md §10.3).
pub const MAX_FORK_DEPTH: u32 = 64;

/// A pin release this group owes to a fork source in (possibly) another group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboxItem {
    pub id: u64,
    pub source: StreamKey,
    pub pin_id: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GroupState {
    pub group: u32,
    pub streams: HashMap<StreamKey, StreamState>,
    pub buckets: BTreeSet<String>,
    pub fenced: BTreeSet<String>,
    pub outbox: BTreeMap<u64, OutboxItem>,
    pub next_outbox_id: u64,
    /// Cold-tier objects in use and waiting for deletion (see [`crate::cold`]).
    pub cold: ColdState,
}

fn not_found() -> Rejection {
    Rejection::new(ErrorCode::STREAM_NOT_FOUND, "stream not found")
}

fn soft_deleted() -> Rejection {
    Rejection::new(
        ErrorCode::STREAM_SOFT_DELETED,
        "stream was deleted and is kept only for its forks",
    )
}

impl GroupState {
    pub fn new(group: u32) -> Self {
        GroupState {
            group,
            ..Default::default()
        }
    }

    /// Applies one committed command. `log_index` is the Raft index of its entry.
    pub fn apply(&mut self, log_index: u64, cmd: &Command) -> Response {
        let now = cmd.now_ms;
        match &cmd.op {
            Op::Noop => Ok(Reply::Done),
            Op::CreateBucket { bucket } => {
                if self.fenced.contains(bucket) {
                    return Err(Rejection::new(
                        ErrorCode::BUCKET_NOT_FOUND,
                        "bucket not found",
                    ));
                }
                self.buckets.insert(bucket.clone());
                Ok(Reply::Done)
            }
            Op::DeleteBucket { bucket } => {
                if self.streams.keys().any(|k| k.bucket() == bucket) {
                    return Err(Rejection::new(
                        ErrorCode::BUCKET_NOT_EMPTY,
                        "bucket still has streams",
                    ));
                }
                self.buckets.remove(bucket);
                Ok(Reply::Done)
            }
            Op::Create(req) => self.create(log_index, now, req),
            Op::Append(req) => self.append(now, req),
            Op::Delete { key, incarnation } => self.delete(now, key, *incarnation),
            Op::Touch { key, incarnation } => {
                self.lapse_if_expired(key, now);
                if let Some(s) = self.streams.get_mut(key)
                    && s.incarnation == *incarnation
                    && !s.soft_deleted
                {
                    s.last_touch_ms = now;
                }
                Ok(Reply::Done)
            }
            Op::Expire { key, incarnation } => {
                if self
                    .streams
                    .get(key)
                    .is_some_and(|s| s.incarnation == *incarnation)
                {
                    self.lapse_if_expired(key, now);
                }
                Ok(Reply::Done)
            }
            Op::Pin(req) => self.pin(now, req),
            Op::Unpin { key, pin_id } => {
                self.unpin(key, *pin_id);
                Ok(Reply::Done)
            }
            Op::OutboxDone { id } => {
                self.outbox.remove(id);
                Ok(Reply::Done)
            }
            Op::PublishSnapshot(req) => self
                .stream_for_update(&req.key, now, req.incarnation)?
                .publish_snapshot(req),
            Op::PublishColdSnapshot(req) => self
                .stream_for_update(&req.key, now, req.incarnation)?
                .publish_cold_snapshot(req),
            Op::DeleteSnapshot {
                key,
                offset,
                incarnation,
            } => self
                .stream_for_update(key, now, *incarnation)?
                .delete_snapshot(*offset),
            Op::Retain {
                key,
                at,
                incarnation,
            } => {
                let mut released = Vec::new();
                let r = self
                    .stream_for_update(key, now, *incarnation)?
                    .retain(*at, &mut released);
                self.cold.release(&released);
                r
            }
            Op::PurgeBucket { bucket } => Ok(self.purge_bucket(bucket)),
            Op::ColdFlush(req) => {
                self.apply_flush(req);
                Ok(Reply::Done)
            }
            Op::ColdGcDone { objects } => {
                self.apply_gc_done(objects);
                Ok(Reply::Done)
            }
        }
    }

    /// Stream operations in a purged bucket answer as if the bucket never existed.
    fn check_not_fenced(&self, key: &StreamKey) -> Result<(), Rejection> {
        if self.fenced.contains(key.bucket()) {
            return Err(Rejection::new(
                ErrorCode::BUCKET_NOT_FOUND,
                "bucket not found",
            ));
        }
        Ok(())
    }

    /// Removes every stream of `bucket` (forks, soft-deleted streams and their pins with
    /// them: forks never leave their bucket) and fences the ID.
    fn purge_bucket(&mut self, bucket: &str) -> Reply {
        let before = self.streams.len();
        let mut released = Vec::new();
        self.streams.retain(|k, s| {
            let keep = k.bucket() != bucket;
            if !keep {
                s.release_all_cold(&mut released);
            }
            keep
        });
        self.cold.release(&released);
        self.outbox.retain(|_, item| item.source.bucket() != bucket);
        self.buckets.remove(bucket);
        if bucket != crate::ids::COMPAT_BUCKET {
            self.fenced.insert(bucket.to_owned());
        }
        Reply::Purged {
            removed: (before - self.streams.len()) as u64,
        }
    }

    /// The stream a subresource write addresses: lapsed streams are removed first, then
    /// `404` when missing, `410` when soft-deleted, `412` when another incarnation.
    fn stream_for_update(
        &mut self,
        key: &StreamKey,
        now: u64,
        incarnation: Option<Incarnation>,
    ) -> Result<&mut StreamState, Rejection> {
        self.lapse_if_expired(key, now);
        self.check_not_fenced(key)?;
        let s = self.streams.get_mut(key).ok_or_else(not_found)?;
        if s.soft_deleted {
            return Err(soft_deleted());
        }
        if let Some(i) = incarnation
            && i != s.incarnation
        {
            return Err(incarnation_mismatch(Some(s.incarnation)));
        }
        Ok(s)
    }

    /// A stream that lapsed is removed, or soft-deleted while it has forks.
    fn lapse_if_expired(&mut self, key: &StreamKey, now: u64) {
        if self
            .streams
            .get(key)
            .is_some_and(|s| !s.soft_deleted && s.expired(now))
        {
            self.remove_or_soft_delete(key);
        }
    }

    fn remove_or_soft_delete(&mut self, key: &StreamKey) {
        let Some(s) = self.streams.get_mut(key) else {
            return;
        };
        if s.pins.is_empty() {
            self.remove(key);
        } else {
            // Kept only for its forks' reads; they hold their own copy of the snapshot.
            s.soft_deleted = true;
            s.snapshot = None;
            s.snapshot_object = None;
        }
    }

    fn remove(&mut self, key: &StreamKey) {
        let Some(mut s) = self.streams.remove(key) else {
            return;
        };
        let mut released = Vec::new();
        s.release_all_cold(&mut released);
        self.cold.release(&released);
        if let Some(link) = s.fork {
            let id = self.next_outbox_id;
            self.next_outbox_id += 1;
            self.outbox.insert(
                id,
                OutboxItem {
                    id,
                    source: link.source,
                    pin_id: link.pin_id,
                },
            );
        }
    }

    fn unpin(&mut self, key: &StreamKey, pin_id: u64) {
        let Some(s) = self.streams.get_mut(key) else {
            return;
        };
        s.pins.remove(&pin_id);
        if s.soft_deleted && s.pins.is_empty() {
            self.remove(key);
        } else {
            // The pin may have been what kept old bytes below the retained offset.
            let mut released: Vec<ObjectId> = Vec::new();
            s.trim(&mut released);
            self.cold.release(&released);
        }
    }

    fn create(&mut self, log_index: u64, now: u64, req: &CreateReq) -> Response {
        let bucket = req.key.bucket();
        if self.fenced.contains(bucket) {
            return Err(Rejection::new(
                ErrorCode::BUCKET_NOT_FOUND,
                "bucket not found",
            ));
        }
        if let Some(p) = &req.producer
            && p.seq != 0
        {
            return Err(Rejection::new(
                ErrorCode::PRODUCER_SEQ_CONFLICT,
                "a create's Producer-Seq must be 0",
            )
            .with(|f| {
                f.expected_seq = Some(0);
                f.received_seq = Some(p.seq);
            }));
        }
        self.lapse_if_expired(&req.key, now);
        if let Some(s) = self.streams.get(&req.key) {
            if s.soft_deleted {
                return Err(Rejection::new(
                    ErrorCode::PATH_SOFT_DELETED,
                    "the path belongs to a deleted stream that still has forks",
                ));
            }
            if let Some(i) = req.incarnation
                && i != s.incarnation
            {
                return Err(incarnation_mismatch(Some(s.incarnation)));
            }
            let same = match &req.fork {
                Some(f) => same_fork(s, req, f),
                None => same_config(s, req),
            };
            if !same {
                return Err(Rejection::new(
                    ErrorCode::STREAM_ALREADY_EXISTS_CONFLICT,
                    "stream already exists with a different configuration",
                ));
            }
            let s = self.streams.get_mut(&req.key).ok_or_else(not_found)?;
            s.last_touch_ms = now;
            return Ok(Reply::Created(Box::new(create_reply(
                s,
                false,
                req,
                s.record_next(),
            ))));
        }
        if req.incarnation.is_some() {
            return Err(incarnation_mismatch(None));
        }
        let incarnation = Incarnation(
            (u128::from(self.group) << 112)
                | (u128::from(log_index & 0xffff_ffff_ffff) << 64)
                | u128::from(now.saturating_mul(1_000_000)),
        );
        let (content_type, lifetime, inherited, fork, depth, own_start, history) = match &req.fork {
            None => (
                req.content_type
                    .clone()
                    .unwrap_or_else(|| "application/octet-stream".into()),
                req.lifetime,
                false,
                None,
                0,
                0,
                Inherited::default(),
            ),
            Some(f) => {
                let Some(p) = &f.pinned else {
                    return Ok(Reply::NeedsPin);
                };
                if now > p.deadline_ms {
                    return Err(Rejection::new(
                        ErrorCode::LEADER_UNAVAILABLE,
                        "the fork source pin expired before the fork was created; retry",
                    ));
                }
                let inherited = req.lifetime.is_none();
                let link = ForkLink {
                    source: f.source.clone(),
                    source_incarnation: p.source_incarnation,
                    pin_id: p.pin_id,
                    anchor: p.anchor,
                    sub: f.sub,
                    point: p.point,
                };
                (
                    p.content_type.clone(),
                    if inherited { p.lifetime } else { req.lifetime },
                    inherited,
                    Some(link),
                    p.depth,
                    p.point,
                    Inherited::of(p),
                )
            }
        };
        let json = content_type::is_json(&content_type);
        let Inherited {
            mut ends,
            ends_cut,
            cut_offset,
            retained,
            snapshot,
        } = history;
        let (snapshot, snapshot_object) = match snapshot {
            Some(v) => {
                let (v, r) = crate::snapshot::ColdSnapshotRef::from_inherited(v);
                (Some(v), r)
            }
            None => (None, None),
        };
        // A non-JSON fork point inside an append ends that unit for the fork (bootstrap
        // parts never span the fork point).
        if !json && own_start > ends.last().copied().unwrap_or(cut_offset) {
            ends.push(own_start);
        }
        let mut s = StreamState {
            incarnation,
            content_type,
            json,
            closed: req.closed,
            lifetime,
            lifetime_inherited: inherited,
            created_at_ms: now,
            last_write_ms: now,
            last_touch_ms: now,
            stream_seq: req.stream_seq.clone(),
            producers: BTreeMap::new(),
            fork,
            depth,
            pins: BTreeMap::new(),
            soft_deleted: false,
            own_start,
            data_start: own_start,
            data: crate::bytelog::ByteLog::new(),
            tail: own_start,
            ends,
            ends_cut,
            cut_offset,
            retained,
            snapshot,
            snapshot_object,
            cold: Default::default(),
        };
        let record_start = s.record_next();
        s.push(&req.payload);
        if let Some(p) = &req.producer {
            let mut st = None;
            producer::record(
                &mut st,
                p,
                Receipt {
                    seq: 0,
                    next_offset: s.tail,
                    record_start,
                    record_next: s.record_next(),
                },
            );
            if let Some(st) = st {
                s.producers.insert(p.id.clone(), st);
            }
        }
        let reply = create_reply(&s, true, req, record_start);
        self.buckets.insert(bucket.to_owned());
        self.streams.insert(req.key.clone(), s);
        Ok(Reply::Created(Box::new(reply)))
    }

    fn append(&mut self, now: u64, req: &AppendReq) -> Response {
        self.lapse_if_expired(&req.key, now);
        self.check_not_fenced(&req.key)?;
        let s = self.streams.get_mut(&req.key).ok_or_else(not_found)?;
        if s.soft_deleted {
            return Err(soft_deleted());
        }
        if let Some(i) = req.incarnation
            && i != s.incarnation
        {
            return Err(incarnation_mismatch(Some(s.incarnation)));
        }
        let close_only = req.close && req.payload.is_empty();
        if let Some(p) = &req.producer
            && let Some(Check::Duplicate {
                receipt,
                epoch,
                last_seq,
            }) = producer::find_duplicate(s.producers.get(&p.id), p)
        {
            s.last_touch_ms = now;
            return Ok(Reply::Appended(AppendReply {
                next_offset: receipt.next_offset,
                closed: s.closed,
                duplicate: true,
                producer: Some((epoch, last_seq)),
                json: s.json,
                record_start: receipt.record_start,
                record_next: receipt.record_next,
                incarnation: s.incarnation,
                appended: false,
            }));
        }
        if s.closed {
            if close_only {
                s.last_touch_ms = now;
                let n = s.record_next();
                return Ok(Reply::Appended(AppendReply {
                    next_offset: s.tail,
                    closed: true,
                    duplicate: false,
                    producer: req.producer.as_ref().map(|p| (p.epoch, p.seq)),
                    json: s.json,
                    record_start: n,
                    record_next: n,
                    incarnation: s.incarnation,
                    appended: false,
                }));
            }
            let tail = s.tail;
            return Err(
                Rejection::new(ErrorCode::STREAM_CLOSED, "stream is closed").with(|f| {
                    f.closed = true;
                    f.next_offset = Some(tail);
                }),
            );
        }
        if let Some(p) = &req.producer {
            producer::validate(s.producers.get(&p.id), p)?;
        }
        if let Some(m) = req.record_match {
            if !s.json {
                return Err(Rejection::new(
                    ErrorCode::INVALID_RECORD_BOUNDARIES,
                    "Stream-Record-Match applies only to application/json streams",
                ));
            }
            let n = s.record_next();
            if m != n {
                let tail = s.tail;
                return Err(Rejection::new(
                    ErrorCode::RECORD_PRECONDITION_FAILED,
                    format!("record tail is {n}, not {m}"),
                )
                .with(|f| {
                    f.record_next = Some(n);
                    f.next_offset = Some(tail);
                    f.json = true;
                }));
            }
        }
        if req.payload.is_empty() && !req.close {
            return Err(Rejection::new(
                ErrorCode::EMPTY_APPEND,
                "append body is empty",
            ));
        }
        if !req.payload.is_empty() {
            let ok = req
                .content_type
                .as_deref()
                .is_some_and(|ct| content_type::matches(ct, &s.content_type));
            if !ok {
                let tail = s.tail;
                return Err(Rejection::new(
                    ErrorCode::CONTENT_TYPE_MISMATCH,
                    format!(
                        "content type does not match the stream's {}",
                        s.content_type
                    ),
                )
                .with(|f| f.next_offset = Some(tail)));
            }
        }
        if let Some(seq) = &req.stream_seq
            && s.stream_seq
                .as_ref()
                .is_some_and(|old| seq.as_bytes() <= old.as_bytes())
        {
            let tail = s.tail;
            return Err(Rejection::new(
                ErrorCode::STREAM_SEQ_CONFLICT,
                "Stream-Seq is not greater than the last one",
            )
            .with(|f| f.next_offset = Some(tail)));
        }
        let record_start = s.record_next();
        s.push(&req.payload);
        if let Some(seq) = &req.stream_seq {
            s.stream_seq = Some(seq.clone());
        }
        s.closed |= req.close;
        s.last_touch_ms = now;
        s.last_write_ms = now;
        let record_next = s.record_next();
        if let Some(p) = &req.producer {
            let mut st = s.producers.remove(&p.id);
            producer::record(
                &mut st,
                p,
                Receipt {
                    seq: p.seq,
                    next_offset: s.tail,
                    record_start,
                    record_next,
                },
            );
            if let Some(st) = st {
                s.producers.insert(p.id.clone(), st);
            }
        }
        Ok(Reply::Appended(AppendReply {
            next_offset: s.tail,
            closed: s.closed,
            duplicate: false,
            producer: req.producer.as_ref().map(|p| (p.epoch, p.seq)),
            json: s.json,
            record_start,
            record_next,
            incarnation: s.incarnation,
            appended: !req.payload.is_empty(),
        }))
    }

    fn delete(&mut self, now: u64, key: &StreamKey, inc: Option<Incarnation>) -> Response {
        self.lapse_if_expired(key, now);
        self.check_not_fenced(key)?;
        let s = self.streams.get(key).ok_or_else(not_found)?;
        if s.soft_deleted {
            return Err(soft_deleted());
        }
        if let Some(i) = inc
            && i != s.incarnation
        {
            return Err(incarnation_mismatch(Some(s.incarnation)));
        }
        self.remove_or_soft_delete(key);
        Ok(Reply::Done)
    }

    fn pin(&mut self, now: u64, req: &PinReq) -> Response {
        self.lapse_if_expired(&req.source, now);
        let s = self.streams.get_mut(&req.source).ok_or_else(|| {
            Rejection::new(
                ErrorCode::FORK_SOURCE_NOT_FOUND,
                "fork source stream not found",
            )
        })?;
        if s.soft_deleted {
            return Err(Rejection::new(
                ErrorCode::FORK_SOURCE_SOFT_DELETED,
                "fork source stream was deleted",
            ));
        }
        if let Some(ct) = &req.content_type
            && !content_type::matches(ct, &s.content_type)
        {
            return Err(Rejection::new(
                ErrorCode::CONTENT_TYPE_MISMATCH,
                format!(
                    "fork content type does not match the source's {}",
                    s.content_type
                ),
            ));
        }
        let anchor = req.anchor.unwrap_or(s.tail);
        if anchor > s.tail {
            return Err(Rejection::new(
                ErrorCode::INVALID_FORK_OFFSET,
                format!("fork offset {anchor} is beyond the source tail {}", s.tail),
            ));
        }
        if anchor < s.retained {
            let r = s.retained;
            return Err(Rejection::new(
                ErrorCode::STREAM_GONE,
                format!("fork offset {anchor} is before the retained history ({r})"),
            )
            .with(|f| {
                f.earliest_offset = Some(r);
                f.next_offset = Some(r);
            }));
        }
        let overshoot = || {
            Rejection::new(
                ErrorCode::INVALID_FORK_SUB_OFFSET,
                "fork sub-offset goes beyond the source's data",
            )
        };
        let (point, record_at_point) = if s.json {
            let r_a = s.record_at(anchor).ok_or_else(|| {
                Rejection::new(
                    ErrorCode::INVALID_FORK_OFFSET,
                    format!("fork offset {anchor} is not a message boundary"),
                )
            })?;
            let r = r_a
                .checked_add(req.sub)
                .filter(|r| *r <= s.record_next())
                .ok_or_else(overshoot)?;
            (s.offset_of_record(r).ok_or_else(overshoot)?, r)
        } else {
            let p = anchor
                .checked_add(req.sub)
                .filter(|p| *p <= s.tail)
                .ok_or_else(overshoot)?;
            (p, 0)
        };
        let snapshot = match &s.snapshot {
            Some(v) if v.offset > point && s.retained > 0 => {
                return Err(s.snapshot_conflict(format!(
                    "the source's history before its snapshot at {} is trimmed, so a fork at {point} \
                     could not be rebuilt",
                    v.offset
                )));
            }
            Some(v) if v.offset <= point => s.inheritable_snapshot(),
            _ => None,
        };
        if s.depth + 1 > MAX_FORK_DEPTH {
            return Err(Rejection::new(
                ErrorCode::FORK_DEPTH_EXCEEDED,
                format!("fork chains are limited to {MAX_FORK_DEPTH} levels"),
            ));
        }
        s.pins.insert(
            req.pin_id,
            Pin {
                fork_key: req.fork_key.clone(),
                point,
                deadline_ms: req.deadline_ms,
                floor: s.retained,
            },
        );
        let upto = s.ends.partition_point(|e| *e <= point);
        Ok(Reply::Pinned(Box::new(PinnedSource {
            pin_id: req.pin_id,
            deadline_ms: req.deadline_ms,
            source_incarnation: s.incarnation,
            content_type: s.content_type.clone(),
            lifetime: s.lifetime,
            anchor,
            point,
            record_at_point,
            retained: s.retained,
            depth: s.depth + 1,
            ends_prefix: s.ends[..upto].to_vec(),
            ends_cut: s.ends_cut,
            cut_offset: s.cut_offset,
            snapshot,
        })))
    }

    /// Live (not expired, not soft-deleted) stream counts per bucket.
    pub fn bucket_stream_count(&self, bucket: &str, now_ms: u64) -> usize {
        self.streams
            .iter()
            .filter(|(k, s)| k.bucket() == bucket && !s.soft_deleted && !s.expired(now_ms))
            .count()
    }
}

/// What a fork takes over from its source besides bytes: the message index of the prefix,
/// the retained offset and the visible snapshot (forks.md §9.1).
#[derive(Default)]
struct Inherited {
    ends: Vec<u64>,
    ends_cut: u64,
    cut_offset: u64,
    retained: u64,
    snapshot: Option<crate::snapshot::Snapshot>,
}

impl Inherited {
    fn of(p: &PinnedSource) -> Self {
        Inherited {
            ends: p.ends_prefix.clone(),
            ends_cut: p.ends_cut,
            cut_offset: p.cut_offset,
            retained: p.retained,
            snapshot: p.snapshot.clone(),
        }
    }
}

fn incarnation_mismatch(current: Option<Incarnation>) -> Rejection {
    let msg = match current {
        Some(_) => "the stream is another incarnation",
        None => "the stream does not exist",
    };
    Rejection::new(ErrorCode::INCARNATION_MISMATCH, msg).with(|f| f.incarnation = current)
}

fn same_config(s: &StreamState, req: &CreateReq) -> bool {
    let ct = req
        .content_type
        .as_deref()
        .unwrap_or("application/octet-stream");
    content_type::matches(ct, &s.content_type)
        && req.closed == s.closed
        && req.lifetime == s.lifetime
}

fn same_fork(s: &StreamState, req: &CreateReq, f: &ForkCreate) -> bool {
    let Some(link) = &s.fork else { return false };
    if link.source != f.source {
        return false;
    }
    if let Some(a) = f.anchor
        && (a != link.anchor || f.sub != link.sub)
    {
        return false;
    }
    if let Some(ct) = &req.content_type
        && !content_type::matches(ct, &s.content_type)
    {
        return false;
    }
    let lifetime_ok = if req.lifetime.is_none() {
        s.lifetime_inherited || s.lifetime.is_none()
    } else {
        req.lifetime == s.lifetime
    };
    lifetime_ok && req.closed == s.closed
}

fn create_reply(s: &StreamState, created: bool, req: &CreateReq, record_start: u64) -> CreateReply {
    CreateReply {
        created,
        content_type: s.content_type.clone(),
        tail: s.tail,
        incarnation: s.incarnation,
        lifetime: s.lifetime,
        closed: s.closed,
        json: s.json,
        producer: req.producer.as_ref().map(|p| (p.epoch, p.seq)),
        record_start: if created {
            record_start
        } else {
            s.record_next()
        },
        record_next: s.record_next(),
    }
}
