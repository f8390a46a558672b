//! Snapshots (extensions.md §6): the digest, the visible snapshot of a stream, and the
//! publish and delete checks, run inside the state machine so they are linearizable.
//!
//! A stream keeps only its latest snapshot. Without a cold backend the blob travels inline in
//! the replicated command and lives in the stream state; with one, the blob is a cold object
//! and the state holds a [`ColdSnapshotRef`] (`StreamState::snapshot_object`).

use crate::command::{
    At, PublishColdSnapshotReq, PublishSnapshotReq, Reply, Response, SnapshotReply,
};
use crate::error::{ErrorCode, Rejection};
use crate::stream::StreamState;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Largest blob a single-request publish accepts (`Ursula-Max-Snapshot-Request-Bytes`).
pub const MAX_SNAPSHOT_REQUEST_BYTES: u64 = 128 * 1024 * 1024;

/// A snapshot digest: BLAKE3 over `u64_le(len(ct)) || ct || blob` (extensions.md §6.3).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    /// The digest of a snapshot with normalized content type `ct` and body `blob`.
    pub fn of(ct: &str, blob: &[u8]) -> Digest {
        let mut h = blake3::Hasher::new();
        h.update(&(ct.len() as u64).to_le_bytes());
        h.update(ct.as_bytes());
        h.update(blob);
        Digest(*h.finalize().as_bytes())
    }

    /// Whether `text` (a `Stream-Snapshot-Match` value) names this digest. Hex case is
    /// ignored; anything that is not this digest's hex form does not match.
    pub fn matches_text(&self, text: &str) -> bool {
        text.trim().eq_ignore_ascii_case(&self.to_string())
    }
}

/// A [`Digest`] computed over a blob that arrives in pieces (a multi-part commit's copy).
#[derive(Debug, Clone)]
pub struct DigestBuilder(blake3::Hasher);

impl DigestBuilder {
    pub fn new(ct: &str) -> Self {
        let mut h = blake3::Hasher::new();
        h.update(&(ct.len() as u64).to_le_bytes());
        h.update(ct.as_bytes());
        DigestBuilder(h)
    }

    pub fn update(&mut self, piece: &[u8]) {
        self.0.update(piece);
    }

    pub fn finish(&self) -> Digest {
        Digest(*self.0.finalize().as_bytes())
    }
}

impl Digest {
    /// Parses the 64-lowercase-hex form (`Stream-Snapshot-Digest` of a commit).
    pub fn parse(text: &str) -> Option<Digest> {
        let b = text.as_bytes();
        if b.len() != 64
            || !b
                .iter()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
        {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, o) in out.iter_mut().enumerate() {
            *o = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Digest(out))
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({self})")
    }
}

/// The visible snapshot of a stream: immutable at its offset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub offset: u64,
    /// Normalized snapshot content type (independent of the stream's).
    pub content_type: String,
    pub digest: Digest,
    pub blob: Bytes,
}

/// Where a cold snapshot's blob lives: the key of its object (a `USNP` object, or a `UMAN`
/// manifest of `USNP` pieces for a committed multi-part upload) and the blob's length.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColdSnapshotRef {
    pub key: String,
    pub len: u64,
}

/// Longest blob that may stand for a [`ColdSnapshotRef`] in a fork's inherited snapshot.
const REF_BLOB_MAX: usize = 1024;

impl ColdSnapshotRef {
    /// A fork inherits its source's snapshot as a [`Snapshot`] (whose schema-1 layout the log
    /// holds inside fork creates). For a cold snapshot that snapshot's `blob` carries this
    /// reference instead of the bytes: `"{len} {key}"`. Such a blob never hashes to the
    /// snapshot's digest, which is how [`ColdSnapshotRef::from_inherited`] tells it apart from
    /// a real blob.
    pub fn as_inherited(&self, s: &Snapshot) -> Snapshot {
        Snapshot {
            blob: Bytes::from(format!("{} {}", self.len, self.key)),
            ..s.clone()
        }
    }

    /// Splits an inherited snapshot back into its metadata and its cold reference.
    pub fn from_inherited(s: Snapshot) -> (Snapshot, Option<ColdSnapshotRef>) {
        if s.blob.is_empty()
            || s.blob.len() > REF_BLOB_MAX
            || Digest::of(&s.content_type, &s.blob) == s.digest
        {
            return (s, None);
        }
        let parsed = std::str::from_utf8(&s.blob).ok().and_then(|t| {
            let (len, key) = t.split_once(' ')?;
            Some(ColdSnapshotRef {
                key: key.to_owned(),
                len: len.parse().ok()?,
            })
        });
        match parsed {
            Some(r) => (
                Snapshot {
                    blob: Bytes::new(),
                    ..s
                },
                Some(r),
            ),
            None => (s, None),
        }
    }
}

impl StreamState {
    /// `(offset, digest)` of the visible snapshot.
    pub fn snapshot_key(&self) -> Option<(u64, Digest)> {
        self.snapshot.as_ref().map(|s| (s.offset, s.digest))
    }

