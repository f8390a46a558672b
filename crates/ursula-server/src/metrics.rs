//! Process metrics, rendered as Prometheus text and as the JSON of `/__ursula/metrics`.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Default)]
pub struct Metrics {
    pub requests: AtomicU64,
    pub errors_4xx: AtomicU64,
    pub errors_5xx: AtomicU64,
    pub appends: AtomicU64,
    pub appended_bytes: AtomicU64,
    pub reads: AtomicU64,
    pub read_bytes: AtomicU64,
    pub live_waiters: AtomicU64,
    pub sse_connections: AtomicU64,
    /// SSE responses opened, and the data events they sent.
    pub sse_opened: AtomicU64,
    pub sse_data_events: AtomicU64,
    pub live_wakeups: AtomicU64,
}

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

pub fn inc(c: &AtomicU64, by: u64) {
    c.fetch_add(by, Ordering::Relaxed);
}

impl Metrics {
    fn pairs(&self) -> [(&'static str, &'static str, &'static str, u64); 12] {
        [
            (
                "ursula_http_requests_total",
                "counter",
                "HTTP requests answered",
                get(&self.requests),
            ),
            (
                "ursula_http_client_errors_total",
                "counter",
                "4xx answers",
                get(&self.errors_4xx),
            ),
            (
                "ursula_http_server_errors_total",
                "counter",
                "5xx answers",
                get(&self.errors_5xx),
            ),
            (
                "ursula_appends_total",
                "counter",
                "accepted appends",
                get(&self.appends),
            ),
            (
                "ursula_appended_bytes_total",
                "counter",
                "bytes appended",
                get(&self.appended_bytes),
            ),
            (
                "ursula_reads_total",
                "counter",
                "read responses with data",
                get(&self.reads),
            ),
            (
                "ursula_read_bytes_total",
                "counter",
                "stream bytes served",
                get(&self.read_bytes),
            ),
            (
                "ursula_live_waiters",
                "gauge",
                "long-poll readers waiting",
                get(&self.live_waiters),
            ),
            (
                "ursula_sse_connections",
                "gauge",
                "open SSE responses",
                get(&self.sse_connections),
            ),
            (
                "ursula_sse_responses_total",
                "counter",
                "SSE responses opened",
                get(&self.sse_opened),
            ),
            (
                "ursula_sse_data_events_total",
                "counter",
                "data events sent on SSE responses",
                get(&self.sse_data_events),
            ),
            (
                "ursula_live_wakeups_total",
                "counter",
                "live readers woken by a change to their stream",
                get(&self.live_wakeups),
            ),
        ]
    }

    /// Prometheus text exposition format.
    /// `extra`: (name, Prometheus type, value) read at scrape time.
    pub fn prometheus(&self, extra: &[(&str, &str, u64)]) -> String {
        let mut out = String::new();
        for (name, kind, help, v) in self.pairs() {
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n"
            ));
        }
        for (name, kind, v) in extra {
            out.push_str(&format!("# TYPE {name} {kind}\n{name} {v}\n"));
        }
        out
    }

    pub fn json(&self, extra: &[(&str, &str, u64)]) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        for (name, _, _, v) in self.pairs() {
            m.insert(name.trim_start_matches("ursula_").to_owned(), v.into());
        }
        for (name, _, v) in extra {
            m.insert(name.trim_start_matches("ursula_").to_owned(), (*v).into());
        }
        serde_json::Value::Object(m)
    }
}

/// Counts something while alive (a waiting reader, an open SSE response).
pub struct Gauge<'a>(&'a AtomicU64);

impl<'a> Gauge<'a> {
    pub fn new(c: &'a AtomicU64) -> Self {
        c.fetch_add(1, Ordering::Relaxed);
        Gauge(c)
    }
}

impl Drop for Gauge<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
