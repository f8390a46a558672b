//! `read`: catch-up reads of pre-filled streams.
//!
//! Each stream is filled with `stream_bytes` in `chunk_size` appends, then
//! C connections read whole streams from offset -1, following
//! `Stream-Next-Offset` until `Stream-Up-To-Date: true`. A "read" is one
//! GET; a "stream read" is one stream read to its tail.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use bytes::Bytes;
use http::{Method, StatusCode};
use serde::Serialize;

use super::{Window, check_positive, create_streams, run_id, stream_names};
use crate::cli::ReadArgs;
use crate::client::{
    BodySink, Conn, Endpoint, OCTET_STREAM, STREAM_NEXT_OFFSET, error_kind, header_str, up_to_date,
};
use crate::procfs::{CpuProbe, ServerCpu, fmt_cpu};
use crate::report::{Header, fmt_latency, fmt_num, kv_table};
use crate::stats::{Errors, Histogram, Latency};
use crate::target::valid_offset;

const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Safety net against a server that never says up-to-date.
const MAX_PAGES: usize = 100_000;

#[derive(Debug, Serialize)]
pub struct ReadReport {
    #[serde(flatten)]
    pub header: Header,
    pub streams: usize,
    pub stream_bytes: usize,
    pub chunk_size: usize,
    pub connections: usize,
    pub duration_s: f64,
    pub reads: u64,
    pub reads_per_s: f64,
    pub stream_reads: u64,
    pub stream_reads_per_s: f64,
    pub bytes: u64,
    pub mb_per_s: f64,
    pub latency: Latency,
    pub errors: Errors,
    /// The server's tier metrics when the read started (servers with
    /// `/__ursula/metrics` only).
    pub cold: Option<ColdState>,
    /// Server CPU over the measured window, per GET.
    pub server_cpu: Option<ServerCpu>,
}

/// Where the pre-filled bytes were when the measured reads began.
#[derive(Debug, Serialize)]
pub struct ColdState {
    pub cold_bytes: u64,
    pub hot_bytes: u64,
    /// cold_bytes / bytes pre-filled (the server may hold other streams too).
    pub cold_fraction: f64,
    /// The run asked for cold data (`--wait-cold` above zero).
    pub waited_for_cold: bool,
    /// How long the scenario waited for the flushes.
    pub waited_s: f64,
}

impl ReadReport {
    pub fn table(&self) -> String {
        kv_table(
            "read",
            &[
                ("target", self.header.target.clone()),
                (
                    "shape",
                    format!(
                        "{} streams x {} B, {} conns",
                        self.streams, self.stream_bytes, self.connections
                    ),
                ),
                ("MB/s", fmt_num(self.mb_per_s)),
                ("reads/s", fmt_num(self.reads_per_s)),
                ("stream reads/s", fmt_num(self.stream_reads_per_s)),
                ("latency (per GET)", fmt_latency(&self.latency)),
                ("errors", self.errors.summary()),
                (
                    "cold at start",
                    self.cold
                        .as_ref()
                        .map_or("n/a (no tier metrics)".to_owned(), |c| {
                            format!(
                                "{} B cold ({:.0} % of the pre-fill), {} B hot, after {:.1} s",
                                c.cold_bytes,
                                c.cold_fraction * 100.0,
                                c.hot_bytes,
                                c.waited_s
                            )
                        }),
                ),
                ("server CPU", fmt_cpu(&self.server_cpu)),
            ],
        )
    }

    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if self.bytes == 0 {
            p.push("read: no bytes read".to_owned());
        }
        if let Some(c) = &self.cold
            && c.waited_for_cold
            && c.cold_bytes == 0
        {
            p.push(format!("read: nothing was cold after {:.1} s", c.waited_s));
        }
        if !self.errors.is_empty() {
            p.push(format!("read: errors {}", self.errors.summary()));
        }
        p
    }
}

#[derive(Default)]
struct TaskResult {
    hist: Histogram,
    reads: u64,
    stream_reads: u64,
    bytes: u64,
    errors: Errors,
}

pub async fn run(ep: Arc<Endpoint>, args: &ReadArgs) -> Result<ReadReport> {
    check_positive("streams", args.streams)?;
    check_positive("connections", args.connections)?;
    check_positive("chunk size", args.chunk_size)?;
    let run = run_id();
    let names = stream_names("read", &run, args.streams);
    let uris = names
        .iter()
        .map(|n| ep.target.stream_uri(n))
        .collect::<Result<Vec<_>>>()?;
    let mut errors = Errors::default();
    errors.add_n(
        "create",
        create_streams(&ep, &uris, &OCTET_STREAM, args.connections).await?,
    );
    errors.add_n("prefill", prefill(&ep, &uris, args).await?);
    let written = (args.streams * args.stream_bytes) as u64;
    let cold = wait_cold(&ep, written, args.wait_cold, args.cold_target).await;

    let paths: Arc<[String]> = names
        .iter()
        .map(|n| ep.target.stream_path(n))
        .collect::<Vec<_>>()
        .into();
    let window = Window::new(args.warmup, args.duration);
    let cpu = CpuProbe::over(args.server_pid, window.start, window.end);
    let mut tasks = Vec::with_capacity(args.connections);
    for i in 0..args.connections {
        let ep = ep.clone();
        let paths = paths.clone();
        let (conns, expected) = (args.connections, args.stream_bytes as u64);
        let copy = args.copy_bodies;
        tasks.push(tokio::spawn(async move {
            read_loop(ep, paths, i, conns, expected, window, copy).await
        }));
    }
    let mut total = TaskResult::default();
    for t in tasks {
        let r = t.await??;
        total.hist.merge(&r.hist);
        total.reads += r.reads;
        total.stream_reads += r.stream_reads;
        total.bytes += r.bytes;
        total.errors.merge(&r.errors);
    }
    errors.merge(&total.errors);
    let secs = window.secs();
    let server_cpu = cpu.finish("GET", total.reads).await;
    Ok(ReadReport {
        header: Header::new("read", &ep.target),
        streams: args.streams,
        stream_bytes: args.stream_bytes,
        chunk_size: args.chunk_size,
        connections: args.connections,
        duration_s: secs,
        reads: total.reads,
        reads_per_s: total.reads as f64 / secs,
        stream_reads: total.stream_reads,
        stream_reads_per_s: total.stream_reads as f64 / secs,
        bytes: total.bytes,
        mb_per_s: total.bytes as f64 / secs / 1e6,
        latency: total.hist.latency_us(),
        errors,
        cold,
        server_cpu,
    })
}

