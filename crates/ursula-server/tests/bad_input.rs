//! Malformed input: every bad request gets a 4xx with the JSON error body (where the
//! server can answer at all), never a 5xx, and afterwards the server still serves and the
//! data written before is byte-identical.
//!
//! Answers produced by the HTTP library before any route runs (unparseable request lines
//! and header sections) must be a 4xx with the JSON error body too (the server replaces
//! hyper's empty body, OQ-32), or a closed connection where no answer can be written.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;
#[path = "bad_input/http_edges.rs"]
mod http_edges;

use common::{Conn, PeerState, Response, Server, build_request, check_error_body, off20, truncate};
use std::io::Write as _;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

const DATA: &str = "/badinput/data";
const JDATA: &str = "/badinput/jdata";

/// What a case must get.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// This status and error code.
    Code(u16, &'static str),
    /// Some 4xx with a JSON error body (the exact answer is left open by the spec).
    Any4xx,
    /// Rejected by the HTTP layer: a 4xx answer or a closed connection.
    HttpLayer,
}

struct Case {
    name: String,
    raw: Vec<u8>,
    expect: Expect,
    /// Socket timeout for the answer.
    timeout: Duration,
}

fn case(
    addr: SocketAddr,
    name: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    expect: Expect,
) -> Case {
    Case {
        name: name.to_owned(),
        raw: build_request(addr, method, path, headers, body),
        expect,
        timeout: Duration::from_secs(10),
    }
}

fn raw_case(name: &str, raw: Vec<u8>, expect: Expect) -> Case {
    Case {
        name: name.to_owned(),
        raw,
        expect,
        timeout: Duration::from_secs(10),
    }
}

/// What happened to one raw request.
enum Outcome {
    Answer(Response),
    Closed(String),
}

/// Sends raw bytes on a fresh connection and reads one answer. Write errors (the server
/// may answer and close before reading everything) are tolerated.
fn send_raw(addr: SocketAddr, raw: &[u8], timeout: Duration, head_only: bool) -> Outcome {
    let mut c = match Conn::open(addr, timeout) {
        Ok(c) => c,
        Err(e) => return Outcome::Closed(format!("connect failed: {e}")),
    };
    let write_err = c.write_raw(raw).err();
    match c.read_response(head_only) {
        Ok(r) => Outcome::Answer(r),
        Err(e) => Outcome::Closed(format!("no answer ({e}); write error: {write_err:?}")),
    }
}

struct Report {
    failures: Vec<String>,
}

impl Report {
    fn new() -> Report {
        Report {
            failures: Vec::new(),
        }
    }

    fn judge(&mut self, name: &str, expect: Expect, outcome: Outcome) {
        match (expect, outcome) {
            (Expect::HttpLayer, Outcome::Closed(_)) => {}
            (_, Outcome::Closed(why)) => {
                self.failures.push(format!("{name}: no HTTP answer: {why}"))
            }
            (expect, Outcome::Answer(r)) => {
                if r.status >= 500 {
                    self.failures
                        .push(format!("{name}: server error {}", r.describe()));
                    return;
                }
                if !(400..500).contains(&r.status) {
                    self.failures
                        .push(format!("{name}: expected a 4xx, got {}", r.describe()));
                    return;
                }
                match expect {
                    Expect::Code(status, code) => {
                        if r.status != status {
                            self.failures.push(format!(
                                "{name}: expected {status} {code}, got {}",
                                r.describe()
                            ));
                            return;
                        }
                        match check_error_body(&r) {
                            Ok(c) if c == code => {}
                            Ok(c) => self.failures.push(format!(
                                "{name}: expected code {code}, got {c}: {}",
                                r.describe()
                            )),
                            Err(e) => self.failures.push(format!("{name}: {e}")),
                        }
                    }
                    Expect::Any4xx => {
                        if let Err(e) = check_error_body(&r) {
                            self.failures.push(format!("{name}: {e}"));
                        }
                    }
                    Expect::HttpLayer => {
                        if r.body.is_empty() {
                            self.failures.push(format!(
                                "{name}: HTTP-layer {} {} with an empty body (not the JSON error shape)",
                                r.status, r.reason
                            ));
                        } else if let Err(e) = check_error_body(&r) {
                            self.failures.push(format!("{name}: {e}"));
                        }
                    }
                }
            }
        }
    }

    fn finish(self) {
        assert!(
            self.failures.is_empty(),
            "{} malformed request(s) were not rejected properly:\n{}",
            self.failures.len(),
            self.failures.join("\n")
        );
    }
}

impl Fingerprint {
    fn describe(&self) -> String {
        format!(
            "data={:?} jdata={:?} heads={:?} listing={:?}",
            String::from_utf8_lossy(&self.data),
            String::from_utf8_lossy(&self.jdata),
            self.heads,
            self.listing
        )
    }
}

/// Status, `Stream-Next-Offset`, `Stream-Incarnation`, `ETag` and `Stream-Closed` of a HEAD.
#[derive(Debug, PartialEq, Eq)]
struct HeadFacts(u16, [Option<String>; 4]);

/// The state that must not change: bytes, tails, incarnations, closed flags.
#[derive(Debug, PartialEq, Eq)]
struct Fingerprint {
    data: Vec<u8>,
    jdata: Vec<u8>,
    heads: Vec<HeadFacts>,
    listing: Vec<String>,
}

