//! Errors of the cold store: the conditions a caller branches on are variants, never strings.

use std::fmt;

/// Why a cold-store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ColdError {
    /// No object at `key`.
    #[error("cold object {key} not found")]
    NotFound { key: String },
    /// A conditional create found an object already at `key` (immutable objects are never
    /// overwritten).
    #[error("cold object {key} already exists")]
    AlreadyExists { key: String },
    /// Another precondition of the request failed.
    #[error("precondition failed for cold object {key}")]
    Precondition { key: String },
    /// The range is empty, reversed or reaches past the object's `size` (`size` is 0 for an
    /// empty or reversed range, which is refused without asking the store).
    #[error("range {start}..{end} is outside cold object {key} of {size} bytes")]
    InvalidRange {
        key: String,
        start: u64,
        end: u64,
        size: u64,
    },
    /// The key is not a valid object key (see [`super::ObjectKey`]).
    #[error("invalid cold object key {key:?}: {reason}")]
    InvalidKey { key: String, reason: &'static str },
    /// The store refused the credentials or the permission.
    #[error("cold store denied access to {key}: {source}")]
    Denied {
        key: String,
        #[source]
        source: object_store::Error,
    },
    /// The backend cannot do this operation (e.g. conditional create on a store without it).
    #[error("cold store does not support {operation}: {detail}")]
    Unsupported {
        operation: &'static str,
        detail: String,
    },
    /// The store failed or could not be reached; the operation may succeed if retried.
    #[error("cold store unavailable during {operation}: {source}")]
    Unavailable {
        operation: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
}

impl ColdError {
    /// Whether retrying the same operation later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, ColdError::Unavailable { .. })
    }

    /// Maps an `object_store` error of `operation` on `key`.
    pub(crate) fn from_store(operation: &'static str, key: &str, e: object_store::Error) -> Self {
        use object_store::Error as E;
        let key = key.to_owned();
        match e {
            E::NotFound { .. } => ColdError::NotFound { key },
            E::AlreadyExists { .. } => ColdError::AlreadyExists { key },
            E::Precondition { .. } | E::NotModified { .. } => ColdError::Precondition { key },
            E::InvalidPath { .. } => ColdError::InvalidKey {
                key,
                reason: "rejected by the object store",
            },
            E::PermissionDenied { .. } | E::Unauthenticated { .. } => {
                ColdError::Denied { key, source: e }
            }
            E::NotSupported { .. } | E::NotImplemented { .. } => ColdError::Unsupported {
                operation,
                detail: e.to_string(),
            },
            other => ColdError::Unavailable {
                operation,
                source: Box::new(other),
            },
        }
    }
}

/// A fault the fault-injecting twin reports (see [`super::FaultyColdStore`]).
#[derive(Debug)]
pub struct InjectedFault;

impl fmt::Display for InjectedFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("injected fault")
    }
}

impl std::error::Error for InjectedFault {}
