//! The node's in-flight body budget (`http_inflight_body_size`, cluster.md §6.6): request body
//! bytes the HTTP layer holds at once, from the first byte read until the handler answers.
//! A body that does not fit answers `503 INGRESS_BODY_BYTES_LIMIT_REACHED` with
//! `Retry-After: 1`, before it is read when its `Content-Length` says so, so many large
//! uploads at once cannot exhaust memory.

use super::error::ApiError;
use std::sync::atomic::{AtomicU64, Ordering};
use ursula_core::ErrorCode;

/// Body bytes held by requests in flight, against a limit (`0`: unlimited).
#[derive(Debug)]
pub struct BodyBudget {
    used: AtomicU64,
    limit: u64,
}

impl BodyBudget {
    pub fn new(limit: u64) -> Self {
        BodyBudget {
            used: AtomicU64::new(0),
            limit,
        }
    }

    /// Bytes held now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// An empty charge; [`Charge::grow`] adds to it.
    pub fn charge(&self) -> Charge<'_> {
        Charge {
            budget: self,
            bytes: 0,
        }
    }

    fn take(&self, n: u64) -> bool {
        if self.limit == 0 {
            self.used.fetch_add(n, Ordering::Relaxed);
            return true;
        }
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                // A single body larger than the whole budget still gets through alone, so
                // the budget never refuses what the size limit allows.
                (u == 0 || u.saturating_add(n) <= self.limit).then_some(u + n)
            })
            .is_ok()
    }
}

/// Bytes one request holds; given back when dropped.
#[derive(Debug)]
pub struct Charge<'a> {
    budget: &'a BodyBudget,
    bytes: u64,
}

impl Charge<'_> {
    /// Holds `n` more bytes, or answers `503 INGRESS_BODY_BYTES_LIMIT_REACHED`.
    pub fn grow(&mut self, n: u64) -> Result<(), ApiError> {
        if n == 0 || self.budget.take(n) {
            self.bytes += n;
            return Ok(());
        }
        // A 503: rendered with `Retry-After: 1` (http/error.rs).
        Err(ApiError::new(
            ErrorCode::INGRESS_BODY_BYTES_LIMIT_REACHED,
            format!(
                "the node holds {} bytes of request bodies, its limit is {}; retry shortly",
                self.budget.used(),
                self.budget.limit
            ),
        ))
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Charge<'_> {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_are_bounded_and_given_back() {
        let b = BodyBudget::new(100);
        let mut a = b.charge();
        a.grow(60).unwrap();
        let mut c = b.charge();
        let e = c.grow(50).unwrap_err();
        assert_eq!(
            e.rejection.code,
            ErrorCode::INGRESS_BODY_BYTES_LIMIT_REACHED
        );
        c.grow(40).unwrap();
        assert_eq!(b.used(), 100);
        drop(a);
        assert_eq!(b.used(), 40);
        drop(c);
        assert_eq!(b.used(), 0);
        // Alone, a body larger than the budget is let through.
        let mut big = b.charge();
        big.grow(500).unwrap();
        assert!(b.charge().grow(1).is_err());
    }

    #[test]
    fn zero_is_unlimited() {
        let b = BodyBudget::new(0);
        let mut a = b.charge();
        a.grow(u64::MAX / 2).unwrap();
        a.grow(1000).unwrap();
    }
}
