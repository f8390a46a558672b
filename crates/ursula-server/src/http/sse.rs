//! Server-Sent Events reads (protocol.md §10.4).

use super::path::Target;
use super::query::ReadQuery;
use super::read::{self, Repr, View};
use super::{ApiResult, headers as h, long_poll, record_read};
use crate::app::App;
use crate::metrics::{Gauge, inc};
use axum::body::Body;
use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderValue, Response};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use ursula_core::offset::Off;
use ursula_core::records::{RecordQuery, envelope_into};
use ursula_core::{Incarnation, content_type};

/// A comment line after this long without events keeps proxies from closing the response.
const KEEPALIVE: Duration = Duration::from_secs(15);
/// Responses end at a control-event boundary after about this long (OQ-21).
const MAX_LIFETIME: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Text,
    Json,
    Base64,
}

/// A record-aware SSE read: the ordinal it is at, and the batch and view rules.
#[derive(Clone, Copy)]
struct Records {
    next: u64,
    max_records: Option<u64>,
    envelope: bool,
}

/// Opens an SSE response from offset `start`; `records`, for a record-aware read, holds the
/// ordinal at `start` and the record parameters (extensions.md §11.8).
pub fn open(
    app: Arc<App>,
    target: Target,
    v: View,
    start: u64,
    q: ReadQuery,
    records: Option<(u64, RecordQuery)>,
) -> ApiResult {
    let enc = if v.json {
        Encoding::Json
    } else if content_type::is_text(&v.content_type) {
        Encoding::Text
    } else {
        Encoding::Base64
    };
    let mut resp = Response::new(Body::empty());
    let hm = resp.headers_mut();
    hm.insert(
        "content-type",
        HeaderValue::from_static("text/event-stream"),
    );
    hm.insert("cache-control", HeaderValue::from_static("no-cache"));
    let records = records.map(|(next, rq)| Records {
        next,
        max_records: rq.max_records,
        envelope: rq.envelope,
    });
    let data_ct = if records.is_some_and(|r| r.envelope) {
        "application/vnd.durable-stream-record+json"
    } else if v.json {
        "application/json"
    } else {
        v.content_type.as_str()
    };
    h::put(hm, &h::STREAM_DATA_CONTENT_TYPE, data_ct);
    h::put_incarnation(hm, v.incarnation);
    if enc == Encoding::Base64 {
        hm.insert(
            &h::STREAM_SSE_DATA_ENCODING,
            HeaderValue::from_static("base64"),
        );
    }
    if v.json {
        h::put(hm, &h::STREAM_EXTENSIONS, h::JSON_RECORDS_EXT);
    }
    let (tx, rx) = mpsc::channel::<Bytes>(8);
    long_poll::check_waiter_capacity(&app)?;
    let batch = q
        .max_bytes
        .unwrap_or(app.cfg.sse_batch_bytes)
        .min(app.cfg.max_read_bytes);
    let opened = Opened {
        incarnation: v.incarnation,
        ttl_s: v.lifetime.ttl_s,
    };
    let pos = Position {
        offset: start,
        records,
    };
    tokio::spawn(run(app, target, opened, pos, batch, q.cursor, enc, tx));
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    *resp.body_mut() = Body::from_stream(stream);
    Ok(resp)
}

fn data_event(enc: Encoding, payload: &[u8]) -> String {
    let mut ev = String::from("event: data\n");
    match enc {
        Encoding::Base64 => {
            ev.push_str("data:");
            ev.push_str(&base64::engine::general_purpose::STANDARD.encode(payload));
            ev.push('\n');
        }
        Encoding::Text | Encoding::Json => {
            let text = String::from_utf8_lossy(payload);
            for line in text.split('\n') {
                let clean: String = line.chars().filter(|c| *c != '\r' && *c != '\0').collect();
                ev.push_str(if clean.starts_with(' ') {
                    "data: "
                } else {
                    "data:"
                });
                ev.push_str(&clean);
                ev.push('\n');
            }
        }
    }
    ev.push('\n');
    ev
}

/// Where an SSE response is: its offset and, for a record read, its ordinal.
struct Position {
    offset: u64,
    records: Option<Records>,
}

