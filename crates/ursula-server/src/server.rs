//! The HTTP/1.1 listener: connection timeouts and graceful shutdown.

use crate::app::App;
use crate::coarse_timer::HyperTimer;
use crate::parse_errors::{Armed, JsonParseErrors};
use crate::send_file::SendFile;
use axum::body::Body;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};

/// How long a shutdown waits for in-flight requests (spec cluster.md §15). Long-polls and
/// SSE streams end with the shutdown signal, so this bounds slow uploads and downloads.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);

/// Serves `listener` with `handler` until `shutdown` resolves, then drains connections.
pub async fn run<H, F>(
    listener: TcpListener,
    app: Arc<App>,
    shutdown: impl Future<Output = ()>,
    handler: H,
) where
    H: Fn(Arc<App>, hyper::Request<Body>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = crate::http::Resp> + Send + 'static,
{
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    app.timer.start();
    let header_timeout = Duration::from_millis(app.cfg.header_timeout_ms);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        set_send_buffer(&stream, app.cfg.send_buffer_bytes);
        let timer = HyperTimer(app.timer.clone());
        let app = app.clone();
        let handler = handler.clone();
        let armed = Armed::default();
        let io = JsonParseErrors::new(SendFile::new(stream), armed.clone());
        let svc = service_fn(move |req: hyper::Request<Incoming>| {
            armed.disarm();
            // Boxed once here, so that hyper moves a pointer, not the handler's state.
            let fut = Box::pin(handler(app.clone(), req.map(Body::new)));
            let armed = armed.clone();
            async move {
                let resp = fut.await;
                // What hyper writes next, after this response, may be its own error answer
                // to the next request (parse_errors.rs).
                armed.arm();
                Ok::<_, Infallible>(resp)
            }
        });
        let conn = http1::Builder::new()
            .timer(timer)
            .header_read_timeout(header_timeout)
            .keep_alive(true)
            .serve_connection(TokioIo::new(io), svc);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    tracing::info!("shutting down: no new connections; finishing in-flight requests");
    let _ = app.shutdown.send(true);
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            drain_s = DRAIN_TIMEOUT.as_secs(),
            "some connections did not finish in time"
        );
    }
}

/// Sets a connection's `SO_SNDBUF` (`send_buffer_bytes`; 0 keeps the kernel's autotuning).
/// The kernel caps it at `net.core.wmem_max`: the first connection reads it back and says
/// so once when the cap applied.
fn set_send_buffer(stream: &TcpStream, bytes: u64) {
    static CHECKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if bytes == 0 {
        return;
    }
    let sock = socket2::SockRef::from(stream);
    if let Err(e) = sock.set_send_buffer_size(bytes as usize) {
        tracing::debug!(error = %e, "could not set the send buffer size");
        return;
    }
    if CHECKED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    // Linux reports twice the value it accepted (the doubled buffer it uses).
    if let Ok(got) = sock.send_buffer_size()
        && (got as u64) < 2 * bytes
    {
        tracing::warn!(
            send_buffer_bytes = bytes,
            granted = got / 2,
            "the kernel capped send_buffer_bytes at net.core.wmem_max; raise that sysctl for \
             the configured size"
        );
    }
}
