//! A GET-only HTTP/1.1 keep-alive connection that discards response bodies inside the kernel.
//!
//! Catch-up reads move gigabytes per second over loopback. Received with `read`, every byte
//! is copied from the socket into the generator, and on a two-core machine (server on one
//! core, generator on the other) that copy, not the server, set the read presets' ceiling:
//! both servers delivered what one receiving core could take. Here the response head is read
//! in small pieces and parsed with `httparse`, and the body's bytes are `splice`d from the
//! socket into a pipe and from the pipe into `/dev/null`: the kernel hands the pages over
//! instead of copying them. Chunk-size lines of a chunked body are read the ordinary way;
//! their data is spliced too. Bodies are counted, not looked at: the `read` scenario compares
//! each stream's byte count with what it wrote.
//!
//! Redirects are not followed here: the caller sends a request that was redirected again
//! through [`super::Conn`]. Linux only (`splice(2)`); elsewhere the scenario uses `Conn`.

use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use rustix::pipe::{PipeFlags, SpliceFlags, fcntl_setpipe_size, pipe_with, splice};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::TcpStream;

use super::{Body, Endpoint};

/// The pipe's capacity asked for: one splice moves at most this much.
const PIPE_BYTES: usize = 1 << 20;
/// Bytes read at a time while looking for a head or a chunk-size line. Small, so that little
/// of the body that follows is copied into user space with it.
const LINE_READ: usize = 512;
/// A response head longer than this is refused.
const MAX_HEAD: usize = 64 * 1024;
const MAX_HEADERS: usize = 64;

/// How a response's body ends.
enum Framing {
    None,
    Length(u64),
    Chunked,
    Close,
}

/// The server closed the connection before any byte of an answer's head arrived.
#[derive(Debug)]
struct ClosedIdle;

impl std::fmt::Display for ClosedIdle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection closed by the server before an answer")
    }
}

impl std::error::Error for ClosedIdle {}

pub struct SinkConn {
    ep: Arc<Endpoint>,
    stream: Option<TcpStream>,
    /// Bytes received but not yet consumed (a head's tail, a chunk-size line's tail).
    buf: Vec<u8>,
    pipe_r: OwnedFd,
    pipe_w: OwnedFd,
    devnull: File,
}

impl SinkConn {
    pub fn new(ep: Arc<Endpoint>) -> Result<Self> {
        let (pipe_r, pipe_w) = pipe_with(PipeFlags::CLOEXEC).context("pipe")?;
        // Smaller pipes (pipe-max-size) still work, one splice per pipe's worth.
        let _ = fcntl_setpipe_size(&pipe_w, PIPE_BYTES);
        let devnull = File::options()
            .write(true)
            .open("/dev/null")
            .context("open /dev/null")?;
        Ok(Self {
            ep,
            stream: None,
            buf: Vec::with_capacity(MAX_HEAD),
            pipe_r,
            pipe_w,
            devnull,
        })
    }

    /// Drop the connection (after an error or a time-out mid-response), and the pipe, which
    /// may hold bytes of the abandoned body.
    pub fn reset(&mut self) {
        self.stream = None;
        self.buf.clear();
        if let Ok((r, w)) = pipe_with(PipeFlags::CLOEXEC) {
            let _ = fcntl_setpipe_size(&w, PIPE_BYTES);
            (self.pipe_r, self.pipe_w) = (r, w);
        }
    }

    /// GET `uri` and discard the body: status, headers and the body's length.
    pub async fn get(&mut self, req: Request<Body>) -> Result<(http::response::Parts, u64)> {
        let reused = self.stream.is_some();
        let mut r = self.exchange(&req).await;
        // A kept-alive connection the server closed while it was idle: a GET may be sent again.
        if reused && r.as_ref().is_err_and(|e| e.is::<ClosedIdle>()) {
            self.reset();
            r = self.exchange(&req).await;
        }
        if r.is_err() {
            self.reset();
        }
        r
    }

