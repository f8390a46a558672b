//! The network of a single-node deployment: there are no peers, so every other node is
//! unreachable. A real network replaces [`SingleNodeNetwork`] with an implementation of the same
//! openraft traits; nothing else depends on it.

use openraft::BasicNode;
use openraft::error::{InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};

use crate::types::{NodeId, TypeConfig};

#[derive(Debug, thiserror::Error)]
#[error("node {0} is unreachable: this node runs without a network")]
struct NoNetwork(NodeId);

/// Connects to no one.
#[derive(Clone, Debug, Default)]
pub struct SingleNodeNetwork;

/// A "connection" to a peer that always fails with [`Unreachable`].
#[derive(Debug)]
pub struct UnreachablePeer {
    target: NodeId,
}

impl UnreachablePeer {
    fn err<E: std::error::Error>(&self) -> RPCError<NodeId, BasicNode, E> {
        RPCError::Unreachable(Unreachable::new(&NoNetwork(self.target)))
    }
}

impl RaftNetworkFactory<TypeConfig> for SingleNodeNetwork {
    type Network = UnreachablePeer;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> Self::Network {
        UnreachablePeer { target }
    }
}

impl RaftNetwork<TypeConfig> for UnreachablePeer {
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        Err(self.err())
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        Err(self.err())
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        Err(self.err())
    }
}