/// With `wait > 0`, poll the tier metrics until the cold tier holds `target` of
/// what was written (or the time is up); without the metrics or their
/// `cold_bytes` (a peer server, an older build), return at once.
async fn wait_cold(
    ep: &Arc<Endpoint>,
    written: u64,
    wait: Duration,
    target: f64,
) -> Option<ColdState> {
    let mut conn = Conn::new(ep.clone());
    let started = Instant::now();
    let deadline = started + wait;
    loop {
        let m = super::cold_soak::fetch_metrics(&mut conn).await?;
        // No `cold_bytes` metric: a server without this cold tier; read at once.
        let cold_bytes = *m.get("cold_bytes")?;
        let state = ColdState {
            cold_bytes,
            hot_bytes: m.get("hot_bytes").copied().unwrap_or(0),
            cold_fraction: cold_bytes as f64 / written.max(1) as f64,
            waited_for_cold: !wait.is_zero(),
            waited_s: started.elapsed().as_secs_f64(),
        };
        if wait.is_zero() || state.cold_fraction >= target || Instant::now() >= deadline {
            return Some(state);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Fill each stream; returns how many appends were rejected.
async fn prefill(ep: &Arc<Endpoint>, uris: &[http::Uri], args: &ReadArgs) -> Result<u64> {
    let chunk = Bytes::from(
        (0..args.chunk_size)
            .map(|i| b'a' + (i % 26) as u8)
            .collect::<Vec<_>>(),
    );
    let total = args.stream_bytes;
    let ep2 = ep.clone();
    super::per_connection(ep, uris, args.connections, move |mut conn, uri| {
        let (ep, chunk) = (ep2.clone(), chunk.clone());
        async move {
            let mut rejected = 0u64;
            let mut left = total;
            while left > 0 {
                let n = left.min(chunk.len());
                left -= n;
                let req =
                    || ep.with_type(Method::POST, uri.clone(), &OCTET_STREAM, chunk.slice(..n));
                let (parts, _) =
                    tokio::time::timeout(REQUEST_TIMEOUT, conn.send_drain(req)).await??;
                if !parts.status.is_success() {
                    rejected += 1;
                }
            }
            Ok((conn, rejected))
        }
    })
    .await
}

async fn read_loop(
    ep: Arc<Endpoint>,
    paths: Arc<[String]>,
    index: usize,
    conns: usize,
    expected: u64,
    window: Window,
    copy_bodies: bool,
) -> Result<TaskResult> {
    let mut r = TaskResult::default();
    let mut conn = BodySink::new(ep.clone(), copy_bodies)?;
    let mut k = 0usize;
    'streams: while Instant::now() < window.end {
        let path = &paths[(index + k * conns) % paths.len()];
        k += 1;
        let mut offset = String::from("-1");
        let mut got = 0u64;
        let mut whole_stream_counts = true;
        for _ in 0..MAX_PAGES {
            let started = Instant::now();
            if started >= window.end {
                break 'streams;
            }
            let measured = window.in_measurement(started);
            whole_stream_counts &= measured;
            let uri = ep.target.read_uri(path, &offset, "")?;
            let res = tokio::time::timeout(REQUEST_TIMEOUT, conn.get(&uri)).await;
            let finished = Instant::now();
            let (parts, n) = match res {
                Ok(Ok(x)) => x,
                Ok(Err(e)) => {
                    if measured {
                        r.errors.add(error_kind(&e));
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue 'streams;
                }
                Err(_) => {
                    if measured {
                        r.errors.add("timeout");
                    }
                    conn.reset();
                    continue 'streams;
                }
            };
            if window.counts(started, finished) {
                r.reads += 1;
                r.bytes += n;
                r.hist.record((finished - started).as_nanos() as u64);
            }
            got += n;
            if !parts.status.is_success() {
                if measured {
                    r.errors.status(parts.status);
                }
                continue 'streams;
            }
            let next = header_str(&parts, &STREAM_NEXT_OFFSET);
            if parts.status == StatusCode::NO_CONTENT || up_to_date(&parts) || next.is_none() {
                break;
            }
            let Some(next) = next.filter(|o| valid_offset(o)) else {
                r.errors.add("bad_offset");
                continue 'streams;
            };
            if n == 0 && next == offset {
                r.errors.add("stuck");
                continue 'streams;
            }
            offset = next.to_owned();
        }
        if Instant::now() > window.end {
            break;
        }
        if got != expected && whole_stream_counts {
            r.errors.add("short_read");
        }
        if whole_stream_counts {
            r.stream_reads += 1;
        }
    }
    Ok(r)
}