    /// `409 SNAPSHOT_CONFLICT` naming the latest snapshot and the tail (errors.md §2.2).
    pub(crate) fn snapshot_conflict(&self, message: String) -> Rejection {
        let (tail, snapshot) = (self.tail, self.snapshot_key());
        let records = self.json.then(|| (self.record_first(), self.record_next()));
        Rejection::new(ErrorCode::SNAPSHOT_CONFLICT, message).with(|f| {
            f.next_offset = Some(tail);
            f.snapshot = snapshot;
            put_records(f, records);
        })
    }

    /// `410 STREAM_GONE` for an offset (or record) before the retained history.
    pub(crate) fn history_gone(&self, message: String) -> Rejection {
        let retained = self.retained;
        let records = self.json.then(|| (self.record_first(), self.record_next()));
        Rejection::new(ErrorCode::STREAM_GONE, message).with(|f| {
            f.next_offset = Some(retained);
            f.earliest_offset = Some(retained);
            put_records(f, records);
        })
    }

    /// Publishes `req` after every state check of extensions.md §6.2 steps 6-12, in order.
    /// The caller has checked existence and the incarnation (steps 4-5).
    pub(crate) fn publish_snapshot(&mut self, req: &PublishSnapshotReq) -> Response {
        let offset = match self.check_publish(req.at, req.digest, req.snapshot_match.as_deref())? {
            Publish::Repeat(reply) => return Ok(reply),
            Publish::At(offset) => offset,
        };
        self.snapshot = Some(Snapshot {
            offset,
            content_type: req.content_type.clone(),
            digest: req.digest,
            blob: req.blob.clone(),
        });
        self.snapshot_object = None;
        Ok(self.snapshot_reply(offset, req.digest))
    }

    /// Publishes a snapshot whose blob is a cold object, after the same checks; a commit's
    /// parts must belong to the current incarnation (snapshot-parts.md §4.2 Phase C).
    pub(crate) fn publish_cold_snapshot(&mut self, req: &PublishColdSnapshotReq) -> Response {
        if req.parts_incarnation.is_some_and(|i| i != self.incarnation) {
            return Err(Rejection::new(
                ErrorCode::UNKNOWN_SNAPSHOT_PART,
                "the parts belong to an earlier incarnation of the stream",
            ));
        }
        let offset = match self.check_publish(req.at, req.digest, req.snapshot_match.as_deref())? {
            Publish::Repeat(reply) => return Ok(reply),
            Publish::At(offset) => offset,
        };
        self.snapshot = Some(Snapshot {
            offset,
            content_type: req.content_type.clone(),
            digest: req.digest,
            blob: Bytes::new(),
        });
        self.snapshot_object = Some(req.object.clone());
        Ok(self.snapshot_reply(offset, req.digest))
    }

    /// The checks of extensions.md §6.2 steps 6-12, in order: the offset to publish at, or
    /// the reply of a repeat.
    fn check_publish(
        &self,
        at: At,
        digest: Digest,
        snapshot_match: Option<&str>,
    ) -> Result<Publish, Rejection> {
        let offset = match at {
            At::Offset(o) => o,
            At::Record(n) => self.publish_record_offset(n)?,
        };
        // Steps 6-7: the key (offset, digest) comes before every other state check.
        if let Some(v) = &self.snapshot {
            if v.offset == offset && v.digest == digest {
                return Ok(Publish::Repeat(self.snapshot_reply(offset, digest)));
            }
            if v.offset == offset {
                return Err(self.snapshot_conflict(format!(
                    "offset {offset} already holds a snapshot with another content"
                )));
            }
            if v.offset > offset {
                return Err(self.snapshot_conflict(format!(
                    "snapshot offset {offset} is older than the latest snapshot offset {}",
                    v.offset
                )));
            }
        }
        if offset < self.retained {
            return Err(self.history_gone(format!(
                "snapshot offset {offset} is before the retained history (earliest retained \
                 offset {})",
                self.retained
            )));
        }
        if offset > self.tail {
            return Err(self.snapshot_conflict(format!(
                "snapshot offset {offset} is beyond the tail {}",
                self.tail
            )));
        }
        if let Some(m) = snapshot_match
            && !self
                .snapshot
                .as_ref()
                .is_some_and(|v| v.digest.matches_text(m))
        {
            return Err(self.snapshot_conflict(
                "Stream-Snapshot-Match does not name the visible snapshot".into(),
            ));
        }
        if self.json && !self.is_boundary(offset) {
            return Err(Rejection::new(
                ErrorCode::INVALID_SNAPSHOT,
                format!("snapshot offset {offset} is not a message boundary of the JSON stream"),
            ));
        }
        Ok(Publish::At(offset))
    }

    /// The publish checks (extensions.md §6.2 steps 6-12) without publishing, for a commit's
    /// Phase A: `Some(reply)` when the key names the visible snapshot (a repeat), `None`
    /// when a publish at that offset would go ahead.
    pub fn precheck_publish(
        &self,
        at: At,
        digest: Digest,
        snapshot_match: Option<&str>,
    ) -> Result<Option<SnapshotReply>, Rejection> {
        match self.check_publish(at, digest, snapshot_match)? {
            Publish::Repeat(Reply::Snapshot(r)) => Ok(Some(*r)),
            Publish::Repeat(_) => Err(Rejection::new(ErrorCode::INTERNAL_ERROR, "bad reply")),
            Publish::At(_) => Ok(None),
        }
    }

