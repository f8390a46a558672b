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
use ursula_raft::{BatchFuture, OnAnswer, RpcFuture, Transport, TransportError, send_each};

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
                return send_each(self, target, frames, timeout, on_answer).await;
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
                    return send_each(self, target, frames, timeout, on_answer).await;
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
    let body = match rpc_body(app, req).await {
        Ok(b) => b,
        Err(refused) => return refused,
    };
    match Arc::clone(&app.node).handle_batch(body) {
        Ok(answers) => {
            use futures::StreamExt;
            let answers = answers.map(|a| Ok::<_, std::convert::Infallible>(Bytes::from(a)));
            raft_answer(Body::from_stream(answers))
        }
        Err(e) => plain(StatusCode::BAD_REQUEST, e),
    }
}

/// `POST /__ursula/raft/v1`: one Raft RPC from a peer.
async fn serve_rpc(app: &Arc<App>, req: Request<Body>) -> Response<Body> {
    let body = match rpc_body(app, req).await {
        Ok(b) => b,
        Err(refused) => return refused,
    };
    match app.node.handle_rpc(&body).await {
        Ok(answer) => raft_answer(Body::from(answer)),
        Err(e) => plain(StatusCode::BAD_REQUEST, e),
    }
}

/// The body of a Raft RPC request, or the answer that refuses it.
async fn rpc_body(app: &App, req: Request<Body>) -> Result<Bytes, Response<Body>> {
    if req.method() != http::Method::POST {
        return Err(plain(StatusCode::METHOD_NOT_ALLOWED, "POST only".into()));
    }
    if !app.node.has_peers() {
        return Err(plain(
            StatusCode::NOT_FOUND,
            "this node has no peers".into(),
        ));
    }
    match Limited::new(req.into_body(), MAX_RPC_BYTES).collect().await {
        Ok(b) => Ok(b.to_bytes()),
        Err(e) => Err(plain(StatusCode::BAD_REQUEST, format!("rpc body: {e}"))),
    }
}

fn raft_answer(body: Body) -> Response<Body> {
    let mut r = Response::new(body);
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ursula-raft"),
    );
    r
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// A peer of an older version: the batch path is unknown (404), single RPCs are echoed.
    async fn old_peer(singles: Arc<AtomicUsize>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let singles = Arc::clone(&singles);
                let service =
                    hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let singles = Arc::clone(&singles);
                        async move {
                            let path = req.uri().path().to_owned();
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            let mut r = Response::new(Full::new(body));
                            if path == RAFT_PATH {
                                singles.fetch_add(1, Ordering::SeqCst);
                            } else {
                                // Batch attempts count in the thousands.
                                singles.fetch_add(1000, Ordering::SeqCst);
                                *r.status_mut() = StatusCode::NOT_FOUND;
                            }
                            Ok::<_, std::convert::Infallible>(r)
                        }
                    });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service),
                );
            }
        });
        format!("http://{addr}")
    }

    #[tokio::test]
    async fn a_peer_without_batches_gets_each_frame_on_its_own() {
        let singles = Arc::new(AtomicUsize::new(0));
        let url = old_peer(Arc::clone(&singles)).await;
        let t = HttpTransport::new(1, &BTreeMap::from([(1, String::new()), (2, url)])).unwrap();
        let frames = vec![b"one".to_vec(), b"two".to_vec(), b"three".to_vec()];
        for round in 0..2 {
            let mut got = vec![None; frames.len()];
            let mut on_answer = |i: usize, a: Result<Vec<u8>, TransportError>| {
                got[i] = Some(a.unwrap());
            };
            let sent = t
                .send_batch(2, frames.clone(), Duration::from_secs(5), &mut on_answer)
                .await;
            sent.unwrap();
            let got: Vec<Vec<u8>> = got.into_iter().map(Option::unwrap).collect();
            assert_eq!(got, frames, "round {round}");
        }
        // One batch attempt; both rounds' frames went one by one, the second round's
        // without trying the batch path again.
        assert_eq!(singles.load(Ordering::SeqCst), 1006);
        assert!(t.peers[&2].no_batches.load(Ordering::Relaxed));
    }
}
