//! Scenarios and the pieces they share: run ids, stream setup, the
//! measurement window.

pub mod append;
pub mod cold_soak;
pub mod create;
pub mod fanout;
pub mod idle;
pub mod longpoll;
pub mod mixed;
pub mod read;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use http::{HeaderValue, Uri};

use crate::client::{Conn, Endpoint, create_stream};

/// Unique per process run, so repeated runs against one server never reuse
/// stream names or producer ids.
pub fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{:x}{:x}",
        std::process::id(),
        (nanos as u64) & 0xff_ffff_ffff
    )
}

pub fn stream_names(kind: &str, run: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{kind}-{run}-{i}")).collect()
}

/// Runs `work` once per stream, spreading the streams over `connections` connections (one
/// task and one keep-alive connection each; connection `c` takes streams `c, c + n, ...`).
/// `work` gets the connection back and forth and returns how many requests were rejected
/// (non-2xx); a transport failure is an error. Returns the total rejected.
pub async fn per_connection<F, Fut>(
    ep: &Arc<Endpoint>,
    uris: &[Uri],
    connections: usize,
    work: F,
) -> Result<u64>
where
    F: Fn(Conn, Uri) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<(Conn, u64)>> + Send,
{
    let connections = connections.clamp(1, uris.len().max(1));
    let uris: Arc<[Uri]> = uris.into();
    let mut tasks = Vec::with_capacity(connections);
    for c in 0..connections {
        let mut conn = Conn::new(ep.clone());
        let uris = uris.clone();
        let work = work.clone();
        tasks.push(tokio::spawn(async move {
            let mut rejected = 0u64;
            for uri in uris.iter().skip(c).step_by(connections) {
                let (back, r) = work(conn, uri.clone()).await?;
                conn = back;
                rejected += r;
            }
            Ok::<u64, anyhow::Error>(rejected)
        }));
    }
    let mut rejected = 0;
    for t in tasks {
        rejected += t.await??;
    }
    Ok(rejected)
}

/// Create every stream, spreading the PUTs over `connections` connections.
/// A transport failure is an error; a non-2xx answer is returned as a count.
pub async fn create_streams(
    ep: &Arc<Endpoint>,
    uris: &[Uri],
    content_type: &HeaderValue,
    connections: usize,
) -> Result<u64> {
    let ct = content_type.clone();
    per_connection(ep, uris, connections, move |mut conn, uri| {
        let ct = ct.clone();
        async move {
            let ok = create_stream(&mut conn, &uri, &ct).await?.is_success();
            Ok((conn, u64::from(!ok)))
        }
    })
    .await
}

/// Requests count when they start after warm-up and finish before the end.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    pub start: Instant,
    pub end: Instant,
}

impl Window {
    pub fn new(warmup: Duration, duration: Duration) -> Self {
        let start = Instant::now() + warmup;
        Self {
            start,
            end: start + duration,
        }
    }

    pub fn counts(&self, started: Instant, finished: Instant) -> bool {
        started >= self.start && finished <= self.end
    }

    pub fn in_measurement(&self, started: Instant) -> bool {
        started >= self.start
    }

    pub fn secs(&self) -> f64 {
        (self.end - self.start).as_secs_f64()
    }
}

pub fn check_positive(what: &str, v: usize) -> Result<()> {
    if v == 0 {
        bail!("{what} must be at least 1");
    }
    Ok(())
}

pub fn check_rate(rate: f64) -> Result<()> {
    if !(rate.is_finite() && rate > 0.0 && rate <= 100_000.0) {
        bail!("rate must be in (0, 100000] appends/s");
    }
    Ok(())
}

/// Sleep, but wake early when `stop` flips. Returns true if stopped.
pub async fn sleep_or_stop(d: Duration, stop: &mut tokio::sync::watch::Receiver<bool>) -> bool {
    if *stop.borrow() {
        return true;
    }
    tokio::select! {
        _ = tokio::time::sleep(d) => *stop.borrow(),
        _ = stop.changed() => true,
    }
}

/// Wait until `done()` or the deadline, polling; used after a writer stops
/// to let late deliveries arrive.
pub async fn wait_until(deadline: Instant, mut done: impl FnMut() -> bool) {
    while !done() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What a delivery scenario (fanout, longpoll) reports as wrong with its own run.
pub fn delivery_problems(
    name: &str,
    deliveries: u64,
    missed: u64,
    errors: &crate::stats::Errors,
) -> Vec<String> {
    let mut p = Vec::new();
    if deliveries == 0 {
        p.push(format!("{name}: nothing delivered"));
    }
    if missed > 0 {
        p.push(format!("{name}: {missed} missed deliveries"));
    }
    if !errors.is_empty() {
        p.push(format!("{name}: errors {}", errors.summary()));
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_counts_only_inside() {
        let w = Window::new(Duration::from_secs(1), Duration::from_secs(2));
        assert!((w.secs() - 2.0).abs() < 1e-9);
        assert!(!w.counts(w.start - Duration::from_millis(1), w.start));
        assert!(w.counts(w.start, w.end));
        assert!(!w.counts(w.start, w.end + Duration::from_millis(1)));
        assert!(w.in_measurement(w.start + Duration::from_millis(1)));
    }

    #[test]
    fn names_are_unique_and_url_safe() {
        let run = run_id();
        let names = stream_names("append", &run, 3);
        assert_eq!(names.len(), 3);
        assert_ne!(names[0], names[1]);
        for n in names {
            assert!(n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
        }
    }

    #[test]
    fn argument_checks() {
        assert!(check_positive("streams", 0).is_err());
        assert!(check_positive("streams", 1).is_ok());
        assert!(check_rate(0.0).is_err());
        assert!(check_rate(f64::NAN).is_err());
        assert!(check_rate(50.0).is_ok());
    }
}
