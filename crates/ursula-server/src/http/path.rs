//! Request-target routing (README §4.4): operational, compatibility, bucket and stream routes.

use super::error::ApiError;
use std::borrow::Cow;
use ursula_core::ErrorCode;
use ursula_core::ids::{self, COMPAT_BUCKET, RESERVED_BUCKET, StreamKey};

/// A stream addressed by a request, in whichever layout the client used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub key: StreamKey,
}

impl Target {
    /// The native path of the stream's `/bootstrap` route.
    pub fn bootstrap_path(&self) -> String {
        format!(
            "/{}/{}/bootstrap",
            self.key.bucket(),
            pct_encode(self.key.stream())
        )
    }
}

/// Subresources of a native stream (extensions.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sub {
    Snapshot(Vec<String>),
    Retention(Vec<String>),
    Bootstrap,
    Attrs,
    AppendBatch,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    Ops(Vec<String>),
    Bucket(String),
    List(String),
    Stream(Target, Option<Sub>),
    NotFound,
}

/// Percent-decodes one segment as UTF-8; `None` for bad escapes or invalid UTF-8.
pub fn pct_decode(seg: &str) -> Option<String> {
    ids::pct_decode(seg).map(Cow::into_owned)
}

/// Percent-encodes a decoded segment for use in a path.
pub fn pct_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn bad_stream(m: &str) -> ApiError {
    ApiError::new(ErrorCode::INVALID_STREAM_ID, m.to_owned())
}

/// Resolves a compatibility name (the segments after `/v1/stream/`).
fn compat_target(raw_segs: &[&str]) -> Result<Route, ApiError> {
    let mut parts = Vec::with_capacity(raw_segs.len());
    for seg in raw_segs {
        let d = pct_decode(seg).ok_or_else(|| bad_stream("stream name is not valid UTF-8"))?;
        if d.is_empty() || d == "." || d == ".." || d.contains('/') {
            return Err(bad_stream(
                "stream name has an empty, '.', '..' or encoded '/' segment",
            ));
        }
        parts.push(d);
    }
    if parts.first().is_some_and(|p| p == "__ds") {
        return Ok(Route::NotFound);
    }
    let id = ids::escape_compat_name(&parts.join("/"));
    ids::validate_stream(COMPAT_BUCKET, &id).map_err(|e| bad_stream(&e.to_string()))?;
    Ok(Route::Stream(
        Target {
            key: StreamKey::new(COMPAT_BUCKET, &id),
        },
        None,
    ))
}

/// Parses a request path into a route.
pub fn route(path: &str) -> Result<Route, ApiError> {
    let Some(rest) = path.strip_prefix('/') else {
        return Ok(Route::NotFound);
    };
    if rest.is_empty() {
        return Ok(Route::NotFound);
    }
    let segs: Vec<&str> = rest.split('/').collect();
    let first = ids::pct_decode(segs[0]).ok_or_else(|| {
        ApiError::new(ErrorCode::INVALID_BUCKET_ID, "bucket id is not valid UTF-8")
    })?;
    if first == RESERVED_BUCKET {
        return Ok(Route::Ops(
            segs[1..].iter().map(|s| (*s).to_owned()).collect(),
        ));
    }
    if segs[0] == "v1" {
        if segs.len() >= 3 && segs[1] == "stream" && !(segs.len() == 3 && segs[2].is_empty()) {
            return compat_target(&segs[2..]);
        }
        return Ok(Route::NotFound);
    }
    ids::validate_bucket(&first)
        .map_err(|e| ApiError::new(ErrorCode::INVALID_BUCKET_ID, e.to_string()))?;
    if segs.len() == 1 {
        return Ok(Route::Bucket(first.into_owned()));
    }
    // `/{bucket}/` names the empty stream ID, which is invalid (seed 003: 1 to 122 bytes);
    // `validate_stream` below refuses it with 400.
    let second =
        ids::pct_decode(segs[1]).ok_or_else(|| bad_stream("stream id is not valid UTF-8"))?;
    if second == "__ds" && segs.len() > 2 {
        // Subscription control routes of the bucket root (not served by this node).
        return Ok(Route::NotFound);
    }
    if segs.len() == 2 && second == "streams" {
        return Ok(Route::List(first.into_owned()));
    }
    ids::validate_stream(&first, &second).map_err(|e| bad_stream(&e.to_string()))?;
    let target = Target {
        key: StreamKey::new(&first, &second),
    };
    if segs.len() == 2 {
        return Ok(Route::Stream(target, None));
    }
    let tail: Vec<String> = segs[3..].iter().map(|s| (*s).to_owned()).collect();
    let sub = match segs[2] {
        "snapshot" => Sub::Snapshot(tail),
        "retention" => Sub::Retention(tail),
        "bootstrap" if tail.is_empty() => Sub::Bootstrap,
        "attrs" if tail.is_empty() => Sub::Attrs,
        "append-batch" if tail.is_empty() => Sub::AppendBatch,
        _ => return Ok(Route::NotFound),
    };
    Ok(Route::Stream(target, Some(sub)))
}

