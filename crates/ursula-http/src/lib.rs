//! HTTP/1 plumbing shared by the node (`ursula`) and the gateway (`ursulagw`), so that both
//! answer the same way where the spec says they must:
//! - [`error_body`]: the JSON error body of errors.md §1;
//! - [`parse_errors`]: that body also on the answers hyper writes itself to requests it
//!   cannot parse (OQ-32);
//! - [`strip_hop_by_hop`]: the headers of one connection, which a proxy never forwards;
//! - [`congestion`]: the TCP congestion control of client connections.

pub mod congestion;
mod hop_by_hop;
pub mod parse_errors;

pub use hop_by_hop::strip_hop_by_hop;
pub use parse_errors::{Armed, JsonParseErrors};

use ursula_core::ErrorCode;

/// `{"error":{"code":code,"message":message}}`.
pub fn error_body(code: ErrorCode, message: &str) -> String {
    error_body_str(code.as_str(), message)
}

/// [`error_body`] for a code given as text (the gateway's own codes).
pub fn error_body_str(code: &str, message: &str) -> String {
    serde_json::json!({ "error": { "code": code, "message": message } }).to_string()
}
