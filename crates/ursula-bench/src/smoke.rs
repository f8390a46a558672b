//! `smoke`: every scenario for about a second with tiny sizes.
//!
//! Fails (non-zero exit) when the generator itself fails: it cannot reach
//! the server, a scenario errors out or panics. `--strict` also fails on
//! protocol-level trouble (non-2xx answers, lost deliveries, no progress),
//! which is what CI wants against a real Durable Streams server. Speed is
//! never judged.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use serde::Serialize;

use crate::cli::{
    AppendArgs, ColdSoakArgs, CreateArgs, FanoutArgs, IdleArgs, LongpollArgs, MixedArgs, ReadArgs,
    SmokeArgs,
};
use crate::client::Endpoint;
use crate::report::{json_line, note};
use crate::scenarios::{append, cold_soak, create, fanout, idle, longpoll, mixed, read};

#[derive(Debug, Serialize)]
struct SmokeSummary {
    scenario: &'static str,
    target: String,
    strict: bool,
    ok: bool,
    failures: Vec<String>,
    problems: Vec<String>,
}

/// Returns true when smoke passed.
pub async fn run(ep: Arc<Endpoint>, args: &SmokeArgs, quiet: bool) -> Result<bool> {
    let d = args.duration;
    let warmup = Duration::from_millis(100);
    let grace = Duration::from_secs(2);
    let mut failures = Vec::new();
    let mut problems = Vec::new();

    macro_rules! step {
        ($name:expr, $fut:expr) => {
            match $fut.await {
                Ok(rep) => {
                    json_line(&rep)?;
                    if !quiet {
                        note(&rep.table());
                    }
                    problems.extend(rep.problems());
                }
                Err(e) => failures.push(format!("{}: {e:#}", $name)),
            }
        };
    }

    let a = AppendArgs {
        streams: 4,
        connections: 2,
        body_size: 64,
        duration: d,
        warmup,
        producer: false,
        server_pid: args.server_pid,
        slow_over: None,
    };
    step!("append", append::run(ep.clone(), &a));
    let ap = AppendArgs {
        producer: true,
        ..a
    };
    step!("append --producer", append::run(ep.clone(), &ap));
    // Many streams (the compare presets go to 100,000; a smaller count keeps this short).
    let many = AppendArgs {
        streams: 2_000,
        connections: 32,
        producer: false,
        ..a
    };
    step!("append 2000 streams", append::run(ep.clone(), &many));
    let c = CreateArgs {
        streams: 500,
        connections: 8,
        server_pid: args.server_pid,
    };
    step!("create", create::run(ep.clone(), &c));
    let r = ReadArgs {
        streams: 2,
        stream_bytes: 64 * 1024,
        chunk_size: 4096,
        connections: 2,
        duration: d,
        warmup,
        wait_cold: Duration::ZERO,
        cold_target: 0.9,
        copy_bodies: false,
        server_pid: args.server_pid,
    };
    step!("read", read::run(ep.clone(), &r));
    // The same reads received through hyper, as `--copy-bodies` does.
    let copied = ReadArgs {
        copy_bodies: true,
        ..r.clone()
    };
    step!("read (copied)", read::run(ep.clone(), &copied));
    // 48 MiB over 4 streams: past the default node's 8 MiB flush threshold in every group
    // that holds one, so the read waits (bounded) until some of it is cold. A server
    // without tier metrics is read at once.
    let rc = ReadArgs {
        streams: 4,
        stream_bytes: 12 << 20,
        chunk_size: 256 << 10,
        wait_cold: Duration::from_secs(15),
        cold_target: 0.25,
        ..r
    };
    step!("read (cold)", read::run(ep.clone(), &rc));
    let f = FanoutArgs {
        subscribers: 3,
        rate: 20.0,
        body_size: 48,
        duration: d,
        grace,
        server_pid: args.server_pid,
    };
    step!("fanout", fanout::run(ep.clone(), &f));
    let l = LongpollArgs {
        readers: 4,
        streams: 2,
        rate: 20.0,
        timeout_ms: 1000,
        body_size: 48,
        duration: d,
        grace,
        server_pid: args.server_pid,
    };
    step!("longpoll", longpoll::run(ep.clone(), &l));
    let mx = MixedArgs {
        append_streams: 20,
        append_connections: 4,
        readers: 2,
        subscribers: 5,
        sse_rate: 20.0,
        duration: d,
        warmup,
        server_pid: args.server_pid,
    };
    step!("mixed", mixed::run(ep.clone(), &mx));
    let i = IdleArgs {
        streams: 200,
        connections: 4,
        body_size: 16,
        server_pid: args.server_pid,
        settle: Duration::from_millis(100),
    };
    step!("idle", idle::run(ep.clone(), &i));
    // A tiny cold soak: 64 MiB over 10 streams is past the default flush threshold (8 MiB per
    // group), so on a node with a cold tier the read back spans both tiers.
    let c = ColdSoakArgs {
        streams: 10,
        total_bytes: 64 << 20,
        append_size: 256 << 10,
        connections: 4,
        server_pid: args.server_pid,
        data_dir: None,
        rss_interval: Duration::from_millis(100),
        purge_settle: Duration::ZERO,
        purge_timeout: Duration::ZERO,
        wait_cold: Duration::from_secs(5),
        max_attempts: 60,
        run: None,
    };
    step!("cold-soak", cold_soak::run(ep.clone(), &c, true));

    let ok = failures.is_empty() && (!args.strict || problems.is_empty());
    let summary = SmokeSummary {
        scenario: "smoke",
        target: ep.target.base.clone(),
        strict: args.strict,
        ok,
        failures,
        problems,
    };
    json_line(&summary)?;
    if !quiet {
        let mut text = format!(
            "smoke {} against {}{}\n",
            if ok { "PASSED" } else { "FAILED" },
            ep.target.describe(),
            if args.strict { " (strict)" } else { "" }
        );
        for f in &summary.failures {
            text.push_str(&format!("  generator failure: {f}\n"));
        }
        for p in &summary.problems {
            let tag = if args.strict {
                "failure"
            } else {
                "note (not strict)"
            };
            text.push_str(&format!("  {tag}: {p}\n"));
        }
        note(&text);
    }
    Ok(ok)
}
