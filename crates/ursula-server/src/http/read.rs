//! Reads: catch-up and long-poll `GET`, and `HEAD` (protocol.md §9-§10).

use super::error::ApiError;
use super::path::Target;
use super::{ApiResult, Resp, headers as h, render, sse};
use crate::app::App;
use crate::metrics::inc;
use axum::body::Body;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use std::sync::Arc;
use std::time::Duration;
use ursula_core::cold::Piece;
use ursula_core::command::{Lifetime, Op};
use ursula_core::ids::Incarnation;
use ursula_core::offset::{self, Off, ReadStart};
use ursula_core::snapshot::{Digest, MAX_SNAPSHOT_REQUEST_BYTES};
use ursula_core::stream::StreamState;
use ursula_core::{ErrorCode, StreamKey, json};

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

/// Looks a stream up for a direct request: `404` when missing or expired, `410` when
/// soft-deleted (or expired while it still has forks).
pub fn view(app: &App, key: &StreamKey, now: u64) -> Result<View, ApiError> {
    let found = app.with_stream(key, |s| {
        if s.soft_deleted || (s.expired(now) && !s.pins.is_empty()) {
            Err(ApiError::new(
                ErrorCode::STREAM_SOFT_DELETED,
                "stream was deleted and is kept only for its forks",
            ))
        } else if s.expired(now) {
            Err(ApiError::new(
                ErrorCode::STREAM_NOT_FOUND,
                "stream not found",
            ))
        } else {
            Ok(View::of(s, now))
        }
    });
    found.unwrap_or_else(|| {
        let fenced = app.with_group(app.group_of(key), |g| g.fenced.contains(key.bucket()));
        Err(if fenced {
            ApiError::new(ErrorCode::BUCKET_NOT_FOUND, "bucket not found")
        } else {
            ApiError::new(ErrorCode::STREAM_NOT_FOUND, "stream not found")
        })
    })
}

/// Where the bytes `[start, end)` of a stream live, following fork links for inherited
/// bytes: `(group of the owning stream, piece)` in offset order. Each owning stream's group
/// lock is taken once, briefly; hot pieces share the stream's memory (no copy).
pub fn plan(
    app: &App,
    key: &StreamKey,
    start: u64,
    end: u64,
) -> Result<Vec<(u32, Piece)>, ApiError> {
    let gone = || {
        ApiError::new(
            ErrorCode::STREAM_GONE,
            "inherited history is no longer available",
        )
    };
    // Walk down the fork chain from the newest bytes: each stream owns `[own_start, hi)`.
    let mut key = key.clone();
    let mut hi = end;
    let mut parts: Vec<(u32, Vec<Piece>)> = Vec::new();
    while start < hi {
        let group = app.group_of(&key);
        let step = app.with_stream(&key, |s| {
            let lo = start.max(s.own_start).min(hi);
            let mut pieces = Vec::new();
            // Retention may have trimmed the bytes since the caller looked (never below a
            // pin).
            let held = lo == hi || s.plan_own(lo, hi, &mut pieces);
            held.then(|| (lo, pieces, s.fork.as_ref().map(|l| l.source.clone())))
        });
        let (lo, pieces, source) = step.flatten().ok_or_else(gone)?;
        parts.push((group, pieces));
        if start < lo {
            key = source.ok_or_else(|| {
                ApiError::new(
                    ErrorCode::INTERNAL_ERROR,
                    "stream has no bytes below its start",
                )
            })?;
            hi = lo;
        } else {
            break;
        }
    }
    Ok(parts
        .into_iter()
        .rev()
        .flat_map(|(g, pieces)| pieces.into_iter().map(move |p| (g, p)))
        .collect())
}

/// Copies the bytes `[start, end)` of a stream into `out`, fetching cold pieces from the
/// cold tier outside any lock.
pub async fn collect(
    app: &App,
    key: &StreamKey,
    start: u64,
    end: u64,
    out: &mut Vec<u8>,
) -> Result<(), ApiError> {
    let pieces = plan(app, key, start, end)?;
    out.reserve((end - start) as usize);
    for (group, piece) in pieces {
        match piece {
            Piece::Hot(b) => out.extend_from_slice(&b),
            Piece::Cold {
                object,
                pos,
                len,
                object_len,
            } => {
                let Some(t) = &app.tiering else {
                    return Err(ApiError::new(
                        ErrorCode::INTERNAL_ERROR,
                        "stream bytes are in a cold tier this node has no backend for",
                    ));
                };
                t.fetch(group, object, pos, len, object_len, out).await?;
            }
        }
    }
    Ok(())
}

/// Query parameters of a read.
#[derive(Debug, Default)]
pub struct ReadQuery {
    pub offset: Option<ReadStart>,
    pub live: Option<Live>,
    pub cursor: Option<String>,
    pub timeout_ms: Option<u64>,
    pub max_bytes: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Live {
    LongPoll,
    Sse,
}

fn bad_query(m: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::INVALID_QUERY, m)
}

