//! Reading a stream's bytes piece by piece (cluster.md §6.3): one short look at the owning
//! groups' state makes a plan, then the bytes come out of it one piece at a time, outside any
//! lock. Hot pieces share the stream's memory; cold pieces are fetched from the cold tier a
//! bounded piece at a time ([`crate::tiering::FETCH_PIECE`]), so a long read holds about one
//! piece in memory per reader instead of the whole answer.
//!
//! Catch-up bodies stream from a [`Pieces`] (see [`body`]); bootstrap streams its update
//! parts from one; SSE and long-poll collect bounded windows with [`super::read::collect`],
//! which drains one.

use super::error::ApiError;
use super::read::plan;
use crate::app::App;
use crate::tiering::FetchError;
use axum::body::Body;
use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::Arc;
use ursula_core::cold::Piece;
use ursula_core::ids::Incarnation;
use ursula_core::{ErrorCode, StreamKey};

/// How many times a read plans again after an object it planned was deleted.
const REPLANS: u32 = 2;

/// The bytes `[start, end)` of a stream, handed out in order.
pub struct Pieces {
    app: Arc<App>,
    key: StreamKey,
    pos: u64,
    end: u64,
    plan: VecDeque<(u32, Piece)>,
    /// Fetched cold bytes not yet handed out (one fetch yields a slice per chunk block);
    /// `pos` is already past them.
    ready: VecDeque<Bytes>,
    replans: u32,
    /// The incarnation of `key` the read is of: a re-plan never reads another one.
    incarnation: Option<Incarnation>,
}

impl Pieces {
    /// Plans a read of the stream's `incarnation` only: `410 STREAM_GONE` if the bytes are
    /// no longer held or `key` is another incarnation now.
    pub fn pinned(
        app: &Arc<App>,
        key: &StreamKey,
        incarnation: Incarnation,
        start: u64,
        end: u64,
    ) -> Result<Self, ApiError> {
        let (pieces, incarnation) = plan(app, key, Some(incarnation), start, end)?;
        Ok(Pieces {
            plan: pieces.into(),
            ready: VecDeque::new(),
            app: app.clone(),
            key: key.clone(),
            pos: start,
            end,
            replans: 0,
            incarnation,
        })
    }

    /// Bytes not yet handed out.
    pub fn remaining(&self) -> u64 {
        let ready: usize = self.ready.iter().map(Bytes::len).sum();
        self.end - self.pos + ready as u64
    }

    /// Whether every remaining piece is hot or fetched (so [`Pieces::next`] cannot fail).
    pub fn all_hot(&self) -> bool {
        self.plan.iter().all(|(_, p)| matches!(p, Piece::Hot(_)))
    }

    /// The next bytes, `None` at the end. A cold object deleted since the plan was made (GC
    /// after a retention advance or a delete) makes the rest of the read plan again, which
    /// answers `410` if the bytes are gone; missing again on fresh plans is a lost object.
    pub async fn next(&mut self) -> Result<Option<Bytes>, ApiError> {
        if let Some(b) = self.ready.pop_front() {
            return Ok(Some(b));
        }
        while self.pos < self.end {
            let Some((group, piece)) = self.plan.pop_front() else {
                return Err(ApiError::new(
                    ErrorCode::INTERNAL_ERROR,
                    "a read plan ended before the range it was made for",
                ));
            };
            let (object, pos, len, object_len) = match piece {
                Piece::Hot(b) if b.is_empty() => continue,
                Piece::Hot(b) => {
                    self.pos += b.len() as u64;
                    return Ok(Some(b));
                }
                Piece::Cold {
                    object,
                    pos,
                    len,
                    object_len,
                } => (object, pos, len, object_len),
            };
            match self.fetch(group, object, (pos, len, object_len)).await {
                Ok((take, pieces)) => {
                    if take < len {
                        let rest = Piece::Cold {
                            object,
                            pos: pos + take,
                            len: len - take,
                            object_len,
                        };
                        self.plan.push_front((group, rest));
                    }
                    self.pos += take;
                    self.ready = pieces.into();
                    if let Some(b) = self.ready.pop_front() {
                        return Ok(Some(b));
                    }
                }
                Err(FetchError::Missing) if self.replans < REPLANS => {
                    self.replans += 1;
                    let (pieces, _) =
                        plan(&self.app, &self.key, self.incarnation, self.pos, self.end)?;
                    self.plan = pieces.into();
                }
                Err(FetchError::Missing) => {
                    tracing::error!(stream = ?self.key, pos = self.pos, end = self.end,
                        "a referenced cold object is missing");
                    if let Some(t) = &self.app.tiering {
                        t.health.note_missing_object();
                    }
                    return Err(ApiError::new(
                        ErrorCode::COLD_STORE_FAILED,
                        "a cold object these bytes live in is missing from the store",
                    ));
                }
                Err(FetchError::Failed(e)) => return Err(e),
            }
        }
        Ok(None)
    }

    async fn fetch(
        &self,
        group: u32,
        object: ursula_core::cold::ObjectId,
        range: (u64, u64, u64),
    ) -> Result<(u64, Vec<Bytes>), FetchError> {
        let Some(t) = &self.app.tiering else {
            return Err(FetchError::Failed(ApiError::new(
                ErrorCode::INTERNAL_ERROR,
                "stream bytes are in a cold tier this node has no backend for",
            )));
        };
        let namespace = self.app.with_group(group, |g| g.cold.namespace);
        let mut out = Vec::new();
        let took = t.fetch((namespace, group), object, range, &mut out).await?;
        Ok((took, out))
    }

