//! `fanout`: M SSE subscribers on one text/plain stream, one writer at R
//! appends/s. Each append carries its send time (see `payload`); delivery
//! latency is measured at the subscribers, and every sequence number the
//! writer got acknowledged must reach every subscriber or it is "missed".

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use bytes::Bytes;
use http::Method;
use http::header::CONTENT_TYPE;
use http_body_util::BodyExt;
use serde::Serialize;
use tokio::sync::{mpsc, watch};

use super::{check_positive, check_rate, create_streams, run_id, sleep_or_stop, wait_until};
use crate::cli::FanoutArgs;
use crate::client::{Conn, Endpoint, TEXT_PLAIN, error_kind};
use crate::payload::{SeqSet, decode, encode, now_ns};
use crate::procfs::{CpuProbe, ServerCpu, fmt_cpu};
use crate::report::{Header, fmt_latency, kv_table};
use crate::sse::{Parser, control_next_offset};
use crate::stats::{Errors, Histogram, Latency};
use crate::target::valid_offset;

const READY_TIMEOUT: Duration = Duration::from_secs(15);
const APPEND_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Serialize)]
pub struct FanoutReport {
    #[serde(flatten)]
    pub header: Header,
    pub subscribers: usize,
    pub subscribers_connected: usize,
    pub rate: f64,
    pub body_size: usize,
    pub duration_s: f64,
    pub appends_sent: u64,
    pub expected_deliveries: u64,
    pub deliveries: u64,
    pub missed: u64,
    pub duplicates: u64,
    pub reconnects: u64,
    pub delivery: Latency,
    pub append_latency: Latency,
    pub errors: Errors,
    /// Server CPU while the writer ran, per delivery (one append reaching one reader).
    pub server_cpu: Option<ServerCpu>,
}

impl FanoutReport {
    pub fn table(&self) -> String {
        kv_table(
            "fanout (SSE)",
            &[
                ("target", self.header.target.clone()),
                (
                    "shape",
                    format!(
                        "{} subscribers ({} connected), {}/s, {} B",
                        self.subscribers, self.subscribers_connected, self.rate, self.body_size
                    ),
                ),
                ("appends sent", self.appends_sent.to_string()),
                (
                    "deliveries",
                    format!("{} of {}", self.deliveries, self.expected_deliveries),
                ),
                ("missed", self.missed.to_string()),
                ("delivery latency", fmt_latency(&self.delivery)),
                ("append latency", fmt_latency(&self.append_latency)),
                ("errors", self.errors.summary()),
                ("server CPU", fmt_cpu(&self.server_cpu)),
            ],
        )
    }

    pub fn problems(&self) -> Vec<String> {
        super::delivery_problems("fanout", self.deliveries, self.missed, &self.errors)
    }
}

/// Shared progress counters the writer watches while draining.
struct Counters {
    delivered: Arc<AtomicU64>,
    connected: Arc<AtomicU64>,
}

#[derive(Default)]
struct SubResult {
    hist: Histogram,
    seen: SeqSet,
    errors: Errors,
    reconnects: u64,
    connected: bool,
}

