//! Reads: catch-up and long-poll `GET`, and `HEAD` (protocol.md §9-§10).

use super::error::ApiError;
use super::path::Target;
use super::pieces::{self, Pieces};
use super::query::{Live, parse_query, wants_ndjson};
use super::{ApiResult, headers as h, long_poll, record_read, render, sse};
use crate::app::App;
use crate::metrics::inc;
use axum::body::Body;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use std::sync::Arc;
use ursula_core::cold::Piece;
use ursula_core::command::{Lifetime, Op};
use ursula_core::ids::Incarnation;
use ursula_core::offset::{Off, ReadStart};
use ursula_core::read as read_plan;
use ursula_core::snapshot::Digest;
use ursula_core::stream::StreamState;
use ursula_core::{ErrorCode, StreamKey};

/// The metadata of a stream a read needs, copied out of its group's lock.
#[derive(Debug, Clone)]
pub struct View {
    pub incarnation: Incarnation,
    pub content_type: String,
    pub json: bool,
    pub closed: bool,
    pub tail: u64,
    pub retained: u64,
    pub lifetime: Lifetime,
    pub record_first: u64,
    pub record_next: u64,
    pub touch_due: bool,
    /// `(offset, digest)` of the visible snapshot.
    pub snapshot: Option<(u64, Digest)>,
}

impl View {
    fn of(s: &StreamState, now: u64) -> View {
        View {
            incarnation: s.incarnation,
            content_type: s.content_type.clone(),
            json: s.json,
            closed: s.closed,
            tail: s.tail,
            retained: s.retained,
            lifetime: s.lifetime,
            record_first: s.record_first(),
            record_next: s.record_next(),
            touch_due: s.read_should_touch(now),
            snapshot: s.snapshot_key(),
        }
    }
}

/// Looks a stream up for a direct request (`GroupState::lookup` decides what it may see).
pub fn view(app: &App, key: &StreamKey, now: u64) -> Result<View, ApiError> {
    app.with_group(app.group_of(key), |g| {
        g.lookup(key, now).map(|s| View::of(s, now))
    })
    .map_err(ApiError::from)
}

/// A read plan: `(group of the owning stream, piece)` in offset order.
pub type Plan = Vec<(u32, Piece)>;

/// Where the bytes `[start, end)` of a stream live, following fork links for inherited
/// bytes (`ursula_core::read::plan_chain`): `(group of the owning stream, piece)` in offset
/// order. Each owning stream's group state is read once, briefly; hot pieces share the
/// stream's memory (no copy). `head` pins the incarnation of `key` itself (a stream deleted
/// and created again under the same name is `410`, never read as if it were the old one);
/// also returns the incarnation the plan read (`None` for an empty range).
pub fn plan(
    app: &App,
    key: &StreamKey,
    head: Option<Incarnation>,
    start: u64,
    end: u64,
) -> Result<(Plan, Option<Incarnation>), ApiError> {
    let mut seen = head;
    let pieces = read_plan::plan_chain(key, start, end, |k, incarnation, lo, hi| {
        let group = app.group_of(k);
        // Only the first step (the stream itself) has no pinned incarnation.
        let is_head = incarnation.is_none();
        let pinned = if is_head { head } else { incarnation };
        app.with_stream(k, |s| {
            if is_head {
                seen = Some(s.incarnation);
            }
            s.plan_step(pinned, lo, hi)
        })
        .flatten()
        .map(|step| (group, step))
    })?;
    Ok((pieces, seen))
}

/// Copies the bytes `[start, end)` of a stream into `out`, fetching cold pieces from the
/// cold tier outside any lock (for bounded windows: SSE events, record reads), of the stream's
/// `incarnation` only (`410` if it was deleted and created again meanwhile).
pub async fn collect(
    app: &Arc<App>,
    key: &StreamKey,
    incarnation: Incarnation,
    (start, end): (u64, u64),
    out: &mut Vec<u8>,
) -> Result<(), ApiError> {
    Pieces::pinned(app, key, incarnation, start, end)?
        .read_into(out)
        .await
}

/// Representation of a read response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repr {
    Bytes,
    JsonArray,
    Ndjson,
}

/// `410 STREAM_GONE` for a read that starts before the retained history.
pub fn gone(target: &Target, start: u64, retained: u64) -> ApiError {
    let path = target.bootstrap_path();
    let mut e = ApiError::new(
        ErrorCode::STREAM_GONE,
        format!(
            "offset {start} is before the retained history (earliest retained offset {retained}); \
             read {path} and continue from its Stream-Next-Offset"
        ),
    );
    e.rejection.facts.next_offset = Some(retained);
    e.rejection.facts.earliest_offset = Some(retained);
    e.bootstrap_location = Some(path);
    e
}

