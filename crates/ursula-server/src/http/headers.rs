//! Header names and parsing of the protocol's request headers (protocol.md §2.2).

use super::error::ApiError;
use http::{HeaderMap, HeaderName, HeaderValue, header};
use ursula_core::ErrorCode;
use ursula_core::command::{Lifetime, ProducerHdr};
use ursula_core::ids::Incarnation;
use ursula_core::offset::Off;

pub static STREAM_NEXT_OFFSET: HeaderName = HeaderName::from_static("stream-next-offset");
pub static STREAM_EARLIEST_OFFSET: HeaderName = HeaderName::from_static("stream-earliest-offset");
pub static STREAM_BOOTSTRAP_LOCATION: HeaderName =
    HeaderName::from_static("stream-bootstrap-location");
pub static STREAM_CLOSED: HeaderName = HeaderName::from_static("stream-closed");
pub static STREAM_UP_TO_DATE: HeaderName = HeaderName::from_static("stream-up-to-date");
pub static STREAM_CURSOR: HeaderName = HeaderName::from_static("stream-cursor");
pub static STREAM_TTL: HeaderName = HeaderName::from_static("stream-ttl");
pub static STREAM_EXPIRES_AT: HeaderName = HeaderName::from_static("stream-expires-at");
pub static STREAM_SEQ: HeaderName = HeaderName::from_static("stream-seq");
pub static STREAM_INCARNATION: HeaderName = HeaderName::from_static("stream-incarnation");
pub static STREAM_EXTENSIONS: HeaderName = HeaderName::from_static("stream-extensions");
pub static STREAM_RECORD_START: HeaderName = HeaderName::from_static("stream-record-start");
pub static STREAM_RECORD_NEXT: HeaderName = HeaderName::from_static("stream-record-next");
pub static STREAM_RECORD_FIRST: HeaderName = HeaderName::from_static("stream-record-first");
pub static STREAM_RECORD_MATCH: HeaderName = HeaderName::from_static("stream-record-match");
pub static STREAM_RETAINED_OFFSET: HeaderName = HeaderName::from_static("stream-retained-offset");
pub static STREAM_FORKED_FROM: HeaderName = HeaderName::from_static("stream-forked-from");
pub static STREAM_FORK_OFFSET: HeaderName = HeaderName::from_static("stream-fork-offset");
pub static STREAM_FORK_SUB_OFFSET: HeaderName = HeaderName::from_static("stream-fork-sub-offset");
pub static PRODUCER_ID: HeaderName = HeaderName::from_static("producer-id");
pub static PRODUCER_EPOCH: HeaderName = HeaderName::from_static("producer-epoch");
pub static PRODUCER_SEQ: HeaderName = HeaderName::from_static("producer-seq");
pub static PRODUCER_EXPECTED_SEQ: HeaderName = HeaderName::from_static("producer-expected-seq");
pub static PRODUCER_RECEIVED_SEQ: HeaderName = HeaderName::from_static("producer-received-seq");
pub static STREAM_SSE_DATA_ENCODING: HeaderName =
    HeaderName::from_static("stream-sse-data-encoding");
pub static STREAM_DATA_CONTENT_TYPE: HeaderName =
    HeaderName::from_static("stream-data-content-type");
pub static MAX_REQUEST_BYTES_HDR: HeaderName = HeaderName::from_static("ursula-max-request-bytes");
pub static MAX_SNAPSHOT_REQUEST_BYTES_HDR: HeaderName =
    HeaderName::from_static("ursula-max-snapshot-request-bytes");
pub static STREAM_SNAPSHOT_OFFSET: HeaderName = HeaderName::from_static("stream-snapshot-offset");
pub static STREAM_SNAPSHOT_DIGEST: HeaderName = HeaderName::from_static("stream-snapshot-digest");
pub static STREAM_SNAPSHOT_MATCH: HeaderName = HeaderName::from_static("stream-snapshot-match");
pub static STREAM_SNAPSHOT_PARTS: HeaderName = HeaderName::from_static("stream-snapshot-parts");
pub static CROSS_ORIGIN_RESOURCE_POLICY: HeaderName =
    HeaderName::from_static("cross-origin-resource-policy");
