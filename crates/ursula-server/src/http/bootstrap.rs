//! `GET /{bucket}/{stream}/bootstrap` (extensions.md §8): the visible snapshot plus every
//! retained message after it, as one `multipart/mixed` response.

use super::error::ApiError;
use super::path::Target;
use super::snapshot::put_records;
use super::{ApiResult, headers as h, read};
use crate::app::App;
use axum::body::Body;
use bytes::Bytes;
use http::{HeaderValue, Response};
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use ursula_core::ErrorCode;
use ursula_core::ids::Incarnation;
use ursula_core::offset::Off;
use ursula_core::snapshot::Snapshot;

const BOUNDARY_PREFIX: &str = "bootstrap-";
/// Answers whose parts hold at least this many bytes are assembled off the async workers.
const SCAN_INLINE_MAX: usize = 1 << 20;

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
            let lo = s.ends.partition_point(|e| *e <= start);
            let hi = s.ends.partition_point(|e| *e <= s.tail);
            Plan {
                snapshot: s.snapshot.clone(),
                start,
                tail: s.tail,
                ends: s.ends[lo..hi].to_vec(),
                content_type: s.content_type.clone(),
                json: s.json,
                closed: s.closed,
                incarnation: s.incarnation,
                record_first: s.record_first(),
                record_next: s.record_next(),
            }
        })
        .ok_or_else(|| ApiError::new(ErrorCode::STREAM_NOT_FOUND, "stream not found"))?;
    // A cold snapshot's blob is streamed from the cold store piece by piece (`502
    // COLD_STORE_FAILED` if it fails before the answer starts), after one pass over its
    // pieces that notes where it holds `--bootstrap-`, so the boundary avoids it too.
    let mut cold_blob = None;
    if let (Some(r), true) = (&object, plan.snapshot.is_some()) {
        let cold = crate::snapshot_store::store_of(app)?;
        let needle = format!("--{BOUNDARY_PREFIX}");
        let taken =
            crate::snapshot_store::suffixes_after(cold.clone(), r, needle.as_bytes(), 32).await?;
        let stream = crate::snapshot_store::blob_stream(cold, r).await?;
        cold_blob = Some((taken, futures::StreamExt::boxed(stream)));
    }
    let mut data = Vec::new();
    read::collect(app, key, plan.start, plan.tail, &mut data).await?;
    if touch {
        read::touch_if_due(app, key, &v).await;
    }
    let data = Bytes::from(data);
    let scanned = data.len() + plan.snapshot.as_ref().map_or(0, |s| s.blob.len());
    if scanned < SCAN_INLINE_MAX {
        return Ok(respond(plan, data, cold_blob));
    }
    // Choosing the boundary scans every byte once: keep that off the async workers.
    tokio::task::spawn_blocking(move || respond(plan, data, cold_blob))
        .await
        .map_err(|_| ApiError::new(ErrorCode::INTERNAL_ERROR, "building the bootstrap failed"))
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

/// A cold blob: the bytes after each `--bootstrap-` in it, and its pieces.
type ColdBlob = (
    Vec<Vec<u8>>,
    futures::stream::BoxStream<'static, Result<Bytes, std::io::Error>>,
);

