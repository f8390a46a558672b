//! Per-tenant admission limits (cluster.md §12.7, `--quota-policy`): a request rate per
//! bucket (a token bucket holding one second of its rate, refilled continuously), concurrent
//! live reads per bucket, and a request body cap under the gateway's own. Limits are per
//! gateway process; an absent limit is unlimited.

use serde::Deserialize;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    pub requests_per_sec: Option<f64>,
    pub max_concurrent_live_reads: Option<u64>,
    pub max_request_body_bytes: Option<u64>,
}

impl Limits {
    /// `self`, with `default`'s limits where it sets none.
    fn over(self, default: Limits) -> Limits {
        Limits {
            requests_per_sec: self.requests_per_sec.or(default.requests_per_sec),
            max_concurrent_live_reads: self
                .max_concurrent_live_reads
                .or(default.max_concurrent_live_reads),
            max_request_body_bytes: self
                .max_request_body_bytes
                .or(default.max_request_body_bytes),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    default: Limits,
    #[serde(default)]
    bucket: Vec<BucketLimits>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BucketLimits {
    id: String,
    requests_per_sec: Option<f64>,
    max_concurrent_live_reads: Option<u64>,
    max_request_body_bytes: Option<u64>,
}

/// Why a request was not admitted.
#[derive(Debug, PartialEq)]
pub enum Over {
    /// `429 RATE_LIMITED`, with `Retry-After` in whole seconds.
    Rate { retry_after_s: u64 },
    /// `429 LIVE_READS_EXHAUSTED`.
    LiveReads,
}

struct Tokens {
    tokens: f64,
    at: Instant,
}

/// Buckets idle this long lose their token state (a full bucket is what they would have).
const PRUNE_AFTER_S: f64 = 60.0;

pub struct Quotas {
    default: Limits,
    buckets: HashMap<String, Limits>,
    tokens: Mutex<HashMap<String, Tokens>>,
    live: Mutex<HashMap<String, Arc<AtomicU64>>>,
}

/// A live-read slot, given back when dropped (the answer ended or the client went away).
pub struct Slot(Arc<AtomicU64>);

/// An answer's body that holds a live-read slot until it ends or is dropped.
pub struct Held {
    pub body: crate::answer::Body,
    /// Held for its `Drop`.
    pub _slot: Slot,
}

impl http_body::Body for Held {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, hyper::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Quotas {
    pub fn load(path: &Path) -> Result<Quotas, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the quota policy {}: {e}", path.display()))?;
        Quotas::parse(&text).map_err(|e| format!("quota policy {}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Quotas, String> {
        let file: File = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut seen = HashSet::new();
        let mut buckets = HashMap::new();
        for b in file.bucket {
            if b.id.trim().is_empty() || !seen.insert(b.id.clone()) {
                return Err(format!("bucket id {:?} is empty or listed twice", b.id));
            }
            let limits = Limits {
                requests_per_sec: b.requests_per_sec,
                max_concurrent_live_reads: b.max_concurrent_live_reads,
                max_request_body_bytes: b.max_request_body_bytes,
            };
            buckets.insert(b.id, limits.over(file.default));
        }
        for l in buckets.values().chain([&file.default]) {
            if l.requests_per_sec
                .is_some_and(|r| !(r > 0.0 && r.is_finite()))
            {
                return Err("requests_per_sec must be a positive number".to_owned());
            }
        }
        Ok(Quotas {
            default: file.default,
            buckets,
            tokens: Mutex::default(),
            live: Mutex::default(),
        })
    }

    pub fn limits(&self, bucket: &str) -> Limits {
        self.buckets.get(bucket).copied().unwrap_or(self.default)
    }

    /// Takes a token of `bucket`'s rate at `now`, or says how long until one is there.
    pub fn take(&self, bucket: &str, now: Instant) -> Result<(), Over> {
        let Some(rate) = self.limits(bucket).requests_per_sec else {
            return Ok(());
        };
        let mut all = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        if all.len() > 1024 {
            all.retain(|_, t| now.duration_since(t.at).as_secs_f64() < PRUNE_AFTER_S);
        }
        let t = all.entry(bucket.to_owned()).or_insert(Tokens {
            tokens: rate,
            at: now,
        });
        let elapsed = now.duration_since(t.at).as_secs_f64();
        t.tokens = (t.tokens + elapsed * rate).min(rate);
        t.at = now;
        if t.tokens >= 1.0 {
            t.tokens -= 1.0;
            return Ok(());
        }
        let wait = ((1.0 - t.tokens) / rate).ceil().max(1.0);
        Err(Over::Rate {
            retry_after_s: wait as u64,
        })
    }

    /// A live-read slot of `bucket`, if one is free.
    pub fn live_read(&self, bucket: &str) -> Result<Option<Slot>, Over> {
        let Some(max) = self.limits(bucket).max_concurrent_live_reads else {
            return Ok(None);
        };
        let counter = {
            let mut all = self.live.lock().unwrap_or_else(|e| e.into_inner());
            Arc::clone(all.entry(bucket.to_owned()).or_default())
        };
        counter
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .map(|_| Some(Slot(counter)))
            .map_err(|_| Over::LiveReads)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const POLICY: &str = r#"
[default]
requests_per_sec = 100

[[bucket]]
id = "tenant-a"
requests_per_sec = 2
max_concurrent_live_reads = 1
max_request_body_bytes = 1048576
"#;

    #[test]
    fn a_bucket_spends_one_second_of_its_rate_then_waits_for_tokens() {
        let q = Quotas::parse(POLICY).unwrap_or_else(|e| panic!("{e}"));
        let t0 = Instant::now();
        assert_eq!(q.take("tenant-a", t0), Ok(()));
        assert_eq!(q.take("tenant-a", t0), Ok(()));
        assert_eq!(q.take("tenant-a", t0), Err(Over::Rate { retry_after_s: 1 }));
        // Half a second refills one token at 2/s.
        assert_eq!(q.take("tenant-a", t0 + Duration::from_millis(500)), Ok(()));
        // Others use the default.
        for _ in 0..100 {
            assert_eq!(q.take("tenant-b", t0), Ok(()));
        }
        assert!(q.take("tenant-b", t0).is_err());
        assert_eq!(q.limits("tenant-b").max_request_body_bytes, None);
        assert_eq!(q.limits("tenant-a").max_request_body_bytes, Some(1 << 20));
    }

    #[test]
    fn live_reads_hold_their_slot_until_dropped() {
        let q = Quotas::parse(POLICY).unwrap_or_else(|e| panic!("{e}"));
        let slot = q.live_read("tenant-a");
        assert!(matches!(slot, Ok(Some(_))));
        assert!(matches!(q.live_read("tenant-a"), Err(Over::LiveReads)));
        drop(slot);
        assert!(matches!(q.live_read("tenant-a"), Ok(Some(_))));
        assert!(matches!(q.live_read("tenant-b"), Ok(None)), "no limit");
    }

    #[test]
    fn a_malformed_quota_policy_is_refused() {
        for bad in [
            "[default]\nbogus = 1\n",
            "[[bucket]]\nid = \"a\"\n[[bucket]]\nid = \"a\"\n",
            "[[bucket]]\nid = \"\"\n",
            "[default]\nrequests_per_sec = 0\n",
            "[[bucket]]\nid = \"a\"\nbogus = 1\n",
        ] {
            assert!(Quotas::parse(bad).is_err(), "{bad}");
        }
    }
}