pub const JSON_RECORDS_EXT: &str = "json-record-coordinates-v1";

/// Largest producer epoch/sequence: 2^53 - 1.
const MAX_PRODUCER_NUMBER: u64 = (1 << 53) - 1;

/// Inserts a header whose value we produced (never fails for valid text).
pub fn put(hm: &mut HeaderMap, name: &HeaderName, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        hm.insert(name, v);
    }
}

/// Inserts an offset in its 20-digit form, without formatting through a `String`.
pub fn put_off(hm: &mut HeaderMap, name: &HeaderName, off: u64) {
    put_ascii(hm, name, &Off(off).digits());
}

/// Inserts `Stream-Incarnation`.
pub fn put_incarnation(hm: &mut HeaderMap, inc: Incarnation) {
    put_ascii(hm, &STREAM_INCARNATION, &inc.hex());
}

/// Inserts an unsigned decimal number.
pub fn put_u64(hm: &mut HeaderMap, name: &HeaderName, n: u64) {
    hm.insert(name, HeaderValue::from(n));
}

fn put_ascii(hm: &mut HeaderMap, name: &HeaderName, value: &[u8]) {
    if let Ok(v) = HeaderValue::from_bytes(value) {
        hm.insert(name, v);
    }
}

/// Which families of protocol headers a request carries (`Stream-*`, `Producer-*`), found in
/// one pass over its header names. Most appends carry none, and looking up a name that is
/// absent still hashes it: a write skips the families it was not sent.
#[derive(Clone, Copy, Debug, Default)]
pub struct Carried {
    pub stream: bool,
    pub producer: bool,
}

pub fn carried(hm: &HeaderMap) -> Carried {
    let mut c = Carried::default();
    for name in hm.keys() {
        let n = name.as_str();
        c.stream |= n.starts_with("stream-");
        c.producer |= n.starts_with("producer-");
    }
    c
}

/// A header as text; a value that is not visible ASCII counts as the given error.
pub fn text<'a>(
    hm: &'a HeaderMap,
    name: &HeaderName,
    code: ErrorCode,
) -> Result<Option<&'a str>, ApiError> {
    match hm.get(name) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .map(Some)
            .map_err(|_| ApiError::new(code, format!("{name} is not valid text"))),
    }
}

