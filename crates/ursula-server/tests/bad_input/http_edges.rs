//! What a bounded fuzzing campaign found at the HTTP edge (issue 14), answer by answer on
//! raw sockets: `Host` validation and the absolute `Location`, a parse error on the second
//! request of a connection, media types, overlong targets and long IDs in error messages.

use crate::common::{Conn, Response, Server, assert_error, build_request, check_error_body};
use std::net::SocketAddr;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(10);

/// Sends `raw` on a fresh connection and reads one answer.
fn raw(addr: SocketAddr, raw: &[u8]) -> Response {
    let mut c = Conn::open(addr, TIMEOUT).expect("connect");
    // The server may answer and close before it read everything (an overlong target).
    let _ = c.write_raw(raw);
    c.read_response(raw.starts_with(b"HEAD "))
        .unwrap_or_else(|e| {
            panic!(
                "no answer to {:?}: {e}",
                String::from_utf8_lossy(&raw[..60.min(raw.len())])
            )
        })
}

/// A request with exactly the given head lines (no `Host` added) and an empty body.
fn with_lines(method: &str, path: &str, version: &str, lines: &[&str]) -> Vec<u8> {
    let mut r = format!("{method} {path} {version}\r\n");
    for l in lines {
        r.push_str(l);
        r.push_str("\r\n");
    }
    if method != "GET" && method != "HEAD" {
        r.push_str("Content-Length: 0\r\n");
    }
    r.push_str("\r\n");
    r.into_bytes()
}

#[test]
fn host_must_be_one_valid_authority_and_makes_the_location() {
    let s = Server::start();
    let a = s.addr();
    let bad: Vec<(&str, Vec<&str>)> = vec![
        ("markup", vec!["Host: x\"><script>"]),
        ("empty", vec!["Host: "]),
        ("space", vec!["Host: a b"]),
        ("two", vec!["Host: a", "Host: a"]),
        ("none", vec![]),
        ("userinfo", vec!["Host: u@evil.test"]),
        ("bad port", vec!["Host: a:99999"]),
        ("path", vec!["Host: a/b"]),
    ];
    for (i, (name, lines)) in bad.iter().enumerate() {
        let path = format!("/hostcheck/s{i}");
        let r = raw(a, &with_lines("PUT", &path, "HTTP/1.1", lines));
        assert_error(&r, 400, "MALFORMED_REQUEST");
        assert!(r.header("location").is_none(), "{name}: {}", r.describe());
        assert_eq!(s.head(&path).status, 404, "{name}: the stream was created");
        // Reads are refused the same way: the rule is the HTTP layer's, not the create's.
        let r = raw(a, &with_lines("GET", "/__ursula/health", "HTTP/1.1", lines));
        assert_error(&r, 400, "MALFORMED_REQUEST");
    }
    // A valid Host, with a port, a bracketed IPv6 literal or none, becomes the authority.
    for (host, want) in [
        (
            "example.test:8080",
            "http://example.test:8080/hostcheck/ok1",
        ),
        ("[::1]:9", "http://[::1]:9/hostcheck/ok2"),
        (
            "streams.example.test",
            "http://streams.example.test/hostcheck/ok3",
        ),
    ] {
        let path = &want[want.rfind("/hostcheck").unwrap()..];
        let r = raw(
            a,
            &with_lines("PUT", path, "HTTP/1.1", &[&format!("Host: {host}")]),
        );
        assert_eq!(r.status, 201, "{}", r.describe());
        assert_eq!(r.header("location"), Some(want));
    }
    // An absolute-form target names the authority; it is checked and wins over Host.
    let r = raw(
        a,
        &with_lines(
            "PUT",
            "http://target.test:1/hostcheck/abs",
            "HTTP/1.1",
            &["Host: other.test"],
        ),
    );
    assert_eq!(r.status, 201, "{}", r.describe());
    assert_eq!(
        r.header("location"),
        Some("http://target.test:1/hostcheck/abs")
    );
    // HTTP/1.0 has no Host requirement: the listener's address names the node.
    let r = raw(a, &with_lines("PUT", "/hostcheck/old", "HTTP/1.0", &[]));
    assert_eq!(r.status, 201, "{}", r.describe());
    assert_eq!(
        r.header("location"),
        Some(format!("http://{a}/hostcheck/old").as_str())
    );
}