fn control_event(
    next: u64,
    records: Option<(u64, u64)>,
    cursor: Option<String>,
    up_to_date: bool,
    closed: bool,
) -> String {
    let mut m = serde_json::Map::new();
    m.insert("streamNextOffset".into(), Off(next).to_string().into());
    if let Some((first, next)) = records {
        record_read::control_fields(&mut m, first, next);
    }
    if let Some(c) = cursor {
        m.insert("streamCursor".into(), c.into());
    }
    if up_to_date {
        m.insert("upToDate".into(), true.into());
    }
    if closed {
        m.insert("streamClosed".into(), true.into());
    }
    format!("event: control\ndata:{}\n\n", serde_json::Value::Object(m))
}

fn error_event(msg: &str) -> String {
    format!("event: error\ndata:{}\n\n", msg.replace(['\n', '\r'], " "))
}

/// Length of the UTF-8 sequence a lead byte starts (1 for anything else).
fn utf8_len(lead: u8) -> usize {
    match lead {
        0xC0..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF7 => 4,
        _ => 1,
    }
}

/// Shortens a text batch so it never ends inside a UTF-8 sequence.
fn utf8_end(bytes: &[u8]) -> usize {
    match std::str::from_utf8(bytes) {
        Ok(_) => bytes.len(),
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        Err(_) => bytes.len(),
    }
}

/// What the response was opened on: the incarnation it reads and its TTL.
struct Opened {
    incarnation: ursula_core::Incarnation,
    ttl_s: Option<u64>,
}

#[allow(clippy::too_many_arguments, reason = "the state of one SSE response")]
async fn run(
    app: Arc<App>,
    target: Target,
    opened: Opened,
    position: Position,
    batch: u64,
    mut cursor_echo: Option<String>,
    enc: Encoding,
    tx: mpsc::Sender<Bytes>,
) {
    let _open = Gauge::new(&app.metrics.sse_connections);
    let key = &target.key;
    let (mut pos, mut records) = (position.offset, position.records);
    // Registered before the first look at the stream, so no commit slips past.
    let mut watch = app.watchers.watch(app.group_of(key), key);
    let started = tokio::time::Instant::now();
    let repr = if enc == Encoding::Json {
        Repr::JsonArray
    } else {
        Repr::Bytes
    };
    let mut first = true;
    let mut stop = app.shutdown.subscribe();
    // Renew the TTL every quarter window while connected, and keep the line warm.
    let tick = opened
        .ttl_s
        .map_or(KEEPALIVE, |t| {
            Duration::from_millis(t.saturating_mul(1000).div_ceil(4))
        })
        .min(KEEPALIVE);
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + tick, tick);
    let mut last_sent = tokio::time::Instant::now();
    loop {
        let v = match read::view(&app, key, app.now_ms()) {
            Ok(v) => v,
            Err(e) => {
                let _ = tx
                    .send(Bytes::from(error_event(&e.rejection.message)))
                    .await;
                return;
            }
        };
        if v.incarnation != opened.incarnation {
            let _ = tx
                .send(Bytes::from(error_event("the stream was deleted")))
                .await;
            return;
        }
        if pos < v.retained {
            let e = read::gone(&target, pos, v.retained);
            let _ = tx
                .send(Bytes::from(error_event(&e.rejection.message)))
                .await;
            return;
        }
        if pos < v.tail
            && let Some(r) = records.as_mut()
        {
            let (ev, end, up_to_date) =
                match record_batch(&app, &target, v.incarnation, r, batch).await {
                    Ok(b) => b,
                    Err(e) => {
                        let _ = tx
                            .send(Bytes::from(error_event(&e.rejection.message)))
                            .await;
                        return;
                    }
                };
            let closed = up_to_date && v.closed;
            let c = (!closed).then(|| read::cursor(end, cursor_echo.as_deref()));
            let mut ev = ev;
            ev.push_str(&control_event(
                end,
                Some((v.record_first, r.next)),
                c.clone(),
                up_to_date,
                closed,
            ));
            inc(&app.metrics.read_bytes, end - pos);
            last_sent = tokio::time::Instant::now();
            if tx.send(Bytes::from(ev)).await.is_err() {
                return;
            }
            cursor_echo = c;
            pos = end;
            first = false;
            if closed || (up_to_date && started.elapsed() > MAX_LIFETIME) {
                return;
            }
            continue;
        }
        if pos < v.tail {
            let mut end = read::window_end(&app, key, &v, repr, pos, batch);
            let mut raw = Vec::new();
            if let Err(e) = read::collect(&app, key, v.incarnation, (pos, end), &mut raw).await {
                let _ = tx
                    .send(Bytes::from(error_event(&e.rejection.message)))
                    .await;
                return;
            }
            if enc == Encoding::Text {
                let keep = utf8_end(&raw);
                if keep > 0 {
                    raw.truncate(keep);
                    end = pos + keep as u64;
                } else if let Some(need) = raw.first().map(|b| utf8_len(*b))
                    && need > raw.len()
                    && pos + need as u64 <= v.tail
                {
                    // A window smaller than one character: send that whole character, as a
                    // JSON message larger than the window is sent alone.
                    end = pos + need as u64;
                    raw.clear();
                    if let Err(e) =
                        read::collect(&app, key, v.incarnation, (pos, end), &mut raw).await
                    {
                        let _ = tx
                            .send(Bytes::from(error_event(&e.rejection.message)))
                            .await;
                        return;
                    }
                }
            }
            let payload = if enc == Encoding::Json {
                let mut out = Vec::with_capacity(raw.len() + 2);
                ursula_core::json::ndjson_to_array(&raw, &mut out);
                out
            } else {
                raw
            };
            inc(&app.metrics.read_bytes, end - pos);
            let at_tail = end == v.tail;
            let closed = at_tail && v.closed;
            let c = (!closed).then(|| read::cursor(end, cursor_echo.as_deref()));
            let mut ev = data_event(enc, &payload);
            ev.push_str(&control_event(end, None, c.clone(), at_tail, closed));
            last_sent = tokio::time::Instant::now();
            if tx.send(Bytes::from(ev)).await.is_err() {
                return;
            }
            cursor_echo = c;
            pos = end;
            first = false;
            if closed || (at_tail && started.elapsed() > MAX_LIFETIME) {
                return;
            }
            continue;
        }
        if first || v.closed {
            let c = (!v.closed).then(|| read::cursor(v.tail, cursor_echo.as_deref()));
            if tx
                .send(Bytes::from(control_event(
                    v.tail,
                    records.map(|r| (v.record_first, r.next)),
                    c.clone(),
                    true,
                    v.closed,
                )))
                .await
                .is_err()
                || v.closed
            {
                return;
            }
            cursor_echo = c;
            first = false;
        }
        if started.elapsed() > MAX_LIFETIME {
            return;
        }
        // Wait until this stream has something new (commits to other streams do not wake
        // us). The ticker keeps its schedule across wake-ups.
        loop {
            tokio::select! {
                () = watch.changed() => inc(&app.metrics.live_wakeups, 1),
                _ = ticker.tick() => {}
                _ = tx.closed() => return,
                _ = stop.changed() => return,
            }
            if last_sent.elapsed() >= KEEPALIVE {
                if tx.send(Bytes::from_static(b":\n")).await.is_err() {
                    return;
                }
                last_sent = tokio::time::Instant::now();
            }
            match read::view(&app, key, app.now_ms()) {
                Ok(v) if v.incarnation == opened.incarnation && v.tail == pos && !v.closed => {
                    read::touch_if_due(&app, key, &v).await;
                }
                _ => break,
            }
        }
    }
}

