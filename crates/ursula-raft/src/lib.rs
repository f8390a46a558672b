//! # ursula-raft
//!
//! openraft (0.9) wiring for Ursula: a node runs `group_count` independent Raft groups (each
//! replicating one [`ursula_core::GroupState`]), and every group logs to the node's single
//! shared [`ursula_storage::Wal`], so appends of all groups share fsyncs. A node without peers
//! is a one-voter cluster per group; with peers ([`NodeConfig::peers`]) every node hosts a
//! replica of every group, and the groups' RPCs travel over a [`Transport`] (HTTP in the server,
//! [`testing::TestNetwork`] in tests; frame format in `wire.rs`). See `docs/cluster.md`.
//!
//! ## Facade
//!
//! [`Node::open`] recovers and starts everything; [`Node::leader_of`], [`Node::peer_url`],
//! [`Node::ensure_linearizable`] and [`Node::wait_for_leaders`] answer who leads and make
//! leader reads linearizable; a follower's proposal fails with
//! [`ProposeError::ForwardToLeader`]; [`Node::handle_rpc`] takes a peer's RPC frame;
//! [`Node::propose`] replicates one
//! [`ursula_core::Command`] and returns what `GroupState::apply` answered, after the entry is
//! durable, committed and applied; [`Node::read`] runs a closure over a group's applied
//! state (the lock is never handed out) and [`Node::applied`] lets readers wait for changes; an [`ApplyListener`] in the [`NodeConfig`] hears which
//! streams each applied batch may have changed (live readers wait per stream).
//!
//! ## Batching
//!
//! openraft 0.9 appends each `client_write` separately and waits for its flush before the next
//! one, so one entry per proposal would cost one fsync per proposal per group. A per-group
//! batcher therefore packs the proposals queued while the previous batch was in flight into one
//! entry ([`types::Batch`]); the entry's response is one [`ursula_core::Response`] per command.
//! Command `n` of the group (counted over all applied batches, carried in snapshots) is applied
//! as `GroupState::apply(n, cmd)`, so every command has its own deterministic index.
//!
//! ## Data directory (format version 1)
//!
//! ```text
//! {data_dir}/node.toml                   magic, format_version = 1, node_id, group_count,
//!                                        optional cluster_id (adopted once, then enforced)
//! {data_dir}/wal/                        the shared WAL (ursula-storage format)
//! {data_dir}/snapshots/group-{g}.snap    ursula-storage snapshot file per group
//! {data_dir}/snapshots/group-{g}.recv    a snapshot being received from the leader
//! ```
//!
//! ### WAL records
//!
//! `WalRecord.group` is the Raft group; `kind` is one of:
//!
//! | kind | meaning  | payload                                                        |
//! |-----:|----------|----------------------------------------------------------------|
//! | 1    | entry    | `tag u8` (0 blank, 1 normal, 2 membership), `bincode(LogId)`, body |
//! | 2    | vote     | `bincode(Vote)`                                                |
//! | 3    | truncate | `bincode(LogId)`: entries with index >= its index were removed |
//! | 4    | purge    | `bincode(LogId)`: entries up to it (inclusive) were removed    |
//!
//! A normal entry's body is `count u32 LE`, then per command `len u32 LE` and
//! `Command::encode()` bytes. A membership body is `bincode(Membership)`. bincode is 1.x with
//! its default (fixed-int, little-endian) encoding.
//!
//! Recovery replays records in LSN order per group: an entry replaces any entry at or after its
//! index, truncate and purge remove entries, the last vote and the highest purge win. The
//! committed index is not logged: after a restart a single voter re-commits (and the state
//! machine re-applies from its snapshot) before [`Node::open`] returns; a node with peers
//! learns the commit index from its group's leader.
//!
//! ### Segment GC
//!
//! Each group *pins* the lowest LSN it needs: its first retained entry, and its latest durable
//! vote and purge records. Upkeep deletes the segments below every pin. When segments remain
//! that only old vote/purge records or an idle group's few entries keep alive, upkeep re-writes
//! those markers and asks that group to snapshot (which purges its log), so the WAL stays
//! bounded by what the groups have not yet snapshotted.
//!
//! ### Snapshots
//!
//! Payload = `bincode(SnapshotHeader)` (format 1, group, last applied log id, membership,
//! applied command count, snapshot id) followed by `GroupState::encode()`. Upkeep triggers them
//! (openraft's own policy is `Never`), at most one per pass and one per group per second: when
//! a group's retained log grows past max(`snapshot_min_log_bytes`, its last snapshot), when its
//! entries pin the oldest segment and the WAL is larger than its last snapshot, or after
//! `snapshot_logs` entries once the log since the last snapshot holds at least half of that
//! snapshot's bytes (so a byte of log costs at most two bytes of snapshot, however large the
//! state grows); the log is purged right after (`max_in_snapshot_log_to_keep = 0`). A snapshot file that cannot be written is
//! retried with backoff inside the build (openraft would stop the group if the build failed);
//! the log is not purged meanwhile and writes go on.
//!
//! ### Storage faults
//!
//! [`Node::propose`] refuses a write before it reaches the log while the WAL has failed
//! ([`ProposeError::StorageUnavailable`]) or the disk is full
//! ([`ProposeError::InsufficientStorage`]); a write whose batch was in the failed WAL sync is
//! [`ProposeError::OutcomeUnknown`]. [`Node::storage_health`] and [`Node::leaderless_groups`]
//! feed readiness and metrics. The policies are in `docs/storage.md`. A snapshot file is only written
//! while the node's WAL is open, so a reopened node never races a write of a previous instance.

pub mod batch_wire;
pub mod coalesce;
mod codec;
mod error;
mod identity;
mod listener;
mod log_store;
mod metrics;
pub mod network;
mod node;
mod state_machine;
pub mod testing;
pub mod types;
mod wire;

pub use coalesce::CoalesceStats;
pub use error::{ProposeError, RaftError};
pub use identity::{FORMAT_VERSION, recorded_group_count};
pub use listener::ApplyListener;
pub use log_store::LogStore;
pub use metrics::GroupMetrics;
pub use network::{BatchFuture, OnAnswer, RpcFuture, Transport, TransportError, send_each};
pub use node::{
    AllowError, Allowed, COMMIT_LINGER, Node, NodeConfig, RaftTiming, ShedState, StallClock,
    StallWatch, TransferError, observe_stall, shed, stalled_for,
};
pub use state_machine::{SnapshotBuilder, StateMachine};
pub use types::{Batch, BatchResponse, TypeConfig};
pub use ursula_storage::WalOptions;