#[test]
fn public_url_and_allowed_hosts() {
    let s = Server::start_with_args(&[
        "--public-url",
        "https://streams.example.com/",
        "--allowed-hosts",
        "localhost,127.0.0.1",
    ]);
    let a = s.addr();
    let put = |host: &str, path: &str| {
        raw(
            a,
            &with_lines("PUT", path, "HTTP/1.1", &[&format!("Host: {host}")]),
        )
    };
    // Behind a proxy the public URL names the node, whatever Host the proxy forwards.
    let r = put(&a.to_string(), "/hostcheck/pub");
    assert_eq!(r.status, 201, "{}", r.describe());
    assert_eq!(
        r.header("location"),
        Some("https://streams.example.com/hostcheck/pub")
    );
    let r = put("LOCALHOST:1234", "/hostcheck/pub2");
    assert_eq!(
        r.status,
        201,
        "host names compare case-insensitively: {}",
        r.describe()
    );
    // A host outside the list, and an invalid Host, are refused before anything runs.
    for host in ["evil.test", "127.0.0.1.evil.test:80", "x\"><script>"] {
        let r = put(host, "/hostcheck/never");
        assert_error(&r, 400, "MALFORMED_REQUEST");
    }
    assert_eq!(s.head("/hostcheck/never").status, 404);
}

