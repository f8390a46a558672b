//! The receiving side of the Raft transport: one encoded frame in, one encoded answer out.

use super::*;

use bytes::Bytes;
use futures::stream::{FuturesUnordered, Stream, StreamExt};

use crate::batch_wire;
use crate::network::TransportError;
use crate::wire::{
    self, AppendResult, ElectResult, ProposeResult, Request, SnapshotResult, VoteResult,
};

/// How long a proposal forwarded to a group's leader may take.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(30);

impl Node {
    /// Handles one Raft RPC frame from a peer (see `wire.rs`) and returns the answer frame.
    /// An undecodable frame or an unknown group is an `Err` (the transport answers it as a
    /// bad request; the sender treats it as a network failure and retries).
    pub async fn handle_rpc(&self, frame: &[u8]) -> Result<Vec<u8>, String> {
        if let Some(answer) = self.handle_rejoin_rpc(frame).await? {
            return Ok(answer);
        }
        let (group, req) = wire::decode_request(frame)?;
        let g = self
            .groups
            .get(group as usize)
            .ok_or_else(|| format!("no raft group {group} on node {}", self.node_id))?;
        if matches!(req, Request::Append(_) | Request::Snapshot(_)) {
            // Only a leader sends these: it is alive and reaches this node.
            g.heard_ms.store(self.clock_ms(), Ordering::Relaxed);
        }
        Ok(match req {
            Request::Append(r) => {
                wire::encode_response::<AppendResult>(&g.raft.append_entries(r).await)
            }
            Request::Vote(r) => wire::encode_response::<VoteResult>(&g.raft.vote(r).await),
            Request::Snapshot(r) => {
                wire::encode_response::<SnapshotResult>(&g.raft.install_snapshot(r).await)
            }
            // Proposed here only: a node that does not lead answers ForwardToLeader, so a
            // forwarded request never travels further.
            Request::Propose(cmd) => wire::encode_response::<ProposeResult>(
                &self.propose(group, cmd).await.map_err(Into::into),
            ),
            Request::Elect => wire::encode_response::<ElectResult>(&self.campaign(group).await),
        })
    }

    /// Handles a batch of frames from a peer (`batch_wire.rs`), all at once. The stream
    /// yields the answer stream's bytes: its header, then each frame's answer as soon as that
    /// frame is handled, so no frame waits for a slower one of another group.
    pub fn handle_batch(
        self: Arc<Self>,
        batch: Bytes,
    ) -> Result<impl Stream<Item = Vec<u8>> + Send + 'static, String> {
        let frames = batch_wire::decode_batch(batch)?;
        let calls: FuturesUnordered<_> = frames
            .into_iter()
            .enumerate()
            .map(|(i, frame)| {
                let node = Arc::clone(&self);
                async move { batch_wire::encode_answer(i as u32, &node.handle_rpc(&frame).await) }
            })
            .collect();
        Ok(futures::stream::once(async { batch_wire::answers_header() }).chain(calls))
    }

    /// [`Node::propose`], and where another node leads `group`, the same command proposed by
    /// that leader over the transport: for requests that must reach several groups (a bucket
    /// replicated to every group, a fork's pin in its source's group), whose leaders may sit
    /// on other nodes. A client's own write is redirected to its leader instead (HTTP 307).
    ///
    /// A forwarded command whose answer is lost may have been applied: like a client retry,
    /// the caller must be idempotent.
    pub async fn propose_via_leader(
        &self,
        group: u32,
        cmd: Command,
    ) -> Result<Response, ProposeError> {
        let Some(transport) = &self.transport else {
            return self.propose(group, cmd).await;
        };
        let leader = match self.not_leading(group) {
            None => return self.propose(group, cmd).await,
            Some(None) => return Err(ProposeError::ForwardToLeader { leader: None }),
            Some(Some(l)) => l,
        };
        let frame = wire::encode_propose(group, &cmd).map_err(ProposeError::Storage)?;
        let answer = transport
            .send(leader, frame, FORWARD_TIMEOUT)
            .await
            .map_err(|e| match e {
                // Not delivered: nothing was proposed.
                TransportError::Unreachable(..) => ProposeError::ForwardToLeader { leader: None },
                TransportError::Failed(..) => ProposeError::Unavailable(format!(
                    "forwarding to node {leader}, the leader of group {group}, failed: {e}"
                )),
            })?;
        let result: ProposeResult = wire::decode_response(&answer).map_err(|e| {
            ProposeError::Unavailable(format!("bad answer from node {leader}: {e}"))
        })?;
        result.map_err(Into::into)
    }
}
