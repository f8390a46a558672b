//! Request latency by operation and Raft group, and answers by status (cluster.md §9.1).
//!
//! A request is timed from its head (parsed) to its answer's head (ready to send); a read's
//! body streams after that, and live reads (long-poll, SSE), which wait by design, are not
//! timed. Each group has its own histograms; the node's are their sum, taken at scrape time,
//! so a request costs two clock reads and three relaxed atomic adds.

use http::StatusCode;
use serde_json::{Map, Value, json};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the buckets in microseconds; a last bucket (`+Inf`) holds the rest.
pub const BOUNDS_US: [u64; 16] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
];
const BUCKETS: usize = BOUNDS_US.len() + 1;

/// What a timed request did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `POST` to a stream.
    Append,
    /// A catch-up read: `GET`/`HEAD` of a stream, its bootstrap, snapshot or retention, a
    /// bucket or its listing.
    Read,
    /// Any other change: create, delete, a snapshot or retention change, a bucket's.
    Mutation,
}

impl Op {
    pub const ALL: [Op; 3] = [Op::Append, Op::Read, Op::Mutation];

    pub fn name(self) -> &'static str {
        match self {
            Op::Append => "append",
            Op::Read => "read",
            Op::Mutation => "mutation",
        }
    }
}

#[derive(Default)]
struct Histogram {
    /// Requests per bucket (not cumulative).
    buckets: [AtomicU64; BUCKETS],
    sum_us: AtomicU64,
}

impl Histogram {
    fn observe(&self, us: u64) {
        let i = BOUNDS_US.partition_point(|b| *b < us);
        if let Some(b) = self.buckets.get(i) {
            b.fetch_add(1, Ordering::Relaxed);
        }
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    fn add_to(&self, s: &mut Summary) {
        for (n, b) in s.buckets.iter_mut().zip(&self.buckets) {
            *n += b.load(Ordering::Relaxed);
        }
        s.sum_us += self.sum_us.load(Ordering::Relaxed);
    }
}

/// A histogram's counts read at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Requests per bucket (not cumulative), the last one above every bound.
    pub buckets: [u64; BUCKETS],
    pub sum_us: u64,
}

impl Summary {
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// The bound of the bucket that holds quantile `q` (0..=1), `None` when it is above every
    /// bound or nothing was counted.
    pub fn quantile_bound_us(&self, q: f64) -> Option<u64> {
        let count = self.count();
        if count == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return BOUNDS_US.get(i).copied();
            }
        }
        None
    }

    fn json(&self) -> Value {
        let mut cumulative = Map::new();
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            let le = BOUNDS_US.get(i).map_or("+Inf".to_owned(), u64::to_string);
            cumulative.insert(le, seen.into());
        }
        json!({
            "count": self.count(),
            "sum_us": self.sum_us,
            "le_us": cumulative,
            "p50_le_us": self.quantile_bound_us(0.5),
            "p99_le_us": self.quantile_bound_us(0.99),
        })
    }
}

/// Latency histograms of every group and answers by status.
pub struct Latency {
    /// Per group, one histogram per [`Op`]; the last entry is for requests of no group (a
    /// bucket's).
    groups: Vec<[Histogram; 3]>,
    /// Answers by status code, from 100 to 599.
    statuses: Vec<AtomicU64>,
}

