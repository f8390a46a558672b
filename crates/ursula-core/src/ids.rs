//! Validated identifiers: bucket IDs, stream IDs, stream keys and group placement.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The bucket that holds every stream of the compatibility family `/v1/stream/...`.
pub const COMPAT_BUCKET: &str = "__compat_v1";
/// The only reserved bucket ID: it names the operational routes.
pub const RESERVED_BUCKET: &str = "__ursula";
/// Upper bound of `len(bucket) + 1 + len(stream)`.
pub const MAX_KEY_BYTES: usize = 122;

/// Why an identifier was refused; the HTTP layer maps these to error codes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdError {
    Bucket(String),
    Stream(String),
}

impl fmt::Display for IdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdError::Bucket(m) | IdError::Stream(m) => f.write_str(m),
        }
    }
}

/// How much of a rejected ID an error message quotes.
const QUOTED_ID_BYTES: usize = 64;

/// The start of a rejected ID, quoted, with `...` when cut: a message names the ID without
/// echoing kilobytes of it back.
fn quoted_prefix(id: &str) -> String {
    let mut end = id.len().min(QUOTED_ID_BYTES);
    while !id.is_char_boundary(end) {
        end -= 1;
    }
    let more = if end < id.len() { "..." } else { "" };
    format!("{:?}{more}", &id[..end])
}

/// Checks a bucket ID against `^[a-z0-9_-]{4,64}$`.
pub fn validate_bucket(bucket: &str) -> Result<(), IdError> {
    let ok_len = (4..=64).contains(&bucket.len());
    let ok_chars = bucket
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if ok_len && ok_chars {
        Ok(())
    } else {
        Err(IdError::Bucket(format!(
            "bucket id {} must match [a-z0-9_-]{{4,64}}",
            quoted_prefix(bucket)
        )))
    }
}

/// Checks a (decoded) stream ID and the combined key length.
pub fn validate_stream(bucket: &str, stream: &str) -> Result<(), IdError> {
    let bad = |why: &str| {
        let shown = quoted_prefix(stream);
        Err(IdError::Stream(format!("stream id {shown} {why}")))
    };
    if stream.is_empty() || stream.len() > MAX_KEY_BYTES {
        return bad("must be 1 to 122 bytes");
    }
    if stream.contains('/') || stream.contains('\0') || stream.contains("..") {
        return bad("must not contain '/', NUL or '..'");
    }
    if stream.starts_with('$') {
        return bad("must not start with '$'");
    }
    if stream == "streams" || stream == "__ds" {
        return bad("is reserved");
    }
    if bucket.len() + 1 + stream.len() > MAX_KEY_BYTES {
        return bad("makes {bucket}/{stream} longer than 122 bytes");
    }
    Ok(())
}

/// Escapes a compatibility name (segments joined with `/`) into a native stream ID.
pub fn escape_compat_name(name: &str) -> String {
    name.replace('%', "%25").replace('/', "%2F")
}

/// Percent-decodes one path segment, borrowing it when it has nothing to decode; `None` when
/// an escape is malformed or the result is not UTF-8. Nodes and the gateway decode alike, so
/// that both derive the same [`StreamKey`] (and group) from a path.
pub fn pct_decode(seg: &str) -> Option<std::borrow::Cow<'_, str>> {
    if !seg.contains('%') {
        return Some(std::borrow::Cow::Borrowed(seg));
    }
    let b = seg.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3)?;
            let s = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(s, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok().map(std::borrow::Cow::Owned)
}

/// Reverses [`escape_compat_name`].
pub fn unescape_compat_id(id: &str) -> String {
    id.replace("%2F", "/").replace("%25", "%")
}

/// The identity of a stream inside a node: `bucket/stream`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StreamKey(String);

impl StreamKey {
    /// Builds a key from already validated parts.
    pub fn new(bucket: &str, stream: &str) -> Self {
        let mut s = String::with_capacity(bucket.len() + 1 + stream.len());
        s.push_str(bucket);
        s.push('/');
        s.push_str(stream);
        StreamKey(s)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn bucket(&self) -> &str {
        self.0.split_once('/').map_or(self.0.as_str(), |(b, _)| b)
    }

    pub fn stream(&self) -> &str {
        self.0.split_once('/').map_or("", |(_, s)| s)
    }

    /// The Raft group this stream belongs to: FNV-1a 64 of `bucket/stream`.
    pub fn group(&self, group_count: u32) -> u32 {
        group_of(self.0.as_bytes(), group_count)
    }
}

impl fmt::Debug for StreamKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl fmt::Display for StreamKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// FNV-1a 64 hash of `bytes`, reduced to a group index. With one group (a single node's
/// default) there is nothing to hash.
pub fn group_of(bytes: &[u8], group_count: u32) -> u32 {
    if group_count <= 1 {
        return 0;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h % u64::from(group_count.max(1))) as u32
}

/// A stream incarnation token: 128 bits, shown as 32 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
pub struct Incarnation(pub u128);

impl Incarnation {
    /// Parses the 32-hex-digit form (either case accepted).
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim();
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u128::from_str_radix(s, 16).ok().map(Incarnation)
    }