fn respond(plan: Plan, data: Bytes, cold: Option<ColdBlob>) -> Response<Body> {
    let ranges = part_ranges(&plan);
    let piece =
        |(a, b): (u64, u64)| data.slice((a - plan.start) as usize..(b - plan.start) as usize);
    let blob = plan
        .snapshot
        .as_ref()
        .map_or_else(Bytes::new, |s| s.blob.clone());
    let (taken, cold_stream) = match cold {
        Some((t, st)) => (t, Some(st)),
        None => (Vec::new(), None),
    };
    let boundary = pick_boundary(&[&blob, &data], &taken);
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
    let part_head = format!("\r\n{dash}\r\nContent-Type: {update_ct}\r\n\r\n");
    let mut chunks = vec![];
    for r in ranges {
        chunks.push(Bytes::from(part_head.clone()));
        chunks.push(piece(r));
    }
    chunks.push(Bytes::from(format!("\r\n{dash}--\r\n")));
    let ok = |v: Vec<Bytes>| futures::stream::iter(v.into_iter().map(Ok::<_, std::io::Error>));
    let blob_part = match cold_stream {
        Some(st) => st,
        None => futures::StreamExt::boxed(ok(vec![blob])),
    };
    let stream = futures::StreamExt::chain(
        futures::StreamExt::chain(ok(vec![Bytes::from(head)]), blob_part),
        ok(chunks),
    );
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

/// A `bootstrap-` + 32 random hex boundary that occurs in none of the bodies.
fn pick_boundary(bodies: &[&[u8]], also_taken: &[Vec<u8>]) -> String {
    let state = RandomState::new();
    let mut n = 0u64;
    choose_boundary(bodies, also_taken, || {
        n += 1;
        let (a, b) = (state.hash_one(n), state.hash_one(!n));
        format!("{a:016x}{b:016x}")
    })
}

/// The first candidate (`bootstrap-` + `next()`) that occurs in none of the bodies. Every
/// occurrence of `--bootstrap-` in a body is noted first, so the bytes are scanned once.
fn choose_boundary(
    bodies: &[&[u8]],
    also_taken: &[Vec<u8>],
    mut next: impl FnMut() -> String,
) -> String {
    let needle = format!("--{BOUNDARY_PREFIX}");
    let mut taken: Vec<&[u8]> = also_taken.iter().map(Vec::as_slice).collect();
    for body in bodies {
        for at in find_all(body, needle.as_bytes()) {
            taken.push(&body[at + needle.len()..]);
        }
    }
    loop {
        let hex = next();
        if !taken.iter().any(|t| t.starts_with(hex.as_bytes())) {
            return format!("{BOUNDARY_PREFIX}{hex}");
        }
    }
}

/// Start positions of `needle` in `hay` (non-empty needle).
fn find_all(hay: &[u8], needle: &[u8]) -> Vec<usize> {
    let Some((&first, rest)) = needle.split_first() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(p) = hay
        .get(i..)
        .and_then(|h| h.iter().position(|b| *b == first))
    {
        let at = i + p;
        if hay.get(at + 1..at + needle.len()) == Some(rest) {
            out.push(at);
        }
        i = at + 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_every_occurrence() {
        assert_eq!(find_all(b"abcabcab", b"ab"), vec![0, 3, 6]);
        assert_eq!(find_all(b"aaa", b"aa"), vec![0, 1]);
        assert!(find_all(b"", b"x").is_empty());
    }

    #[test]
    fn boundary_avoids_the_bodies() {
        let b = pick_boundary(&[b"hello", b""], &[]);
        assert!(b.starts_with(BOUNDARY_PREFIX) && b.len() == BOUNDARY_PREFIX.len() + 32);
        assert!(
            b[BOUNDARY_PREFIX.len()..]
                .bytes()
                .all(|c| c.is_ascii_hexdigit())
        );
        let first = "0".repeat(32);
        let second = "1".repeat(32);
        let body = format!("x\r\n--{BOUNDARY_PREFIX}{first}\r\n");
        let mut candidates = [first.clone(), second.clone()].into_iter();
        let chosen = choose_boundary(&[b"", body.as_bytes()], &[], || {
            candidates.next().unwrap_or_default()
        });
        assert_eq!(chosen, format!("{BOUNDARY_PREFIX}{second}"));
        let mut candidates = [first.clone(), second.clone()].into_iter();
        let chosen = choose_boundary(&[], &[first.clone().into_bytes()], || {
            candidates.next().unwrap_or_default()
        });
        assert_eq!(
            chosen,
            format!("{BOUNDARY_PREFIX}{second}"),
            "a cold blob's occurrences"
        );
    }
}
