//! The openraft type configuration shared by every group, and short aliases.

use openraft::BasicNode;
use serde::{Deserialize, Serialize};
use ursula_core::{Command, Response};

/// The application data of one Raft log entry: the commands of one proposal batch.
///
/// Concurrent [`crate::Node::propose`] calls on a group are gathered into one entry, because
/// openraft 0.9 appends (and waits for the flush of) every `client_write` separately; one entry
/// per batch is what lets many proposals share one WAL fsync. Commands apply in order.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Batch(pub Vec<Command>);

/// What applying one entry answered: one [`Response`] per command of its [`Batch`], in order
/// (empty for blank and membership entries).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchResponse(pub Vec<Response>);

openraft::declare_raft_types!(
    /// openraft type configuration of every Ursula Raft group.
    pub TypeConfig:
        D = Batch,
        R = BatchResponse,
        NodeId = u64,
        Node = BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        // A snapshot travels as its file: openraft reads (and a receiver writes) one chunk at a
        // time, so no side holds a whole snapshot in memory for the transfer.
        SnapshotData = tokio::fs::File,
        AsyncRuntime = openraft::TokioRuntime,
);

/// Raft node id.
pub type NodeId = u64;
/// A Raft group handle.
pub type Raft = openraft::Raft<TypeConfig>;
/// A log id (leader id + index).
pub type LogId = openraft::LogId<NodeId>;
/// A vote.
pub type Vote = openraft::Vote<NodeId>;
/// A log entry.
pub type Entry = openraft::Entry<TypeConfig>;
/// A membership config.
pub type Membership = openraft::Membership<NodeId, BasicNode>;
/// A membership config with the log id that introduced it.
pub type StoredMembership = openraft::StoredMembership<NodeId, BasicNode>;
/// Snapshot metadata.
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, BasicNode>;
/// openraft's storage error.
pub type StorageError = openraft::StorageError<NodeId>;
