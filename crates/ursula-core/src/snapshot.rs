//! Snapshots (extensions.md §6): the digest, the visible snapshot of a stream, and the
//! publish and delete checks, run inside the state machine so they are linearizable.
//!
//! A stream keeps only its latest snapshot. The blob travels inline in the replicated
//! command and lives in the stream state (there is no cold backend yet).

use crate::command::{At, PublishSnapshotReq, Reply, Response, SnapshotReply};
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
        let offset = match req.at {
            At::Offset(o) => o,
            At::Record(n) => self.publish_record_offset(n)?,
        };
        // Steps 6-7: the key (offset, digest) comes before every other state check.
        if let Some(v) = &self.snapshot {
            if v.offset == offset && v.digest == req.digest {
                return Ok(self.snapshot_reply(offset, req.digest));
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
        if let Some(m) = &req.snapshot_match
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
        self.snapshot = Some(Snapshot {
            offset,
            content_type: req.content_type.clone(),
            digest: req.digest,
            blob: req.blob.clone(),
        });
        Ok(self.snapshot_reply(offset, req.digest))
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
    }
}
