//! The server's own HTTP/1.1 loop for plain writes (src/h1): what a client sees is what hyper
//! gives it, on the same connection as hyper's requests, and the loop lets the node stop.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use common::{Conn, Response, Server, build_request, check_error_body};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);

fn open(s: &Server) -> Conn {
    Conn::open(s.addr(), T).expect("connect")
}

#[test]
fn pipelined_writes_a_read_and_more_writes_share_one_connection() {
    let s = Server::start();
    let a = s.addr();
    let mut c = open(&s);
    let ct = [("Content-Type", "text/plain")];
    // Create, two appends and a read in one write: the read hands the connection to hyper.
    let mut batch = build_request(a, "PUT", "/loop/pipe", &ct, b"");
    batch.extend(build_request(a, "POST", "/loop/pipe", &ct, b"one\n"));
    batch.extend(build_request(a, "POST", "/loop/pipe", &ct, b"two\n"));
    batch.extend(build_request(a, "GET", "/loop/pipe?offset=-1", &[], b""));
    c.write_raw(&batch).expect("write");
    let statuses: Vec<u16> = (0..3)
        .map(|_| c.read_response(false).expect("answer").status)
        .collect();
    assert_eq!(statuses, [201, 204, 204]);
    let read = c.read_response(false).expect("read answer");
    assert_eq!(read.status, 200, "{}", read.describe());
    assert_eq!(read.body, b"one\ntwo\n");
    // hyper serves the rest of this connection, writes included.
    let r = c
        .send("POST", "/loop/pipe", &ct, b"three\n")
        .expect("append");
    assert_eq!(r.status, 204, "{}", r.describe());
    assert_eq!(s.read_all("/loop/pipe").0, b"one\ntwo\nthree\n");
}

#[test]
fn a_body_in_many_pieces_is_appended_once_and_whole() {
    let s = Server::start();
    assert_eq!(s.put("/loop/pieces", "text/plain", b"").status, 201);
    let mut c = open(&s);
    let body: Vec<u8> = (0..3000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let raw = build_request(
        s.addr(),
        "POST",
        "/loop/pieces",
        &[("Content-Type", "text/plain")],
        &body,
    );
    // Head split inside a header name, then the body a few bytes at a time.
    for piece in raw.chunks(7) {
        c.write_raw(piece).expect("write piece");
    }
    let r = c.read_response(false).expect("answer");
    assert_eq!(r.status, 204, "{}", r.describe());
    assert_eq!(s.read_all("/loop/pieces").0, body);
}

#[test]
fn a_head_in_pieces_then_its_body_is_answered_and_the_connection_stays_usable() {
    let s = Server::start();
    assert_eq!(s.put("/loop/headpieces", "text/plain", b"").status, 201);
    let mut c = open(&s);
    let ct = [("Content-Type", "text/plain")];
    for i in 0..3u8 {
        let body = vec![b'a' + i; 100];
        let raw = build_request(s.addr(), "POST", "/loop/headpieces", &ct, &body);
        let head_len = raw.len() - body.len();
        // The head a few bytes at a time (re-parsed only when a line ends), its last bytes
        // together with the body.
        let (head, rest) = raw.split_at(head_len - 3);
        for piece in head.chunks(5) {
            c.write_raw(piece).expect("write piece");
        }
        c.write_raw(rest).expect("write the rest");
        let r = c.read_response(false).expect("answer");
        assert_eq!(r.status, 204, "{}", r.describe());
    }
    let want: Vec<u8> = (0..3u8).flat_map(|i| vec![b'a' + i; 100]).collect();
    assert_eq!(s.read_all("/loop/headpieces").0, want);
}

#[test]
fn connection_close_is_answered_then_the_connection_ends() {
    let s = Server::start();
    assert_eq!(s.put("/loop/close", "text/plain", b"").status, 201);
    let mut c = open(&s);
    let r = c
        .send(
            "POST",
            "/loop/close",
            &[("Content-Type", "text/plain"), ("Connection", "close")],
            b"x",
        )
        .expect("append");
    assert_eq!(r.status, 204, "{}", r.describe());
    assert!(
        c.read_head().is_err(),
        "the server closes the connection after answering"
    );
    assert_eq!(s.read_all("/loop/close").0, b"x");
}

/// What a client can compare between two nodes: status, headers (without the date, the port
/// in a created stream's location and the incarnation's value, which is the node's clock) and
/// body.
fn comparable(r: &Response, port: u16) -> (u16, BTreeMap<String, String>, Vec<u8>) {
    let headers = r
        .headers
        .iter()
        .filter(|(k, _)| k != "date")
        .map(|(k, v)| match k.as_str() {
            "stream-incarnation" => (k.clone(), "INCARNATION".to_owned()),
            _ => (k.clone(), v.replace(&port.to_string(), "PORT")),
        })
        .collect();
    (r.status, headers, r.body.clone())
}

/// A request: method, path, headers, body.
type Case<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)], &'a [u8]);