    /// The 32 lowercase hex digits as ASCII bytes, without allocating.
    pub fn hex(&self) -> [u8; 32] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 32];
        for (i, d) in out.iter_mut().enumerate() {
            *d = DIGITS[((self.0 >> (124 - 4 * i)) & 0xf) as usize];
        }
        out
    }
}

impl fmt::Display for Incarnation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Always ASCII hex digits.
        f.write_str(std::str::from_utf8(&self.hex()).map_err(|_| fmt::Error)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejections_quote_a_short_prefix_of_the_id() {
        let long = "x".repeat(64 * 1024);
        let msg = validate_stream("bucket", &long).unwrap_err().to_string();
        assert!(msg.len() < 200, "{} bytes", msg.len());
        assert!(msg.contains(&format!("\"{}\"...", "x".repeat(QUOTED_ID_BYTES))));
        let msg = validate_bucket(&"B".repeat(70_000))
            .unwrap_err()
            .to_string();
        assert!(msg.len() < 200, "{} bytes", msg.len());
        // A multi-byte character is never cut in half, and a short ID is quoted whole.
        let msg = validate_stream("bucket", &"é".repeat(100))
            .unwrap_err()
            .to_string();
        assert!(msg.contains(&format!("\"{}\"...", "é".repeat(32))), "{msg}");
        let msg = validate_stream("bucket", "$x").unwrap_err().to_string();
        assert!(msg.contains("\"$x\" "), "{msg}");
    }

    #[test]
    fn the_group_is_fnv1a_64_of_the_key_and_zero_with_one_group() {
        // 6509609049879196279 = FNV-1a 64 of "bench/events", computed independently.
        assert_eq!(group_of(b"bench/events", 4), 3);
        assert_eq!(group_of(b"bench/events", 12), 7);
        assert_eq!(group_of(b"bench/events", 1), 0);
        assert_eq!(group_of(b"bench/events", 0), 0);
    }

    proptest::proptest! {
        #[test]
        fn incarnation_hex_is_32_lowercase_digits(n in proptest::prelude::any::<u128>()) {
            let inc = Incarnation(n);
            proptest::prop_assert_eq!(inc.to_string(), format!("{n:032x}"));
            proptest::prop_assert_eq!(Incarnation::parse(&inc.to_string()), Some(inc));
        }
    }

    #[test]
    fn bucket_rules() {
        assert!(validate_bucket("demo").is_ok());
        assert!(validate_bucket("__compat_v1").is_ok());
        assert!(validate_bucket("abc").is_err());
        assert!(validate_bucket("Demo").is_err());
        assert!(validate_bucket(&"a".repeat(65)).is_err());
    }

    #[test]
    fn stream_rules() {
        assert!(validate_stream("demo", "hello world:1").is_ok());
        for bad in ["", "a/b", "a..b", "$x", "streams", "__ds", "a\0b"] {
            assert!(validate_stream("demo", bad).is_err(), "{bad:?}");
        }
        assert!(validate_stream("demo", &"x".repeat(117)).is_ok());
        assert!(validate_stream("demo", &"x".repeat(118)).is_err());
    }

    #[test]
    fn compat_escape_round_trips() {
        for name in ["events/abc", "50%/x", "plain", "%2F"] {
            assert_eq!(unescape_compat_id(&escape_compat_name(name)), name);
        }
        assert_eq!(escape_compat_name("events/abc"), "events%2Fabc");
        assert_eq!(escape_compat_name("50%/x"), "50%25%2Fx");
    }

    #[test]
    fn incarnation_format() {
        let i = Incarnation(0x186f_2b3a_1c0d_9e00);
        assert_eq!(i.to_string(), "0000000000000000186f2b3a1c0d9e00");
        assert_eq!(Incarnation::parse(&i.to_string()), Some(i));
        assert_eq!(Incarnation::parse("xyz"), None);
    }
}