/// The data event of one batch of a record read, from ordinal `r.next` (which it
/// advances): one array of at most `max_records` complete records, or for the envelope view
/// one record. Returns the events, the offset after them and whether they reach
/// the record tail.
async fn record_batch(
    app: &Arc<App>,
    target: &Target,
    incarnation: Incarnation,
    r: &mut Records,
    batch: u64,
) -> Result<(String, u64, bool), super::error::ApiError> {
    // The envelope view sends one record per data event, each with its control event.
    let max = if r.envelope { Some(1) } else { r.max_records };
    let w = record_read::window(app, target, r.next, max, batch)?;
    let mut raw = Vec::new();
    read::collect(
        app,
        &target.key,
        incarnation,
        (w.start_offset, w.end_offset),
        &mut raw,
    )
    .await?;
    let mut ev = String::new();
    if r.envelope {
        let mut lines = Vec::new();
        envelope_into(&raw, w.start, &mut lines);
        for line in lines.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            ev.push_str(&data_event(Encoding::Json, line));
        }
    } else {
        let mut out = Vec::with_capacity(raw.len() + 2);
        ursula_core::json::ndjson_to_array(&raw, &mut out);
        ev.push_str(&data_event(Encoding::Json, &out));
    }
    r.next = w.next;
    Ok((ev, w.end_offset, w.up_to_date()))
}
