//! `longpoll`: L long-poll readers spread over S text/plain streams, one
//! writer at R appends/s round-robin over the streams. Wake-up latency is
//! the time from the writer sending an append to a reader holding it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use bytes::Bytes;
use http::{Method, StatusCode};
use serde::Serialize;
use tokio::sync::{mpsc, watch};

use super::{
    check_positive, check_rate, create_streams, run_id, sleep_or_stop, stream_names, wait_until,
};
use crate::cli::LongpollArgs;
use crate::client::{Conn, Endpoint, STREAM_NEXT_OFFSET, TEXT_PLAIN, error_kind, header_str};
use crate::payload::{SeqSet, decode, encode, now_ns};
use crate::procfs::{CpuProbe, ServerCpu, fmt_cpu};
use crate::report::{Header, fmt_latency, kv_table};
use crate::stats::{Errors, Histogram, Latency};
use crate::target::valid_offset;

const READY_TIMEOUT: Duration = Duration::from_secs(15);
const APPEND_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Serialize)]
pub struct LongpollReport {
    #[serde(flatten)]
    pub header: Header,
    pub readers: usize,
    pub readers_ready: usize,
    pub streams: usize,
    pub rate: f64,
    pub timeout_ms: u64,
    pub duration_s: f64,
    pub appends_sent: u64,
    pub expected_deliveries: u64,
    pub deliveries: u64,
    pub missed: u64,
    pub wakeups: u64,
    pub timeouts: u64,
    pub wake: Latency,
    pub append_latency: Latency,
    pub errors: Errors,
    /// Server CPU while the writer ran, per delivery (one append reaching one reader).
    pub server_cpu: Option<ServerCpu>,
}

impl LongpollReport {
    pub fn table(&self) -> String {
        kv_table(
            "longpoll",
            &[
                ("target", self.header.target.clone()),
                (
                    "shape",
                    format!(
                        "{} readers ({} ready) on {} streams, {}/s",
                        self.readers, self.readers_ready, self.streams, self.rate
                    ),
                ),
                ("appends sent", self.appends_sent.to_string()),
                (
                    "deliveries",
                    format!("{} of {}", self.deliveries, self.expected_deliveries),
                ),
                ("missed", self.missed.to_string()),
                (
                    "wake-ups / 204s",
                    format!("{} / {}", self.wakeups, self.timeouts),
                ),
                ("wake-up latency", fmt_latency(&self.wake)),
                ("append latency", fmt_latency(&self.append_latency)),
                ("errors", self.errors.summary()),
                ("server CPU", fmt_cpu(&self.server_cpu)),
            ],
        )
    }

    pub fn problems(&self) -> Vec<String> {
        super::delivery_problems("longpoll", self.deliveries, self.missed, &self.errors)
    }
}

#[derive(Default)]
struct ReaderResult {
    stream: usize,
    hist: Histogram,
    seen: SeqSet,
    wakeups: u64,
    timeouts: u64,
    errors: Errors,
    ready: bool,
}

