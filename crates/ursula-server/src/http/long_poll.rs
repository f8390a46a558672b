//! The wait of a long-poll read (protocol.md §10.3), shared by offset and record reads:
//! look, wait for a commit to the stream (or the timeout, or shutdown), look again.

use super::error::ApiError;
use super::path::Target;
use super::read::{self, View, cursor, touch_if_due};
use super::{ApiResult, Resp, headers as h, render};
use crate::app::App;
use crate::metrics::inc;
use http::{HeaderValue, StatusCode};
use std::sync::Arc;
use std::time::Duration;
use ursula_core::ErrorCode;
use ursula_core::ids::Incarnation;

/// Waits until `data` answers for the stream opened as incarnation `opened`, or it closes, or
/// the timeout passes. `data` looks at a fresh [`View`] (and may fetch cold bytes) and
/// answers `Ok(None)` while there is nothing to return; `empty` builds the `204` (its cursor is `None` when the stream is
/// closed at the read's start).
pub async fn wait<F>(
    app: &Arc<App>,
    target: &Target,
    opened: Incarnation,
    timeout_ms: Option<u64>,
    echoed: Option<&str>,
    mut data: impl FnMut(View) -> F,
    empty: impl Fn(&View, Option<String>) -> Resp,
) -> ApiResult
where
    F: Future<Output = Result<Option<Resp>, ApiError>>,
{
    let key = &target.key;
    let timeout = Duration::from_millis(
        timeout_ms
            .unwrap_or(app.cfg.long_poll_timeout_ms)
            .clamp(1, 60_000),
    );
    let deadline = tokio::time::Instant::now() + timeout;
    check_waiter_capacity(app)?;
    let _waiter = crate::metrics::Gauge::new(&app.metrics.live_waiters);
    // Register before looking again, so no commit can slip between look and wait.
    let mut watch = app.watchers.watch(app.group_of(key), key);
    let mut v = read::view(app, key, app.now_ms())?;
    touch_if_due(app, key, &v).await;
    loop {
        if v.incarnation != opened {
            return Err(ApiError::new(
                ErrorCode::STREAM_NOT_FOUND,
                "the stream was deleted while the read waited",
            ));
        }
        if let Some(resp) = data(v.clone()).await? {
            return Ok(resp);
        }
        if v.closed {
            return Ok(empty(&v, None));
        }
        // Shutting down: answer now, as a timeout would.
        if watch.stopping() || tokio::time::Instant::now() >= deadline {
            let c = cursor(v.tail, echoed.filter(|c| !c.is_empty()));
            return Ok(empty(&v, Some(c)));
        }
        // Wake for commits; also every quarter TTL so a waiting reader keeps the stream alive.
        let quarter = v
            .lifetime
            .ttl_s
            .map(|t| Duration::from_millis(t.saturating_mul(1000).div_ceil(4)));
        let wake_at = quarter.map_or(deadline, |q| deadline.min(tokio::time::Instant::now() + q));
        // A shutdown wakes the watch too (`Watchers::stop_all`).
        tokio::select! {
            () = watch.changed() => inc(&app.metrics.live_wakeups, 1),
            _ = tokio::time::sleep_until(wake_at) => {}
        }
        v = read::view(app, key, app.now_ms())?;
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

/// The `204` of a long-poll: at the tail, with the cursor, or closed when `cursor` is `None`.
pub fn no_content(v: &View, cursor: Option<String>) -> Resp {
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
