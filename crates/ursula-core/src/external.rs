//! External payloads (cluster.md §6.4): an append or create body large enough to go to the
//! cold tier before it is proposed, so the Raft log carries a reference, not the bytes.
//!
//! The node that takes the request writes the body as an object of its own (an id with
//! [`ObjectId::EXTERNAL_BIT`] set, chosen at random: uploads run concurrently and may commit
//! in any order, so they cannot take ids from [`ColdState::next_object`]), then proposes
//! [`Op::AppendExternal`](crate::Op) or [`Op::CreateExternal`](crate::Op). Applying it runs
//! every check of a plain append or create; if the payload is appended, the object becomes
//! one chunk reference of the stream, exactly like a flushed chunk (same refcounts, same GC,
//! same fork pins). If the command is refused, or appends nothing (a producer duplicate, an
//! idempotent re-create), the same apply queues the object for GC, so a committed command
//! never leaves an orphan. An upload whose command never commits is left to the sweep of the
//! server (docs/storage.md).
//!
//! # Where an external payload sits in a stream
//!
//! A stream's own held bytes are its chunk references ([`ColdChunks`], offset order, never
//! overlapping) and its hot bytes ([`ByteLog`](crate::bytelog::ByteLog)). References end at
//! or below `data_start` (flushed bytes) or start above it (external payloads appended after
//! hot bytes that are not flushed yet): the hot region `[data_start, tail)` is hot bytes with
//! external references in between, and the byte log holds only the hot bytes. `data_start`
//! always sits on a hot byte or at the tail ([`StreamState::settle_hot_start`]), so the hot
//! bytes from `data_start` up to the next reference are what a flush may move.

use crate::cold::{ChunkRef, ColdState, ObjectId, ObjectUse};
use crate::command::{AppendReq, CreateReq, Response};
use crate::error::{ErrorCode, Rejection};
use crate::stream::StreamState;
use serde::{Deserialize, Serialize};

impl ObjectId {
    /// Set in the id of every external payload object (never reached by flush ids).
    pub const EXTERNAL_BIT: u64 = 1 << 63;

    /// Whether this is an external payload object.
    pub fn is_external(self) -> bool {
        self.0 & Self::EXTERNAL_BIT != 0
    }
}

/// Where an uploaded payload is, and what core needs to know of its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExternalPayload {
    /// The group's namespace the object was written under (see [`ColdState::namespace`]).
    pub namespace: u64,
    /// The object (its id has [`ObjectId::EXTERNAL_BIT`] set).
    pub object: ObjectId,
    /// Payload bytes (the canonical body; NDJSON for JSON streams).
    pub len: u64,
    /// Bytes of the whole object on the store (payload plus framing).
    pub object_size: u64,
    /// JSON streams: the end of every message, relative to the payload's first byte, in
    /// increasing order, the last one `len` (the byte after each newline of the canonical
    /// NDJSON). Empty for other streams.
    pub ends: Vec<u64>,
}

/// An append whose body is an external payload (`req.payload` is empty).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExternalAppend {
    pub req: AppendReq,
    pub payload: ExternalPayload,
}

/// A create whose initial body is an external payload (`req.payload` is empty).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExternalCreate {
    pub req: CreateReq,
    pub payload: ExternalPayload,
}

