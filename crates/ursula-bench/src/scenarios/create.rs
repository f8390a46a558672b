//! `create`: K empty `application/octet-stream` streams created with one PUT
//! each over C keep-alive connections (connection c creates streams c, c + C,
//! ...). Creation throughput and latency, and server CPU per create.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use bytes::Bytes;
use http::Method;
use serde::Serialize;

use super::{check_positive, run_id};
use crate::cli::CreateArgs;
use crate::client::{Conn, Endpoint, OCTET_STREAM, error_kind};
use crate::procfs::{CpuProbe, ServerCpu, fmt_cpu};
use crate::report::{Header, fmt_latency, fmt_num, kv_table};
use crate::stats::{Errors, Histogram, Latency};

const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Serialize)]
pub struct CreateReport {
    #[serde(flatten)]
    pub header: Header,
    pub streams: usize,
    pub connections: usize,
    pub created: u64,
    pub create_s: f64,
    pub creates_per_s: f64,
    pub latency: Latency,
    pub errors: Errors,
    /// Server CPU from the first PUT to the last answer, per stream created.
    pub server_cpu: Option<ServerCpu>,
}

impl CreateReport {
    pub fn table(&self) -> String {
        kv_table(
            "create",
            &[
                ("target", self.header.target.clone()),
                (
                    "streams created",
                    format!(
                        "{} of {} over {} conns",
                        self.created, self.streams, self.connections
                    ),
                ),
                ("creates/s", fmt_num(self.creates_per_s)),
                ("latency", fmt_latency(&self.latency)),
                ("errors", self.errors.summary()),
                ("server CPU", fmt_cpu(&self.server_cpu)),
            ],
        )
    }

    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if self.created == 0 {
            p.push("create: no stream created".to_owned());
        }
        if !self.errors.is_empty() {
            p.push(format!("create: errors {}", self.errors.summary()));
        }
        p
    }
}

pub async fn run(ep: Arc<Endpoint>, args: &CreateArgs) -> Result<CreateReport> {
    check_positive("streams", args.streams)?;
    check_positive("connections", args.connections)?;
    let run = run_id();
    let conns = args.connections.min(args.streams);
    let cpu = CpuProbe::start(args.server_pid);
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(conns);
    for c in 0..conns {
        let (ep, run, total) = (ep.clone(), run.clone(), args.streams);
        tasks.push(tokio::spawn(async move {
            let mut conn = Conn::new(ep.clone());
            let mut created = 0u64;
            let mut hist = Histogram::new();
            let mut errors = Errors::default();
            for i in (c..total).step_by(conns) {
                let uri = ep.target.stream_uri(&format!("create-{run}-{i}"))?;
                let req = || ep.with_type(Method::PUT, uri.clone(), &OCTET_STREAM, Bytes::new());
                let t0 = Instant::now();
                match tokio::time::timeout(REQUEST_TIMEOUT, conn.send_drain(req)).await {
                    Ok(Ok((parts, _))) if parts.status.is_success() => {
                        created += 1;
                        hist.record(t0.elapsed().as_nanos() as u64);
                    }
                    Ok(Ok((parts, _))) => errors.status(parts.status),
                    Ok(Err(e)) => {
                        errors.add(error_kind(&e));
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Err(_) => {
                        errors.add("timeout");
                        conn.reset();
                    }
                }
            }
            Ok::<_, anyhow::Error>((created, hist, errors))
        }));
    }
    let mut created = 0;
    let mut hist = Histogram::new();
    let mut errors = Errors::default();
    for t in tasks {
        let (n, h, e) = t.await??;
        created += n;
        hist.merge(&h);
        errors.merge(&e);
    }
    let create_s = started.elapsed().as_secs_f64();
    Ok(CreateReport {
        header: Header::new("create", &ep.target),
        streams: args.streams,
        connections: conns,
        created,
        create_s,
        creates_per_s: created as f64 / create_s.max(1e-9),
        latency: hist.latency_us(),
        errors,
        server_cpu: cpu.finish("create", created),
    })
}