    /// The visible snapshot as a fork inherits it (see [`ColdSnapshotRef::as_inherited`]).
    pub fn inheritable_snapshot(&self) -> Option<Snapshot> {
        let s = self.snapshot.as_ref()?;
        Some(match &self.snapshot_object {
            Some(r) => r.as_inherited(s),
            None => s.clone(),
        })
    }

    /// Resolves `?record=n` of a publish (extensions.md §6.5).
    fn publish_record_offset(&self, n: u64) -> Result<u64, Rejection> {
        if !self.json {
            return Err(not_json());
        }
        let (first, next) = (self.record_first(), self.record_next());
        if n < first {
            return Err(self.history_gone(format!(
                "record {n} is before the first retained record {first}"
            )));
        }
        if n > next {
            return Err(
                self.snapshot_conflict(format!("record {n} is beyond the record tail {next}"))
            );
        }
        self.offset_of_record(n).ok_or_else(|| {
            Rejection::new(ErrorCode::INTERNAL_ERROR, "record index is inconsistent")
        })
    }

    /// `DELETE .../snapshot/{offset}`: this server keeps only the visible snapshot, which
    /// cannot be deleted, so this never changes anything (extensions.md §6.8).
    pub(crate) fn delete_snapshot(&self, offset: u64) -> Response {
        match &self.snapshot {
            Some(v) if v.offset == offset => Err(self.snapshot_conflict(format!(
                "snapshot {offset} is the visible snapshot; publish a newer one to replace it"
            ))),
            _ => Err(Rejection::new(
                ErrorCode::SNAPSHOT_NOT_FOUND,
                format!("no snapshot at offset {offset}"),
            )),
        }
    }

    fn snapshot_reply(&self, offset: u64, digest: Digest) -> Reply {
        Reply::Snapshot(Box::new(SnapshotReply {
            offset,
            digest,
            incarnation: self.incarnation,
            tail: self.tail,
            json: self.json,
            record_first: self.record_first(),
            record_next: self.record_next(),
        }))
    }
}

/// The outcome of the publish checks.
enum Publish {
    /// The key names the visible snapshot: answer as published.
    Repeat(Reply),
    /// Publish at this offset.
    At(u64),
}

/// `400 INVALID_RECORD_BOUNDARIES` for a `?record=` form on a stream that is not JSON.
pub(crate) fn not_json() -> Rejection {
    Rejection::new(
        ErrorCode::INVALID_RECORD_BOUNDARIES,
        "record coordinates apply only to application/json streams",
    )
}

pub(crate) fn put_records(f: &mut crate::error::Facts, records: Option<(u64, u64)>) {
    if let Some((first, next)) = records {
        f.json = true;
        f.record_first = Some(first);
        f.record_next = Some(next);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_covers_type_and_body() {
        let d = Digest::of("application/octet-stream", b"hello");
        let mut h = blake3::Hasher::new();
        h.update(&24u64.to_le_bytes());
        h.update(b"application/octet-stream");
        h.update(b"hello");
        assert_eq!(d.0, *h.finalize().as_bytes());
        assert_eq!(d.to_string().len(), 64);
        assert!(
            d.to_string()
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        );
        assert_ne!(d, Digest::of("application/json", b"hello"));
        assert_ne!(d, Digest::of("application/octet-stream", b"hellO"));
        assert!(d.matches_text(&d.to_string().to_uppercase()));
        assert!(!d.matches_text("x"));
        assert_eq!(Digest::parse(&d.to_string()), Some(d));
        assert_eq!(Digest::parse(&d.to_string().to_uppercase()), None);
        assert_eq!(Digest::parse("ab"), None);
        let mut b = DigestBuilder::new("application/octet-stream");
        b.update(b"he");
        b.update(b"llo");
        assert_eq!(b.finish(), d);
    }

    #[test]
    fn inherited_cold_references_round_trip_and_real_blobs_stay() {
        let real = Snapshot {
            offset: 3,
            content_type: "text/plain".into(),
            digest: Digest::of("text/plain", b"12 snapshots/x"),
            blob: Bytes::from_static(b"12 snapshots/x"),
        };
        // A real blob that looks like a reference is still a real blob: it hashes right.
        assert_eq!(
            ColdSnapshotRef::from_inherited(real.clone()),
            (real.clone(), None)
        );
        let r = ColdSnapshotRef {
            key: "snapshots/b/s/i/x.snap".into(),
            len: 1 << 30,
        };
        let meta = Snapshot {
            blob: Bytes::new(),
            digest: Digest::of("text/plain", b"other"),
            ..real
        };
        let (back, got) = ColdSnapshotRef::from_inherited(r.as_inherited(&meta));
        assert_eq!(back, meta);
        assert_eq!(got, Some(r));
    }
}
