//! `cold-soak`: more data than the hot tier holds, appended, measured and read back exact.
//!
//! Appends `total_bytes` over S `application/octet-stream` streams in `append_size` bodies
//! (C connections; connection c owns streams c, c + C, ... and appends to them round-robin,
//! so each stream's appends are sequential). Every append goes through an idempotent
//! producer (one per stream), so a retry after a transport error cannot duplicate bytes;
//! `503 COLD_BACKPRESSURE` answers are counted and retried after their `Retry-After`.
//! Stream bytes follow a deterministic per-stream pattern (`Pattern`), so nothing is kept
//! in the generator: the read-back regenerates what each position must hold.
//!
//! With `--server-pid` the server's VmRSS is sampled throughout (peak per phase); with
//! `--data-dir` the directory is measured (wal/, cold/, the rest) after waiting, bounded,
//! for the WAL to stop shrinking. `--run ID` skips the appends and only reads back the
//! streams an earlier run `ID` wrote (same --streams and --total-bytes): what
//! scripts/cold-soak.sh does after a SIGKILL and restart.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http::{HeaderValue, Method, StatusCode};
use http_body_util::BodyExt;
use serde::Serialize;

use super::{check_positive, create_streams, run_id, stream_names};
use crate::cli::ColdSoakArgs;
use crate::client::{
    Conn, Endpoint, OCTET_STREAM, PRODUCER_EPOCH, PRODUCER_ID, PRODUCER_SEQ, STREAM_NEXT_OFFSET,
    error_kind, header_str, up_to_date,
};
use crate::procfs::rss_kib;
use crate::report::{Header, fmt_num, kv_table, note};
use crate::stats::Errors;
use crate::target::{path_uri, valid_offset};

const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Safety net against a server that never says up-to-date (pages per stream).
const MAX_PAGES: usize = 1_000_000;
/// Longest Retry-After honoured.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(10);
const MIB: f64 = 1024.0 * 1024.0;