pub async fn run(ep: Arc<Endpoint>, args: &LongpollArgs) -> Result<LongpollReport> {
    check_positive("readers", args.readers)?;
    check_positive("streams", args.streams)?;
    check_rate(args.rate)?;
    let run = run_id();
    let names = stream_names("longpoll", &run, args.streams);
    let uris = names
        .iter()
        .map(|n| ep.target.stream_uri(n))
        .collect::<Result<Vec<_>>>()?;
    let mut errors = Errors::default();
    errors.add_n("create", create_streams(&ep, &uris, &TEXT_PLAIN, 8).await?);
    let paths: Vec<Arc<str>> = names
        .iter()
        .map(|n| ep.target.stream_path(n).into())
        .collect();

    let (stop_tx, stop_rx) = watch::channel(false);
    let (ready_tx, mut ready_rx) = mpsc::unbounded_channel::<(usize, bool)>();
    let delivered = Arc::new(AtomicU64::new(0));
    let mut readers = Vec::with_capacity(args.readers);
    for i in 0..args.readers {
        let stream = i % args.streams;
        let ctx = ReaderCtx {
            ep: ep.clone(),
            path: paths[stream].clone(),
            stream,
            timeout_ms: args.timeout_ms,
            delivered: delivered.clone(),
        };
        readers.push(tokio::spawn(reader(ctx, stop_rx.clone(), ready_tx.clone())));
    }
    drop(ready_tx);
    let mut ready_per_stream = vec![0u64; args.streams];
    let ready_deadline = Instant::now() + READY_TIMEOUT;
    let mut answered = 0;
    while answered < args.readers {
        let left = ready_deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, ready_rx.recv()).await {
            Ok(Some((stream, ok))) => {
                answered += 1;
                ready_per_stream[stream] += u64::from(ok);
            }
            _ => {
                errors.add("ready_timeout");
                break;
            }
        }
    }

    let mut conn = Conn::new(ep.clone());
    let mut sent = vec![SeqSet::default(); args.streams];
    let mut append_hist = Histogram::new();
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / args.rate));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let cpu = CpuProbe::start(args.server_pid);
    let started = Instant::now();
    let end = started + args.duration;
    let mut seq = 0u64;
    loop {
        ticker.tick().await;
        if Instant::now() >= end {
            break;
        }
        let s = (seq % args.streams as u64) as usize;
        let body = Bytes::from(encode(seq, now_ns(), args.body_size));
        let req = || ep.with_type(Method::POST, uris[s].clone(), &TEXT_PLAIN, body.clone());
        let t0 = Instant::now();
        match tokio::time::timeout(APPEND_TIMEOUT, conn.send_drain(req)).await {
            Ok(Ok((parts, _))) if parts.status.is_success() => {
                sent[s].insert(seq);
                append_hist.record(t0.elapsed().as_nanos() as u64);
            }
            Ok(Ok((parts, _))) => errors.add(&format!("append_{}", parts.status.as_str())),
            Ok(Err(e)) => errors.add(&format!("append_{}", error_kind(&e))),
            Err(_) => {
                errors.add("append_timeout");
                conn.reset();
            }
        }
        seq += 1;
    }
    let duration_s = started.elapsed().as_secs_f64();
    let cpu = cpu.finish_later();
    let expected: u64 = sent
        .iter()
        .zip(&ready_per_stream)
        .map(|(s, r)| s.unique() * r)
        .sum();
    wait_until(Instant::now() + args.grace, || {
        delivered.load(Ordering::Relaxed) >= expected
    })
    .await;
    let _ = stop_tx.send(true);

    let mut hist = Histogram::new();
    let (mut deliveries, mut missed, mut wakeups, mut timeouts, mut ready) = (0, 0, 0, 0, 0usize);
    for r in readers {
        let r = r.await?;
        let lost = r.seen.missing_from(&sent[r.stream]);
        missed += lost;
        deliveries += sent[r.stream].unique() - lost;
        wakeups += r.wakeups;
        timeouts += r.timeouts;
        ready += usize::from(r.ready);
        hist.merge(&r.hist);
        errors.merge(&r.errors);
    }
    let appends_sent: u64 = sent.iter().map(SeqSet::unique).sum();
    let server_cpu = cpu.finish("delivery", deliveries);
    Ok(LongpollReport {
        header: Header::new("longpoll", &ep.target),
        readers: args.readers,
        readers_ready: ready,
        streams: args.streams,
        rate: args.rate,
        timeout_ms: args.timeout_ms,
        duration_s,
        appends_sent,
        expected_deliveries: sent
            .iter()
            .enumerate()
            .map(|(i, s)| s.unique() * readers_on(i, args.readers, args.streams))
            .sum(),
        deliveries,
        missed,
        wakeups,
        timeouts,
        wake: hist.latency_us(),
        append_latency: append_hist.latency_us(),
        errors,
        server_cpu,
    })
}

/// Readers waiting on stream `i` when reader r takes stream r % streams.
fn readers_on(i: usize, readers: usize, streams: usize) -> u64 {
    (readers / streams + usize::from(i < readers % streams)) as u64
}