#[test]
fn writes_are_answered_as_hyper_answers_them() {
    let own = Server::start();
    let hyper_only = Server::start_with_args(&["--http1-own-path", "false"]);
    let text = [("Content-Type", "text/plain")];
    let json = [("Content-Type", "application/json")];
    let cors = [
        ("Content-Type", "text/plain"),
        ("Origin", "https://app.example"),
    ];
    let producer = [
        ("Content-Type", "text/plain"),
        ("Producer-Id", "p"),
        ("Producer-Epoch", "0"),
        ("Producer-Seq", "0"),
    ];
    let cases: Vec<Case<'_>> = vec![
        ("PUT", "/loop/cmp", &text, b"first\n"),
        ("PUT", "/loop/cmp", &text, b"first\n"),
        ("PUT", "/loop/cmpj", &json, b"[1,2]"),
        ("POST", "/loop/cmp", &text, b"second\n"),
        ("POST", "/loop/cmp", &cors, b"third\n"),
        ("POST", "/loop/cmp", &producer, b"p0\n"),
        ("POST", "/loop/cmp", &producer, b"p0\n"),
        ("POST", "/loop/cmp", &json, b"{}"),
        ("POST", "/loop/cmpj", &json, b"{\"a\":"),
        ("POST", "/loop/cmp", &[], b"no type"),
        ("POST", "/loop/missing", &text, b"x"),
        (
            "POST",
            "/loop/cmp",
            &[("Content-Type", "text/plain"), ("Stream-Closed", "true")],
            b"",
        ),
        ("POST", "/loop/cmp", &text, b"after close"),
        ("DELETE", "/loop/cmpj", &[], b""),
        ("DELETE", "/loop/cmpj", &[], b""),
        ("PUT", "/v1/stream/", &text, b""),
    ];
    let (mut c_own, mut c_hyper) = (open(&own), open(&hyper_only));
    for (method, path, headers, body) in cases {
        let a = c_own.send(method, path, headers, body).expect("own");
        let b = c_hyper.send(method, path, headers, body).expect("hyper");
        assert!(a.header("date").is_some(), "{}", a.describe());
        assert_eq!(
            comparable(&a, own.addr().port()),
            comparable(&b, hyper_only.addr().port()),
            "{method} {path}: own loop (left) and hyper (right) differ"
        );
    }
    // Both count the same requests and client errors.
    let (m_own, m_hyper) = (own.metrics(), hyper_only.metrics());
    for key in [
        "http_requests_total",
        "http_client_errors_total",
        "appends_total",
    ] {
        assert_eq!(m_own[key], m_hyper[key], "{key}");
        assert!(m_own[key].as_u64().unwrap_or(0) > 0, "{key} counted");
    }
}

