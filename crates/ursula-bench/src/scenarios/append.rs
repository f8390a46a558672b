//! `append`: N streams, C connections, fixed body size, for a duration.
//!
//! Connection i sends its k-th append to stream (i + k*C) % N, so every
//! stream gets load and a single stream gets all of it. With `--producer`
//! each (connection, stream) pair is its own idempotent producer whose
//! Producer-Seq starts at 0 and increases by one per request.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use bytes::Bytes;
use http::{HeaderValue, Method, StatusCode};
use serde::Serialize;

use super::{Window, check_positive, create_streams, run_id, stream_names};
use crate::cli::AppendArgs;
use crate::client::{
    Conn, Endpoint, OCTET_STREAM, PRODUCER_EPOCH, PRODUCER_ID, PRODUCER_SEQ, error_kind, header_str,
};
use crate::procfs::{CpuProbe, ServerCpu, fmt_cpu};
use crate::report::{Header, fmt_latency, fmt_num, kv_table};
use crate::stalls::{Slow, Stalls};
use crate::stats::{Errors, Histogram, Latency};

const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
const EXPECTED_SEQ: http::HeaderName = http::HeaderName::from_static("producer-expected-seq");

#[derive(Debug, Serialize)]
pub struct AppendReport {
    #[serde(flatten)]
    pub header: Header,
    pub producer: bool,
    pub streams: usize,
    pub connections: usize,
    pub body_size: usize,
    pub duration_s: f64,
    pub appends: u64,
    pub appends_per_s: f64,
    pub mb_per_s: f64,
    pub latency: Latency,
    pub errors: Errors,
    pub reconnects: u64,
    /// Server CPU over the measured window, per acknowledged append.
    pub server_cpu: Option<ServerCpu>,
    /// With `--slow-over`: the slow appends, in bursts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stalls: Option<Stalls>,
}

impl AppendReport {
    pub fn table(&self) -> String {
        let title = if self.producer {
            "append --producer"
        } else {
            "append"
        };
        let mut rows = vec![
            ("target", self.header.target.clone()),
            (
                "shape",
                format!(
                    "{} streams, {} conns, {} B",
                    self.streams, self.connections, self.body_size
                ),
            ),
            ("appends/s", fmt_num(self.appends_per_s)),
            ("MB/s", fmt_num(self.mb_per_s)),
            ("latency", fmt_latency(&self.latency)),
            ("errors", self.errors.summary()),
            ("reconnects", self.reconnects.to_string()),
            ("redirects", self.header.redirects.to_string()),
            ("server CPU", fmt_cpu(&self.server_cpu)),
        ];
        if let Some(s) = &self.stalls {
            for (i, line) in s.lines().into_iter().enumerate() {
                rows.push((if i == 0 { "slow appends" } else { "" }, line));
            }
        }
        kv_table(title, &rows)
    }

    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if self.appends == 0 {
            p.push("append: no successful append".to_owned());
        }
        if !self.errors.is_empty() {
            p.push(format!("append: errors {}", self.errors.summary()));
        }
        p
    }
}

struct TaskResult {
    hist: Histogram,
    ok: u64,
    errors: Errors,
    reconnects: u64,
    slow: Vec<Slow>,
}

