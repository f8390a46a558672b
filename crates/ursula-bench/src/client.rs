//! One HTTP/1.1 keep-alive connection per task (hyper 1 conn API).
//!
//! `Conn` reconnects lazily after a transport error. Requests are built
//! without the fallible builder; bodies are `Bytes` so reusing a payload is
//! a reference-count bump, not a copy.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use http::header::{ACCEPT, CONTENT_TYPE, HOST};
use http::{HeaderName, HeaderValue, Method, Request, Response, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::target::Target;

pub type Body = Full<Bytes>;

pub const STREAM_NEXT_OFFSET: HeaderName = HeaderName::from_static("stream-next-offset");
pub const STREAM_UP_TO_DATE: HeaderName = HeaderName::from_static("stream-up-to-date");
pub const PRODUCER_ID: HeaderName = HeaderName::from_static("producer-id");
pub const PRODUCER_EPOCH: HeaderName = HeaderName::from_static("producer-epoch");
pub const PRODUCER_SEQ: HeaderName = HeaderName::from_static("producer-seq");

pub const TEXT_PLAIN: HeaderValue = HeaderValue::from_static("text/plain");
pub const OCTET_STREAM: HeaderValue = HeaderValue::from_static("application/octet-stream");
pub const EVENT_STREAM: HeaderValue = HeaderValue::from_static("text/event-stream");

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Shared, resolved target: address plus prebuilt header values.
#[derive(Debug)]
pub struct Endpoint {
    pub target: Target,
    pub addr: SocketAddr,
}

impl Endpoint {
    pub async fn resolve(target: Target) -> Result<Arc<Self>> {
        let addr = tokio::net::lookup_host((target.host.as_str(), target.port))
            .await
            .with_context(|| format!("resolving {}", target.host))?
            .next()
            .with_context(|| format!("{} resolved to no address", target.host))?;
        Ok(Arc::new(Self { target, addr }))
    }

    /// A request with the Host header set.
    pub fn request(&self, method: Method, uri: Uri, body: Bytes) -> Request<Body> {
        let mut req = Request::new(Full::new(body));
        *req.method_mut() = method;
        *req.uri_mut() = uri;
        req.headers_mut()
            .insert(HOST, self.target.host_header.clone());
        req
    }

    pub fn get(&self, uri: Uri) -> Request<Body> {
        self.request(Method::GET, uri, Bytes::new())
    }

    pub fn sse(&self, uri: Uri) -> Request<Body> {
        let mut req = self.get(uri);
        req.headers_mut().insert(ACCEPT, EVENT_STREAM);
        req
    }

    pub fn with_type(
        &self,
        method: Method,
        uri: Uri,
        content_type: &HeaderValue,
        body: Bytes,
    ) -> Request<Body> {
        let mut req = self.request(method, uri, body);
        req.headers_mut().insert(CONTENT_TYPE, content_type.clone());
        req
    }
}

/// A lazily (re)connecting HTTP/1.1 connection.
pub struct Conn {
    ep: Arc<Endpoint>,
    sender: Option<SendRequest<Body>>,
    /// Number of TCP connections opened (1 in a healthy run).
    pub connects: u64,
}

impl Conn {
    pub fn new(ep: Arc<Endpoint>) -> Self {
        Self {
            ep,
            sender: None,
            connects: 0,
        }
    }

    pub fn endpoint(&self) -> &Arc<Endpoint> {
        &self.ep
    }

    async fn connect(&mut self) -> Result<&mut SendRequest<Body>> {
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(self.ep.addr))
            .await
            .with_context(|| format!("connect to {} timed out", self.ep.addr))?
            .with_context(|| format!("connect to {}", self.ep.addr))?;
        stream.set_nodelay(true)?;
        let (sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            // Ends when the peer closes or the sender is dropped.
            let _ = conn.await;
        });
        self.connects += 1;
        Ok(self.sender.insert(sender))
    }

    /// Send one request; on a transport error the connection is dropped and
    /// the next call reconnects.
    pub async fn send(&mut self, req: Request<Body>) -> Result<Response<Incoming>> {
        let sender = match self.sender.take() {
            Some(s) if !s.is_closed() => self.sender.insert(s),
            _ => self.connect().await?,
        };
        if let Err(e) = sender.ready().await {
            self.sender = None;
            return Err(e.into());
        }
        match sender.send_request(req).await {
            Ok(resp) => Ok(resp),
            Err(e) => {
                self.sender = None;
                Err(e.into())
            }
        }
    }

    /// Send and read the whole body, returning status, headers and byte count.
    pub async fn send_drain(&mut self, req: Request<Body>) -> Result<(http::response::Parts, u64)> {
        let resp = self.send(req).await?;
        let (parts, body) = resp.into_parts();
        match drain(body).await {
            Ok(n) => Ok((parts, n)),
            Err(e) => {
                self.sender = None;
                Err(e)
            }
        }
    }

    /// Send and collect the body (for small bodies that must be parsed).
    pub async fn send_collect(
        &mut self,
        req: Request<Body>,
    ) -> Result<(http::response::Parts, Bytes)> {
        let resp = self.send(req).await?;
        let (parts, body) = resp.into_parts();
        match body.collect().await {
            Ok(c) => Ok((parts, c.to_bytes())),
            Err(e) => {
                self.sender = None;
                Err(e.into())
            }
        }
    }

    /// Forget the connection (e.g. after abandoning a response mid-body).
    pub fn reset(&mut self) {
        self.sender = None;
    }
}

/// Read a body to the end without keeping it; returns the byte count.
pub async fn drain(mut body: Incoming) -> Result<u64> {
    let mut n = 0u64;
    while let Some(frame) = body.frame().await {
        if let Some(d) = frame?.data_ref() {
            n += d.len() as u64;
        }
    }
    Ok(n)
}

pub fn header_str<'a>(parts: &'a http::response::Parts, name: &HeaderName) -> Option<&'a str> {
    parts.headers.get(name).and_then(|v| v.to_str().ok())
}

pub fn up_to_date(parts: &http::response::Parts) -> bool {
    header_str(parts, &STREAM_UP_TO_DATE).is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// Classify a transport error for the error table.
pub fn error_kind(e: &anyhow::Error) -> &'static str {
    if e.downcast_ref::<tokio::time::error::Elapsed>().is_some() {
        return "timeout";
    }
    if let Some(h) = e.downcast_ref::<hyper::Error>() {
        if h.is_timeout() {
            return "timeout";
        }
        if h.is_closed() || h.is_incomplete_message() || h.is_canceled() {
            return "closed";
        }
        return "http";
    }
    "io"
}

/// Create a stream with PUT. Transport failures are errors; the status is
/// returned (any 2xx is success: the floor answers 204).
pub async fn create_stream(
    conn: &mut Conn,
    uri: &Uri,
    content_type: &HeaderValue,
) -> Result<http::StatusCode> {
    let req = conn
        .endpoint()
        .with_type(Method::PUT, uri.clone(), content_type, Bytes::new());
    let (parts, _) = tokio::time::timeout(Duration::from_secs(30), conn.send_drain(req))
        .await
        .context("PUT timed out")??;
    Ok(parts.status)
}