    async fn exchange(&mut self, req: &Request<Body>) -> Result<(http::response::Parts, u64)> {
        let stream = match &mut self.stream {
            Some(s) => s,
            None => {
                let s = super::connect_tcp(self.ep.addr).await?;
                self.buf.clear();
                self.stream.insert(s)
            }
        };
        stream.write_all(&request_head(req)).await?;
        let (parts, framing) = self.read_head().await?;
        let close = parts
            .headers
            .get(CONNECTION)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
        let n = match framing {
            Framing::None => 0,
            Framing::Length(n) => {
                self.skip(n).await?;
                n
            }
            Framing::Chunked => self.skip_chunked().await?,
            Framing::Close => self.skip_to_close().await?,
        };
        if close || matches!(framing, Framing::Close) {
            self.reset();
        }
        Ok((parts, n))
    }

    /// Read more bytes into `buf` (at most `LINE_READ`); an error at end of stream, which is
    /// [`ClosedIdle`] when `buf` was empty.
    async fn fill(&mut self) -> Result<()> {
        let stream = self.stream.as_mut().context("not connected")?;
        let len = self.buf.len();
        self.buf.resize(len + LINE_READ, 0);
        let n = stream.read(&mut self.buf[len..]).await;
        self.buf.truncate(len + *n.as_ref().unwrap_or(&0));
        if n? == 0 {
            if len == 0 {
                return Err(ClosedIdle.into());
            }
            bail!("connection closed by the server");
        }
        Ok(())
    }

    async fn read_head(&mut self) -> Result<(http::response::Parts, Framing)> {
        loop {
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut res = httparse::Response::new(&mut headers);
            if let httparse::Status::Complete(len) = res.parse(&self.buf)? {
                let status = StatusCode::from_u16(res.code.unwrap_or(0))?;
                let mut resp = Response::new(());
                *resp.status_mut() = status;
                let hm = resp.headers_mut();
                for h in res.headers.iter() {
                    hm.append(
                        HeaderName::from_bytes(h.name.as_bytes())?,
                        HeaderValue::from_bytes(h.value)?,
                    );
                }
                self.buf.drain(..len);
                let (parts, ()) = resp.into_parts();
                // An interim answer (100 Continue, 103 Early Hints): the final one follows.
                if parts.status.is_informational()
                    && parts.status != StatusCode::SWITCHING_PROTOCOLS
                {
                    continue;
                }
                let framing = framing(&parts)?;
                return Ok((parts, framing));
            }
            if self.buf.len() >= MAX_HEAD {
                bail!("response head longer than {MAX_HEAD} bytes");
            }
            self.fill().await?;
        }
    }

    /// Consume `n` body bytes: those already buffered, the rest spliced.
    async fn skip(&mut self, n: u64) -> Result<()> {
        let buffered = (self.buf.len() as u64).min(n) as usize;
        self.buf.drain(..buffered);
        let mut left = n - buffered as u64;
        while left > 0 {
            match self.splice_some(left).await? {
                0 => bail!("connection closed mid-body"),
                moved => left -= moved as u64,
            }
        }
        Ok(())
    }

