//! `ursula-redirect-proxy`: an HTTP/1.1 proxy in front of one node of a cluster that does
//! what a cluster-aware client must do, so that a client which cannot (Node's `fetch` does
//! not re-send a binary body after a `307`) can still be pointed at a follower. It exists
//! for the conformance suite run against a follower (`scripts/conformance-cluster.sh`).
//!
//! Per request it buffers the body, sends it to `--upstream`, follows `307`/`308` to the
//! `Location` (the leader's peer URL) at most `--max-hops` times re-sending the same method,
//! headers and body, and retries `503 LEADER_UNAVAILABLE` (an election: nothing was written)
//! every 100 ms for at most `--retry-for`. Any other answer is streamed back as it arrives,
//! never buffered, so SSE and long-polls pass through live. The client's `Host` is kept.
//!
//!   ursula-redirect-proxy --upstream http://127.0.0.1:4447 [--listen 127.0.0.1:0]
//!
//! It prints `redirect-proxy: listening addr=HOST:PORT` on stderr once it accepts, and a
//! line per redirect followed and per retried `503`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use clap::Parser;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

#[derive(Parser, Debug)]
#[command(about = "Redirect-following HTTP proxy in front of one node of an Ursula cluster")]
struct Args {
    /// The node every request goes to first: `http://host:port`.
    #[arg(long)]
    upstream: Uri,
    /// Address to listen on (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Redirects followed per request.
    #[arg(long, default_value_t = 4)]
    max_hops: usize,
    /// How long `503 LEADER_UNAVAILABLE` and unreachable leaders are retried, in ms.
    #[arg(long, default_value_t = 10_000)]
    retry_for_ms: u64,
    /// Largest request body buffered, in bytes.
    #[arg(long, default_value_t = 256 << 20)]
    max_body: usize,
}

type Body = BoxBody<Bytes, hyper::Error>;

struct Proxy {
    client: Client<HttpConnector, Full<Bytes>>,
    upstream: Uri,
    max_hops: usize,
    retry_for: Duration,
    max_body: usize,
}

/// Hop-by-hop headers are dropped as the gateway drops them (`ursula-gateway`).
fn strip_hop_headers(h: &mut HeaderMap) {
    ursula_http::strip_hop_by_hop(h);
}

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).map_err(|never| match never {}).boxed()
}

