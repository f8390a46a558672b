//! The gateway (`ursula gateway`, cluster.md §12) as a client meets it: one address for a
//! cluster, answers from each stream's leader, no node address in any answer, its own CORS
//! and its own JSON errors. The real binaries, real processes, loopback ports.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod common;

use common::cluster::{Cluster, ClusterSpec};
use common::gateway::Gateway;
use common::{Server, SseStream, try_request, wait_until};
use serde_json::Value;
use std::net::SocketAddr;
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

#[test]
fn one_address_for_a_cluster_answers_from_each_leader_and_names_no_node() {
    let mut c = Cluster::start(ClusterSpec::new(3));
    c.wait_ready();
    let upstreams: Vec<String> = c
        .ports()
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();
    let gw = Gateway::start(&upstreams, &[]);
    let text = [("Content-Type", "text/plain")];
    // Streams spread over the 4 groups, so most are led by a node the gateway does not try
    // first: it follows the 307s itself.
    let mut answers = Vec::new();
    for i in 0..12 {
        let p = format!("/gwbk/s{i}");
        let r = gw.req("PUT", &p, &text, b"first;");
        assert_eq!(r.status, 201, "create {p}: {}", r.text());
        let loc = r.header("location").expect("Location");
        assert_eq!(loc, format!("http://{}{p}", gw.addr), "no node address");
        answers.push(r);
        let r = gw.req("POST", &p, &text, b"second;");
        assert_eq!(r.status, 204, "append {p}: {}", r.text());
        answers.push(r);
        let r = gw.req("GET", &format!("{p}?offset=-1"), &[], b"");
        assert_eq!(r.status, 200, "read {p}");
        assert_eq!(r.text(), "first;second;");
        answers.push(r);
    }
    // No header or body of any answer names a node.
    for r in &answers {
        for n in c.ports() {
            let node = format!("127.0.0.1:{n}");
            let named = r.headers.iter().any(|(_, v)| v.contains(&node));
            assert!(!named && !r.text().contains(&node), "{r:?}");
        }
    }
    let m = gw.metrics();
    assert!(m["leader_redirects"].as_u64().unwrap() > 0, "{m}");
    assert!(m["leader_cache_hits"].as_u64().unwrap() > 0, "{m}");
    assert!(m["leader_cache_entries"].as_u64().unwrap() >= 1, "{m}");
    // With the group count, one leader per group is cached, whatever the number of streams.
    let by_group = Gateway::start(&upstreams, &["--raft-group-count", "4"]);
    for i in 0..12 {
        let r = by_group.req("GET", &format!("/gwbk/s{i}?offset=-1"), &[], b"");
        assert_eq!(r.text(), "first;second;");
    }
    let m = by_group.metrics();
    let entries = m["leader_cache_entries"].as_u64().unwrap();
    assert!((1..=4).contains(&entries), "{m}");
}

