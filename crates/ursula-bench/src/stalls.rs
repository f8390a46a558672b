//! Stalls: the requests slower than a threshold (`append --slow-over`), grouped into bursts.
//!
//! A tail percentile says how many requests were slow, not why. Slow requests whose
//! lifetimes overlap waited on the same thing (a sync the disk held back, a flush, a pause
//! of the server), so they are merged into one burst; the bursts' times and spacing point at
//! the cause (a burst every 100 ms is a disk throttle, every second a periodic task).

use serde::Serialize;

/// One slow request: when it started, in µs from the start of the measurement, and how long
/// it took.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Slow {
    pub start_us: u64,
    pub latency_us: u64,
}

/// Slow requests whose lifetimes overlap.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Burst {
    /// First start, in ms from the start of the measurement.
    pub at_ms: f64,
    /// From the first start to the last finish.
    pub span_ms: f64,
    pub requests: u64,
    pub longest_ms: f64,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Stalls {
    pub threshold_ms: f64,
    pub slow: u64,
    pub bursts: u64,
    /// The bursts with the most requests, in time order (at most [`SHOWN`]).
    pub largest: Vec<Burst>,
}

/// Bursts listed in a report.
pub const SHOWN: usize = 8;

impl Stalls {
    pub fn from_slow(threshold_us: u64, mut slow: Vec<Slow>) -> Stalls {
        slow.sort_unstable();
        let mut bursts: Vec<Burst> = Vec::new();
        let (mut first_us, mut end_us) = (0u64, 0u64);
        for s in &slow {
            let finish = s.start_us + s.latency_us;
            match bursts.last_mut() {
                Some(b) if s.start_us <= end_us => {
                    end_us = end_us.max(finish);
                    b.span_ms = (end_us - first_us) as f64 / 1e3;
                    b.requests += 1;
                    b.longest_ms = b.longest_ms.max(s.latency_us as f64 / 1e3);
                }
                _ => {
                    (first_us, end_us) = (s.start_us, finish);
                    bursts.push(Burst {
                        at_ms: s.start_us as f64 / 1e3,
                        span_ms: s.latency_us as f64 / 1e3,
                        requests: 1,
                        longest_ms: s.latency_us as f64 / 1e3,
                    });
                }
            }
        }
        let count = bursts.len() as u64;
        bursts.sort_by(|a, b| {
            b.requests
                .cmp(&a.requests)
                .then(b.longest_ms.total_cmp(&a.longest_ms))
        });
        bursts.truncate(SHOWN);
        bursts.sort_by(|a, b| a.at_ms.total_cmp(&b.at_ms));
        Stalls {
            threshold_ms: threshold_us as f64 / 1e3,
            slow: slow.len() as u64,
            bursts: count,
            largest: bursts,
        }
    }

    /// A summary line, then one line per listed burst, for the text report.
    pub fn lines(&self) -> Vec<String> {
        let mut v = vec![format!(
            "{} over {} ms in {} bursts",
            self.slow, self.threshold_ms, self.bursts
        )];
        v.extend(self.largest.iter().map(|b| {
            format!(
                "at {:.1} ms: {} requests over {:.1} ms, longest {:.1} ms",
                b.at_ms, b.requests, b.span_ms, b.longest_ms
            )
        }));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slow(start_us: u64, latency_us: u64) -> Slow {
        Slow {
            start_us,
            latency_us,
        }
    }

    #[test]
    fn overlapping_slow_requests_form_one_burst() {
        // Two stalls: three requests caught by one at 10 ms, two by another at 500 ms.
        let s = Stalls::from_slow(
            2_000,
            vec![
                slow(500_000, 3_000),
                slow(10_000, 5_000),
                slow(11_000, 4_500),
                slow(14_000, 2_500),
                slow(501_000, 2_500),
            ],
        );
        assert_eq!(s.slow, 5);
        assert_eq!(s.bursts, 2);
        assert_eq!(s.largest.len(), 2);
        let first = &s.largest[0];
        assert_eq!(first.requests, 3);
        assert_eq!(first.at_ms, 10.0);
        assert_eq!(first.span_ms, 6.5);
        assert_eq!(first.longest_ms, 5.0);
        assert_eq!(s.largest[1].requests, 2);
        assert_eq!(s.largest[1].at_ms, 500.0);
    }

    #[test]
    fn the_largest_bursts_are_listed_in_time_order() {
        // Twenty separate slow requests, and one burst of three at the end.
        let mut v: Vec<Slow> = (0..20).map(|i| slow(i * 100_000, 2_500)).collect();
        v.extend([
            slow(5_000_000, 3_000),
            slow(5_000_100, 3_000),
            slow(5_000_200, 3_000),
        ]);
        let s = Stalls::from_slow(2_000, v);
        assert_eq!(s.bursts, 21);
        assert_eq!(s.largest.len(), SHOWN);
        assert!(s.largest.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
        assert_eq!(s.largest.last().map(|b| b.requests), Some(3));
        assert_eq!(s.lines()[0], "23 over 2 ms in 21 bursts");
        assert_eq!(s.lines().len(), SHOWN + 1);
    }
}
