//! The replicated command model: what the Raft log carries and what applying it answers.
//!
//! Every command is stamped by the leader with `now_ms` (wall-clock milliseconds), so
//! applying a command is deterministic on every replica and during recovery.

use crate::cold::{FlushReq, ObjectId};
use crate::error::Rejection;
use crate::external::{ExternalAppend, ExternalCreate};
use crate::ids::{Incarnation, StreamKey};
use crate::snapshot::{ColdSnapshotRef, Digest, Snapshot};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// One Raft log payload.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Command {
    pub now_ms: u64,
    pub op: Op,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Op {
    /// Acknowledge a bucket (replicated to every group).
    CreateBucket {
        bucket: String,
    },
    /// Delete an empty bucket (replicated to every group).
    DeleteBucket {
        bucket: String,
    },
    Create(Box<CreateReq>),
    Append(Box<AppendReq>),
    Delete {
        key: StreamKey,
        incarnation: Option<Incarnation>,
    },
    /// Renew a sliding TTL because of a read.
    Touch {
        key: StreamKey,
        incarnation: Incarnation,
    },
    /// Remove (or soft-delete) a stream whose lifetime lapsed.
    Expire {
        key: StreamKey,
        incarnation: Incarnation,
    },
    /// Record a pin on a fork source and describe the fork point (source's group).
    Pin(Box<PinReq>),
    /// Release a pin (source's group); cascades clean-up of soft-deleted sources.
    Unpin {
        key: StreamKey,
        pin_id: u64,
    },
    /// Drop a delivered outbox item (fork's group).
    OutboxDone {
        id: u64,
    },
    /// A command that only advances the log (used to test the write path).
    Noop,
    // New variants go last: bincode encodes the variant index, and the log holds old ones.
    /// Publish a snapshot (extensions.md §6.2, §6.5).
    PublishSnapshot(Box<PublishSnapshotReq>),
    /// Delete a snapshot: always refused, but checked in order with publishes (§6.8).
    DeleteSnapshot {
        key: StreamKey,
        offset: u64,
        incarnation: Option<Incarnation>,
    },
    /// Advance retention (extensions.md §7).
    Retain {
        key: StreamKey,
        at: At,
        incarnation: Option<Incarnation>,
    },
    /// Erase every stream of a bucket and fence its ID (replicated to every group;
    /// `__compat_v1` is emptied but never fenced).
    PurgeBucket {
        bucket: String,
    },
    /// Publish an uploaded cold object's slices as chunk references (cluster.md §6.2).
    ColdFlush(Box<FlushReq>),
    /// Forget cold objects the leader deleted (cluster.md §6.5).
    ColdGcDone {
        objects: Vec<ObjectId>,
    },
    /// Publish a snapshot whose blob is already a cold object (a single-request publish on a
    /// node with a cold backend, or a committed multi-part upload; snapshot-parts.md §4).
    PublishColdSnapshot(Box<PublishColdSnapshotReq>),
    /// An append whose body was written to the cold tier first (cluster.md §6.4).
    AppendExternal(Box<ExternalAppend>),
    /// A create whose initial body was written to the cold tier first (cluster.md §6.4).
    CreateExternal(Box<ExternalCreate>),
}

/// Which streams' live readers a command may concern (see [`Op::affects`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Affects<'a> {
    /// No stream's tail, incarnation or existence changes.
    Nothing,
    /// At most this stream changes.
    Stream(&'a StreamKey),
    /// Any number of streams may change (bucket purges).
    Everything,
}

