//! User-visible behaviour of the stream API, black-box over HTTP against the real binary.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use common::{Response, Server, SseEvent, SseStream, assert_error, off20, try_request, wait_until};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

// ---- helpers ------------------------------------------------------------------------------

fn producer_post(s: &Server, path: &str, id: &str, epoch: u64, seq: u64, body: &[u8]) -> Response {
    let (e, q) = (epoch.to_string(), seq.to_string());
    s.req(
        "POST",
        path,
        &[
            ("Content-Type", "text/plain"),
            ("Producer-Id", id),
            ("Producer-Epoch", &e),
            ("Producer-Seq", &q),
        ],
        body,
    )
}

#[track_caller]
fn assert_status(r: &Response, status: u16) {
    assert_eq!(r.status, status, "unexpected answer: {}", r.describe());
}

/// Reads the whole body of a catch-up GET and checks the status.
#[track_caller]
fn get_ok(s: &Server, path: &str) -> Response {
    let r = s.get(path);
    assert_status(&r, 200);
    r
}

/// Waits (bounded) until the server reports a waiting long-poll reader, when it exposes
/// that gauge. Correctness never depends on it; it only makes the wake path likelier.
fn wait_for_waiter(s: &Server) {
    let _ = wait_until(Duration::from_secs(3), || {
        s.metrics()
            .get("live_waiters")
            .and_then(Value::as_u64)
            .is_none_or(|n| n >= 1)
    });
}

fn long_poll_in_thread(
    addr: SocketAddr,
    path: String,
) -> std::thread::JoinHandle<(Response, Duration)> {
    std::thread::spawn(move || {
        let t0 = Instant::now();
        let r = try_request(addr, "GET", &path, &[], b"", Duration::from_secs(45))
            .unwrap_or_else(|e| panic!("long-poll {path}: {e}"));
        (r, t0.elapsed())
    })
}

fn next_event(sse: &mut SseStream, what: &str) -> SseEvent {
    let deadline = Instant::now() + Duration::from_secs(10);
    match sse.next_event(deadline) {
        Ok(Some(e)) => e,
        Ok(None) => panic!(
            "SSE ended while waiting for {what}; raw {:?}",
            String::from_utf8_lossy(&sse.raw)
        ),
        Err(e) => panic!(
            "SSE error while waiting for {what}: {e}; raw {:?}",
            String::from_utf8_lossy(&sse.raw)
        ),
    }
}

/// Checks that every `event: data` in a raw SSE body is directly followed by `event: control`.
fn assert_data_control_pairs(raw: &[u8]) {
    let text = String::from_utf8_lossy(raw).replace("\r\n", "\n");
    let kinds: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("event:"))
        .map(str::trim)
        .collect();
    for w in kinds.windows(2) {
        if w[0] == "data" {
            assert_eq!(
                w[1], "control",
                "a data event not followed by a control event: {kinds:?}"
            );
        }
    }
    assert_ne!(
        kinds.last(),
        Some(&"data"),
        "SSE ended with a data event: {kinds:?}"
    );
}

#[test]
fn a_node_behind_a_trusted_proxy_names_the_forwarded_base_in_location() {
    let fwd = [
        ("Content-Type", "text/plain"),
        (
            "Forwarded",
            "for=192.0.2.60;proto=https;host=streams.example.com",
        ),
    ];
    let xfwd = [
        ("Content-Type", "text/plain"),
        ("X-Forwarded-Proto", "https"),
        ("X-Forwarded-Host", "edge.example:8443"),
    ];
    let trusted = Server::start_with_args(&["--trust-forwarded-headers", "true"]);
    let r = trusted.req("PUT", "/proxied/a", &fwd, b"");
    assert_status(&r, 201);
    assert_eq!(
        r.header("location"),
        Some("https://streams.example.com/proxied/a")
    );
    let r = trusted.req("PUT", "/proxied/b", &xfwd, b"");
    assert_eq!(
        r.header("location"),
        Some("https://edge.example:8443/proxied/b")
    );
    // A forwarded host that is not a valid authority is ignored, not echoed.
    let bad = [
        ("Content-Type", "text/plain"),
        ("X-Forwarded-Host", "x\"><b>"),
    ];
    let r = trusted.req("PUT", "/proxied/c", &bad, b"");
    let loc = r.header("location").expect("Location");
    assert!(loc.starts_with("http://127.0.0.1:"), "{loc}");

    // By default the headers are a client's, not a proxy's: ignored.
    let s = Server::start();
    let r = s.req("PUT", "/proxied/a", &fwd, b"");
    let loc = r.header("location").expect("Location");
    assert!(loc.starts_with("http://127.0.0.1:"), "{loc}");
}

// ---- round trips ----------------------------------------------------------------------------

#[test]
fn native_layout_round_trip() {
    let s = Server::start();
    let p = "/demo-bucket/greetings";

    let r = s.put(p, "text/plain", b"hello ");
    assert_status(&r, 201);
    let loc = r.header("location").expect("Location on 201");
    assert!(
        loc.starts_with("http://") && loc.ends_with(p),
        "Location {loc:?}"
    );
    assert_eq!(r.next_offset(), 6);
    let inc = r.incarnation();
    assert_eq!(r.header("content-type"), Some("text/plain"));
    assert!(r.header("etag").is_none(), "create must not carry an ETag");
    assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
    assert_eq!(
        r.header("cross-origin-resource-policy"),
        Some("cross-origin")
    );
    assert_eq!(r.header("cache-control"), Some("no-store"));
    assert!(r.body.is_empty());

    let r = s.post(p, "text/plain", b"world");
    assert_status(&r, 204);
    assert_eq!(r.next_offset(), 11);
    assert!(r.header("etag").is_none());
    // Parameters and case of the media type do not matter for matching.
    let r = s.post(p, "Text/Plain; charset=utf-8", b"!");
    assert_status(&r, 204);
    assert_eq!(r.next_offset(), 12);

    for q in [
        "",
        "?offset=-1",
        "?offset=00000000000000000000",
        "?offset=0",
    ] {
        let r = get_ok(&s, &format!("{p}{q}"));
        assert_eq!(r.body, b"hello world!", "read {q}");
        assert_eq!(r.next_offset(), 12);
        assert_eq!(r.header("stream-up-to-date"), Some("true"));
        assert_eq!(r.header("content-type"), Some("text/plain"));
        assert_eq!(r.header("cache-control"), Some("no-store"));
        assert!(r.header("etag").is_some(), "catch-up 200 carries an ETag");
        assert!(r.header("stream-closed").is_none());
        assert!(
            r.header("stream-cursor").is_none(),
            "no cursor on catch-up reads"
        );
    }
    let r = get_ok(&s, &format!("{p}?offset={}", off20(6)));
    assert_eq!(r.body, b"world!");
    let r = get_ok(&s, &format!("{p}?offset=6"));
    assert_eq!(r.body, b"world!");
    assert_eq!(r.next_offset(), 12);

    let r = get_ok(&s, &format!("{p}?offset=now"));
    assert!(r.body.is_empty());
    assert_eq!(r.next_offset(), 12);
    assert_eq!(r.header("stream-up-to-date"), Some("true"));
    assert!(r.header("etag").is_none(), "offset=now has no ETag");

    let r = get_ok(&s, &format!("{p}?offset=12"));
    assert!(r.body.is_empty());
    assert_eq!(r.header("stream-up-to-date"), Some("true"));

    let r = get_ok(&s, &format!("{p}?offset=0&max_bytes=5"));
    assert_eq!(r.body, b"hello");
    assert_eq!(r.next_offset(), 5);
    assert!(
        r.header("stream-up-to-date").is_none(),
        "partial read is not up to date"
    );

    let r = s.get(&format!("{p}?offset=13"));
    assert_error(&r, 416, "OFFSET_OUT_OF_RANGE");
    assert_eq!(r.next_offset(), 12);

    let r = s.head(p);
    assert_status(&r, 200);
    assert!(r.body.is_empty());
    assert_eq!(r.header("content-type"), Some("text/plain"));
    assert_eq!(r.next_offset(), 12);
    assert_eq!(r.header("stream-up-to-date"), Some("true"));
    assert_eq!(r.incarnation(), inc);
    assert!(r.header("etag").is_some());
    assert!(r.header("stream-closed").is_none());
    assert_eq!(r.header("ursula-max-request-bytes"), Some("33554432"));
    assert_eq!(r.header("cache-control"), Some("no-store"));

    let r = s.post(p, "application/json", b"{}");
    assert_error(&r, 409, "CONTENT_TYPE_MISMATCH");
    assert_eq!(r.next_offset(), 12);
    let r = s.post(p, "text/plain", b"");
    assert_error(&r, 400, "EMPTY_APPEND");
    let r = s.req("POST", p, &[], b"no type");
    assert_error(&r, 400, "MISSING_CONTENT_TYPE");

    let r = s.post("/demo-bucket/missing", "text/plain", b"x");
    assert_error(&r, 404, "STREAM_NOT_FOUND");
    let r = s.get("/demo-bucket/missing");
    assert_error(&r, 404, "STREAM_NOT_FOUND");
    assert_eq!(
        r.header("cross-origin-resource-policy"),
        Some("cross-origin")
    );
    let r = s.head("/demo-bucket/missing");
    assert_status(&r, 404);

    // Nothing above changed the data.
    let (bytes, tail) = s.read_all(p);
    assert_eq!(bytes, b"hello world!");
    assert_eq!(tail, 12);
}

