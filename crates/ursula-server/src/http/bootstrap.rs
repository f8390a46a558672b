//! `GET /{bucket}/{stream}/bootstrap` (extensions.md §8): the visible snapshot plus every
//! retained message after it, as one `multipart/mixed` response.

use super::boundary::{self, SuffixScan};
use super::error::ApiError;
use super::path::Target;
use super::pieces::Pieces;
use super::snapshot::put_records;
use super::{ApiResult, headers as h, read};
use crate::app::App;
use axum::body::Body;
use bytes::Bytes;
use http::{HeaderValue, Response};
use std::collections::VecDeque;
use std::sync::Arc;
use ursula_core::ErrorCode;
use ursula_core::ids::Incarnation;
use ursula_core::offset::Off;
use ursula_core::snapshot::Snapshot;

const BOUNDARY_PREFIX: &str = "bootstrap-";
/// The boundary scan yields to other tasks after this many bytes.
const YIELD_EVERY: usize = 4 << 20;

/// What one bootstrap answer is built from, read under one lock so it is consistent.
struct Plan {
    snapshot: Option<Snapshot>,
    /// Where the update parts start: the snapshot offset, else the retained offset.
    start: u64,
    tail: u64,
    /// Message ends in `(start, tail]`: each update part ends at one of them.
    ends: Vec<u64>,
    content_type: String,
    json: bool,
    closed: bool,
    incarnation: Incarnation,
    record_first: u64,
    record_next: u64,
}

/// Answers `GET` (which renews a sliding TTL like any read) and `HEAD` (which does not).
pub async fn get(app: &Arc<App>, target: &Target, query: Option<&str>, touch: bool) -> ApiResult {
    let live = query
        .unwrap_or("")
        .split('&')
        .any(|p| p.split_once('=').map_or(p, |(k, _)| k) == "live");
    if live {
        return Err(ApiError::new(
            ErrorCode::INVALID_QUERY,
            "bootstrap is not live; read it, then continue with a live read from its \
             Stream-Next-Offset",
        ));
    }
    let key = &target.key;
    let v = read::view(app, key, app.now_ms())?;
    let mut object = None;
    let plan = app
        .with_stream(key, |s| {
            object = s.snapshot_object.clone();
            let start = s.snapshot.as_ref().map_or(s.retained, |v| v.offset);
            let lo = s.ends.partition_point(|e| e <= start);
            let hi = s.ends.partition_point(|e| e <= s.tail);
            Plan {
                snapshot: s.snapshot.clone(),
                start,
                tail: s.tail,
                ends: s.ends.to_vec(lo, hi),
                content_type: s.content_type.clone(),
                json: s.json,
                closed: s.closed,
                incarnation: s.incarnation,
                record_first: s.record_first(),
                record_next: s.record_next(),
            }
        })
        .ok_or_else(|| ApiError::new(ErrorCode::STREAM_NOT_FOUND, "stream not found"))?;
    // The boundary must occur in no part. One pass over the bodies, a piece at a time (one
    // cold fetch in memory at once), notes what follows each `--bootstrap-` in them; the
    // answer then streams a second pass. A failing cold store answers `502
    // COLD_STORE_FAILED` during the first pass, before the answer starts.
    let needle = format!("--{BOUNDARY_PREFIX}");
    let mut taken = Vec::new();
    let mut cold_blob = None;
    if let (Some(r), true) = (&object, plan.snapshot.is_some()) {
        let cold = crate::snapshot_store::store_of(app)?;
        taken = crate::snapshot_store::suffixes_after(
            cold.clone(),
            r,
            needle.as_bytes(),
            boundary::RANDOM_HEX,
        )
        .await?;
        cold_blob = Some(futures::StreamExt::boxed(
            crate::snapshot_store::blob_stream(cold, r).await?,
        ));
    }
    let mut scan = SuffixScan::new(needle.as_bytes(), boundary::RANDOM_HEX);
    if let Some(s) = &plan.snapshot {
        scan.feed(&s.blob);
        scan.end_body();
    }
    let mut scanned = 0usize;
    let mut pass = Pieces::pinned(app, key, plan.incarnation, plan.start, plan.tail)?;
    while let Some(piece) = pass.next().await? {
        scan.feed(&piece);
        scanned += piece.len();
        if scanned >= YIELD_EVERY {
            scanned = 0;
            tokio::task::yield_now().await;
        }
    }
    taken.extend(scan.into_found());
    let updates = Pieces::pinned(app, key, plan.incarnation, plan.start, plan.tail)?;
    if touch {
        read::touch_if_due(app, key, &v).await;
    }
    Ok(respond(plan, &taken, updates, cold_blob))
}

