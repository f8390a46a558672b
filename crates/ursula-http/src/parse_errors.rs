//! JSON error bodies for the answers hyper writes on its own.
//!
//! hyper answers a request it cannot parse (a bad request line or header section, a target or
//! a header section over its limits) itself, before any route runs: a 4xx head with
//! `connection: close`, `content-length: 0` and no body, after which it closes the connection.
//! It offers no hook to change that answer, and the spec wants the JSON error body there too
//! (spec/open-questions.md OQ-32, errors.md §2.1).
//!
//! [`JsonParseErrors`] sits between hyper and the socket and recognises that canned answer in
//! what hyper writes; the same head goes out with our common headers and a JSON body carrying
//! the matching code. Two guards keep it from touching anything else:
//! - it only looks at writes while the connection is *armed*: no request is in the service.
//!   A connection starts armed, the service disarms it when it takes a request and arms it
//!   again when its response is ready ([`Armed`]). hyper answers a parse error in exactly that
//!   state, also for a request that arrived in the same read as the one before it (a
//!   pipelined request): that is why arming follows the service, not the socket's reads;
//! - the write must be exactly hyper's answer and nothing else, in one buffer: one of its
//!   three status lines, then `connection: close`, `content-length: 0` and a `date`.
//!   Our own heads never look like that (they carry `x-content-type-options`). A response
//!   body is written while armed, so a body that is exactly such an answer, written on its
//!   own, would be replaced: only a stream whose bytes are that very text can produce it,
//!   and its readers then get a JSON error and a closed connection instead of the text.
//!
//! hyper answers `431` both for a header section over its buffer and for a request line
//! over it (a target of about 400 KiB and more); it answers `414` only for a shorter target
//! over its URI limit. The stream tells the two apart: while armed it notes whether a line
//! end arrived since the service took the last request, and a `431` before any line end is
//! an overlong target, answered `414 URI_TOO_LONG` like the shorter ones.
//!
//! Everything else passes through untouched; the check costs a flag load per write.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use ursula_core::ErrorCode;

use crate::error_body;

/// The status lines hyper answers unparseable requests with, and our code for each.
const CANNED: [(&[u8], ErrorCode, &str); 3] = [
    (
        b"HTTP/1.1 400 Bad Request",
        ErrorCode::MALFORMED_REQUEST,
        "the request line or header section could not be parsed",
    ),
    (
        b"HTTP/1.1 414 URI Too Long",
        ErrorCode::URI_TOO_LONG,
        "the request target is longer than this server accepts",
    ),
    (
        b"HTTP/1.1 431 Request Header Fields Too Large",
        ErrorCode::HEADERS_TOO_LARGE,
        "the request's header section is larger than this server accepts",
    ),
];
/// What follows the status line in hyper's answer, up to the date's value.
const CANNED_HEADERS: &[u8] = b"\r\nconnection: close\r\ncontent-length: 0\r\ndate: ";
/// An HTTP date (`Mon, 30 Nov 2026 11:23:19 GMT`) is always this long.
const HTTP_DATE_LEN: usize = 29;
/// The longest of hyper's canned answers (the `431`), in bytes.
const CANNED_MAX_LEN: usize = CANNED[2].0.len() + CANNED_HEADERS.len() + HTTP_DATE_LEN + 4;

/// Whether a request is in the service (see the module docs), and whether a line end arrived
/// since it took the last one. Shared by a connection's stream and its service.
#[derive(Clone, Debug)]
pub struct Armed(Arc<[AtomicBool; 2]>);

impl Default for Armed {
    /// A new connection: armed, no line end seen.
    fn default() -> Self {
        Armed(Arc::new([AtomicBool::new(true), AtomicBool::new(false)]))
    }
}

impl Armed {
    /// Called by the service when it takes a request.
    pub fn disarm(&self) {
        self.0[0].store(false, Ordering::Relaxed);
        self.0[1].store(false, Ordering::Relaxed);
    }

    /// Called by the service when its response is ready: the next request is hyper's again.
    pub fn arm(&self) {
        self.0[0].store(true, Ordering::Relaxed);
    }

    fn is_armed(&self) -> bool {
        self.0[0].load(Ordering::Relaxed)
    }

    /// Notes the bytes hyper reads while armed (a request head), until one holds a line end.
    fn saw(&self, bytes: &[u8]) {
        if self.is_armed() && !self.line_ended() && bytes.contains(&b'\n') {
            self.0[1].store(true, Ordering::Relaxed);
        }
    }