pub fn parse_query(q: Option<&str>) -> Result<ReadQuery, ApiError> {
    let mut rq = ReadQuery::default();
    let mut seen_offset = false;
    for pair in q.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, raw) = pair.split_once('=').unwrap_or((pair, ""));
        if !matches!(k, "offset" | "live" | "cursor" | "timeout_ms" | "max_bytes") {
            continue;
        }
        let v = match (k, super::path::pct_decode(&raw.replace('+', " "))) {
            (_, Some(v)) => v,
            ("offset", None) => {
                return Err(ApiError::new(
                    ErrorCode::INVALID_OFFSET,
                    "offset is not valid UTF-8",
                ));
            }
            ("cursor", None) => String::new(),
            (_, None) => return Err(bad_query(format!("{k} is not valid UTF-8"))),
        };
        match k {
            "offset" => {
                if seen_offset {
                    return Err(bad_query("offset given twice"));
                }
                seen_offset = true;
                rq.offset = Some(offset::parse_read_offset(&v).ok_or_else(|| {
                    ApiError::new(ErrorCode::INVALID_OFFSET, format!("invalid offset {v:?}"))
                })?);
            }
            "live" => {
                rq.live = match v.as_str() {
                    "long-poll" => Some(Live::LongPoll),
                    "sse" => Some(Live::Sse),
                    _ => return Err(bad_query(format!("invalid live mode {v:?}"))),
                }
            }
            "cursor" => rq.cursor = Some(v),
            "timeout_ms" => {
                rq.timeout_ms = Some(
                    offset::parse_digits(&v)
                        .ok_or_else(|| bad_query("timeout_ms must be an integer"))?,
                )
            }
            "max_bytes" => {
                rq.max_bytes = Some(
                    offset::parse_digits(&v)
                        .filter(|n| *n >= 1)
                        .ok_or_else(|| bad_query("max_bytes must be an integer >= 1"))?,
                )
            }
            _ => {}
        }
    }
    if rq.live.is_some() && rq.offset.is_none() {
        return Err(bad_query("a live read needs an offset"));
    }
    Ok(rq)
}

/// Whether the client asked for NDJSON over the default JSON array.
fn wants_ndjson(hm: &HeaderMap) -> bool {
    let Some(accept) = hm.get(http::header::ACCEPT).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let mut nd: Option<f32> = None;
    let mut js: f32 = 0.0;
    for item in accept.split(',') {
        let mut parts = item.split(';');
        let ty = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        let q = parts
            .find_map(|p| {
                p.trim()
                    .strip_prefix("q=")
                    .and_then(|q| q.trim().parse::<f32>().ok())
            })
            .unwrap_or(1.0);
        if ty == "application/x-ndjson" {
            nd = Some(nd.map_or(q, |x| x.max(q)));
        } else if ty == "application/json" {
            js = js.max(q);
        }
    }
    nd.is_some_and(|q| q > 0.0 && q >= js)
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
pub fn window_end(app: &App, key: &StreamKey, v: &View, repr: Repr, start: u64, max: u64) -> u64 {
    let limit = start.saturating_add(max).min(v.tail);
    match repr {
        Repr::Bytes => limit,
        Repr::JsonArray | Repr::Ndjson => app
            .with_stream(key, |s| s.boundary_end(start, limit).min(v.tail))
            .unwrap_or(start),
    }
}

/// Builds a catch-up style `200` body for `[start, end)`.
pub async fn body_of(
    app: &App,
    key: &StreamKey,
    repr: Repr,
    start: u64,
    end: u64,
) -> Result<Vec<u8>, ApiError> {
    let mut raw = Vec::new();
    collect(app, key, start, end, &mut raw).await?;
    Ok(match repr {
        Repr::JsonArray => {
            let mut out = Vec::with_capacity(raw.len() + 2);
            json::ndjson_to_array(&raw, &mut out);
            out
        }
        _ => raw,
    })
}

fn etag(v: &View, start: u64, end: u64, repr: Repr) -> String {
    let mut t = format!("\"{}:{}:{}", v.incarnation, Off(start), Off(end));
    if end == v.tail {
        t.push_str(":u");
        if v.closed {
            t.push_str(":c");
        }
    }
    match repr {
        Repr::JsonArray => t.push_str(":a"),
        Repr::Ndjson => t.push_str(":n"),
        Repr::Bytes => {}
    }
    t.push('"');
    t
}

fn if_none_match(hm: &HeaderMap, tag: &str) -> bool {
    hm.get_all(http::header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.split(',').map(str::trim).any(|t| t == tag || t == "*"))
}

/// The cursor of a live response (protocol.md §10.7).
pub fn cursor(next: u64, echoed: Option<&str>) -> String {
    match echoed.and_then(|c| c.parse::<u64>().ok()) {
        Some(c) if c >= next => Off(c.saturating_add(1)).to_string(),
        _ => Off(next).to_string(),
    }
}

fn put_stream_headers(hm: &mut HeaderMap, v: &View, repr: Repr) {
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
        let op = Op::Touch {
            key: key.clone(),
            incarnation: v.incarnation,
        };
        let _ = app.propose(app.group_of(key), op).await;
    }
}

