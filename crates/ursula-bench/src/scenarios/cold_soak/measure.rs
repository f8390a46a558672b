//! What the soak measures besides its own requests: the server's RSS, its data dir, its metrics.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::client::Conn;
use crate::procfs::rss_kib;
use crate::target::path_uri;

/// Peak VmRSS of the server, per phase, sampled by a background task.
pub(super) struct RssSampler {
    pub(super) pid: u32,
    pub(super) phase_peak: Arc<AtomicU64>,
    pub(super) last: Arc<AtomicU64>,
    pub(super) samples: Arc<AtomicU64>,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) task: tokio::task::JoinHandle<()>,
}

impl RssSampler {
    pub(super) fn start(pid: u32, interval: Duration) -> Result<Self> {
        let first = rss_kib(pid).with_context(|| format!("server pid {pid}"))?;
        let phase_peak = Arc::new(AtomicU64::new(first));
        let last = Arc::new(AtomicU64::new(first));
        let samples = Arc::new(AtomicU64::new(1));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, l, n, s) = (
            phase_peak.clone(),
            last.clone(),
            samples.clone(),
            stop.clone(),
        );
        let task = tokio::spawn(async move {
            while !s.load(Ordering::Relaxed) {
                tokio::time::sleep(interval).await;
                if let Ok(kib) = rss_kib(pid) {
                    p.fetch_max(kib, Ordering::Relaxed);
                    l.store(kib, Ordering::Relaxed);
                    n.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        Ok(Self {
            pid,
            phase_peak,
            last,
            samples,
            stop,
            task,
        })
    }

    /// The peak since the previous call (or the start), then a fresh phase.
    pub(super) fn end_phase(&self) -> u64 {
        let now = rss_kib(self.pid).unwrap_or(0);
        self.last.store(now, Ordering::Relaxed);
        self.phase_peak.fetch_max(now, Ordering::Relaxed);
        self.phase_peak.swap(now, Ordering::Relaxed)
    }

    pub(super) fn last(&self) -> u64 {
        self.last.load(Ordering::Relaxed)
    }

    pub(super) fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.task.abort();
        self.samples.load(Ordering::Relaxed)
    }
}

#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct DirSize {
    /// Allocated bytes (st_blocks * 512), what `du` counts.
    pub wal_bytes: u64,
    pub cold_bytes: u64,
    /// Everything else in the data dir (snapshots, node.toml, ...).
    pub other_bytes: u64,
    pub total_bytes: u64,
    /// Apparent sizes (file lengths), for comparison.
    pub wal_apparent_bytes: u64,
    pub cold_apparent_bytes: u64,
    pub other_apparent_bytes: u64,
    pub cold_files: u64,
}

pub(super) fn walk(dir: &Path, depth: usize, f: &mut impl FnMut(&std::fs::Metadata)) {
    if depth > 16 {
        return;
    }
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        // Files vanish under us (segment GC, flushes): skip what cannot be read.
        let Ok(md) = e.metadata() else { continue };
        if md.is_dir() {
            walk(&e.path(), depth + 1, f);
        } else if md.is_file() {
            f(&md);
        }
    }
}

pub fn dir_size(data_dir: &Path) -> DirSize {
    use std::os::unix::fs::MetadataExt;
    let mut d = DirSize::default();
    let Ok(rd) = std::fs::read_dir(data_dir) else {
        return d;
    };
    for e in rd.flatten() {
        let name = e.file_name();
        let kind = match name.to_str() {
            Some("wal") => 0,
            Some("cold") => 1,
            _ => 2,
        };
        let mut alloc = 0u64;
        let mut apparent = 0u64;
        let mut files = 0u64;
        let mut add = |md: &std::fs::Metadata| {
            alloc += md.blocks() * 512;
            apparent += md.len();
            files += 1;
        };
        match e.metadata() {
            Ok(md) if md.is_dir() => walk(&e.path(), 0, &mut add),
            Ok(md) if md.is_file() => add(&md),
            _ => {}
        }
        match kind {
            0 => {
                d.wal_bytes += alloc;
                d.wal_apparent_bytes += apparent;
            }
            1 => {
                d.cold_bytes += alloc;
                d.cold_apparent_bytes += apparent;
                d.cold_files += files;
            }
            _ => {
                d.other_bytes += alloc;
                d.other_apparent_bytes += apparent;
            }
        }
    }
    d.total_bytes = d.wal_bytes + d.cold_bytes + d.other_bytes;
    d
}

/// `GET /__ursula/metrics` as name -> value (JSON object or Prometheus text); None when the
/// server has no such route (the reference server, the floor).
pub async fn fetch_metrics(conn: &mut Conn) -> Option<BTreeMap<String, u64>> {
    let ep = conn.endpoint().clone();
    let uri = path_uri(&format!("{}/__ursula/metrics", ep.target.prefix)).ok()?;
    let (parts, body) = tokio::time::timeout(
        Duration::from_secs(10),
        conn.send_collect(|| ep.get(uri.clone())),
    )
    .await
    .ok()?
    .ok()?;
    if !parts.status.is_success() {
        return None;
    }
    parse_metrics(&body)
}

pub fn parse_metrics(body: &[u8]) -> Option<BTreeMap<String, u64>> {
    let text = std::str::from_utf8(body).ok()?;
    let mut out = BTreeMap::new();
    if text.trim_start().starts_with('{') {
        let v: serde_json::Value = serde_json::from_str(text).ok()?;
        for (k, v) in v.as_object()? {
            if let Some(n) = v.as_u64() {
                out.insert(k.trim_start_matches("ursula_").to_owned(), n);
            }
        }
    } else {
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let mut it = line.split_whitespace();
            if let (Some(k), Some(v)) = (it.next(), it.next())
                && let Ok(n) = v.parse::<f64>()
                && n >= 0.0
            {
                out.insert(k.trim_start_matches("ursula_").to_owned(), n as u64);
            }
        }
    }
    (!out.is_empty()).then_some(out)
}

/// The metrics worth reporting here.
pub(super) fn tier_metrics(m: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    m.iter()
        .filter(|(k, _)| k.starts_with("hot_") || k.starts_with("cold_") || k.starts_with("wal_"))
        .map(|(k, v)| (k.clone(), *v))
        .collect()
}
