//! Latency histogram, percentiles, error counters and medians.
//!
//! The histogram is log-linear: values below 2^SUB_BITS are stored exactly,
//! larger values land in one of 2^SUB_BITS linear sub-buckets per power of two,
//! so the relative error is at most 1/2^SUB_BITS (about 1.6%). Recording is
//! allocation-free; one histogram per connection task, merged at the end.

use std::collections::BTreeMap;

use serde::Serialize;

const SUB_BITS: u32 = 6;
const SUB: u64 = 1 << SUB_BITS;
/// Enough buckets for any u64 value.
const BUCKETS: usize = ((64 - SUB_BITS as usize) + 1) * SUB as usize;

#[derive(Clone, Debug)]
pub struct Histogram {
    counts: Box<[u64]>,
    count: u64,
    min: u64,
    max: u64,
    sum: u128,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

/// Index of the bucket holding `v`.
fn bucket_of(v: u64) -> usize {
    if v < SUB {
        return v as usize;
    }
    let exp = 63 - v.leading_zeros(); // floor(log2 v) >= SUB_BITS
    let shift = exp - SUB_BITS;
    let mantissa = v >> shift; // in [SUB, 2*SUB)
    ((shift as u64 + 1) * SUB + (mantissa - SUB)) as usize
}

/// Largest value that maps to bucket `idx`.
fn bucket_high(idx: usize) -> u64 {
    let idx = idx as u64;
    if idx < SUB {
        return idx;
    }
    let shift = idx / SUB - 1;
    let mantissa = SUB + idx % SUB;
    let low = mantissa << shift;
    low.saturating_add((1u64 << shift) - 1)
}

impl Histogram {
    pub fn new() -> Self {
        Self {
            counts: vec![0; BUCKETS].into_boxed_slice(),
            count: 0,
            min: u64::MAX,
            max: 0,
            sum: 0,
        }
    }

    pub fn record(&mut self, v: u64) {
        self.counts[bucket_of(v)] += 1;
        self.count += 1;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
        self.sum += u128::from(v);
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += *b;
        }
        self.count += other.count;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
        self.sum += other.sum;
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn max(&self) -> u64 {
        if self.count == 0 { 0 } else { self.max }
    }

    pub fn min(&self) -> u64 {
        if self.count == 0 { 0 } else { self.min }
    }

    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum as f64 / self.count as f64
        }
    }

    /// Nearest-rank percentile (`p` in 0..=100): the smallest recorded value
    /// such that at least p% of samples are <= it, within bucket precision,
    /// clamped to the exact min and max.
    pub fn percentile(&self, p: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let p = p.clamp(0.0, 100.0);
        let rank = ((p / 100.0) * self.count as f64).ceil().max(1.0) as u64;
        let mut seen = 0u64;
        for (idx, c) in self.counts.iter().enumerate() {
            seen += *c;
            if seen >= rank {
                return bucket_high(idx).clamp(self.min, self.max);
            }
        }
        self.max
    }

    /// Summary in microseconds, assuming samples were recorded in nanoseconds.
    pub fn latency_us(&self) -> Latency {
        let us = |ns: u64| ns as f64 / 1000.0;
        Latency {
            count: self.count(),
            min_us: us(self.min()),
            p50_us: us(self.percentile(50.0)),
            p90_us: us(self.percentile(90.0)),
            p99_us: us(self.percentile(99.0)),
            max_us: us(self.max()),
            mean_us: self.mean() / 1000.0,
        }
    }
}

/// Latency summary as printed in reports.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Latency {
    pub count: u64,
    pub min_us: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
}

/// Errors by kind: HTTP status code ("409") or a transport error name ("io").
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
#[serde(transparent)]
pub struct Errors(pub BTreeMap<String, u64>);

impl Errors {
    pub fn add(&mut self, kind: &str) {
        self.add_n(kind, 1);
    }

    pub fn add_n(&mut self, kind: &str, n: u64) {
        if n == 0 {
            return;
        }
        match self.0.get_mut(kind) {
            Some(v) => *v += n,
            None => {
                self.0.insert(kind.to_owned(), n);
            }
        }
    }

    pub fn status(&mut self, status: http::StatusCode) {
        self.add(status.as_str());
    }

