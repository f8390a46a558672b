//! The state of one Raft group: its streams, buckets and fork outbox, and `apply`.
//!
//! `apply` dispatches here; the stream lifecycle (lapse, delete, remove, purge, unpin) lives in
//! this file, the larger commands in their own: [`create`] (creates and forks), [`append`],
//! [`pin`] (the source side of a fork).

mod append;
mod create;
mod pin;

use crate::cold::{ColdState, ObjectId};
use crate::command::*;
use crate::error::{ErrorCode, Rejection};
use crate::ids::{Incarnation, StreamKey};
use crate::stream::StreamState;
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

pub(super) fn not_found() -> Rejection {
    Rejection::new(ErrorCode::STREAM_NOT_FOUND, "stream not found")
}

pub(super) fn soft_deleted() -> Rejection {
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
            Op::AppendExternal(a) => self.append_external(now, a),
            Op::CreateExternal(c) => self.create_external(log_index, now, c),
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

    /// Live (not expired, not soft-deleted) stream counts per bucket.
    pub fn bucket_stream_count(&self, bucket: &str, now_ms: u64) -> usize {
        self.streams
            .iter()
            .filter(|(k, s)| k.bucket() == bucket && !s.soft_deleted && !s.expired(now_ms))
            .count()
    }
}

pub(super) fn incarnation_mismatch(current: Option<Incarnation>) -> Rejection {
    let msg = match current {
        Some(_) => "the stream is another incarnation",
        None => "the stream does not exist",
    };
    Rejection::new(ErrorCode::INCARNATION_MISMATCH, msg).with(|f| f.incarnation = current)
}
