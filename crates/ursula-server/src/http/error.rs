//! The one place where an [`ErrorCode`] becomes an HTTP status, and the JSON error body.

use super::headers as h;
use axum::body::Body;
use http::{HeaderValue, Response, StatusCode};
use ursula_core::error::{ErrorCode, Facts, Rejection};

/// An error answer: a rejection plus optional bootstrap location for reads.
#[derive(Debug)]
pub struct ApiError {
    pub rejection: Rejection,
    pub bootstrap_location: Option<String>,
    pub allow: Option<&'static str>,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Rejection::new(code, message).into()
    }

    pub fn code(&self) -> ErrorCode {
        self.rejection.code
    }
}

impl From<Rejection> for ApiError {
    fn from(rejection: Rejection) -> Self {
        ApiError {
            rejection,
            bootstrap_location: None,
            allow: None,
        }
    }
}

/// The HTTP status of each error code (errors.md §2).
pub fn status_of(code: ErrorCode) -> StatusCode {
    use ErrorCode::*;
    match code {
        INVALID_BUCKET_ID
        | INVALID_STREAM_ID
        | INVALID_OFFSET
        | INVALID_QUERY
        | INVALID_HEADER
        | INVALID_FORK_SOURCE
        | INVALID_FORK_OFFSET
        | INVALID_FORK_SUB_OFFSET
        | FORK_DEPTH_EXCEEDED
        | INVALID_JSON
        | MISSING_CONTENT_TYPE
        | EMPTY_APPEND
        | INVALID_PRODUCER
        | INVALID_STREAM_ATTRS
        | INVALID_RECORD_BOUNDARIES
        | INVALID_SNAPSHOT
        | INVALID_RETENTION
        | MALFORMED_REQUEST
        | INVALID_CONTENT_TYPE
        | INVALID_SNAPSHOT_MANIFEST
        | UNKNOWN_SNAPSHOT_PART
        | SNAPSHOT_DIGEST_MISMATCH
        | NOT_A_VOTER
        | INVALID_ADMIN_TARGET => StatusCode::BAD_REQUEST,
        STAGED_PARTS_LIMIT => StatusCode::TOO_MANY_REQUESTS,
        REQUEST_TIMEOUT => StatusCode::REQUEST_TIMEOUT,
        PAYLOAD_TOO_LARGE => StatusCode::PAYLOAD_TOO_LARGE,
        URI_TOO_LONG => StatusCode::URI_TOO_LONG,
        HEADERS_TOO_LARGE => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        OFFSET_OUT_OF_RANGE => StatusCode::RANGE_NOT_SATISFIABLE,
        PRODUCER_EPOCH_STALE => StatusCode::FORBIDDEN,
        BUCKET_NOT_FOUND
        | STREAM_NOT_FOUND
        | FORK_SOURCE_NOT_FOUND
        | SNAPSHOT_NOT_FOUND
        | NOT_FOUND => StatusCode::NOT_FOUND,
        METHOD_NOT_ALLOWED => StatusCode::METHOD_NOT_ALLOWED,
        STREAM_ALREADY_EXISTS_CONFLICT
        | PATH_SOFT_DELETED
        | FORK_SOURCE_SOFT_DELETED
        | STREAM_CLOSED
        | CONTENT_TYPE_MISMATCH
        | STREAM_SEQ_CONFLICT
        | PRODUCER_SEQ_CONFLICT
        | SNAPSHOT_CONFLICT
        | BUCKET_NOT_EMPTY
        | NOT_LEADER
        | TRANSFER_REFUSED => StatusCode::CONFLICT,
        STREAM_GONE | STREAM_SOFT_DELETED => StatusCode::GONE,
        INCARNATION_MISMATCH | RECORD_PRECONDITION_FAILED => StatusCode::PRECONDITION_FAILED,
        QUOTA_EXCEEDED => StatusCode::TOO_MANY_REQUESTS,
        INTERNAL_ERROR => StatusCode::INTERNAL_SERVER_ERROR,
        INGRESS_BODY_BYTES_LIMIT_REACHED
        | LIVE_READ_BACKPRESSURE
        | LEADER_UNAVAILABLE
        | SERVICE_SHUTTING_DOWN
        | WRITE_OUTCOME_UNKNOWN
        | STORAGE_UNAVAILABLE
        | COLD_BACKPRESSURE
        | RAFT_UNCOMMITTED_BACKPRESSURE
        | SNAPSHOT_COMMIT_IN_PROGRESS
        | SNAPSHOT_COMMITS_BUSY => StatusCode::SERVICE_UNAVAILABLE,
        INSUFFICIENT_STORAGE => StatusCode::INSUFFICIENT_STORAGE,
        COLD_STORE_FAILED => StatusCode::BAD_GATEWAY,
        COLD_STORE_NOT_CONFIGURED => StatusCode::NOT_IMPLEMENTED,
    }
}

pub use ursula_http::error_body;

/// Renders the JSON error body with the header facts.
pub fn render(err: ApiError) -> Response<Body> {
    let status = status_of(err.rejection.code);
    let body = error_body(err.rejection.code, &err.rejection.message);
    let mut resp = Response::new(Body::from(body));
    *resp.status_mut() = status;
    let hm = resp.headers_mut();
    hm.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if status == StatusCode::SERVICE_UNAVAILABLE {
        hm.insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
    } else if status == StatusCode::INSUFFICIENT_STORAGE {
        // errors.md §2.3: a full disk is not freed within a second.
        hm.insert(http::header::RETRY_AFTER, HeaderValue::from_static("5"));
    }
    if let Some(allow) = err.allow {
        hm.insert(http::header::ALLOW, HeaderValue::from_static(allow));
    }
    if let Some(loc) = &err.bootstrap_location {
        h::put(hm, &h::STREAM_BOOTSTRAP_LOCATION, loc);
    }
    put_facts(hm, &err.rejection.facts);
    resp
}

fn put_facts(hm: &mut http::HeaderMap, f: &Facts) {
    if let Some(o) = f.next_offset {
        h::put_off(hm, &h::STREAM_NEXT_OFFSET, o);
    }
    if let Some(o) = f.earliest_offset {
        h::put_off(hm, &h::STREAM_EARLIEST_OFFSET, o);
    }
    if f.closed {
        hm.insert(&h::STREAM_CLOSED, HeaderValue::from_static("true"));
    }
    if let Some(e) = f.producer_epoch {
        h::put_u64(hm, &h::PRODUCER_EPOCH, e);
    }
    if let Some(e) = f.expected_seq {
        h::put_u64(hm, &h::PRODUCER_EXPECTED_SEQ, e);
    }
    if let Some(e) = f.received_seq {
        h::put_u64(hm, &h::PRODUCER_RECEIVED_SEQ, e);
    }
    if let Some(i) = f.incarnation {
        h::put_incarnation(hm, i);
    }
    if let Some(n) = f.record_first {
        h::put_u64(hm, &h::STREAM_RECORD_FIRST, n);
    }
    if let Some(n) = f.record_next {
        h::put_u64(hm, &h::STREAM_RECORD_NEXT, n);
    }
    if let Some((offset, digest)) = f.snapshot {
        h::put_off(hm, &h::STREAM_SNAPSHOT_OFFSET, offset);
        h::put(hm, &h::STREAM_SNAPSHOT_DIGEST, &digest.to_string());
    }
    if f.json {
        h::put(hm, &h::STREAM_EXTENSIONS, h::JSON_RECORDS_EXT);
    }
}