#[test]
fn public_url_must_be_an_http_url() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ursula"))
        .args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .args(["--public-url", "http://x\"><script>"])
        .env("NO_COLOR", "1")
        .output()
        .expect("run ursula");
    assert!(
        !out.status.success(),
        "the server started with a bad public_url"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("public_url"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_parse_error_after_a_good_request_gets_the_json_body() {
    let s = Server::start();
    let a = s.addr();
    assert_eq!(s.put("/hostcheck/pipe", "text/plain", b"abc").status, 201);
    for first in [
        with_lines("GET", "/__ursula/health", "HTTP/1.1", &["Host: x"]),
        with_lines("GET", "/hostcheck/pipe", "HTTP/1.1", &["Host: x"]),
        build_request(
            a,
            "POST",
            "/hostcheck/pipe",
            &[("Content-Type", "text/plain")],
            b"d",
        ),
    ] {
        let mut c = Conn::open(a, TIMEOUT).expect("connect");
        let mut bytes = first.clone();
        bytes.extend_from_slice(b"X\r\n\r\n");
        c.write_raw(&bytes).expect("write both requests at once");
        let r1 = c.read_response(false).expect("first answer");
        assert!(r1.status < 300, "{}", r1.describe());
        let r2 = c.read_response(false).expect("second answer");
        assert_error(&r2, 400, "MALFORMED_REQUEST");
        assert_eq!(
            r2.header("cross-origin-resource-policy"),
            Some("cross-origin")
        );
        assert_eq!(r2.header("cache-control"), Some("no-store"));
    }
    // Only the one append above went in.
    assert_eq!(s.read_all("/hostcheck/pipe").0, b"abcd");
}

#[test]
fn every_overlong_target_is_414() {
    let s = Server::start();
    let a = s.addr();
    for kib in [64, 100, 500, 1024, 2048] {
        let target = format!("/hostcheck/x?pad={}", "p".repeat(kib * 1024));
        let r = raw(a, &with_lines("GET", &target, "HTTP/1.1", &["Host: x"]));
        assert_error(&r, 414, "URI_TOO_LONG");
    }
    // A header section that is too large stays 431.
    let big = format!("X-Big: {}", "v".repeat(1 << 20));
    let r = raw(
        a,
        &with_lines("GET", "/hostcheck/x", "HTTP/1.1", &["Host: x", &big]),
    );
    assert_error(&r, 431, "HEADERS_TOO_LARGE");
    let r = s.get("/__ursula/health");
    assert_eq!(r.status, 200, "{}", r.describe());
}

#[test]
fn long_ids_are_quoted_short_in_error_messages() {
    let s = Server::start();
    let long = "x".repeat(60_000);
    for path in [
        format!("/hostcheck/{long}"),
        format!("/{}/s", "B".repeat(60_000)),
        format!("/hostcheck/s?offset={long}"),
        format!("/hostcheck/s?offset=0&live={long}"),
        format!("/hostcheck/s/snapshot/{long}"),
    ] {
        let r = s.get(&path);
        assert_eq!(r.status, 400, "{}", r.describe());
        check_error_body(&r).expect("JSON error body");
        let msg = r.json()["error"]["message"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        assert!(msg.len() < 300, "a {} byte message: {msg:.100}", msg.len());
        assert!(msg.contains("..."), "{msg}");
    }
}

#[test]
fn content_type_must_be_one_media_type() {
    let s = Server::start();
    assert_eq!(
        s.put("/hostcheck/j", "application/json", b"[1]").status,
        201
    );
    assert_eq!(s.put("/hostcheck/t", "text/plain", b"a").status, 201);
    let bad = [
        "application/json, text/plain",
        "application/json\"",
        "application/json ,x",
        "application",
        "text/plain; charset",
        "a/b/c",
    ];
    for (i, ct) in bad.iter().enumerate() {
        let path = format!("/hostcheck/ct{i}");
        assert_error(&s.put(&path, ct, b"[1]"), 400, "INVALID_CONTENT_TYPE");
        assert_eq!(s.head(&path).status, 404, "{ct:?} created a stream");
        assert_error(
            &s.post("/hostcheck/t", ct, b"b"),
            400,
            "INVALID_CONTENT_TYPE",
        );
        assert_error(
            &s.post("/hostcheck/j", ct, b"[2]"),
            400,
            "INVALID_CONTENT_TYPE",
        );
        let r = s.req(
            "PUT",
            &format!("/hostcheck/t/snapshot/{:020}", 1),
            &[("Content-Type", ct)],
            b"state",
        );
        assert_error(&r, 400, "INVALID_CONTENT_TYPE");
    }
    // Content-Type twice is not one media type either.
    let twice = [
        ("Content-Type", "text/plain"),
        ("Content-Type", "text/plain"),
    ];
    assert_error(
        &s.req("POST", "/hostcheck/t", &twice, b"b"),
        400,
        "INVALID_CONTENT_TYPE",
    );
    // Nothing was appended; valid parameters still work and the stored type is normalized.
    assert_eq!(s.read_all("/hostcheck/t").0, b"a");
    assert_eq!(s.read_all("/hostcheck/j").0, b"[1]");
    let r = s.put("/hostcheck/p", "Text/Plain; Charset=\"utf-8\"", b"x");
    assert_eq!(r.status, 201, "{}", r.describe());
    assert_eq!(
        s.head("/hostcheck/p").header("content-type"),
        Some("text/plain; charset=\"utf-8\"")
    );
}

#[test]
fn record_parameters_are_honoured_or_refused() {
    let s = Server::start();
    assert_eq!(
        s.put("/hostcheck/j", "application/json", b"[1,2,3]").status,
        201
    );
    assert_eq!(s.put("/hostcheck/t", "text/plain", b"abc").status, 201);
    // The case: `record=now` is the record tail, not the whole history.
    let r = s.get("/hostcheck/j?record=now");
    assert_eq!(
        (r.status, r.text()),
        (200, "[]".to_owned()),
        "{}",
        r.describe()
    );
    assert_eq!(r.header("stream-record-start"), Some("3"));
    for (q, status, code) in [
        ("record=0&offset=0", 400, "INVALID_QUERY"),
        ("record=0&tail_records=1", 400, "INVALID_QUERY"),
        ("max_records=1", 400, "INVALID_QUERY"),
        ("record=0&max_bytes=1", 400, "INVALID_QUERY"),
        ("record_view=envelope", 400, "INVALID_QUERY"),
        ("record=0&record_view=x", 400, "INVALID_QUERY"),
        ("record=x", 400, "INVALID_QUERY"),
        ("record=0&max_records=0", 400, "INVALID_QUERY"),
        ("record=4", 400, "INVALID_RECORD_BOUNDARIES"),
        ("record=4&live=long-poll", 400, "INVALID_RECORD_BOUNDARIES"),
        ("record=4&live=sse", 400, "INVALID_RECORD_BOUNDARIES"),
    ] {
        assert_error(&s.get(&format!("/hostcheck/j?{q}")), status, code);
    }
    for q in ["record=0", "tail_records=1", "record=now&live=sse"] {
        assert_error(
            &s.get(&format!("/hostcheck/t?{q}")),
            400,
            "INVALID_RECORD_BOUNDARIES",
        );
    }
}

/// Reads from `c` until the server closes it, for at most 10 s: whether it did. Bytes the
/// server sends before closing are ignored.
fn wait_closed(c: &mut std::net::TcpStream) -> bool {
    use std::io::Read as _;
    let started = std::time::Instant::now();
    let mut buf = [0u8; 4096];
    c.set_read_timeout(Some(Duration::from_millis(20)))
        .expect("timeout");
    while started.elapsed() < Duration::from_secs(10) {
        match c.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return true,
        }
    }
    false
}

/// `header_timeout_ms` bounds how long a connection may take to send a request head: one
/// that sends nothing, one that stops halfway through a head, and one kept alive without a
/// next request are closed once it passes, while a client that keeps sending requests is
/// not cut off, and the node keeps serving.
#[test]
fn a_request_head_must_arrive_within_the_header_timeout() {
    use std::io::Write as _;
    let tmp = tempfile::tempdir().expect("tmp");
    let cfg = tmp.path().join("ursula.toml");
    std::fs::write(&cfg, "header_timeout_ms = 1000\n").expect("config");
    let s = Server::start_in_with_args(
        &tmp.path().join("data"),
        &["--config", cfg.to_str().expect("utf-8")],
    );
    let a = s.addr();
    let connect = || std::net::TcpStream::connect(a).expect("connect");
    let put = with_lines(
        "PUT",
        "/headtimeout/s",
        "HTTP/1.1",
        &[&format!("Host: {a}")],
    );

    // All three start their wait now; each is closed about a second later.
    let started = std::time::Instant::now();
    let mut silent = connect();
    let mut halfway = connect();
    halfway
        .write_all(format!("PUT /headtimeout/x HTTP/1.1\r\nHost: {a}\r\nContent-").as_bytes())
        .expect("write");
    let mut idle = connect();
    idle.write_all(&put).expect("write");
    for (name, c) in [
        ("silent", &mut silent),
        ("halfway", &mut halfway),
        ("idle", &mut idle),
    ] {
        assert!(wait_closed(c), "the {name} connection was not closed");
        let took = started.elapsed();
        // The bound is 1 s, kept to about a tenth of a second (the coarse clock may lag more
        // on a loaded machine).
        assert!(
            took >= Duration::from_millis(500),
            "{name} closed after {took:?}"
        );
        assert!(
            took <= Duration::from_millis(3000),
            "{name} closed after {took:?}"
        );
    }

    // A client that sends a request every 300 ms for 2.4 s is served throughout: the
    // deadline starts again with each request.
    let mut busy = Conn::open(a, TIMEOUT).expect("connect");
    for i in 0..8 {
        busy.write_raw(&with_lines(
            "HEAD",
            "/headtimeout/s",
            "HTTP/1.1",
            &[&format!("Host: {a}")],
        ))
        .expect("write");
        let r = busy
            .read_response(true)
            .unwrap_or_else(|e| panic!("request {i}: {e}"));
        assert_eq!(r.status, 200, "request {i}: {}", r.describe());
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(s.head("/headtimeout/s").status, 200);
}
