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

mod load;
mod measure;
mod pattern;

use load::*;
use measure::*;
pub use measure::{DirSize, dir_size, fetch_metrics};
pub use pattern::{Pattern, stream_len};

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use http::HeaderValue;
use serde::Serialize;

use super::{check_positive, create_streams, run_id, stream_names};
use crate::cli::ColdSoakArgs;
use crate::client::{Conn, Endpoint, OCTET_STREAM};
use crate::report::{Header, fmt_num, kv_table, note};
use crate::stats::Errors;

pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Safety net against a server that never says up-to-date (pages per stream).
pub(super) const MAX_PAGES: usize = 1_000_000;
/// Longest Retry-After honoured.
pub(super) const MAX_RETRY_AFTER: Duration = Duration::from_secs(10);
pub(super) const MIB: f64 = 1024.0 * 1024.0;

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

pub(super) struct Stream {
    pub(super) uri: http::Uri,
    pub(super) path: String,
    pub(super) producer: HeaderValue,
    pub(super) pattern: Pattern,
    pub(super) len: u64,
}

#[derive(Default)]
pub(super) struct AppendResult {
    pub(super) appends: u64,
    pub(super) backpressure: u64,
    pub(super) retries: u64,
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
