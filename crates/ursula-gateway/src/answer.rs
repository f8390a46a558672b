//! The answers the gateway makes itself, with the JSON error body of errors.md §1.

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::{BodyExt, Full};

/// The body of every answer: an upstream's, streamed, or the gateway's own.
pub type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, hyper::Error>;

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// `status` with `{"error":{"code":code,"message":message}}`.
pub fn error(status: StatusCode, code: &str, message: &str) -> Response<Body> {
    let mut r = Response::new(full(ursula_http::error_body_str(code, message)));
    *r.status_mut() = status;
    let hm = r.headers_mut();
    hm.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    hm.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    hm.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    r
}

/// `502 UPSTREAM_FAILED`: no node answered (connection refused, reset, header time-out).
pub fn upstream_failed(why: &str) -> Response<Body> {
    error(StatusCode::BAD_GATEWAY, "UPSTREAM_FAILED", why)
}

pub fn too_large(limit: u64) -> Response<Body> {
    error(
        StatusCode::PAYLOAD_TOO_LARGE,
        "PAYLOAD_TOO_LARGE",
        &format!("the request body is larger than this gateway's limit of {limit} bytes"),
    )
}
