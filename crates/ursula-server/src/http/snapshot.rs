//! Snapshot routes (extensions.md §6): publish (by offset or record), read the latest
//! (`307`), read at an offset, delete, and the multi-part routes, which need a cold backend
//! this node does not have (`501`, OQ-98).
//!
//! The HTTP layer checks syntax and computes the digest; every state check runs in the
//! state machine, in one replicated command per publish, so nothing half-published is ever
//! visible and the checks are linearizable with appends and retention.

use super::error::ApiError;
use super::path::{Target, pct_decode, pct_encode};
use super::{ApiResult, body, headers as h, method_not_allowed, not_found, read, render};
use crate::app::App;
use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use std::sync::Arc;
use ursula_core::command::{At, Op, PublishSnapshotReq, Reply, SnapshotReply};
use ursula_core::offset::{self, Off};
use ursula_core::snapshot::Digest;
use ursula_core::{ErrorCode, content_type};

/// Blobs at least this large are hashed off the async workers.
const HASH_INLINE_MAX: usize = 1 << 20;

/// Answers every `/{bucket}/{stream}/snapshot[/...]` request.
pub async fn handle(
    app: &Arc<App>,
    target: &Target,
    rest: &[String],
    req: Request<Body>,
) -> ApiResult {
    let method = req.method().clone();
    match rest {
        [] => match method {
            Method::GET | Method::HEAD => latest(app, target),
            Method::PUT => publish(app, target, None, req).await,
            _ => Err(method_not_allowed("GET, HEAD, PUT, OPTIONS")),
        },
        [p] if p == "parts" => match method {
            Method::DELETE => super::parts::discard(app, target, req.headers()).await,
            _ => Err(method_not_allowed("DELETE, OPTIONS")),
        },
        [off] => match method {
            Method::PUT => publish(app, target, Some(off), req).await,
            Method::GET => read_at(app, target, off, true).await,
            Method::HEAD => read_at(app, target, off, false).await,
            Method::DELETE => delete(app, target, off, req.headers()).await,
            _ => Err(method_not_allowed("GET, HEAD, PUT, DELETE, OPTIONS")),
        },
        [off, p] if p == "parts" => match method {
            Method::POST => super::parts::stage(app, target, off, req).await,
            _ => Err(method_not_allowed("POST, OPTIONS")),
        },
        _ => Err(not_found()),
    }
}

/// A `{offset}` path segment: digits only (protocol.md §3.2).
pub fn path_offset(seg: &str) -> Result<u64, ApiError> {
    pct_decode(seg)
        .and_then(|s| offset::parse_digits(&s))
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::INVALID_OFFSET,
                format!(
                    "{:?} is not an offset (1 to 20 digits)",
                    h::shorten(seg, 64)
                ),
            )
        })
}

/// The required `record` query parameter of the `?record=` forms.
pub fn record_query(query: Option<&str>) -> Result<u64, ApiError> {
    let bad = |m: &str| ApiError::new(ErrorCode::INVALID_QUERY, m.to_owned());
    let mut found = None;
    for pair in query.unwrap_or("").split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k != "record" {
            continue;
        }
        if found.is_some() {
            return Err(bad("record given twice"));
        }
        found = Some(
            pct_decode(v)
                .and_then(|v| offset::parse_digits(&v))
                .ok_or_else(|| bad("record must be an unsigned integer"))?,
        );
    }
    found.ok_or_else(|| bad("record is required (or give an offset in the path)"))
}

