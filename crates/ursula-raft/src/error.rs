//! Errors of [`crate::Node`].

use std::path::{Path, PathBuf};

use ursula_storage::WalError;

/// Why a node could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum RaftError {
    /// An I/O error on a file of the data directory.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The WAL could not be opened or recovered.
    #[error("wal: {0}")]
    Wal(#[from] WalError),
    /// The data directory belongs to another node, another group count or an unknown format.
    #[error("data directory: {0}")]
    DataDir(String),
    /// Recovered data is inconsistent (a WAL record or snapshot that cannot be decoded or does
    /// not fit).
    #[error("corrupt data: {0}")]
    Corrupt(String),
    /// The configuration is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// An internal task failed (a bug).
    #[error("internal error: {0}")]
    Internal(String),
    /// A Raft group failed to start, initialize or win leadership.
    #[error("raft group {group}: {message}")]
    Group { group: u32, message: String },
}

impl RaftError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        RaftError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Why a proposal failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ProposeError {
    /// Retryable (HTTP 503): this node is not the group's leader, the node is shutting down, or
    /// the group stopped. The command was not applied by this call's knowledge; it may still have
    /// been if the failure happened after it was submitted.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// Fatal: the log could not be made durable (the WAL failed); the group has stopped.
    #[error("storage failure: {0}")]
    Storage(String),
    /// The node's storage has failed (a WAL sync or write): it takes no writes until it has
    /// restarted (fail-stop, see docs/storage.md). The command was not logged. HTTP 503
    /// `STORAGE_UNAVAILABLE`.
    #[error("storage unavailable: {0}")]
    StorageUnavailable(String),
    /// The command reached the log but the sync that would have made it durable failed: it may
    /// or may not be present after the restart. HTTP 503 `WRITE_OUTCOME_UNKNOWN`.
    #[error("outcome unknown: {0}")]
    OutcomeUnknown(String),
    /// The disk is full; the command was not logged (nothing changed). Writes resume by
    /// themselves once space is free. HTTP 507 `INSUFFICIENT_STORAGE`.
    #[error("insufficient storage: {0}")]
    InsufficientStorage(String),
    /// The command is too large to log (approximate encoded size in bytes).
    #[error("command of about {size} bytes exceeds the limit of {max} bytes")]
    TooLarge { size: usize, max: usize },
    /// This node does not lead the group: `leader` does (retry there), or no leader is known
    /// yet (`None`: an election is in progress; retry shortly). Nothing was logged.
    #[error("not the leader (leader: {leader:?})")]
    ForwardToLeader { leader: Option<u64> },
    /// The group id is not below [`crate::Node::group_count`].
    #[error("no such raft group {0}")]
    NoSuchGroup(u32),
}

impl ProposeError {
    /// Whether retrying later (possibly on another node) may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            ProposeError::Unavailable(_) | ProposeError::ForwardToLeader { .. }
        )
    }
}
