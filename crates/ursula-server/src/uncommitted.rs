//! `raft.max_uncommitted_size_per_group` (cluster.md §6.6): a bound on the payload bytes a
//! group has proposed and not yet answered, so that a leader whose followers fall behind
//! (or whose disk stalls) refuses new writes with `503 RAFT_UNCOMMITTED_BACKPRESSURE` instead
//! of holding ever more of them in memory.
//!
//! Only a client's data counts (appends and creates, with their bodies or, for an external
//! payload, its message ends): the node's own commands (flushes, GC, retention, snapshots)
//! and deletes are never refused, since they are what frees memory. A write is counted from
//! its proposal until its answer (applied, refused, failed or timed out). A group holding
//! nothing admits any one write, so a body larger than the bound is not refused forever.

use crate::http::error::ApiError;
use std::sync::atomic::{AtomicU64, Ordering};
use ursula_core::ErrorCode;

/// Each group's bytes proposed and not yet answered.
pub struct Uncommitted {
    cap: Option<u64>,
    groups: Vec<AtomicU64>,
    refused: AtomicU64,
}

/// Bytes counted until dropped.
#[must_use = "the bytes stay counted only while this lives"]
pub struct Held<'a> {
    counter: Option<&'a AtomicU64>,
    bytes: u64,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.counter {
            c.fetch_sub(self.bytes, Ordering::AcqRel);
        }
    }
}

impl Uncommitted {
    pub fn new(groups: u32, cap: Option<u64>) -> Self {
        Uncommitted {
            cap,
            groups: (0..groups).map(|_| AtomicU64::new(0)).collect(),
            refused: AtomicU64::new(0),
        }
    }

    /// Counts `bytes` for `group`, or answers `503 RAFT_UNCOMMITTED_BACKPRESSURE` when they
    /// would take it past the bound.
    pub fn admit(&self, group: u32, bytes: u64) -> Result<Held<'_>, ApiError> {
        let (Some(cap), Some(counter)) = (self.cap, self.groups.get(group as usize)) else {
            return Ok(Held {
                counter: None,
                bytes: 0,
            });
        };
        match counter.fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
            (held == 0 || held.saturating_add(bytes) <= cap).then(|| held.saturating_add(bytes))
        }) {
            Ok(_) => Ok(Held {
                counter: Some(counter),
                bytes,
            }),
            Err(held) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                Err(ApiError::new(
                    ErrorCode::RAFT_UNCOMMITTED_BACKPRESSURE,
                    format!(
                        "raft group {group} holds {held} bytes proposed and not yet committed \
                         (raft.max_uncommitted_size_per_group {cap}); retry"
                    ),
                ))
            }
        }
    }

    /// Writes refused so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Bytes every group holds now, added up.
    pub fn held(&self) -> u64 {
        self.groups.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_past_the_bound_are_refused_until_earlier_ones_are_answered() {
        let u = Uncommitted::new(2, Some(100));
        let a = u.admit(0, 60).ok();
        let b = u.admit(0, 40).ok();
        assert!(a.is_some() && b.is_some(), "up to the bound");
        let e = u.admit(0, 1).err().map(|e| e.code());
        assert_eq!(e, Some(ErrorCode::RAFT_UNCOMMITTED_BACKPRESSURE));
        assert!(u.admit(1, 100).is_ok(), "per group");
        assert_eq!(u.held(), 100);
        drop(a);
        assert!(u.admit(0, 60).is_ok(), "room again once answered");
        drop(b);
        assert_eq!(u.held(), 0, "every hold given back");
        // A group holding nothing admits one write of any size.
        assert!(u.admit(0, 1_000).is_ok());
        assert_eq!(u.refused(), 1);
        // No bound: nothing is counted.
        let off = Uncommitted::new(1, None);
        let h = off.admit(0, u64::MAX).ok();
        assert!(h.is_some());
        assert_eq!(off.held(), 0);
    }
}
