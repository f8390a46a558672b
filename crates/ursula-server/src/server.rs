//! The HTTP/1.1 listener: connection timeouts and graceful shutdown. Each connection starts
//! on the server's own loop (`h1`), which hands it to hyper for anything but plain writes.

use crate::app::App;
use crate::coarse_timer::HyperTimer;
use crate::send_file::SendFile;
use axum::body::Body;
use bytes::Bytes;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::Watcher;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use ursula_http::{Armed, JsonParseErrors};

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
    set_send_buffer(&listener, app.cfg.send_buffer_bytes);
    ursula_http::congestion::set(&listener, &app.cfg.tcp_congestion);
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
        let conn = Accepted {
            app: app.clone(),
            handler: handler.clone(),
            watcher: graceful.watcher(),
            peer,
        };
        if app.cfg.http1_own_path {
            tokio::spawn(crate::h1::serve(stream, conn));
        } else {
            tokio::spawn(conn.serve_hyper(stream, Bytes::new()));
        }
    }
    tracing::info!("shutting down: no new connections; finishing in-flight requests");
    let _ = app.shutdown.send(true);
    // Live readers (long-polls, SSE) wait on their stream's watch alone: this wakes them.
    app.watchers.stop_all();
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

/// An accepted connection: what serves it, and its watcher for a graceful shutdown (which
/// waits until every watcher is dropped).
pub struct Accepted<H> {
    pub app: Arc<App>,
    pub handler: H,
    pub watcher: Watcher,
    pub peer: SocketAddr,
}

impl<H, F> Accepted<H>
where
    H: Fn(Arc<App>, hyper::Request<Body>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = crate::http::Resp> + Send + 'static,
{
    /// hyper serves the connection from here on; `prefix` is what was read from it already.
    pub async fn serve_hyper(self, stream: TcpStream, prefix: Bytes) {
        let Accepted {
            app,
            handler,
            watcher,
            peer,
        } = self;
        let timer = HyperTimer(app.timer.clone());
        let header_timeout = Duration::from_millis(app.cfg.header_timeout_ms);
        let app_shutdown = app.shutdown.subscribe();
        let armed = Armed::default();
        let io = JsonParseErrors::new(SendFile::with_prefix(stream, prefix), armed.clone());
        let svc = service_fn(move |req: hyper::Request<Incoming>| {
            armed.disarm();
            // Boxed once here, so that hyper moves a pointer, not the handler's state.
            let fut = Box::pin(handler(app.clone(), req.map(Body::new)));
            let armed = armed.clone();
            async move {
                let resp = fut.await;
                // What hyper writes next, after this response, may be its own error answer
                // to the next request (ursula_http::parse_errors).
                armed.arm();
                Ok::<_, Infallible>(resp)
            }
        });
        let conn = http1::Builder::new()
            .timer(timer)
            .header_read_timeout(header_timeout)
            .keep_alive(true)
            .serve_connection(TokioIo::new(io), svc);
        // The drain (`GracefulShutdown::shutdown`) waits until every watcher is dropped: this
        // one lives as long as the connection. hyper is told to stop on the node's own signal,
        // and only after its first poll: a request the h1 loop already took off the socket
        // sits in `SendFile`'s prefix, not in hyper's buffer, and hyper would otherwise see an
        // idle connection and close it unanswered.
        let _held = watcher;
        let mut stop = app_shutdown;
        let mut conn = std::pin::pin!(conn);
        let res = tokio::select! {
            biased;
            r = conn.as_mut() => r,
            () = async { drop(stop.wait_for(|stopping| *stopping).await) } => {
                conn.as_mut().graceful_shutdown();
                conn.await
            }
        };
        if let Err(e) = res {
            tracing::debug!(%peer, error = %e, "connection ended with an error");
        }
    }
}

/// Sets the listener's `SO_SNDBUF` (`send_buffer_bytes`; 0 keeps the kernel's autotuning):
/// Linux gives an accepted connection its listener's buffer, so this is one call at start-up,
/// not one per connection. The kernel caps the value at `net.core.wmem_max`; a cap is logged.
fn set_send_buffer(listener: &TcpListener, bytes: u64) {
    if bytes == 0 {
        return;
    }
    let sock = socket2::SockRef::from(listener);
    if let Err(e) = sock.set_send_buffer_size(bytes as usize) {
        tracing::warn!(error = %e, send_buffer_bytes = bytes, "could not set the send buffer size");
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The send buffer of a connection accepted on `listener`.
    async fn accepted_send_buffer(listener: &TcpListener) -> usize {
        let addr = listener.local_addr().expect("addr");
        let (accepted, _client) =
            tokio::join!(listener.accept(), tokio::net::TcpStream::connect(addr));
        let (sock, _) = accepted.expect("accept");
        socket2::SockRef::from(&sock)
            .send_buffer_size()
            .expect("SO_SNDBUF")
    }

    #[tokio::test]
    async fn accepted_connections_get_the_configured_send_buffer() {
        let configured = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        set_send_buffer(&configured, 128 << 10);
        let autotuned = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        set_send_buffer(&autotuned, 0);
        let want = socket2::SockRef::from(&configured)
            .send_buffer_size()
            .expect("SO_SNDBUF");
        let got = accepted_send_buffer(&configured).await;
        assert_eq!(
            got, want,
            "an accepted connection inherits its listener's buffer"
        );
        assert_ne!(
            accepted_send_buffer(&autotuned).await,
            want,
            "without the setting the kernel's default applies"
        );
    }
}
