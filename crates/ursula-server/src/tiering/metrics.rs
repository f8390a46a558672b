//! The cold tier's metrics (`/__ursula/metrics`).

use super::Tiering;
use std::sync::atomic::{AtomicU64, Ordering};
use ursula_core::cold::GroupSizes;
impl Tiering {
    /// The cold tier's metrics, read at scrape time; the sizes are each group's, taken in one
    /// short read of its state ([`ursula_core::GroupState::sizes`]).
    pub fn metrics(&self, sizes: &[GroupSizes]) -> Vec<(&'static str, &'static str, u64)> {
        let sum = |f: fn(&GroupSizes) -> u64| sizes.iter().map(f).sum::<u64>();
        let hot = sum(|s| s.hot_bytes);
        let cold = sum(|s| s.cold_bytes);
        let objects = sum(|s| s.cold_objects);
        let queued = sum(|s| s.gc_queued);
        let m = &self.metrics;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut rows = self.external.rows();
        rows.extend([
            ("ursula_hot_bytes", "gauge", hot),
            (
                "ursula_cold_store_healthy",
                "gauge",
                u64::from(self.health.reason().is_none()),
            ),
            ("ursula_cold_bytes", "gauge", cold),
            ("ursula_cold_objects", "gauge", objects),
            ("ursula_cold_gc_queued_objects", "gauge", queued),
            ("ursula_cold_flushes_total", "counter", get(&m.flushes)),
            (
                "ursula_cold_pressure_flush_passes_total",
                "counter",
                get(&m.pressure_flushes),
            ),
            (
                "ursula_cold_flushed_bytes_total",
                "counter",
                get(&m.flushed_bytes),
            ),
            (
                "ursula_cold_flush_errors_total",
                "counter",
                get(&m.flush_errors),
            ),
            (
                "ursula_cold_gc_deleted_total",
                "counter",
                get(&m.gc_deleted),
            ),
            ("ursula_cold_gc_errors_total", "counter", get(&m.gc_errors)),
            ("ursula_cold_reads_total", "counter", get(&m.cold_reads)),
            (
                "ursula_cold_read_bytes_total",
                "counter",
                get(&m.cold_read_bytes),
            ),
            (
                "ursula_cold_read_errors_total",
                "counter",
                get(&m.cold_read_errors),
            ),
            (
                "ursula_cold_store_calls_total",
                "counter",
                get(&m.store_calls),
            ),
            (
                "ursula_cold_store_micros_total",
                "counter",
                get(&m.store_micros),
            ),
            (
                "ursula_cold_backpressure_total",
                "counter",
                get(&m.backpressured),
            ),
            (
                "ursula_cold_cache_hits_total",
                "counter",
                self.cache.as_ref().map_or(0, |c| get(&c.metrics.hits)),
            ),
            (
                "ursula_cold_cache_misses_total",
                "counter",
                self.cache.as_ref().map_or(0, |c| get(&c.metrics.misses)),
            ),
            (
                "ursula_cold_cache_bytes",
                "gauge",
                self.cache.as_ref().map_or(0, |c| c.weight()),
            ),
            (
                "ursula_cold_sendfile_bytes_total",
                "counter",
                crate::send_file::SENT.load(Ordering::Relaxed),
            ),
        ]);
        rows
    }
}
