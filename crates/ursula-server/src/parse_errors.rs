//! JSON error bodies for the answers hyper writes on its own.
//!
//! hyper answers a request it cannot parse (a bad request line or header section, a target or
//! a header section over its limits) itself, before any route runs: a 4xx head with
//! `connection: close`, `content-length: 0` and no body, after which it closes the connection.
//! It offers no hook to change that answer, and the spec wants the JSON error body there too
//! (spec/open-questions.md OQ-32, errors.md §2.1).
//!
//! [`JsonParseErrors`] sits between hyper and the socket and recognises that canned answer in
//! what hyper writes. No route of ours produces it: every error a route renders carries a JSON
//! body, so its `content-length` is never 0. The same head goes out with a
//! `content-type: application/json` body carrying the matching code. Everything else passes
//! through untouched; the check costs one prefix comparison per write.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use ursula_core::ErrorCode;

use crate::http::error::error_body;

/// The header lines that mark hyper's own error answer (in the order hyper writes them).
const CANNED_MARK: &[u8] = b"\r\nconnection: close\r\ncontent-length: 0\r\n";

/// A connection's byte stream, with hyper's bodiless error answers given JSON bodies.
#[derive(Debug)]
pub struct JsonParseErrors<S> {
    inner: S,
    /// An answer being written in place of hyper's: the bytes, how many went out, and how
    /// many bytes of hyper's to report once all did.
    replacing: Option<(Vec<u8>, usize, usize)>,
}

impl<S> JsonParseErrors<S> {
    pub fn new(inner: S) -> Self {
        JsonParseErrors {
            inner,
            replacing: None,
        }
    }
}

/// The answer to write instead of `head`, if `head` is hyper's canned error answer.
fn replacement(head: &[u8]) -> Option<Vec<u8>> {
    if !head.starts_with(b"HTTP/1.1 4") || !head.ends_with(b"\r\n\r\n") {
        return None;
    }
    let at = head
        .windows(CANNED_MARK.len())
        .position(|w| w == CANNED_MARK)?;
    let (code, message) = match head.get(9..12)? {
        b"431" => (
            ErrorCode::HEADERS_TOO_LARGE,
            "the request's header section is larger than this server accepts",
        ),
        b"414" => (
            ErrorCode::URI_TOO_LONG,
            "the request target is longer than this server accepts",
        ),
        b"408" => (
            ErrorCode::REQUEST_TIMEOUT,
            "the request head did not arrive in time",
        ),
        b"413" => (
            ErrorCode::PAYLOAD_TOO_LARGE,
            "the request is larger than this server accepts",
        ),
        _ => (
            ErrorCode::MALFORMED_REQUEST,
            "the request line or header section could not be parsed",
        ),
    };
    let body = error_body(code, message);
    // Keep hyper's head (status line, `connection: close`, `date`), with the body's headers
    // in place of `content-length: 0`.
    let keep_to = at + b"\r\nconnection: close".len();
    let rest = &head[at + CANNED_MARK.len()..];
    let mut out = Vec::with_capacity(head.len() + body.len() + 64);
    out.extend_from_slice(&head[..keep_to]);
    // The headers every answer of ours carries (`http::common_headers`), then the body's.
    out.extend_from_slice(
        b"\r\nx-content-type-options: nosniff\r\ncross-origin-resource-policy: cross-origin\
          \r\ncache-control: no-store\r\ncontent-type: application/json\r\ncontent-length: ",
    );
    out.extend_from_slice(body.len().to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(rest);
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
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
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
            match replacement(buf) {
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
            let first = bufs.iter().find(|b| !b.is_empty());
            match first.and_then(|b| replacement(b).map(|r| (r, b.len()))) {
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
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
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
        let out = replacement(CANNED_431).expect("recognised");
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
            ("408 Request Timeout", "REQUEST_TIMEOUT"),
        ] {
            let canned = format!(
                "HTTP/1.1 {status}\r\nconnection: close\r\ncontent-length: 0\r\ndate: x\r\n\r\n"
            );
            let (_, body) = split(&replacement(canned.as_bytes()).unwrap());
            assert_eq!(body["error"]["code"], code, "{status}");
        }
    }

    #[test]
    fn other_answers_pass_through() {
        for answer in [
            &b"HTTP/1.1 204 No Content\r\nstream-next-offset: 1\r\n\r\n"[..],
            b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 60\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n", // head cut
            b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
        ] {
            assert!(replacement(answer).is_none(), "{:?}", String::from_utf8_lossy(answer));
        }
    }

    #[tokio::test]
    async fn the_stream_writes_the_replacement_and_reports_hypers_length() {
        let (a, mut b) = tokio::io::duplex(16); // small: the replacement needs many writes
        let mut w = JsonParseErrors::new(a);
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            b.read_to_end(&mut got).await.unwrap();
            got
        });
        let n = std::future::poll_fn(|cx| Pin::new(&mut w).poll_write(cx, CANNED_431))
            .await
            .unwrap();
        assert_eq!(n, CANNED_431.len());
        w.write_all(b"after").await.unwrap();
        w.shutdown().await.unwrap();
        drop(w);
        let got = reader.await.unwrap();
        let mut want = replacement(CANNED_431).unwrap();
        want.extend_from_slice(b"after");
        assert_eq!(got, want);
    }
}