struct ReaderCtx {
    ep: Arc<Endpoint>,
    path: Arc<str>,
    stream: usize,
    timeout_ms: u64,
    delivered: Arc<AtomicU64>,
}

async fn reader(
    ctx: ReaderCtx,
    mut stop: watch::Receiver<bool>,
    ready: mpsc::UnboundedSender<(usize, bool)>,
) -> ReaderResult {
    let ReaderCtx {
        ep,
        path,
        stream,
        timeout_ms,
        delivered,
    } = ctx;
    let mut r = ReaderResult {
        stream,
        ..ReaderResult::default()
    };
    let mut conn = Conn::new(ep.clone());
    // Find the tail with a plain catch-up read.
    let mut offset = String::from("-1");
    let first = match ep.target.read_uri(&path, &offset, "") {
        Ok(uri) => {
            tokio::time::timeout(APPEND_TIMEOUT, conn.send_collect(|| ep.get(uri.clone()))).await
        }
        Err(e) => Ok(Err(e)),
    };
    match first {
        Ok(Ok((parts, _))) => {
            match header_str(&parts, &STREAM_NEXT_OFFSET).filter(|o| valid_offset(o)) {
                Some(o) if parts.status.is_success() => offset = o.to_owned(),
                _ => {
                    r.errors.add(&format!("catchup_{}", parts.status.as_str()));
                    let _ = ready.send((stream, false));
                    return r;
                }
            }
        }
        Ok(Err(e)) => {
            r.errors.add(error_kind(&e));
            let _ = ready.send((stream, false));
            return r;
        }
        Err(_) => {
            r.errors.add("timeout");
            let _ = ready.send((stream, false));
            return r;
        }
    }
    r.ready = true;
    let _ = ready.send((stream, true));
    let live = format!("&live=long-poll&timeout_ms={timeout_ms}");
    let request_timeout = Duration::from_millis(timeout_ms) + Duration::from_secs(5);
    while !*stop.borrow() {
        let uri = match ep.target.read_uri(&path, &offset, &live) {
            Ok(u) => u,
            Err(_) => {
                r.errors.add("bad_offset");
                break;
            }
        };
        let res = tokio::select! {
            res = tokio::time::timeout(request_timeout, conn.send_collect(|| ep.get(uri.clone()))) => res,
            _ = stop.changed() => break,
        };
        let now = now_ns();
        let pause = match res {
            Ok(Ok((parts, body))) => {
                if let Some(o) = header_str(&parts, &STREAM_NEXT_OFFSET).filter(|o| valid_offset(o))
                {
                    offset = o.to_owned();
                }
                match parts.status {
                    StatusCode::OK if body.is_empty() => {
                        r.errors.add("empty_200");
                        true
                    }
                    StatusCode::OK => {
                        r.wakeups += 1;
                        let text = String::from_utf8_lossy(&body);
                        let bad = decode(&text, |seq, sent_ns| {
                            if r.seen.insert(seq) {
                                r.hist.record(now.saturating_sub(sent_ns));
                                delivered.fetch_add(1, Ordering::Relaxed);
                            }
                        });
                        r.errors.add_n("bad_record", bad);
                        false
                    }
                    StatusCode::NO_CONTENT => {
                        r.timeouts += 1;
                        false
                    }
                    other => {
                        r.errors.status(other);
                        true
                    }
                }
            }
            Ok(Err(e)) => {
                r.errors.add(error_kind(&e));
                true
            }
            Err(_) => {
                r.errors.add("timeout");
                conn.reset();
                false
            }
        };
        // Back off after an answer that would make us spin.
        if pause && sleep_or_stop(Duration::from_millis(50), &mut stop).await {
            break;
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::readers_on;

    #[test]
    fn readers_are_spread_evenly() {
        assert_eq!(readers_on(0, 100, 10), 10);
        assert_eq!(readers_on(0, 5, 2), 3);
        assert_eq!(readers_on(1, 5, 2), 2);
        assert_eq!(readers_on(3, 2, 4), 0);
        let total: u64 = (0..7).map(|i| readers_on(i, 23, 7)).sum();
        assert_eq!(total, 23);
    }
}
