//! Redirect following against two tiny in-process HTTP servers: `a` (the node the generator
//! is pointed at) and `b` (the leader `a` redirects to).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::Result;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use super::*;
use crate::target::{Layout, Target};

/// What a test server answers for a path: 200 echoing the request, or a 307 to `Location`.
#[derive(Clone)]
enum Answer {
    Echo,
    /// To this base URL + the same path and query.
    RedirectTo(String),
    /// A relative `Location`.
    RedirectPath(&'static str),
}

#[derive(Default)]
struct Node {
    routes: Mutex<HashMap<String, Answer>>,
    /// Requests seen per path.
    hits: Mutex<HashMap<String, u64>>,
}

impl Node {
    fn route(&self, path: &str, a: Answer) {
        self.routes.lock().unwrap().insert(path.to_owned(), a);
    }
    fn hits(&self, path: &str) -> u64 {
        self.hits.lock().unwrap().get(path).copied().unwrap_or(0)
    }
}

async fn answer(node: Arc<Node>, req: Request<Incoming>) -> Result<Response<Full<Bytes>>> {
    let path = req.uri().path().to_owned();
    *node.hits.lock().unwrap().entry(path.clone()).or_default() += 1;
    let route = node.routes.lock().unwrap().get(&path).cloned();
    let (parts, body) = req.into_parts();
    let body = body.collect().await?.to_bytes();
    let mut resp = Response::new(Full::new(Bytes::new()));
    match route.unwrap_or(Answer::Echo) {
        Answer::Echo => {
            let h = |n: &str| {
                parts
                    .headers
                    .get(n)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-")
                    .to_owned()
            };
            let echo = format!(
                "{} {} host={} type={} seq={} body={}",
                parts.method,
                parts.uri,
                h("host"),
                h("content-type"),
                h("producer-seq"),
                String::from_utf8_lossy(&body)
            );
            *resp.body_mut() = Full::new(Bytes::from(echo));
        }
        Answer::RedirectTo(base) => {
            *resp.status_mut() = StatusCode::TEMPORARY_REDIRECT;
            let loc = format!("{base}{}", parts.uri);
            resp.headers_mut().insert(LOCATION, loc.parse()?);
            resp.headers_mut()
                .insert("x-ursula-raft-leader-id", HeaderValue::from_static("2"));
            *resp.body_mut() = Full::new(Bytes::from_static(b"{\"redirect\":true}"));
        }
        Answer::RedirectPath(p) => {
            *resp.status_mut() = StatusCode::TEMPORARY_REDIRECT;
            resp.headers_mut()
                .insert(LOCATION, HeaderValue::from_static(p));
        }
    }
    Ok(resp)
}

/// Serves `node` on a free port until the test ends; returns its base URL.
async fn serve(node: Arc<Node>) -> Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr: SocketAddr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let node = node.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| answer(node.clone(), req));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok(format!("http://{addr}"))
}

struct Pair {
    a: Arc<Node>,
    b: Arc<Node>,
    a_url: String,
    b_url: String,
    conn: Conn,
    ep: Arc<Endpoint>,
}

async fn pair() -> Result<Pair> {
    let (a, b) = (Arc::new(Node::default()), Arc::new(Node::default()));
    let a_url = serve(a.clone()).await?;
    let b_url = serve(b.clone()).await?;
    let ep = Endpoint::resolve(Target::parse(&a_url, Layout::Native, "b")?).await?;
    Ok(Pair {
        a,
        b,
        conn: Conn::new(ep.clone()),
        ep,
        a_url,
        b_url,
    })
}

async fn post(p: &mut Pair, path: &str, seq: u64) -> Result<(StatusCode, String)> {
    let (uri, ep) = (crate::target::path_uri(path)?, p.ep.clone());
    let body = Bytes::from(format!("hello-{seq}"));
    let req = || {
        let mut r = ep.with_type(Method::POST, uri.clone(), &OCTET_STREAM, body.clone());
        r.headers_mut().insert(PRODUCER_SEQ, HeaderValue::from(seq));
        r
    };
    let (parts, bytes): (_, Bytes) = p.conn.send_collect(req).await?;
    Ok((parts.status, String::from_utf8_lossy(&bytes).into_owned()))
}

