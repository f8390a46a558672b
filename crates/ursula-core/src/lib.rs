//! `ursula-core`: the pure, deterministic state machine of Ursula.
//!
//! No async, no IO, no clock: time arrives inside each [`command::Command`].
//!
//! Module map:
//! - [`bytelog`]: a stream's hot bytes in fixed-size chunks.
//! - [`ends`]: a stream's message ends in shared chunks, so that a snapshot's clone is cheap,
//!   and packed (LEB128 differences) when persisted.
//! - [`cold`]: chunk references into the cold tier, flushes, object GC, read plans.
//! - [`external`]: payloads written to the cold tier before they are proposed.
//! - [`ids`]: bucket and stream IDs, stream keys, group placement, incarnations.
//! - [`offset`]: the 20-digit offset tokens and their accepted input forms.
//! - [`content_type`]: normalization, matching, JSON/text detection.
//! - [`json`]: JSON-mode validation, flattening and canonical NDJSON.
//! - [`error`]: wire error codes and rejections with their header facts.
//! - [`command`]: the replicated command model and its replies.
//! - [`parts`]: the rules of multi-part snapshot upload (manifest, part IDs, staged bounds).
//! - [`producer`]: idempotent producer validation and receipts.
//! - [`stream`]: one stream's state, boundaries and TTL decisions.
//! - [`snapshot`]: snapshot digests and the publish/delete checks.
//! - [`retention`]: the retained offset and physical trimming below it.
//! - [`read`]: what a read may see: stream lookup (lapse, soft delete, fences) and read plans
//!   across fork chains.
//! - [`records`]: record-aware reads of JSON streams (parameters, start, window).
//! - [`group`]: one Raft group's state and `apply`.
//! - [`encoding`]: the versioned durable encoding of commands and group state.

pub mod bytelog;
pub mod cold;
pub mod command;
pub mod content_type;
pub mod encoding;
pub mod ends;
pub mod error;
pub mod external;
pub mod group;
pub mod ids;
pub mod json;
pub mod offset;
pub mod parts;
pub mod producer;
pub mod read;
pub mod records;
pub mod retention;
pub mod snapshot;
pub mod stream;

pub use command::{Command, Op, Reply, Response};
pub use encoding::Schema;
pub use error::{ErrorCode, Rejection};
pub use group::GroupState;
pub use ids::{Incarnation, StreamKey};