/// The update parts: `(start, end)` offsets of each message, or of the rest of the one the
/// start falls into.
fn part_ranges(plan: &Plan) -> Vec<(u64, u64)> {
    let mut out = Vec::with_capacity(plan.ends.len() + 1);
    let mut at = plan.start;
    for &end in &plan.ends {
        out.push((at, end));
        at = end;
    }
    if at < plan.tail {
        out.push((at, plan.tail));
    }
    out
}

/// A cold blob's pieces.
type ColdBlob = futures::stream::BoxStream<'static, Result<Bytes, std::io::Error>>;

fn respond(
    plan: Plan,
    taken: &[Vec<u8>],
    updates: Pieces,
    cold: Option<ColdBlob>,
) -> Response<Body> {
    use futures::StreamExt;
    let boundary = boundary::pick(BOUNDARY_PREFIX, taken);
    let dash = format!("--{boundary}");
    let snapshot_ct = plan
        .snapshot
        .as_ref()
        .map_or("application/octet-stream", |s| s.content_type.as_str());
    let update_ct = if plan.json {
        "application/json"
    } else {
        plan.content_type.as_str()
    };
    let head = format!("{dash}\r\nContent-Type: {snapshot_ct}\r\n\r\n");
    let part_head = Bytes::from(format!("\r\n{dash}\r\nContent-Type: {update_ct}\r\n\r\n"));
    let blob_part = match cold {
        Some(st) => st,
        None => {
            let blob = plan
                .snapshot
                .as_ref()
                .map_or_else(Bytes::new, |s| s.blob.clone());
            futures::stream::iter([Ok(blob)]).boxed()
        }
    };
    let parts = Parts {
        cuts: part_ranges(&plan).into_iter().map(|(a, _)| a).collect(),
        pos: plan.start,
        pending: Bytes::new(),
        part_head,
        pieces: updates,
    };
    let end = Bytes::from(format!("\r\n{dash}--\r\n"));
    let stream = futures::stream::iter([Ok(Bytes::from(head))])
        .chain(blob_part)
        .chain(parts.into_stream())
        .chain(futures::stream::iter([Ok(end)]));
    let mut resp = Response::new(Body::from_stream(stream));
    let hm = resp.headers_mut();
    h::put(
        hm,
        &http::header::CONTENT_TYPE,
        &format!("multipart/mixed; boundary={boundary}"),
    );
    let snapshot_offset = plan
        .snapshot
        .as_ref()
        .map_or_else(|| "-1".to_owned(), |s| Off(s.offset).to_string());
    h::put(hm, &h::STREAM_SNAPSHOT_OFFSET, &snapshot_offset);
    h::put_off(hm, &h::STREAM_NEXT_OFFSET, plan.tail);
    hm.insert(&h::STREAM_UP_TO_DATE, HeaderValue::from_static("true"));
    if plan.closed {
        hm.insert(&h::STREAM_CLOSED, HeaderValue::from_static("true"));
    }
    h::put_incarnation(hm, plan.incarnation);
    put_records(hm, plan.json, plan.record_first, plan.record_next);
    resp
}

/// The update parts of an answer: the stream's bytes with a part head before each message.
struct Parts {
    pieces: Pieces,
    /// Offsets where a part starts, in order.
    cuts: VecDeque<u64>,
    /// Offset of the first byte of `pending`.
    pos: u64,
    pending: Bytes,
    part_head: Bytes,
}

impl Parts {
    async fn next(&mut self) -> Result<Option<Bytes>, ApiError> {
        if self.cuts.front() == Some(&self.pos) {
            self.cuts.pop_front();
            return Ok(Some(self.part_head.clone()));
        }
        if self.pending.is_empty() {
            match self.pieces.next().await? {
                Some(b) => self.pending = b,
                None => return Ok(None),
            }
        }
        let room = self
            .cuts
            .front()
            .map_or(u64::MAX, |c| c - self.pos)
            .min(self.pending.len() as u64);
        self.pos += room;
        Ok(Some(self.pending.split_to(room as usize)))
    }

    fn into_stream(self) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send {
        futures::stream::try_unfold(self, |mut p| async move {
            match p.next().await {
                Ok(Some(b)) => Ok(Some((b, p))),
                Ok(None) => Ok(None),
                Err(e) => Err(std::io::Error::other(e.rejection.message)),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_is_a_part() {
        let plan = |start, tail, ends: Vec<u64>| Plan {
            snapshot: None,
            start,
            tail,
            ends,
            content_type: String::new(),
            json: false,
            closed: false,
            incarnation: Incarnation(0),
            record_first: 0,
            record_next: 0,
        };
        assert_eq!(part_ranges(&plan(2, 9, vec![5, 9])), vec![(2, 5), (5, 9)]);
        assert_eq!(part_ranges(&plan(2, 9, vec![5])), vec![(2, 5), (5, 9)]);
        assert!(part_ranges(&plan(4, 4, vec![])).is_empty());
    }
}
