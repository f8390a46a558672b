//! The Raft network of a node: openraft's [`RaftNetworkFactory`]/[`RaftNetwork`] over a
//! [`Transport`] that carries encoded frames (see `wire.rs`) to peers.
//!
//! The transport is the only part that knows how bytes travel: the server plugs in HTTP (one
//! connection pool per peer, every group's RPCs over it), the tests an in-process network that
//! can drop, delay and partition ([`crate::testing::TestNetwork`]). A node without peers has no
//! transport; any RPC it would send fails as unreachable — the same code path, with no one to
//! talk to.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use openraft::BasicNode;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};

use crate::coalesce::Coalescer;
use crate::types::{LogId, NodeId, TypeConfig};
use crate::wire;

/// Why a frame did not get an answer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TransportError {
    /// The peer could not be reached at all (no connection, unknown peer, partitioned): the
    /// request was not delivered. openraft backs off before retrying.
    #[error("peer {0} unreachable: {1}")]
    Unreachable(NodeId, String),
    /// The request may have been delivered but no (valid) answer came back in time.
    #[error("rpc to peer {0} failed: {1}")]
    Failed(NodeId, String),
}

/// A boxed future of one RPC.
pub type RpcFuture<'a> = Pin<Box<dyn Future<Output = Result<Vec<u8>, TransportError>> + Send + 'a>>;

/// A boxed future of one batch: `Err` fails every frame not answered yet.
pub type BatchFuture<'a> = Pin<Box<dyn Future<Output = Result<(), TransportError>> + Send + 'a>>;

/// Hears each answer of a batch, tagged with the frame's index, as soon as it arrives.
pub type OnAnswer<'a> = dyn FnMut(usize, Result<Vec<u8>, TransportError>) + Send + 'a;

/// Carries encoded request frames to a peer and returns their encoded response frames.
///
/// Implementations keep their own connections (one pool per peer, shared by every group) and
/// must give up after `timeout`.
pub trait Transport: Send + Sync + 'static {
    /// One frame, one answer.
    fn send(&self, target: NodeId, frame: Vec<u8>, timeout: Duration) -> RpcFuture<'_>;

    /// Several frames (of any groups) in one round trip, each answer handed to `on_answer` as
    /// it arrives ([`crate::batch_wire`]); frames it was not called for when the future ends
    /// failed with the future's error, or as lost. The default sends each frame on its own.
    fn send_batch<'a>(
        &'a self,
        target: NodeId,
        frames: Vec<Vec<u8>>,
        timeout: Duration,
        on_answer: &'a mut OnAnswer<'a>,
    ) -> BatchFuture<'a> {
        Box::pin(send_each(self, target, frames, timeout, on_answer))
    }
}

/// Sends each of `frames` as an RPC of its own, all at once, handing each answer to
/// `on_answer` as it comes (what a transport without batches does with a batch).
pub async fn send_each<T: Transport + ?Sized>(
    transport: &T,
    target: NodeId,
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

/// The network factory of one group.
#[derive(Clone)]
pub struct Network {
    group: u32,
    transport: Option<Arc<Coalescer>>,
    retry_after: Duration,
}

impl Network {
    /// `retry_after`: how long replication to a peer that could not be reached waits before
    /// it tries again.
    pub(crate) fn new(
        group: u32,
        transport: Option<Arc<Coalescer>>,
        retry_after: Duration,
    ) -> Self {
        Network {
            group,
            transport,
            retry_after,
        }
    }
}

/// A group's client of one peer.
pub struct PeerClient {
    group: u32,
    target: NodeId,
    transport: Option<Arc<Coalescer>>,
    retry_after: Duration,
    /// The commit index the last append-entries told the peer, if one was sent.
    sent_commit: Option<Option<LogId>>,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Msg(String);

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> Self::Network {
        PeerClient {
            group: self.group,
            target,
            transport: self.transport.clone(),
            retry_after: self.retry_after,
            sent_commit: None,
        }
    }
}

impl PeerClient {
    async fn call<T, E>(
        &self,
        frame: Result<Vec<u8>, String>,
        timeout: Duration,
        linger: bool,
    ) -> Result<T, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>
    where
        T: serde::de::DeserializeOwned,
        E: std::error::Error + serde::de::DeserializeOwned,
    {
        let frame = frame.map_err(|e| RPCError::Network(NetworkError::new(&Msg(e))))?;
        let Some(transport) = &self.transport else {
            return Err(RPCError::Unreachable(Unreachable::new(&Msg(format!(
                "node {} is unreachable: this node has no peers",
                self.target
            )))));
        };
        let answer = match transport.call(self.target, frame, timeout, linger).await {
            Ok(a) => a,
            Err(e @ TransportError::Unreachable(..)) => {
                return Err(RPCError::Unreachable(Unreachable::new(&e)));
            }
            Err(e @ TransportError::Failed(..)) => {
                return Err(RPCError::Network(NetworkError::new(&e)));
            }
        };
        let result: Result<T, RaftError<NodeId, E>> = wire::decode_response(&answer)
            .map_err(|e| RPCError::Network(NetworkError::new(&Msg(e))))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    /// openraft waits 500 ms by default after a failed RPC. A restarted peer would then miss
    /// its leader's heartbeats for that long, and a new leader that needs its vote to commit
    /// could not: writes stalled for half a second after every rolling restart step. Retrying
    /// every two heartbeats costs a refused connection per group per 100 ms to a peer that is
    /// down.
    fn backoff(&self) -> openraft::network::Backoff {
        openraft::network::Backoff::new(std::iter::repeat(self.retry_after))
    }

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        // A heartbeat may wait a moment for other groups' heartbeats to share its request;
        // an empty append that tells the peer a new commit index does not wait (the next
        // write of this group queues behind it), nor does one with entries.
        let commit = Some(rpc.leader_commit);
        let heartbeat = rpc.entries.is_empty() && self.sent_commit == commit;
        self.sent_commit = commit;
        self.call(
            wire::encode_append(self.group, &rpc),
            option.hard_ttl(),
            heartbeat,
        )
        .await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.call(
            wire::encode_snapshot(self.group, &rpc),
            option.hard_ttl(),
            false,
        )
        .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.call(
            wire::encode_vote(self.group, &rpc),
            option.hard_ttl(),
            false,
        )
        .await
    }
}
