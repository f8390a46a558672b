//! Record-aware reads of JSON streams (extensions.md §11.6-§11.8): catch-up and long-poll
//! here, SSE in `sse.rs`. The rules live in `ursula_core::records`; this module takes the
//! window under the group's lock, copies its canonical bytes outside it and renders a view.

use super::error::ApiError;
use super::long_poll;
use super::path::Target;
use super::query::{Live, ReadQuery, wants_ndjson};
use super::read::{self, View, if_none_match, put_stream_headers, touch_if_due};
use super::{ApiResult, headers as h, render, sse};
use crate::app::App;
use crate::metrics::inc;
use axum::body::Body;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use std::sync::Arc;
use ursula_core::records::{RecordQuery, RecordStart, RecordWindow, envelope_into};
use ursula_core::{ErrorCode, Incarnation, json};

/// The envelope view of a catch-up or long-poll read.
pub const ENVELOPE_CT: &str = "application/vnd.durable-stream-records+ndjson";

/// How the records of a response are represented (extensions.md §11.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordView {
    /// One JSON array (the default).
    Array,
    /// The canonical lines (`Accept: application/x-ndjson`).
    Ndjson,
    /// `{"record":n,"value":v}` lines (`record_view=envelope`, whatever `Accept` says).
    Envelope,
}

impl RecordView {
    fn of(rq: &RecordQuery, hm: &HeaderMap) -> RecordView {
        if rq.envelope {
            RecordView::Envelope
        } else if wants_ndjson(hm) {
            RecordView::Ndjson
        } else {
            RecordView::Array
        }
    }
}

/// Adds the bootstrap pointer to a `410` (protocol.md §3.3).
fn with_bootstrap(target: &Target, e: ursula_core::Rejection) -> ApiError {
    let gone = e.code == ErrorCode::STREAM_GONE;
    let mut e = ApiError::from(e);
    if gone {
        e.bootstrap_location = Some(target.bootstrap_path());
    }
    e
}

fn vanished() -> ApiError {
    ApiError::new(ErrorCode::STREAM_NOT_FOUND, "stream not found")
}

/// Resolves a record start to an ordinal (`400`/`410` per extensions.md §11.6).
pub fn resolve(app: &App, target: &Target, start: RecordStart) -> Result<u64, ApiError> {
    app.with_stream(&target.key, |s| s.resolve_record_start(start))
        .ok_or_else(vanished)?
        .map_err(|e| with_bootstrap(target, e))
}

/// The window of complete records from ordinal `start`, checked again against the stream
/// as it is now (retention may have passed `start` while a live read waited: `410`).
pub fn window(
    app: &App,
    target: &Target,
    start: u64,
    max_records: Option<u64>,
    max_bytes: u64,
) -> Result<RecordWindow, ApiError> {
    app.with_stream(&target.key, |s| {
        s.resolve_record_start(RecordStart::At(start))
            .map(|n| s.record_window(n, max_records, max_bytes))
    })
    .ok_or_else(vanished)?
    .map_err(|e| with_bootstrap(target, e))
}

/// The canonical bytes of a window (following fork links), in `view`.
pub async fn body(
    app: &Arc<App>,
    target: &Target,
    incarnation: Incarnation,
    w: &RecordWindow,
    view: RecordView,
) -> Result<Vec<u8>, ApiError> {
    let mut raw = Vec::new();
    read::collect(
        app,
        &target.key,
        incarnation,
        (w.start_offset, w.end_offset),
        &mut raw,
    )
    .await?;
    Ok(match view {
        RecordView::Ndjson => raw,
        RecordView::Array => {
            let mut out = Vec::with_capacity(raw.len() + 2);
            json::ndjson_to_array(&raw, &mut out);
            out
        }
        RecordView::Envelope => {
            let mut out = Vec::new();
            envelope_into(&raw, w.start, &mut out);
            out
        }
    })
}

/// The ETag of a record response: the canonical one of the same bytes for the array and
/// NDJSON views, its own (`:env`) for the envelope (protocol.md §12.2).
fn etag(v: &View, w: &RecordWindow, view: RecordView) -> String {
    let suffix = match view {
        RecordView::Array => ":a",
        RecordView::Ndjson => ":n",
        RecordView::Envelope => ":env",
    };
    read::etag_of(v, w.start_offset, w.end_offset, suffix)
}