#[test]
fn a_large_or_unusual_write_goes_to_hyper_and_is_served() {
    let s = Server::start();
    assert_eq!(s.put("/loop/big", "text/plain", b"").status, 201);
    let mut c = open(&s);
    // Over the loop's 64 KiB body bound.
    let big = vec![b'z'; 200 * 1024];
    let r = c
        .send("POST", "/loop/big", &[("Content-Type", "text/plain")], &big)
        .expect("big append");
    assert_eq!(r.status, 204, "{}", r.describe());
    // A malformed head on a fresh connection gets the JSON 400 hyper's path gives.
    let mut bad = open(&s);
    bad.write_raw(b"POST /h1/big HTTP/1.1\r\nBad Header: x\r\n\r\n")
        .expect("write");
    let r = bad.read_response(false).expect("answer");
    assert_eq!(r.status, 400, "{}", r.describe());
    assert_eq!(check_error_body(&r), Ok("MALFORMED_REQUEST".to_owned()));
    assert_eq!(s.read_all("/loop/big").0.len(), big.len());
}

#[test]
fn the_node_stops_promptly_with_idle_connections_open() {
    let mut s = Server::start();
    assert_eq!(s.put("/loop/stop", "text/plain", b"").status, 201);
    let mut idle: Vec<Conn> = (0..4).map(|_| open(&s)).collect();
    for c in &mut idle {
        let r = c
            .send(
                "POST",
                "/loop/stop",
                &[("Content-Type", "text/plain")],
                b"x",
            )
            .expect("append");
        assert_eq!(r.status, 204);
    }
    let t0 = Instant::now();
    let status = s.terminate();
    assert!(status.success(), "exit status {status}");
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "idle kept-alive connections held the shutdown for {:?}",
        t0.elapsed()
    );
    for c in &mut idle {
        assert!(c.read_head().is_err(), "an idle connection is closed");
    }
}

#[test]
fn a_body_still_arriving_is_hypers_budgeted_and_timed_out() {
    let s = Server::start_with_config(
        "body_timeout_ms = 800\nmax_request_bytes = 1000\nhttp_inflight_body_size = 1000\n",
        &["--cold-backend", "none"],
    );
    assert_eq!(s.put("/loop/late", "text/plain", b"").status, 201);
    let a = s.addr();
    // A body that stops half way goes to hyper's path, which charges it to the budget.
    let mut stalled = open(&s);
    stalled
        .write_raw(
            format!(
                "POST /loop/late HTTP/1.1\r\nHost: {a}\r\nOrigin: https://app.example\r\n\
                 Content-Type: text/plain\r\nContent-Length: 900\r\n\r\nhalf"
            )
            .as_bytes(),
        )
        .expect("write partial body");
    let held = || s.metrics()["http_inflight_body_bytes"].as_u64() == Some(900);
    assert!(
        common::wait_until(T, held),
        "the held body is charged: {}",
        s.metrics()["http_inflight_body_bytes"]
    );
    // Another body that does not fit beside it is refused, not buffered.
    let mut other = open(&s);
    other
        .write_raw(
            format!(
                "POST /loop/late HTTP/1.1\r\nHost: {a}\r\nContent-Type: text/plain\r\n\
                 Content-Length: 900\r\n\r\nsome"
            )
            .as_bytes(),
        )
        .expect("write");
    let r = other.read_response(false).expect("answer");
    assert_eq!(r.status, 503, "{}", r.describe());
    assert_eq!(
        check_error_body(&r),
        Ok("INGRESS_BODY_BYTES_LIMIT_REACHED".to_owned())
    );
    // The stalled one times out with a JSON 408 a browser may read.
    let r = stalled.read_response(false).expect("408");
    assert_eq!(r.status, 408, "{}", r.describe());
    assert_eq!(check_error_body(&r), Ok("REQUEST_TIMEOUT".to_owned()));
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    assert!(common::wait_until(
        T,
        || s.metrics()["http_inflight_body_bytes"].as_u64() == Some(0)
    ));
    assert_eq!(
        s.read_all("/loop/late").0,
        b"",
        "nothing partial was appended"
    );
}