#[test]
fn compat_layout_round_trip() {
    let s = Server::start();
    let p = "/v1/stream/orders/2024";
    let r = s.put(p, "text/plain", b"a\n");
    assert_status(&r, 201);
    let loc = r.header("location").expect("Location");
    assert!(
        loc.starts_with("http://") && loc.ends_with(p),
        "Location {loc:?}"
    );
    let inc = r.incarnation();
    assert_eq!(r.next_offset(), 2);

    let r = s.post(p, "text/plain", b"b\n");
    assert_status(&r, 204);
    assert_eq!(r.next_offset(), 4);

    let r = get_ok(&s, &format!("{p}?offset=-1"));
    assert_eq!(r.body, b"a\nb\n");
    assert_eq!(r.next_offset(), 4);

    // The same stream through the native layout of the compatibility bucket.
    let native = "/__compat_v1/orders%252F2024";
    let r = get_ok(&s, native);
    assert_eq!(r.body, b"a\nb\n");
    let r = s.head(native);
    assert_status(&r, 200);
    assert_eq!(r.incarnation(), inc);

    let r = get_ok(&s, "/__compat_v1/streams");
    let v = r.json();
    let entry = v["streams"]
        .as_array()
        .expect("streams array")
        .iter()
        .find(|e| e["stream_id"] == "orders%2F2024")
        .unwrap_or_else(|| panic!("compat stream not listed: {v}"));
    assert_eq!(entry["compat_path"], "orders/2024", "{v}");
    assert_eq!(entry["tail_offset"], 4, "{v}");
    assert_eq!(entry["status"], "Open", "{v}");

    assert_error(&s.get("/v1/stream"), 404, "NOT_FOUND");
    assert_error(&s.get("/v1/other/x"), 404, "NOT_FOUND");

    assert_status(&s.delete(p), 204);
    assert_error(&s.get(p), 404, "STREAM_NOT_FOUND");
}

// ---- create rules -------------------------------------------------------------------------

#[test]
fn create_is_idempotent_and_conflicts_on_config() {
    let s = Server::start();
    let p = "/rules/s1";
    let ttl = [("Content-Type", "text/plain"), ("Stream-TTL", "3600")];
    let r = s.req("PUT", p, &ttl, b"init");
    assert_status(&r, 201);
    assert_eq!(r.header("stream-ttl"), Some("3600"));
    let inc = r.incarnation();
    assert_eq!(r.next_offset(), 4);

    let r = s.req("PUT", p, &ttl, b"");
    assert_status(&r, 200);
    assert_eq!(r.incarnation(), inc);
    assert_eq!(r.next_offset(), 4);
    assert!(
        r.header("location").is_some_and(|l| l.ends_with(p)),
        "200 create keeps Location"
    );

    // Body, charset parameter, Stream-Seq and producer (seq 0) do not count: 200, body ignored.
    let r = s.req(
        "PUT",
        p,
        &[
            ("Content-Type", "text/plain; charset=utf-8"),
            ("Stream-TTL", "3600"),
            ("Stream-Seq", "zzz"),
            ("Producer-Id", "p"),
            ("Producer-Epoch", "0"),
            ("Producer-Seq", "0"),
        ],
        b"ignored body",
    );
    assert_status(&r, 200);
    assert_eq!(r.next_offset(), 4);
    assert_eq!(s.read_all(p).0, b"init");

    for (what, headers) in [
        ("no TTL", vec![("Content-Type", "text/plain")]),
        (
            "other type",
            vec![("Content-Type", "application/json"), ("Stream-TTL", "3600")],
        ),
        (
            "other TTL",
            vec![("Content-Type", "text/plain"), ("Stream-TTL", "60")],
        ),
        (
            "closed",
            vec![
                ("Content-Type", "text/plain"),
                ("Stream-TTL", "3600"),
                ("Stream-Closed", "true"),
            ],
        ),
        (
            "expires-at",
            vec![
                ("Content-Type", "text/plain"),
                ("Stream-Expires-At", "2099-01-01T00:00:00Z"),
            ],
        ),
    ] {
        let r = s.req("PUT", p, &headers, b"");
        assert_eq!(r.status, 409, "{what}: {}", r.describe());
        assert_eq!(r.error_code(), "STREAM_ALREADY_EXISTS_CONFLICT", "{what}");
    }

    // Producer-Seq != 0 on a create is a conflict whether or not the stream exists.
    let prod = |seq: &'static str| {
        vec![
            ("Content-Type", "text/plain"),
            ("Stream-TTL", "3600"),
            ("Producer-Id", "p"),
            ("Producer-Epoch", "0"),
            ("Producer-Seq", seq),
        ]
    };
    let r = s.req("PUT", p, &prod("1"), b"");
    assert_error(&r, 409, "PRODUCER_SEQ_CONFLICT");
    assert_eq!(r.header("producer-expected-seq"), Some("0"));
    assert_eq!(r.header("producer-received-seq"), Some("1"));
    let r = s.req("PUT", "/rules/never", &prod("5"), b"x");
    assert_error(&r, 409, "PRODUCER_SEQ_CONFLICT");
    assert_status(&s.head("/rules/never"), 404);

    // Length limits: `len(bucket) + 1 + len(stream) <= 122` bytes.
    let longest = format!("/rules/{}", "l".repeat(116));
    assert_status(&s.put(&longest, "text/plain", b"x"), 201);
    assert_eq!(s.read_all(&longest).0, b"x");
    let too_long = format!("/rules/{}", "l".repeat(117));
    assert_error(
        &s.put(&too_long, "text/plain", b"x"),
        400,
        "INVALID_STREAM_ID",
    );

    // Default content type.
    let r = s.req("PUT", "/rules/s2", &[], b"");
    assert_status(&r, 201);
    assert_eq!(r.header("content-type"), Some("application/octet-stream"));
    assert_eq!(r.next_offset(), 0);
    assert_status(&s.put("/rules/s2", "application/octet-stream", b""), 200);

    // Normalized content type.
    assert_status(&s.put("/rules/s3", "Text/Plain ;Charset=UTF-8", b""), 201);
    let r = s.head("/rules/s3");
    assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));

    // Absolute expiry is echoed with millisecond precision; equal instants match.
    let r = s.req(
        "PUT",
        "/rules/s4",
        &[
            ("Content-Type", "text/plain"),
            ("Stream-Expires-At", "2099-01-01T00:00:00Z"),
        ],
        b"",
    );
    assert_status(&r, 201);
    assert_eq!(
        r.header("stream-expires-at"),
        Some("2099-01-01T00:00:00.000Z")
    );
    let r = s.req(
        "PUT",
        "/rules/s4",
        &[
            ("Content-Type", "text/plain"),
            ("Stream-Expires-At", "2099-01-01T00:00:00.000Z"),
        ],
        b"",
    );
    assert_status(&r, 200);
    let r = s.req(
        "PUT",
        "/rules/s4",
        &[
            ("Content-Type", "text/plain"),
            ("Stream-Expires-At", "2099-01-01T00:00:01Z"),
        ],
        b"",
    );
    assert_error(&r, 409, "STREAM_ALREADY_EXISTS_CONFLICT");

    // Created closed: same state matches, open request conflicts.
    let closed = [("Content-Type", "text/plain"), ("Stream-Closed", "true")];
    let r = s.req("PUT", "/rules/s5", &closed, b"final");
    assert_status(&r, 201);
    assert_eq!(r.header("stream-closed"), Some("true"));
    assert_eq!(r.next_offset(), 5);
    assert_status(&s.req("PUT", "/rules/s5", &closed, b""), 200);
    assert_error(
        &s.put("/rules/s5", "text/plain", b""),
        409,
        "STREAM_ALREADY_EXISTS_CONFLICT",
    );
}