/// Resolves a `Stream-Forked-From` path to a stream key (forks.md §2.1).
pub fn fork_source(value: &str) -> Result<StreamKey, ApiError> {
    let bad = || {
        ApiError::new(
            ErrorCode::INVALID_FORK_SOURCE,
            format!("{value:?} is not a stream path"),
        )
    };
    if !value.starts_with('/') || value.contains('?') || value.contains('#') {
        return Err(bad());
    }
    match route(value) {
        Ok(Route::Stream(t, None)) => Ok(t.key),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(path: &str) -> String {
        match route(path) {
            Ok(Route::Stream(t, None)) => t.key.to_string(),
            other => panic!("{path}: {other:?}"),
        }
    }

    #[test]
    fn layouts() {
        assert_eq!(key("/v1/stream/orders"), "__compat_v1/orders");
        assert_eq!(key("/v1/stream/events/abc"), "__compat_v1/events%2Fabc");
        assert_eq!(key("/demo/hello"), "demo/hello");
        assert_eq!(
            key("/__compat_v1/events%252Fabc"),
            "__compat_v1/events%2Fabc"
        );
        assert_eq!(route("/demo").ok(), Some(Route::Bucket("demo".into())));
        assert_eq!(
            route("/demo/streams").ok(),
            Some(Route::List("demo".into()))
        );
        assert_eq!(route("/v1/stream/").ok(), Some(Route::NotFound));
        assert_eq!(route("/v1/other/x").ok(), Some(Route::NotFound));
        assert!(matches!(route("/__ursula/metrics"), Ok(Route::Ops(_))));
    }

    #[test]
    fn invalid_ids() {
        assert_eq!(
            route("/ab/x").err().map(|e| e.code()),
            Some(ErrorCode::INVALID_BUCKET_ID)
        );
        assert_eq!(
            route("/demo/%24x").err().map(|e| e.code()),
            Some(ErrorCode::INVALID_STREAM_ID)
        );
        assert_eq!(
            route("/demo/a%2Fb").err().map(|e| e.code()),
            Some(ErrorCode::INVALID_STREAM_ID)
        );
        assert_eq!(
            route("/v1/stream/a//b").err().map(|e| e.code()),
            Some(ErrorCode::INVALID_STREAM_ID)
        );
        assert_eq!(
            route("/v1/stream/a/../b").err().map(|e| e.code()),
            Some(ErrorCode::INVALID_STREAM_ID)
        );
        assert_eq!(
            route("/demo/%ff").err().map(|e| e.code()),
            Some(ErrorCode::INVALID_STREAM_ID)
        );
    }

    #[test]
    fn reserved_and_empty_stream_ids_are_invalid() {
        // Seed 003: "streams is reserved. An invalid ID answers 400"; IDs are 1 to 122 bytes;
        // README: stream IDs are not `streams` or `__ds`.
        for path in ["/demo/", "/demo/__ds", "/demo/%5F_ds"] {
            assert_eq!(
                route(path).err().map(|e| e.code()),
                Some(ErrorCode::INVALID_STREAM_ID),
                "{path}"
            );
        }
        assert_eq!(
            route("/demo/__ds/subscriptions/x").ok(),
            Some(Route::NotFound)
        );
        // The listing stays a route of its own; methods other than GET/HEAD refuse the ID.
        assert_eq!(
            route("/demo/streams").ok(),
            Some(Route::List("demo".into()))
        );
    }

    #[test]
    fn fork_sources() {
        assert_eq!(
            fork_source("/v1/stream/a").map(|k| k.to_string()).ok(),
            Some("__compat_v1/a".into())
        );
        assert!(fork_source("http://x/v1/stream/a").is_err());
        assert!(fork_source("/v1/stream/a?x=1").is_err());
        assert!(fork_source("/demo").is_err());
    }
}
