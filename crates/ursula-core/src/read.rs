//! What a read may see, decided here only (the server asks, then renders): whether a direct
//! request finds a stream ([`GroupState::lookup`]: lapse, soft delete, bucket fences), and
//! where the bytes of a range live across a fork chain ([`plan_chain`]: own pieces, then the
//! source's below the fork point, each source checked against the incarnation the fork
//! pinned).
//!
//! A fork chain may cross groups, and each group has its own state: [`plan_chain`] takes a
//! `step` that looks one stream up (the caller takes that stream's group state briefly, once
//! per step) and does the walk itself.

use crate::cold::Piece;
use crate::error::{ErrorCode, Rejection};
use crate::group::GroupState;
use crate::ids::{Incarnation, StreamKey};
use crate::stream::StreamState;

impl StreamState {
    /// Whether listings and direct requests at `now_ms` see the stream (not deleted, not
    /// lapsed).
    pub fn visible(&self, now_ms: u64) -> bool {
        !self.soft_deleted && !self.expired(now_ms)
    }

    /// Whether the stream's lifetime lapsed at `now_ms` and its expiry is still to be
    /// applied (upkeep proposes it).
    pub fn lapse_due(&self, now_ms: u64) -> bool {
        !self.soft_deleted && self.expired(now_ms)
    }
}

impl GroupState {
    /// Whether this group knows `bucket` (created here, or holding one of its streams), and
    /// whether it is fenced (being purged). A bucket exists when some group knows it and none
    /// fences it.
    pub fn bucket_facts(&self, bucket: &str) -> (bool, bool) {
        let known =
            self.buckets.contains(bucket) || self.streams.keys().any(|k| k.bucket() == bucket);
        (known, self.fenced.contains(bucket))
    }

    /// The stream a direct request at `now_ms` reaches: `404 STREAM_NOT_FOUND` when it does
    /// not exist or its lifetime lapsed, `404 BUCKET_NOT_FOUND` when its bucket is being
    /// purged, `410 STREAM_SOFT_DELETED` when it was deleted (or lapsed) and is kept only for
    /// its forks.
    pub fn lookup(&self, key: &StreamKey, now_ms: u64) -> Result<&StreamState, Rejection> {
        let Some(s) = self.streams.get(key) else {
            return Err(if self.fenced.contains(key.bucket()) {
                Rejection::new(ErrorCode::BUCKET_NOT_FOUND, "bucket not found")
            } else {
                Rejection::new(ErrorCode::STREAM_NOT_FOUND, "stream not found")
            });
        };
        let lapsed = s.expired(now_ms);
        if s.soft_deleted || (lapsed && !s.pins.is_empty()) {
            Err(Rejection::new(
                ErrorCode::STREAM_SOFT_DELETED,
                "stream was deleted and is kept only for its forks",
            ))
        } else if lapsed {
            Err(Rejection::new(
                ErrorCode::STREAM_NOT_FOUND,
                "stream not found",
            ))
        } else {
            Ok(s)
        }
    }
}

/// One stream's part of a planned read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanStep {
    /// The first offset this stream supplies (its own start, or the range's start).
    pub lo: u64,
    /// Its pieces of `[lo, hi)`, in order.
    pub pieces: Vec<Piece>,
    /// The fork source that supplies the bytes below `lo`, and the incarnation it must be.
    pub source: Option<(StreamKey, Incarnation)>,
}

impl StreamState {
    /// This stream's part of a read of `[start, hi)`: its own bytes from
    /// `max(start, own_start)`; `None` when it no longer holds them (retention trimmed them
    /// since the caller looked; never below a fork's pin) or, for a fork's source, when it is
    /// not the `incarnation` the fork pinned.
    pub fn plan_step(
        &self,
        incarnation: Option<Incarnation>,
        start: u64,
        hi: u64,
    ) -> Option<PlanStep> {
        if incarnation.is_some_and(|i| i != self.incarnation) {
            return None;
        }
        let lo = start.max(self.own_start).min(hi);
        let mut pieces = Vec::new();
        if lo < hi && !self.plan_own(lo, hi, &mut pieces) {
            return None;
        }
        Some(PlanStep {
            lo,
            pieces,
            source: self
                .fork
                .as_ref()
                .map(|l| (l.source.clone(), l.source_incarnation)),
        })
    }
}

/// Where the bytes `[start, end)` of `key` live, in offset order, each piece tagged with what
/// `step` returned for the stream that owns it (the server's group id). `step(key,
/// incarnation, start, hi)` looks the stream up and returns its
/// [`StreamState::plan_step`]`(incarnation, start, hi)`. `410 STREAM_GONE` when a stream of the chain no
/// longer holds its part.
pub fn plan_chain<G: Copy>(
    key: &StreamKey,
    start: u64,
    end: u64,
    mut step: impl FnMut(&StreamKey, Option<Incarnation>, u64, u64) -> Option<(G, PlanStep)>,
) -> Result<Vec<(G, Piece)>, Rejection> {
    let gone = || {
        Rejection::new(
            ErrorCode::STREAM_GONE,
            "inherited history is no longer available",
        )
    };
    // Walk down the fork chain from the newest bytes: each stream owns `[lo, hi)`.
    let mut parts: Vec<(G, Vec<Piece>)> = Vec::new();
    let mut key = key.clone();
    let mut incarnation = None;
    let mut hi = end;
    while start < hi {
        let (tag, s) = step(&key, incarnation, start, hi).ok_or_else(gone)?;
        parts.push((tag, s.pieces));
        if start >= s.lo {
            break;
        }
        let (source, inc) = s.source.ok_or_else(|| {
            Rejection::new(
                ErrorCode::INTERNAL_ERROR,
                "stream has no bytes below its start",
            )
        })?;
        key = source;
        incarnation = Some(inc);
        hi = s.lo;
    }
    Ok(parts
        .into_iter()
        .rev()
        .flat_map(|(g, pieces)| pieces.into_iter().map(move |p| (g, p)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn hot(b: &[u8]) -> Piece {
        Piece::Hot(Bytes::copy_from_slice(b))
    }

    #[test]
    fn the_chain_is_walked_down_and_read_in_order() {
        // fork (own bytes from 4) <- source (own bytes from 0).
        let (fork, source) = (StreamKey::new("b", "fork"), StreamKey::new("b", "src"));
        let got = plan_chain(&fork, 1, 6, |k, inc, start, hi| {
            if *k == fork {
                assert_eq!(inc, None);
                Some((
                    1u32,
                    PlanStep {
                        lo: start.max(4),
                        pieces: vec![hot(&b"efgh"[..(hi - 4) as usize])],
                        source: Some((source.clone(), Incarnation(7))),
                    },
                ))
            } else {
                assert_eq!((inc, start, hi), (Some(Incarnation(7)), 1, 4));
                Some((
                    2u32,
                    PlanStep {
                        lo: start,
                        pieces: vec![hot(b"bcd")],
                        source: None,
                    },
                ))
            }
        })
        .unwrap();
        assert_eq!(got, vec![(2, hot(b"bcd")), (1, hot(b"ef"))]);
    }

    #[test]
    fn a_missing_link_is_gone() {
        let k = StreamKey::new("b", "s");
        let e = plan_chain::<u32>(&k, 0, 3, |_, _, _, _| None).unwrap_err();
        assert_eq!(e.code, ErrorCode::STREAM_GONE);
        let none = plan_chain::<u32>(&k, 3, 3, |_, _, _, _| unreachable!()).unwrap();
        assert!(none.is_empty());
    }
}
