//! `mixed`: three loads on one server at once, each the scenario of its own
//! name: `append` (closed loop, 128 B bodies), `read` (catch-up reads of 10
//! pre-filled 1 MiB streams) and `fanout` (SSE subscribers tailing a stream a
//! writer appends to at a fixed rate).
//!
//! Each part measures its own window (the read's starts after its pre-fill,
//! the fan-out's once its subscribers are connected), so the windows overlap
//! for all but about the first second. Server CPU is taken over the append
//! window and divided by every operation in it: appends, GETs and SSE
//! deliveries.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use serde::Serialize;

use super::append::{self, AppendReport};
use super::check_positive;
use super::fanout::{self, FanoutReport};
use super::read::{self, ReadReport};
use crate::cli::{AppendArgs, FanoutArgs, MixedArgs, ReadArgs};
use crate::client::Endpoint;
use crate::procfs::{CpuProbe, ServerCpu, fmt_cpu};
use crate::report::{Header, fmt_num, fmt_us, kv_table};

#[derive(Debug, Serialize)]
pub struct MixedReport {
    #[serde(flatten)]
    pub header: Header,
    pub append: AppendReport,
    pub read: ReadReport,
    pub fanout: FanoutReport,
    /// Server CPU over the append window, per append, GET and SSE delivery.
    pub server_cpu: Option<ServerCpu>,
}

impl MixedReport {
    pub fn table(&self) -> String {
        kv_table(
            "mixed",
            &[
                ("target", self.header.target.clone()),
                (
                    "appends/s, p99",
                    format!(
                        "{} ({} streams, {} conns), {}",
                        fmt_num(self.append.appends_per_s),
                        self.append.streams,
                        self.append.connections,
                        fmt_us(self.append.latency.p99_us)
                    ),
                ),
                (
                    "catch-up MB/s, p99 per GET",
                    format!(
                        "{} ({} conns), {}",
                        fmt_num(self.read.mb_per_s),
                        self.read.connections,
                        fmt_us(self.read.latency.p99_us)
                    ),
                ),
                (
                    "SSE delivery p50 / p99",
                    format!(
                        "{} / {} ({} subscribers, {} missed)",
                        fmt_us(self.fanout.delivery.p50_us),
                        fmt_us(self.fanout.delivery.p99_us),
                        self.fanout.subscribers,
                        self.fanout.missed
                    ),
                ),
                ("server CPU", fmt_cpu(&self.server_cpu)),
            ],
        )
    }

    pub fn problems(&self) -> Vec<String> {
        let mut p = self.append.problems();
        p.extend(self.read.problems());
        p.extend(self.fanout.problems());
        p.into_iter().map(|x| format!("mixed: {x}")).collect()
    }
}

pub async fn run(ep: Arc<Endpoint>, args: &MixedArgs) -> Result<MixedReport> {
    check_positive("append streams", args.append_streams)?;
    check_positive("append connections", args.append_connections)?;
    check_positive("readers", args.readers)?;
    check_positive("subscribers", args.subscribers)?;
    let a = AppendArgs {
        streams: args.append_streams,
        connections: args.append_connections,
        body_size: 128,
        duration: args.duration,
        warmup: args.warmup,
        producer: false,
        server_pid: None,
        slow_over: None,
    };
    let r = ReadArgs {
        streams: 10,
        stream_bytes: 1 << 20,
        chunk_size: 16 << 10,
        connections: args.readers,
        duration: args.duration,
        warmup: args.warmup,
        wait_cold: Duration::ZERO,
        cold_target: 0.9,
        copy_bodies: false,
        server_pid: None,
    };
    let f = FanoutArgs {
        subscribers: args.subscribers,
        rate: args.sse_rate,
        body_size: 64,
        // The writer starts without a warm-up; run it as long as the others in all.
        duration: args.warmup + args.duration,
        grace: Duration::from_secs(5),
        server_pid: None,
    };
    let start = Instant::now() + args.warmup;
    let cpu = CpuProbe::over(args.server_pid, start, start + args.duration);
    let (append, read, fanout) = tokio::join!(
        append::run(ep.clone(), &a),
        read::run(ep.clone(), &r),
        fanout::run(ep.clone(), &f)
    );
    let (append, read, fanout) = (append?, read?, fanout?);
    // Deliveries in the CPU window: the fan-out's rate over its whole run, scaled.
    let fanout_in_window =
        fanout.deliveries as f64 * args.duration.as_secs_f64() / fanout.duration_s.max(1e-9);
    let ops = append.appends + read.reads + fanout_in_window as u64;
    let server_cpu = cpu.finish("op", ops).await;
    Ok(MixedReport {
        header: Header::new("mixed", &ep.target),
        append,
        read,
        fanout,
        server_cpu,
    })
}
