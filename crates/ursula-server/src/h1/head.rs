//! Which requests the connection loop answers itself, and their `http::Request`.
//!
//! A request head is taken here only when it is plain: HTTP/1.1, `POST`, `PUT` or `DELETE`,
//! a body framed by one `Content-Length` of at most [`MAX_BODY`] (or no body), an origin-form
//! target, and none of the headers that change how a connection behaves (`Transfer-Encoding`,
//! `Expect`, `Upgrade`, a `Connection` other than `keep-alive` or `close`). Everything else,
//! malformed heads included, is [`Parsed::Handoff`]: hyper gets the connection and answers
//! it, and with it every later request on that connection.

use bytes::{Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, Uri};

/// The largest body a request on this path may declare. Bodies below 64 KiB are copied into
/// an allocation of their own anyway (`http::body::COPY_BELOW`), so reading them whole first
/// costs nothing; a larger one goes to hyper, which hands it over without a copy.
pub const MAX_BODY: usize = 64 * 1024 - 1;
/// The largest head read here; a longer one is hyper's to answer (it allows more, and answers
/// `431` beyond its own limit).
pub const MAX_HEAD: usize = 16 * 1024;
/// Headers per request on this path; a request with more goes to hyper.
const MAX_HEADERS: usize = 48;

/// What the start of a connection's read buffer holds.
#[derive(Debug)]
pub enum Parsed {
    /// A head this path answers.
    Fast(Head),
    /// Not a whole head yet.
    Partial,
    /// A request for hyper (see the module docs).
    Handoff,
}

/// A parsed request head, with offsets into the buffer it was parsed from.
#[derive(Debug)]
pub struct Head {
    method: Method,
    head_len: usize,
    target: (usize, usize),
    /// Header names, and their values' offsets.
    headers: Headers,
    /// The declared body length.
    pub body_len: usize,
    /// The client asked to close the connection after this answer.
    pub close: bool,
}

fn offsets(base: &[u8], part: &[u8]) -> (usize, usize) {
    let start = part.as_ptr() as usize - base.as_ptr() as usize;
    (start, start + part.len())
}