fn host_of(url: &str) -> &str {
    url.trim_start_matches("http://")
}

#[tokio::test]
async fn follows_a_307_once_then_goes_to_the_leader_directly() -> Result<()> {
    let mut p = pair().await?;
    p.a.route("/b/s", Answer::RedirectTo(p.b_url.clone()));
    for seq in 0..3 {
        let (status, echo) = post(&mut p, "/b/s", seq).await?;
        assert_eq!(status, StatusCode::OK);
        // Same method, path, body and headers, with the leader's Host.
        let want = format!(
            "POST /b/s host={} type=application/octet-stream seq={seq} body=hello-{seq}",
            host_of(&p.b_url)
        );
        assert_eq!(echo, want);
    }
    assert_eq!(
        p.a.hits("/b/s"),
        1,
        "only the first request went to the target"
    );
    assert_eq!(p.b.hits("/b/s"), 3);
    assert_eq!(p.conn.redirects, 1);
    assert_eq!(p.conn.connects(), 2, "one connection per node, kept alive");
    // Another stream is still sent to the target first.
    let (status, echo) = post(&mut p, "/b/other", 7).await?;
    assert_eq!(status, StatusCode::OK);
    assert!(
        echo.contains(&format!("host={}", host_of(&p.a_url))),
        "{echo}"
    );
    assert_eq!((p.a.hits("/b/other"), p.b.hits("/b/other")), (1, 0));
    assert!(redirects_followed() >= 1);
    Ok(())
}

#[tokio::test]
async fn a_request_not_redirected_stays_on_the_target() -> Result<()> {
    let mut p = pair().await?;
    for seq in 0..2 {
        let (status, echo) = post(&mut p, "/b/local", seq).await?;
        assert_eq!(status, StatusCode::OK);
        assert!(
            echo.contains(&format!("host={}", host_of(&p.a_url))),
            "{echo}"
        );
    }
    assert_eq!((p.a.hits("/b/local"), p.b.hits("/b/local")), (2, 0));
    assert_eq!(p.conn.redirects, 0);
    assert!(!p.ep.routes_learnt());
    Ok(())
}

#[tokio::test]
async fn reads_keep_their_query_and_get_no_body() -> Result<()> {
    let mut p = pair().await?;
    p.a.route("/b/r", Answer::RedirectTo(p.b_url.clone()));
    let (uri, ep) = (
        crate::target::path_uri("/b/r?offset=-1&live=sse")?,
        p.ep.clone(),
    );
    let (parts, body) = p.conn.send_collect(|| ep.sse(uri.clone())).await?;
    assert_eq!(parts.status, StatusCode::OK);
    let echo = String::from_utf8_lossy(&body).into_owned();
    assert!(echo.starts_with("GET /b/r?offset=-1&live=sse "), "{echo}");
    assert!(echo.ends_with(" body="), "{echo}");
    assert_eq!(p.conn.redirects, 1);
    Ok(())
}

/// What `b` echoes for a GET of `path_and_query` through `a_url`'s target.
fn echo_len(path_and_query: &str, host: &str) -> u64 {
    format!("GET {path_and_query} host={host} type=- seq=- body=").len() as u64
}

#[tokio::test]
async fn a_body_sink_counts_bodies_and_follows_a_redirect_through_hyper() -> Result<()> {
    for copy_bodies in [false, true] {
        let p = pair().await?;
        p.a.route("/b/r", Answer::RedirectTo(p.b_url.clone()));
        let mut sink = BodySink::new(p.ep.clone(), copy_bodies)?;
        let (parts, n) = sink
            .get(&crate::target::path_uri("/b/s?offset=-1")?)
            .await?;
        assert_eq!(parts.status, StatusCode::OK);
        assert_eq!(n, echo_len("/b/s?offset=-1", host_of(&p.a_url)));
        // Redirected: answered by `b`, whose echo names it as the host.
        let (parts, n) = sink.get(&crate::target::path_uri("/b/r?offset=5")?).await?;
        assert_eq!(parts.status, StatusCode::OK, "copy_bodies {copy_bodies}");
        assert_eq!(n, echo_len("/b/r?offset=5", host_of(&p.b_url)));
        // The sink's own `307` is not followed; the request goes again through `Conn`, which
        // is redirected and follows (once per reader, then `Conn` takes every request).
        let target_hits = if copy_bodies { 1 } else { 2 };
        assert_eq!((p.a.hits("/b/r"), p.b.hits("/b/r")), (target_hits, 1));
    }
    Ok(())
}