/// `Stream-Record-First`, `-Start`, `-Next`.
fn put_records(hm: &mut HeaderMap, first: u64, start: u64, next: u64) {
    h::put_u64(hm, &h::STREAM_RECORD_FIRST, first);
    h::put_u64(hm, &h::STREAM_RECORD_START, start);
    h::put_u64(hm, &h::STREAM_RECORD_NEXT, next);
}

/// A record-aligned `200` (or `304`) for a window (extensions.md §11.7).
async fn respond(
    app: &Arc<App>,
    target: &Target,
    v: &View,
    w: &RecordWindow,
    view: RecordView,
    live_cursor: Option<&str>,
    hm: &HeaderMap,
) -> ApiResult {
    let tag = etag(v, w, view);
    let mut resp = if if_none_match(hm, &tag) {
        render::empty(StatusCode::NOT_MODIFIED)
    } else {
        let bytes = body(app, target, v.incarnation, w, view).await?;
        inc(&app.metrics.reads, 1);
        inc(&app.metrics.read_bytes, w.end_offset - w.start_offset);
        Response::new(Body::from(bytes))
    };
    let out = resp.headers_mut();
    put_stream_headers(
        out,
        v,
        if view == RecordView::Ndjson {
            read::Repr::Ndjson
        } else {
            read::Repr::JsonArray
        },
    );
    if view == RecordView::Envelope {
        out.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static(ENVELOPE_CT),
        );
    }
    put_records(out, w.first, w.start, w.next);
    h::put_off(out, &h::STREAM_NEXT_OFFSET, w.end_offset);
    h::put(out, &http::header::ETAG, &tag);
    let closed = v.closed && w.up_to_date() && w.end_offset == v.tail;
    if w.up_to_date() {
        out.insert(&h::STREAM_UP_TO_DATE, HeaderValue::from_static("true"));
    }
    if closed {
        out.insert(&h::STREAM_CLOSED, HeaderValue::from_static("true"));
    } else if let Some(c) = live_cursor {
        let c = read::cursor(w.end_offset, Some(c).filter(|c| !c.is_empty()));
        h::put(out, &h::STREAM_CURSOR, &c);
    }
    Ok(resp)
}

/// `GET` with `record` or `tail_records`: catch-up, long-poll or SSE from a record.
pub async fn get(
    app: &Arc<App>,
    target: &Target,
    v: View,
    rq: RecordQuery,
    q: ReadQuery,
    hm: &HeaderMap,
) -> ApiResult {
    let start = resolve(app, target, rq.start)?;
    let view = RecordView::of(&rq, hm);
    let cap = app.cfg.max_read_bytes;
    match q.live {
        Some(Live::Sse) => {
            touch_if_due(app, &target.key, &v).await;
            let at = app
                .with_stream(&target.key, |s| s.offset_of_record(start))
                .flatten()
                .ok_or_else(vanished)?;
            return sse::open(app.clone(), target.clone(), v, at, q, Some((start, rq)));
        }
        Some(Live::LongPoll) => {
            let echoed = q.cursor.clone().unwrap_or_default();
            let echoed = echoed.as_str();
            let max_records = rq.max_records;
            let data = |v: View| async move {
                let w = window(app, target, start, max_records, cap)?;
                if w.next == w.start {
                    return Ok(None);
                }
                respond(app, target, &v, &w, view, Some(echoed), hm)
                    .await
                    .map(Some)
            };
            let empty = |v: &View, cursor: Option<String>| {
                let mut r = long_poll::no_content(v, cursor);
                put_records(r.headers_mut(), v.record_first, start, start);
                r
            };
            return long_poll::wait(
                app,
                target,
                v.incarnation,
                q.timeout_ms,
                q.cursor.as_deref(),
                data,
                empty,
            )
            .await;
        }
        None => {}
    }
    touch_if_due(app, &target.key, &v).await;
    let w = window(app, target, start, rq.max_records, cap)?;
    respond(app, target, &v, &w, view, None, hm).await
}