#[test]
fn the_gateway_owns_cors_limits_and_its_errors() {
    let s = Server::start();
    let node = format!("http://{}", s.addr());
    let gw = Gateway::start(
        &[node],
        &[
            "--cors-allowed-origin",
            "https://app.example",
            "--max-request-body-bytes",
            "1000",
        ],
    );
    let text = [("Content-Type", "text/plain")];
    assert_eq!(gw.req("PUT", "/gwck/s", &text, b"x").status, 201);

    // Preflight: answered by the gateway, for an allowed origin only.
    let pre = gw.req(
        "OPTIONS",
        "/gwck/s",
        &[
            ("Origin", "https://app.example"),
            ("Access-Control-Request-Method", "POST"),
            (
                "Access-Control-Request-Headers",
                "content-type, if-none-match",
            ),
        ],
        b"",
    );
    assert_eq!(pre.status, 204);
    assert_eq!(
        pre.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    assert_eq!(
        pre.header("access-control-allow-headers"),
        Some("content-type, if-none-match")
    );
    // The node answers `*` for any origin; through the gateway only its policy shows.
    let r = gw.req(
        "GET",
        "/gwck/s?offset=-1",
        &[("Origin", "https://app.example")],
        b"",
    );
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    assert_eq!(r.header("access-control-expose-headers"), Some("*"));
    let r = gw.req(
        "GET",
        "/gwck/s?offset=-1",
        &[("Origin", "https://evil.example")],
        b"",
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("access-control-allow-origin"), None);

    // The limit it enforces is the one it advertises, and a larger body is refused in JSON.
    let head = gw.req("HEAD", "/gwck/s", &[], b"");
    assert_eq!(head.header("ursula-max-request-bytes"), Some("1000"));
    let r = gw.req("POST", "/gwck/s", &text, &[b'a'; 1001]);
    assert_eq!(r.status, 413);
    assert_eq!(r.json()["error"]["code"], "PAYLOAD_TOO_LARGE");
    assert_eq!(gw.req("POST", "/gwck/s", &text, &[b'a'; 1000]).status, 204);

    // A client that stops sending its body gets 408, not a connection held for ever.
    let quick = Gateway::start(
        &[format!("http://{}", s.addr())],
        &["--client-timeout", "1"],
    );
    let mut c = std::net::TcpStream::connect(quick.addr).unwrap();
    c.set_read_timeout(Some(T)).unwrap();
    let head = format!(
        "POST /gwck/s HTTP/1.1\r\nHost: {}\r\nContent-Type: text/plain\r\nContent-Length: 10\r\n\r\nhalf!",
        quick.addr
    );
    std::io::Write::write_all(&mut c, head.as_bytes()).unwrap();
    let mut answer = Vec::new();
    let _ = std::io::Read::read_to_end(&mut c, &mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"REQUEST_TIMEOUT\""), "{answer}");

    // Requests the HTTP layer cannot parse get the JSON error body too (OQ-32), and the
    // gateway keeps serving.
    let raw = |bytes: &[u8]| {
        let mut c = std::net::TcpStream::connect(gw.addr).unwrap();
        c.set_read_timeout(Some(T)).unwrap();
        std::io::Write::write_all(&mut c, bytes).unwrap();
        let mut answer = Vec::new();
        let _ = std::io::Read::read_to_end(&mut c, &mut answer);
        String::from_utf8_lossy(&answer).into_owned()
    };
    let bad = raw(b"GET /gwck/s HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n");
    assert!(bad.starts_with("HTTP/1.1 400"), "{bad}");
    assert!(bad.ends_with(r#""code":"MALFORMED_REQUEST","message":"the request line or header section could not be parsed"}}"#), "{bad}");
    assert!(bad.contains("content-type: application/json"), "{bad}");
    let mut long = b"GET /gwck/".to_vec();
    long.extend(std::iter::repeat_n(b'a', 70_000));
    long.extend_from_slice(b" HTTP/1.1\r\nHost: x\r\n\r\n");
    let long = raw(&long);
    assert!(long.starts_with("HTTP/1.1 414"), "{long}");
    assert!(long.contains(r#""code":"URI_TOO_LONG""#), "{long}");
    assert_eq!(gw.req("GET", "/gwck/s?offset=-1", &[], b"").status, 200);

    // A node that does not answer: 502 UPSTREAM_FAILED, and the gateway keeps serving.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let dead = Gateway::start(&[format!("http://127.0.0.1:{port}")], &[]);
    let r = dead.req("GET", "/gwck/s", &[], b"");
    assert_eq!(r.status, 502);
    assert_eq!(r.json()["error"]["code"], "UPSTREAM_FAILED");
    assert!(wait_until(T, || dead
        .req("GET", "/gwck/s", &[], b"")
        .status
        == 502));
}

// ---- access control (cluster.md §12.3 to §12.5) ---------------------------------------------

/// The test issuer: its private key and JWKS are fixtures made for these tests only.
const ISSUER: &str = "https://issuer.test";
const AUDIENCE: &str = "ursula-test";
const KEY_PEM: &[u8] = include_bytes!("fixtures/gateway/issuer-key.pem");
const JWKS: &str = include_str!("fixtures/gateway/jwks.json");
const CONCEALED: &str = r#"{"error":{"code":"NOT_FOUND","message":"not found"}}"#;

/// Serves `body` as JSON to every request on a loopback port, for the tests' lifetime.
fn serve_json(body: &'static str) -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut s in l.incoming().map_while(Result::ok) {
            let mut buf = [0u8; 4096];
            let _ = std::io::Read::read(&mut s, &mut buf);
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = std::io::Write::write_all(&mut s, head.as_bytes());
            let _ = std::io::Write::write_all(&mut s, body.as_bytes());
        }
    });
    addr
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// An access token for `sub`, valid for `ttl_s` seconds; `tweak` edits its header and claims.
fn token(
    sub: &str,
    ttl_s: i64,
    tweak: impl FnOnce(&mut jsonwebtoken::Header, &mut Value),
) -> String {
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
    header.typ = Some("at+jwt".to_owned());
    header.kid = Some("test-key-1".to_owned());
    let mut claims = serde_json::json!({
        "iss": ISSUER, "aud": AUDIENCE, "sub": sub, "client_id": "test-client",
        "iat": now(), "exp": now() as i64 + ttl_s, "jti": format!("{sub}-{ttl_s}"),
    });
    tweak(&mut header, &mut claims);
    let key = jsonwebtoken::EncodingKey::from_rsa_pem(KEY_PEM).unwrap();
    jsonwebtoken::encode(&header, &claims, &key).unwrap()
}

fn secured(node: &Server, dir: &std::path::Path, jwks: SocketAddr) -> Gateway {
    secured_with(node, dir, jwks, &[])
}

fn secured_with(node: &Server, dir: &std::path::Path, jwks: SocketAddr, extra: &[&str]) -> Gateway {
    let policy = dir.join("policy.toml");
    std::fs::write(
        &policy,
        format!(
            "[[bucket]]\nid = \"pubk\"\npublic_read = true\nowners = [{{ issuer = \"{ISSUER}\", subject = \"alice\" }}]\n\
             [[bucket]]\nid = \"priv\"\nowners = [{{ issuer = \"{ISSUER}\", subject = \"alice\" }}]\n"
        ),
    )
    .unwrap();
    let jwks_url = format!("http://{jwks}/jwks.json");
    let mut args = vec![
        "--auth-issuer",
        ISSUER,
        "--auth-audience",
        AUDIENCE,
        "--auth-jwks-url",
        &jwks_url,
        "--auth-policy",
        policy.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    Gateway::start(&[format!("http://{}", node.addr())], &args)
}

#[test]
fn tenants_are_held_to_their_rate_live_reads_and_body_size() {
    let node = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let quotas = dir.path().join("quotas.toml");
    std::fs::write(
        &quotas,
        "[default]\nrequests_per_sec = 1000\n\
         [[bucket]]\nid = \"pubk\"\nrequests_per_sec = 1\n\
         [[bucket]]\nid = \"priv\"\nmax_concurrent_live_reads = 1\nmax_request_body_bytes = 100\n",
    )
    .unwrap();
    let gw = secured_with(
        &node,
        dir.path(),
        serve_json(JWKS),
        &["--quota-policy", quotas.to_str().unwrap()],
    );
    let alice = format!("Bearer {}", token("alice", 300, |_, _| {}));
    let auth = ("Authorization", alice.as_str());
    let text = ("Content-Type", "text/plain");

    // One request a second for `pubk`: the next one waits for its token.
    assert_eq!(gw.req("PUT", "/pubk/s", &[text, auth], b"x").status, 201);
    let r = gw.req("GET", "/pubk/s?offset=-1", &[], b"");
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "RATE_LIMITED");
    assert_eq!(r.header("retry-after"), Some("1"));

    // `priv` takes bodies of 100 bytes at most, and says so.
    assert_eq!(gw.req("PUT", "/priv/s", &[text, auth], b"").status, 201);
    let head = gw.req("HEAD", "/priv/s", &[auth], b"");
    assert_eq!(head.header("ursula-max-request-bytes"), Some("100"));
    let r = gw.req("POST", "/priv/s", &[text, auth], &[b'a'; 101]);
    assert_eq!(r.status, 413);
    assert_eq!(
        gw.req("POST", "/priv/s", &[text, auth], &[b'a'; 100])
            .status,
        204
    );

    // One live read at a time: a second one is refused while the first is open.
    let held = SseStream::open_with(gw.addr, "/priv/s?offset=-1&live=sse", &[auth]).unwrap();
    assert_eq!(held.status, 200);
    let r = gw.req(
        "GET",
        "/priv/s?offset=100&live=long-poll&timeout_ms=50",
        &[auth],
        b"",
    );
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "LIVE_READS_EXHAUSTED");
    assert_eq!(r.header("retry-after"), None);
    // Its slot comes back once the client goes away.
    drop(held);
    assert!(wait_until(T, || {
        gw.req(
            "GET",
            "/priv/s?offset=100&live=long-poll&timeout_ms=50",
            &[auth],
            b"",
        )
        .status
            == 204
    }));
}

#[test]
fn owners_write_the_public_reads_and_everything_else_is_concealed() {
    let node = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let gw = secured(&node, dir.path(), serve_json(JWKS));
    let alice = format!("Bearer {}", token("alice", 300, |_, _| {}));
    let bob = format!("Bearer {}", token("bob", 300, |_, _| {}));
    let text = ("Content-Type", "text/plain");
    for b in ["pubk", "priv"] {
        let r = gw.req(
            "PUT",
            &format!("/{b}/s"),
            &[text, ("Authorization", &alice)],
            b"hi",
        );
        assert_eq!(r.status, 201, "{b}: {}", r.text());
    }
    // The public reads a public bucket, anonymously or with any valid token.
    assert_eq!(gw.req("GET", "/pubk/s?offset=-1", &[], b"").text(), "hi");
    let r = gw.req("GET", "/pubk/s?offset=-1", &[("Authorization", &bob)], b"");
    assert_eq!(r.status, 200);
    // Everything else answers the same 404, byte for byte.
    for (method, path, auth) in [
        ("POST", "/pubk/s", None),
        ("POST", "/pubk/s", Some(&bob)),
        ("GET", "/priv/s?offset=-1", None),
        ("GET", "/priv/s?offset=-1", Some(&bob)),
        ("GET", "/nobody/s?offset=-1", Some(&alice)),
        ("GET", "/__ursula/metrics", Some(&alice)),
        ("GET", "/__ursula/gateway/metrics", None),
        ("GET", "/__ursula/gateway/metrics", Some(&alice)),
    ] {
        let mut h = vec![text];
        if let Some(a) = auth {
            h.push(("Authorization", a.as_str()));
        }
        let r = gw.req(method, path, &h, b"x");
        assert_eq!(
            (r.status, r.text().as_str()),
            (404, CONCEALED),
            "{method} {path}"
        );
    }
    let r = gw.req("POST", "/priv/s", &[text, ("Authorization", &alice)], b"!");
    assert_eq!(r.status, 204);
    let r = gw.req(
        "GET",
        "/priv/s?offset=-1",
        &[("Authorization", &alice)],
        b"",
    );
    assert_eq!(r.text(), "hi!");

    // Operators read the gateway's metrics on their own listener.
    let ops = secured_with(
        &node,
        dir.path(),
        serve_json(JWKS),
        &["--metrics-listen", "127.0.0.1:0"],
    );
    assert_eq!(ops.req("GET", "/pubk/s?offset=-1", &[], b"").text(), "hi");
    let metrics_at = ops
        .more
        .recv_timeout(T)
        .expect("the metrics address is logged");
    let on_ops = |path: &str| try_request(metrics_at, "GET", path, &[], b"", T).unwrap();
    let m = on_ops("/__ursula/gateway/metrics");
    assert_eq!(m.status, 200, "{}", m.text());
    assert!(m.json()["requests"].as_u64().unwrap() >= 1, "{}", m.text());
    assert_eq!(on_ops("/pubk/s?offset=-1").status, 404);
    assert_eq!(
        ops.req("GET", "/__ursula/gateway/metrics", &[], b"").text(),
        CONCEALED
    );
}

#[test]
fn bad_tokens_answer_401_and_an_unreachable_issuer_503() {
    let node = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let gw = secured(&node, dir.path(), serve_json(JWKS));
    let bad = [
        "Basic YWxpY2U6cHc=".to_owned(),
        "Bearer ".to_owned(),
        "Bearer not.a.jwt".to_owned(),
        format!("Bearer {}", token("alice", -120, |_, _| {})),
        format!(
            "Bearer {}",
            token("alice", 300, |h, _| h.typ = Some("JWT".to_owned()))
        ),
        format!(
            "Bearer {}",
            token("alice", 300, |_, c| c["aud"] = "other".into())
        ),
        format!(
            "Bearer {}",
            token("alice", 300, |_, c| c["iss"] = "https://evil.test".into())
        ),
        format!(
            "Bearer {}",
            token("alice", 300, |_, c| drop(
                c.as_object_mut().unwrap().remove("jti")
            ))
        ),
        format!(
            "Bearer {}",
            token("alice", 300, |h, _| h.kid = Some("unknown".to_owned()))
        ),
    ];
    for auth in &bad {
        let r = gw.req("GET", "/pubk/s?offset=-1", &[("Authorization", auth)], b"");
        assert_eq!(r.status, 401, "{auth}: {}", r.text());
        assert_eq!(r.json()["error"]["code"], "UNAUTHORIZED");
        assert_eq!(
            r.header("www-authenticate"),
            Some("Bearer error=\"invalid_token\"")
        );
    }
    // No JWKS to be had: the token cannot be checked, which is not the client's fault.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let gw = secured(&node, dir.path(), port);
    let alice = format!("Bearer {}", token("alice", 300, |_, _| {}));
    let r = gw.req(
        "GET",
        "/pubk/s?offset=-1",
        &[("Authorization", &alice)],
        b"",
    );
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "AUTH_UNAVAILABLE");
}

