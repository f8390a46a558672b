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

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use ursula_raft::{RpcFuture, Transport, TransportError};

use crate::app::App;

/// The reserved path of Raft RPCs (`/__ursula/` is never a stream path).
pub const RAFT_PATH: &str = "/__ursula/raft/v1";
/// Largest RPC body accepted (an append-entries of many batches, or one snapshot chunk).
const MAX_RPC_BYTES: usize = 512 << 20;
/// Connect time-out to a peer; an unreachable peer fails fast so openraft backs off.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

type PeerClient = Client<HttpConnector, Full<Bytes>>;

/// Raft RPCs to peers over HTTP: one client (connection pool) per peer.
pub struct HttpTransport {
    peers: BTreeMap<u64, (Uri, PeerClient)>,
}

impl HttpTransport {
    /// Clients for every peer of `urls` other than `me`.
    pub fn new(me: u64, urls: &BTreeMap<u64, String>) -> anyhow::Result<Self> {
        let mut peers = BTreeMap::new();
        for (&id, url) in urls {
            if id == me {
                continue;
            }
            let uri: Uri = format!("{url}{RAFT_PATH}")
                .parse()
                .map_err(|e| anyhow::anyhow!("raft.peers url of node {id} ({url}): {e}"))?;
            let mut connector = HttpConnector::new();
            connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
            connector.set_nodelay(true);
            let client = Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(60))
                .pool_max_idle_per_host(64)
                .build(connector);
            peers.insert(id, (uri, client));
        }
        Ok(HttpTransport { peers })
    }
}

impl Transport for HttpTransport {
    fn send(&self, target: u64, frame: Vec<u8>, timeout: Duration) -> RpcFuture<'_> {
        Box::pin(async move {
            let (uri, client) = self
                .peers
                .get(&target)
                .ok_or_else(|| TransportError::Unreachable(target, "not a peer".into()))?;
            let req = Request::post(uri.clone())
                .header(http::header::CONTENT_TYPE, "application/x-ursula-raft")
                .body(Full::new(Bytes::from(frame)))
                .map_err(|e| TransportError::Failed(target, e.to_string()))?;
            let call = async {
                let resp = client.request(req).await.map_err(|e| {
                    if e.is_connect() {
                        TransportError::Unreachable(target, e.to_string())
                    } else {
                        TransportError::Failed(target, e.to_string())
                    }
                })?;
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
}

fn plain(status: StatusCode, text: String) -> Response<Body> {
    let mut r = Response::new(Body::from(text));
    *r.status_mut() = status;
    r
}

/// `POST /__ursula/raft/v1`: one Raft RPC from a peer.
pub async fn serve_rpc(app: &Arc<App>, req: Request<Body>) -> Response<Body> {
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
