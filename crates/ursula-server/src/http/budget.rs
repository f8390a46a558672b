//! The node's in-flight body budget (`http_inflight_body_size`, protocol.md §2.4, cluster.md
//! §6.6): before a request body is read, its size (`Content-Length`, else the route's limit)
//! is reserved from a process-wide budget and held until the request is answered; a body
//! whose reservation does not fit answers `503 INGRESS_BODY_BYTES_LIMIT_REACHED` with
//! `Retry-After: 1` and is not read. Snapshot commit copies are charged to the same budget
//! (snapshot-parts.md §10). So many large uploads at once cannot exhaust memory.

use super::error::ApiError;
use std::sync::atomic::{AtomicU64, Ordering};
use ursula_core::ErrorCode;
use ursula_core::parts as rules;

/// Most commits copying at once on a node (snapshot-parts.md §10).
pub const MAX_COPIES: u64 = 2;

/// Bytes reserved by requests in flight and commit copies, against a limit (`0`: unlimited).
#[derive(Debug)]
pub struct BodyBudget {
    used: AtomicU64,
    copies: AtomicU64,
    limit: u64,
}

impl BodyBudget {
    pub fn new(limit: u64) -> Self {
        BodyBudget {
            used: AtomicU64::new(0),
            copies: AtomicU64::new(0),
            limit,
        }
    }

    /// The budget (`0`: unlimited).
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes reserved now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Reserves `n` bytes for a body, or answers `503 INGRESS_BODY_BYTES_LIMIT_REACHED`.
    /// Zero bytes reserve nothing.
    pub fn reserve(&self, n: u64) -> Result<Charge<'_>, ApiError> {
        if n == 0 || self.take(n, |used| used.saturating_add(n) <= self.limit) {
            return Ok(Charge {
                budget: self,
                bytes: n,
                copy: false,
            });
        }
        // A 503: rendered with `Retry-After: 1` (http/error.rs).
        Err(ApiError::new(
            ErrorCode::INGRESS_BODY_BYTES_LIMIT_REACHED,
            format!(
                "the node holds {} bytes of request bodies, its limit is {}; retry shortly",
                self.used(),
                self.limit
            ),
        ))
    }

    /// Reserves a commit copy's charge: at most [`MAX_COPIES`] at once, and only while a full
    /// part-sized request still fits beside everything reserved (snapshot-parts.md §10).
    pub fn reserve_copy(&self) -> Option<Charge<'_>> {
        self.copies
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                (c < MAX_COPIES).then_some(c + 1)
            })
            .ok()?;
        let charge = rules::copy_charge(if self.limit == 0 {
            u64::MAX
        } else {
            self.limit
        });
        if self.take(charge, |used| rules::copy_fits(used, self.limit)) {
            return Some(Charge {
                budget: self,
                bytes: charge,
                copy: true,
            });
        }
        self.copies.fetch_sub(1, Ordering::AcqRel);
        None
    }

    fn take(&self, n: u64, fits: impl Fn(u64) -> bool) -> bool {
        if self.limit == 0 {
            self.used.fetch_add(n, Ordering::Relaxed);
            return true;
        }
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                fits(u).then_some(u + n)
            })
            .is_ok()
    }
}

/// Bytes one request or copy holds; given back when dropped.
#[derive(Debug)]
pub struct Charge<'a> {
    budget: &'a BodyBudget,
    bytes: u64,
    copy: bool,
}

impl Charge<'_> {
    /// Bytes held.
    #[cfg(test)]
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Charge<'_> {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
        }
        if self.copy {
            self.budget.copies.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_are_bounded_and_given_back() {
        let b = BodyBudget::new(100);
        let a = b.reserve(60).unwrap();
        let e = b.reserve(50).unwrap_err();
        assert_eq!(e.code(), ErrorCode::INGRESS_BODY_BYTES_LIMIT_REACHED);
        let c = b.reserve(40).unwrap();
        assert_eq!(b.used(), 100);
        assert!(b.reserve(0).is_ok(), "an empty body reserves nothing");
        drop(a);
        assert_eq!(b.used(), 40);
        drop(c);
        assert_eq!(b.used(), 0);
        assert!(
            b.reserve(101).is_err(),
            "more than the whole budget never fits"
        );
    }

    #[test]
    fn copies_fit_beside_a_full_request_and_two_at_most() {
        let mib = 1u64 << 20;
        let b = BodyBudget::new(256 * mib);
        let one = b.reserve_copy().unwrap();
        assert_eq!(one.bytes(), 56 * mib);
        let two = b.reserve_copy().unwrap();
        assert!(b.reserve_copy().is_none(), "two copies at most");
        drop(two);
        // 56 (copy) + 150 (a body) + 56 + 32 > 256: a second copy must wait.
        let body = b.reserve(150 * mib).unwrap();
        assert!(b.reserve_copy().is_none());
        drop(body);
        let again = b.reserve_copy().unwrap();
        drop((one, again));
        assert_eq!(b.used(), 0);
        let small = BodyBudget::new(64 * mib);
        let c = small.reserve_copy().unwrap();
        assert_eq!(c.bytes(), 32 * mib);
        assert!(small.reserve_copy().is_none());
    }

    #[test]
    fn zero_is_unlimited() {
        let b = BodyBudget::new(0);
        let _a = b.reserve(u64::MAX / 4).unwrap();
        let _c = b.reserve_copy().unwrap();
    }
}
