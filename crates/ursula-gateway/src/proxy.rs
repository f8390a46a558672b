//! One request through the gateway (cluster.md §12.2): its body is buffered (to replay it
//! after a redirect), it goes to the cached leader of its stream or else to the next node,
//! a node's `307` to its group's leader is followed here, and the answer is streamed back
//! with no node address in it.

use crate::answer::{self, Body};
use crate::headers;
use crate::leaders::key_of;
use crate::metrics::inc;
use crate::serve::{Admitted, Gateway};
use http::header::{self, HeaderMap, HeaderValue};
use http::request::Parts;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use std::time::{Duration, Instant};

/// Redirects followed for one request: a leadership that moves more often than this while
/// one request is routed is answered `503` (retry).
const MAX_HOPS: usize = 4;

/// Sends `req` to the node that answers for it and returns that node's answer.
pub async fn forward(gw: &Gateway, req: Request<Incoming>, admitted: Admitted) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let tenant_cap = admitted.body_cap.unwrap_or(u64::MAX);
    let limit = if single_snapshot_publish(&parts) {
        gw.args.max_snapshot_request_body_bytes
    } else {
        gw.args.max_request_body_bytes
    }
    .min(tenant_cap);
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return answer::too_large(limit);
    }
    let cap = usize::try_from(limit).unwrap_or(usize::MAX);
    let within = Duration::from_secs(gw.args.client_timeout.max(1));
    let Ok(body) = tokio::time::timeout(within, Limited::new(body, cap).collect()).await else {
        return answer::error(
            StatusCode::REQUEST_TIMEOUT,
            "REQUEST_TIMEOUT",
            &format!(
                "the request body did not arrive within {} s",
                within.as_secs()
            ),
        );
    };
    let body = match body {
        Ok(b) => b.to_bytes(),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            return answer::too_large(limit);
        }
        Err(e) => {
            return answer::error(
                StatusCode::BAD_REQUEST,
                "MALFORMED_REQUEST",
                &format!("the request body could not be read: {e}"),
            );
        }
    };
    if let Some((usage, key)) = &admitted.usage {
        usage.request(key, body.len() as u64);
    }
    let key = key_of(parts.uri.path(), gw.args.raft_group_count);
    let mut upstream_headers = headers::upstream_request(&parts.headers);
    if admitted.strip_authorization {
        upstream_headers.remove(header::AUTHORIZATION);
    }
    let cached = key.as_deref().and_then(|k| gw.leaders.get(k));
    if key.is_some() {
        let c = match cached {
            Some(_) => &gw.metrics.leader_cache_hits,
            None => &gw.metrics.leader_cache_misses,
        };
        inc(c, 1);
    }
    let mut origin = cached.unwrap_or_else(|| gw.pick());
    let mut target = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let timeout = header_timeout(gw, &parts);
    for hop in 0..=MAX_HOPS {
        let started = Instant::now();
        let mut up = Request::new(Full::new(body.clone()));
        *up.method_mut() = parts.method.clone();
        *up.headers_mut() = upstream_headers.clone();
        *up.uri_mut() = match format!("{origin}{target}").parse() {
            Ok(u) => u,
            Err(_) => return answer::upstream_failed("a node redirected to an invalid URL"),
        };
        let resp = match tokio::time::timeout(timeout, gw.client.request(up)).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                forget(gw, key.as_deref(), &origin);
                tracing::debug!(%origin, error = %e, "upstream failed");
                return answer::upstream_failed(&format!("a node did not answer: {e}"));
            }
            Err(_) => {
                forget(gw, key.as_deref(), &origin);
                return answer::upstream_failed(&format!(
                    "a node sent no answer headers within {} s",
                    timeout.as_secs()
                ));
            }
        };
        let to_leader = resp.status() == StatusCode::TEMPORARY_REDIRECT
            && resp.headers().contains_key("x-ursula-raft-leader-id");
        if to_leader {
            let location = resp
                .headers()
                .get(header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|l| Some((headers::origin_of(l)?, headers::path_of(l))));
            let Some((leader, path)) = location else {
                return answer::upstream_failed("a node redirected without a leader URL");
            };
            if hop == MAX_HOPS {
                break;
            }
            inc(&gw.metrics.leader_redirects, 1);
            let ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
            inc(&gw.metrics.leader_redirect_ns, ns);
            if let Some(k) = &key {
                if gw.leaders.put(k, leader) {
                    inc(&gw.metrics.leader_cache_evictions, 1);
                }
                inc(&gw.metrics.leader_cache_updates, 1);
            }
            (origin, target) = (leader.to_owned(), path.to_owned());
            continue;
        }
        if resp.status() == StatusCode::SERVICE_UNAVAILABLE
            && resp.headers().contains_key(header::RETRY_AFTER)
        {
            forget(gw, key.as_deref(), &origin);
        }
        let client = (&parts.headers, admitted.listening);
        let resp = answer(gw, resp, &origin, client, &upstream_headers, tenant_cap);
        let resp = match admitted.usage {
            Some((usage, key)) => {
                let (parts, body) = resp.into_parts();
                Response::from_parts(parts, usage.metered(key, body))
            }
            None => resp,
        };
        let resp = match admitted.expires_at {
            Some(exp) if is_event_stream(resp.headers()) => {
                let (parts, body) = resp.into_parts();
                Response::from_parts(parts, crate::expiry::until(body, exp))
            }
            _ => resp,
        };
        return match admitted.slot {
            Some(slot) => {
                let (parts, body) = resp.into_parts();
                let held = crate::quota::Held { body, _slot: slot };
                Response::from_parts(parts, BodyExt::boxed_unsync(held))
            }
            None => resp,
        };
    }
    let mut r = answer::error(
        StatusCode::SERVICE_UNAVAILABLE,
        "LEADER_UNAVAILABLE",
        "the stream's leadership moved while the request was routed; retry",
    );
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

