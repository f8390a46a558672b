//! One HTTP/1.1 keep-alive connection per task and node (hyper 1 conn API).
//!
//! `Conn` reconnects lazily after a transport error and follows a cluster's
//! redirects. Requests are built without the fallible builder; bodies are
//! `Bytes` so reusing a payload is a reference-count bump, not a copy.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http::header::{ACCEPT, CONTENT_TYPE, HOST, LOCATION};
use http::uri::Authority;
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::target::Target;

#[cfg(target_os = "linux")]
pub mod sink;

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
    /// What redirects taught every `Conn` to this target.
    routes: Routes,
}

/// The leaders learnt from redirects, shared by every `Conn` of one target, so each stream
/// is redirected about once per run rather than once per connection.
#[derive(Debug, Default)]
struct Routes {
    /// Set on the first remembered route: until then a request takes no lock.
    any: AtomicBool,
    /// Stream path → the node that led it at the last redirect.
    leaders: RwLock<HashMap<Box<str>, Arc<Endpoint>>>,
    /// Nodes `Location`s named, resolved once.
    nodes: Mutex<Vec<Arc<Endpoint>>>,
}

impl Routes {
    fn get(&self, path: &str) -> Option<Arc<Endpoint>> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        let leaders = self.leaders.read().unwrap_or_else(|e| e.into_inner());
        leaders.get(path).cloned()
    }

    /// `leader` None: the stream is led by the target itself again.
    fn set(&self, path: &str, leader: Option<Arc<Endpoint>>) {
        let mut leaders = self.leaders.write().unwrap_or_else(|e| e.into_inner());
        match leader {
            Some(ep) => {
                leaders.insert(path.into(), ep);
                self.any.store(true, Ordering::Relaxed);
            }
            None => {
                leaders.remove(path);
            }
        }
    }

    /// Forget every stream routed to `node` (it failed; the target redirects them afresh).
    fn forget(&self, node: &Endpoint) {
        let mut leaders = self.leaders.write().unwrap_or_else(|e| e.into_inner());
        leaders.retain(|_, ep| ep.addr != node.addr);
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.leaders
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }
}

impl Endpoint {
    pub async fn resolve(target: Target) -> Result<Arc<Self>> {
        let addr = tokio::net::lookup_host((target.host.as_str(), target.port))
            .await
            .with_context(|| format!("resolving {}", target.host))?
            .next()
            .with_context(|| format!("{} resolved to no address", target.host))?;
        Ok(Arc::new(Self {
            target,
            addr,
            routes: Routes::default(),
        }))
    }

