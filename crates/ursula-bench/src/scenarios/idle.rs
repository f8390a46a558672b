//! `idle`: create K streams with one small append each, then report the
//! server's resident memory per stream (VmRSS before and after).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use bytes::Bytes;
use http::Method;
use serde::Serialize;

use super::{check_positive, run_id};
use crate::cli::IdleArgs;
use crate::client::{Conn, Endpoint, TEXT_PLAIN, create_stream, error_kind};
use crate::procfs::rss_kib;
use crate::report::{Header, fmt_num, kv_table};
use crate::stats::Errors;

const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Serialize)]
pub struct IdleReport {
    #[serde(flatten)]
    pub header: Header,
    pub streams: usize,
    pub created: u64,
    pub body_size: usize,
    pub create_s: f64,
    pub creates_per_s: f64,
    pub server_pid: Option<u32>,
    pub rss_before_kib: Option<u64>,
    pub rss_after_kib: Option<u64>,
    pub rss_per_stream_bytes: Option<f64>,
    pub errors: Errors,
}

impl IdleReport {
    pub fn table(&self) -> String {
        let kib =
            |v: Option<u64>| v.map_or("n/a (no --server-pid)".to_owned(), |v| format!("{v} KiB"));
        kv_table(
            "idle",
            &[
                ("target", self.header.target.clone()),
                (
                    "streams created",
                    format!("{} of {}", self.created, self.streams),
                ),
                ("creates/s (PUT+POST)", fmt_num(self.creates_per_s)),
                ("RSS before", kib(self.rss_before_kib)),
                ("RSS after", kib(self.rss_after_kib)),
                (
                    "RSS per stream",
                    self.rss_per_stream_bytes
                        .map_or("n/a".to_owned(), |b| format!("{b:.0} B")),
                ),
                ("errors", self.errors.summary()),
            ],
        )
    }

    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if self.created == 0 {
            p.push("idle: no stream created".to_owned());
        }
        if !self.errors.is_empty() {
            p.push(format!("idle: errors {}", self.errors.summary()));
        }
        p
    }
}

pub async fn run(ep: Arc<Endpoint>, args: &IdleArgs) -> Result<IdleReport> {
    check_positive("streams", args.streams)?;
    check_positive("connections", args.connections)?;
    check_positive("body size", args.body_size)?;
    let rss_before = args.server_pid.map(rss_kib).transpose()?;
    let run = run_id();
    let body = Bytes::from(vec![b'i'; args.body_size]);
    let conns = args.connections.min(args.streams);
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(conns);
    for c in 0..conns {
        let (ep, run, body, total) = (ep.clone(), run.clone(), body.clone(), args.streams);
        tasks.push(tokio::spawn(async move {
            let mut conn = Conn::new(ep.clone());
            let mut created = 0u64;
            let mut errors = Errors::default();
            for i in (c..total).step_by(conns) {
                let uri = ep.target.stream_uri(&format!("idle-{run}-{i}"))?;
                let status = create_stream(&mut conn, &uri, &TEXT_PLAIN).await?;
                if !status.is_success() {
                    errors.add(&format!("create_{}", status.as_str()));
                    continue;
                }
                let req = || ep.with_type(Method::POST, uri.clone(), &TEXT_PLAIN, body.clone());
                match tokio::time::timeout(REQUEST_TIMEOUT, conn.send_drain(req)).await {
                    Ok(Ok((parts, _))) if parts.status.is_success() => created += 1,
                    Ok(Ok((parts, _))) => errors.add(&format!("append_{}", parts.status.as_str())),
                    Ok(Err(e)) => errors.add(error_kind(&e)),
                    Err(_) => {
                        errors.add("timeout");
                        conn.reset();
                    }
                }
            }
            Ok::<_, anyhow::Error>((created, errors))
        }));
    }
    let mut created = 0;
    let mut errors = Errors::default();
    for t in tasks {
        let (n, e) = t.await??;
        created += n;
        errors.merge(&e);
    }
    let create_s = started.elapsed().as_secs_f64();
    if args.server_pid.is_some() {
        tokio::time::sleep(args.settle).await;
    }
    let rss_after = args.server_pid.map(rss_kib).transpose()?;
    let per_stream = match (rss_before, rss_after) {
        (Some(b), Some(a)) if created > 0 => Some((a as f64 - b as f64) * 1024.0 / created as f64),
        _ => None,
    };
    Ok(IdleReport {
        header: Header::new("idle", &ep.target),
        streams: args.streams,
        created,
        body_size: args.body_size,
        create_s,
        creates_per_s: created as f64 / create_s.max(1e-9),
        server_pid: args.server_pid,
        rss_before_kib: rss_before,
        rss_after_kib: rss_after,
        rss_per_stream_bytes: per_stream,
        errors,
    })
}