impl Latency {
    pub fn new(groups: u32) -> Self {
        Latency {
            groups: (0..=groups).map(|_| Default::default()).collect(),
            statuses: (100..600).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Counts a request of `op` in `group` (`None`: of no group) that took `took`.
    pub fn observe(&self, op: Op, group: Option<u32>, took: Duration) {
        let last = self.groups.len() - 1;
        let g = group.map_or(last, |g| (g as usize).min(last));
        if let Some(h) = self.groups.get(g) {
            h[op as usize].observe(u64::try_from(took.as_micros()).unwrap_or(u64::MAX));
        }
    }

    /// Counts an answer.
    pub fn answered(&self, status: StatusCode) {
        if let Some(c) = self
            .statuses
            .get(usize::from(status.as_u16()).wrapping_sub(100))
        {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The node's histogram of `op`: every group's added up.
    pub fn node(&self, op: Op) -> Summary {
        let mut s = Summary::default();
        for g in &self.groups {
            g[op as usize].add_to(&mut s);
        }
        s
    }

    fn group(&self, g: usize, op: Op) -> Summary {
        let mut s = Summary::default();
        if let Some(h) = self.groups.get(g) {
            h[op as usize].add_to(&mut s);
        }
        s
    }

    fn statuses(&self) -> impl Iterator<Item = (u16, u64)> + '_ {
        self.statuses
            .iter()
            .zip(100u16..)
            .filter_map(|(c, status)| {
                let n = c.load(Ordering::Relaxed);
                (n > 0).then_some((status, n))
            })
    }

    /// `request_latency` (the node's, by operation), `request_latency_by_group` (groups that
    /// timed a request) and `http_responses` (by status) for `/__ursula/metrics`.
    pub fn json(&self) -> [(&'static str, Value); 3] {
        let node: Map<String, Value> = Op::ALL
            .iter()
            .map(|op| (op.name().to_owned(), self.node(*op).json()))
            .collect();
        let groups: Vec<Value> = (0..self.groups.len() - 1)
            .filter_map(|g| {
                let ops: Vec<(Op, Summary)> =
                    Op::ALL.iter().map(|op| (*op, self.group(g, *op))).collect();
                if ops.iter().all(|(_, s)| s.count() == 0) {
                    return None;
                }
                let mut m = Map::new();
                m.insert("group".to_owned(), g.into());
                for (op, s) in ops {
                    m.insert(op.name().to_owned(), s.json());
                }
                Some(Value::Object(m))
            })
            .collect();
        let statuses: Map<String, Value> = self
            .statuses()
            .map(|(s, n)| (s.to_string(), n.into()))
            .collect();
        [
            ("request_latency", Value::Object(node)),
            ("request_latency_by_group", Value::Array(groups)),
            ("http_responses", Value::Object(statuses)),
        ]
    }

    /// The node's histograms and the answers by status, in Prometheus text format.
    pub fn prometheus(&self) -> String {
        let mut out = String::new();
        let name = "ursula_request_duration_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} time from a request's head to its answer's head, by operation \
             (live reads are not timed)\n# TYPE {name} histogram"
        );
        for op in Op::ALL {
            let s = self.node(op);
            let op = op.name();
            let mut seen = 0;
            for (i, n) in s.buckets.iter().enumerate() {
                seen += n;
                let le = BOUNDS_US
                    .get(i)
                    .map_or("+Inf".to_owned(), |b| format!("{}", *b as f64 / 1e6));
                let _ = writeln!(out, "{name}_bucket{{op=\"{op}\",le=\"{le}\"}} {seen}");
            }
            let sum = s.sum_us as f64 / 1e6;
            let _ = writeln!(out, "{name}_sum{{op=\"{op}\"}} {sum}");
            let _ = writeln!(out, "{name}_count{{op=\"{op}\"}} {seen}");
        }
        let name = "ursula_http_responses_total";
        let _ = writeln!(
            out,
            "# HELP {name} answers by status code\n# TYPE {name} counter"
        );
        for (status, n) in self.statuses() {
            let _ = writeln!(out, "{name}{{status=\"{status}\"}} {n}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn requests_land_in_their_bucket_and_the_node_sums_its_groups() {
        let l = Latency::new(2);
        l.observe(Op::Append, Some(0), us(80));
        l.observe(Op::Append, Some(1), us(100));
        l.observe(Op::Append, Some(1), us(101));
        l.observe(Op::Append, Some(9), us(20_000_000));
        l.observe(Op::Read, None, us(700));
        let a = l.node(Op::Append);
        assert_eq!(a.count(), 4);
        assert_eq!(a.buckets[0], 2, "a bound is inclusive");
        assert_eq!(a.buckets[1], 1);
        assert_eq!(a.buckets[BUCKETS - 1], 1, "above every bound");
        assert_eq!(a.sum_us, 80 + 100 + 101 + 20_000_000);
        assert_eq!(a.quantile_bound_us(0.5), Some(100));
        assert_eq!(a.quantile_bound_us(0.75), Some(250));
        assert_eq!(a.quantile_bound_us(1.0), None);
        assert_eq!(l.node(Op::Read).quantile_bound_us(0.99), Some(1_000));
        assert_eq!(l.node(Op::Mutation).quantile_bound_us(0.5), None);
        // The out-of-range group was counted with the requests of no group.
        assert_eq!(l.group(2, Op::Append).count(), 1);
    }

    #[test]
    fn the_exposition_is_cumulative_and_lists_answers_by_status() {
        let l = Latency::new(1);
        l.observe(Op::Append, Some(0), us(300));
        l.observe(Op::Append, Some(0), us(3_000));
        l.answered(StatusCode::OK);
        l.answered(StatusCode::OK);
        l.answered(StatusCode::NOT_FOUND);
        let text = l.prometheus();
        assert!(
            text.contains(
                "ursula_request_duration_seconds_bucket{op=\"append\",le=\"0.00025\"} 0\n"
            )
        );
        assert!(
            text.contains(
                "ursula_request_duration_seconds_bucket{op=\"append\",le=\"0.0005\"} 1\n"
            )
        );
        assert!(
            text.contains("ursula_request_duration_seconds_bucket{op=\"append\",le=\"0.005\"} 2\n")
        );
        assert!(
            text.contains("ursula_request_duration_seconds_bucket{op=\"append\",le=\"+Inf\"} 2\n")
        );
        assert!(text.contains("ursula_request_duration_seconds_count{op=\"append\"} 2\n"));
        assert!(text.contains("ursula_request_duration_seconds_sum{op=\"append\"} 0.0033\n"));
        assert!(text.contains("ursula_request_duration_seconds_count{op=\"read\"} 0\n"));
        assert!(text.contains("ursula_http_responses_total{status=\"200\"} 2\n"));
        assert!(text.contains("ursula_http_responses_total{status=\"404\"} 1\n"));
        assert!(!text.contains("status=\"500\""));
        let [(_, node), (_, groups), (_, statuses)] = l.json();
        assert_eq!(node["append"]["le_us"]["500"], 1);
        assert_eq!(node["append"]["p99_le_us"], 5_000);
        assert_eq!(groups.as_array().unwrap().len(), 1);
        assert_eq!(groups[0]["group"], 0);
        assert_eq!(statuses["404"], 1);
    }
}
