//! The gateway's listener: HTTP/1.1 connections served until SIGTERM, then drained for at most
//! `--graceful-shutdown-timeout`.

use crate::answer::{self, Body};
use crate::auth::{Auth, Refused};
use crate::config::GatewayArgs;
use crate::cors::Cors;
use crate::leaders::Leaders;
use crate::metrics::{Metrics, inc};
use crate::policy::Policy;
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
use ursula_http::{Armed, JsonParseErrors};

/// What every request shares.
pub struct Gateway {
    pub(crate) args: GatewayArgs,
    pub(crate) client: Client<HttpConnector, Full<Bytes>>,
    pub(crate) leaders: Leaders,
    pub(crate) metrics: Metrics,
    pub(crate) cors: Cors,
    /// Access control, with `--auth-issuer`.
    access: Option<(Auth, Policy)>,
    /// Admission limits, with `--quota-policy`.
    quotas: Option<crate::quota::Quotas>,
    /// Usage metering, with `--usage-log`.
    usage: Option<Arc<crate::usage::Usage>>,
    next: AtomicUsize,
}

/// What the gateway decided to do with a request it forwards.
#[derive(Default)]
pub(crate) struct Admitted {
    /// Access control is on: the client's `Authorization` is the gateway's, never a node's.
    pub strip_authorization: bool,
    /// A live read authorized by a credential: its SSE answer ends at this `exp`.
    pub expires_at: Option<u64>,
    /// The tenant's body cap, under the gateway's own.
    pub body_cap: Option<u64>,
    /// The tenant's live-read slot, held until the answer ends.
    pub slot: Option<crate::quota::Slot>,
    /// Where the request and its answer's bytes are counted (`--usage-log`).
    pub usage: Option<(Arc<crate::usage::Usage>, crate::usage::Key)>,
    /// The gateway's own address on the client's connection: the origin of a rewritten
    /// `Location` when the client sent no `Host` (HTTP/1.0).
    pub listening: Option<std::net::SocketAddr>,
}

impl Gateway {
    /// Fails on an unreadable or invalid policy file.
    pub fn new(args: GatewayArgs) -> Result<Arc<Gateway>, String> {
        let access = match (&args.auth_issuer, &args.auth_audience, &args.auth_policy) {
            (Some(iss), Some(aud), Some(policy)) => Some((
                Auth::new(iss.clone(), aud.clone(), args.auth_jwks_url.clone())?,
                Policy::load(policy)?,
            )),
            (None, ..) => None,
            _ => return Err("--auth-issuer needs --auth-audience and --auth-policy".to_owned()),
        };
        let quotas = match &args.quota_policy {
            Some(_) if access.is_none() => {
                return Err("--quota-policy needs access control (--auth-issuer)".to_owned());
            }
            Some(p) => Some(crate::quota::Quotas::load(p)?),
            None => None,
        };
        let usage = match &args.usage_log {
            Some(_) if access.is_none() => {
                return Err("--usage-log needs access control (--auth-issuer)".to_owned());
            }
            Some(p) => Some(Arc::new(crate::usage::Usage::new(
                p.clone(),
                args.usage_chunk_bytes,
            ))),
            None => None,
        };
        let mut conn = HttpConnector::new();
        conn.set_connect_timeout(Some(Duration::from_secs(args.connect_timeout.max(1))));
        conn.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .build(conn);
        Ok(Arc::new(Gateway {
            cors: Cors::new(&args.cors_allowed_origins),
            args,
            client,
            leaders: Leaders::default(),
            metrics: Metrics::default(),
            access,
            quotas,
            usage,
            next: AtomicUsize::new(0),
        }))
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

    async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        listening: Option<std::net::SocketAddr>,
    ) -> Response<Body> {
        inc(&self.metrics.requests, 1);
        if req.method() == Method::OPTIONS {
            return self.cors.options(req.headers());
        }
        let origin = req.headers().get(header::ORIGIN).cloned();
        // With access control, `/__ursula/*` is concealed like any refused path (cluster.md
        // §9): the metrics are then read on `--metrics-listen`.
        let mut resp = if self.access.is_none() && req.uri().path() == METRICS_PATH {
            self.metrics_answer()
        } else {
            self.admit(req, listening).await
        };
        self.cors.apply(origin.as_ref(), resp.headers_mut());
        resp
    }
}

/// Where the gateway's metrics are served (cluster.md §12.9).
const METRICS_PATH: &str = "/__ursula/gateway/metrics";

impl Gateway {
    fn metrics_answer(&self) -> Response<Body> {
        let mut r = Response::new(answer::full(self.metrics.json(self.leaders.len())));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        r
    }

    /// The `--metrics-listen` listener's one route.
    async fn handle_metrics(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        if req.method() == Method::GET && req.uri().path() == METRICS_PATH {
            self.metrics_answer()
        } else {
            answer::error(http::StatusCode::NOT_FOUND, "NOT_FOUND", "not found")
        }
    }

