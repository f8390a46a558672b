//! The cluster plane: Raft RPCs between nodes over HTTP, and the leader gate of the stream
//! routes (307 to the leader, 503 during an election; spec cluster.md §3.2).
//!
//! ## Why HTTP/1.1 with hyper and a compact binary body
//!
//! The spec names gRPC (`tonic`). The build of tonic's generated code needs `protoc`, a system
//! tool CI would have to install, and a gRPC server would be a second HTTP stack beside the
//! axum/hyper one every node already runs. The Raft RPCs are three messages (append-entries,
//! vote, install-snapshot chunk) whose encoding `ursula-raft` already owns (`wire.rs`: magic,
//! version, group id, the WAL's own entry encoding), so they travel as the body of a `POST` to
//! the reserved path [`RAFT_PATH`] on the node's `listen` address: no new dependency, no
//! generated code, the same connection limits and timeouts as every other request. Each peer
//! has one hyper client (one keep-alive connection pool) that every group's RPCs share.
//! Moving to HTTP/2 (one multiplexed connection per peer) is a client/server flag away.
//!
//! Small RPCs of many groups travel together (`ursula_raft::coalesce`): one `POST` to
//! [`RAFT_BATCH_PATH`] carries the batch, and the answer body streams each frame's answer as
//! its group has handled it. A peer that does not know the batch path (a node of an older
//! version, during a rolling upgrade) answers `404`; its frames are then sent one by one.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use ursula_raft::batch_wire::{self, AnswerReader};
use ursula_raft::{BatchFuture, OnAnswer, RpcFuture, Transport, TransportError};

use crate::app::App;

/// The reserved path of Raft RPCs (`/__ursula/` is never a stream path).
pub const RAFT_PATH: &str = "/__ursula/raft/v1";
/// The reserved path of batches of Raft RPCs (`batch_wire.rs`).
pub const RAFT_BATCH_PATH: &str = "/__ursula/raft/v1/batch";
/// Largest RPC body accepted (an append-entries of many batches, or one snapshot chunk).
const MAX_RPC_BYTES: usize = 512 << 20;
/// Connect time-out to a peer; an unreachable peer fails fast so openraft backs off.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

type PeerClient = Client<HttpConnector, Full<Bytes>>;

/// Raft RPCs to peers over HTTP: one client (connection pool) per peer.
pub struct HttpTransport {
    peers: BTreeMap<u64, Peer>,
}

struct Peer {
    uri: Uri,
    batch_uri: Uri,
    client: PeerClient,
    /// Set once the peer answered a batch `404`: it predates batches.
    no_batches: AtomicBool,
}

fn failed(target: u64) -> impl Fn(hyper_util::client::legacy::Error) -> TransportError {
    move |e| {
        if e.is_connect() {
            TransportError::Unreachable(target, e.to_string())
        } else {
            TransportError::Failed(target, e.to_string())
        }
    }
}

fn raft_request(uri: &Uri, body: Vec<u8>) -> Result<Request<Full<Bytes>>, http::Error> {
    Request::post(uri.clone())
        .header(http::header::CONTENT_TYPE, "application/x-ursula-raft")
        .body(Full::new(Bytes::from(body)))
}

impl HttpTransport {
    /// Clients for every peer of `urls` other than `me`.
    pub fn new(me: u64, urls: &BTreeMap<u64, String>) -> anyhow::Result<Self> {
        let mut peers = BTreeMap::new();
        for (&id, url) in urls {
            if id == me {
                continue;
            }
            let parse = |path: &str| -> anyhow::Result<Uri> {
                format!("{url}{path}")
                    .parse()
                    .map_err(|e| anyhow::anyhow!("raft.peers url of node {id} ({url}): {e}"))
            };
            let (uri, batch_uri) = (parse(RAFT_PATH)?, parse(RAFT_BATCH_PATH)?);
            let mut connector = HttpConnector::new();
            connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
            connector.set_nodelay(true);
            let client = Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(60))
                .pool_max_idle_per_host(64)
                .build(connector);
            peers.insert(
                id,
                Peer {
                    uri,
                    batch_uri,
                    client,
                    no_batches: AtomicBool::new(false),
                },
            );
        }
        Ok(HttpTransport { peers })
    }
}