/// Forgets `key`'s cached leader if it is `origin` (it failed or stepped down).
fn forget(gw: &Gateway, key: Option<&str>, origin: &str) {
    if let Some(k) = key
        && gw.leaders.evict(k, origin)
    {
        inc(&gw.metrics.leader_cache_evictions, 1);
    }
}

/// The node's answer as the client gets it: hop-by-hop headers dropped, every `Location`
/// naming the gateway (a redirect's as a path, a create's with the client's origin: its `Host`,
/// else the gateway address it connected to, `listening`), limits
/// capped to the gateway's; the body streams through.
fn answer(
    gw: &Gateway,
    resp: Response<Incoming>,
    origin: &str,
    (client, listening): (&HeaderMap, Option<std::net::SocketAddr>),
    sent: &HeaderMap,
    tenant_cap: u64,
) -> Response<Body> {
    let (mut parts, body) = resp.into_parts();
    ursula_http::strip_hop_by_hop(&mut parts.headers);
    let location = parts
        .headers
        .get(header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|l| Some((headers::origin_of(l)?, headers::path_of(l).to_owned())));
    if let Some((at, path)) = location {
        let node = at == origin || gw.args.upstreams.iter().any(|u| u == at);
        let rewritten = if parts.status.is_redirection() {
            Some(path)
        } else if node && matches!(parts.status, StatusCode::OK | StatusCode::CREATED) {
            let proto = sent
                .get("x-forwarded-proto")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("http");
            // The client's `Host`, else the address it reached the gateway on.
            let host = client
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(str::to_owned)
                .or_else(|| listening.map(|at| at.to_string()));
            host.map(|host| format!("{proto}://{host}{path}"))
        } else {
            None
        };
        if let Some(v) = rewritten.and_then(|l| HeaderValue::from_str(&l).ok()) {
            parts.headers.insert(header::LOCATION, v);
        }
    }
    headers::advertise_limits(
        &mut parts.headers,
        gw.args.max_request_body_bytes.min(tenant_cap),
        gw.args.max_snapshot_request_body_bytes.min(tenant_cap),
    );
    Response::from_parts(parts, body.boxed_unsync())
}

fn is_event_stream(hm: &HeaderMap) -> bool {
    hm.get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"))
}

/// A single-request snapshot publish (`PUT .../snapshot/{offset}` or `.../snapshot?record=`
/// without `Stream-Snapshot-Parts`), whose body has its own, larger cap.
fn single_snapshot_publish(parts: &Parts) -> bool {
    parts.method == Method::PUT
        && !parts.headers.contains_key("stream-snapshot-parts")
        && parts
            .uri
            .path()
            .split('/')
            .nth(3)
            .is_some_and(|s| s == "snapshot")
}

/// How long to wait for the answer's headers: the configured bound, and for a long-poll at
/// least its `timeout_ms` (default 1,000, at most 60,000) plus 2 s.
fn header_timeout(gw: &Gateway, parts: &Parts) -> Duration {
    let base = gw.args.response_header_timeout();
    let query = parts.uri.query().unwrap_or("");
    let pairs = || query.split('&').filter_map(|p| p.split_once('='));
    if !pairs().any(|(k, v)| k == "live" && v == "long-poll") {
        return base;
    }
    let wait = pairs()
        .find(|(k, _)| *k == "timeout_ms")
        .and_then(|(_, v)| v.parse::<u64>().ok())
        .unwrap_or(1_000)
        .min(60_000);
    base.max(Duration::from_millis(wait) + Duration::from_secs(2))
}