pub async fn get(app: &Arc<App>, target: &Target, req: Request<Body>) -> ApiResult {
    let q = parse_query(req.uri().query())?;
    let hm = req.headers();
    let key = &target.key;
    let v = view(app, key, app.now_ms())?;
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
            return sse::open(app.clone(), target.clone(), v, start, q);
        }
        Some(Live::LongPoll) => {
            return long_poll(app, target, v.incarnation, start, repr, q, hm).await;
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
        window_end(app, key, &v, repr, start, max)
    };
    data_response(app, target, &v, repr, start, end, !now_read, None, hm).await
}

/// A `200` with the bytes `[start, end)`.
#[allow(
    clippy::too_many_arguments,
    reason = "one response, many independent facts"
)]
async fn data_response(
    app: &App,
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
        let body = body_of(app, &target.key, repr, start, end).await?;
        inc(&app.metrics.reads, 1);
        inc(&app.metrics.read_bytes, end - start);
        Response::new(Body::from(body))
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

#[allow(clippy::too_many_arguments, reason = "mirrors data_response")]
async fn long_poll(
    app: &Arc<App>,
    target: &Target,
    opened: Incarnation,
    start: u64,
    repr: Repr,
    q: ReadQuery,
    hm: &HeaderMap,
) -> ApiResult {
    let key = &target.key;
    let echoed = q.cursor.clone().unwrap_or_default();
    let timeout = Duration::from_millis(
        q.timeout_ms
            .unwrap_or(app.cfg.long_poll_timeout_ms)
            .clamp(1, 60_000),
    );
    let mut deadline = tokio::time::Instant::now() + timeout;
    check_waiter_capacity(app)?;
    let _waiter = crate::metrics::Gauge::new(&app.metrics.live_waiters);
    let mut stop = app.shutdown.subscribe();
    // Register before looking again, so no commit can slip between look and wait.
    let mut watch = app.watchers.watch(app.group_of(key), key);
    let mut v = view(app, key, app.now_ms())?;
    touch_if_due(app, key, &v).await;
    loop {
        if v.incarnation != opened {
            return Err(ApiError::new(
                ErrorCode::STREAM_NOT_FOUND,
                "the stream was deleted while the read waited",
            ));
        }
        if start < v.tail {
            let max = q
                .max_bytes
                .unwrap_or(app.cfg.max_read_bytes)
                .min(app.cfg.max_read_bytes);
            let end = window_end(app, key, &v, repr, start, max);
            return data_response(app, target, &v, repr, start, end, true, Some(&echoed), hm)
                .await;
        }
        if v.closed {
            return Ok(no_content(&v, None));
        }
        if tokio::time::Instant::now() >= deadline {
            let c = cursor(v.tail, Some(echoed.as_str()).filter(|c| !c.is_empty()));
            return Ok(no_content(&v, Some(c)));
        }
        // Wake for commits; also every quarter TTL so a waiting reader keeps the stream alive.
        let quarter = v
            .lifetime
            .ttl_s
            .map(|t| Duration::from_millis(t.saturating_mul(1000).div_ceil(4)));
        let wake_at = quarter.map_or(deadline, |q| deadline.min(tokio::time::Instant::now() + q));
        tokio::select! {
            () = watch.changed() => inc(&app.metrics.live_wakeups, 1),
            _ = tokio::time::sleep_until(wake_at) => {}
            // Shutting down: answer now, as a timeout would.
            _ = stop.changed() => deadline = tokio::time::Instant::now(),
        }
        v = view(app, key, app.now_ms())?;
        touch_if_due(app, key, &v).await;
    }
}

/// `503 LIVE_READ_BACKPRESSURE` once the node holds `live_read_max_waiters` live readers.
pub fn check_waiter_capacity(app: &App) -> Result<(), ApiError> {
    let max = app.cfg.live_read_max_waiters;
    let held = app
        .metrics
        .live_waiters
        .load(std::sync::atomic::Ordering::Relaxed)
        + app
            .metrics
            .sse_connections
            .load(std::sync::atomic::Ordering::Relaxed);
    if max > 0 && held >= max {
        return Err(ApiError::new(
            ErrorCode::LIVE_READ_BACKPRESSURE,
            format!("this node already holds {max} live readers; retry"),
        ));
    }
    Ok(())
}

fn no_content(v: &View, cursor: Option<String>) -> Resp {
    let mut r = render::empty(StatusCode::NO_CONTENT);
    let hm = r.headers_mut();
    h::put_off(hm, &h::STREAM_NEXT_OFFSET, v.tail);
    hm.insert(&h::STREAM_UP_TO_DATE, HeaderValue::from_static("true"));
    h::put_incarnation(hm, v.incarnation);
    if v.json {
        h::put(hm, &h::STREAM_EXTENSIONS, h::JSON_RECORDS_EXT);
    }
    match cursor {
        Some(c) => h::put(hm, &h::STREAM_CURSOR, &c),
        None => {
            hm.insert(&h::STREAM_CLOSED, HeaderValue::from_static("true"));
        }
    }
    r
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
        &MAX_SNAPSHOT_REQUEST_BYTES.to_string(),
    );
    Ok(r)
}