    fn line_ended(&self) -> bool {
        self.0[1].load(Ordering::Relaxed)
    }
}

/// A connection's byte stream, with hyper's bodiless error answers given JSON bodies.
#[derive(Debug)]
pub struct JsonParseErrors<S> {
    inner: S,
    armed: Armed,
    /// An answer being written in place of hyper's: the bytes, how many went out, and how
    /// many bytes of hyper's to report once all did.
    replacing: Option<(Vec<u8>, usize, usize)>,
}

impl<S> JsonParseErrors<S> {
    pub fn new(inner: S, armed: Armed) -> Self {
        JsonParseErrors {
            inner,
            armed,
            replacing: None,
        }
    }
}

/// The answer to write instead of `head`, if `head` is exactly hyper's canned error answer.
/// `line_ended`: whether the request's first line was complete (else a `431` is a `414`).
fn replacement(head: &[u8], line_ended: bool) -> Option<Vec<u8>> {
    // Measured before anything is read: a response body may be a buffer of a mapped file
    // (`send_file.rs`) that this process never touches otherwise, and reading its first bytes
    // here cost a page fault per buffer (3 % of the server's CPU in a cold read benchmark).
    if head.len() > CANNED_MAX_LEN {
        return None;
    }
    let found = CANNED.iter().find(|(line, _, _)| head.starts_with(line))?;
    let date_line = head[found.0.len()..].strip_prefix(CANNED_HEADERS)?;
    let (status, code, message) = match found.1 {
        ErrorCode::HEADERS_TOO_LARGE if !line_ended => &CANNED[1],
        _ => found,
    };
    let date = date_line.strip_suffix(b"\r\n\r\n")?;
    if date.len() != HTTP_DATE_LEN
        || !date
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b" ,:".contains(b))
    {
        return None;
    }
    let body = error_body(*code, message);
    let mut out = Vec::with_capacity(head.len() + body.len() + 160);
    out.extend_from_slice(status);
    // hyper's `connection: close`, the headers every answer of ours carries
    // (`http::common_headers`), the body's, then hyper's `date`.
    out.extend_from_slice(
        b"\r\nconnection: close\r\nx-content-type-options: nosniff\
          \r\ncross-origin-resource-policy: cross-origin\r\ncache-control: no-store\
          \r\ncontent-type: application/json\r\ncontent-length: ",
    );
    out.extend_from_slice(body.len().to_string().as_bytes());
    out.extend_from_slice(b"\r\ndate: ");
    out.extend_from_slice(date);
    out.extend_from_slice(b"\r\n\r\n");
    out.extend_from_slice(body.as_bytes());
    Some(out)
}

