//! The HTTP API: one entry point that answers CORS, routes, and adds the common headers.

pub mod admin;
pub mod admin_raft;
pub mod body;
pub mod bootstrap;
pub mod boundary;
pub mod bucket;
pub mod budget;
pub mod error;
pub mod headers;
pub mod host;
pub mod leader;
pub mod leadership;
pub mod long_poll;
pub mod ops;
pub mod parts;
pub mod path;
pub mod pieces;
pub mod query;
pub mod read;
pub mod record_read;
pub mod render;
pub mod retention;
pub mod snapshot;
pub mod sse;
mod sse_frame;
pub mod write;

use crate::app::App;
use crate::latency::Op;
use crate::metrics::inc;
use axum::body::Body;
use error::ApiError;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use path::{Route, Sub};
use std::sync::Arc;
use std::time::Instant;
use ursula_core::ErrorCode;

pub type Resp = Response<Body>;
pub type ApiResult = Result<Resp, ApiError>;

const ALLOW_STREAM: &str = "GET, HEAD, POST, PUT, DELETE, OPTIONS";
const DEFAULT_ALLOW_HEADERS: &str = "Content-Type, Stream-Seq, Stream-TTL, Stream-Expires-At, \
Stream-Closed, Stream-Forked-From, Stream-Fork-Offset, Stream-Fork-Sub-Offset, Producer-Id, \
Producer-Epoch, Producer-Seq, Stream-Incarnation, Stream-Record-Match, Stream-Attrs, \
Stream-Snapshot-Match, Stream-Snapshot-Parts, Stream-Snapshot-Digest, If-None-Match, Authorization";

/// Answers one request of the client plane. It carries the Raft RPCs too, unless
/// `server.cluster_listen` gives them a listener of their own ([`handle_cluster`]).
pub async fn handle(app: Arc<App>, req: Request<Body>) -> Resp {
    if app.cfg.server.cluster_listen.is_none() && crate::cluster::is_raft_path(req.uri().path()) {
        return Box::pin(crate::cluster::serve_raft(&app, req)).await;
    }
    if req.uri().path() == crate::probe::PATH && app.cfg.server.cluster_listen.is_none() {
        return Box::pin(crate::probe::serve(req)).await;
    }
    serve(app, req).await
}

/// Answers one request on `server.cluster_listen`: the Raft RPCs, and every client route (a
/// peer URL is also where clients are redirected to).
pub async fn handle_cluster(app: Arc<App>, req: Request<Body>) -> Resp {
    if crate::cluster::is_raft_path(req.uri().path()) {
        return Box::pin(crate::cluster::serve_raft(&app, req)).await;
    }
    if req.uri().path() == crate::probe::PATH {
        return Box::pin(crate::probe::serve(req)).await;
    }
    serve(app, req).await
}

async fn serve(app: Arc<App>, req: Request<Body>) -> Resp {
    inc(&app.metrics.requests, 1);
    let started = Instant::now();
    let origin = req.headers().get(header::ORIGIN).cloned();
    let mut timed = None;
    let mut resp = if let Err(e) = host::check(&app, &req) {
        error::render(e)
    } else if req.method() == Method::OPTIONS {
        options(&app, &req, origin.as_ref())
    } else {
        match dispatch(&app, req, &mut timed).await {
            Ok(r) => r,
            Err(e) => error::render(e),
        }
    };
    let status = resp.status();
    app.latency.answered(status);
    if let Some((op, group)) = timed {
        app.latency.observe(op, group, started.elapsed());
    }
    if status.is_client_error() {
        inc(&app.metrics.errors_4xx, 1);
    } else if status.is_server_error() {
        inc(&app.metrics.errors_5xx, 1);
    }
    common_headers(&app, &mut resp, origin.as_ref());
    resp
}

fn allowed_origin(app: &App, origin: Option<&HeaderValue>) -> Option<HeaderValue> {
    let origin = origin?;
    let list = &app.cfg.cors_allowed_origins;
    if list.iter().any(|o| o == "*") {
        return Some(HeaderValue::from_static("*"));
    }
    let o = origin.to_str().ok()?;
    list.iter().any(|a| a == o).then(|| origin.clone())
}

pub fn common_headers(app: &App, resp: &mut Resp, origin: Option<&HeaderValue>) {
    let hm = resp.headers_mut();
    hm.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    hm.insert(
        &headers::CROSS_ORIGIN_RESOURCE_POLICY,
        HeaderValue::from_static("cross-origin"),
    );
    if !hm.contains_key(header::CACHE_CONTROL) {
        hm.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    if let Some(allow) = allowed_origin(app, origin) {
        if allow != "*" {
            hm.append(header::VARY, HeaderValue::from_static("Origin"));
        }
        hm.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow);
        hm.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static("*"),
        );
    }
}

fn options(app: &App, req: &Request<Body>, origin: Option<&HeaderValue>) -> Resp {
    let mut resp = Response::new(Body::empty());
    *resp.status_mut() = StatusCode::NO_CONTENT;
    let hm = resp.headers_mut();
    if req
        .headers()
        .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
    {
        if allowed_origin(app, origin).is_some() {
            hm.insert(
                header::ACCESS_CONTROL_ALLOW_METHODS,
                HeaderValue::from_static(ALLOW_STREAM),
            );
            let allow_headers = req
                .headers()
                .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
                .cloned()
                .unwrap_or(HeaderValue::from_static(DEFAULT_ALLOW_HEADERS));
            hm.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, allow_headers);
            hm.insert(
                header::ACCESS_CONTROL_MAX_AGE,
                HeaderValue::from_static("600"),
            );
        }
    } else {
        hm.insert(header::ALLOW, HeaderValue::from_static(ALLOW_STREAM));
    }
    resp
}

