//! `GET /__ursula/gateway/metrics` (cluster.md §12.9).

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Default)]
pub struct Metrics {
    pub requests: AtomicU64,
    pub leader_cache_hits: AtomicU64,
    pub leader_cache_misses: AtomicU64,
    pub leader_cache_updates: AtomicU64,
    pub leader_cache_evictions: AtomicU64,
    pub leader_redirects: AtomicU64,
    /// Nanoseconds spent on the upstream answers that were redirects.
    pub leader_redirect_ns: AtomicU64,
}

pub fn inc(c: &AtomicU64, by: u64) {
    c.fetch_add(by, Ordering::Relaxed);
}

impl Metrics {
    pub fn json(&self, entries: usize) -> String {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        serde_json::json!({
            "requests": g(&self.requests),
            "leader_cache_hits": g(&self.leader_cache_hits),
            "leader_cache_misses": g(&self.leader_cache_misses),
            "leader_cache_updates": g(&self.leader_cache_updates),
            "leader_cache_evictions": g(&self.leader_cache_evictions),
            "leader_redirects": g(&self.leader_redirects),
            "leader_redirect_ns": g(&self.leader_redirect_ns),
            "leader_cache_entries": entries,
        })
        .to_string()
    }
}