#[test]
fn a_live_read_ends_when_its_credential_expires() {
    let node = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let gw = secured(&node, dir.path(), serve_json(JWKS));
    let alice = format!("Bearer {}", token("alice", 300, |_, _| {}));
    let text = ("Content-Type", "text/plain");
    let r = gw.req(
        "PUT",
        "/priv/live",
        &[text, ("Authorization", &alice)],
        b"a",
    );
    assert_eq!(r.status, 201);
    // Valid for two more seconds: the SSE answer ends then, with the event that says why.
    let brief = format!("Bearer {}", token("alice", 2, |_, _| {}));
    let started = std::time::Instant::now();
    let r = gw.req(
        "GET",
        "/priv/live?offset=-1&live=sse",
        &[("Authorization", &brief)],
        b"",
    );
    assert_eq!(r.status, 200);
    let body = r.text();
    assert!(body.contains("event: data"), "{body}");
    assert!(
        body.ends_with("event: credential-expired\ndata:{\"reason\":\"credential_expired\"}\n\n"),
        "{body}"
    );
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn usage_is_metered_per_bucket_principal_and_class() {
    let node = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("usage.jsonl");
    let gw = secured_with(
        &node,
        dir.path(),
        serve_json(JWKS),
        &[
            "--usage-log",
            log.to_str().unwrap(),
            "--usage-flush-secs",
            "1",
            "--usage-chunk-bytes",
            "4",
        ],
    );
    let alice = format!("Bearer {}", token("alice", 300, |_, _| {}));
    let auth = ("Authorization", alice.as_str());
    let text = ("Content-Type", "text/plain");
    assert_eq!(gw.req("PUT", "/pubk/u", &[text, auth], b"").status, 201);
    assert_eq!(
        gw.req("POST", "/pubk/u", &[text, auth], b"0123456789")
            .status,
        204
    );
    assert_eq!(
        gw.req("GET", "/pubk/u?offset=-1", &[], b"").text(),
        "0123456789"
    );
    let mut records = Vec::new();
    assert!(wait_until(Duration::from_secs(15), || {
        records = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .flat_map(|l| {
                let b: Value = serde_json::from_str(l).unwrap();
                assert!(
                    b["sequence"].as_u64().is_some() && b["window_end_unix_ms"].as_u64().is_some()
                );
                b["records"].as_array().cloned().unwrap_or_default()
            })
            .collect();
        records.iter().any(|r| r["class"] == "read")
    }));
    let find = |class: &str, subject: Option<&str>| {
        records
            .iter()
            .filter(|r| r["class"] == class && r["subject"].as_str() == subject)
            .fold((0, 0, 0, 0), |a, r| {
                let n = |k: &str| r[k].as_u64().unwrap_or(0);
                (
                    a.0 + n("requests"),
                    a.1 + n("request_bytes"),
                    a.2 + n("chunks"),
                    a.3 + n("response_bytes"),
                )
            })
    };
    // The create and the append, by alice: 10 bytes in, 1 + 3 chunks of 4 bytes.
    assert_eq!(find("append", Some("alice")), (2, 10, 4, 0));
    // The anonymous read: the 10 bytes it was sent.
    assert_eq!(find("read", None), (1, 0, 0, 10));
}