impl Op {
    /// Which live readers applying this command may concern: a reader waiting on a stream
    /// needs waking only for commands that may change that stream's tail, closed flag,
    /// incarnation or existence. Over-reporting is harmless (a woken reader re-checks).
    pub fn affects(&self) -> Affects<'_> {
        match self {
            Op::Create(r) => Affects::Stream(&r.key),
            Op::Append(r) => Affects::Stream(&r.key),
            Op::AppendExternal(r) => Affects::Stream(&r.req.key),
            Op::CreateExternal(r) => Affects::Stream(&r.req.key),
            Op::PublishSnapshot(r) => Affects::Stream(&r.key),
            Op::PublishColdSnapshot(r) => Affects::Stream(&r.key),
            // A pin may lapse an expired source; an unpin may remove a soft-deleted one (the
            // cascade up a fork chain goes through further `Unpin`s).
            Op::Pin(r) => Affects::Stream(&r.source),
            Op::Unpin { key, .. }
            | Op::Delete { key, .. }
            | Op::Touch { key, .. }
            | Op::Expire { key, .. }
            | Op::Retain { key, .. }
            | Op::DeleteSnapshot { key, .. } => Affects::Stream(key),
            Op::PurgeBucket { .. } => Affects::Everything,
            Op::CreateBucket { .. }
            | Op::DeleteBucket { .. }
            | Op::OutboxDone { .. }
            | Op::ColdFlush(_)
            | Op::ColdGcDone { .. }
            | Op::Noop => Affects::Nothing,
        }
    }

    /// Bytes of payload the command carries (bodies and snapshot blobs), for batching. An
    /// external payload's bytes are not carried: only its message ends are.
    pub fn payload_len(&self) -> usize {
        match self {
            Op::Append(r) => r.payload.len(),
            Op::Create(r) => {
                let pinned = r.fork.as_ref().and_then(|f| f.pinned.as_ref());
                r.payload.len()
                    + pinned.map_or(0, |p| p.ends_prefix.len() * 8)
                    + pinned
                        .and_then(|p| p.snapshot.as_ref())
                        .map_or(0, |s| s.blob.len())
            }
            Op::PublishSnapshot(r) => r.blob.len(),
            Op::AppendExternal(r) => r.payload.ends.len() * 8,
            Op::CreateExternal(r) => r.payload.ends.len() * 8,
            _ => 0,
        }
    }
}

/// Where a snapshot or retention boundary lies: a byte offset, or a JSON record ordinal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum At {
    Offset(u64),
    Record(u64),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PublishSnapshotReq {
    pub key: StreamKey,
    pub incarnation: Option<Incarnation>,
    pub at: At,
    /// Normalized snapshot content type.
    pub content_type: String,
    /// Digest of `content_type` and `blob`, computed by the node that received the request.
    pub digest: Digest,
    /// `Stream-Snapshot-Match`, when sent (trimmed, never empty).
    pub snapshot_match: Option<String>,
    pub blob: Bytes,
}

/// A publish whose blob is the cold object `object` (snapshot-parts.md §4.2 Phase C).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishColdSnapshotReq {
    pub key: StreamKey,
    /// `Stream-Incarnation`, when sent.
    pub incarnation: Option<Incarnation>,
    /// The incarnation the committed parts belong to: a stream recreated meanwhile is never
    /// published to (`400 UNKNOWN_SNAPSHOT_PART`). `None` for a single-request publish.
    pub parts_incarnation: Option<Incarnation>,
    pub at: At,
    pub content_type: String,
    pub digest: Digest,
    pub snapshot_match: Option<String>,
    pub object: ColdSnapshotRef,
}

/// Idempotent-producer headers of a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerHdr {
    pub id: String,
    pub epoch: u64,
    pub seq: u64,
}

/// Sliding TTL or absolute expiry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lifetime {
    pub ttl_s: Option<u64>,
    pub expires_at_ms: Option<u64>,
}