/// Whether a comma-separated header value holds `token` (ASCII case-insensitively).
pub(super) fn has_token(value: &[u8], token: &str) -> bool {
    value
        .split(|&b| b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

/// A `Content-Length` value: ASCII digits only, no sign, no spaces inside.
fn content_length(value: &[u8]) -> Option<usize> {
    let v = value.trim_ascii();
    // `parse` alone would also take a leading `+`.
    if !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// Parses the head at the start of `buf` (see [`Parsed`]).
pub fn parse(buf: &[u8]) -> Parsed {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut slots);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => return Parsed::Partial,
        // Too long, too many headers, or malformed: hyper answers it (with our JSON body,
        // ursula_http::parse_errors) as it answers every such request.
        _ => return Parsed::Handoff,
    };
    if head_len > MAX_HEAD || req.version != Some(1) {
        return Parsed::Handoff;
    }
    let method = match req.method {
        Some("POST") => Method::POST,
        Some("PUT") => Method::PUT,
        Some("DELETE") => Method::DELETE,
        _ => return Parsed::Handoff,
    };
    let Some(path) = req.path.filter(|p| p.starts_with('/')) else {
        return Parsed::Handoff;
    };
    let target = offsets(buf, path.as_bytes());
    let mut body_len = None;
    let mut close = false;
    let mut headers = Vec::with_capacity(req.headers.len());
    for h in req.headers.iter() {
        let Ok(name) = HeaderName::from_bytes(h.name.as_bytes()) else {
            return Parsed::Handoff;
        };
        if name == http::header::CONTENT_LENGTH {
            match (body_len, content_length(h.value)) {
                (None, Some(n)) => body_len = Some(n),
                _ => return Parsed::Handoff,
            }
        } else if name == http::header::CONNECTION {
            let ok = h
                .value
                .split(|&b| b == b',')
                .map(<[u8]>::trim_ascii)
                .all(|t| t.eq_ignore_ascii_case(b"close") || t.eq_ignore_ascii_case(b"keep-alive"));
            if !ok {
                return Parsed::Handoff;
            }
            close |= has_token(h.value, "close");
        } else if name == http::header::TRANSFER_ENCODING
            || name == http::header::EXPECT
            || name == http::header::UPGRADE
        {
            return Parsed::Handoff;
        }
        headers.push((name, offsets(buf, h.value)));
    }
    let body_len = body_len.unwrap_or(0);
    if body_len > MAX_BODY {
        return Parsed::Handoff;
    }
    Parsed::Fast(Head {
        method,
        head_len,
        target,
        headers,
        body_len,
        close,
    })
}

impl Head {
    /// The request, taking its head and body off the front of `buf` (which must hold both).
    /// The target and the header values are slices of the head, as hyper makes them. `None`
    /// when the target or a header value is not valid for `http` (hyper's to answer): `buf`
    /// then holds what it held before.
    pub fn take(mut self, buf: &mut BytesMut) -> Option<Request<Bytes>> {
        debug_assert!(buf.len() >= self.len());
        let head = buf.split_to(self.head_len).freeze();
        let headers = std::mem::take(&mut self.headers);
        let Some((uri, map)) = build(self.target, headers, &head) else {
            let mut restored = BytesMut::with_capacity(head.len() + buf.len());
            restored.extend_from_slice(&head);
            restored.extend_from_slice(buf);
            *buf = restored;
            return None;
        };
        let body = buf.split_to(self.body_len).freeze();
        let mut req = Request::new(body);
        *req.method_mut() = self.method;
        *req.uri_mut() = uri;
        *req.headers_mut() = map;
        Some(req)
    }

    /// Bytes the head and its body take.
    pub fn len(&self) -> usize {
        self.head_len + self.body_len
    }
}

type Headers = Vec<(HeaderName, (usize, usize))>;

fn build(target: (usize, usize), headers: Headers, head: &Bytes) -> Option<(Uri, HeaderMap)> {
    let uri = Uri::from_maybe_shared(head.slice(target.0..target.1)).ok()?;
    let mut map = HeaderMap::with_capacity(headers.len());
    for (name, (start, end)) in headers {
        let value = HeaderValue::from_maybe_shared(head.slice(start..end)).ok()?;
        map.append(name, value);
    }
    Some((uri, map))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const APPEND: &[u8] = b"POST /v1/stream/a/b?x=1 HTTP/1.1\r\nHost: h\r\nContent-Type: text/plain\r\nStream-Seq: 7\r\nContent-Length: 5\r\n\r\nhello";

    fn fast(buf: &[u8]) -> Head {
        match parse(buf) {
            Parsed::Fast(h) => h,
            other => panic!("expected a fast head, got {other:?}"),
        }
    }

    fn is_handoff(buf: &[u8]) -> bool {
        matches!(parse(buf), Parsed::Handoff)
    }

    #[test]
    fn a_plain_append_becomes_a_request_and_leaves_the_next_one() {
        let mut buf = BytesMut::from(APPEND);
        buf.extend_from_slice(b"POST /next");
        let head = fast(&buf);
        assert_eq!(head.len(), APPEND.len());
        assert!(!head.close);
        let req = head.take(&mut buf).unwrap();
        assert_eq!(req.method(), Method::POST);
        assert_eq!(req.uri().path(), "/v1/stream/a/b");
        assert_eq!(req.uri().query(), Some("x=1"));
        assert_eq!(req.headers()["content-type"], "text/plain");
        assert_eq!(req.headers()["stream-seq"], "7");
        assert_eq!(req.headers()["host"], "h");
        assert_eq!(req.body().as_ref(), b"hello");
        assert_eq!(
            &buf[..],
            b"POST /next",
            "a pipelined request stays in the buffer"
        );
        assert!(matches!(parse(&buf), Parsed::Partial));
    }

    #[test]
    fn repeated_headers_keep_every_value_in_order() {
        let raw = b"PUT /s HTTP/1.1\r\nX-A: 1\r\nx-a: 2\r\nContent-Length: 0\r\n\r\n";
        let mut buf = BytesMut::from(&raw[..]);
        let req = fast(&buf).take(&mut buf).unwrap();
        let all: Vec<_> = req.headers().get_all("x-a").iter().collect();
        assert_eq!(all, ["1", "2"]);
        assert!(buf.is_empty());
    }

    #[test]
    fn no_length_is_an_empty_body_and_close_is_noted() {
        let h = fast(b"DELETE /s HTTP/1.1\r\nConnection: keep-alive, Close\r\n\r\n");
        assert_eq!(h.body_len, 0);
        assert!(h.close);
    }

    #[test]
    fn every_unusual_request_goes_to_hyper() {
        let cases: [&[u8]; 15] = [
            b"GET /s HTTP/1.1\r\n\r\n",
            b"HEAD /s HTTP/1.1\r\n\r\n",
            b"OPTIONS /s HTTP/1.1\r\n\r\n",
            b"POST /s HTTP/1.0\r\nContent-Length: 1\r\n\r\nx",
            b"POST /s HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST /s HTTP/1.1\r\nContent-Length: 1\r\nExpect: 100-continue\r\n\r\n",
            b"POST /s HTTP/1.1\r\nUpgrade: websocket\r\n\r\n",
            b"POST /s HTTP/1.1\r\nConnection: upgrade\r\n\r\n",
            b"POST /s HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx",
            b"POST /s HTTP/1.1\r\nContent-Length: +1\r\n\r\nx",
            b"POST /s HTTP/1.1\r\nContent-Length: 1 1\r\n\r\nx",
            b"POST /s HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n",
            b"POST /s HTTP/1.1\r\nContent-Length: 65536\r\n\r\n",
            b"POST http://h/s HTTP/1.1\r\n\r\n",
            b"POST /s HTTP/1.1\r\nBad Header: x\r\n\r\n",
        ];
        for raw in cases {
            assert!(is_handoff(raw), "{:?}", String::from_utf8_lossy(raw));
        }
        let long = format!("POST /s HTTP/1.1\r\nX: {}\r\n", "a".repeat(MAX_HEAD));
        assert!(is_handoff(long.as_bytes()), "a head over MAX_HEAD");
        let many: String = (0..MAX_HEADERS + 1)
            .map(|i| format!("X-{i}: v\r\n"))
            .collect();
        assert!(is_handoff(
            format!("POST /s HTTP/1.1\r\n{many}\r\n").as_bytes()
        ));
        let max = format!("POST /s HTTP/1.1\r\nContent-Length: {MAX_BODY}\r\n\r\n");
        assert_eq!(fast(max.as_bytes()).body_len, MAX_BODY);
    }

    proptest! {
        /// Any prefix of a request that ends before its head does is partial; the whole head
        /// parses to the same request whatever follows it.
        #[test]
        fn a_head_cut_anywhere_is_partial(cut in 0usize..APPEND.len() - 5) {
            prop_assert!(matches!(parse(&APPEND[..cut]), Parsed::Partial));
        }

        /// Arbitrary bytes never panic, and a fast head's request takes exactly its bytes.
        #[test]
        fn arbitrary_bytes_parse_without_panic(
            raw in proptest::collection::vec(any::<u8>(), 0..300),
            prefix in prop_oneof![Just(&b""[..]), Just(&b"POST /s HTTP/1.1\r\n"[..])],
        ) {
            let mut bytes = prefix.to_vec();
            bytes.extend_from_slice(&raw);
            if let Parsed::Fast(h) = parse(&bytes) {
                let total = h.len();
                let mut buf = BytesMut::from(&bytes[..]);
                if total <= buf.len() {
                    let before = buf.len();
                    match h.take(&mut buf) {
                        Some(_) => prop_assert_eq!(buf.len(), before - total),
                        None => prop_assert_eq!(&buf[..], &bytes[..]),
                    }
                }
            }
        }
    }
}