/// The snapshot's own content type: visible ASCII, normalized, `application/octet-stream`
/// when absent or empty.
pub(super) fn snapshot_content_type(hm: &HeaderMap) -> Result<String, ApiError> {
    let Some(v) = hm.get(http::header::CONTENT_TYPE) else {
        return Ok("application/octet-stream".to_owned());
    };
    let visible = v
        .as_bytes()
        .iter()
        .all(|b| (0x20..=0x7e).contains(b) || *b == b'\t');
    if !visible || v.to_str().is_err() {
        return Err(ApiError::new(
            ErrorCode::INVALID_SNAPSHOT,
            "the snapshot Content-Type must be visible ASCII",
        ));
    }
    // One media type, sent once (`400 INVALID_CONTENT_TYPE` otherwise).
    Ok(h::single_content_type(hm)?
        .filter(|s| !s.trim().is_empty())
        .map_or_else(
            || "application/octet-stream".to_owned(),
            content_type::normalize,
        ))
}

/// `Stream-Snapshot-Match`: an empty value is malformed.
pub(super) fn snapshot_match(hm: &HeaderMap) -> Result<Option<String>, ApiError> {
    match h::text(hm, &h::STREAM_SNAPSHOT_MATCH, ErrorCode::INVALID_HEADER)? {
        None => Ok(None),
        Some(v) if v.trim().is_empty() => Err(ApiError::new(
            ErrorCode::INVALID_HEADER,
            "Stream-Snapshot-Match must not be empty",
        )),
        Some(v) => Ok(Some(v.trim().to_owned())),
    }
}

async fn digest_of(ct: String, blob: Bytes) -> Result<Digest, ApiError> {
    if blob.len() < HASH_INLINE_MAX {
        return Ok(Digest::of(&ct, &blob));
    }
    tokio::task::spawn_blocking(move || Digest::of(&ct, &blob))
        .await
        .map_err(|_| ApiError::new(ErrorCode::INTERNAL_ERROR, "hashing the snapshot failed"))
}

/// `PUT .../snapshot/{offset}` and `PUT .../snapshot?record=n` (extensions.md §6.2, §6.5).
async fn publish(
    app: &Arc<App>,
    target: &Target,
    offset: Option<&String>,
    req: Request<Body>,
) -> ApiResult {
    let (parts, body) = req.into_parts();
    let hm = &parts.headers;
    if hm.contains_key(&h::STREAM_SNAPSHOT_PARTS) {
        let (Some(off), true) = (offset, true) else {
            return Err(crate::snapshot_store::store_of(app)
                .err()
                .unwrap_or_else(|| {
                    ApiError::new(
                        ErrorCode::INVALID_SNAPSHOT_MANIFEST,
                        "a commit names its offset in the path",
                    )
                }));
        };
        return super::parts::commit(app, target, off, Request::from_parts(parts, body)).await;
    }
    let at = match offset {
        Some(o) => At::Offset(path_offset(o)?),
        None => At::Record(record_query(parts.uri.query())?),
    };
    let content_type = snapshot_content_type(hm)?;
    let snapshot_match = snapshot_match(hm)?;
    let incarnation = h::incarnation(hm)?;
    // The stream keeps the blob as it is: it must not pin a connection's read buffer.
    let (blob, _charge) = body::read_owned(app, hm, body, app.snapshot_request_limit()).await?;
    let digest = digest_of(content_type.clone(), blob.clone()).await?;
    if let (Some(t), false) = (&app.tiering, blob.is_empty()) {
        // On a node with a cold backend the blob is a cold object (extensions.md §6).
        let hint = match at {
            At::Offset(o) => o,
            At::Record(_) => 0,
        };
        let p = ursula_core::command::PublishColdSnapshotReq {
            key: target.key.clone(),
            incarnation,
            parts_incarnation: None,
            at,
            content_type,
            digest,
            snapshot_match,
            object: Default::default(),
        };
        let r = crate::snapshot_store::publish_blob(app, &t.store, p, blob, hint).await?;
        return Ok(published(&r));
    }
    let op = Op::PublishSnapshot(Box::new(PublishSnapshotReq {
        key: target.key.clone(),
        incarnation,
        at,
        content_type,
        digest,
        snapshot_match,
        blob,
    }));
    match app.propose(app.group_of(&target.key), op).await? {
        Reply::Snapshot(r) => Ok(published(&r)),
        _ => Err(ApiError::new(
            ErrorCode::INTERNAL_ERROR,
            "unexpected reply to a snapshot publish",
        )),
    }
}