impl<S: AsyncWrite + Unpin> JsonParseErrors<S> {
    /// Writes the pending replacement; reports hyper's bytes as written once all of it is.
    fn poll_replacing(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let Some((bytes, written, reported)) = self.replacing.as_mut() else {
            return Poll::Ready(Ok(0));
        };
        while *written < bytes.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &bytes[*written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *written += n;
        }
        let reported = *reported;
        self.replacing = None;
        Poll::Ready(Ok(reported))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for JsonParseErrors<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let res = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Some(new) = buf.filled().get(before..) {
            this.armed.saw(new);
        }
        res
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for JsonParseErrors<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.replacing.is_none() {
            match (this.armed.is_armed())
                .then(|| replacement(buf, this.armed.line_ended()))
                .flatten()
            {
                Some(bytes) => this.replacing = Some((bytes, 0, buf.len())),
                None => return Pin::new(&mut this.inner).poll_write(cx, buf),
            }
        }
        this.poll_replacing(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.replacing.is_none() {
            // hyper's canned answer is a head alone, in one buffer.
            let mut non_empty = bufs.iter().filter(|b| !b.is_empty());
            let only = match (non_empty.next(), non_empty.next()) {
                (Some(b), None) if this.armed.is_armed() => Some(b),
                _ => None,
            };
            let line_ended = this.armed.line_ended();
            match only.and_then(|b| replacement(b, line_ended).map(|r| (r, b.len()))) {
                Some((bytes, len)) => this.replacing = Some((bytes, 0, len)),
                None => return Pin::new(&mut this.inner).poll_write_vectored(cx, bufs),
            }
        }
        this.poll_replacing(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_replacing(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_replacing(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const CANNED_431: &[u8] = b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\ndate: Mon, 30 Nov 2026 11:23:19 GMT\r\n\r\n";

    fn split(answer: &[u8]) -> (String, serde_json::Value) {
        let text = std::str::from_utf8(answer).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        (head.to_owned(), serde_json::from_str(body).unwrap())
    }

    #[test]
    fn canned_answers_get_the_json_body_and_keep_their_head() {
        // The longest canned answer is at the length limit and still recognised.
        assert_eq!(CANNED_431.len(), CANNED_MAX_LEN);
        let out = replacement(CANNED_431, true).expect("recognised");
        let (head, body) = split(&out);
        assert!(head.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"));
        assert!(head.contains("\r\nconnection: close\r\n"));
        assert!(head.contains("\r\ndate: Mon, 30 Nov 2026 11:23:19 GMT"));
        assert!(head.contains("\r\ncontent-type: application/json\r\n"));
        assert!(head.contains("\r\nx-content-type-options: nosniff\r\n"));
        let len: usize = head
            .split("\r\n")
            .find_map(|l| l.strip_prefix("content-length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(len, out.len() - head.len() - 4);
        assert_eq!(body["error"]["code"], "HEADERS_TOO_LARGE");

        for (status, code) in [
            ("400 Bad Request", "MALFORMED_REQUEST"),
            ("414 URI Too Long", "URI_TOO_LONG"),
        ] {
            let canned = format!(
                "HTTP/1.1 {status}\r\nconnection: close\r\ncontent-length: 0\r\ndate: Mon, 30 Nov 2026 11:23:19 GMT\r\n\r\n"
            );
            let (_, body) = split(&replacement(canned.as_bytes(), true).unwrap());
            assert_eq!(body["error"]["code"], code, "{status}");
        }
    }

    #[test]
    fn a_431_before_the_first_line_ended_is_an_overlong_target() {
        let (head, body) = split(&replacement(CANNED_431, false).unwrap());
        assert!(head.starts_with("HTTP/1.1 414 URI Too Long\r\n"), "{head}");
        assert_eq!(body["error"]["code"], "URI_TOO_LONG");
        let armed = Armed::default();
        armed.saw(b"GET /aaaa");
        assert!(!armed.line_ended());
        armed.saw(b"aa HTTP/1.1\r\n");
        assert!(armed.line_ended());
        // While a request is in the service, its body's line ends do not count.
        armed.disarm();
        armed.saw(b"body\n");
        armed.arm();
        assert!(!armed.line_ended());
    }

    #[test]
    fn other_answers_pass_through() {
        for answer in [
            &b"HTTP/1.1 204 No Content\r\nstream-next-offset: 1\r\n\r\n"[..],
            b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 60\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n", // head cut
            b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
            // Anything beyond hyper's exact answer.
            b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\ndate: Mon, 30 Nov 2026 11:23:19 GMT\r\n\r\nmore",
            b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\nx-a: b\r\ndate: Mon, 30 Nov 2026 11:23:19 GMT\r\n\r\n",
            b"HTTP/1.1 404 Not Found\r\nconnection: close\r\ncontent-length: 0\r\ndate: Mon, 30 Nov 2026 11:23:19 GMT\r\n\r\n",
        ] {
            assert!(replacement(answer, true).is_none(), "{:?}", String::from_utf8_lossy(answer));
        }
    }

    #[tokio::test]
    async fn the_stream_writes_the_replacement_and_reports_hypers_length() {
        let (a, mut b) = tokio::io::duplex(16); // small: the replacement needs many writes
        let armed = Armed::default();
        armed.disarm(); // a request is in the service
        let mut w = JsonParseErrors::new(a, armed.clone());
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            b.read_to_end(&mut got).await.unwrap();
            got
        });
        // Not armed (a request is in the service): even hyper's exact answer, say as a
        // stream's bytes in a body, passes through.
        w.write_all(CANNED_431).await.unwrap();
        armed.arm();
        armed.saw(b"GET / HTTP/1.1\r\nX-Big: ");
        let n = std::future::poll_fn(|cx| Pin::new(&mut w).poll_write(cx, CANNED_431))
            .await
            .unwrap();
        assert_eq!(n, CANNED_431.len());
        w.write_all(b"after").await.unwrap();
        w.shutdown().await.unwrap();
        drop(w);
        let got = reader.await.unwrap();
        let mut want = CANNED_431.to_vec();
        want.extend_from_slice(&replacement(CANNED_431, true).unwrap());
        want.extend_from_slice(b"after");
        assert_eq!(got, want);
    }
}