#[tokio::test]
async fn redirects_are_bounded_per_request() -> Result<()> {
    let mut p = pair().await?;
    // `a` redirects to itself forever.
    p.a.route("/b/loop", Answer::RedirectTo(p.a_url.clone()));
    let (status, _) = post(&mut p, "/b/loop", 0).await?;
    assert_eq!(status, StatusCode::TEMPORARY_REDIRECT);
    assert_eq!(p.conn.redirects, MAX_REDIRECTS as u64);
    assert_eq!(p.a.hits("/b/loop"), MAX_REDIRECTS as u64 + 1);
    assert_eq!(p.conn.connects(), 1);
    Ok(())
}

#[tokio::test]
async fn a_leader_moving_back_to_the_target_is_followed_and_remembered() -> Result<()> {
    let mut p = pair().await?;
    p.a.route("/b/m", Answer::RedirectTo(p.b_url.clone()));
    post(&mut p, "/b/m", 0).await?;
    post(&mut p, "/b/m", 1).await?;
    assert_eq!((p.a.hits("/b/m"), p.b.hits("/b/m")), (1, 2));
    // Leadership moves to `a`: `b` now redirects there.
    p.a.route("/b/m", Answer::Echo);
    p.b.route("/b/m", Answer::RedirectTo(p.a_url.clone()));
    for seq in 2..5 {
        let (status, echo) = post(&mut p, "/b/m", seq).await?;
        assert_eq!(status, StatusCode::OK);
        assert!(
            echo.contains(&format!("host={}", host_of(&p.a_url))),
            "{echo}"
        );
    }
    assert_eq!((p.a.hits("/b/m"), p.b.hits("/b/m")), (4, 3));
    assert_eq!(p.conn.redirects, 2);
    Ok(())
}

#[tokio::test]
async fn a_relative_location_is_followed_on_the_same_node_and_not_remembered() -> Result<()> {
    let mut p = pair().await?;
    p.a.route("/b/snap", Answer::RedirectPath("/b/snap-1"));
    let (status, echo) = post(&mut p, "/b/snap", 0).await?;
    assert_eq!(status, StatusCode::OK);
    assert!(echo.starts_with("POST /b/snap-1 "), "{echo}");
    assert_eq!((p.a.hits("/b/snap"), p.a.hits("/b/snap-1")), (1, 1));
    assert!(!p.ep.routes_learnt());
    assert_eq!(p.conn.connects(), 1);
    Ok(())
}

#[tokio::test]
async fn another_connection_to_the_target_uses_the_route_learnt() -> Result<()> {
    let mut p = pair().await?;
    p.a.route("/b/shared", Answer::RedirectTo(p.b_url.clone()));
    post(&mut p, "/b/shared", 0).await?;
    assert!(p.ep.routes_learnt());
    // A second connection of the same run goes to the leader at once.
    p.conn = Conn::new(p.ep.clone());
    let (status, echo) = post(&mut p, "/b/shared", 1).await?;
    assert_eq!(status, StatusCode::OK);
    assert!(
        echo.contains(&format!("host={}", host_of(&p.b_url))),
        "{echo}"
    );
    assert_eq!((p.a.hits("/b/shared"), p.b.hits("/b/shared")), (1, 2));
    assert_eq!(p.conn.redirects, 0);
    assert_eq!(p.conn.connects(), 1, "only to the leader");
    Ok(())
}