/// A JSON error answer of the proxy itself (the node never saw the request, or never
/// answered it).
fn error(status: StatusCode, code: &str, message: &str) -> Response<Body> {
    let body = serde_json::json!({ "error": { "code": code, "message": message } }).to_string();
    let mut r = Response::new(full(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// `Location` resolved against the URI it answered: absolute, or a path on the same node.
fn resolve(location: &str, base: &Uri) -> Option<Uri> {
    let uri: Uri = location.parse().ok()?;
    if uri.scheme().is_some() && uri.authority().is_some() {
        return Some(uri);
    }
    let mut parts = base.clone().into_parts();
    parts.path_and_query = uri.path_and_query().cloned();
    Uri::from_parts(parts).ok()
}

/// `base`'s scheme and authority with `path_and_query`.
fn on(base: &Uri, path_and_query: Option<&http::uri::PathAndQuery>) -> Result<Uri> {
    let mut parts = base.clone().into_parts();
    parts.path_and_query = Some(
        path_and_query
            .cloned()
            .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/")),
    );
    Ok(Uri::from_parts(parts)?)
}

impl Proxy {
    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Result<Response<Body>> {
        let (mut head, body) = req.into_parts();
        // A body the client framed (even an empty one) is re-sent with its exact length.
        let framed = head.headers.contains_key(header::CONTENT_LENGTH)
            || head.headers.contains_key(header::TRANSFER_ENCODING);
        let body = match Limited::new(body, self.max_body).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => {
                let msg = format!("request body not read: {e}");
                return Ok(error(StatusCode::PAYLOAD_TOO_LARGE, "PROXY_BODY", &msg));
            }
        };
        strip_hop_headers(&mut head.headers);
        head.headers.remove(header::EXPECT);
        head.headers.remove(header::CONTENT_LENGTH);
        if framed {
            head.headers
                .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
        }
        let first = on(&self.upstream, head.uri.path_and_query())?;
        let mut target = first.clone();
        let mut hops = 0;
        let deadline = Instant::now() + self.retry_for;
        loop {
            let mut up = Request::new(Full::new(body.clone()));
            *up.method_mut() = head.method.clone();
            *up.uri_mut() = target.clone();
            *up.headers_mut() = head.headers.clone();
            let resp = match self.client.request(up).await {
                Ok(r) => r,
                Err(e) if target != first && Instant::now() < deadline => {
                    // A leader that died after redirecting to it: ask the first node again.
                    tracing_note(&format!("{target}: {e}; retrying via {first}"));
                    target = first.clone();
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
                Err(e) => {
                    let msg = format!("{target}: {e}");
                    return Ok(error(StatusCode::BAD_GATEWAY, "PROXY_UPSTREAM", &msg));
                }
            };
            let status = resp.status();
            if (status == StatusCode::TEMPORARY_REDIRECT
                || status == StatusCode::PERMANENT_REDIRECT)
                && hops < self.max_hops
            {
                let next = resp
                    .headers()
                    .get(header::LOCATION)
                    .and_then(|l| l.to_str().ok())
                    .and_then(|l| resolve(l, &target));
                if let Some(next) = next {
                    // Read the redirect's own (small) body so its connection is reused.
                    let _ = Limited::new(resp.into_body(), 64 << 10).collect().await;
                    tracing_note(&format!(
                        "followed {status} {} {target} -> {next}",
                        head.method
                    ));
                    target = next;
                    hops += 1;
                    continue;
                }
            }
            if status == StatusCode::SERVICE_UNAVAILABLE && Instant::now() < deadline {
                let (parts, b) = resp.into_parts();
                let bytes = match Limited::new(b, 64 << 10).collect().await {
                    Ok(b) => b.to_bytes(),
                    Err(e) => bail!("reading a 503 from {target}: {e}"),
                };
                if bytes.windows(18).any(|w| w == b"LEADER_UNAVAILABLE") {
                    tracing_note(&format!("retrying 503 LEADER_UNAVAILABLE from {target}"));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    target = first.clone();
                    hops = 0;
                    continue;
                }
                let mut r = Response::from_parts(parts, full(bytes));
                strip_hop_headers(r.headers_mut());
                return Ok(r);
            }
            let (mut parts, b) = resp.into_parts();
            strip_hop_headers(&mut parts.headers);
            return Ok(Response::from_parts(parts, b.boxed()));
        }
    }
}

/// Proxy diagnostics go to stderr (the proxy has no log framework of its own).
fn tracing_note(msg: &str) {
    eprintln!("redirect-proxy: {msg}");
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.upstream.scheme_str() != Some("http") || args.upstream.authority().is_none() {
        bail!("--upstream must be http://host:port, got {}", args.upstream);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("tokio runtime")?;
    rt.block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    let mut conn = HttpConnector::new();
    conn.set_connect_timeout(Some(Duration::from_secs(1)));
    conn.set_nodelay(true);
    let client = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(conn);
    let proxy = Arc::new(Proxy {
        client,
        upstream: args.upstream.clone(),
        max_hops: args.max_hops,
        retry_for: Duration::from_millis(args.retry_for_ms),
        max_body: args.max_body,
    });
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let addr = listener.local_addr()?;
    tracing_note(&format!("listening addr={addr} upstream={}", args.upstream));
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing_note(&format!("accept: {e}"));
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let proxy = Arc::clone(&proxy);
        tokio::spawn(async move {
            let svc = service_fn(move |req| Arc::clone(&proxy).handle(req));
            let conn = hyper::server::conn::http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), svc);
            if let Err(e) = conn.await
                && !e.is_incomplete_message()
            {
                tracing_note(&format!("connection: {e}"));
            }
        });
    }
}
