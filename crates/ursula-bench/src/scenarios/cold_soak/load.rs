//! The soak's appenders and readers.

use super::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use http::{HeaderValue, Method, StatusCode};
use http_body_util::BodyExt;

use crate::client::{
    Conn, Endpoint, OCTET_STREAM, PRODUCER_EPOCH, PRODUCER_ID, PRODUCER_SEQ, STREAM_NEXT_OFFSET,
    error_kind, header_str, up_to_date,
};
use crate::stats::Errors;
use crate::target::valid_offset;

pub(super) fn retry_after(parts: &http::response::Parts) -> Duration {
    header_str(parts, &http::header::RETRY_AFTER)
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(Duration::from_secs(1), Duration::from_secs)
        .min(MAX_RETRY_AFTER)
}

pub(super) async fn append_loop(
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
                let req = || {
                    let mut req =
                        ep.with_type(Method::POST, st.uri.clone(), &OCTET_STREAM, body.clone());
                    let h = req.headers_mut();
                    h.insert(PRODUCER_ID, st.producer.clone());
                    h.insert(PRODUCER_EPOCH, epoch.clone());
                    h.insert(PRODUCER_SEQ, HeaderValue::from(seq[k]));
                    req
                };
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

pub(super) fn problem(r: &mut ReadResult, text: String) {
    if r.first_problems.len() < 5 {
        r.first_problems.push(text);
    }
}

#[derive(Default)]
pub(super) struct ReadResult {
    pub(super) bytes: u64,
    pub(super) gets: u64,
    pub(super) mismatched: u64,
    pub(super) short: u64,
    pub(super) errors: Errors,
    /// The first few problems, for the log.
    pub(super) first_problems: Vec<String>,
}

pub(super) async fn read_loop(
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
            let uri = ep.target.read_uri(&st.path, &offset, "")?;
            let req = || ep.get(uri.clone());
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
