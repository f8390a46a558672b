//! The receiving side of the Raft transport: one encoded frame in, one encoded answer out.

use super::*;

use crate::wire::{self, AppendResult, Request, SnapshotResult, VoteResult};

impl Node {
    /// Handles one Raft RPC frame from a peer (see `wire.rs`) and returns the answer frame.
    /// An undecodable frame or an unknown group is an `Err` (the transport answers it as a
    /// bad request; the sender treats it as a network failure and retries).
    pub async fn handle_rpc(&self, frame: &[u8]) -> Result<Vec<u8>, String> {
        let (group, req) = wire::decode_request(frame)?;
        let g = self
            .groups
            .get(group as usize)
            .ok_or_else(|| format!("no raft group {group} on node {}", self.node_id))?;
        Ok(match req {
            Request::Append(r) => {
                wire::encode_response::<AppendResult>(&g.raft.append_entries(r).await)
            }
            Request::Vote(r) => wire::encode_response::<VoteResult>(&g.raft.vote(r).await),
            Request::Snapshot(r) => {
                wire::encode_response::<SnapshotResult>(&g.raft.install_snapshot(r).await)
            }
        })
    }
}