/// Resolves and checks a start position; `Now` becomes the tail.
pub fn resolve_start(target: &Target, v: &View, start: ReadStart) -> Result<u64, ApiError> {
    let pos = match start {
        ReadStart::Beginning => 0,
        ReadStart::Now => return Ok(v.tail),
        ReadStart::At(o) => o,
    };
    if pos > v.tail {
        let mut e = ApiError::new(
            ErrorCode::OFFSET_OUT_OF_RANGE,
            format!("offset {pos} is beyond the tail {}", v.tail),
        );
        e.rejection.facts.next_offset = Some(v.tail);
        return Err(e);
    }
    if pos < v.retained || (v.retained > 0 && start == ReadStart::Beginning) {
        return Err(gone(target, pos, v.retained));
    }
    Ok(pos)
}

/// Where a read window ends: whole messages for JSON streams.
pub fn window_end(app: &App, key: &StreamKey, tail: u64, repr: Repr, start: u64, max: u64) -> u64 {
    let limit = start.saturating_add(max).min(tail);
    match repr {
        Repr::Bytes => limit,
        Repr::JsonArray | Repr::Ndjson => app
            .with_stream(key, |s| s.boundary_end(start, limit).min(tail))
            .unwrap_or(start),
    }
}

fn etag(v: &View, start: u64, end: u64, repr: Repr) -> String {
    let view = match repr {
        Repr::JsonArray => ":a",
        Repr::Ndjson => ":n",
        Repr::Bytes => "",
    };
    etag_of(v, start, end, view)
}

/// The ETag of the bytes `[start, end)` in the representation named by `view` (`:a`, `:n`,
/// `:env` or nothing; protocol.md §12.2).
pub(super) fn etag_of(v: &View, start: u64, end: u64, view: &str) -> String {
    let mut t = format!("\"{}:{}:{}", v.incarnation, Off(start), Off(end));
    if end == v.tail {
        t.push_str(":u");
        if v.closed {
            t.push_str(":c");
        }
    }
    t.push_str(view);
    t.push('"');
    t
}

pub(super) fn if_none_match(hm: &HeaderMap, tag: &str) -> bool {
    hm.get_all(http::header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.split(',').map(str::trim).any(|t| t == tag || t == "*"))
}

/// The cursor of a live response (protocol.md §10.7).
pub fn cursor(next: u64, echoed: Option<&str>) -> String {
    Off(cursor_value(
        next,
        echoed.and_then(|c| c.parse::<u64>().ok()),
    ))
    .to_string()
}

/// The cursor after `next` given the one the client echoed: past the echoed one if that is
/// not behind `next`, so that a cursor never repeats (protocol.md §10.7).
pub fn cursor_value(next: u64, echoed: Option<u64>) -> u64 {
    match echoed {
        Some(c) if c >= next => c.saturating_add(1),
        _ => next,
    }
}

pub(super) fn put_stream_headers(hm: &mut HeaderMap, v: &View, repr: Repr) {
    let ct = if repr == Repr::Ndjson {
        "application/x-ndjson"
    } else {
        v.content_type.as_str()
    };
    h::put(hm, &http::header::CONTENT_TYPE, ct);
    h::put_incarnation(hm, v.incarnation);
    if v.json {
        hm.insert(http::header::VARY, HeaderValue::from_static("Accept"));
        h::put(hm, &h::STREAM_EXTENSIONS, h::JSON_RECORDS_EXT);
    }
}

/// Renews a sliding TTL because of a read, at most once per quarter window.
pub async fn touch_if_due(app: &Arc<App>, key: &StreamKey, v: &View) {
    if v.touch_due {
        touch(app, key, v.incarnation).await;
    }
}

/// Renews the sliding TTL of `key` (as incarnation `incarnation`) because of a read.
pub async fn touch(app: &Arc<App>, key: &StreamKey, incarnation: Incarnation) {
    let op = Op::Touch {
        key: key.clone(),
        incarnation,
    };
    let _ = app.propose(app.group_of(key), op).await;
}

pub async fn get(app: &Arc<App>, target: &Target, req: Request<Body>) -> ApiResult {
    let q = parse_query(req.uri().query())?;
    let hm = req.headers();
    let key = &target.key;
    let v = view(app, key, app.now_ms())?;
    if let Some(rq) = q.records {
        return record_read::get(app, target, v, rq, q, hm).await;
    }
    let repr = match (v.json, wants_ndjson(hm)) {
        (false, _) => Repr::Bytes,
        (true, true) => Repr::Ndjson,
        (true, false) => Repr::JsonArray,
    };
    let start_req = q.offset.unwrap_or(ReadStart::Beginning);
    let start = resolve_start(target, &v, start_req)?;
    if repr == Repr::JsonArray && app.with_stream(key, |s| s.is_boundary(start)) == Some(false) {
        return Err(ApiError::new(
            ErrorCode::INVALID_OFFSET,
            format!("offset {start} is inside a JSON message"),
        ));
    }
    match q.live {
        Some(Live::Sse) => {
            touch_if_due(app, key, &v).await;
            return sse::open(app.clone(), target.clone(), v, start, q, None);
        }
        Some(Live::LongPoll) => {
            let max = q
                .max_bytes
                .unwrap_or(app.cfg.max_read_bytes)
                .min(app.cfg.max_read_bytes);
            let echoed = q.cursor.clone().unwrap_or_default();
            let echoed = echoed.as_str();
            let data = |v: View| async move {
                if start >= v.tail {
                    return Ok(None);
                }
                let end = window_end(app, key, v.tail, repr, start, max);
                data_response(app, target, &v, repr, start, end, true, Some(echoed), hm)
                    .await
                    .map(Some)
            };
            return long_poll::wait(
                app,
                target,
                v.incarnation,
                q.timeout_ms,
                q.cursor.as_deref(),
                data,
                long_poll::no_content,
            )
            .await;
        }
        None => {}
    }
    touch_if_due(app, key, &v).await;
    let now_read = start_req == ReadStart::Now;
    let max = q
        .max_bytes
        .unwrap_or(app.cfg.max_read_bytes)
        .min(app.cfg.max_read_bytes);
    let end = if now_read {
        start
    } else {
        window_end(app, key, v.tail, repr, start, max)
    };
    data_response(app, target, &v, repr, start, end, !now_read, None, hm).await
}