    /// Move up to `max` bytes from the socket to /dev/null; how many moved, 0 at end of
    /// stream.
    async fn splice_some(&mut self, max: u64) -> Result<usize> {
        let stream = self.stream.as_ref().context("not connected")?;
        let want = max.min(PIPE_BYTES as u64) as usize;
        let moved = loop {
            stream.readable().await?;
            let r = stream.try_io(Interest::READABLE, || {
                splice(
                    stream,
                    None,
                    &self.pipe_w,
                    None,
                    want,
                    SpliceFlags::MOVE | SpliceFlags::NONBLOCK,
                )
                .map_err(io::Error::from)
            });
            match r {
                Ok(m) => break m,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e.into()),
            }
        };
        // The pipe holds exactly `moved` bytes and /dev/null takes them all at once.
        let mut left = moved;
        while left > 0 {
            left -= splice(
                &self.pipe_r,
                None,
                &self.devnull,
                None,
                left,
                SpliceFlags::MOVE,
            )?;
        }
        Ok(moved)
    }

    /// A chunked body: size lines parsed, data spliced; returns the data bytes.
    async fn skip_chunked(&mut self) -> Result<u64> {
        let mut total = 0u64;
        loop {
            let line = self.line().await?;
            let hex = line.split(|&b| b == b';').next().unwrap_or_default();
            let hex = std::str::from_utf8(hex)?.trim();
            let size =
                u64::from_str_radix(hex, 16).with_context(|| format!("chunk size {hex:?}"))?;
            if size == 0 {
                // Trailers, then the empty line.
                while !self.line().await?.is_empty() {}
                return Ok(total);
            }
            self.skip(size).await?;
            total += size;
            if !self.line().await?.is_empty() {
                bail!("chunk data longer than its size");
            }
        }
    }

    /// The next CRLF-terminated line, without the CRLF.
    async fn line(&mut self) -> Result<Vec<u8>> {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = self.buf[..i].to_vec();
                self.buf.drain(..i + 2);
                return Ok(line);
            }
            if self.buf.len() >= MAX_HEAD {
                bail!("chunk line longer than {MAX_HEAD} bytes");
            }
            self.fill().await?;
        }
    }

    /// A body that ends when the server closes the connection.
    async fn skip_to_close(&mut self) -> Result<u64> {
        let mut total = std::mem::take(&mut self.buf).len() as u64;
        loop {
            match self.splice_some(PIPE_BYTES as u64).await? {
                0 => return Ok(total),
                n => total += n as u64,
            }
        }
    }
}

