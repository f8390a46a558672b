//! The cold tier's metrics (`/__ursula/metrics`).

use super::Tiering;
use crate::app::App;
use std::sync::atomic::{AtomicU64, Ordering};
impl Tiering {
    /// The cold tier's metrics, read at scrape time (exact hot and cold sizes come from
    /// one short read of each group's state).
    pub fn metrics(&self, app: &App) -> Vec<(&'static str, &'static str, u64)> {
        let (mut hot, mut cold, mut objects, mut queued) = (0, 0, 0, 0);
        for g in 0..app.node.group_count() {
            app.with_group(g, |gs| {
                hot += gs.hot_bytes();
                cold += gs.cold_bytes();
                objects += gs.cold.objects.len() as u64;
                queued += gs.cold.gc.len() as u64;
            });
        }
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