pub fn method_not_allowed(allow: &'static str) -> ApiError {
    let mut e = ApiError::new(
        ErrorCode::METHOD_NOT_ALLOWED,
        "method not allowed on this route",
    );
    e.allow = Some(allow);
    e
}

pub fn not_found() -> ApiError {
    ApiError::new(ErrorCode::NOT_FOUND, "not found")
}

/// Routes `req`; `timed` learns what it is and in which group, unless it is not timed (a
/// live read, an operational route).
async fn dispatch(
    app: &Arc<App>,
    req: Request<Body>,
    timed: &mut Option<(Op, Option<u32>)>,
) -> ApiResult {
    let route = path::route(req.uri().path())?;
    *timed = timed_op(app, req.method(), &route, req.uri().query());
    if let Route::Stream(target, sub) = &route {
        match leader::gate(app, target, sub.as_ref(), &req) {
            leader::Gate::Lead => {}
            leader::Gate::LeadRead(group) => {
                if let Some(r) = Box::pin(leader::confirm_leader_read(app, group, req.uri())).await
                {
                    return Ok(r);
                }
            }
            leader::Gate::Answer(r) => {
                Box::pin(leader::discard_body(app, req)).await;
                return Ok(r);
            }
            leader::Gate::FollowerRead(group) => {
                let uri = req.uri().clone();
                return Ok(match route_request(app, route, req).await {
                    Ok(resp) => leader::after_follower_read(app, group, &uri, resp),
                    // An error on a replica (a stream it has not applied yet) is the leader's
                    // to answer.
                    Err(_) => leader::redirect(app, group, &uri),
                });
            }
        }
    }
    route_request(app, route, req).await
}

/// What a request to `route` is, for the latency histograms (`crate::latency`), and the
/// group of its stream.
fn timed_op(
    app: &App,
    method: &Method,
    route: &Route,
    query: Option<&str>,
) -> Option<(Op, Option<u32>)> {
    let read = method == Method::GET || method == Method::HEAD;
    let op = |read_op| if read { read_op } else { Op::Mutation };
    match route {
        Route::Stream(target, sub) => {
            let group = Some(app.group_of(&target.key));
            let op = match sub {
                None if method == Method::POST => Op::Append,
                None if read && query::is_live(query) => return None,
                None | Some(Sub::Bootstrap | Sub::Snapshot(_) | Sub::Retention(_)) => op(Op::Read),
                Some(Sub::Attrs | Sub::AppendBatch) => return None,
            };
            Some((op, group))
        }
        Route::Bucket(_) | Route::List(_) => Some((op(Op::Read), None)),
        Route::Ops(_) | Route::NotFound => None,
    }
}

/// Every route but the append is boxed: an async fn's future is as large as its largest
/// state, and each layer above it (and hyper) moves it by value, so inline routes of a few
/// KiB each made every request copy kilobytes several times (callgrind: a quarter of an
/// append's instructions were `memcpy`). The append, the hot path, stays inline and small.
async fn route_request(app: &Arc<App>, route: Route, req: Request<Body>) -> ApiResult {
    let method = req.method().clone();
    match route {
        Route::NotFound => Err(not_found()),
        Route::Ops(segs) => Box::pin(ops::handle(app, &method, &segs)).await,
        Route::Bucket(bucket) => match method {
            Method::PUT => Box::pin(bucket::create(app, &bucket)).await,
            Method::GET | Method::HEAD => bucket::info(app, &bucket),
            Method::DELETE => Box::pin(bucket::delete(app, &bucket)).await,
            _ => Err(method_not_allowed("GET, HEAD, PUT, DELETE, OPTIONS")),
        },
        Route::List(bucket) => match method {
            Method::GET | Method::HEAD => bucket::list(app, &bucket, req.uri().query()),
            // Any other method addresses a stream named `streams`, a reserved ID (seed 003).
            _ => Err(ApiError::new(
                ErrorCode::INVALID_STREAM_ID,
                "stream id \"streams\" is reserved",
            )),
        },
        Route::Stream(target, None) => match method {
            Method::PUT => Box::pin(write::create(app, &target, req)).await,
            Method::POST => write::append(app, target, req).await,
            Method::DELETE => Box::pin(write::delete(app, &target, req.headers())).await,
            Method::GET => Box::pin(read::get(app, &target, req)).await,
            Method::HEAD => read::head(app, &target, req.headers()),
            _ => Err(method_not_allowed(ALLOW_STREAM)),
        },
        Route::Stream(target, Some(Sub::Snapshot(rest))) => {
            Box::pin(snapshot::handle(app, &target, &rest, req)).await
        }
        Route::Stream(target, Some(Sub::Retention(rest))) => {
            Box::pin(retention::handle(app, &target, &rest, req)).await
        }
        Route::Stream(target, Some(Sub::Bootstrap)) => match method {
            Method::GET => Box::pin(bootstrap::get(app, &target, req.uri().query(), true)).await,
            Method::HEAD => Box::pin(bootstrap::get(app, &target, req.uri().query(), false)).await,
            _ => Err(method_not_allowed("GET, HEAD, OPTIONS")),
        },
        Route::Stream(_, Some(Sub::Attrs | Sub::AppendBatch)) => Err(not_found()),
    }
}