impl Transport for HttpTransport {
    fn send(&self, target: u64, frame: Vec<u8>, timeout: Duration) -> RpcFuture<'_> {
        Box::pin(async move {
            let peer = self
                .peers
                .get(&target)
                .ok_or_else(|| TransportError::Unreachable(target, "not a peer".into()))?;
            let req = raft_request(&peer.uri, frame)
                .map_err(|e| TransportError::Failed(target, e.to_string()))?;
            let call = async {
                let resp = peer.client.request(req).await.map_err(failed(target))?;
                let status = resp.status();
                let body = resp
                    .into_body()
                    .collect()
                    .await
                    .map_err(|e| TransportError::Failed(target, e.to_string()))?
                    .to_bytes();
                if status != StatusCode::OK {
                    return Err(TransportError::Failed(
                        target,
                        format!("{status}: {}", String::from_utf8_lossy(&body)),
                    ));
                }
                Ok(body.to_vec())
            };
            tokio::time::timeout(timeout, call)
                .await
                .unwrap_or_else(|_| Err(TransportError::Failed(target, "timed out".into())))
        })
    }

    fn send_batch<'a>(
        &'a self,
        target: u64,
        frames: Vec<Vec<u8>>,
        timeout: Duration,
        on_answer: &'a mut OnAnswer<'a>,
    ) -> BatchFuture<'a> {
        Box::pin(async move {
            let peer = self
                .peers
                .get(&target)
                .ok_or_else(|| TransportError::Unreachable(target, "not a peer".into()))?;
            if peer.no_batches.load(Ordering::Relaxed) {
                return one_by_one(self, target, frames, timeout, on_answer).await;
            }
            let req = raft_request(&peer.batch_uri, batch_wire::encode_batch(&frames))
                .map_err(|e| TransportError::Failed(target, e.to_string()))?;
            let call = async {
                let resp = peer.client.request(req).await.map_err(failed(target))?;
                let status = resp.status();
                if status == StatusCode::NOT_FOUND {
                    // Nothing was handled: send the frames the old way.
                    tracing::info!(peer = target, "peer does not take batched raft rpcs");
                    peer.no_batches.store(true, Ordering::Relaxed);
                    return one_by_one(self, target, frames, timeout, on_answer).await;
                }
                let mut body = resp.into_body();
                if status != StatusCode::OK {
                    let text = body.collect().await.map(|b| b.to_bytes());
                    let text = text.unwrap_or_default();
                    return Err(TransportError::Failed(
                        target,
                        format!("{status}: {}", String::from_utf8_lossy(&text)),
                    ));
                }
                let mut reader = AnswerReader::default();
                while let Some(frame) = body.frame().await {
                    let frame = frame.map_err(|e| TransportError::Failed(target, e.to_string()))?;
                    let Ok(chunk) = frame.into_data() else {
                        continue;
                    };
                    reader.push(&chunk);
                    while let Some((i, answer)) = reader
                        .next_answer()
                        .map_err(|e| TransportError::Failed(target, e))?
                    {
                        on_answer(i, answer.map_err(|e| TransportError::Failed(target, e)));
                    }
                }
                if reader.has_partial() {
                    return Err(TransportError::Failed(target, "truncated answers".into()));
                }
                Ok(())
            };
            tokio::time::timeout(timeout, call)
                .await
                .unwrap_or_else(|_| Err(TransportError::Failed(target, "timed out".into())))
        })
    }
}

/// Each frame of a batch as an RPC of its own, all at once (a peer without batches).
async fn one_by_one(
    transport: &HttpTransport,
    target: u64,
    frames: Vec<Vec<u8>>,
    timeout: Duration,
    on_answer: &mut OnAnswer<'_>,
) -> Result<(), TransportError> {
    use futures::StreamExt;
    let mut calls: futures::stream::FuturesUnordered<_> = frames
        .into_iter()
        .enumerate()
        .map(|(i, f)| async move { (i, transport.send(target, f, timeout).await) })
        .collect();
    while let Some((i, answer)) = calls.next().await {
        on_answer(i, answer);
    }
    Ok(())
}

fn plain(status: StatusCode, text: String) -> Response<Body> {
    let mut r = Response::new(Body::from(text));
    *r.status_mut() = status;
    r
}

/// Whether `path` is one of the Raft RPC paths ([`serve_raft`] answers them).
pub fn is_raft_path(path: &str) -> bool {
    path == RAFT_PATH || path == RAFT_BATCH_PATH
}

/// Answers a request to a Raft RPC path ([`is_raft_path`]).
pub async fn serve_raft(app: &Arc<App>, req: Request<Body>) -> Response<Body> {
    if req.uri().path() == RAFT_BATCH_PATH {
        serve_batch(app, req).await
    } else {
        serve_rpc(app, req).await
    }
}

/// `POST /__ursula/raft/v1/batch`: a batch of Raft RPCs from a peer; the body streams each
/// answer as it is ready.
async fn serve_batch(app: &Arc<App>, req: Request<Body>) -> Response<Body> {
    if req.method() != http::Method::POST {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "POST only".into());
    }
    if !app.node.has_peers() {
        return plain(StatusCode::NOT_FOUND, "this node has no peers".into());
    }
    let body = match Limited::new(req.into_body(), MAX_RPC_BYTES).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return plain(StatusCode::BAD_REQUEST, format!("rpc body: {e}")),
    };
    match Arc::clone(&app.node).handle_batch(body) {
        Ok(answers) => {
            use futures::StreamExt;
            let answers = answers.map(|a| Ok::<_, std::convert::Infallible>(Bytes::from(a)));
            let mut r = Response::new(Body::from_stream(answers));
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/x-ursula-raft"),
            );
            r
        }
        Err(e) => plain(StatusCode::BAD_REQUEST, e),
    }
}

/// `POST /__ursula/raft/v1`: one Raft RPC from a peer.
async fn serve_rpc(app: &Arc<App>, req: Request<Body>) -> Response<Body> {
    if req.method() != http::Method::POST {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "POST only".into());
    }
    if !app.node.has_peers() {
        return plain(StatusCode::NOT_FOUND, "this node has no peers".into());
    }
    let body = match Limited::new(req.into_body(), MAX_RPC_BYTES).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return plain(StatusCode::BAD_REQUEST, format!("rpc body: {e}")),
    };
    match app.node.handle_rpc(&body).await {
        Ok(answer) => {
            let mut r = Response::new(Body::from(answer));
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/x-ursula-raft"),
            );
            r
        }
        Err(e) => plain(StatusCode::BAD_REQUEST, e),
    }
}