    /// Drains the rest into `out`.
    pub async fn read_into(&mut self, out: &mut Vec<u8>) -> Result<(), ApiError> {
        out.reserve(self.remaining() as usize);
        while let Some(b) = self.next().await? {
            out.extend_from_slice(&b);
        }
        Ok(())
    }

    /// The rest as a stream of bytes; an error cuts the stream (the client sees a body
    /// shorter than its `Content-Length`, never wrong bytes).
    pub fn into_stream(
        self,
    ) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
        futures::stream::try_unfold(self, |mut p| async move {
            match p.next().await {
                Ok(Some(b)) => Ok(Some((b, p))),
                Ok(None) => Ok(None),
                Err(e) => {
                    tracing::warn!(stream = ?p.key, pos = p.pos, error = %e.rejection.message,
                        "a streamed read failed after its answer started");
                    Err(std::io::Error::other(e.rejection.message))
                }
            }
        })
    }
}

/// Turns NDJSON into the JSON array view piece by piece, the way
/// [`ursula_core::json::ndjson_to_array`] does for a whole body: `[`, the non-empty lines
/// joined by `,`, `]`.
#[derive(Debug, Default)]
pub struct ArrayView {
    /// Inside a line (its first byte was written).
    in_line: bool,
    /// A line was written.
    any: bool,
}

impl ArrayView {
    /// The first bytes of the answer.
    pub fn open() -> Bytes {
        Bytes::from_static(b"[")
    }

    /// The array bytes for the next NDJSON piece.
    pub fn piece(&mut self, ndjson: &[u8]) -> Bytes {
        let mut out = Vec::with_capacity(ndjson.len() + 1);
        for run in ndjson.split_inclusive(|b| *b == b'\n') {
            let (body, ends) = match run.split_last() {
                Some((b'\n', body)) => (body, true),
                _ => (run, false),
            };
            if !body.is_empty() {
                if !self.in_line && self.any {
                    out.push(b',');
                }
                out.extend_from_slice(body);
                self.in_line = true;
                self.any = true;
            }
            if ends {
                self.in_line = false;
            }
        }
        Bytes::from(out)
    }

    /// The last bytes of the answer.
    pub fn close() -> Bytes {
        Bytes::from_static(b"]")
    }
}

/// A catch-up body of `[start, end)`: hot reads hand the stream's own memory to the socket
/// (no copy); reads that touch the cold tier fetch their first piece before the answer starts
/// (so a failing store answers `502 COLD_STORE_FAILED`), then stream the rest. `array` turns
/// NDJSON into the JSON array view. Returns the body and, when known, its length.
pub async fn body(mut p: Pieces, array: bool) -> Result<(Body, Option<u64>), ApiError> {
    use futures::StreamExt;
    let len = p.remaining();
    if !array && p.plan.len() == 1 && p.all_hot() {
        let b = p.next().await?.unwrap_or_default();
        return Ok((Body::from(b), Some(len)));
    }
    // Up to and including the first cold piece (hot pieces before it, e.g. bytes before an
    // external payload, are shared memory), so that a failing store answers before the
    // answer starts.
    let mut first = Vec::new();
    while !p.all_hot() {
        let cold_next = p
            .plan
            .iter()
            .find(|(_, x)| !matches!(x, Piece::Hot(b) if b.is_empty()))
            .is_some_and(|(_, x)| matches!(x, Piece::Cold { .. }));
        match p.next().await? {
            Some(b) => first.push(Ok(b)),
            None => break,
        }
        if cold_next {
            break;
        }
    }
    let head = futures::stream::iter(first);
    if !array {
        let s = head.chain(p.into_stream());
        return Ok((Body::from_stream(s), Some(len)));
    }
    let mut view = ArrayView::default();
    let s = head
        .chain(p.into_stream())
        .map(move |r| r.map(|b| view.piece(&b)));
    let open = futures::stream::iter([Ok(ArrayView::open())]);
    let close = futures::stream::iter([Ok(ArrayView::close())]);
    Ok((Body::from_stream(open.chain(s).chain(close)), None))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn array_of(pieces: &[&[u8]]) -> Vec<u8> {
        let mut v = ArrayView::default();
        let mut out = ArrayView::open().to_vec();
        for p in pieces {
            out.extend_from_slice(&v.piece(p));
        }
        out.extend_from_slice(&ArrayView::close());
        out
    }

    #[test]
    fn the_array_view_joins_lines() {
        assert_eq!(array_of(&[]), b"[]");
        assert_eq!(array_of(&[b"1\n2\n"]), b"[1,2]");
        assert_eq!(
            array_of(&[b"{\"a\"", b":1}\n", b"\n2", b"\n"]),
            b"[{\"a\":1},2]"
        );
    }

    proptest! {
        #[test]
        fn piecewise_equals_whole(lines in prop::collection::vec("[a-z0-9]{0,6}", 0..8),
                                  cuts in prop::collection::vec(0usize..64, 0..6)) {
            let mut nd = Vec::new();
            for l in &lines {
                nd.extend_from_slice(l.as_bytes());
                nd.push(b'\n');
            }
            let mut whole = Vec::new();
            ursula_core::json::ndjson_to_array(&nd, &mut whole);
            let mut at: Vec<usize> = cuts.iter().map(|c| c % (nd.len() + 1)).collect();
            at.sort_unstable();
            let mut pieces = Vec::new();
            let mut prev = 0;
            for c in at {
                pieces.push(&nd[prev..c]);
                prev = c;
            }
            pieces.push(&nd[prev..]);
            prop_assert_eq!(array_of(&pieces), whole);
        }
    }
}