/// A `200` with the bytes `[start, end)`.
#[allow(
    clippy::too_many_arguments,
    reason = "one response, many independent facts"
)]
async fn data_response(
    app: &Arc<App>,
    target: &Target,
    v: &View,
    repr: Repr,
    start: u64,
    end: u64,
    with_etag: bool,
    live_cursor: Option<&str>,
    hm: &HeaderMap,
) -> ApiResult {
    let tag = etag(v, start, end, repr);
    let at_tail = end == v.tail;
    let closed = v.closed && at_tail;
    let mut resp = if with_etag && if_none_match(hm, &tag) {
        render::empty(StatusCode::NOT_MODIFIED)
    } else {
        let pieces = Pieces::pinned(app, &target.key, v.incarnation, start, end)?;
        let (body, len) = pieces::body(pieces, repr == Repr::JsonArray).await?;
        inc(&app.metrics.reads, 1);
        inc(&app.metrics.read_bytes, end - start);
        let mut r = Response::new(body);
        if let Some(n) = len {
            h::put_u64(r.headers_mut(), &http::header::CONTENT_LENGTH, n);
        }
        r
    };
    let out = resp.headers_mut();
    put_stream_headers(out, v, repr);
    h::put_off(out, &h::STREAM_NEXT_OFFSET, end);
    if with_etag {
        h::put(out, &http::header::ETAG, &tag);
    }
    if at_tail {
        out.insert(&h::STREAM_UP_TO_DATE, HeaderValue::from_static("true"));
    }
    if closed {
        out.insert(&h::STREAM_CLOSED, HeaderValue::from_static("true"));
    } else if let Some(c) = live_cursor {
        h::put(
            out,
            &h::STREAM_CURSOR,
            &cursor(end, Some(c).filter(|c| !c.is_empty())),
        );
    }
    Ok(resp)
}

pub fn head(app: &Arc<App>, target: &Target, hm: &HeaderMap) -> ApiResult {
    let v = view(app, &target.key, app.now_ms())?;
    let mut tag = format!("\"{}:{}", v.incarnation, Off(v.tail));
    if v.closed {
        tag.push_str(":c");
    }
    tag.push('"');
    let mut r = if if_none_match(hm, &tag) {
        render::empty(StatusCode::NOT_MODIFIED)
    } else {
        render::empty(StatusCode::OK)
    };
    let out = r.headers_mut();
    h::put(out, &http::header::CONTENT_TYPE, &v.content_type);
    h::put_off(out, &h::STREAM_NEXT_OFFSET, v.tail);
    out.insert(&h::STREAM_UP_TO_DATE, HeaderValue::from_static("true"));
    if v.closed {
        out.insert(&h::STREAM_CLOSED, HeaderValue::from_static("true"));
    }
    h::put_lifetime(out, &v.lifetime);
    h::put_incarnation(out, v.incarnation);
    h::put(out, &http::header::ETAG, &tag);
    h::put_off(out, &h::STREAM_RETAINED_OFFSET, v.retained);
    if v.json {
        h::put(out, &h::STREAM_EXTENSIONS, h::JSON_RECORDS_EXT);
        h::put_u64(out, &h::STREAM_RECORD_FIRST, v.record_first);
        h::put_u64(out, &h::STREAM_RECORD_NEXT, v.record_next);
    }
    if let Some((offset, digest)) = v.snapshot {
        h::put_off(out, &h::STREAM_SNAPSHOT_OFFSET, offset);
        h::put(out, &h::STREAM_SNAPSHOT_DIGEST, &digest.to_string());
    }
    h::put(
        out,
        &h::MAX_REQUEST_BYTES_HDR,
        &app.cfg.max_request_bytes.to_string(),
    );
    h::put(
        out,
        &h::MAX_SNAPSHOT_REQUEST_BYTES_HDR,
        &app.snapshot_request_limit().to_string(),
    );
    if app.tiering.is_some() {
        h::put_u64(
            out,
            &super::parts::MAX_SNAPSHOT_BYTES_HDR,
            ursula_core::parts::MAX_SNAPSHOT_BYTES,
        );
    }
    Ok(r)
}
