//! Server-Sent Events reads (protocol.md §10.4).
//!
//! An SSE response is a [`Live`] state machine that runs inside the response body: hyper's
//! connection task asks it for the next frame, and it looks at the stream, renders what is
//! new, or waits for the stream's next commit. There is no task or channel per subscriber,
//! so a delivery costs one wake-up of the connection that sends it.

use super::error::ApiError;
use super::path::Target;
use super::query::ReadQuery;
use super::read::{self, Repr, View};
use super::sse_frame::{
    Control, Encoding, control_event, data_event, error_event, utf8_end, utf8_len,
};
use super::{ApiResult, headers as h, long_poll, record_read};
use crate::app::App;
use crate::metrics::inc;
use crate::watchers::{FrameTag, StreamWatch};
use axum::body::Body;
use bytes::Bytes;
use http::{HeaderValue, Response};
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::time::{Instant, Interval};
use ursula_core::offset::Off;
use ursula_core::records::{RecordQuery, envelope_into};
use ursula_core::{Incarnation, StreamKey, content_type};

/// A comment line after this long without events keeps proxies from closing the response.
const KEEPALIVE: Duration = Duration::from_secs(15);
/// Responses end at a control-event boundary after about this long (OQ-21).
const MAX_LIFETIME: Duration = Duration::from_secs(60);
/// The largest data event kept for the other readers of a stream (`StreamWatch::rendered`).
const SHARED_FRAME_MAX: usize = 64 * 1024;

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
    long_poll::check_waiter_capacity(&app)?;
    let batch = q
        .max_bytes
        .unwrap_or(app.cfg.sse_batch_bytes)
        .min(app.cfg.max_read_bytes);
    let live = Box::new(Live::new(
        app, target, &v, start, records, batch, q.cursor, enc,
    ));
    let frames = futures::stream::unfold(live, |mut live| async move {
        let frame = live.next().await?;
        Some((Ok::<_, Infallible>(frame), live))
    });
    *resp.body_mut() = Body::from_stream(frames);
    Ok(resp)
}

/// Counts an open SSE response in `ursula_sse_connections` while alive.
struct Open(Arc<App>);