    /// Forwards `req` if its credential and the bucket policy allow it (cluster.md §12.3,
    /// §12.4); without access control, always.
    async fn admit(
        &self,
        req: Request<Incoming>,
        listening: Option<std::net::SocketAddr>,
    ) -> Response<Body> {
        let Some((auth, policy)) = &self.access else {
            let admitted = Admitted {
                listening,
                ..Admitted::default()
            };
            return crate::proxy::forward(self, req, admitted).await;
        };
        let credential = match crate::auth::bearer(req.headers()) {
            Ok(None) => None,
            Ok(Some(token)) => match auth.verify(token).await {
                Ok(c) => Some(c),
                Err(r) => return refused(r),
            },
            Err(r) => return refused(r),
        };
        let what = crate::classify::classify(req.method(), req.uri().path(), req.uri().query());
        let who = credential.as_ref().map(|c| &c.principal);
        let Some(what) = what.filter(|w| policy.allows(&w.bucket, w.read_only, who)) else {
            // The same answer as a missing resource, byte for byte, whatever was refused.
            return answer::error(http::StatusCode::NOT_FOUND, "NOT_FOUND", "not found");
        };
        let usage = self.usage.as_ref().map(|u| {
            let key = crate::usage::Key {
                bucket: what.bucket.clone(),
                principal: credential.as_ref().map(|c| c.principal.clone()),
                class: what.class,
            };
            (Arc::clone(u), key)
        });
        let mut admitted = Admitted {
            strip_authorization: true,
            expires_at: credential.filter(|_| what.live).map(|c| c.expires_at),
            usage,
            listening,
            ..Admitted::default()
        };
        if let Some(q) = &self.quotas {
            let over = q
                .take(&what.bucket, std::time::Instant::now())
                .and_then(|()| {
                    admitted.slot = if what.live {
                        q.live_read(&what.bucket)?
                    } else {
                        None
                    };
                    Ok(())
                });
            if let Err(over) = over {
                return limited(over);
            }
            admitted.body_cap = q.limits(&what.bucket).max_request_body_bytes;
        }
        crate::proxy::forward(self, req, admitted).await
    }
}

fn limited(over: crate::quota::Over) -> Response<Body> {
    use crate::quota::Over;
    let status = http::StatusCode::TOO_MANY_REQUESTS;
    match over {
        Over::Rate { retry_after_s } => {
            let mut r = answer::error(
                status,
                "RATE_LIMITED",
                "this bucket's request rate at this gateway is exhausted; retry after Retry-After",
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_s));
            r
        }
        Over::LiveReads => answer::error(
            status,
            "LIVE_READS_EXHAUSTED",
            "this bucket holds as many live reads at this gateway as it may",
        ),
    }
}

fn refused(r: Refused) -> Response<Body> {
    match r {
        Refused::Invalid(why) => {
            let mut resp = answer::error(http::StatusCode::UNAUTHORIZED, "UNAUTHORIZED", &why);
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer error=\"invalid_token\""),
            );
            resp
        }
        Refused::Unavailable(why) => {
            tracing::warn!(error = %why, "the issuer's keys could not be fetched");
            answer::error(
                http::StatusCode::SERVICE_UNAVAILABLE,
                "AUTH_UNAVAILABLE",
                "the access token could not be checked (the issuer's keys are unavailable)",
            )
        }
    }
}

/// Serves `listener` until `shutdown` resolves, then waits for in-flight requests (at most
/// `--graceful-shutdown-timeout`).
pub async fn run(gw: Arc<Gateway>, listener: TcpListener, shutdown: impl Future<Output = ()>) {
    run_with_metrics(gw, listener, None, shutdown).await;
}

/// [`run`], with the metrics also served on `metrics` (`--metrics-listen`) until `shutdown`.
pub async fn run_with_metrics(
    gw: Arc<Gateway>,
    listener: TcpListener,
    metrics: Option<TcpListener>,
    shutdown: impl Future<Output = ()>,
) {
    let metrics = metrics.map(|l| tokio::spawn(serve_metrics(Arc::clone(&gw), l)));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let flusher = gw.usage.clone().map(|u| {
        let every = Duration::from_secs(gw.args.usage_flush_secs.max(1));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            loop {
                tick.tick().await;
                let u = Arc::clone(&u);
                let _ = tokio::task::spawn_blocking(move || u.flush()).await;
            }
        })
    });
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
        let head_timeout = Duration::from_secs(gw.args.client_timeout.max(1));
        let gw = Arc::clone(&gw);
        // hyper's own answers to requests it cannot parse get the JSON error body (OQ-32),
        // as on a node: armed while no request is in the service.
        let armed = Armed::default();
        let local = stream.local_addr().ok();
        let io = JsonParseErrors::new(stream, armed.clone());
        let svc = service_fn(move |req: Request<Incoming>| {
            armed.disarm();
            let gw = Arc::clone(&gw);
            let armed = armed.clone();
            async move {
                let resp = gw.handle(req, local).await;
                armed.arm();
                Ok::<_, Infallible>(resp)
            }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(head_timeout)
            .keep_alive(true)
            .serve_connection(TokioIo::new(io), svc);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended");
            }
        });
    }
    // New connections are refused from now on; those open finish what they carry.
    drop(listener);
    let drain = Duration::from_secs(gw.args.graceful_shutdown_timeout);
    tracing::info!(timeout_s = drain.as_secs(), "draining");
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("drain timed out; closing the remaining connections");
    }
    if let Some(m) = metrics {
        m.abort();
    }
    // The last window's usage is written before the process ends.
    if let (Some(f), Some(u)) = (flusher, gw.usage.clone()) {
        f.abort();
        let _ = tokio::task::spawn_blocking(move || u.flush()).await;
    }
}

/// Serves `listener` with the gateway's metrics only, until aborted.
async fn serve_metrics(gw: Arc<Gateway>, listener: TcpListener) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let gw = Arc::clone(&gw);
        let svc = service_fn(move |req| {
            let gw = Arc::clone(&gw);
            async move { Ok::<_, Infallible>(gw.handle_metrics(req).await) }
        });
        tokio::spawn(
            hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc),
        );
    }
}