pub async fn run(ep: Arc<Endpoint>, args: &FanoutArgs) -> Result<FanoutReport> {
    check_positive("subscribers", args.subscribers)?;
    check_rate(args.rate)?;
    let run = run_id();
    let name = format!("fanout-{run}");
    let uri = ep.target.stream_uri(&name)?;
    let mut errors = Errors::default();
    errors.add_n(
        "create",
        create_streams(&ep, std::slice::from_ref(&uri), &TEXT_PLAIN, 1).await?,
    );
    let path: Arc<str> = ep.target.stream_path(&name).into();

    let (stop_tx, stop_rx) = watch::channel(false);
    let (ready_tx, mut ready_rx) = mpsc::unbounded_channel::<()>();
    let delivered = Arc::new(AtomicU64::new(0));
    let connected_subs = Arc::new(AtomicU64::new(0));
    let mut subs = Vec::with_capacity(args.subscribers);
    for _ in 0..args.subscribers {
        let counters = Counters {
            delivered: delivered.clone(),
            connected: connected_subs.clone(),
        };
        let (ep, path, stop, ready) = (ep.clone(), path.clone(), stop_rx.clone(), ready_tx.clone());
        subs.push(tokio::spawn(subscriber(ep, path, stop, ready, counters)));
    }
    drop(ready_tx);
    // Start writing once every subscriber has its response headers (or gave up).
    let ready_deadline = Instant::now() + READY_TIMEOUT;
    for _ in 0..args.subscribers {
        let left = ready_deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, ready_rx.recv()).await {
            Ok(Some(())) => {}
            _ => {
                errors.add("subscribe_timeout");
                break;
            }
        }
    }

    // The writer: one connection, fixed rate.
    let mut conn = Conn::new(ep.clone());
    let mut sent = SeqSet::default();
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
        let body = Bytes::from(encode(seq, now_ns(), args.body_size));
        let req = || ep.with_type(Method::POST, uri.clone(), &TEXT_PLAIN, body.clone());
        let t0 = Instant::now();
        match tokio::time::timeout(APPEND_TIMEOUT, conn.send_drain(req)).await {
            Ok(Ok((parts, _))) if parts.status.is_success() => {
                sent.insert(seq);
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

    let want = sent.unique() * connected_subs.load(Ordering::Relaxed);
    wait_until(Instant::now() + args.grace, || {
        delivered.load(Ordering::Relaxed) >= want
    })
    .await;
    let _ = stop_tx.send(true);

    let mut hist = Histogram::new();
    let (mut deliveries, mut missed, mut duplicates, mut reconnects, mut connected) =
        (0u64, 0u64, 0u64, 0u64, 0usize);
    for s in subs {
        let r = s.await?;
        hist.merge(&r.hist);
        errors.merge(&r.errors);
        let lost = r.seen.missing_from(&sent);
        missed += lost;
        deliveries += sent.unique() - lost;
        duplicates += r.seen.duplicates();
        reconnects += r.reconnects;
        connected += usize::from(r.connected);
    }
    let server_cpu = cpu.finish("delivery", deliveries);
    Ok(FanoutReport {
        header: Header::new("fanout", &ep.target),
        subscribers: args.subscribers,
        subscribers_connected: connected,
        rate: args.rate,
        body_size: args.body_size,
        duration_s,
        appends_sent: sent.unique(),
        expected_deliveries: sent.unique() * args.subscribers as u64,
        deliveries,
        missed,
        duplicates,
        reconnects,
        delivery: hist.latency_us(),
        append_latency: append_hist.latency_us(),
        errors,
        server_cpu,
    })
}

async fn subscriber(
    ep: Arc<Endpoint>,
    path: Arc<str>,
    mut stop: watch::Receiver<bool>,
    ready: mpsc::UnboundedSender<()>,
    counters: Counters,
) -> SubResult {
    let Counters {
        delivered,
        connected,
    } = counters;
    let mut r = SubResult::default();
    let mut ready = Some(ready);
    let mut conn = Conn::new(ep.clone());
    let mut offset = String::from("-1");
    let mut failures = 0u32;
    'connect: while !*stop.borrow() {
        let uri = match ep.target.read_uri(&path, &offset, "&live=sse") {
            Ok(u) => u,
            Err(_) => {
                r.errors.add("bad_offset");
                break;
            }
        };
        let resp = tokio::select! {
            res = conn.send(|| ep.sse(uri.clone())) => res,
            _ = stop.changed() => break,
        };
        let resp = match resp {
            Ok(resp) => resp,
            Err(e) => {
                r.errors.add(error_kind(&e));
                failures += 1;
                if failures >= 5 || sleep_or_stop(Duration::from_millis(100), &mut stop).await {
                    break;
                }
                continue;
            }
        };
        let is_sse = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if !resp.status().is_success() || !is_sse {
            // Not an event stream (e.g. the floor's 204): give up, counted.
            r.errors.add(&format!("sse_{}", resp.status().as_str()));
            break;
        }
        failures = 0;
        if !r.connected {
            connected.fetch_add(1, Ordering::Relaxed);
        }
        r.connected = true;
        if let Some(tx) = ready.take() {
            let _ = tx.send(());
        }
        let mut body = resp.into_body();
        let mut parser = Parser::default();
        loop {
            let frame = tokio::select! {
                f = body.frame() => f,
                _ = stop.changed() => break 'connect,
            };
            match frame {
                None => {
                    // Server ended the response; resume from the last offset.
                    r.reconnects += 1;
                    continue 'connect;
                }
                Some(Err(e)) => {
                    r.errors.add(error_kind(&anyhow::Error::from(e)));
                    conn.reset();
                    r.reconnects += 1;
                    continue 'connect;
                }
                Some(Ok(frame)) => {
                    let Some(data) = frame.data_ref() else {
                        continue;
                    };
                    let now = now_ns();
                    parser.feed(data, |ev| match ev.kind.as_str() {
                        "data" => {
                            let bad = decode(&ev.data, |seq, sent_ns| {
                                if r.seen.insert(seq) {
                                    r.hist.record(now.saturating_sub(sent_ns));
                                    delivered.fetch_add(1, Ordering::Relaxed);
                                }
                            });
                            r.errors.add_n("bad_record", bad);
                        }
                        "control" => {
                            if let Some(o) =
                                control_next_offset(&ev.data).filter(|o| valid_offset(o))
                            {
                                offset = o;
                            }
                        }
                        _ => {}
                    });
                }
            }
        }
    }
    // Never leave the writer waiting on a subscriber that gave up.
    if let Some(tx) = ready.take() {
        let _ = tx.send(());
    }
    r
}
