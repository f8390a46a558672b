//! The gateway's listener: HTTP/1.1 connections served until SIGTERM, then drained for at most
//! `--graceful-shutdown-timeout`.

use crate::answer::{self, Body};
use crate::config::GatewayArgs;
use crate::cors::Cors;
use crate::leaders::Leaders;
use crate::metrics::{Metrics, inc};
use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;

/// What every request shares.
pub struct Gateway {
    pub(crate) args: GatewayArgs,
    pub(crate) client: Client<HttpConnector, Full<Bytes>>,
    pub(crate) leaders: Leaders,
    pub(crate) metrics: Metrics,
    pub(crate) cors: Cors,
    next: AtomicUsize,
}

impl Gateway {
    pub fn new(args: GatewayArgs) -> Arc<Gateway> {
        let mut conn = HttpConnector::new();
        conn.set_connect_timeout(Some(Duration::from_secs(args.connect_timeout.max(1))));
        conn.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .build(conn);
        Arc::new(Gateway {
            cors: Cors::new(&args.cors_allowed_origins),
            args,
            client,
            leaders: Leaders::default(),
            metrics: Metrics::default(),
            next: AtomicUsize::new(0),
        })
    }

    /// The node for a request whose leader is not cached: each in turn.
    pub(crate) fn pick(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        self.args
            .upstreams
            .get(n % self.args.upstreams.len().max(1))
            .cloned()
            .unwrap_or_default()
    }

    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        inc(&self.metrics.requests, 1);
        if req.method() == Method::OPTIONS {
            return self.cors.options(req.headers());
        }
        let origin = req.headers().get(header::ORIGIN).cloned();
        let mut resp = if req.uri().path() == "/__ursula/gateway/metrics" {
            let mut r = Response::new(answer::full(self.metrics.json(self.leaders.len())));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            r
        } else {
            crate::proxy::forward(&self, req).await
        };
        self.cors.apply(origin.as_ref(), resp.headers_mut());
        resp
    }
}

/// Serves `listener` until `shutdown` resolves, then waits for in-flight requests (at most
/// `--graceful-shutdown-timeout`).
pub async fn run(gw: Arc<Gateway>, listener: TcpListener, shutdown: impl Future<Output = ()>) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let gw = Arc::clone(&gw);
        let svc = service_fn(move |req| {
            let gw = Arc::clone(&gw);
            async move { Ok::<_, Infallible>(gw.handle(req).await) }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .keep_alive(true)
            .serve_connection(TokioIo::new(stream), svc);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended");
            }
        });
    }
    let drain = Duration::from_secs(gw.args.graceful_shutdown_timeout);
    tracing::info!(timeout_s = drain.as_secs(), "draining");
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("drain timed out; closing the remaining connections");
    }
}
