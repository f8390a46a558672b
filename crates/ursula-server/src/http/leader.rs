//! Which node serves a stream request (spec cluster.md §3): the leader of the stream's group
//! serves everything; a follower serves only catch-up reads of bytes it has applied, and
//! redirects the rest (`307` to the leader's peer URL, or `503 LEADER_UNAVAILABLE` while no
//! leader is known). A node without peers leads every group: nothing here applies.

use super::Resp;
use super::error::{self, ApiError};
use super::headers as h;
use super::path::{Sub, Target};
use crate::app::App;
use axum::body::Body;
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode, header};
use ursula_core::ErrorCode;

pub static RAFT_LEADER_ID: HeaderName = HeaderName::from_static("x-ursula-raft-leader-id");

/// What this node does with a stream request.
pub enum Gate {
    /// This node leads the group (or has no peers): serve.
    Lead,
    /// This node leads the group of a read: confirm it still does with a quorum (read index,
    /// [`confirm_leader_read`]) before serving, so a deposed leader never serves a stale tail.
    LeadRead(u32),
    /// A follower serving a catch-up read; see [`after_follower_read`].
    FollowerRead(u32),
    /// Answer this instead (307 or 503).
    Answer(Resp),
}

/// A catch-up read: `GET` of the stream itself, not live, not `offset=now`.
fn follower_servable(method: &Method, sub: Option<&Sub>, q: Option<&str>) -> bool {
    if method != Method::GET || sub.is_some() {
        return false;
    }
    !q.unwrap_or("").split('&').any(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        k == "live" || (k == "offset" && v == "now")
    })
}

pub fn gate(app: &App, target: &Target, sub: Option<&Sub>, req: &Request<Body>) -> Gate {
    let node = &app.node;
    if !node.has_peers() {
        return Gate::Lead;
    }
    let group = app.group_of(&target.key);
    if node.leads(group) {
        let read = req.method() == Method::GET || req.method() == Method::HEAD;
        return if read {
            Gate::LeadRead(group)
        } else {
            Gate::Lead
        };
    }
    if follower_servable(req.method(), sub, req.uri().query()) {
        return Gate::FollowerRead(group);
    }
    Gate::Answer(redirect(app, group, req.uri()))
}

/// `None` once this node has confirmed with a quorum that it leads `group` and has applied
/// everything committed before; else the redirect (or 503) to answer instead.
pub async fn confirm_leader_read(app: &App, group: u32, uri: &http::Uri) -> Option<Resp> {
    match app.node.ensure_linearizable(group).await {
        Ok(()) => None,
        Err(_) => Some(redirect(app, group, uri)),
    }
}

/// A follower answers a read itself only with bytes it has applied that state no tail fact
/// (§3.3). Anything else goes to the leader: `Stream-Up-To-Date: true` without a closed tail,
/// and every non-200 answer (a stream this replica has not applied yet would be a 404, an
/// offset past its applied tail a 416).
pub fn after_follower_read(app: &App, group: u32, uri: &http::Uri, resp: Resp) -> Resp {
    if resp.status() != StatusCode::OK {
        return redirect(app, group, uri);
    }
    let hm = resp.headers();
    let says_up_to_date = hm
        .get(&h::STREAM_UP_TO_DATE)
        .is_some_and(|v| v.as_bytes() == b"true");
    let closed = hm
        .get(&h::STREAM_CLOSED)
        .is_some_and(|v| v.as_bytes() == b"true");
    if says_up_to_date && !closed {
        redirect(app, group, uri)
    } else {
        resp
    }
}

/// Reads and drops the body of a request answered with a redirect before it was read, so that
/// the client finishes sending and reads the answer (a client still writing a body the node
/// stopped reading gets a broken pipe instead). Bounded by `max_request_bytes` and the body
/// time-out; a larger body is not read (the connection closes after the answer). Frames are
/// dropped as they arrive (never collected: the node's body budget does not cover them).
pub async fn discard_body(app: &App, req: Request<Body>) {
    use http_body_util::BodyExt;
    let limit = app.cfg.max_request_bytes;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared == Some(0) || declared.is_some_and(|n| n > app.cfg.max_request_bytes) {
        return;
    }
    let timeout = std::time::Duration::from_millis(app.cfg.body_timeout_ms.max(1));
    let drain = async {
        let mut body = req.into_body();
        let mut seen = 0u64;
        while let Some(Ok(frame)) = body.frame().await {
            seen += frame.data_ref().map_or(0, |d| d.len() as u64);
            if seen > limit {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(timeout, drain).await;
}

/// `307` to the leader of `group`, or `503 LEADER_UNAVAILABLE` (`Retry-After: 1`).
pub fn redirect(app: &App, group: u32, uri: &http::Uri) -> Resp {
    let me = app.node.node_id();
    // A leader this node has not heard from lately is not a redirect target (it died or is
    // cut off): the client hears "retry" rather than being sent to a node that does not answer.
    let leader = app.node.reachable_leader(group).filter(|&l| l != me);
    let Some((id, url)) = leader.and_then(|l| Some((l, app.node.peer_url(l)?))) else {
        return error::render(ApiError::new(
            ErrorCode::LEADER_UNAVAILABLE,
            format!(
                "raft group {group} has no reachable leader (an election may be running); retry shortly"
            ),
        ));
    };
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let location = format!("{}{path}", url.trim_end_matches('/'));
    let mut r = Response::new(Body::empty());
    *r.status_mut() = StatusCode::TEMPORARY_REDIRECT;
    let hm = r.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&location) {
        hm.insert(header::LOCATION, v);
    }
    hm.insert(&RAFT_LEADER_ID, HeaderValue::from(id));
    r
}