impl Open {
    fn new(app: &Arc<App>) -> Open {
        app.metrics.sse_connections.fetch_add(1, Ordering::Relaxed);
        app.metrics.sse_opened.fetch_add(1, Ordering::Relaxed);
        Open(app.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0
            .metrics
            .sse_connections
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// What an SSE response needs to know of its stream at each look, copied out of the group
/// lock without allocating.
#[derive(Clone, Copy)]
struct Tail {
    incarnation: Incarnation,
    tail: u64,
    retained: u64,
    closed: bool,
    record_first: u64,
    touch_due: bool,
}

fn look(app: &App, key: &StreamKey) -> Result<Tail, super::error::ApiError> {
    let now = app.now_ms();
    app.with_group(app.group_of(key), |g| {
        g.lookup(key, now).map(|s| Tail {
            incarnation: s.incarnation,
            tail: s.tail,
            retained: s.retained,
            closed: s.closed,
            record_first: s.record_first(),
            touch_due: s.read_should_touch(now),
        })
    })
    .map_err(Into::into)
}

/// How a wait for the stream ended.
enum Woke {
    /// The stream changed (its look is in `Live::fresh`), or could not be looked at.
    Changed,
    /// Nothing changed for [`KEEPALIVE`]: send a comment line.
    KeepAlive,
    /// The node is shutting down.
    Stop,
}

/// The state of one SSE response, advanced one frame at a time by [`Live::next`].
struct Live {
    app: Arc<App>,
    target: Target,
    incarnation: Incarnation,
    pos: u64,
    records: Option<Records>,
    batch: u64,
    /// The cursor the last control event carried (at first: the client's, if it is a
    /// number); the next one is minted from it (protocol.md §10.7).
    cursor: Option<u64>,
    enc: Encoding,
    /// Wakes on commits to the stream and on shutdown ([`StreamWatch::stopping`]).
    watch: StreamWatch,
    /// Renews the TTL every quarter window while connected, and keeps the line warm.
    ticker: Interval,
    /// How far apart the ticker's ticks are.
    tick: Duration,
    /// Ticks since the response opened, and since a frame was last sent: the response's
    /// clock, so that a delivery reads no time.
    ticks: u32,
    idle_ticks: u32,
    first: bool,
    done: bool,
    /// A look taken after the last wake-up and not acted on yet.
    fresh: Option<Tail>,
    /// The last frame reached the tail of a look taken after the last wake-up: the next step
    /// waits without looking again (a commit since that look has bumped the watch already).
    at_tail: bool,
    _open: Open,
}

impl Live {
    #[allow(clippy::too_many_arguments, reason = "the state of one SSE response")]
    fn new(
        app: Arc<App>,
        target: Target,
        v: &View,
        start: u64,
        records: Option<Records>,
        batch: u64,
        cursor_echo: Option<String>,
        enc: Encoding,
    ) -> Live {
        let open = Open::new(&app);
        // Registered before the first look at the stream, so no commit slips past.
        let watch = app.watchers.watch(app.group_of(&target.key), &target.key);
        let tick = v
            .lifetime
            .ttl_s
            .map_or(KEEPALIVE, |t| {
                Duration::from_millis(t.saturating_mul(1000).div_ceil(4))
            })
            .min(KEEPALIVE);
        let now = Instant::now();
        Live {
            tick,
            ticks: 0,
            idle_ticks: 0,
            at_tail: false,
            incarnation: v.incarnation,
            pos: start,
            records,
            batch,
            cursor: cursor_echo.and_then(|c| c.parse::<u64>().ok()),
            enc,
            watch,
            ticker: tokio::time::interval_at(now + tick, tick),
            first: true,
            done: false,
            fresh: None,
            _open: open,
            app,
            target,
        }
    }

    /// The next frame of the response, or `None` once it has ended.
    async fn next(&mut self) -> Option<Bytes> {
        if self.done {
            return None;
        }
        match self.step().await {
            Some(frame) => {
                self.idle_ticks = 0;
                Some(frame)
            }
            None => {
                self.done = true;
                None
            }
        }
    }

    /// Ends the response after an error event.
    fn fail(&mut self, msg: &str) -> Option<Bytes> {
        self.done = true;
        Some(error_event(msg).into())
    }

    /// Appends the control event after `next`, with a fresh cursor unless `closed`.
    fn control(
        &mut self,
        out: &mut Vec<u8>,
        next: u64,
        records: Option<(u64, u64)>,
        up_to_date: bool,
        closed: bool,
    ) {
        self.cursor = (!closed).then(|| read::cursor_value(next, self.cursor));
        let digits = self.cursor.map(|c| Off(c).digits());
        control_event(
            out,
            &Control {
                next,
                records,
                cursor: digits.as_ref().and_then(|d| std::str::from_utf8(d).ok()),
                up_to_date,
                closed,
            },
        );
    }

    /// Whether the response has lived its [`MAX_LIFETIME`] (counted in ticks).
    fn expired(&self) -> bool {
        self.tick * self.ticks >= MAX_LIFETIME
    }

    async fn step(&mut self) -> Option<Bytes> {
        if std::mem::take(&mut self.at_tail)
            && let Err(instead) = self.idle().await
        {
            return instead;
        }
        loop {
            let t = match self.fresh.take() {
                Some(t) => t,
                None => match look(&self.app, &self.target.key) {
                    Ok(t) => t,
                    Err(e) => return self.fail(&e.rejection.message),
                },
            };
            if t.incarnation != self.incarnation {
                return self.fail("the stream was deleted");
            }
            if self.pos < t.retained {
                let e = read::gone(&self.target, self.pos, t.retained);
                return self.fail(&e.rejection.message);
            }
            if self.pos < t.tail {
                let frame = if let Some(r) = self.records {
                    self.record_frame(t, r).await.map(Bytes::from)
                } else {
                    self.data_frame(t).await
                };
                return match frame {
                    Ok(f) => Some(f),
                    Err(e) => self.fail(&e.rejection.message),
                };
            }
            if self.first || t.closed {
                self.first = false;
                self.done = t.closed;
                let mut out = Vec::with_capacity(160);
                let records = self.records.map(|r| (t.record_first, r.next));
                self.control(&mut out, t.tail, records, true, t.closed);
                self.at_tail = !t.closed;
                return Some(out.into());
            }
            if let Err(instead) = self.idle().await {
                return instead;
            }
        }
    }

    /// At the tail: waits until the stream changes (`Ok`), or says what to send instead: a
    /// keep-alive comment, or the end of an expired or stopped response.
    async fn idle(&mut self) -> Result<(), Option<Bytes>> {
        if self.expired() {
            return Err(None);
        }
        match self.wait().await {
            Woke::Changed => Ok(()),
            Woke::KeepAlive => Err(Some(Bytes::from_static(b":\n"))),
            Woke::Stop => Err(None),
        }
    }

    /// Waits until this stream has something new (commits to other streams do not wake us),
    /// renewing its TTL on the ticker's schedule, which holds across wake-ups.
    async fn wait(&mut self) -> Woke {
        loop {
            // A shutdown wakes the watch too (`Watchers::stop_all`), so one waker per wait.
            if self.watch.stopping() {
                return Woke::Stop;
            }
            tokio::select! {
                () = self.watch.changed() => inc(&self.app.metrics.live_wakeups, 1),
                _ = self.ticker.tick() => {
                    self.ticks = self.ticks.saturating_add(1);
                    self.idle_ticks = self.idle_ticks.saturating_add(1);
                }
            }
            if self.watch.stopping() {
                return Woke::Stop;
            }
            match look(&self.app, &self.target.key) {
                Ok(t) if t.incarnation == self.incarnation && t.tail == self.pos && !t.closed => {
                    if t.touch_due {
                        read::touch(&self.app, &self.target.key, t.incarnation).await;
                    }
                    if self.tick * self.idle_ticks >= KEEPALIVE {
                        return Woke::KeepAlive;
                    }
                }
                Ok(t) => {
                    self.fresh = Some(t);
                    return Woke::Changed;
                }
                Err(_) => return Woke::Changed,
            }
        }
    }

    /// One data event (at most `batch` bytes from `pos`) followed by its control event, in one
    /// chunk: a proxy that forwards chunk by chunk would otherwise let a client see a data
    /// event whose text contains `event: control` before the real control event (the
    /// conformance suite's injection tests read until that text).
    ///
    /// Readers of a stream that sit at the same position after the same commit share the
    /// work: the first renders the data event and keeps it beside the stream's watch; the
    /// first whose control event is the usual one (its cursor is behind the new end, so the
    /// next cursor is that end) keeps the whole chunk too, and every such reader after it
    /// sends that chunk as it is, with nothing rendered, allocated or copied.
    async fn data_frame(&mut self, t: Tail) -> Result<Bytes, ApiError> {
        let tag = FrameTag {
            incarnation: t.incarnation,
            from: self.pos,
            tail: t.tail,
            batch: self.batch,
            encoding: self.enc as u8,
            closed: t.closed,
        };
        // Whether this reader's control event after `end` is the one every reader sends.
        let usual = |cursor: Option<u64>, end: u64| {
            (end == t.tail && t.closed) || cursor.is_none_or(|c| c < end)
        };
        if let Some((end, chunk)) = self.watch.rendered_chunk(&tag)
            && usual(self.cursor, end)
        {
            let closed = end == t.tail && t.closed;
            self.cursor = (!closed).then_some(end);
            self.advance(end, t);
            return Ok(chunk);
        }
        let (end, data, kept) = match self.watch.rendered(&tag) {
            Some((end, data)) => (end, data, true),
            None => {
                let (end, data) = self.render_data(t).await?;
                // Only a window that reaches the tail is kept (the one its followers ask
                // for next), and only up to 64 KiB: a stream's slot never pins a large
                // catch-up window.
                let keep = end == t.tail && data.len() <= SHARED_FRAME_MAX;
                if keep {
                    self.watch.keep_rendered(tag, end, data.clone());
                }
                (end, data, keep)
            }
        };
        let at_tail = end == t.tail;
        let usual = usual(self.cursor, end);
        let mut chunk = Vec::with_capacity(data.len() + 160);
        chunk.extend_from_slice(&data);
        self.control(&mut chunk, end, None, at_tail, at_tail && t.closed);
        let chunk = Bytes::from(chunk);
        if kept && usual {
            self.watch.keep_chunk(&tag, chunk.clone());
        }
        self.advance(end, t);
        Ok(chunk)
    }

    /// After a data frame that ends at `end`: the position, and whether the response is at
    /// the tail or done.
    fn advance(&mut self, end: u64, t: Tail) {
        inc(&self.app.metrics.read_bytes, end - self.pos);
        inc(&self.app.metrics.sse_data_events, 1);
        let at_tail = end == t.tail;
        let closed = at_tail && t.closed;
        self.pos = end;
        self.first = false;
        self.done = closed || (at_tail && self.expired());
        self.at_tail = at_tail && !self.done;
    }

    /// Reads and renders the data event from `pos`; returns the offset it ends at.
    async fn render_data(&self, t: Tail) -> Result<(u64, Bytes), ApiError> {
        let (app, key, pos) = (&self.app, &self.target.key, self.pos);
        let repr = if self.enc == Encoding::Json {
            Repr::JsonArray
        } else {
            Repr::Bytes
        };
        let mut end = read::window_end(app, key, t.tail, repr, pos, self.batch);
        let mut raw = Vec::new();
        read::collect(app, key, t.incarnation, (pos, end), &mut raw).await?;
        if self.enc == Encoding::Text {
            let keep = utf8_end(&raw);
            if keep > 0 {
                raw.truncate(keep);
                end = pos + keep as u64;
            } else if let Some(need) = raw.first().map(|b| utf8_len(*b))
                && need > raw.len()
                && pos + need as u64 <= t.tail
            {
                // A window smaller than one character: send that whole character, as a
                // JSON message larger than the window is sent alone.
                end = pos + need as u64;
                raw.clear();
                read::collect(app, key, t.incarnation, (pos, end), &mut raw).await?;
            }
        }
        // Base64 grows the payload by a third; the event's own lines need about 50 bytes.
        let mut out = Vec::with_capacity(raw.len() + raw.len() / 3 + 64);
        if self.enc == Encoding::Json {
            let mut array = Vec::with_capacity(raw.len() + 2);
            ursula_core::json::ndjson_to_array(&raw, &mut array);
            data_event(&mut out, self.enc, &array);
        } else {
            data_event(&mut out, self.enc, &raw);
        }
        Ok((end, out.into()))
    }

    /// One batch of a record read and its control event.
    async fn record_frame(&mut self, t: Tail, mut r: Records) -> Result<Vec<u8>, ApiError> {
        let (mut out, end, up_to_date) =
            record_batch(&self.app, &self.target, t.incarnation, &mut r, self.batch).await?;
        self.records = Some(r);
        let closed = up_to_date && t.closed;
        self.control(
            &mut out,
            end,
            Some((t.record_first, r.next)),
            up_to_date,
            closed,
        );
        inc(&self.app.metrics.read_bytes, end - self.pos);
        self.pos = end;
        self.first = false;
        self.done = closed || (up_to_date && self.expired());
        self.at_tail = end == t.tail && !self.done;
        Ok(out)
    }
}

/// The data events of one batch of a record read, from ordinal `r.next` (which it
/// advances): one array of at most `max_records` complete records, or for the envelope view
/// one record. Returns the events, the offset after them and whether they reach
/// the record tail.
async fn record_batch(
    app: &Arc<App>,
    target: &Target,
    incarnation: Incarnation,
    r: &mut Records,
    batch: u64,
) -> Result<(Vec<u8>, u64, bool), ApiError> {
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
    let mut ev = Vec::with_capacity(raw.len() + 256);
    if r.envelope {
        let mut lines = Vec::new();
        envelope_into(&raw, w.start, &mut lines);
        for line in lines.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            data_event(&mut ev, Encoding::Json, line);
        }
    } else {
        let mut out = Vec::with_capacity(raw.len() + 2);
        ursula_core::json::ndjson_to_array(&raw, &mut out);
        data_event(&mut ev, Encoding::Json, &out);
    }
    r.next = w.next;
    Ok((ev, w.end_offset, w.up_to_date()))
}