fn fingerprint(s: &Server) -> Fingerprint {
    let (data, _) = s.read_all(DATA);
    let jdata = s
        .req(
            "GET",
            &format!("{JDATA}?offset=-1"),
            &[("Accept", "application/x-ndjson")],
            b"",
        )
        .body;
    let heads = [DATA, JDATA]
        .iter()
        .map(|p| {
            let r = s.head(p);
            let h = |n: &str| r.header(n).map(str::to_owned);
            HeadFacts(
                r.status,
                [
                    h("stream-next-offset"),
                    h("stream-incarnation"),
                    h("etag"),
                    h("stream-closed"),
                ],
            )
        })
        .collect();
    let v = s.get("/badinput/streams").json();
    let listing = v["streams"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|e| e["stream_id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    Fingerprint {
        data,
        jdata,
        heads,
        listing,
    }
}

fn setup(s: &Server) -> Fingerprint {
    assert_eq!(s.put(DATA, "text/plain", b"line-1\n").status, 201);
    assert_eq!(s.post(DATA, "text/plain", b"line-2\n").status, 204);
    let r = s.req(
        "POST",
        DATA,
        &[
            ("Content-Type", "text/plain"),
            ("Producer-Id", "bp"),
            ("Producer-Epoch", "0"),
            ("Producer-Seq", "0"),
        ],
        b"line-3\n",
    );
    assert_eq!(r.status, 200, "{}", r.describe());
    assert_eq!(
        s.put(JDATA, "application/json", br#"[{"a":1},{"b":[1,2]}]"#)
            .status,
        201
    );
    let f = fingerprint(s);
    assert_eq!(f.data, b"line-1\nline-2\nline-3\n");
    assert_eq!(f.listing, ["data", "jdata"]);
    f
}

/// Checks the server still answers ordinary requests and nothing changed.
fn check_intact(s: &mut Server, before: &Fingerprint) -> Result<(), String> {
    if !s.is_running() {
        return Err(format!("server process died; log:\n{}", s.log_tail(60)));
    }
    let r = s.get(&format!("{DATA}?offset=-1"));
    if r.status != 200 {
        return Err(format!("server no longer serves: {}", r.describe()));
    }
    let after = fingerprint(s);
    if &after != before {
        return Err(format!(
            "malformed requests changed stored state:\n before: {}\n after:  {}",
            before.describe(),
            after.describe()
        ));
    }
    // And it still accepts a well-formed write afterwards.
    let r = s.put("/badinput/after", "text/plain", b"ok");
    if r.status != 201 {
        return Err(format!(
            "well-formed create after the corpus: {}",
            r.describe()
        ));
    }
    if s.read_all("/badinput/after").0 != b"ok" {
        return Err("well-formed write after the corpus reads back wrong".to_owned());
    }
    Ok(())
}

#[test]
fn malformed_requests_get_json_4xx_and_change_nothing() {
    let mut s = Server::start();
    let before = setup(&s);
    let a = s.addr();
    let mut cases: Vec<Case> = Vec::new();
    use Expect::{Any4xx, Code, HttpLayer};
    let bad_bucket = Code(400, "INVALID_BUCKET_ID");
    let bad_stream = Code(400, "INVALID_STREAM_ID");
    let bad_offset = Code(400, "INVALID_OFFSET");
    let bad_query = Code(400, "INVALID_QUERY");
    let bad_header = Code(400, "INVALID_HEADER");
    let bad_producer = Code(400, "INVALID_PRODUCER");
    let bad_json = Code(400, "INVALID_JSON");
    let text = [("Content-Type", "text/plain")];

    // -- bucket IDs --
    let long_bucket = format!("/{}/data", "b".repeat(65));
    for p in [
        "/ab/data",
        "/ABCD/data",
        "/a%00bc/data",
        "/bad.bucket/data",
        "/b%FFcd/data",
        "/b%zzcd/data",
        long_bucket.as_str(),
    ] {
        cases.push(case(a, &format!("GET {p}"), "GET", p, &[], b"", bad_bucket));
        cases.push(case(
            a,
            &format!("PUT {p}"),
            "PUT",
            p,
            &text,
            b"x",
            bad_bucket,
        ));
    }
    cases.push(case(a, "PUT /ab", "PUT", "/ab", &[], b"", bad_bucket));
    cases.push(case(
        a,
        "GET /ab/streams",
        "GET",
        "/ab/streams",
        &[],
        b"",
        bad_bucket,
    ));
    cases.push(case(
        a,
        "DELETE /UPPER",
        "DELETE",
        "/UPPER",
        &[],
        b"",
        bad_bucket,
    ));

    // -- stream IDs (never a 404: validation precedes lookup) --
    let long_stream = format!("/badinput/{}", "x".repeat(123));
    let long_combined = format!("/badinput/{}", "x".repeat(114)); // 8 + 1 + 114 = 123 bytes
    let long_compat = format!("/v1/stream/{}", "y".repeat(111));
    let long_compat_escaped = format!("/v1/stream/{}", "a/".repeat(40) + "b"); // 40 * 4 + 1 bytes escaped
    for p in [
        "/badinput/a%00b",
        "/badinput/%00",
        "/badinput/a..b",
        "/badinput/..",
        "/badinput/%2e%2e",
        "/badinput/..%2F..%2Fetc",
        "/badinput/a%2Fb",
        "/badinput/%24x",
        "/badinput/$x",
        "/badinput/%FF",
        "/badinput/%C3%28",
        long_stream.as_str(),
        long_combined.as_str(),
        "/v1/stream/a//b",
        "/v1/stream/../x",
        "/v1/stream/a/./b",
        "/v1/stream/a/..",
        "/v1/stream/a%2Fb",
        "/v1/stream/%24x",
        "/v1/stream/streams",
        "/v1/stream/a%00",
        "/v1/stream/%FF",
        long_compat.as_str(),
        long_compat_escaped.as_str(),
    ] {
        let name = truncate(p, 60);
        cases.push(case(
            a,
            &format!("GET {name}"),
            "GET",
            p,
            &[],
            b"",
            bad_stream,
        ));
        cases.push(case(
            a,
            &format!("PUT {name}"),
            "PUT",
            p,
            &text,
            b"x",
            bad_stream,
        ));
        cases.push(case(
            a,
            &format!("POST {name}"),
            "POST",
            p,
            &text,
            b"x",
            bad_stream,
        ));
        cases.push(case(
            a,
            &format!("DELETE {name}"),
            "DELETE",
            p,
            &[],
            b"",
            bad_stream,
        ));
    }
    cases.push(case(
        a,
        "PUT /badinput/streams",
        "PUT",
        "/badinput/streams",
        &text,
        b"x",
        Any4xx,
    ));
    cases.push(case(
        a,
        "GET /badinput/__ds",
        "GET",
        "/badinput/__ds",
        &[],
        b"",
        Any4xx,
    ));
    cases.push(case(
        a,
        "PATCH data",
        "PATCH",
        DATA,
        &text,
        b"x",
        Code(405, "METHOD_NOT_ALLOWED"),
    ));
    cases.push(case(
        a,
        "POST bucket",
        "POST",
        "/badinput",
        &text,
        b"x",
        Code(405, "METHOD_NOT_ALLOWED"),
    ));
    cases.push(case(
        a,
        "GET /__ursula/nope",
        "GET",
        "/__ursula/nope",
        &[],
        b"",
        Code(404, "NOT_FOUND"),
    ));

    // -- offsets --
    for q in [
        "offset=abc",
        "offset=-2",
        "offset=",
        "offset=+1",
        "offset=0x10",
        "offset=1.5",
        "offset=%201",
        "offset=1%20",
        "offset=1e3",
        "offset=NOW",
        "offset=-1-1",
        "offset=--1",
        "offset=000000000000000000001",
        "offset=18446744073709551616",
        "offset=99999999999999999999",
        "offset=%FF",
    ] {
        cases.push(case(
            a,
            &format!("GET ?{q}"),
            "GET",
            &format!("{DATA}?{q}"),
            &[],
            b"",
            bad_offset,
        ));
        cases.push(case(
            a,
            &format!("long-poll ?{q}"),
            "GET",
            &format!("{DATA}?{q}&live=long-poll&timeout_ms=10"),
            &[],
            b"",
            bad_offset,
        ));
    }
    for q in [
        "offset=0&offset=0",
        "offset=-1&offset=now",
        "offset=abc&offset=0",
    ] {
        cases.push(case(
            a,
            &format!("GET ?{q}"),
            "GET",
            &format!("{DATA}?{q}"),
            &[],
            b"",
            Any4xx,
        ));
    }
    for q in ["offset=0&offset=0", "offset=-1&offset=now"] {
        cases.push(case(
            a,
            &format!("GET ?{q} (code)"),
            "GET",
            &format!("{DATA}?{q}"),
            &[],
            b"",
            bad_query,
        ));
    }
    cases.push(case(
        a,
        "JSON read inside a message",
        "GET",
        &format!("{JDATA}?offset=3"),
        &[],
        b"",
        bad_offset,
    ));
    cases.push(case(
        a,
        "offset beyond tail",
        "GET",
        &format!("{DATA}?offset={}", off20(99_999)),
        &[],
        b"",
        Code(416, "OFFSET_OUT_OF_RANGE"),
    ));

    // -- live / timeout_ms / max_bytes --
    for q in [
        "offset=0&live=foo",
        "offset=0&live=",
        "offset=0&live=LONG-POLL",
        "offset=0&live=longpoll",
        "live=long-poll",
        "live=sse",
        "offset=0&live=long-poll&timeout_ms=abc",
        "offset=0&live=long-poll&timeout_ms=-1",
        "offset=0&live=long-poll&timeout_ms=1.5",
        "offset=0&live=long-poll&timeout_ms=",
        "offset=0&live=long-poll&timeout_ms=1e3",
        "offset=0&max_bytes=0",
        "offset=0&max_bytes=abc",
        "offset=0&max_bytes=-5",
        "offset=0&max_bytes=1.5",
        "offset=0&max_bytes=",
        "offset=0&live=long-poll&max_bytes=0",
        "offset=0&live=sse&max_bytes=0",
    ] {
        cases.push(case(
            a,
            &format!("GET ?{q}"),
            "GET",
            &format!("{DATA}?{q}"),
            &[],
            b"",
            bad_query,
        ));
    }

    // -- lifetime / incarnation / fork headers on create (streams must not appear) --
    let mut n = 0;
    let mut never_created: Vec<String> = Vec::new();
    let mut put_bad =
        |cases: &mut Vec<Case>, name: &str, headers: &[(&str, &str)], expect: Expect| {
            n += 1;
            let p = format!("/badinput/never-{n}");
            let mut h = vec![("Content-Type", "text/plain")];
            h.extend_from_slice(headers);
            cases.push(case(a, name, "PUT", &p, &h, b"body", expect));
            never_created.push(p);
        };
    for v in [
        "0",
        "-1",
        "+3600",
        "03600",
        "3600.0",
        "3.6e3",
        "",
        "abc",
        "1 0",
        "18446744073709551615",
        "99999999999999999999999",
        "0x10",
    ] {
        put_bad(
            &mut cases,
            &format!("Stream-TTL {v:?}"),
            &[("Stream-TTL", v)],
            bad_header,
        );
    }
    put_bad(
        &mut cases,
        "TTL and Expires-At",
        &[
            ("Stream-TTL", "60"),
            ("Stream-Expires-At", "2099-01-01T00:00:00Z"),
        ],
        bad_header,
    );
    for v in [
        "tomorrow",
        "2000-01-01T00:00:00Z",
        "2099-13-01T00:00:00Z",
        "2099-01-01",
        "",
        "1700000000",
        "2099-01-01T00:00:00",
    ] {
        put_bad(
            &mut cases,
            &format!("Stream-Expires-At {v:?}"),
            &[("Stream-Expires-At", v)],
            bad_header,
        );
    }
    for v in [
        "xyz",
        "0123456789abcdef0123456789abcde",
        "0123456789abcdef0123456789abcdef0",
        "0123456789abcdef0123456789abcdeg",
        "",
    ] {
        put_bad(
            &mut cases,
            &format!("PUT Stream-Incarnation {v:?}"),
            &[("Stream-Incarnation", v)],
            bad_header,
        );
    }
    put_bad(
        &mut cases,
        "fork offset without source",
        &[("Stream-Fork-Offset", "0")],
        bad_header,
    );
    put_bad(
        &mut cases,
        "PUT producer seq abc",
        &[
            ("Producer-Id", "p"),
            ("Producer-Epoch", "0"),
            ("Producer-Seq", "abc"),
        ],
        bad_producer,
    );
    put_bad(
        &mut cases,
        "PUT producer id only",
        &[("Producer-Id", "p")],
        bad_producer,
    );
    n += 1;
    let pj = format!("/badinput/never-{n}");
    cases.push(case(
        a,
        "PUT invalid JSON body",
        "PUT",
        &pj,
        &[("Content-Type", "application/json")],
        b"{oops",
        bad_json,
    ));
    never_created.push(pj);
    n += 1;
    let pbig = format!("/badinput/never-{n}");
    never_created.push(pbig.clone());

    // -- producer and other append headers (must not append) --
    let prod = |id: &'static str, e: &'static str, q: &'static str| {
        vec![
            ("Content-Type", "text/plain"),
            ("Producer-Id", id),
            ("Producer-Epoch", e),
            ("Producer-Seq", q),
        ]
    };
    for (name, headers) in [
        (
            "producer id only",
            vec![("Content-Type", "text/plain"), ("Producer-Id", "p")],
        ),
        (
            "producer without seq",
            vec![
                ("Content-Type", "text/plain"),
                ("Producer-Id", "p"),
                ("Producer-Epoch", "0"),
            ],
        ),
        (
            "producer epoch+seq only",
            vec![
                ("Content-Type", "text/plain"),
                ("Producer-Epoch", "0"),
                ("Producer-Seq", "0"),
            ],
        ),
        ("empty producer id", prod("  ", "0", "0")),
        ("epoch abc", prod("p", "abc", "0")),
        ("epoch -1", prod("p", "-1", "0")),
        ("epoch +1", prod("p", "+1", "0")),
        ("seq 1.5", prod("p", "0", "1.5")),
        ("seq 1 2", prod("p", "0", "1 2")),
        ("epoch 2^53", prod("p", "9007199254740992", "0")),
        ("seq 2^64", prod("p", "0", "18446744073709551616")),
        ("epoch empty", prod("p", "", "0")),
    ] {
        cases.push(case(
            a,
            &format!("POST {name}"),
            "POST",
            DATA,
            &headers,
            b"evil\n",
            bad_producer,
        ));
    }
    cases.push(raw_case(
        "POST non-ASCII Producer-Id",
        {
            let mut r = format!("POST {DATA} HTTP/1.1\r\nHost: {a}\r\nContent-Type: text/plain\r\n").into_bytes();
            r.extend_from_slice(b"Producer-Id: \xff\xfe\r\nProducer-Epoch: 0\r\nProducer-Seq: 0\r\nContent-Length: 5\r\n\r\nevil\n");
            r
        },
        Any4xx,
    ));
    for v in [
        "xyz",
        "0123456789abcdef",
        "",
        "0123456789abcdef0123456789abcdef00",
    ] {
        cases.push(case(
            a,
            &format!("POST Stream-Incarnation {v:?}"),
            "POST",
            DATA,
            &[("Content-Type", "text/plain"), ("Stream-Incarnation", v)],
            b"evil\n",
            bad_header,
        ));
        cases.push(case(
            a,
            &format!("DELETE Stream-Incarnation {v:?}"),
            "DELETE",
            DATA,
            &[("Stream-Incarnation", v)],
            b"",
            bad_header,
        ));
    }
    for v in ["abc", "-1", "1.5", ""] {
        cases.push(case(
            a,
            &format!("Stream-Record-Match {v:?}"),
            "POST",
            JDATA,
            &[
                ("Content-Type", "application/json"),
                ("Stream-Record-Match", v),
            ],
            b"{}",
            bad_header,
        ));
    }

    // -- bodies and content types --
    cases.push(case(
        a,
        "POST without Content-Type",
        "POST",
        DATA,
        &[],
        b"evil\n",
        Code(400, "MISSING_CONTENT_TYPE"),
    ));
    cases.push(case(
        a,
        "POST empty Content-Type",
        "POST",
        DATA,
        &[("Content-Type", "")],
        b"evil\n",
        Code(400, "MISSING_CONTENT_TYPE"),
    ));
    cases.push(case(
        a,
        "POST empty body",
        "POST",
        DATA,
        &text,
        b"",
        Code(400, "EMPTY_APPEND"),
    ));
    cases.push(case(
        a,
        "POST wrong content type",
        "POST",
        DATA,
        &[("Content-Type", "application/json")],
        b"{}",
        Code(409, "CONTENT_TYPE_MISMATCH"),
    ));
    cases.push(case(
        a,
        "POST missing stream",
        "POST",
        "/badinput/missing",
        &text,
        b"x",
        Code(404, "STREAM_NOT_FOUND"),
    ));
    let deep_array = "[".repeat(100_000);
    let deep_object = "{\"a\":".repeat(50_000);
    let json_bodies: Vec<(&str, &[u8])> = vec![
        ("{bad", b"{bad"),
        ("[1,2", b"[1,2"),
        ("[]", b"[]"),
        ("two values", br#"{"a":1}{"b":2}"#),
        ("NaN", b"NaN"),
        ("single quotes", b"'single'"),
        ("invalid UTF-8 string", b"\"\xff\xfe\""),
        ("invalid UTF-8 in array", b"[\"ok\",\"\xc3\x28\"]"),
        ("invalid UTF-8 key", b"{\"\xff\":1}"),
        ("missing value", br#"{"a":}"#),
        ("trailing comma", b"[1,]"),
        ("bare word", b"hello"),
        ("only whitespace", b"   \n "),
        ("deep array", deep_array.as_bytes()),
        ("deep object", deep_object.as_bytes()),
        ("NUL byte", b"{\"a\":1}\x00"),
    ];
    for (name, body) in json_bodies {
        cases.push(case(
            a,
            &format!("JSON append {name}"),
            "POST",
            JDATA,
            &[("Content-Type", "application/json")],
            body,
            bad_json,
        ));
    }

    // -- HTTP layer garbage --
    let garbage: Vec<(&str, Vec<u8>)> = vec![
        ("binary garbage", b"\x00\x01\x02\x03garbage\r\n\r\n".to_vec()),
        ("method only", b"GET\r\n\r\n".to_vec()),
        ("no version", format!("GET {DATA}\r\n\r\n").into_bytes()),
        ("HTTP/9.9", format!("GET {DATA} HTTP/9.9\r\nHost: x\r\n\r\n").into_bytes()),
        ("bad Content-Length", format!("POST {DATA} HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: abc\r\n\r\nevil\n").into_bytes()),
        ("negative Content-Length", format!("POST {DATA} HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: -5\r\n\r\nevil\n").into_bytes()),
        (
            "conflicting Content-Lengths",
            format!("POST {DATA} HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 5\r\nContent-Length: 3\r\n\r\nevil\n").into_bytes(),
        ),
        ("space in header name", format!("GET {DATA} HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n").into_bytes()),
        ("header without colon", format!("GET {DATA} HTTP/1.1\r\nHost: x\r\nNoColonHere\r\n\r\n").into_bytes()),
        ("NUL in request line", format!("GET {DATA}\0 HTTP/1.1\r\nHost: x\r\n\r\n").into_bytes()),
        ("space in path", format!("GET {DATA} x HTTP/1.1\r\nHost: x\r\n\r\n").into_bytes()),
        ("asterisk target", b"GET * HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()),
        ("1 MiB header value", format!("GET {DATA} HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "v".repeat(1 << 20)).into_bytes()),
        ("1 MiB URI", format!("GET {DATA}?pad={} HTTP/1.1\r\nHost: x\r\n\r\n", "p".repeat(1 << 20)).into_bytes()),
        (
            "200 headers",
            format!(
                "GET {DATA} HTTP/1.1\r\nHost: x\r\n{}\r\n",
                (0..200).map(|i| format!("X-H{i}: v\r\n")).collect::<String>()
            )
            .into_bytes(),
        ),
        ("TLS client hello", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03rest-of-hello".to_vec()),
        ("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00".to_vec()),
    ];
    for (name, raw) in garbage {
        cases.push(raw_case(name, raw, HttpLayer));
    }
    // Bad chunked framing reaches the route, which reads the body: a JSON 400.
    for (name, body) in [
        ("bad chunk size", "ZZ\r\nabc\r\n0\r\n\r\n"),
        ("chunk longer than declared", "3\r\nabcdef\r\n0\r\n\r\n"),
        (
            "chunk size overflow",
            "FFFFFFFFFFFFFFFFFF\r\nabc\r\n0\r\n\r\n",
        ),
    ] {
        let mut raw = format!(
            "POST {DATA} HTTP/1.1\r\nHost: {a}\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        .into_bytes();
        raw.extend_from_slice(body.as_bytes());
        cases.push(raw_case(&format!("chunked: {name}"), raw, HttpLayer));
    }

    // -- run the corpus --
    let mut report = Report::new();
    let t0 = Instant::now();
    for c in &cases {
        let head_only = c.raw.starts_with(b"HEAD ");
        let outcome = send_raw(a, &c.raw, c.timeout, head_only);
        report.judge(&c.name, c.expect, outcome);
    }
    eprintln!("{} malformed requests in {:?}", cases.len(), t0.elapsed());

    // -- oversized bodies: 413 without sending the body --
    for (name, method, path) in [("POST", "POST", DATA), ("PUT", "PUT", pbig.as_str())] {
        let raw = format!(
            "{method} {path} HTTP/1.1\r\nHost: {a}\r\nContent-Type: text/plain\r\nContent-Length: 33554433\r\n\r\n"
        );
        let t = Instant::now();
        let outcome = send_raw(a, raw.as_bytes(), Duration::from_secs(10), false);
        report.judge(
            &format!("{name} declared 33554433 bytes"),
            Code(413, "PAYLOAD_TOO_LARGE"),
            outcome,
        );
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "413 took {:?}",
            t.elapsed()
        );
    }
    // A streamed (chunked) body that grows beyond 32 MiB.
    match oversized_chunked(a) {
        (Outcome::Closed(why), Some(write_error)) => eprintln!(
            "NOTE chunked body over 32 MiB: the server closed the connection while the body was \
             being sent ({write_error}); its answer, if any, was lost: {why}"
        ),
        (outcome, _) => report.judge(
            "chunked body over 32 MiB",
            Code(413, "PAYLOAD_TOO_LARGE"),
            outcome,
        ),
    }

    // -- everything rejected, nothing changed --
    for p in &never_created {
        let r = s.head(p);
        if r.status != 404 {
            report.failures.push(format!(
                "{p} exists after a rejected create: {}",
                r.describe()
            ));
        }
    }
    if let Err(e) = check_intact(&mut s, &before) {
        report.failures.push(e);
    }
    let server_errors = s
        .metrics()
        .get("http_server_errors_total")
        .and_then(serde_json::Value::as_u64);
    if let Some(n) = server_errors
        && n != 0
    {
        report
            .failures
            .push(format!("the server counted {n} 5xx answers"));
    }
    report.finish();
}

/// Streams 1 MiB chunks until the server answers or 34 MiB were sent. Returns the outcome
/// and the write error, if sending failed (the server may stop reading and reset the
/// connection while unread body bytes are in flight, which can destroy its answer).
fn oversized_chunked(a: SocketAddr) -> (Outcome, Option<String>) {
    let mut c = match Conn::open(a, Duration::from_secs(20)) {
        Ok(c) => c,
        Err(e) => return (Outcome::Closed(format!("connect: {e}")), None),
    };
    let head = format!(
        "POST {DATA} HTTP/1.1\r\nHost: {a}\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    if let Err(e) = c.write_raw(head.as_bytes()) {
        return (Outcome::Closed(format!("write head: {e}")), None);
    }
    let chunk = {
        let mut v = format!("{:x}\r\n", 1 << 20).into_bytes();
        v.extend(std::iter::repeat_n(b'z', 1 << 20));
        v.extend_from_slice(b"\r\n");
        v
    };
    let mut write_error = None;
    for _ in 0..34 {
        if let Err(e) = c.write_raw(&chunk) {
            write_error = Some(e.to_string());
            break;
        }
    }
    if write_error.is_none() {
        let _ = c.write_raw(b"0\r\n\r\n");
    }
    match c.read_response(false) {
        Ok(r) => (Outcome::Answer(r), write_error),
        Err(e) => (Outcome::Closed(format!("no answer: {e}")), write_error),
    }
}

#[test]
fn stalled_requests_do_not_block_the_server() {
    let mut s = Server::start();
    let before = setup(&s);
    let a = s.addr();
    let t0 = Instant::now();

    // A request head that never completes.
    let mut stalled_head = TcpStream::connect(a).expect("connect");
    stalled_head
        .write_all(format!("GET {DATA} HTTP/1.1\r\nHost: {a}\r\nX-Slow: ").as_bytes())
        .expect("write partial head");
    // A body that never completes, on the stream whose bytes must not change.
    let mut stalled_body = TcpStream::connect(a).expect("connect");
    stalled_body
        .write_all(
            format!("POST {DATA} HTTP/1.1\r\nHost: {a}\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\npartial-\n")
                .as_bytes(),
        )
        .expect("write partial body");
    // Many idle connections.
    let idle: Vec<TcpStream> = (0..50)
        .filter_map(|_| {
            let mut c = TcpStream::connect(a).ok()?;
            c.write_all(b"GE").ok()?;
            Some(c)
        })
        .collect();
    assert_eq!(idle.len(), 50);

    // Meanwhile everyone else is served promptly.
    assert_eq!(s.put("/badinput/other", "text/plain", b"").status, 201);
    for i in 0..20 {
        let t = Instant::now();
        let r = s.post("/badinput/other", "text/plain", format!("{i}\n").as_bytes());
        assert_eq!(r.status, 204, "{}", r.describe());
        let r = s.get(DATA);
        assert_eq!(r.status, 200);
        assert_eq!(r.body, before.data);
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "request took {:?} while others stall",
            t.elapsed()
        );
    }

    // Abandon the partial body: it must never be appended.
    drop(stalled_body);
    drop(idle);

    // The stalled head is closed (or answered with a 4xx) within the server's timeouts.
    let mut c = Conn::from_stream(stalled_head).expect("wrap stream");
    let deadline = t0 + Duration::from_secs(14);
    let mut got = Vec::new();
    let verdict = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break Err("still open after 14 s".to_owned());
        }
        match c.wait_closed(left.min(Duration::from_secs(1))) {
            Ok(PeerState::Closed) => break Ok("closed"),
            Ok(PeerState::Open) => {}
            Ok(PeerState::Data(bytes)) => {
                got.extend_from_slice(&bytes);
                if got.windows(4).any(|w| w == b"\r\n\r\n") {
                    let status: Option<u16> = std::str::from_utf8(&got)
                        .ok()
                        .and_then(|t| t.split(' ').nth(1))
                        .and_then(|v| v.parse().ok());
                    match status {
                        Some(st) if (400..500).contains(&st) => break Ok("answered with a 4xx"),
                        other => {
                            break Err(format!(
                                "answered {other:?}: {:?}",
                                String::from_utf8_lossy(&got)
                            ));
                        }
                    }
                }
            }
            Err(e) => break Err(format!("read error {e}")),
        }
    };
    let verdict = verdict.unwrap_or_else(|e| panic!("stalled request head: {e}"));
    eprintln!("stalled request head {verdict} after {:?}", t0.elapsed());

    let (other, _) = s.read_all("/badinput/other");
    assert_eq!(
        other,
        (0..20)
            .map(|i| format!("{i}\n"))
            .collect::<String>()
            .into_bytes()
    );
    let mut before = before;
    before.listing = vec!["data".into(), "jdata".into(), "other".into()];
    if let Err(e) = check_intact(&mut s, &before) {
        panic!("{e}");
    }
}

/// Name, method, path, headers and body of one request.
type Probe = (
    &'static str,
    &'static str,
    String,
    Vec<(&'static str, &'static str)>,
    Vec<u8>,
);

#[test]
fn extreme_but_valid_values_never_cause_server_errors() {
    let mut s = Server::start();
    let before = setup(&s);
    let a = s.addr();
    let mut report = Report::new();
    use Expect::Any4xx;
    // (name, method, path, headers, body); each must answer below 500 (a 4xx must have the
    // JSON body), and the server must keep working.
    let max_ttl = "18446744073709551"; // ttl * 1000 still fits u64; last_touch + ttl does not
    let cases: Vec<Probe> = vec![
        (
            "huge TTL",
            "PUT",
            "/badinput/ttl-max".into(),
            vec![("Content-Type", "text/plain"), ("Stream-TTL", max_ttl)],
            b"x".to_vec(),
        ),
        (
            "read huge TTL",
            "GET",
            "/badinput/ttl-max?offset=-1".into(),
            vec![],
            vec![],
        ),
        (
            "append huge TTL",
            "POST",
            "/badinput/ttl-max".into(),
            vec![("Content-Type", "text/plain")],
            b"y".to_vec(),
        ),
        (
            "head huge TTL",
            "HEAD",
            "/badinput/ttl-max".into(),
            vec![],
            vec![],
        ),
        (
            "list with huge TTL",
            "GET",
            "/badinput/streams".into(),
            vec![],
            vec![],
        ),
        (
            "far expiry",
            "PUT",
            "/badinput/far".into(),
            vec![
                ("Content-Type", "text/plain"),
                ("Stream-Expires-At", "9999-12-31T23:59:59.999Z"),
            ],
            vec![],
        ),
        (
            "head far expiry",
            "HEAD",
            "/badinput/far".into(),
            vec![],
            vec![],
        ),
        (
            "max producer numbers",
            "POST",
            DATA.into(),
            vec![
                ("Content-Type", "text/plain"),
                ("Producer-Id", "maxp"),
                ("Producer-Epoch", "9007199254740991"),
                ("Producer-Seq", "0"),
            ],
            b"line-4\n".to_vec(),
        ),
        (
            "max producer seq gap",
            "POST",
            DATA.into(),
            vec![
                ("Content-Type", "text/plain"),
                ("Producer-Id", "maxp"),
                ("Producer-Epoch", "9007199254740991"),
                ("Producer-Seq", "9007199254740991"),
            ],
            b"no\n".to_vec(),
        ),
        (
            "max_bytes u64::MAX",
            "GET",
            format!("{DATA}?offset=0&max_bytes=18446744073709551615"),
            vec![],
            vec![],
        ),
        (
            "timeout_ms u64::MAX",
            "GET",
            format!("{DATA}?offset=0&live=long-poll&timeout_ms=18446744073709551615"),
            vec![],
            vec![],
        ),
        (
            "offset u64::MAX",
            "GET",
            format!("{DATA}?offset=18446744073709551615"),
            vec![],
            vec![],
        ),
        (
            "cursor u64::MAX",
            "GET",
            format!("{DATA}?offset=0&live=long-poll&cursor=18446744073709551615"),
            vec![],
            vec![],
        ),
        (
            "cursor garbage",
            "GET",
            format!("{DATA}?offset=0&live=long-poll&cursor=%00%01zz"),
            vec![],
            vec![],
        ),
        (
            "SSE max_bytes 1 on JSON",
            "GET",
            format!("{JDATA}?offset=-1&live=sse&max_bytes=1"),
            vec![],
            vec![],
        ),
        (
            "non-ASCII content type",
            "PUT",
            "/badinput/ct-weird".into(),
            vec![("Content-Type", "text/pl\u{e4}in")],
            b"x".to_vec(),
        ),
        (
            "many semicolons",
            "PUT",
            "/badinput/ct-semis".into(),
            vec![("Content-Type", ";;text/plain;;; a=b ;")],
            b"x".to_vec(),
        ),
        (
            "Accept garbage",
            "GET",
            format!("{JDATA}?offset=-1"),
            vec![("Accept", "application/x-ndjson;q=abc, */*;q=-1,,;")],
            vec![],
        ),
        (
            "If-None-Match garbage",
            "GET",
            format!("{DATA}?offset=-1"),
            vec![("If-None-Match", ",,,\"\",*x")],
            vec![],
        ),
        (
            "unicode stream id",
            "PUT",
            "/badinput/%F0%9F%90%BB%20b%C3%A4r".into(),
            vec![("Content-Type", "text/plain")],
            b"x".to_vec(),
        ),
        (
            "unicode stream read",
            "GET",
            "/badinput/%F0%9F%90%BB%20b%C3%A4r".into(),
            vec![],
            vec![],
        ),
    ];
    let mut created = Vec::new();
    for (name, method, path, headers, body) in &cases {
        let raw = build_request(a, method, path, headers, body);
        // SSE responses do not end: read only the head.
        let outcome = if path.contains("live=sse") {
            let mut c = Conn::open(a, Duration::from_secs(10)).expect("connect");
            c.write_raw(&raw).expect("write");
            match c.read_head() {
                Ok((status, reason, headers)) => Outcome::Answer(Response {
                    status,
                    reason,
                    headers,
                    body: Vec::new(),
                }),
                Err(e) => Outcome::Closed(e.to_string()),
            }
        } else {
            send_raw(a, &raw, Duration::from_secs(20), *method == "HEAD")
        };
        match outcome {
            Outcome::Answer(r) if r.status < 400 => {
                if *method == "PUT" && r.status == 201 {
                    created.push(path.clone());
                }
            }
            outcome => report.judge(name, Any4xx, outcome),
        }
    }
    // Everything created is alive (none of the lifetimes above can have run out) and readable.
    for p in &created {
        let r = s.get(&format!("{p}?offset=-1"));
        if r.status != 200 {
            report
                .failures
                .push(format!("reading {p}: {}", r.describe()));
        }
    }
    // The one accepted append to DATA changes it; everything else must be as before.
    let mut before = before;
    let r = s.get(DATA);
    if r.body == b"line-1\nline-2\nline-3\nline-4\n" {
        before = Fingerprint {
            data: r.body.clone(),
            heads: fingerprint(&s).heads,
            ..before
        };
    } else {
        report.failures.push(format!(
            "DATA after the extreme producer append: {:?}",
            r.text()
        ));
    }
    before.listing = fingerprint(&s).listing;
    if let Err(e) = check_intact(&mut s, &before) {
        report.failures.push(e);
    }
    report.finish();
}

#[test]
fn a_body_that_stops_arriving_gets_408_and_appends_nothing() {
    let cfg_dir = tempfile::tempdir().expect("temp dir");
    let cfg = cfg_dir.path().join("ursula.toml");
    std::fs::write(&cfg, "body_timeout_ms = 600\n").expect("write config");
    let s = Server::start_with_args(&["--config", cfg.to_str().expect("utf-8 path")]);
    assert_eq!(s.put("/badinput/slow", "text/plain", b"kept\n").status, 201);
    let a = s.addr();

    let mut stalled = TcpStream::connect(a).expect("connect");
    let t0 = Instant::now();
    stalled
        .write_all(
            format!("POST /badinput/slow HTTP/1.1\r\nHost: {a}\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\npartial-\n")
                .as_bytes(),
        )
        .expect("write partial body");
    let mut c = Conn::from_stream(stalled).expect("wrap stream");
    c.set_read_timeout(Duration::from_secs(10))
        .expect("timeout");
    let r = c
        .read_response(false)
        .expect("an answer to the stalled body");
    let waited = t0.elapsed();
    assert_eq!(r.status, 408, "{}", r.describe());
    assert_eq!(check_error_body(&r), Ok("REQUEST_TIMEOUT".to_owned()));
    assert!(
        waited >= Duration::from_millis(500) && waited < Duration::from_secs(8),
        "answered after {waited:?}, with body_timeout_ms = 600"
    );

    // A body that arrives whole is not affected, and the partial one was never appended.
    assert_eq!(
        s.post("/badinput/slow", "text/plain", b"more\n").status,
        204
    );
    let (bytes, _) = s.read_all("/badinput/slow");
    assert_eq!(bytes, b"kept\nmore\n");
}