pub(super) fn published(r: &SnapshotReply) -> Response<Body> {
    let mut resp = render::empty(StatusCode::NO_CONTENT);
    let hm = resp.headers_mut();
    put_snapshot(hm, r.offset, &r.digest);
    h::put_incarnation(hm, r.incarnation);
    h::put_off(hm, &h::STREAM_NEXT_OFFSET, r.tail);
    put_records(hm, r.json, r.record_first, r.record_next);
    resp
}

fn put_snapshot(hm: &mut HeaderMap, offset: u64, digest: &Digest) {
    h::put_off(hm, &h::STREAM_SNAPSHOT_OFFSET, offset);
    h::put(hm, &h::STREAM_SNAPSHOT_DIGEST, &digest.to_string());
}

/// `Stream-Extensions`, `Stream-Record-First` and `Stream-Record-Next` of a JSON stream.
pub fn put_records(hm: &mut HeaderMap, json: bool, first: u64, next: u64) {
    if json {
        h::put(hm, &h::STREAM_EXTENSIONS, h::JSON_RECORDS_EXT);
        h::put_u64(hm, &h::STREAM_RECORD_FIRST, first);
        h::put_u64(hm, &h::STREAM_RECORD_NEXT, next);
    }
}

/// Headers shared by the latest-snapshot redirect and the snapshot read: where to continue
/// reading updates, and whether that is the tail.
fn put_continuation(hm: &mut HeaderMap, v: &read::View, offset: u64) {
    h::put_off(hm, &h::STREAM_NEXT_OFFSET, offset);
    if offset == v.tail {
        hm.insert(&h::STREAM_UP_TO_DATE, HeaderValue::from_static("true"));
    }
    h::put_incarnation(hm, v.incarnation);
    put_records(hm, v.json, v.record_first, v.record_next);
}

fn snapshot_not_found(what: String) -> ApiError {
    ApiError::new(ErrorCode::SNAPSHOT_NOT_FOUND, what)
}

/// `GET .../snapshot`: `307` to the visible snapshot (extensions.md §6.6).
fn latest(app: &Arc<App>, target: &Target) -> ApiResult {
    let v = read::view(app, &target.key, app.now_ms())?;
    let Some((offset, digest)) = v.snapshot else {
        return Err(snapshot_not_found("the stream has no snapshot".into()));
    };
    let mut resp = render::empty(StatusCode::TEMPORARY_REDIRECT);
    let hm = resp.headers_mut();
    let location = format!(
        "/{}/{}/snapshot/{}",
        target.key.bucket(),
        pct_encode(target.key.stream()),
        Off(offset)
    );
    h::put(hm, &http::header::LOCATION, &location);
    put_snapshot(hm, offset, &digest);
    put_continuation(hm, &v, offset);
    Ok(resp)
}