/// The request line and headers (GET carries no body).
fn request_head(req: &Request<Body>) -> Vec<u8> {
    let pq = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let mut head = Vec::with_capacity(128 + pq.len());
    head.extend_from_slice(req.method().as_str().as_bytes());
    head.push(b' ');
    head.extend_from_slice(pq.as_bytes());
    head.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in req.headers() {
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    head
}

fn framing(parts: &http::response::Parts) -> Result<Framing> {
    let s = parts.status;
    if s.is_informational() || s == StatusCode::NO_CONTENT || s == StatusCode::NOT_MODIFIED {
        return Ok(Framing::None);
    }
    if let Some(te) = parts.headers.get(TRANSFER_ENCODING) {
        if te.as_bytes().eq_ignore_ascii_case(b"chunked") {
            return Ok(Framing::Chunked);
        }
        bail!("unsupported transfer-encoding {te:?}");
    }
    match parts.headers.get(CONTENT_LENGTH) {
        Some(v) => Ok(Framing::Length(v.to_str()?.trim().parse()?)),
        None => Ok(Framing::Close),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::{Layout, Target};
    use std::sync::Mutex;
    use tokio::net::TcpListener;

    /// A loopback server that answers each request head with the next scripted response, as
    /// raw bytes, and closes the connection after it when its flag says so. Counts the
    /// connections it accepted.
    async fn scripted(answers: Vec<(Vec<u8>, bool)>) -> Result<(Arc<Endpoint>, Arc<Mutex<u32>>)> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let accepted = Arc::new(Mutex::new(0u32));
        let count = accepted.clone();
        tokio::spawn(async move {
            let mut answers = answers.into_iter();
            'conns: while let Ok((mut s, _)) = listener.accept().await {
                *count.lock().unwrap() += 1;
                loop {
                    let mut head = Vec::new();
                    while !head.ends_with(b"\r\n\r\n") {
                        let mut b = [0u8; 1];
                        match s.read(&mut b).await {
                            Ok(1) => head.push(b[0]),
                            _ => continue 'conns,
                        }
                    }
                    let Some((resp, close)) = answers.next() else {
                        return;
                    };
                    if s.write_all(&resp).await.is_err() || close {
                        continue 'conns;
                    }
                }
            }
        });
        let target = Target::parse(&url, Layout::Native, "b")?;
        Ok((Endpoint::resolve(target).await?, accepted))
    }

    fn with_length(n: usize) -> Vec<u8> {
        let mut r =
            format!("HTTP/1.1 200 OK\r\ncontent-length: {n}\r\nstream-next-offset: 42\r\n\r\n")
                .into_bytes();
        r.extend(std::iter::repeat_n(b'x', n));
        r
    }

    fn chunked(sizes: &[usize]) -> Vec<u8> {
        let mut r = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        for &n in sizes {
            r.extend(format!("{n:x};ext=1\r\n").into_bytes());
            r.extend(std::iter::repeat_n(b'y', n));
            r.extend(b"\r\n");
        }
        r.extend(b"0\r\ntrailer: t\r\n\r\n");
        r
    }

    async fn get(c: &mut SinkConn, ep: &Endpoint) -> Result<(http::response::Parts, u64)> {
        c.get(ep.get(ep.target.read_uri("/b/s", "-1", "")?)).await
    }

    #[tokio::test]
    async fn counts_bodies_of_every_framing_on_one_connection() -> Result<()> {
        let big = 3 * PIPE_BYTES + 17;
        let answers = vec![
            (with_length(big), false),
            (chunked(&[1, 5000, PIPE_BYTES + 3]), false),
            (
                b"HTTP/1.1 204 No Content\r\nstream-next-offset: 7\r\n\r\n".to_vec(),
                false,
            ),
            (with_length(10), false),
        ];
        let (ep, accepted) = scripted(answers).await?;
        let mut c = SinkConn::new(ep.clone())?;
        let (parts, n) = get(&mut c, &ep).await?;
        assert_eq!((parts.status, n), (StatusCode::OK, big as u64));
        assert_eq!(parts.headers["stream-next-offset"], "42");
        let (_, n) = get(&mut c, &ep).await?;
        assert_eq!(n, (1 + 5000 + PIPE_BYTES + 3) as u64);
        let (parts, n) = get(&mut c, &ep).await?;
        assert_eq!((parts.status, n), (StatusCode::NO_CONTENT, 0));
        assert_eq!(get(&mut c, &ep).await?.1, 10);
        assert_eq!(*accepted.lock().unwrap(), 1, "one keep-alive connection");
        Ok(())
    }

    #[tokio::test]
    async fn an_interim_answer_is_skipped_and_an_idle_close_is_retried_once() -> Result<()> {
        let mut interim = b"HTTP/1.1 100 Continue\r\n\r\n".to_vec();
        interim.extend(with_length(3));
        let answers = vec![
            (interim, false),
            // The server closes the kept-alive connection instead of answering.
            (Vec::new(), true),
            (with_length(5), false),
            (with_length(7), false),
        ];
        let (ep, accepted) = scripted(answers).await?;
        let mut c = SinkConn::new(ep.clone())?;
        let (parts, n) = get(&mut c, &ep).await?;
        assert_eq!((parts.status, n), (StatusCode::OK, 3));
        assert_eq!(
            get(&mut c, &ep).await?.1,
            5,
            "sent again on a new connection"
        );
        assert_eq!(get(&mut c, &ep).await?.1, 7);
        assert_eq!(*accepted.lock().unwrap(), 2);
        Ok(())
    }

    #[tokio::test]
    async fn a_body_cut_short_is_an_error_and_the_next_request_reconnects() -> Result<()> {
        let mut cut = with_length(100_000);
        cut.truncate(cut.len() - 1000);
        let mut close_delimited = b"HTTP/1.1 200 OK\r\n\r\n".to_vec();
        close_delimited.extend([b'z'; 300]);
        let answers = vec![
            (cut, true),
            (close_delimited, true),
            (with_length(5), false),
        ];
        let (ep, accepted) = scripted(answers).await?;
        let mut c = SinkConn::new(ep.clone())?;
        assert!(
            get(&mut c, &ep).await.is_err(),
            "a truncated body is not a read"
        );
        // The server wrote a body delimited by its close; the sink counts it and reconnects.
        assert_eq!(get(&mut c, &ep).await?.1, 300);
        assert_eq!(get(&mut c, &ep).await?.1, 5);
        assert_eq!(*accepted.lock().unwrap(), 3);
        Ok(())
    }
}