    pub fn merge(&mut self, other: &Errors) {
        for (k, v) in &other.0 {
            self.add_n(k, *v);
        }
    }

    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }

    pub fn is_empty(&self) -> bool {
        self.total() == 0
    }

    /// "409:3 io:1" for the human table.
    pub fn summary(&self) -> String {
        if self.is_empty() {
            return "none".to_owned();
        }
        self.0
            .iter()
            .map(|(k, v)| format!("{k}:{v}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Median of the values (mean of the two middle ones for even counts).
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_values_are_exact() {
        let mut h = Histogram::new();
        for v in 1..=100u64 {
            h.record(v);
        }
        assert_eq!(h.count(), 100);
        assert_eq!(h.percentile(50.0), 50);
        assert_eq!(h.percentile(99.0), 99);
        assert_eq!(h.percentile(100.0), 100);
        assert_eq!(h.percentile(0.0), 1);
        assert_eq!(h.min(), 1);
        assert_eq!(h.max(), 100);
        assert!((h.mean() - 50.5).abs() < 1e-9);
    }

    #[test]
    fn nearest_rank_definition() {
        let mut h = Histogram::new();
        for v in [10u64, 20, 30, 40] {
            h.record(v);
        }
        // rank = ceil(0.5 * 4) = 2 -> 20; ceil(0.51 * 4) = 3 -> 30.
        assert_eq!(h.percentile(50.0), 20);
        assert_eq!(h.percentile(51.0), 30);
        assert_eq!(h.percentile(90.0), 40);
    }

    #[test]
    fn bucket_mapping_is_monotonic_and_covers_value() {
        let mut prev = 0usize;
        let mut v = 0u64;
        while v < 1 << 40 {
            let b = bucket_of(v);
            assert!(b >= prev, "non-monotonic at {v}");
            assert!(bucket_high(b) >= v, "bucket {b} high below {v}");
            if b > 0 {
                assert!(bucket_high(b - 1) < v, "value {v} belongs lower than {b}");
            }
            prev = b;
            v = v + 1 + v / 7;
        }
        assert!(bucket_of(u64::MAX) < BUCKETS);
        assert_eq!(bucket_high(bucket_of(u64::MAX)), u64::MAX);
    }

    #[test]
    fn large_values_within_relative_error() {
        let mut h = Histogram::new();
        let values: Vec<u64> = (1..=10_000u64).map(|i| i * 997_331).collect();
        for v in &values {
            h.record(*v);
        }
        for p in [50.0, 90.0, 99.0, 99.9] {
            let rank = ((p / 100.0) * values.len() as f64).ceil() as usize;
            let exact = values[rank - 1] as f64;
            let got = h.percentile(p) as f64;
            let err = (got - exact).abs() / exact;
            assert!(err <= 1.0 / SUB as f64, "p{p}: got {got}, exact {exact}");
        }
        assert_eq!(h.max(), 10_000 * 997_331);
    }

    #[test]
    fn merge_equals_recording_everything_once() {
        let mut a = Histogram::new();
        let mut b = Histogram::new();
        let mut all = Histogram::new();
        for v in 0..5_000u64 {
            let x = v * v % 1_000_003;
            if v % 2 == 0 {
                a.record(x)
            } else {
                b.record(x)
            }
            all.record(x);
        }
        a.merge(&b);
        assert_eq!(a.count(), all.count());
        for p in [1.0, 50.0, 90.0, 99.0, 100.0] {
            assert_eq!(a.percentile(p), all.percentile(p));
        }
        assert_eq!(a.min(), all.min());
        assert_eq!(a.max(), all.max());
    }

    #[test]
    fn empty_histogram_reports_zero() {
        let h = Histogram::new();
        assert_eq!(h.percentile(99.0), 0);
        assert_eq!(h.max(), 0);
        assert_eq!(h.latency_us(), Latency::default());
    }

    #[test]
    fn latency_summary_in_microseconds() {
        let mut h = Histogram::new();
        h.record(1_000);
        h.record(3_000);
        let l = h.latency_us();
        assert_eq!(l.count, 2);
        assert!((l.mean_us - 2.0).abs() < 1e-9);
        assert!((l.max_us - 3.0).abs() < 1e-9);
    }

    #[test]
    fn errors_count_and_merge() {
        let mut e = Errors::default();
        assert_eq!(e.summary(), "none");
        e.status(http::StatusCode::CONFLICT);
        e.add("io");
        e.add("io");
        let mut f = Errors::default();
        f.add_n("409", 2);
        f.add_n("ignored", 0);
        e.merge(&f);
        assert_eq!(e.total(), 5);
        assert_eq!(e.summary(), "409:3 io:2");
        assert_eq!(
            serde_json::to_string(&e).ok().as_deref(),
            Some(r#"{"409":3,"io":2}"#)
        );
    }

    #[test]
    fn median_odd_even_and_empty() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN, 5.0]), Some(5.0));
    }
}
