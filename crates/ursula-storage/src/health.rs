//! [`StorageHealth`]: what the node's storage is going through, for admission, readiness and
//! metrics. Written by the WAL writer and the snapshot writers, read by everyone.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Shared, cheap-to-read storage state. Every flag has a counter beside it (a metric per fault).
#[derive(Debug, Default)]
pub struct StorageHealth {
    /// Set once a WAL write or sync failed with anything but a full disk. Never cleared in this
    /// process: the node fails stop (see docs/storage.md).
    failed: AtomicBool,
    failed_reason: Mutex<Option<String>>,
    /// The WAL writer holds a batch it could not write because the disk is full.
    stalled: AtomicBool,
    /// Free space is below the reserve (checked by [`crate::Wal::check_space`]).
    low_space: AtomicBool,
    low_space_reason: Mutex<Option<String>>,
    /// Groups whose last snapshot write failed (group -> reason); retried with backoff.
    snapshot_failures: Mutex<BTreeMap<u32, String>>,
    sync_failures_total: AtomicU64,
    write_failures_total: AtomicU64,
    no_space_total: AtomicU64,
    snapshot_failures_total: AtomicU64,
}

/// Counters of storage faults since start, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// WAL syncs that failed.
    pub sync_failures: u64,
    /// WAL writes that failed with something other than a full disk.
    pub write_failures: u64,
    /// Times the disk was found full (a write, allocation or free-space check).
    pub no_space: u64,
    /// Snapshot writes that failed.
    pub snapshot_failures: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl StorageHealth {
    /// True once the WAL failed for good (fail-stop pending).
    pub fn failed(&self) -> Option<String> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        lock(&self.failed_reason).clone()
    }

    /// Whether the disk is full: writes must be refused with `507` (nothing is changed).
    pub fn disk_full(&self) -> bool {
        self.stalled.load(Ordering::Acquire) || self.low_space.load(Ordering::Acquire)
    }

    /// Why the node is not fit to take writes, one line per cause (empty when healthy).
    pub fn reasons(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(r) = self.failed() {
            out.push(format!("storage failed: {r}"));
        }
        if self.stalled.load(Ordering::Acquire) {
            out.push("disk full: the wal cannot write its next batch".to_owned());
        }
        if self.low_space.load(Ordering::Acquire)
            && let Some(r) = lock(&self.low_space_reason).clone()
        {
            out.push(format!("disk full: {r}"));
        }
        for (group, r) in lock(&self.snapshot_failures).iter() {
            out.push(format!("snapshot write of group {group} failing: {r}"));
        }
        out
    }

    /// Fault counters since start.
    pub fn counts(&self) -> FaultCounts {
        FaultCounts {
            sync_failures: self.sync_failures_total.load(Ordering::Relaxed),
            write_failures: self.write_failures_total.load(Ordering::Relaxed),
            no_space: self.no_space_total.load(Ordering::Relaxed),
            snapshot_failures: self.snapshot_failures_total.load(Ordering::Relaxed),
        }
    }

    /// Whether the disk is currently found full by a write or the free-space check.
    pub fn stalled(&self) -> bool {
        self.stalled.load(Ordering::Acquire)
    }

    pub(crate) fn set_failed(&self, reason: String, sync: bool) {
        if sync {
            self.sync_failures_total.fetch_add(1, Ordering::Relaxed);
        } else {
            self.write_failures_total.fetch_add(1, Ordering::Relaxed);
        }
        let mut r = lock(&self.failed_reason);
        if r.is_none() {
            *r = Some(reason);
        }
        self.failed.store(true, Ordering::Release);
    }

    pub(crate) fn set_stalled(&self, stalled: bool) {
        if stalled && !self.stalled.swap(true, Ordering::AcqRel) {
            self.no_space_total.fetch_add(1, Ordering::Relaxed);
        } else if !stalled {
            self.stalled.store(false, Ordering::Release);
        }
    }

    pub(crate) fn set_low_space(&self, reason: Option<String>) {
        let low = reason.is_some();
        *lock(&self.low_space_reason) = reason;
        if low && !self.low_space.swap(true, Ordering::AcqRel) {
            self.no_space_total.fetch_add(1, Ordering::Relaxed);
        } else if !low {
            self.low_space.store(false, Ordering::Release);
        }
    }

    /// Records that writing the snapshot of `group` failed (it will be retried).
    pub fn snapshot_failed(&self, group: u32, reason: String) {
        self.snapshot_failures_total.fetch_add(1, Ordering::Relaxed);
        lock(&self.snapshot_failures).insert(group, reason);
    }

    /// Records that the snapshot of `group` was written.
    pub fn snapshot_ok(&self, group: u32) {
        let mut m = lock(&self.snapshot_failures);
        if !m.is_empty() {
            m.remove(&group);
        }
    }
}