/// `Stream-Closed`: present only when equal to `true` case-insensitively.
pub fn closed(hm: &HeaderMap) -> bool {
    hm.get(&STREAM_CLOSED)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

/// `Stream-Seq`: empty or whitespace counts as absent.
pub fn stream_seq(hm: &HeaderMap) -> Result<Option<String>, ApiError> {
    Ok(text(hm, &STREAM_SEQ, ErrorCode::INVALID_HEADER)?
        .filter(|v| !v.trim().is_empty())
        .map(str::to_owned))
}

/// The request's normalized content type, `None` when absent or empty. Anything but one
/// media type (RFC 9110 §8.3.1), or the header twice, is `400 INVALID_CONTENT_TYPE`.
pub fn content_type(hm: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(v) = sole_content_type(hm)? else {
        return Ok(None);
    };
    if v.trim().is_empty() {
        return Ok(None);
    }
    ursula_core::content_type::validate_normalize(v)
        .map(Some)
        .ok_or_else(|| not_one_media_type(v))
}

/// The raw `Content-Type` when it is absent, empty or one valid media type.
pub fn single_content_type(hm: &HeaderMap) -> Result<Option<&str>, ApiError> {
    match sole_content_type(hm)? {
        Some(v) if !v.trim().is_empty() && !ursula_core::content_type::is_valid(v) => {
            Err(not_one_media_type(v))
        }
        v => Ok(v),
    }
}

/// The `Content-Type` as text when it was sent at most once.
fn sole_content_type(hm: &HeaderMap) -> Result<Option<&str>, ApiError> {
    let mut all = hm.get_all(header::CONTENT_TYPE).iter();
    match (all.next(), all.next()) {
        (None, _) => Ok(None),
        (Some(_), Some(_)) => Err(bad_content_type("Content-Type must be sent once")),
        (Some(v), None) => v
            .to_str()
            .map(Some)
            .map_err(|_| bad_content_type("Content-Type is not visible ASCII")),
    }
}

fn not_one_media_type(v: &str) -> ApiError {
    bad_content_type(&format!(
        "Content-Type {:?} is not one media type (type/subtype; parameters)",
        shorten(v, 64)
    ))
}

fn bad_content_type(m: &str) -> ApiError {
    ApiError::new(ErrorCode::INVALID_CONTENT_TYPE, m.to_owned())
}

/// At most `max` bytes of `s` (cut on a character boundary), with `...` when cut: error
/// messages quote what the client sent without echoing kilobytes of it back.
pub fn shorten(s: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if s.len() <= max {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!("{}...", &s[..end]))
}

fn unsigned(v: &str) -> Option<u64> {
    let v = v.trim();
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse().ok()
}

/// `Producer-Id`/`Epoch`/`Seq`: all three or none.
pub fn producer(hm: &HeaderMap) -> Result<Option<ProducerHdr>, ApiError> {
    let bad = |m: &str| ApiError::new(ErrorCode::INVALID_PRODUCER, m.to_owned());
    let id = text(hm, &PRODUCER_ID, ErrorCode::INVALID_PRODUCER)?;
    let epoch = text(hm, &PRODUCER_EPOCH, ErrorCode::INVALID_PRODUCER)?;
    let seq = text(hm, &PRODUCER_SEQ, ErrorCode::INVALID_PRODUCER)?;
    match (id, epoch, seq) {
        (None, None, None) => Ok(None),
        (Some(id), Some(epoch), Some(seq)) => {
            let id = id.trim();
            if id.is_empty() {
                return Err(bad("Producer-Id must not be empty"));
            }
            let num = |v: &str, name: &str| {
                unsigned(v)
                    .filter(|n| *n <= MAX_PRODUCER_NUMBER)
                    .ok_or_else(|| bad(&format!("{name} must be an integer from 0 to 2^53-1")))
            };
            Ok(Some(ProducerHdr {
                id: id.to_owned(),
                epoch: num(epoch, "Producer-Epoch")?,
                seq: num(seq, "Producer-Seq")?,
            }))
        }
        _ => Err(bad(
            "Producer-Id, Producer-Epoch and Producer-Seq must be sent together",
        )),
    }
}

/// `Stream-Incarnation` precondition.
pub fn incarnation(hm: &HeaderMap) -> Result<Option<Incarnation>, ApiError> {
    match text(hm, &STREAM_INCARNATION, ErrorCode::INVALID_HEADER)? {
        None => Ok(None),
        Some(v) => Incarnation::parse(v).map(Some).ok_or_else(|| {
            ApiError::new(
                ErrorCode::INVALID_HEADER,
                "Stream-Incarnation must be 32 hex digits",
            )
        }),
    }
}

/// `Stream-Record-Match`.
pub fn record_match(hm: &HeaderMap) -> Result<Option<u64>, ApiError> {
    match text(hm, &STREAM_RECORD_MATCH, ErrorCode::INVALID_HEADER)? {
        None => Ok(None),
        Some(v) => unsigned(v).map(Some).ok_or_else(|| {
            ApiError::new(
                ErrorCode::INVALID_HEADER,
                "Stream-Record-Match must be an unsigned integer",
            )
        }),
    }
}

/// `Stream-TTL` and `Stream-Expires-At` (mutually exclusive, must lie in the future).
pub fn lifetime(hm: &HeaderMap, now_ms: u64) -> Result<Lifetime, ApiError> {
    let bad = |m: String| ApiError::new(ErrorCode::INVALID_HEADER, m);
    let ttl = text(hm, &STREAM_TTL, ErrorCode::INVALID_HEADER)?;
    let exp = text(hm, &STREAM_EXPIRES_AT, ErrorCode::INVALID_HEADER)?;
    if ttl.is_some() && exp.is_some() {
        return Err(bad(
            "Stream-TTL and Stream-Expires-At are mutually exclusive".into(),
        ));
    }
    let mut lt = Lifetime::default();
    if let Some(v) = ttl {
        let v = v.trim();
        let valid = !v.is_empty()
            && v.bytes().all(|b| b.is_ascii_digit())
            && !v.starts_with('0')
            && v.parse::<u64>()
                .ok()
                .is_some_and(|n| n.checked_mul(1000).is_some());
        if !valid {
            return Err(bad(format!(
                "Stream-TTL {:?} must be a positive number of seconds",
                shorten(v, 64)
            )));
        }
        lt.ttl_s = v.parse().ok();
    }
    if let Some(v) = exp {
        let t = chrono::DateTime::parse_from_rfc3339(v.trim()).map_err(|_| {
            bad(format!(
                "Stream-Expires-At {:?} is not an RFC 3339 timestamp",
                shorten(v, 64)
            ))
        })?;
        let ms = u64::try_from(t.timestamp_millis()).unwrap_or(0);
        if ms <= now_ms {
            return Err(bad("Stream-Expires-At must lie in the future".into()));
        }
        lt.expires_at_ms = Some(ms);
    }
    Ok(lt)
}

/// Formats an absolute expiry as RFC 3339 UTC with milliseconds.
pub fn format_expiry(ms: u64) -> String {
    let t = chrono::DateTime::from_timestamp_millis(i64::try_from(ms).unwrap_or(i64::MAX))
        .unwrap_or_default();
    t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

/// Puts the lifetime headers of a stream.
pub fn put_lifetime(hm: &mut HeaderMap, lt: &Lifetime) {
    if let Some(t) = lt.ttl_s {
        put_u64(hm, &STREAM_TTL, t);
    }
    if let Some(e) = lt.expires_at_ms {
        put(hm, &STREAM_EXPIRES_AT, &format_expiry(e));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hm(pairs: &[(&'static HeaderName, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.insert(*k, HeaderValue::from_str(v).expect("header"));
        }
        m
    }

    #[test]
    fn ttl_grammar() {
        assert_eq!(
            lifetime(&hm(&[(&STREAM_TTL, "3600")]), 0)
                .expect("ok")
                .ttl_s,
            Some(3600)
        );
        for bad in ["0", "-1", "+3600", "03600", "3600.0", "3.6e3", ""] {
            assert!(lifetime(&hm(&[(&STREAM_TTL, bad)]), 0).is_err(), "{bad:?}");
        }
        assert!(
            lifetime(
                &hm(&[
                    (&STREAM_TTL, "1"),
                    (&STREAM_EXPIRES_AT, "2099-01-01T00:00:00Z")
                ]),
                0
            )
            .is_err()
        );
    }

    #[test]
    fn expiry_must_be_future() {
        let lt = lifetime(&hm(&[(&STREAM_EXPIRES_AT, "2030-01-01T00:00:00Z")]), 0).expect("ok");
        assert_eq!(
            format_expiry(lt.expires_at_ms.expect("set")),
            "2030-01-01T00:00:00.000Z"
        );
        assert!(
            lifetime(
                &hm(&[(&STREAM_EXPIRES_AT, "2000-01-01T00:00:00Z")]),
                1_800_000_000_000
            )
            .is_err()
        );
    }

    #[test]
    fn producer_headers() {
        assert!(producer(&hm(&[(&PRODUCER_ID, "p")])).is_err());
        assert!(
            producer(&hm(&[
                (&PRODUCER_ID, " "),
                (&PRODUCER_EPOCH, "0"),
                (&PRODUCER_SEQ, "0")
            ]))
            .is_err()
        );
        assert!(
            producer(&hm(&[
                (&PRODUCER_ID, "p"),
                (&PRODUCER_EPOCH, "9007199254740992"),
                (&PRODUCER_SEQ, "0")
            ]))
            .is_err()
        );
        let p = producer(&hm(&[
            (&PRODUCER_ID, "p"),
            (&PRODUCER_EPOCH, " 2 "),
            (&PRODUCER_SEQ, "3"),
        ]))
        .expect("ok")
        .expect("some");
        assert_eq!((p.epoch, p.seq), (2, 3));
    }
}
