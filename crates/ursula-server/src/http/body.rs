//! Reading request bodies within the size limit and the body timeout.

use super::budget::Charge;
use super::error::ApiError;
use crate::app::App;
use axum::body::Body;
use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body_util::BodyExt;
use std::future::Future;
use std::task::Poll;
use std::time::Duration;
use ursula_core::ErrorCode;

/// Bodies smaller than this are copied into their own allocation.
const COPY_BELOW: usize = 64 * 1024;

fn too_large(limit: u64) -> ApiError {
    ApiError::new(
        ErrorCode::PAYLOAD_TOO_LARGE,
        format!("request body is larger than {limit} bytes"),
    )
}

/// Reads the whole body; `413` beyond `limit`, `408` when it does not arrive in time.
///
/// A large body that arrived in one frame is returned as a slice of the connection's read
/// buffer, which it keeps alive: fine for bytes that are copied on (appends). A body the
/// state keeps as it is must use [`read_owned`].
/// The bytes are charged to the node's in-flight body budget (`503
/// INGRESS_BODY_BYTES_LIMIT_REACHED` when they do not fit) until the returned [`Charge`] is
/// dropped: keep it until the request is answered.
pub async fn read<'a>(
    app: &'a App,
    headers: &HeaderMap,
    body: Body,
    limit: u64,
) -> Result<(Bytes, Charge<'a>), ApiError> {
    read_copying_below(app, headers, body, limit, COPY_BELOW, true).await
}

/// [`read`], always into an allocation of the body's own.
pub async fn read_owned<'a>(
    app: &'a App,
    headers: &HeaderMap,
    body: Body,
    limit: u64,
) -> Result<(Bytes, Charge<'a>), ApiError> {
    read_copying_below(app, headers, body, limit, usize::MAX, true).await
}

/// [`read`] without a budget reservation: only for a snapshot commit's manifest (at most
/// 262,144 bytes), which must never keep its own copy from starting (snapshot-parts.md §10).
pub async fn read_unreserved(
    app: &App,
    headers: &HeaderMap,
    body: Body,
    limit: u64,
) -> Result<Bytes, ApiError> {
    Ok(
        read_copying_below(app, headers, body, limit, COPY_BELOW, false)
            .await?
            .0,
    )
}

async fn read_copying_below<'a>(
    app: &'a App,
    headers: &HeaderMap,
    body: Body,
    limit: u64,
    copy_below: usize,
    reserve: bool,
) -> Result<(Bytes, Charge<'a>), ApiError> {
    // `Content-Length`, else the body's exact size (a request with neither a length nor
    // chunked framing has an empty body).
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .or_else(|| http_body::Body::size_hint(&body).exact());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large(limit));
    }
    // Reserved before any of the body is read: the declared or exact length, else the
    // route's limit (protocol.md §2.4).
    let size = if reserve {
        declared.unwrap_or(limit)
    } else {
        0
    };
    let charge = app.body_budget.reserve(size)?;
    let timeout = Duration::from_millis(app.cfg.body_timeout_ms);
    let collect = async {
        let mut body = body;
        // Allocated only for a body that arrives in several frames.
        let mut buf = BytesMut::new();
        let mut single: Option<Bytes> = None;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                ApiError::new(
                    ErrorCode::MALFORMED_REQUEST,
                    format!("request body could not be read: {e}"),
                )
            })?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            let total = buf.len() as u64
                + single.as_ref().map_or(0, |b| b.len() as u64)
                + data.len() as u64;
            if total > limit {
                return Err(too_large(limit));
            }
            // Keep the common one-chunk body without copying it.
            if buf.is_empty() && single.is_none() {
                single = Some(data);
            } else {
                if let Some(first) = single.take() {
                    buf.reserve(declared.unwrap_or(0).min(limit) as usize);
                    buf.extend_from_slice(&first);
                }
                buf.extend_from_slice(&data);
            }
        }
        // A one-frame body is a slice of the connection's read buffer; one below `copy_below`
        // is copied out so that what the log and state keep does not pin that whole buffer.
        Ok(match single {
            Some(b) if b.len() < copy_below => Bytes::copy_from_slice(&b),
            Some(b) => b,
            None => buf.freeze(),
        })
    };
    // A small body usually arrived with the head: then one poll reads it, and no timer is
    // registered for the request.
    let read = {
        let mut collect = std::pin::pin!(collect);
        match std::future::poll_fn(|cx| Poll::Ready(collect.as_mut().poll(cx))).await {
            Poll::Ready(r) => r,
            Poll::Pending => match tokio::time::timeout(timeout, collect).await {
                Ok(r) => r,
                Err(_) => Err(ApiError::new(
                    ErrorCode::REQUEST_TIMEOUT,
                    "request body did not arrive in time",
                )),
            },
        }
    };
    read.map(|bytes| (bytes, charge))
}
