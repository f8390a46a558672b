//! Error codes of the JSON error body and the rejection a command can produce.

use crate::ids::Incarnation;
use crate::snapshot::Digest;
use serde::{Deserialize, Serialize};

macro_rules! codes {
    ($($name:ident),* $(,)?) => {
        /// Machine-readable error codes (errors.md §2). The HTTP layer maps each to a status.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[allow(non_camel_case_types, reason = "codes are spelled exactly as on the wire")]
        pub enum ErrorCode { $($name),* }

        impl ErrorCode {
            /// The code as it appears in `{"error":{"code": ...}}`.
            pub fn as_str(self) -> &'static str {
                match self { $(ErrorCode::$name => stringify!($name)),* }
            }
        }
    };
}

codes! {
    INVALID_BUCKET_ID, INVALID_STREAM_ID, INVALID_OFFSET, INVALID_QUERY, INVALID_HEADER,
    INVALID_FORK_SOURCE, INVALID_FORK_OFFSET, INVALID_FORK_SUB_OFFSET, FORK_DEPTH_EXCEEDED,
    INVALID_JSON, MISSING_CONTENT_TYPE, EMPTY_APPEND, INVALID_PRODUCER, INVALID_STREAM_ATTRS,
    INVALID_RECORD_BOUNDARIES, INVALID_SNAPSHOT, INVALID_RETENTION,
    PAYLOAD_TOO_LARGE, MALFORMED_REQUEST, REQUEST_TIMEOUT, URI_TOO_LONG, HEADERS_TOO_LARGE,
    OFFSET_OUT_OF_RANGE,
    BUCKET_NOT_FOUND, STREAM_NOT_FOUND, FORK_SOURCE_NOT_FOUND, SNAPSHOT_NOT_FOUND, NOT_FOUND,
    METHOD_NOT_ALLOWED, PRODUCER_EPOCH_STALE, STREAM_ALREADY_EXISTS_CONFLICT, PATH_SOFT_DELETED,
    FORK_SOURCE_SOFT_DELETED, STREAM_CLOSED, CONTENT_TYPE_MISMATCH, STREAM_SEQ_CONFLICT,
    PRODUCER_SEQ_CONFLICT, SNAPSHOT_CONFLICT, BUCKET_NOT_EMPTY, STREAM_GONE, STREAM_SOFT_DELETED,
    INCARNATION_MISMATCH, RECORD_PRECONDITION_FAILED,
    QUOTA_EXCEEDED, INTERNAL_ERROR, INGRESS_BODY_BYTES_LIMIT_REACHED, LIVE_READ_BACKPRESSURE,
    LEADER_UNAVAILABLE, SERVICE_SHUTTING_DOWN, COLD_STORE_NOT_CONFIGURED,
    INVALID_CONTENT_TYPE, WRITE_OUTCOME_UNKNOWN, STORAGE_UNAVAILABLE, INSUFFICIENT_STORAGE,
    COLD_STORE_FAILED, COLD_BACKPRESSURE,
    INVALID_SNAPSHOT_MANIFEST, UNKNOWN_SNAPSHOT_PART, SNAPSHOT_DIGEST_MISMATCH, STAGED_PARTS_LIMIT,
    SNAPSHOT_COMMIT_IN_PROGRESS, SNAPSHOT_COMMITS_BUSY,
    NOT_LEADER, NOT_A_VOTER, TRANSFER_REFUSED, INVALID_ADMIN_TARGET,
    RAFT_UNCOMMITTED_BACKPRESSURE,
}

/// A refused request: code, message, and the protocol facts that travel as headers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejection {
    pub code: ErrorCode,
    pub message: String,
    /// Boxed: rejections are the cold path, and this keeps `Result`s small.
    pub facts: Box<Facts>,
}

/// Header facts that accompany an error (errors.md §4).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Facts {
    pub next_offset: Option<u64>,
    pub earliest_offset: Option<u64>,
    pub closed: bool,
    pub producer_epoch: Option<u64>,
    pub expected_seq: Option<u64>,
    pub received_seq: Option<u64>,
    pub incarnation: Option<Incarnation>,
    pub record_next: Option<u64>,
    pub record_first: Option<u64>,
    pub json: bool,
    /// The latest visible snapshot, on `409 SNAPSHOT_CONFLICT`.
    pub snapshot: Option<(u64, Digest)>,
}

impl Rejection {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Rejection {
            code,
            message: message.into(),
            facts: Box::default(),
        }
    }

    pub fn with(mut self, f: impl FnOnce(&mut Facts)) -> Self {
        f(&mut self.facts);
        self
    }
}