/// `GET .../snapshot/{offset}`: the blob of the visible snapshot (extensions.md §6.7). A `GET`
/// renews a sliding TTL like any read; a `HEAD` does not.
async fn read_at(app: &Arc<App>, target: &Target, seg: &str, touch: bool) -> ApiResult {
    let offset = path_offset(seg)?;
    let v = read::view(app, &target.key, app.now_ms())?;
    let (snapshot, object) = app
        .with_stream(&target.key, |s| {
            s.snapshot.clone().map(|v| (v, s.snapshot_object.clone()))
        })
        .flatten()
        .filter(|(s, _)| s.offset == offset)
        .ok_or_else(|| snapshot_not_found(format!("no snapshot at offset {offset}")))?;
    let body = match (&object, &app.tiering) {
        (None, _) => Body::from(snapshot.blob),
        (Some(r), Some(t)) => {
            Body::from_stream(crate::snapshot_store::blob_stream(t.store.clone(), r).await?)
        }
        (Some(_), None) => {
            return Err(crate::snapshot_store::store_of(app)
                .err()
                .unwrap_or_else(|| ApiError::new(ErrorCode::INTERNAL_ERROR, "no cold store")));
        }
    };
    if touch {
        read::touch_if_due(app, &target.key, &v).await;
    }
    let mut resp = Response::new(body);
    if let Some(r) = &object {
        h::put_u64(resp.headers_mut(), &http::header::CONTENT_LENGTH, r.len);
    }
    let hm = resp.headers_mut();
    h::put(hm, &http::header::CONTENT_TYPE, &snapshot.content_type);
    put_snapshot(hm, offset, &snapshot.digest);
    put_continuation(hm, &v, offset);
    if v.closed && offset == v.tail {
        hm.insert(&h::STREAM_CLOSED, HeaderValue::from_static("true"));
    }
    Ok(resp)
}

/// `DELETE .../snapshot/{offset}`: the visible snapshot cannot be deleted and no other is
/// kept, so this answers `409` or `404`, in order with publishes (extensions.md §6.8).
async fn delete(app: &Arc<App>, target: &Target, seg: &str, hm: &HeaderMap) -> ApiResult {
    let offset = path_offset(seg)?;
    let incarnation = h::incarnation(hm)?;
    let op = Op::DeleteSnapshot {
        key: target.key.clone(),
        offset,
        incarnation,
    };
    app.propose(app.group_of(&target.key), op).await?;
    Err(ApiError::new(
        ErrorCode::INTERNAL_ERROR,
        "unexpected reply to a snapshot delete",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_offsets_are_digits_only() {
        assert_eq!(path_offset("00000000000000000042").ok(), Some(42));
        assert_eq!(path_offset("7").ok(), Some(7));
        for bad in ["-1", "now", "", "+1", "0x1", "1.0", "000000000000000000001"] {
            assert_eq!(
                path_offset(bad).err().map(|e| e.code()),
                Some(ErrorCode::INVALID_OFFSET),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn record_query_rules() {
        assert_eq!(record_query(Some("record=3")).ok(), Some(3));
        assert_eq!(record_query(Some("x=1&record=0")).ok(), Some(0));
        for bad in [
            None,
            Some(""),
            Some("record="),
            Some("record=-1"),
            Some("record=now"),
        ] {
            assert_eq!(
                record_query(bad).err().map(|e| e.code()),
                Some(ErrorCode::INVALID_QUERY),
                "{bad:?}"
            );
        }
        assert!(record_query(Some("record=1&record=2")).is_err());
    }

    #[test]
    fn snapshot_content_types() {
        let mut hm = HeaderMap::new();
        assert_eq!(
            snapshot_content_type(&hm).ok().as_deref(),
            Some("application/octet-stream")
        );
        hm.insert("content-type", HeaderValue::from_static("Text/Plain; A=B"));
        assert_eq!(
            snapshot_content_type(&hm).ok().as_deref(),
            Some("text/plain; a=b")
        );
        hm.insert(
            "content-type",
            HeaderValue::from_bytes(b"text/\xe9").expect("obs-text is a valid header value"),
        );
        assert_eq!(
            snapshot_content_type(&hm).err().map(|e| e.code()),
            Some(ErrorCode::INVALID_SNAPSHOT)
        );
        for bad in ["application/json, text/plain", "application/json\"", "text"] {
            hm.insert("content-type", HeaderValue::from_static(bad));
            assert_eq!(
                snapshot_content_type(&hm).err().map(|e| e.code()),
                Some(ErrorCode::INVALID_CONTENT_TYPE),
                "{bad:?}"
            );
        }
        hm.insert("content-type", HeaderValue::from_static(" "));
        assert_eq!(
            snapshot_content_type(&hm).ok().as_deref(),
            Some("application/octet-stream")
        );
    }
}