pub async fn run(ep: Arc<Endpoint>, args: &AppendArgs) -> Result<AppendReport> {
    check_positive("streams", args.streams)?;
    check_positive("connections", args.connections)?;
    check_positive("body size", args.body_size)?;
    let run = run_id();
    let names = stream_names("append", &run, args.streams);
    let uris = names
        .iter()
        .map(|n| ep.target.stream_uri(n))
        .collect::<Result<Vec<_>>>()?;
    // Setup only: enough connections that creating 100,000 streams stays short.
    let rejected = create_streams(&ep, &uris, &OCTET_STREAM, args.connections.min(64)).await?;
    let uris: Arc<[http::Uri]> = uris.into();
    let body = Bytes::from(vec![b'x'; args.body_size]);
    let window = Window::new(args.warmup, args.duration);
    let cpu = CpuProbe::over(args.server_pid, window.start, window.end);

    let mut tasks = Vec::with_capacity(args.connections);
    for i in 0..args.connections {
        let ep = ep.clone();
        let uris = uris.clone();
        let body = body.clone();
        let producer = args.producer.then(|| format!("bench-{run}-c{i}"));
        let conns = args.connections;
        let slow_over = args.slow_over;
        tasks.push(tokio::spawn(async move {
            connection_loop(ep, uris, body, producer, (i, conns), window, slow_over).await
        }));
    }
    let mut hist = Histogram::new();
    let mut errors = Errors::default();
    errors.add_n("create", rejected);
    let mut ok = 0;
    let mut reconnects = 0;
    let mut slow = Vec::new();
    for t in tasks {
        let mut r = t.await??;
        slow.append(&mut r.slow);
        hist.merge(&r.hist);
        errors.merge(&r.errors);
        ok += r.ok;
        reconnects += r.reconnects;
    }
    let secs = window.secs();
    let server_cpu = cpu.finish("append", ok).await;
    Ok(AppendReport {
        header: Header::new("append", &ep.target),
        producer: args.producer,
        streams: args.streams,
        connections: args.connections,
        body_size: args.body_size,
        duration_s: secs,
        appends: ok,
        appends_per_s: ok as f64 / secs,
        mb_per_s: ok as f64 * args.body_size as f64 / secs / 1e6,
        latency: hist.latency_us(),
        errors,
        reconnects,
        server_cpu,
        stalls: args
            .slow_over
            .map(|t| Stalls::from_slow(t.as_micros() as u64, slow)),
    })
}

async fn connection_loop(
    ep: Arc<Endpoint>,
    uris: Arc<[http::Uri]>,
    body: Bytes,
    producer: Option<String>,
    (index, conns): (usize, usize),
    window: Window,
    slow_over: Option<Duration>,
) -> Result<TaskResult> {
    let n = uris.len();
    let mut conn = Conn::new(ep.clone());
    let mut hist = Histogram::new();
    let mut errors = Errors::default();
    let mut ok = 0u64;
    let mut slow = Vec::new();
    let producer_id = match &producer {
        Some(p) => Some(HeaderValue::try_from(p.as_str())?),
        None => None,
    };
    let epoch = HeaderValue::from_static("0");
    let mut seqs = vec![0u64; if producer.is_some() { n } else { 0 }];
    let mut k = 0usize;
    loop {
        let started = Instant::now();
        if started >= window.end {
            break;
        }
        let s = (index + k * conns) % n;
        k += 1;
        let req = || {
            let mut req = ep.with_type(Method::POST, uris[s].clone(), &OCTET_STREAM, body.clone());
            if let Some(id) = &producer_id {
                let h = req.headers_mut();
                h.insert(PRODUCER_ID, id.clone());
                h.insert(PRODUCER_EPOCH, epoch.clone());
                h.insert(PRODUCER_SEQ, HeaderValue::from(seqs[s]));
            }
            req
        };
        let result = tokio::time::timeout(REQUEST_TIMEOUT, conn.send_drain(req)).await;
        let finished = Instant::now();
        let measured = window.in_measurement(started);
        match result {
            Ok(Ok((parts, _))) if parts.status.is_success() => {
                if producer_id.is_some() {
                    seqs[s] += 1;
                }
                if window.counts(started, finished) {
                    ok += 1;
                    let took = finished - started;
                    hist.record(took.as_nanos() as u64);
                    if slow_over.is_some_and(|t| took > t) {
                        slow.push(Slow {
                            start_us: (started - window.start).as_micros() as u64,
                            latency_us: took.as_micros() as u64,
                        });
                    }
                }
            }
            Ok(Ok((parts, _))) => {
                if measured {
                    errors.status(parts.status);
                }
                // A producer told it is out of step resynchronises.
                if parts.status == StatusCode::CONFLICT
                    && let Some(exp) =
                        header_str(&parts, &EXPECTED_SEQ).and_then(|v| v.parse::<u64>().ok())
                    && !seqs.is_empty()
                {
                    seqs[s] = exp;
                }
                // A cluster electing a leader answers 503 (Retry-After: 1): pause briefly
                // instead of spinning on the nodes that are electing, but less than the
                // second a polite client waits, so the run measures the recovery.
                if parts.status == StatusCode::SERVICE_UNAVAILABLE {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            Ok(Err(e)) => {
                if measured {
                    errors.add(error_kind(&e));
                }
                // Do not spin on a refused connection.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(_) => {
                if measured {
                    errors.add("timeout");
                }
                conn.reset();
            }
        }
    }
    Ok(TaskResult {
        hist,
        ok,
        errors,
        reconnects: conn.reconnects(),
        slow,
    })
}