impl Lifetime {
    pub fn is_none(&self) -> bool {
        self.ttl_s.is_none() && self.expires_at_ms.is_none()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CreateReq {
    pub key: StreamKey,
    /// Normalized request content type; `None` when the header was absent.
    pub content_type: Option<String>,
    pub closed: bool,
    pub lifetime: Lifetime,
    pub stream_seq: Option<String>,
    pub producer: Option<ProducerHdr>,
    pub incarnation: Option<Incarnation>,
    /// Canonical initial payload (NDJSON for JSON streams).
    pub payload: Bytes,
    /// Number of JSON messages in `payload` (JSON streams only).
    pub messages: u64,
    pub fork: Option<ForkCreate>,
}

impl CreateReq {
    /// A plain create of `key` with every option at its default: no content type, no payload,
    /// no lifetime, producer, `Stream-Seq`, incarnation check or fork. Set fields with struct
    /// update syntax: `CreateReq { closed: true, ..CreateReq::new(key) }`.
    pub fn new(key: StreamKey) -> Self {
        CreateReq {
            key,
            content_type: None,
            closed: false,
            lifetime: Lifetime::default(),
            stream_seq: None,
            producer: None,
            incarnation: None,
            payload: Bytes::new(),
            messages: 0,
            fork: None,
        }
    }
}

/// The fork part of a create: what the request asked and what the source pinned.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ForkCreate {
    pub source: StreamKey,
    pub anchor: Option<u64>,
    pub sub: u64,
    /// Present when the source was pinned for this request; absent when the target
    /// was seen to exist already (then only the idempotency comparison runs).
    pub pinned: Option<PinnedSource>,
}

/// What the source's group answered to a pin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinnedSource {
    pub pin_id: u64,
    pub deadline_ms: u64,
    pub source_incarnation: Incarnation,
    pub content_type: String,
    pub lifetime: Lifetime,
    /// The anchor actually used (the tail when the request had none).
    pub anchor: u64,
    /// The fork point `P`.
    pub point: u64,
    /// Record ordinal at `P` (JSON sources).
    pub record_at_point: u64,
    pub retained: u64,
    pub depth: u32,
    /// Message end offsets of the inherited prefix `[cut_offset, point)`.
    pub ends_prefix: Vec<u64>,
    /// Message ends the source's retention dropped before `ends_prefix` (record ordinals).
    pub ends_cut: u64,
    /// Where record `ends_cut` starts.
    pub cut_offset: u64,
    /// The source's visible snapshot when it lies at or below the fork point.
    pub snapshot: Option<Snapshot>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PinReq {
    pub source: StreamKey,
    pub fork_key: StreamKey,
    pub pin_id: u64,
    pub deadline_ms: u64,
    pub anchor: Option<u64>,
    pub sub: u64,
    /// Request content type, when given, must match the source's.
    pub content_type: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AppendReq {
    pub key: StreamKey,
    /// Normalized request content type, `None` when absent.
    pub content_type: Option<String>,
    pub close: bool,
    pub stream_seq: Option<String>,
    pub producer: Option<ProducerHdr>,
    pub incarnation: Option<Incarnation>,
    pub record_match: Option<u64>,
    pub payload: Bytes,
    pub messages: u64,
}

impl AppendReq {
    /// A plain append of `payload` to `key` with every option at its default (no content
    /// type, close, `Stream-Seq`, producer, incarnation or record check; no JSON messages).
    pub fn new(key: StreamKey, payload: Bytes) -> Self {
        AppendReq {
            key,
            content_type: None,
            close: false,
            stream_seq: None,
            producer: None,
            incarnation: None,
            record_match: None,
            payload,
            messages: 0,
        }
    }
}

/// What applying a command answers.
pub type Response = Result<Reply, Rejection>;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    Done,
    Created(Box<CreateReply>),
    Appended(AppendReply),
    Pinned(Box<PinnedSource>),
    /// A fork target was absent although the request carried no pin: pin, then retry.
    NeedsPin,
    /// A snapshot publish succeeded (or repeated the visible snapshot).
    Snapshot(Box<SnapshotReply>),
    Retained(RetainReply),
    /// Streams a purge removed in this group.
    Purged {
        removed: u64,
    },
}

/// The facts a `204` of a snapshot publish reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotReply {
    pub offset: u64,
    pub digest: Digest,
    pub incarnation: Incarnation,
    pub tail: u64,
    pub json: bool,
    pub record_first: u64,
    pub record_next: u64,
}

/// The facts a `204` of a retention request reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetainReply {
    /// The retained offset after the request (unchanged for a no-op).
    pub retained: u64,
    pub incarnation: Incarnation,
    pub json: bool,
    pub record_first: u64,
    pub record_next: u64,
    /// Bytes of memory the request released (0 for a no-op).
    pub freed_bytes: u64,
}

/// The facts a create answer (201 or 200) reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateReply {
    pub created: bool,
    pub content_type: String,
    pub tail: u64,
    pub incarnation: Incarnation,
    pub lifetime: Lifetime,
    pub closed: bool,
    pub json: bool,
    pub producer: Option<(u64, u64)>,
    pub record_start: u64,
    pub record_next: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppendReply {
    pub next_offset: u64,
    pub closed: bool,
    pub duplicate: bool,
    /// (epoch, seq) echoed when producer headers were sent.
    pub producer: Option<(u64, u64)>,
    pub json: bool,
    pub record_start: u64,
    pub record_next: u64,
    pub incarnation: Incarnation,
    /// True when a body was appended (decides 200 vs 204 for producers).
    pub appended: bool,
}