/// The bytes of one stream: position p holds byte p % 8 (little-endian) of
/// splitmix64(seed + p / 8), with the seed derived from the stream's name.
#[derive(Clone, Copy, Debug)]
pub struct Pattern {
    seed: u64,
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Pattern {
    pub fn for_stream(name: &str) -> Self {
        // FNV-1a of the name, then mixed.
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for b in name.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        Self {
            seed: splitmix64(h),
        }
    }

    fn word(&self, w: u64) -> [u8; 8] {
        splitmix64(
            self.seed
                .wrapping_add(w.wrapping_mul(0x2545_f491_4f6c_dd1d)),
        )
        .to_le_bytes()
    }

    /// Fill `out` with the stream's bytes from position `start`.
    pub fn fill(&self, start: u64, out: &mut [u8]) {
        let mut pos = start;
        let mut i = 0usize;
        // Unaligned head.
        while i < out.len() && !pos.is_multiple_of(8) {
            out[i] = self.word(pos / 8)[(pos % 8) as usize];
            i += 1;
            pos += 1;
        }
        let mut chunks = out[i..].chunks_exact_mut(8);
        let mut w = pos / 8;
        for c in &mut chunks {
            c.copy_from_slice(&self.word(w));
            w += 1;
        }
        let tail = chunks.into_remainder();
        if !tail.is_empty() {
            let word = self.word(w);
            tail.copy_from_slice(&word[..tail.len()]);
        }
    }

    pub fn bytes(&self, start: u64, len: usize) -> Bytes {
        let mut v = vec![0u8; len];
        self.fill(start, &mut v);
        Bytes::from(v)
    }

    /// Position (relative to `start`) of the first byte of `got` that differs, if any.
    pub fn first_mismatch(&self, start: u64, got: &[u8], scratch: &mut Vec<u8>) -> Option<u64> {
        scratch.resize(got.len(), 0);
        self.fill(start, scratch);
        if scratch.as_slice() == got {
            return None;
        }
        got.iter()
            .zip(scratch.iter())
            .position(|(a, b)| a != b)
            .map(|p| p as u64)
    }
}

/// Bytes stream `i` of `streams` holds when `total` are spread over them.
pub fn stream_len(total: u64, streams: usize, i: usize) -> u64 {
    let s = streams as u64;
    total / s + u64::from((i as u64) < total % s)
}

/// Peak VmRSS of the server, per phase, sampled by a background task.
struct RssSampler {
    pid: u32,
    phase_peak: Arc<AtomicU64>,
    last: Arc<AtomicU64>,
    samples: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl RssSampler {
    fn start(pid: u32, interval: Duration) -> Result<Self> {
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
    fn end_phase(&self) -> u64 {
        let now = rss_kib(self.pid).unwrap_or(0);
        self.last.store(now, Ordering::Relaxed);
        self.phase_peak.fetch_max(now, Ordering::Relaxed);
        self.phase_peak.swap(now, Ordering::Relaxed)
    }

    fn last(&self) -> u64 {
        self.last.load(Ordering::Relaxed)
    }

    fn finish(self) -> u64 {
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

fn walk(dir: &Path, depth: usize, f: &mut impl FnMut(&std::fs::Metadata)) {
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
    let (parts, body) =
        tokio::time::timeout(Duration::from_secs(10), conn.send_collect(ep.get(uri)))
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
fn tier_metrics(m: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    m.iter()
        .filter(|(k, _)| k.starts_with("hot_") || k.starts_with("cold_") || k.starts_with("wal_"))
        .map(|(k, v)| (k.clone(), *v))
        .collect()
}

#[derive(Debug, Serialize)]
pub struct ColdSoakReport {
    #[serde(flatten)]
    pub header: Header,
    /// Run id: `--run` this to read the same streams back later.
    pub run: String,
    pub verify_only: bool,
    pub streams: usize,
    pub total_bytes: u64,
    pub append_size: usize,
    pub connections: usize,
    pub appends: u64,
    pub append_s: f64,
    pub append_mb_per_s: f64,
    /// `503 COLD_BACKPRESSURE` answers, each retried after its Retry-After.
    pub backpressure: u64,
    /// Retries after transport errors or other 503s (the producer makes them safe).
    pub retries: u64,
    pub rss_start_kib: Option<u64>,
    pub rss_peak_append_kib: Option<u64>,
    pub rss_after_append_kib: Option<u64>,
    pub rss_peak_read_kib: Option<u64>,
    pub rss_peak_kib: Option<u64>,
    pub rss_samples: u64,
    /// Seconds waited for the WAL to stop shrinking, and whether it did within the bound.
    pub purge_wait_s: f64,
    pub purge_settled: bool,
    pub dir_after_append: Option<DirSize>,
    pub dir_settled: Option<DirSize>,
    /// dir_settled.total_bytes / total_bytes.
    pub dir_ratio: Option<f64>,
    pub read_bytes: u64,
    pub read_gets: u64,
    pub read_s: f64,
    pub read_mb_per_s: f64,
    /// Streams whose bytes differ from the pattern or whose length is not what was appended.
    pub mismatched_streams: u64,
    pub short_streams: u64,
    pub verified: bool,
    pub metrics_after_append: Option<BTreeMap<String, u64>>,
    pub metrics_before_read: Option<BTreeMap<String, u64>>,
    pub metrics_after_read: Option<BTreeMap<String, u64>>,
    pub errors: Errors,
}

fn mib(kib: Option<u64>) -> String {
    kib.map_or_else(
        || "-".to_owned(),
        |k| format!("{:.1} MiB", k as f64 / 1024.0),
    )
}

impl ColdSoakReport {
    pub fn table(&self) -> String {
        let dir = |d: &Option<DirSize>| {
            d.map_or_else(
                || "-".to_owned(),
                |d| {
                    format!(
                        "wal {:.1} MiB, cold {:.1} MiB ({} files), other {:.1} MiB, total {:.1} MiB",
                        d.wal_bytes as f64 / MIB,
                        d.cold_bytes as f64 / MIB,
                        d.cold_files,
                        d.other_bytes as f64 / MIB,
                        d.total_bytes as f64 / MIB
                    )
                },
            )
        };
        let m = |key: &str| {
            self.metrics_before_read
                .as_ref()
                .and_then(|m| m.get(key))
                .map_or_else(|| "-".to_owned(), |v| format!("{:.1} MiB", *v as f64 / MIB))
        };
        kv_table(
            "cold-soak",
            &[
                ("target", self.header.target.clone()),
                (
                    "run",
                    format!(
                        "{}{}",
                        self.run,
                        if self.verify_only {
                            " (read back only)"
                        } else {
                            ""
                        }
                    ),
                ),
                (
                    "shape",
                    format!(
                        "{:.1} MiB over {} streams, {} B appends, {} conns",
                        self.total_bytes as f64 / MIB,
                        self.streams,
                        self.append_size,
                        self.connections
                    ),
                ),
                (
                    "append",
                    format!(
                        "{} appends in {:.1} s, {} MB/s",
                        self.appends,
                        self.append_s,
                        fmt_num(self.append_mb_per_s)
                    ),
                ),
                ("backpressure 503s", self.backpressure.to_string()),
                ("other retries", self.retries.to_string()),
                (
                    "server RSS",
                    format!(
                        "start {}, peak append {}, after append {}, peak read {}, peak {} ({} samples)",
                        mib(self.rss_start_kib),
                        mib(self.rss_peak_append_kib),
                        mib(self.rss_after_append_kib),
                        mib(self.rss_peak_read_kib),
                        mib(self.rss_peak_kib),
                        self.rss_samples
                    ),
                ),
                ("data dir after append", dir(&self.dir_after_append)),
                (
                    "data dir settled",
                    match self.dir_settled {
                        None => "-".to_owned(),
                        Some(_) => format!(
                            "{} after {:.1} s{}",
                            dir(&self.dir_settled),
                            self.purge_wait_s,
                            if self.purge_settled {
                                ""
                            } else {
                                " (still shrinking at the bound)"
                            }
                        ),
                    },
                ),
                (
                    "data dir / bytes held",
                    self.dir_ratio
                        .map_or_else(|| "-".to_owned(), |r| format!("{r:.3}")),
                ),
                (
                    "hot / cold before read",
                    format!("{} / {}", m("hot_bytes"), m("cold_bytes")),
                ),
                (
                    "read back",
                    format!(
                        "{:.1} MiB in {} GETs, {:.1} s, {} MB/s",
                        self.read_bytes as f64 / MIB,
                        self.read_gets,
                        self.read_s,
                        fmt_num(self.read_mb_per_s)
                    ),
                ),
                (
                    "verified",
                    if self.verified {
                        "every byte exact".to_owned()
                    } else {
                        format!(
                            "FAILED: {} streams differ, {} short",
                            self.mismatched_streams, self.short_streams
                        )
                    },
                ),
                ("errors", self.errors.summary()),
            ],
        )
    }

    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if !self.verified {
            p.push(format!(
                "cold-soak: read back not exact ({} streams differ, {} short)",
                self.mismatched_streams, self.short_streams
            ));
        }
        if !self.errors.is_empty() {
            p.push(format!("cold-soak: errors {}", self.errors.summary()));
        }
        p
    }
}

struct Stream {
    uri: http::Uri,
    path: String,
    producer: HeaderValue,
    pattern: Pattern,
    len: u64,
}

#[derive(Default)]
struct AppendResult {
    appends: u64,
    backpressure: u64,
    retries: u64,
}

pub async fn run(ep: Arc<Endpoint>, args: &ColdSoakArgs, quiet: bool) -> Result<ColdSoakReport> {
    check_positive("streams", args.streams)?;
    check_positive("connections", args.connections)?;
    check_positive("append size", args.append_size)?;
    if (args.total_bytes as u64) < args.streams as u64 {
        bail!("total bytes must be at least one per stream");
    }
    let verify_only = args.run.is_some();
    let run = args.run.clone().unwrap_or_else(run_id);
    let names = stream_names("cold", &run, args.streams);
    let total = args.total_bytes as u64;
    let streams: Arc<[Stream]> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            Ok(Stream {
                uri: ep.target.stream_uri(n)?,
                path: ep.target.stream_path(n),
                producer: HeaderValue::try_from(format!("{n}-p"))?,
                pattern: Pattern::for_stream(n),
                len: stream_len(total, args.streams, i),
            })
        })
        .collect::<Result<Vec<_>>>()?
        .into();
    let progress = !quiet;
    let sampler = match args.server_pid {
        Some(pid) => Some(RssSampler::start(pid, args.rss_interval)?),
        None => None,
    };
    let rss_start = sampler.as_ref().map(RssSampler::last);
    let mut errors = Errors::default();
    let mut mconn = Conn::new(ep.clone());

    // Append.
    let mut appended = AppendResult::default();
    let mut append_s = 0.0;
    if !verify_only {
        let uris: Vec<_> = streams.iter().map(|s| s.uri.clone()).collect();
        errors.add_n(
            "create",
            create_streams(&ep, &uris, &OCTET_STREAM, args.connections.min(16)).await?,
        );
        if !errors.is_empty() {
            bail!("creating the streams failed: {}", errors.summary());
        }
        let started = Instant::now();
        let done_bytes = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for c in 0..args.connections.min(args.streams) {
            let (ep, streams, done) = (ep.clone(), streams.clone(), done_bytes.clone());
            let (conns, size, max_attempts) =
                (args.connections, args.append_size, args.max_attempts);
            tasks.push(tokio::spawn(async move {
                append_loop(ep, streams, c, conns, size, max_attempts, done).await
            }));
        }
        // Progress notes until every task is done.
        let reporter = progress.then(|| {
            let done = done_bytes.clone();
            let last = sampler.as_ref().map(|s| s.last.clone());
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(10)).await;
                    let d = done.load(Ordering::Relaxed);
                    let rss = last.as_ref().map(|l| l.load(Ordering::Relaxed));
                    note(&format!(
                        "cold-soak: {:.0} MiB of {:.0} MiB appended ({:.0} s), server RSS {}",
                        d as f64 / MIB,
                        total as f64 / MIB,
                        started.elapsed().as_secs_f64(),
                        mib(rss)
                    ));
                }
            })
        });
        let mut failure = None;
        for t in tasks {
            match t.await? {
                Ok(r) => {
                    appended.appends += r.appends;
                    appended.backpressure += r.backpressure;
                    appended.retries += r.retries;
                }
                Err(e) => failure = Some(e),
            }
        }
        if let Some(r) = reporter {
            r.abort();
        }
        if let Some(e) = failure {
            return Err(e.context("appending"));
        }
        append_s = started.elapsed().as_secs_f64();
    }
    let rss_peak_append = sampler.as_ref().map(RssSampler::end_phase);
    let rss_after_append = sampler.as_ref().map(RssSampler::last);
    let metrics_after_append = fetch_metrics(&mut mconn).await.map(|m| tier_metrics(&m));

    // Data dir: right after the appends, then once the WAL stops shrinking (bounded).
    let dir_after_append = args.data_dir.as_deref().map(dir_size);
    let (mut purge_wait_s, mut purge_settled, mut dir_settled) = (0.0, false, None);
    if let Some(dd) = args.data_dir.as_deref() {
        let started = Instant::now();
        let deadline = started + args.purge_timeout;
        let mut best = dir_size(dd);
        let mut best_at = Instant::now();
        loop {
            if best_at.elapsed() >= args.purge_settle {
                purge_settled = true;
                break;
            }
            if Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            let d = dir_size(dd);
            // "Shrinking" = the WAL lost at least a segment's worth or the hot bytes moved.
            if d.wal_bytes + (1 << 20) <= best.wal_bytes {
                best_at = Instant::now();
            }
            best = d;
        }
        purge_wait_s = started.elapsed().as_secs_f64();
        dir_settled = Some(dir_size(dd));
    }
    if args.data_dir.is_none() && !verify_only {
        let deadline = Instant::now() + args.wait_cold;
        while Instant::now() < deadline {
            match fetch_metrics(&mut mconn).await {
                Some(m) if m.get("cold_bytes").copied().unwrap_or(0) == 0 => {}
                _ => break,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let dir_ratio = dir_settled.map(|d| d.total_bytes as f64 / total as f64);
    let metrics_before_read = fetch_metrics(&mut mconn).await.map(|m| tier_metrics(&m));
    if let Some(s) = &sampler {
        s.end_phase();
    }

    // Read back, verifying every byte.
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..args.connections.min(args.streams) {
        let (ep, streams, conns) = (ep.clone(), streams.clone(), args.connections);
        tasks.push(tokio::spawn(async move {
            read_loop(ep, streams, c, conns).await
        }));
    }
    let (mut read_bytes, mut read_gets, mut mismatched, mut short) = (0u64, 0u64, 0u64, 0u64);
    for t in tasks {
        let r = t.await??;
        read_bytes += r.bytes;
        read_gets += r.gets;
        mismatched += r.mismatched;
        short += r.short;
        errors.merge(&r.errors);
        for m in r.first_problems {
            note(&format!("cold-soak: {m}"));
        }
    }
    let read_s = started.elapsed().as_secs_f64();
    let rss_peak_read = sampler.as_ref().map(RssSampler::end_phase);
    let metrics_after_read = fetch_metrics(&mut mconn).await.map(|m| tier_metrics(&m));
    let rss_samples = sampler.map_or(0, RssSampler::finish);
    let rss_peak = match (rss_peak_append, rss_peak_read) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    let verified = mismatched == 0 && short == 0 && read_bytes == total;
    Ok(ColdSoakReport {
        header: Header::new("cold-soak", &ep.target),
        run,
        verify_only,
        streams: args.streams,
        total_bytes: total,
        append_size: args.append_size,
        connections: args.connections,
        appends: appended.appends,
        append_s,
        append_mb_per_s: if append_s > 0.0 {
            total as f64 / append_s / 1e6
        } else {
            0.0
        },
        backpressure: appended.backpressure,
        retries: appended.retries,
        rss_start_kib: rss_start,
        rss_peak_append_kib: rss_peak_append.filter(|_| !verify_only),
        rss_after_append_kib: rss_after_append,
        rss_peak_read_kib: rss_peak_read,
        rss_peak_kib: rss_peak,
        rss_samples,
        purge_wait_s,
        purge_settled,
        dir_after_append,
        dir_settled,
        dir_ratio,
        read_bytes,
        read_gets,
        read_s,
        read_mb_per_s: if read_s > 0.0 {
            read_bytes as f64 / read_s / 1e6
        } else {
            0.0
        },
        mismatched_streams: mismatched,
        short_streams: short,
        verified,
        metrics_after_append,
        metrics_before_read,
        metrics_after_read,
        errors,
    })
}

fn retry_after(parts: &http::response::Parts) -> Duration {
    header_str(parts, &http::header::RETRY_AFTER)
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(Duration::from_secs(1), Duration::from_secs)
        .min(MAX_RETRY_AFTER)
}

async fn append_loop(
    ep: Arc<Endpoint>,
    streams: Arc<[Stream]>,
    index: usize,
    conns: usize,
    size: usize,
    max_attempts: u32,
    done: Arc<AtomicU64>,
) -> Result<AppendResult> {
    let mine: Vec<usize> = (index..streams.len()).step_by(conns).collect();
    let mut pos = vec![0u64; mine.len()];
    let mut seq = vec![0u64; mine.len()];
    let mut conn = Conn::new(ep.clone());
    let mut r = AppendResult::default();
    let epoch = HeaderValue::from_static("0");
    loop {
        let mut progressed = false;
        for (k, &s) in mine.iter().enumerate() {
            let st = &streams[s];
            if pos[k] >= st.len {
                continue;
            }
            progressed = true;
            let n = (st.len - pos[k]).min(size as u64) as usize;
            let body = st.pattern.bytes(pos[k], n);
            let mut attempts = 0u32;
            loop {
                attempts += 1;
                if attempts > max_attempts {
                    bail!(
                        "stream {}: append at {} not accepted after {max_attempts} attempts",
                        st.path,
                        pos[k]
                    );
                }
                let mut req =
                    ep.with_type(Method::POST, st.uri.clone(), &OCTET_STREAM, body.clone());
                let h = req.headers_mut();
                h.insert(PRODUCER_ID, st.producer.clone());
                h.insert(PRODUCER_EPOCH, epoch.clone());
                h.insert(PRODUCER_SEQ, HeaderValue::from(seq[k]));
                let (parts, text) =
                    match tokio::time::timeout(REQUEST_TIMEOUT, conn.send_collect(req)).await {
                        Ok(Ok(x)) => x,
                        Ok(Err(_)) | Err(_) => {
                            // Ambiguous: the producer seq makes the retry safe.
                            conn.reset();
                            r.retries += 1;
                            tokio::time::sleep(Duration::from_millis(200)).await;
                            continue;
                        }
                    };
                if parts.status.is_success() {
                    break;
                }
                if parts.status == StatusCode::SERVICE_UNAVAILABLE {
                    if text.windows(17).any(|w| w == b"COLD_BACKPRESSURE") {
                        r.backpressure += 1;
                    } else {
                        r.retries += 1;
                    }
                    tokio::time::sleep(retry_after(&parts)).await;
                    continue;
                }
                bail!(
                    "stream {}: append at {} answered {}: {}",
                    st.path,
                    pos[k],
                    parts.status,
                    String::from_utf8_lossy(&text[..text.len().min(300)])
                );
            }
            pos[k] += n as u64;
            seq[k] += 1;
            r.appends += 1;
            done.fetch_add(n as u64, Ordering::Relaxed);
        }
        if !progressed {
            return Ok(r);
        }
    }
}

fn problem(r: &mut ReadResult, text: String) {
    if r.first_problems.len() < 5 {
        r.first_problems.push(text);
    }
}

#[derive(Default)]
struct ReadResult {
    bytes: u64,
    gets: u64,
    mismatched: u64,
    short: u64,
    errors: Errors,
    /// The first few problems, for the log.
    first_problems: Vec<String>,
}

async fn read_loop(
    ep: Arc<Endpoint>,
    streams: Arc<[Stream]>,
    index: usize,
    conns: usize,
) -> Result<ReadResult> {
    let mut r = ReadResult::default();
    let mut conn = Conn::new(ep.clone());
    let mut scratch = Vec::new();
    'streams: for st in streams.iter().skip(index).step_by(conns) {
        let mut offset = String::from("-1");
        let mut pos = 0u64;
        let mut attempts = 0u32;
        for _ in 0..MAX_PAGES {
            let req = ep.get(ep.target.read_uri(&st.path, &offset, "")?);
            let resp = match tokio::time::timeout(REQUEST_TIMEOUT, conn.send(req)).await {
                Ok(Ok(resp)) => resp,
                Ok(Err(e)) => {
                    r.errors.add(error_kind(&e));
                    attempts += 1;
                    if attempts > 5 {
                        r.short += 1;
                        problem(
                            &mut r,
                            format!("{}: gave up at {pos} after transport errors", st.path),
                        );
                        continue 'streams;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                Err(_) => {
                    r.errors.add("timeout");
                    conn.reset();
                    r.short += 1;
                    problem(&mut r, format!("{}: GET timed out at {pos}", st.path));
                    continue 'streams;
                }
            };
            r.gets += 1;
            let (parts, mut body) = resp.into_parts();
            if !parts.status.is_success() {
                r.errors.status(parts.status);
                let _ = body.collect().await;
                r.short += 1;
                problem(
                    &mut r,
                    format!("{}: GET at {pos} answered {}", st.path, parts.status),
                );
                continue 'streams;
            }
            let mut bad = false;
            let deadline = Instant::now() + REQUEST_TIMEOUT;
            loop {
                let frame = match tokio::time::timeout_at(
                    tokio::time::Instant::from_std(deadline),
                    body.frame(),
                )
                .await
                {
                    Ok(Some(Ok(f))) => f,
                    Ok(None) => break,
                    Ok(Some(Err(e))) => {
                        conn.reset();
                        r.errors.add(error_kind(&anyhow::Error::from(e)));
                        r.short += 1;
                        problem(&mut r, format!("{}: body failed at {pos}", st.path));
                        continue 'streams;
                    }
                    Err(_) => {
                        conn.reset();
                        r.errors.add("timeout");
                        r.short += 1;
                        problem(&mut r, format!("{}: body timed out at {pos}", st.path));
                        continue 'streams;
                    }
                };
                let Some(data) = frame.data_ref() else {
                    continue;
                };
                if !bad && pos + data.len() as u64 > st.len {
                    bad = true;
                    problem(&mut r, format!("{}: more than {} bytes", st.path, st.len));
                }
                if !bad && let Some(at) = st.pattern.first_mismatch(pos, data, &mut scratch) {
                    bad = true;
                    problem(
                        &mut r,
                        format!("{}: first wrong byte at {}", st.path, pos + at),
                    );
                }
                pos += data.len() as u64;
                r.bytes += data.len() as u64;
            }
            if bad {
                r.mismatched += 1;
                continue 'streams;
            }
            let next = header_str(&parts, &STREAM_NEXT_OFFSET);
            if parts.status == StatusCode::NO_CONTENT || up_to_date(&parts) || next.is_none() {
                break;
            }
            let Some(next) = next.filter(|o| valid_offset(o)) else {
                r.errors.add("bad_offset");
                r.short += 1;
                continue 'streams;
            };
            if next == offset {
                r.errors.add("stuck");
                r.short += 1;
                continue 'streams;
            }
            offset = next.to_owned();
        }
        if pos != st.len {
            r.short += 1;
            problem(
                &mut r,
                format!("{}: read {pos} bytes, appended {}", st.path, st.len),
            );
        }
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_is_position_addressed() {
        let p = Pattern::for_stream("cold-x-1");
        let whole = p.bytes(0, 1000);
        for start in [0u64, 1, 7, 8, 9, 500, 993] {
            for len in [0usize, 1, 5, 8, 13] {
                let end = (start as usize + len).min(1000);
                let part = p.bytes(start, end - start as usize);
                assert_eq!(&part[..], &whole[start as usize..end], "{start}+{len}");
            }
        }
        let q = Pattern::for_stream("cold-x-2");
        assert_ne!(q.bytes(0, 64), p.bytes(0, 64));
        let mut scratch = Vec::new();
        assert_eq!(p.first_mismatch(3, &whole[3..40], &mut scratch), None);
        let mut bad = whole[3..40].to_vec();
        bad[10] ^= 1;
        assert_eq!(p.first_mismatch(3, &bad, &mut scratch), Some(10));
        assert_eq!(p.first_mismatch(4, &whole[3..40], &mut scratch), Some(0));
    }

    #[test]
    fn lengths_add_up() {
        let total = 4u64 << 30;
        let sum: u64 = (0..100).map(|i| stream_len(total, 100, i)).sum();
        assert_eq!(sum, total);
        assert_eq!(stream_len(10, 3, 0), 4);
        assert_eq!(stream_len(10, 3, 2), 3);
    }

    #[test]
    fn metrics_in_both_formats() {
        let j = parse_metrics(br#"{"hot_bytes": 5, "cold_bytes": 7, "name": "x"}"#);
        assert_eq!(j.as_ref().and_then(|m| m.get("hot_bytes")), Some(&5));
        let t =
            parse_metrics(b"# TYPE ursula_hot_bytes gauge\nursula_hot_bytes 12\nursula_x 1.5\n");
        assert_eq!(t.as_ref().and_then(|m| m.get("hot_bytes")), Some(&12));
        assert_eq!(parse_metrics(b"not metrics"), None);
        let m = t.map(|m| tier_metrics(&m)).unwrap_or_default();
        assert_eq!(m.len(), 1);
    }

    #[test]
    fn dir_sizes_split() {
        let d = tempfile::tempdir().ok();
        let Some(d) = d else { return };
        let p = d.path();
        for (sub, len) in [
            ("wal", 4096usize),
            ("cold/chunks/g00000", 10_000),
            ("snapshots", 100),
        ] {
            let _ = std::fs::create_dir_all(p.join(sub));
            let _ = std::fs::write(p.join(sub).join("f"), vec![1u8; len]);
        }
        let s = dir_size(p);
        assert_eq!(s.wal_apparent_bytes, 4096);
        assert_eq!(s.cold_apparent_bytes, 10_000);
        assert_eq!(s.other_apparent_bytes, 100);
        assert_eq!(s.cold_files, 1);
        assert_eq!(s.total_bytes, s.wal_bytes + s.cold_bytes + s.other_bytes);
    }
}