// ---- JSON mode ----------------------------------------------------------------------------

#[test]
fn json_streams_flatten_one_level_and_read_as_arrays() {
    let s = Server::start();
    let p = "/jsonb/events";
    let r = s.put(p, "application/json", br#"[{"a":1},{"b":2}]"#);
    assert_status(&r, 201);
    assert_eq!(r.next_offset(), 16, "two canonical lines of 8 bytes");

    let r = s.post(p, "application/json", b"[[1,2],[3,4]]");
    assert_status(&r, 204);
    assert_eq!(r.next_offset(), 28);
    let r = s.post(p, "application/json", b"[[[1,2,3]]]");
    assert_status(&r, 204);
    assert_eq!(r.next_offset(), 38);
    let r = s.post(
        p,
        "application/json; charset=utf-8",
        b" { \"event\" : \"x\" ,\n \"n\": [1, 2] } ",
    );
    assert_status(&r, 204);
    assert_eq!(r.next_offset(), 62, "re-serialized compactly");
    let r = s.post(p, "application/json", b"42");
    assert_status(&r, 204);
    assert_eq!(r.next_offset(), 65);

    let expected = json!([{"a":1},{"b":2},[1,2],[3,4],[[1,2,3]],{"event":"x","n":[1,2]},42]);
    let r = get_ok(&s, &format!("{p}?offset=-1"));
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.json(), expected);
    assert_eq!(r.next_offset(), 65);
    assert_eq!(r.header("stream-up-to-date"), Some("true"));

    // NDJSON on request: the canonical bytes.
    let r = s.req(
        "GET",
        &format!("{p}?offset=-1"),
        &[("Accept", "application/x-ndjson")],
        b"",
    );
    assert_status(&r, 200);
    assert_eq!(r.header("content-type"), Some("application/x-ndjson"));
    assert_eq!(r.body.len(), 65);
    assert_eq!(r.next_offset(), 65);
    let lines: Vec<Value> = r
        .text()
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    assert_eq!(Value::Array(lines), expected);
    assert!(r.body.ends_with(b"\n"));

    let r = get_ok(&s, &format!("{p}?offset=16"));
    assert_eq!(
        r.json(),
        json!([[1,2],[3,4],[[1,2,3]],{"event":"x","n":[1,2]},42])
    );
    assert_error(&s.get(&format!("{p}?offset=3")), 400, "INVALID_OFFSET");

    // max_bytes ends on a message boundary; one larger message is returned alone.
    let r = get_ok(&s, &format!("{p}?offset=0&max_bytes=10"));
    assert_eq!(r.json(), json!([{"a":1}]));
    assert_eq!(r.next_offset(), 8);
    let r = get_ok(&s, &format!("{p}?offset=0&max_bytes=1"));
    assert_eq!(r.json(), json!([{"a":1}]));
    assert_eq!(r.next_offset(), 8);

    let r = get_ok(&s, &format!("{p}?offset=now"));
    assert_eq!(r.json(), json!([]));
    assert_eq!(r.next_offset(), 65);

    assert_error(&s.post(p, "application/json", b"[]"), 400, "INVALID_JSON");
    assert_error(&s.post(p, "application/json", b"{bad"), 400, "INVALID_JSON");
    assert_error(
        &s.post(p, "application/json", br#"{"a":1}{"b":2}"#),
        400,
        "INVALID_JSON",
    );
    assert_eq!(
        s.head(p).next_offset(),
        65,
        "rejected appends change nothing"
    );

    // `[]` and an empty body create empty streams.
    for (path, body) in [("/jsonb/empty1", &b"[]"[..]), ("/jsonb/empty2", &b""[..])] {
        let r = s.put(path, "application/json", body);
        assert_status(&r, 201);
        assert_eq!(r.next_offset(), 0);
        assert_eq!(get_ok(&s, path).json(), json!([]));
    }

    // The protocol's worked example.
    let ex = "/jsonb/example";
    assert_status(&s.put(ex, "application/json", b""), 201);
    assert_status(
        &s.post(ex, "application/json", br#"{"event":"first"}"#),
        204,
    );
    let r = s.post(ex, "application/json", br#"{"event":"second"}"#);
    assert_eq!(r.next_offset(), 37);
    let r = get_ok(&s, ex);
    assert_eq!(r.json(), json!([{"event":"first"},{"event":"second"}]));
    assert_eq!(r.next_offset(), 37);
    let r = get_ok(&s, &format!("{ex}?offset=now"));
    assert_eq!(r.body, b"[]");
    assert_eq!(r.next_offset(), 37);
}

// ---- producers ----------------------------------------------------------------------------

#[test]
fn idempotent_producers() {
    let s = Server::start();
    let p = "/prod/s";
    assert_status(&s.put(p, "text/plain", b""), 201);

    let r = producer_post(&s, p, "p1", 0, 0, b"a0|");
    assert_status(&r, 200);
    assert!(r.body.is_empty());
    assert_eq!(r.header("producer-epoch"), Some("0"));
    assert_eq!(r.header("producer-seq"), Some("0"));
    assert_eq!(r.next_offset(), 3);
    let r = producer_post(&s, p, "p1", 0, 1, b"a1|");
    assert_status(&r, 200);
    assert_eq!(r.next_offset(), 6);

    // Duplicates: 204 with the original result, body ignored, nothing appended.
    let r = producer_post(&s, p, "p1", 0, 1, b"DIFFERENT");
    assert_status(&r, 204);
    assert_eq!(r.next_offset(), 6);
    assert_eq!(r.header("producer-epoch"), Some("0"));
    assert_eq!(r.header("producer-seq"), Some("1"));
    let r = producer_post(&s, p, "p1", 0, 0, b"x");
    assert_status(&r, 204);
    assert_eq!(
        r.next_offset(),
        3,
        "duplicate returns the original Stream-Next-Offset"
    );

    // Gap.
    let r = producer_post(&s, p, "p1", 0, 3, b"gap");
    assert_error(&r, 409, "PRODUCER_SEQ_CONFLICT");
    assert_eq!(r.header("producer-expected-seq"), Some("2"));
    assert_eq!(r.header("producer-received-seq"), Some("3"));

    // New epoch, then the old one is stale.
    let r = producer_post(&s, p, "p1", 1, 0, b"b0|");
    assert_status(&r, 200);
    assert_eq!(r.next_offset(), 9);
    let r = producer_post(&s, p, "p1", 0, 2, b"zombie");
    assert_error(&r, 403, "PRODUCER_EPOCH_STALE");
    assert_eq!(r.header("producer-epoch"), Some("1"));
    let r = producer_post(&s, p, "p1", 2, 1, b"bad");
    assert_error(&r, 400, "INVALID_PRODUCER");

    // Unknown producer must start at 0; producers are independent.
    let r = producer_post(&s, p, "p2", 0, 1, b"z");
    assert_error(&r, 409, "PRODUCER_SEQ_CONFLICT");
    assert_eq!(r.header("producer-expected-seq"), Some("0"));
    assert_status(&producer_post(&s, p, "p2", 0, 0, b"c0|"), 200);

    // Plain appends interleave freely.
    assert_status(&s.post(p, "text/plain", b"plain|"), 204);
    assert_eq!(s.read_all(p).0, b"a0|a1|b0|c0|plain|");

    // Same producer id on another stream has its own state.
    assert_status(&s.put("/prod/t", "text/plain", b""), 201);
    assert_status(&producer_post(&s, "/prod/t", "p1", 0, 0, b"t"), 200);

    // Producer on create: receipt 0.
    let r = s.req(
        "PUT",
        "/prod/u",
        &[
            ("Content-Type", "text/plain"),
            ("Producer-Id", "p9"),
            ("Producer-Epoch", "0"),
            ("Producer-Seq", "0"),
        ],
        b"init",
    );
    assert_status(&r, 201);
    assert_eq!(r.header("producer-epoch"), Some("0"));
    assert_eq!(r.header("producer-seq"), Some("0"));
    assert_status(&producer_post(&s, "/prod/u", "p9", 0, 1, b"+1"), 200);
    let r = producer_post(&s, "/prod/u", "p9", 0, 0, b"again");
    assert_status(&r, 204);
    assert_eq!(r.next_offset(), 4);
    assert_eq!(s.read_all("/prod/u").0, b"init+1");
}

// ---- close --------------------------------------------------------------------------------

#[test]
fn close_semantics() {
    let s = Server::start();
    let p = "/closing/s";
    let close = [("Content-Type", "text/plain"), ("Stream-Closed", "true")];
    assert_status(&s.put(p, "text/plain", b"abc"), 201);

    // Stream-Closed with any value but `true` is absent.
    let r = s.req(
        "POST",
        p,
        &[("Content-Type", "text/plain"), ("Stream-Closed", "false")],
        b"-",
    );
    assert_status(&r, 204);
    assert!(r.header("stream-closed").is_none());

    let r = s.req("POST", p, &close, b"def");
    assert_status(&r, 204);
    assert_eq!(r.header("stream-closed"), Some("true"));
    assert_eq!(r.next_offset(), 7);

    let r = s.post(p, "text/plain", b"x");
    assert_error(&r, 409, "STREAM_CLOSED");
    assert_eq!(r.header("stream-closed"), Some("true"));
    assert_eq!(r.next_offset(), 7);
    let r = s.req("POST", p, &close, b"more");
    assert_error(&r, 409, "STREAM_CLOSED");
    let r = s.post(p, "text/plain", b"");
    assert_error(&r, 409, "STREAM_CLOSED");

    // Close-only is idempotent, and ignores Content-Type entirely.
    for ct in ["text/plain", "image/png"] {
        let r = s.req(
            "POST",
            p,
            &[("Content-Type", ct), ("Stream-Closed", "TRUE")],
            b"",
        );
        assert_status(&r, 204);
        assert_eq!(r.header("stream-closed"), Some("true"));
        assert_eq!(r.next_offset(), 7);
    }

    let r = get_ok(&s, p);
    assert_eq!(r.body, b"abc-def");
    assert_eq!(r.header("stream-closed"), Some("true"));
    assert_eq!(r.header("stream-up-to-date"), Some("true"));
    let r = get_ok(&s, &format!("{p}?offset=0&max_bytes=3"));
    assert_eq!(r.body, b"abc");
    assert!(
        r.header("stream-closed").is_none(),
        "partial read never carries Stream-Closed"
    );
    let r = get_ok(&s, &format!("{p}?offset=7"));
    assert!(r.body.is_empty());
    assert_eq!(r.header("stream-closed"), Some("true"));

    for q in [format!("offset={}", off20(7)), "offset=now".to_owned()] {
        let t0 = Instant::now();
        let r = s.get(&format!("{p}?{q}&live=long-poll&timeout_ms=20000"));
        assert_status(&r, 204);
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "closed long-poll must answer at once"
        );
        assert_eq!(r.header("stream-closed"), Some("true"));
        assert_eq!(r.header("stream-up-to-date"), Some("true"));
        assert!(r.header("stream-cursor").is_none());
        assert_eq!(r.next_offset(), 7);
    }

    let r = s.head(p);
    assert_eq!(r.header("stream-closed"), Some("true"));
    assert_error(
        &s.put(p, "text/plain", b""),
        409,
        "STREAM_ALREADY_EXISTS_CONFLICT",
    );
    assert_status(&s.req("PUT", p, &close, b""), 200);

    // Close-only on an open stream with no content type at all.
    assert_status(&s.put("/closing/t", "text/plain", b"t"), 201);
    let r = s.req("POST", "/closing/t", &[("Stream-Closed", "true")], b"");
    assert_status(&r, 204);
    assert_eq!(r.header("stream-closed"), Some("true"));
    assert_eq!(r.next_offset(), 1);

    // Producer append-and-close; its retry is a duplicate; anything else is closed.
    let u = "/closing/u";
    assert_status(&s.put(u, "text/plain", b""), 201);
    let ph = |seq: &'static str| {
        vec![
            ("Content-Type", "text/plain"),
            ("Stream-Closed", "true"),
            ("Producer-Id", "px"),
            ("Producer-Epoch", "0"),
            ("Producer-Seq", seq),
        ]
    };
    let r = s.req("POST", u, &ph("0"), b"last");
    assert_status(&r, 200);
    assert_eq!(r.header("stream-closed"), Some("true"));
    let r = s.req("POST", u, &ph("0"), b"last");
    assert_status(&r, 204);
    assert_eq!(r.header("stream-closed"), Some("true"));
    assert_eq!(r.next_offset(), 4);
    let r = producer_post(&s, u, "px", 0, 1, b"more");
    assert_error(&r, 409, "STREAM_CLOSED");
    assert_eq!(r.header("stream-closed"), Some("true"));
    assert_eq!(s.read_all(u).0, b"last");
}

// ---- live reads ---------------------------------------------------------------------------

#[test]
fn long_poll_times_out_and_wakes_on_append_close_and_delete() {
    let s = Server::start();
    let p = "/lpoll/s";
    assert_status(&s.put(p, "text/plain", b"x"), 201);
    assert_error(&s.get(&format!("{p}?live=long-poll")), 400, "INVALID_QUERY");

    // Timeout: 204 with cursor.
    let t0 = Instant::now();
    let r = s.get(&format!("{p}?offset=1&live=long-poll&timeout_ms=300"));
    let waited = t0.elapsed();
    assert_status(&r, 204);
    assert!(
        waited >= Duration::from_millis(250),
        "answered after {waited:?}, before its timeout"
    );
    assert!(waited < Duration::from_secs(5), "answered after {waited:?}");
    assert_eq!(r.next_offset(), 1);
    assert_eq!(r.header("stream-up-to-date"), Some("true"));
    let c1 = common::parse_off20(r.header("stream-cursor").expect("cursor on 204"));
    assert!(r.header("etag").is_none());
    let r = s.get(&format!(
        "{p}?offset=1&live=long-poll&timeout_ms=50&cursor={}",
        off20(c1)
    ));
    assert_status(&r, 204);
    let c2 = common::parse_off20(r.header("stream-cursor").expect("cursor"));
    assert!(c2 > c1, "echoed cursor must grow: {c1} -> {c2}");

    // Data already there: immediate 200.
    let r = get_ok(&s, &format!("{p}?offset=0&live=long-poll&timeout_ms=20000"));
    assert_eq!(r.body, b"x");
    assert!(r.header("stream-cursor").is_some());

    // Wake on append.
    let h = long_poll_in_thread(
        s.addr(),
        format!("{p}?offset={}&live=long-poll&timeout_ms=30000", off20(1)),
    );
    wait_for_waiter(&s);
    assert_status(&s.post(p, "text/plain", b"hello"), 204);
    let (r, took) = h.join().expect("long-poll thread");
    assert_status(&r, 200);
    assert_eq!(r.body, b"hello");
    assert_eq!(r.next_offset(), 6);
    assert!(r.header("stream-cursor").is_some());
    assert!(r.header("etag").is_some());
    assert!(
        took < Duration::from_secs(20),
        "long-poll woke only after {took:?}"
    );

    // Wake on close.
    let h = long_poll_in_thread(
        s.addr(),
        format!("{p}?offset=6&live=long-poll&timeout_ms=30000"),
    );
    wait_for_waiter(&s);
    assert_status(&s.req("POST", p, &[("Stream-Closed", "true")], b""), 204);
    let (r, took) = h.join().expect("long-poll thread");
    assert_status(&r, 204);
    assert_eq!(r.header("stream-closed"), Some("true"));
    assert!(r.header("stream-cursor").is_none());
    assert!(
        took < Duration::from_secs(20),
        "close woke the long-poll only after {took:?}"
    );

    // Delete while waiting: 404.
    let d = "/lpoll/d";
    assert_status(&s.put(d, "text/plain", b""), 201);
    let h = long_poll_in_thread(
        s.addr(),
        format!("{d}?offset=0&live=long-poll&timeout_ms=30000"),
    );
    wait_for_waiter(&s);
    assert_status(&s.delete(d), 204);
    let (r, took) = h.join().expect("long-poll thread");
    assert_eq!(
        r.status,
        404,
        "long-poll on a deleted stream: {}",
        r.describe()
    );
    assert!(
        took < Duration::from_secs(20),
        "delete woke the long-poll only after {took:?}"
    );
}

#[test]
fn sse_delivers_data_then_control_events() {
    let s = Server::start();
    let p = "/ssebk/text";
    assert_status(&s.put(p, "text/plain", b"hello"), 201);

    let mut sse = SseStream::open(s.addr(), &format!("{p}?offset=-1&live=sse")).expect("open SSE");
    assert_eq!(sse.status, 200);
    assert_eq!(sse.header("content-type"), Some("text/event-stream"));
    assert_eq!(sse.header("cache-control"), Some("no-cache"));
    assert!(sse.header("content-length").is_none());
    assert_eq!(sse.header("stream-data-content-type"), Some("text/plain"));
    assert!(sse.header("stream-sse-data-encoding").is_none());

    let e = next_event(&mut sse, "first data");
    assert_eq!(
        e,
        SseEvent {
            event: "data".into(),
            data: "hello".into()
        }
    );
    let c = next_event(&mut sse, "first control").control();
    assert_eq!(c["streamNextOffset"], off20(5));
    assert_eq!(c["upToDate"], true);
    assert!(
        c["streamCursor"].as_str().is_some_and(|v| v.len() == 20),
        "{c}"
    );

    assert_status(&s.post(p, "text/plain", b"world\nline2"), 204);
    let e = next_event(&mut sse, "second data");
    assert_eq!(
        e,
        SseEvent {
            event: "data".into(),
            data: "world\nline2".into()
        }
    );
    let c = next_event(&mut sse, "second control").control();
    assert_eq!(c["streamNextOffset"], off20(16));

    // Append-and-close: its data, then control events up to streamClosed, then the end.
    let r = s.req(
        "POST",
        p,
        &[("Content-Type", "text/plain"), ("Stream-Closed", "true")],
        b"bye",
    );
    assert_status(&r, 204);
    let e = next_event(&mut sse, "closing data");
    assert_eq!(
        e,
        SseEvent {
            event: "data".into(),
            data: "bye".into()
        }
    );
    let mut closed = false;
    for _ in 0..2 {
        let c = next_event(&mut sse, "closing control").control();
        assert_eq!(c["streamNextOffset"], off20(19));
        if c["streamClosed"] == true {
            assert_eq!(c["upToDate"], true);
            assert!(
                c.get("streamCursor").is_none(),
                "no cursor on the final event: {c}"
            );
            closed = true;
            break;
        }
    }
    assert!(closed, "no control event with streamClosed: true");
    let end = sse.next_event(Instant::now() + Duration::from_secs(10));
    assert!(
        matches!(end, Ok(None)),
        "SSE must end after streamClosed, got {end:?}"
    );
    assert_data_control_pairs(&sse.raw);

    // Binary data is base64.
    let bin: &[u8] = &[0, 1, 2, 255, 254, b'\n', b'\r', 0x80];
    let r = s.req(
        "PUT",
        "/ssebk/bin",
        &[
            ("Content-Type", "application/octet-stream"),
            ("Stream-Closed", "true"),
        ],
        bin,
    );
    assert_status(&r, 201);
    let mut sse = SseStream::open(s.addr(), "/ssebk/bin?offset=-1&live=sse").expect("open SSE");
    assert_eq!(sse.status, 200);
    assert_eq!(sse.header("stream-sse-data-encoding"), Some("base64"));
    let e = next_event(&mut sse, "binary data");
    assert_eq!(e.event, "data");
    use base64::Engine as _;
    let b64: String = e
        .data
        .chars()
        .filter(|c| *c != '\n' && *c != '\r')
        .collect();
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(b64.as_bytes())
        .expect("valid base64");
    assert_eq!(decoded, bin);
    let mut n = 0;
    loop {
        n += 1;
        assert!(n < 5, "too many events");
        match sse.next_event(Instant::now() + Duration::from_secs(10)) {
            Ok(Some(ev)) if ev.event == "control" => {}
            Ok(None) => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_data_control_pairs(&sse.raw);

    // JSON streams: each data event is one array.
    let r = s.req(
        "PUT",
        "/ssebk/json",
        &[
            ("Content-Type", "application/json"),
            ("Stream-Closed", "true"),
        ],
        br#"[{"a":1},{"b":2}]"#,
    );
    assert_status(&r, 201);
    let mut sse = SseStream::open(s.addr(), "/ssebk/json?offset=-1&live=sse").expect("open SSE");
    assert_eq!(
        sse.header("stream-data-content-type"),
        Some("application/json")
    );
    let e = next_event(&mut sse, "json data");
    assert_eq!(e.event, "data");
    let v: Value = serde_json::from_str(&e.data).expect("JSON array");
    assert_eq!(v, json!([{"a":1},{"b":2}]));

    // offset=now on an open stream: a control event first, no data.
    assert_status(&s.put("/ssebk/open", "text/plain", b"old"), 201);
    let mut sse = SseStream::open(s.addr(), "/ssebk/open?offset=now&live=sse").expect("open SSE");
    let c = next_event(&mut sse, "now control").control();
    assert_eq!(c["streamNextOffset"], off20(3));
    assert_eq!(c["upToDate"], true);
    assert_status(&s.post("/ssebk/open", "text/plain", b"new"), 204);
    let e = next_event(&mut sse, "new data");
    assert_eq!(
        e,
        SseEvent {
            event: "data".into(),
            data: "new".into()
        }
    );

    // Errors before the stream starts are ordinary HTTP errors.
    assert_error(
        &s.get("/ssebk/missing?offset=-1&live=sse"),
        404,
        "STREAM_NOT_FOUND",
    );
    assert_error(&s.get("/ssebk/open?live=sse"), 400, "INVALID_QUERY");
}

// ---- caching ------------------------------------------------------------------------------

#[test]
fn etag_and_if_none_match() {
    let s = Server::start();
    let p = "/etags/s";
    assert_status(&s.put(p, "text/plain", b"one"), 201);
    let r = get_ok(&s, &format!("{p}?offset=-1"));
    let e1 = r.header("etag").expect("ETag").to_owned();
    assert!(
        e1.starts_with('"') && e1.ends_with('"'),
        "strong quoted ETag: {e1}"
    );

    let r = s.req(
        "GET",
        &format!("{p}?offset=-1"),
        &[("If-None-Match", &e1)],
        b"",
    );
    assert_status(&r, 304);
    assert!(r.body.is_empty());
    assert_eq!(r.header("etag"), Some(e1.as_str()));
    assert_eq!(r.next_offset(), 3);
    assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
    let list = format!("\"other\", {e1}");
    assert_status(
        &s.req(
            "GET",
            &format!("{p}?offset=-1"),
            &[("If-None-Match", &list)],
            b"",
        ),
        304,
    );
    assert_status(
        &s.req(
            "GET",
            &format!("{p}?offset=-1"),
            &[("If-None-Match", "\"nope\"")],
            b"",
        ),
        200,
    );

    assert_status(&s.post(p, "text/plain", b"two"), 204);
    let r = s.req(
        "GET",
        &format!("{p}?offset=-1"),
        &[("If-None-Match", &e1)],
        b"",
    );
    assert_status(&r, 200);
    assert_eq!(r.body, b"onetwo");
    let e2 = r.header("etag").expect("ETag").to_owned();
    assert_ne!(e1, e2);
    let r = get_ok(&s, &format!("{p}?offset=0&max_bytes=3"));
    let e3 = r.header("etag").expect("ETag").to_owned();
    assert_ne!(e3, e2, "different range, different ETag");

    // HEAD has a stream-state ETag.
    let r = s.head(p);
    let h1 = r.header("etag").expect("HEAD ETag").to_owned();
    assert_status(&s.req("HEAD", p, &[("If-None-Match", &h1)], b""), 304);

    // Closing changes both ETags even without new data.
    assert_status(&s.req("POST", p, &[("Stream-Closed", "true")], b""), 204);
    let r = s.req(
        "GET",
        &format!("{p}?offset=-1"),
        &[("If-None-Match", &e2)],
        b"",
    );
    assert_status(&r, 200);
    assert_eq!(r.header("stream-closed"), Some("true"));
    assert_ne!(r.header("etag"), Some(e2.as_str()));
    let r = s.req("HEAD", p, &[("If-None-Match", &h1)], b"");
    assert_status(&r, 200);
    assert_ne!(r.header("etag"), Some(h1.as_str()));
}

// ---- lifecycle ----------------------------------------------------------------------------

#[test]
fn ttl_and_expires_at_make_streams_disappear() {
    let s = Server::start();
    let p = "/ttlb/s";
    let t0 = Instant::now();
    let r = s.req(
        "PUT",
        p,
        &[("Content-Type", "text/plain"), ("Stream-TTL", "1")],
        b"data",
    );
    assert_status(&r, 201);
    assert_eq!(r.header("stream-ttl"), Some("1"));
    let inc1 = r.incarnation();
    assert_eq!(s.head(p).header("stream-ttl"), Some("1"));

    // HEAD never renews, so polling with HEAD observes the expiry.
    assert!(
        wait_until(Duration::from_secs(10), || s.head(p).status == 404),
        "TTL stream still alive after 10 s"
    );
    assert!(
        t0.elapsed() >= Duration::from_millis(900),
        "expired after only {:?}",
        t0.elapsed()
    );
    assert_error(&s.get(p), 404, "STREAM_NOT_FOUND");
    assert_error(&s.post(p, "text/plain", b"x"), 404, "STREAM_NOT_FOUND");
    assert_error(&s.delete(p), 404, "STREAM_NOT_FOUND");
    let r = s.req(
        "PUT",
        p,
        &[("Content-Type", "text/plain"), ("Stream-TTL", "1")],
        b"",
    );
    assert_status(&r, 201);
    assert_ne!(
        r.incarnation(),
        inc1,
        "a re-created stream is a new incarnation"
    );
    assert_eq!(r.next_offset(), 0);

    // Absolute expiry.
    let at = (chrono::Utc::now() + chrono::Duration::milliseconds(1500))
        .format("%Y-%m-%dT%H:%M:%S%.3fZ")
        .to_string();
    let e = "/ttlb/e";
    let r = s.req(
        "PUT",
        e,
        &[("Content-Type", "text/plain"), ("Stream-Expires-At", &at)],
        b"x",
    );
    assert_status(&r, 201);
    assert_eq!(r.header("stream-expires-at"), Some(at.as_str()));
    assert_eq!(s.head(e).header("stream-expires-at"), Some(at.as_str()));
    assert!(
        wait_until(Duration::from_secs(10), || s.head(e).status == 404),
        "Stream-Expires-At stream still alive after 10 s"
    );
    assert_error(&s.get(e), 404, "STREAM_NOT_FOUND");

    // Sliding window: an append renews it. The sleeps let wall-clock time pass; they do not
    // synchronize with the server.
    let sl = "/ttlb/slide";
    assert_status(
        &s.req(
            "PUT",
            sl,
            &[("Content-Type", "text/plain"), ("Stream-TTL", "2")],
            b"",
        ),
        201,
    );
    std::thread::sleep(Duration::from_millis(1200));
    assert_status(&s.post(sl, "text/plain", b"touch"), 204);
    std::thread::sleep(Duration::from_millis(1200));
    assert_status(&s.head(sl), 200);
    assert!(
        wait_until(Duration::from_secs(10), || s.head(sl).status == 404),
        "sliding TTL stream never expired"
    );
}

#[test]
fn delete_then_recreate_gives_new_incarnation() {
    let s = Server::start();
    let p = "/delb/s";
    let r = s.put(p, "text/plain", b"abc");
    assert_status(&r, 201);
    let inc1 = r.incarnation();
    assert_status(&producer_post(&s, p, "pp", 0, 0, b"+"), 200);

    let r = s.delete(p);
    assert_status(&r, 204);
    assert!(r.body.is_empty());
    assert_error(&s.get(p), 404, "STREAM_NOT_FOUND");
    assert_status(&s.head(p), 404);
    assert_error(&s.delete(p), 404, "STREAM_NOT_FOUND");
    assert_error(&s.post(p, "text/plain", b"x"), 404, "STREAM_NOT_FOUND");

    let r = s.put(p, "application/json", br#"{"v":2}"#);
    assert_status(&r, 201);
    let inc2 = r.incarnation();
    assert_ne!(inc1, inc2);
    assert_eq!(r.next_offset(), 8);
    assert_eq!(get_ok(&s, p).json(), json!([{"v":2}]));
    assert_eq!(s.head(p).incarnation(), inc2);

    // Producer state does not carry over to the new incarnation.
    let r = s.req(
        "POST",
        p,
        &[
            ("Content-Type", "application/json"),
            ("Producer-Id", "pp"),
            ("Producer-Epoch", "0"),
            ("Producer-Seq", "1"),
        ],
        b"1",
    );
    assert_error(&r, 409, "PRODUCER_SEQ_CONFLICT");

    // Incarnation preconditions.
    let r = s.req("DELETE", p, &[("Stream-Incarnation", &inc1)], b"");
    assert_error(&r, 412, "INCARNATION_MISMATCH");
    assert_eq!(r.incarnation(), inc2);
    assert_status(&s.head(p), 200);
    let r = s.req(
        "POST",
        p,
        &[
            ("Content-Type", "application/json"),
            ("Stream-Incarnation", &inc1),
        ],
        b"3",
    );
    assert_error(&r, 412, "INCARNATION_MISMATCH");
    let r = s.req("DELETE", p, &[("Stream-Incarnation", &inc2)], b"");
    assert_status(&r, 204);
    assert_status(&s.head(p), 404);
}

// ---- durability across restarts -----------------------------------------------------------

struct Snapshot {
    plain: Vec<u8>,
    json: Value,
    closed: Vec<u8>,
    compat: Vec<u8>,
    incarnations: Vec<String>,
}

const DURABLE_PATHS: [&str; 4] = [
    "/durable/plain",
    "/durable/json",
    "/durable/closed",
    "/v1/stream/compat/x",
];

fn populate(s: &Server) -> Snapshot {
    assert_status(&s.put("/durable/plain", "text/plain", b"alpha\n"), 201);
    assert_status(&s.post("/durable/plain", "text/plain", b"beta\n"), 204);
    assert_status(
        &producer_post(s, "/durable/plain", "dp", 3, 0, b"p0\n"),
        200,
    );
    assert_status(
        &producer_post(s, "/durable/plain", "dp", 3, 1, b"p1\n"),
        200,
    );
    assert_status(
        &s.put(
            "/durable/json",
            "application/json",
            br#"[{"k":"a"},{"k":"b"}]"#,
        ),
        201,
    );
    assert_status(
        &s.post("/durable/json", "application/json", b"[1,2,3]"),
        204,
    );
    let close = [("Content-Type", "text/plain"), ("Stream-Closed", "true")];
    assert_status(&s.put("/durable/closed", "text/plain", b"so"), 201);
    assert_status(&s.req("POST", "/durable/closed", &close, b" long"), 204);
    assert_status(
        &s.put(
            "/v1/stream/compat/x",
            "application/octet-stream",
            &[0, 1, 2, 3],
        ),
        201,
    );
    snapshot(s)
}

fn snapshot(s: &Server) -> Snapshot {
    Snapshot {
        plain: s.read_all("/durable/plain").0,
        json: get_ok(s, "/durable/json").json(),
        closed: s.read_all("/durable/closed").0,
        compat: s.read_all("/v1/stream/compat/x").0,
        incarnations: DURABLE_PATHS
            .iter()
            .map(|p| s.head(p).incarnation())
            .collect(),
    }
}

fn verify(s: &Server, before: &Snapshot) {
    let now = snapshot(s);
    assert_eq!(now.plain, before.plain);
    assert_eq!(now.plain, b"alpha\nbeta\np0\np1\n");
    assert_eq!(now.json, before.json);
    assert_eq!(now.json, json!([{"k":"a"},{"k":"b"},1,2,3]));
    assert_eq!(now.closed, before.closed);
    assert_eq!(now.compat, before.compat);
    assert_eq!(
        now.incarnations, before.incarnations,
        "incarnations survive restarts"
    );
    let r = s.head("/durable/closed");
    assert_eq!(
        r.header("stream-closed"),
        Some("true"),
        "closure survives restarts"
    );
    assert_error(
        &s.post("/durable/closed", "text/plain", b"x"),
        409,
        "STREAM_CLOSED",
    );
    // Producer state survives: the last request is a duplicate, the next one is new.
    let r = producer_post(s, "/durable/plain", "dp", 3, 1, b"p1\n");
    assert_status(&r, 204);
    assert_eq!(r.next_offset(), 17);
    let r = producer_post(s, "/durable/plain", "dp", 2, 0, b"old");
    assert_error(&r, 403, "PRODUCER_EPOCH_STALE");
    let listed = get_ok(s, "/durable/streams").json();
    assert_eq!(listed["stream_count"], 3, "{listed}");
}

#[test]
fn acknowledged_writes_survive_sigterm() {
    let mut s = Server::start();
    let before = populate(&s);
    let st = s.terminate();
    assert!(
        st.success(),
        "graceful shutdown exit status {st}; log:\n{}",
        s.log_tail(40)
    );
    s.restart();
    verify(&s, &before);
    assert_status(
        &producer_post(&s, "/durable/plain", "dp", 3, 2, b"p2\n"),
        200,
    );
    assert_eq!(s.read_all("/durable/plain").0, b"alpha\nbeta\np0\np1\np2\n");
}

/// Live readers end at shutdown instead of holding the drain: a waiting long-poll answers as
/// a timeout would (`204`, up to date), and an SSE response ends after its last control event.
#[test]
fn live_readers_end_at_sigterm() {
    let mut s = Server::start();
    let p = "/shut/live";
    assert_status(&s.put(p, "text/plain", b"abc"), 201);
    let mut sse = SseStream::open(s.addr(), &format!("{p}?offset=-1&live=sse")).expect("open SSE");
    assert_eq!(next_event(&mut sse, "data").data, "abc");
    assert_eq!(next_event(&mut sse, "control").control()["upToDate"], true);
    let poll = long_poll_in_thread(
        s.addr(),
        format!("{p}?offset=3&live=long-poll&timeout_ms=60000"),
    );
    wait_for_waiter(&s);
    let t0 = Instant::now();
    let st = s.terminate();
    let took = t0.elapsed();
    assert!(st.success(), "exit status {st}; log:\n{}", s.log_tail(40));
    // The drain waits up to 20 s for requests in flight; live readers must not be among them.
    assert!(
        took < Duration::from_secs(10),
        "shutdown took {took:?} with live readers"
    );
    let (r, waited) = poll.join().expect("long-poll thread");
    assert_status(&r, 204);
    assert_eq!(r.header("stream-up-to-date"), Some("true"));
    assert!(
        waited < Duration::from_secs(30),
        "long-poll answered after {waited:?}"
    );
    let end = sse.next_event(Instant::now() + Duration::from_secs(10));
    assert!(
        matches!(end, Ok(None)),
        "SSE did not end at shutdown: {end:?}; raw {:?}",
        String::from_utf8_lossy(&sse.raw)
    );
}

/// SIGTERM drains the requests in flight; a second signal exits at once (cluster.md §15),
/// and what was acknowledged is still there.
#[test]
fn a_second_sigterm_cuts_the_drain_short() {
    use std::io::Write;
    let mut s = Server::start();
    let before = populate(&s);
    // An upload that never finishes keeps the drain waiting.
    let mut slow = std::net::TcpStream::connect(s.addr()).unwrap();
    slow.write_all(
        b"POST /durable/plain HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n\
          Content-Length: 1000\r\n\r\npartial",
    )
    .unwrap();
    let pid = s.pid().unwrap().to_string();
    let term = || {
        let st = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        assert!(st.success());
    };
    term();
    assert!(
        wait_until(Duration::from_secs(10), || s
            .log_tail(20)
            .contains("finishing in-flight requests")),
        "{}",
        s.log_tail(20)
    );
    assert!(s.is_running(), "still draining the slow upload");
    term();
    let st = s.wait_exit(Duration::from_secs(5));
    assert_eq!(st.and_then(|st| st.code()), Some(130), "{}", s.log_tail(20));
    drop(slow);
    s.restart();
    verify(&s, &before);
}

#[test]
fn acknowledged_writes_survive_sigkill() {
    let mut s = Server::start();
    let before = populate(&s);
    s.kill9();
    s.restart();
    verify(&s, &before);
    // A second crash after more writes.
    assert_status(
        &producer_post(&s, "/durable/plain", "dp", 3, 2, b"p2\n"),
        200,
    );
    assert_status(
        &s.post(
            "/durable/json",
            "application/json",
            br#"{"after":"restart"}"#,
        ),
        204,
    );
    s.kill9();
    s.restart();
    assert_eq!(s.read_all("/durable/plain").0, b"alpha\nbeta\np0\np1\np2\n");
    assert_eq!(
        get_ok(&s, "/durable/json").json(),
        json!([{"k":"a"},{"k":"b"},1,2,3,{"after":"restart"}])
    );
    assert_eq!(
        s.head("/durable/plain").incarnation(),
        before.incarnations[0]
    );
}

// ---- buckets ------------------------------------------------------------------------------

#[test]
fn bucket_routes() {
    let s = Server::start();
    let b = "/tenant-a";
    let r = s.req("PUT", b, &[], b"");
    assert_status(&r, 201);
    assert!(r.body.is_empty());
    assert_status(&s.req("PUT", b, &[], b""), 201);
    let r = get_ok(&s, b);
    assert!(
        r.header("content-type")
            .is_some_and(|c| c.starts_with("application/json"))
    );
    assert_eq!(r.json(), json!({"bucket_id": "tenant-a", "streams": 0}));

    for id in ["s-b", "s-a", "s-c", "x-1"] {
        assert_status(
            &s.put(&format!("{b}/{id}"), "text/plain", id.as_bytes()),
            201,
        );
    }
    assert_status(&s.post(&format!("{b}/s-a"), "text/plain", b"++"), 204);
    assert_status(
        &s.req(
            "POST",
            &format!("{b}/s-c"),
            &[("Stream-Closed", "true")],
            b"",
        ),
        204,
    );
    assert_eq!(get_ok(&s, b).json()["streams"], 4);

    let v = get_ok(&s, &format!("{b}/streams")).json();
    assert_eq!(v["bucket_id"], "tenant-a", "{v}");
    assert_eq!(v["stream_count"], 4, "{v}");
    assert_eq!(v["prefix"], Value::Null, "{v}");
    assert_eq!(v["has_more"], false, "{v}");
    assert_eq!(v["next_cursor"], Value::Null, "{v}");
    let ids: Vec<&str> = v["streams"]
        .as_array()
        .expect("array")
        .iter()
        .map(|e| e["stream_id"].as_str().expect("stream_id"))
        .collect();
    assert_eq!(ids, ["s-a", "s-b", "s-c", "x-1"]);
    let sa = &v["streams"][0];
    assert_eq!(sa["status"], "Open", "{v}");
    assert_eq!(sa["content_type"], "text/plain", "{v}");
    assert_eq!(sa["tail_offset"], 5, "{v}");
    assert!(
        sa["created_at_ms"]
            .as_u64()
            .is_some_and(|t| t > 1_600_000_000_000),
        "{v}"
    );
    assert!(sa["last_write_at_ms"].as_u64().is_some(), "{v}");
    assert_eq!(v["streams"][2]["status"], "Closed", "{v}");

    let v = get_ok(&s, &format!("{b}/streams?prefix=s-")).json();
    assert_eq!(v["stream_count"], 3, "{v}");
    assert_eq!(v["prefix"], "s-", "{v}");
    let v = get_ok(&s, &format!("{b}/streams?limit=2")).json();
    assert_eq!(v["stream_count"], 2, "{v}");
    assert_eq!(v["has_more"], true, "{v}");
    assert_eq!(v["next_cursor"], "s-b", "{v}");
    let v = get_ok(&s, &format!("{b}/streams?limit=2&after=s-b")).json();
    assert_eq!(v["streams"][0]["stream_id"], "s-c", "{v}");
    assert_eq!(v["streams"][1]["stream_id"], "x-1", "{v}");
    assert_eq!(v["has_more"], false, "{v}");
    for q in ["limit=0", "limit=1001", "limit=abc", "limit=-1"] {
        assert_error(&s.get(&format!("{b}/streams?{q}")), 400, "INVALID_QUERY");
    }

    assert_error(&s.delete(b), 409, "BUCKET_NOT_EMPTY");
    for id in ["s-a", "s-b", "s-c", "x-1"] {
        assert_status(&s.delete(&format!("{b}/{id}")), 204);
    }
    assert_status(&s.delete(b), 204);
    assert_error(&s.get(b), 404, "BUCKET_NOT_FOUND");
    assert_error(&s.get(&format!("{b}/streams")), 404, "BUCKET_NOT_FOUND");
    assert_error(&s.delete(b), 404, "BUCKET_NOT_FOUND");
    // A deleted bucket may be created again.
    assert_status(&s.req("PUT", b, &[], b""), 201);
    assert_eq!(get_ok(&s, b).json()["streams"], 0);

    // Implicit creation by the first stream.
    assert_status(&s.put("/implicit-b/s", "text/plain", b""), 201);
    assert_eq!(
        get_ok(&s, "/implicit-b").json(),
        json!({"bucket_id": "implicit-b", "streams": 1})
    );

    assert_error(&s.get("/never-made"), 404, "BUCKET_NOT_FOUND");
    assert_error(&s.get("/never-made/streams"), 404, "BUCKET_NOT_FOUND");
    let r = s.get("/never-made/x");
    assert_eq!(r.status, 404, "{}", r.describe());
    let code = r.error_code();
    assert!(
        code == "STREAM_NOT_FOUND" || code == "BUCKET_NOT_FOUND",
        "{code}"
    );
    assert_error(&s.req("PUT", "/AB", &[], b""), 400, "INVALID_BUCKET_ID");
}

// ---- writer sequence, CORS, JSON long-poll ------------------------------------------------

#[test]
fn stream_seq_guard_and_cors() {
    let s = Server::start();
    let p = "/seqs/s";
    let seq = |v: &'static str| vec![("Content-Type", "text/plain"), ("Stream-Seq", v)];
    assert_status(&s.req("PUT", p, &seq("005"), b""), 201);
    let r = s.req("POST", p, &seq("004"), b"a");
    assert_error(&r, 409, "STREAM_SEQ_CONFLICT");
    assert_eq!(r.next_offset(), 0);
    assert_error(
        &s.req("POST", p, &seq("005"), b"a"),
        409,
        "STREAM_SEQ_CONFLICT",
    );
    assert_status(&s.req("POST", p, &seq("006"), b"a"), 204);
    assert_error(
        &s.req("POST", p, &seq("006"), b"b"),
        409,
        "STREAM_SEQ_CONFLICT",
    );
    // Bytewise comparison: "7" > "006", and "10" < "7".
    assert_status(&s.req("POST", p, &seq("7"), b"b"), 204);
    assert_error(
        &s.req("POST", p, &seq("10"), b"x"),
        409,
        "STREAM_SEQ_CONFLICT",
    );
    // Without the header nothing is checked; an empty value counts as absent.
    assert_status(&s.post(p, "text/plain", b"c"), 204);
    assert_status(&s.req("POST", p, &seq(" "), b"d"), 204);
    assert_eq!(s.read_all(p).0, b"abcd");

    // Unknown query parameters are ignored; a repeated parameter other than offset takes
    // its last value.
    let r = get_ok(
        &s,
        &format!("{p}?utm_source=x&offset=1&max_bytes=1&max_bytes=2"),
    );
    assert_eq!(r.body, b"bc");

    // CORS preflight is answered for any path, existing or not.
    for path in [p, "/seqs/nope", "/whatever/at/all", "/v1/stream/x"] {
        let r = s.req(
            "OPTIONS",
            path,
            &[
                ("Origin", "https://app.example"),
                ("Access-Control-Request-Method", "POST"),
                ("Access-Control-Request-Headers", "stream-seq, content-type"),
            ],
            b"",
        );
        assert_status(&r, 204);
        assert_eq!(r.header("access-control-allow-origin"), Some("*"), "{path}");
        let methods = r.header("access-control-allow-methods").unwrap_or("");
        assert!(
            methods.contains("POST") && methods.contains("PUT"),
            "{methods}"
        );
        assert_eq!(
            r.header("access-control-allow-headers"),
            Some("stream-seq, content-type")
        );
        assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
    }
    let r = s.req("GET", p, &[("Origin", "https://app.example")], b"");
    assert_status(&r, 200);
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    assert_eq!(r.header("access-control-expose-headers"), Some("*"));
    let r = s.req("OPTIONS", p, &[], b"");
    assert_status(&r, 204);
    assert!(r.header("allow").is_some_and(|a| a.contains("GET")));
}

#[test]
fn json_long_poll_returns_arrays() {
    let s = Server::start();
    let p = "/jpoll/s";
    let r = s.put(p, "application/json", br#"{"n":0}"#);
    assert_status(&r, 201);
    let tail = r.next_offset();
    let h = long_poll_in_thread(
        s.addr(),
        format!("{p}?offset={}&live=long-poll&timeout_ms=30000", off20(tail)),
    );
    wait_for_waiter(&s);
    assert_status(&s.post(p, "application/json", br#"[{"n":1},{"n":2}]"#), 204);
    let (r, took) = h.join().expect("long-poll thread");
    assert_status(&r, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.json(), json!([{"n":1},{"n":2}]));
    assert_eq!(r.next_offset(), tail + 16);
    assert!(took < Duration::from_secs(20), "woke after {took:?}");
    // Timeout on a JSON stream: 204, no body.
    let r = s.get(&format!("{p}?offset=now&live=long-poll&timeout_ms=100"));
    assert_status(&r, 204);
    assert!(r.body.is_empty());
    assert_eq!(r.next_offset(), tail + 16);
}

#[test]
fn health_and_metrics_report_what_happened() {
    let s = Server::start();
    let h = get_ok(&s, "/__ursula/health");
    assert_eq!(h.json()["status"], "ok");

    assert_status(&s.put("/opsb/m", "text/plain", b""), 201);
    let before = s.metrics();
    for _ in 0..5 {
        assert_status(&s.post("/opsb/m", "text/plain", b"12345"), 204);
    }
    let m = s.metrics();
    let n = |v: &Value, k: &str| v[k].as_u64().unwrap_or_else(|| panic!("metric {k}: {v}"));
    assert_eq!(n(&m, "appends_total") - n(&before, "appends_total"), 5);
    assert_eq!(
        n(&m, "appended_bytes_total") - n(&before, "appended_bytes_total"),
        25
    );
    assert_eq!(n(&m, "streams"), 1);
    // A node without peers makes its directory with one group.
    assert_eq!(n(&m, "raft_group_count"), 1);
    assert_eq!(m["wal_backend"], "disk");
    let groups = m["raft_groups"].as_array().expect("raft_groups array");
    assert_eq!(groups.len(), 1);
    for (i, g) in groups.iter().enumerate() {
        assert_eq!(g["raft_group_id"], i as u64, "{g}");
        assert_eq!(g["node_id"], 1, "{g}");
        // A single node leads every group, and has committed and applied what it logged.
        assert_eq!(g["current_leader"], 1, "{g}");
        assert_eq!(g["voter_ids"], serde_json::json!([1]), "{g}");
        assert!(g["current_term"].as_u64().is_some_and(|t| t >= 1), "{g}");
        assert_eq!(g["committed_index"], g["last_log_index"], "{g}");
        assert!(g["last_applied_index"].as_u64().is_some(), "{g}");
    }
    // Every acknowledged append was synced; concurrent ones may share a sync.
    assert!(n(&m, "wal_syncs_total") > n(&before, "wal_syncs_total"));
    assert!(n(&m, "wal_disk_bytes") > 0);
    assert_eq!(n(&m, "live_waiters"), 0);

    let p = get_ok(&s, "/__ursula/metrics/prometheus");
    let text = p.text();
    for line in [
        "# TYPE ursula_appends_total counter",
        "# TYPE ursula_wal_syncs_total counter",
        "# TYPE ursula_streams gauge",
        "ursula_streams 1",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
}
