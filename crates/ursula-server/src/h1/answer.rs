//! An answer's head as HTTP/1.1 bytes, as hyper would write it: lower-case names in the
//! response's order, then the body's framing, `connection: close` when the connection ends
//! after it, and a `date`.

use http::response::Parts;
use http::{HeaderMap, StatusCode, header};
use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

/// How the body follows the head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// `content-length`, or no length for a status that has no body (1xx, 204, 304).
    Length(u64),
    /// `transfer-encoding: chunked`.
    Chunked,
}

/// Whether an answer with `status` carries a body at all (RFC 9110 §6.4.1).
pub fn has_body(status: StatusCode) -> bool {
    !(status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED)
}

/// Whether the handler asked for the connection to end after this answer.
pub fn wants_close(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .any(|v| super::head::has_token(v.as_bytes(), "close"))
}

/// Appends the head of an answer to `out`. Framing headers the handler set are replaced by
/// `framing`'s own.
pub fn write_head(out: &mut Vec<u8>, parts: &Parts, framing: Framing, close: bool) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(parts.status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(
        parts
            .status
            .canonical_reason()
            .unwrap_or("<none>")
            .as_bytes(),
    );
    out.extend_from_slice(b"\r\n");
    for (name, value) in &parts.headers {
        if name == header::CONTENT_LENGTH
            || name == header::TRANSFER_ENCODING
            || name == header::CONNECTION
            || name == header::DATE
        {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    match framing {
        Framing::Length(n) if has_body(parts.status) => {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        Framing::Length(_) => {}
        Framing::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"date: ");
    with_date(|d| out.extend_from_slice(d));
    out.extend_from_slice(b"\r\n\r\n");
}

/// The current second as an HTTP date (`Sun, 06 Dec 2026 22:35:00 GMT`), formatted once per
/// second per thread.
fn with_date(f: impl FnOnce(&[u8])) {
    thread_local! {
        static DATE: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
    }
    let now = SystemTime::now();
    let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    DATE.with(|cell| {
        let mut cached = cell.borrow_mut();
        if cached.0 != secs {
            *cached = (secs, httpdate::fmt_http_date(now));
        }
        f(cached.1.as_bytes());
    });
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;
    use http::{HeaderValue, Response};

    fn head_of(resp: Response<()>, framing: Framing, close: bool) -> String {
        let (parts, ()) = resp.into_parts();
        let mut out = Vec::new();
        write_head(&mut out, &parts, framing, close);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn a_head_lists_the_headers_then_length_and_date() {
        let mut resp = Response::new(());
        *resp.status_mut() = StatusCode::OK;
        resp.headers_mut()
            .insert("stream-next-offset", HeaderValue::from_static("12"));
        resp.headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from_static("999"));
        let text = head_of(resp, Framing::Length(5), false);
        let (first, rest) = text.split_once("\r\n").unwrap();
        assert_eq!(first, "HTTP/1.1 200 OK");
        assert!(rest.starts_with("stream-next-offset: 12\r\ncontent-length: 5\r\ndate: "));
        assert!(rest.ends_with(" GMT\r\n\r\n"), "{rest:?}");
        assert!(!rest.contains("999"), "the handler's length is replaced");
        let date = rest.split("date: ").nth(1).unwrap().trim_end();
        assert!(httpdate::parse_http_date(date).is_ok(), "{date:?}");
    }

    #[test]
    fn no_content_has_no_length_and_close_is_said() {
        let mut resp = Response::new(());
        *resp.status_mut() = StatusCode::NO_CONTENT;
        let text = head_of(resp, Framing::Length(0), true);
        assert!(text.starts_with("HTTP/1.1 204 No Content\r\nconnection: close\r\ndate: "));
        assert!(!text.contains("content-length"));
    }

    #[test]
    fn an_unknown_length_is_chunked() {
        let mut resp = Response::new(());
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("Close"));
        let (parts, ()) = resp.into_parts();
        assert!(wants_close(&parts.headers));
        let mut out = Vec::new();
        write_head(&mut out, &parts, Framing::Chunked, true);
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("\r\ntransfer-encoding: chunked\r\nconnection: close\r\n"));
        assert_eq!(text.matches("connection").count(), 1);
    }
}