/// The body of an append or create as the apply sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Body<'a> {
    Inline(&'a [u8]),
    External(&'a ExternalPayload),
}

impl Body<'_> {
    pub(crate) fn len(&self) -> u64 {
        match self {
            Body::Inline(b) => b.len() as u64,
            Body::External(x) => x.len,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl ExternalPayload {
    /// Whether the reference is well formed for a stream (`json`): a deterministic check, so
    /// every replica refuses the same commands.
    pub(crate) fn well_formed(&self, json: bool) -> bool {
        if self.len == 0 || !self.object.is_external() {
            return false;
        }
        if !json {
            return self.ends.is_empty();
        }
        let increasing = self.ends.windows(2).all(|w| w[0] < w[1]);
        increasing
            && self.ends.first().is_some_and(|e| *e > 0)
            && self.ends.last() == Some(&self.len)
    }
}

pub(crate) fn malformed() -> Rejection {
    Rejection::new(
        ErrorCode::INTERNAL_ERROR,
        "the external payload reference is malformed",
    )
}

impl StreamState {
    /// Index in `cold` of the first reference above the hot start (an external payload
    /// inside the hot region), or the number of references when there is none.
    pub(crate) fn first_ahead(&self) -> usize {
        self.cold.partition_point(|c| c.end <= self.data_start)
    }

    /// Hot bytes in `[data_start, x)`, for an `x` of the hot region that is not inside an
    /// external payload.
    pub(crate) fn hot_before(&self, x: u64) -> u64 {
        let mut n = x.saturating_sub(self.data_start);
        for c in self.cold.range_from(self.first_ahead()) {
            if c.start >= x {
                break;
            }
            n = n.saturating_sub(c.end.min(x) - c.start);
        }
        n
    }

    /// Moves `data_start` past external payloads that start at (or span) it, so that it sits
    /// on a hot byte or at the tail.
    pub(crate) fn settle_hot_start(&mut self) {
        while let Some(c) = self.cold.get(self.first_ahead()) {
            if c.start > self.data_start {
                break;
            }
            self.data_start = c.end;
        }
    }

    /// Appends an external payload: one reference to its object, message ends as given.
    /// The caller checked [`ExternalPayload::well_formed`].
    pub(crate) fn push_external(&mut self, x: &ExternalPayload) {
        let start = self.tail;
        self.cold.push_ref(ChunkRef {
            start,
            end: start + x.len,
            object: x.object,
            pos: 0,
            object_len: x.len,
        });
        self.tail += x.len;
        if self.json {
            self.ends.extend(x.ends.iter().map(|e| start + e));
        } else {
            self.ends.push(self.tail);
        }
        self.settle_hot_start();
    }

    /// Appends `body` (inline bytes or an external payload) and its message ends; a new
    /// external reference is counted in `cold`.
    pub(crate) fn push_body(&mut self, body: Body<'_>, cold: &mut ColdState) {
        match body {
            Body::Inline(b) => self.push(b),
            Body::External(x) => {
                self.push_external(x);
                cold.objects.insert(x.object, ObjectUse { refs: 1 });
            }
        }
    }
}

impl crate::group::GroupState {
    /// Checks that an external payload may be applied to this group at all: its namespace
    /// is this group's (adopted if the group has none yet) and its id is fresh.
    fn admit_external(&mut self, x: &ExternalPayload) -> Result<(), Rejection> {
        if self.cold.namespace == 0 {
            self.cold.namespace = x.namespace;
        }
        if x.namespace != self.cold.namespace {
            return Err(Rejection::new(
                ErrorCode::LEADER_UNAVAILABLE,
                "the payload was written under another cold namespace (leadership changed); retry",
            ));
        }
        if self.cold.objects.contains_key(&x.object) || self.cold.gc.contains(&x.object) {
            return Err(Rejection::new(
                ErrorCode::INTERNAL_ERROR,
                "the external payload object is already known",
            ));
        }
        Ok(())
    }

    /// Queues `x`'s object for deletion if the apply did not reference it.
    fn settle_external(&mut self, x: &ExternalPayload) {
        if !self.cold.objects.contains_key(&x.object) {
            self.cold.gc.insert(x.object);
        }
    }

    pub(crate) fn append_external(&mut self, now: u64, a: &ExternalAppend) -> Response {
        self.admit_external(&a.payload)?;
        let r = match a.req.payload.is_empty() {
            true => self.append_body(now, &a.req, Body::External(&a.payload)),
            false => Err(malformed()),
        };
        self.settle_external(&a.payload);
        r
    }

    pub(crate) fn create_external(
        &mut self,
        log_index: u64,
        now: u64,
        c: &ExternalCreate,
    ) -> Response {
        self.admit_external(&c.payload)?;
        let r = match c.req.payload.is_empty() {
            true => self.create_body(log_index, now, &c.req, Body::External(&c.payload)),
            false => Err(malformed()),
        };
        self.settle_external(&c.payload);
        r
    }
}