    /// The node at `authority` (resolved once per target and node).
    async fn node(&self, authority: &Authority) -> Result<Arc<Endpoint>> {
        let same =
            |ep: &Arc<Endpoint>| ep.target.host_header.as_bytes() == authority.as_str().as_bytes();
        if let Some(ep) = self
            .routes
            .nodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|e| same(e))
        {
            return Ok(ep.clone());
        }
        let t = &self.target;
        let target = Target::parse(&format!("http://{authority}"), t.layout, &t.bucket)?;
        let ep = Endpoint::resolve(target).await?;
        let mut nodes = self.routes.nodes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(known) = nodes.iter().find(|e| same(e)) {
            return Ok(known.clone());
        }
        if nodes.len() >= MAX_ENDPOINTS {
            bail!("redirected to more than {MAX_ENDPOINTS} nodes");
        }
        nodes.push(ep.clone());
        Ok(ep)
    }

    #[cfg(test)]
    pub fn routes_learnt(&self) -> bool {
        !self.routes.is_empty()
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

/// A TCP connection to `addr` for requests: bounded by `CONNECT_TIMEOUT`, Nagle off.
async fn connect_tcp(addr: SocketAddr) -> Result<TcpStream> {
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
        .await
        .with_context(|| format!("connect to {addr} timed out"))?
        .with_context(|| format!("connect to {addr}"))?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Redirects followed per request before its last `307` is handed to the caller.
pub const MAX_REDIRECTS: usize = 3;
/// Distinct nodes one target may redirect to (a cluster has a handful).
const MAX_ENDPOINTS: usize = 16;

/// Redirects followed by every `Conn` of this process (each run is one process).
static REDIRECTS: AtomicU64 = AtomicU64::new(0);

/// Redirects followed so far by this process, setup included.
pub fn redirects_followed() -> u64 {
    REDIRECTS.load(Ordering::Relaxed)
}

/// One node a `Conn` talks to, with its lazily opened connection.
struct Slot {
    ep: Arc<Endpoint>,
    sender: Option<SendRequest<Body>>,
    connects: u64,
}

/// A lazily (re)connecting HTTP/1.1 connection to the target, which follows `307`/`308`.
///
/// Requests are given as a closure building them for the target, called again for each
/// redirect: the same method, headers and body go to `Location` with its `Host`. A cluster
/// node answers a write (or a tail read) for a group another node leads with a `307` to
/// that leader's peer URL + the same path and query; the connection to that node is kept
/// (one per node and `Conn`), and the stream's path is remembered in the target's routes,
/// shared by its `Conn`s, so the stream's next requests go to the leader directly. A
/// request that is not redirected costs what it did before: one build, and a lookup only
/// once some stream has been redirected.
pub struct Conn {
    /// `slots[0]` is the target given; the others were learnt from `Location`s.
    slots: Vec<Slot>,
    /// Redirects this connection followed.
    pub redirects: u64,
}

impl Conn {
    pub fn new(ep: Arc<Endpoint>) -> Self {
        Self {
            slots: vec![Slot {
                ep,
                sender: None,
                connects: 0,
            }],
            redirects: 0,
        }
    }

    pub fn endpoint(&self) -> &Arc<Endpoint> {
        &self.slots[0].ep
    }

    /// TCP connections opened, to every node (1 in a healthy single-node run).
    #[cfg(test)]
    pub fn connects(&self) -> u64 {
        self.slots.iter().map(|s| s.connects).sum()
    }

    /// Connections opened again after the first to the same node.
    pub fn reconnects(&self) -> u64 {
        self.slots
            .iter()
            .map(|s| s.connects.saturating_sub(1))
            .sum()
    }

    async fn connect(slot: &mut Slot) -> Result<&mut SendRequest<Body>> {
        let stream = connect_tcp(slot.ep.addr).await?;
        let (sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            // Ends when the peer closes or the sender is dropped.
            let _ = conn.await;
        });
        slot.connects += 1;
        Ok(slot.sender.insert(sender))
    }

    /// Send one request on slot `i`; on a transport error its connection is dropped (the
    /// next request reconnects) and, for a learnt node, the streams routed to it are
    /// forgotten, so they go to the target again and are redirected afresh.
    async fn send_on(&mut self, i: usize, req: Request<Body>) -> Result<Response<Incoming>> {
        let result = Self::send_slot(&mut self.slots[i], req).await;
        if result.is_err() && i != 0 {
            self.slots[0].ep.routes.forget(&self.slots[i].ep);
        }
        result
    }

    async fn send_slot(slot: &mut Slot, req: Request<Body>) -> Result<Response<Incoming>> {
        let sender = match slot.sender.take() {
            Some(s) if !s.is_closed() => slot.sender.insert(s),
            _ => Self::connect(slot).await?,
        };
        if let Err(e) = sender.ready().await {
            slot.sender = None;
            return Err(e.into());
        }
        match sender.send_request(req).await {
            Ok(resp) => Ok(resp),
            Err(e) => {
                slot.sender = None;
                Err(e.into())
            }
        }
    }

    /// The slot of `ep`, added on first use.
    fn slot_of(&mut self, ep: &Arc<Endpoint>) -> usize {
        if let Some(i) = self.slots.iter().position(|s| s.ep.addr == ep.addr) {
            return i;
        }
        self.slots.push(Slot {
            ep: ep.clone(),
            sender: None,
            connects: 0,
        });
        self.slots.len() - 1
    }

    /// Send a request, following up to `MAX_REDIRECTS` redirects; `build` makes the request
    /// for the target (origin-form URI) and is called once more per redirect. On a transport
    /// error the connection is dropped and the next call reconnects.
    pub async fn send<F>(&mut self, build: F) -> Result<Response<Incoming>>
    where
        F: Fn() -> Request<Body>,
    {
        let mut req = build();
        let mut slot = 0;
        if let Some(leader) = self.slots[0].ep.routes.get(req.uri().path()) {
            slot = self.slot_of(&leader);
            req.headers_mut()
                .insert(HOST, leader.target.host_header.clone());
        }
        let mut hops = 0;
        loop {
            let resp = self.send_on(slot, req).await?;
            if hops == MAX_REDIRECTS || !is_redirect(resp.status()) {
                return Ok(resp);
            }
            let Some(location) = location(&resp) else {
                return Ok(resp);
            };
            if let Err(e) = drain(resp.into_body()).await {
                self.slots[slot].sender = None;
                return Err(e);
            }
            let next = match location.authority() {
                Some(a) => {
                    let ep = self.slots[0].ep.node(a).await?;
                    self.slot_of(&ep)
                }
                None => slot,
            };
            hops += 1;
            self.redirects += 1;
            REDIRECTS.fetch_add(1, Ordering::Relaxed);
            req = build();
            let pq = location.path_and_query().cloned();
            // Same path on another node: that node leads the stream; go there next time.
            if location.authority().is_some() && pq.as_ref() == req.uri().path_and_query() {
                let leader = (next != 0).then(|| self.slots[next].ep.clone());
                self.slots[0].ep.routes.set(req.uri().path(), leader);
            }
            if let Some(pq) = pq {
                *req.uri_mut() = Uri::from(pq);
            }
            req.headers_mut()
                .insert(HOST, self.slots[next].ep.target.host_header.clone());
            slot = next;
        }
    }

    /// Send and read the whole body, returning status, headers and byte count.
    pub async fn send_drain<F>(&mut self, build: F) -> Result<(http::response::Parts, u64)>
    where
        F: Fn() -> Request<Body>,
    {
        let resp = self.send(build).await?;
        let (parts, body) = resp.into_parts();
        match drain(body).await {
            Ok(n) => Ok((parts, n)),
            Err(e) => {
                self.reset();
                Err(e)
            }
        }
    }

    /// Send and collect the body (for small bodies that must be parsed).
    pub async fn send_collect<F>(&mut self, build: F) -> Result<(http::response::Parts, Bytes)>
    where
        F: Fn() -> Request<Body>,
    {
        let resp = self.send(build).await?;
        let (parts, body) = resp.into_parts();
        match body.collect().await {
            Ok(c) => Ok((parts, c.to_bytes())),
            Err(e) => {
                self.reset();
                Err(e.into())
            }
        }
    }

    /// Forget the connections (e.g. after abandoning a response mid-body).
    pub fn reset(&mut self) {
        for s in &mut self.slots {
            s.sender = None;
        }
    }
}

fn is_redirect(s: StatusCode) -> bool {
    s == StatusCode::TEMPORARY_REDIRECT || s == StatusCode::PERMANENT_REDIRECT
}

/// The `Location` of a redirect: absolute `http://` or a path on the same node.
fn location(resp: &Response<Incoming>) -> Option<Uri> {
    let uri: Uri = resp.headers().get(LOCATION)?.to_str().ok()?.parse().ok()?;
    match (uri.scheme_str(), uri.authority()) {
        (Some("http"), Some(_)) => Some(uri),
        (None, None) if uri.path().starts_with('/') => Some(uri),
        _ => None,
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
    let ep = conn.endpoint().clone();
    let req = || ep.with_type(Method::PUT, uri.clone(), content_type, Bytes::new());
    let (parts, _) = tokio::time::timeout(Duration::from_secs(30), conn.send_drain(req))
        .await
        .context("PUT timed out")??;
    Ok(parts.status)
}

/// One reader's connection for GETs whose bodies are only counted: spliced into /dev/null
/// inside the kernel ([`sink::SinkConn`], Linux), or received through hyper ([`Conn`], copied
/// into the generator) when `copy_bodies` is set, on other systems, and once the target has
/// redirected (a cluster: `Conn` remembers leaders, the sink does not).
pub struct BodySink {
    conn: Conn,
    #[cfg(target_os = "linux")]
    sink: Option<sink::SinkConn>,
}

impl BodySink {
    pub fn new(ep: Arc<Endpoint>, copy_bodies: bool) -> Result<Self> {
        #[cfg(target_os = "linux")]
        let sink = if copy_bodies {
            None
        } else {
            Some(sink::SinkConn::new(ep.clone())?)
        };
        #[cfg(not(target_os = "linux"))]
        let _ = copy_bodies;
        Ok(Self {
            conn: Conn::new(ep),
            #[cfg(target_os = "linux")]
            sink,
        })
    }

    /// GET `uri` (origin form): status, headers and the body's length.
    pub async fn get(&mut self, uri: &Uri) -> Result<(http::response::Parts, u64)> {
        let ep = self.conn.endpoint().clone();
        #[cfg(target_os = "linux")]
        if let Some(sink) = &mut self.sink {
            let got = sink.get(ep.get(uri.clone())).await?;
            if !is_redirect(got.0.status) {
                return Ok(got);
            }
            self.sink = None;
        }
        self.conn.send_drain(|| ep.get(uri.clone())).await
    }

    /// Forget the connections (after a time-out mid-response).
    pub fn reset(&mut self) {
        self.conn.reset();
        #[cfg(target_os = "linux")]
        if let Some(sink) = &mut self.sink {
            sink.reset();
        }
    }
}

#[cfg(test)]
mod tests;
