//! The server's own HTTP/1.1 loop, for the requests that are most of a write-heavy load.
//!
//! An append costs the server about 11 µs of kernel time (socket, sync) and, with hyper, about
//! 10 µs of user space, a third of which was hyper's connection machinery around our handler
//! (docs/benchmarks.md, session 25). This loop reads a connection's requests itself, parses
//! heads with `httparse`, and answers plain writes (head.rs says which) whose body has
//! arrived whole by calling the same handler hyper calls; it writes the answer's head itself
//! (answer.rs). The first request it does not take (any `GET`, a large, chunked or still
//! arriving body, an `Expect`, a malformed head) hands the connection to hyper for good, with
//! the bytes read so far, so reads, live tails and every edge of HTTP/1.1 stay hyper's.
//!
//! Written here rather than taken from a crate because it is the hot path of the product and
//! measurably cheaper than the general server (hyper) that stays behind it for the rest.
//!
//! A request is taken only once its whole body is here; a body still on its way (a large
//! upload, a client that sends the head first) is hyper's, with its streaming, body budget and
//! `body_timeout_ms`. A head must arrive within `header_timeout_ms` of the previous answer, as
//! with hyper (an idle connection is closed silently then). On shutdown an idle connection is
//! closed (also one whose next head has only partly arrived, which hyper would wait for) and a
//! request in progress is answered with `connection: close`; the connection's
//! graceful-shutdown watcher is held until then.

mod answer;
mod head;

use crate::app::App;
use crate::coarse_timer::CoarseSleep;
use crate::http::Resp;
use crate::server::Accepted;
use answer::Framing;
use axum::body::Body;
use bytes::BytesMut;
use head::Parsed;
use http_body_util::BodyExt;
use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

/// Bytes a read asks for at least.
const READ_SIZE: usize = 8 * 1024;
/// Bodies up to this size leave in the same write as their head.
const INLINE_BODY: usize = 16 * 1024;

/// Serves `stream` until it closes, or until a request for hyper arrives.
pub async fn serve<H, F>(mut stream: TcpStream, conn: Accepted<H>)
where
    H: Fn(Arc<App>, hyper::Request<Body>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Resp> + Send + 'static,
{
    let app = conn.app.clone();
    let mut shutdown = app.shutdown.subscribe();
    let header_timeout = Duration::from_millis(app.cfg.header_timeout_ms);
    let mut buf = BytesMut::with_capacity(READ_SIZE);
    let mut out = Vec::with_capacity(512);
    loop {
        let mut deadline = None;
        // How much of `buf` was looked at for a head: httparse runs on the first bytes and
        // then only when a line has ended since, so a head sent a byte at a time is not
        // parsed again for every byte (at most once per line, and a head has few).
        let mut scanned = 0;
        let head = loop {
            if scanned == 0 || memchr::memchr(b'\n', &buf[scanned..]).is_some() {
                match head::parse(&buf) {
                    Parsed::Fast(h) => break h,
                    Parsed::Handoff => return conn.serve_hyper(stream, buf.freeze()).await,
                    Parsed::Partial => {}
                }
            } else if buf.len() >= head::MAX_HEAD {
                return conn.serve_hyper(stream, buf.freeze()).await;
            }
            scanned = buf.len();
            // Taken when the first head byte is awaited; the timer slot only while a read waits.
            let deadline = deadline.get_or_insert_with(|| app.timer.sleep(header_timeout));
            if !fill(&mut stream, &mut buf, deadline, &mut shutdown).await {
                return;
            }
        };
        if buf.len() < head.len() {
            // The body is still on its way. Routes may act on a body as it arrives (a snapshot
            // commit holds its copy slot while its manifest streams in), and hyper's path
            // charges it to the body budget and times it out, so a body that is not here yet
            // is hyper's, unless the socket already holds the rest.
            buf.reserve(head.len() - buf.len());
            let _ = stream.try_read_buf(&mut buf);
            if buf.len() < head.len() {
                return conn.serve_hyper(stream, buf.freeze()).await;
            }
        }
        let asked_close = head.close;
        let Some(req) = head.take(&mut buf) else {
            return conn.serve_hyper(stream, buf.freeze()).await;
        };
        let resp = (conn.handler)(app.clone(), req.map(Body::from)).await;
        let close = asked_close || *shutdown.borrow() || answer::wants_close(resp.headers());
        if write_answer(&mut stream, &mut out, resp, close)
            .await
            .is_err()
            || close
        {
            let _ = stream.shutdown().await;
            return;
        }
    }
}

/// Reads what the socket has into `buf`, waiting for it if it has nothing yet: false when the
/// stream ended or failed, `deadline` passed or the node is shutting down (an idle connection
/// ends with the node; a partial head is dropped with it).
///
/// Through `AsyncRead` rather than `try_read`: a read that returns less than it asked for
/// clears the socket's readiness there, so the next wait goes straight to epoll instead of
/// first making a `recvfrom` that finds nothing (one syscall per request).
async fn fill(
    stream: &mut TcpStream,
    buf: &mut BytesMut,
    deadline: &mut CoarseSleep,
    shutdown: &mut watch::Receiver<bool>,
) -> bool {
    if buf.capacity() - buf.len() < READ_SIZE / 4 {
        buf.reserve(READ_SIZE);
    }
    tokio::select! {
        biased;
        r = stream.read_buf(buf) => matches!(r, Ok(n) if n > 0),
        () = deadline => false,
        _ = shutdown.wait_for(|stopping| *stopping) => false,
    }
}

fn body_error(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("answer body failed: {e}"))
}

/// Writes `resp`: its head and body in one write when the body is small and of known length,
/// else the head and then each piece (chunked when the length is not known).
async fn write_answer(
    stream: &mut TcpStream,
    out: &mut Vec<u8>,
    resp: Resp,
    close: bool,
) -> io::Result<()> {
    let (parts, mut body) = resp.into_parts();
    out.clear();
    // A length the handler set for a streamed body frames it, as with hyper.
    let exact = http_body::Body::size_hint(&body).exact().or_else(|| {
        parts
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse().ok())
    });
    if !answer::has_body(parts.status) {
        answer::write_head(out, &parts, Framing::Length(0), close);
        return stream.write_all(out).await;
    }
    let Some(len) = exact else {
        answer::write_head(out, &parts, Framing::Chunked, close);
        stream.write_all(out).await?;
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame.map_err(body_error)?.into_data() else {
                continue;
            };
            if data.is_empty() {
                continue;
            }
            out.clear();
            out.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
            out.extend_from_slice(&data);
            out.extend_from_slice(b"\r\n");
            stream.write_all(out).await?;
        }
        return stream.write_all(b"0\r\n\r\n").await;
    };
    answer::write_head(out, &parts, Framing::Length(len), close);
    let mut sent = 0u64;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(body_error)?.into_data() else {
            continue;
        };
        sent += data.len() as u64;
        if sent > len {
            return Err(body_error("longer than its length"));
        }
        if out.len() + data.len() <= INLINE_BODY {
            out.extend_from_slice(&data);
        } else {
            if !out.is_empty() {
                stream.write_all(out).await?;
                out.clear();
            }
            stream.write_all(&data).await?;
        }
    }
    if !out.is_empty() {
        stream.write_all(out).await?;
    }
    if sent != len {
        return Err(body_error("shorter than its length"));
    }
    Ok(())
}
