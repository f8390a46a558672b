//! Record-aware reads of JSON streams (extensions.md §11.6-§11.9), black-box against the
//! real binary: catch-up in every view, validation, retention, long-poll and SSE.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use common::{Response, Server, SseStream, assert_error, request};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const JSON: &str = "application/json";

fn records(r: &Response) -> (u64, u64, u64) {
    let n = |h: &str| -> u64 {
        r.header(h)
            .unwrap_or_else(|| panic!("no {h}: {}", r.describe()))
            .parse()
            .unwrap()
    };
    (
        n("stream-record-first"),
        n("stream-record-start"),
        n("stream-record-next"),
    )
}

fn ok(r: Response) -> Response {
    assert_eq!(r.status, 200, "{}", r.describe());
    assert_eq!(
        r.header("stream-extensions"),
        Some("json-record-coordinates-v1")
    );
    r
}

#[test]
fn catch_up_record_reads_in_every_view() {
    let s = Server::start();
    assert_eq!(s.put("/recs/j", JSON, b"[1,2,3]").status, 201);
    let tail = s.head("/recs/j").next_offset();

    // The issue's case: record=now is an empty, up-to-date read at the record tail.
    let r = ok(s.get("/recs/j?record=now"));
    assert_eq!(r.json(), json!([]));
    assert_eq!(records(&r), (0, 3, 3));
    assert_eq!(r.next_offset(), tail);
    assert_eq!(r.header("stream-up-to-date"), Some("true"));
    assert_eq!(r.header("content-type"), Some(JSON));

    let r = ok(s.get("/recs/j?record=0"));
    assert_eq!((r.json(), records(&r)), (json!([1, 2, 3]), (0, 0, 3)));
    let r = ok(s.get("/recs/j?record=1&max_records=1"));
    assert_eq!((r.json(), records(&r)), (json!([2]), (0, 1, 2)));
    assert!(r.header("stream-up-to-date").is_none(), "{}", r.describe());
    // Continuing by offset or by record gives the same rest.
    let by_offset = ok(s.get(&format!("/recs/j?offset={:020}", r.next_offset())));
    let by_record = ok(s.get("/recs/j?record=2"));
    assert_eq!(by_offset.json(), json!([3]));
    assert_eq!(by_record.json(), json!([3]));
    assert_eq!(by_offset.header("etag"), by_record.header("etag"));
    for (q, body, coords) in [
        ("tail_records=2", json!([2, 3]), (0, 1, 3)),
        ("tail_records=0", json!([]), (0, 3, 3)),
        ("tail_records=100", json!([1, 2, 3]), (0, 0, 3)),
        ("record=3", json!([]), (0, 3, 3)),
    ] {
        let r = ok(s.get(&format!("/recs/j?{q}")));
        assert_eq!((r.json(), records(&r)), (body, coords), "{q}");
    }

    // NDJSON on request, and the envelope whatever Accept says.
    let nd = ok(s.req(
        "GET",
        "/recs/j?record=1",
        &[("Accept", "application/x-ndjson")],
        b"",
    ));
    assert_eq!(nd.header("content-type"), Some("application/x-ndjson"));
    assert_eq!(nd.text(), "2\n3\n");
    let env = ok(s.req(
        "GET",
        "/recs/j?record=1&record_view=envelope",
        &[("Accept", "application/x-ndjson")],
        b"",
    ));
    assert_eq!(
        env.header("content-type"),
        Some("application/vnd.durable-stream-records+ndjson")
    );
    assert_eq!(
        env.text(),
        "{\"record\":1,\"value\":2}\n{\"record\":2,\"value\":3}\n"
    );
    let arr = ok(s.get("/recs/j?record=1"));
    let tags: Vec<&str> = [&arr, &nd, &env]
        .iter()
        .map(|r| r.header("etag").unwrap())
        .collect();
    assert!(
        tags[0] != tags[1] && tags[1] != tags[2] && tags[0] != tags[2],
        "{tags:?}"
    );
    // A matching If-None-Match is a 304 with the record headers.
    let r = s.req(
        "GET",
        "/recs/j?record=1&record_view=envelope",
        &[("If-None-Match", tags[2])],
        b"",
    );
    assert_eq!(r.status, 304, "{}", r.describe());
    assert!(r.body.is_empty());
    assert_eq!(records(&r), (0, 1, 3));

    // Closed at the tail: the EOF signal, as for offset reads.
    let close = s.req("POST", "/recs/j", &[("Stream-Closed", "true")], b"");
    assert_eq!(close.status, 204, "{}", close.describe());
    let r = ok(s.get("/recs/j?record=now"));
    assert_eq!(r.header("stream-closed"), Some("true"));
    let r = ok(s.get("/recs/j?record=0&max_records=1"));
    assert!(r.header("stream-closed").is_none(), "{}", r.describe());
}

#[test]
fn record_parameters_that_cannot_be_honoured_answer_400() {
    let s = Server::start();
    assert_eq!(s.put("/recs/j", JSON, b"[1,2,3]").status, 201);
    assert_eq!(s.put("/recs/t", "text/plain", b"abc").status, 201);
    for q in [
        "record=1&tail_records=1",
        "record=1&offset=0",
        "tail_records=1&offset=-1",
        "max_records=1",
        "record=0&max_bytes=10",
        "record_view=envelope",
        "record=0&record_view=full",
        "record=abc",
        "record=-1",
        "tail_records=x",
        "record=0&max_records=0",
        "record=now&live=sse&max_bytes=1",
    ] {
        assert_error(&s.get(&format!("/recs/j?{q}")), 400, "INVALID_QUERY");
    }
    let r = s.get("/recs/j?record=4");
    assert_error(&r, 400, "INVALID_RECORD_BOUNDARIES");
    assert_eq!(r.header("stream-record-first"), Some("0"));
    assert_eq!(r.header("stream-record-next"), Some("3"));
    for q in ["record=0", "record=now", "tail_records=1&live=long-poll"] {
        assert_error(
            &s.get(&format!("/recs/t?{q}")),
            400,
            "INVALID_RECORD_BOUNDARIES",
        );
    }
}

#[test]
fn record_reads_across_a_retention_boundary() {
    let s = Server::start();
    let values: Vec<Value> = (0..10).map(|i| json!({ "i": i })).collect();
    let body = serde_json::to_vec(&values).unwrap();
    assert_eq!(s.put("/recs/r", JSON, &body).status, 201);
    let r = s.req(
        "PUT",
        "/recs/r/snapshot?record=4",
        &[("Content-Type", "application/json")],
        b"{\"state\":4}",
    );
    assert_eq!(r.status, 204, "{}", r.describe());
    let r = s.req("PUT", "/recs/r/retention?record=4", &[], b"");
    assert_eq!(r.status, 204, "{}", r.describe());
    // Retention, snapshot and bootstrap answers carry the record coordinates (§11.9).
    assert_eq!(r.header("stream-record-first"), Some("4"));
    assert_eq!(r.header("stream-record-next"), Some("10"));
    let snapshot_at = s
        .head("/recs/r")
        .header("stream-snapshot-offset")
        .expect("a visible snapshot")
        .to_owned();
    for path in [
        format!("/recs/r/snapshot/{snapshot_at}"),
        "/recs/r/bootstrap".to_owned(),
    ] {
        let r = s.get(&path);
        assert_eq!(r.status, 200, "{path}: {}", r.describe());
        assert_eq!(r.header("stream-record-first"), Some("4"), "{path}");
        assert_eq!(r.header("stream-record-next"), Some("10"), "{path}");
    }
    let head = s.head("/recs/r");
    assert_eq!(head.header("stream-record-first"), Some("4"));
    assert_eq!(head.header("stream-record-next"), Some("10"));

    // Before F: 410 with the record coordinates and the bootstrap pointer.
    for q in [
        "record=0",
        "record=3",
        "record=3&live=long-poll&timeout_ms=10",
    ] {
        let r = s.get(&format!("/recs/r?{q}"));
        assert_error(&r, 410, "STREAM_GONE");
        assert_eq!(r.header("stream-record-first"), Some("4"), "{q}");
        assert_eq!(r.header("stream-record-next"), Some("10"), "{q}");
        assert_eq!(
            r.header("stream-bootstrap-location"),
            Some("/recs/r/bootstrap")
        );
    }
    // At and after F the ordinals are the ones they always were.
    let r = ok(s.get("/recs/r?record=4&max_records=2"));
    assert_eq!(
        (r.json(), records(&r)),
        (json!([{ "i": 4 }, { "i": 5 }]), (4, 4, 6))
    );
    let r = ok(s.get("/recs/r?tail_records=100&record_view=envelope"));
    assert_eq!(records(&r), (4, 4, 10));
    let first_line: Value = serde_json::from_str(r.text().lines().next().unwrap()).unwrap();
    assert_eq!(first_line, json!({ "record": 4, "value": { "i": 4 } }));
    let a = s.post("/recs/r", JSON, b"{\"i\":10}");
    assert_eq!(a.header("stream-record-start"), Some("10"));
    let r = ok(s.get("/recs/r?tail_records=1"));
    assert_eq!((r.json(), records(&r)), (json!([{ "i": 10 }]), (4, 10, 11)));
}

#[test]
fn long_poll_record_reads() {
    let s = Server::start();
    let a = s.addr();
    assert_eq!(s.put("/recs/lp", JSON, b"[1,2,3]").status, 201);
    // Timeout: 204 at the resolved start, with the record headers.
    let r = s.get("/recs/lp?record=now&live=long-poll&timeout_ms=50");
    assert_eq!(r.status, 204, "{}", r.describe());
    assert_eq!(records(&r), (0, 3, 3));
    assert_eq!(r.header("stream-up-to-date"), Some("true"));
    assert!(r.header("stream-cursor").is_some());
    // A waiter at record 3 gets the records appended while it waits (or at once, if the
    // append came first: the read starts at an explicit record either way).
    let waiter = std::thread::spawn(move || {
        request(
            a,
            "GET",
            "/recs/lp?record=3&live=long-poll&timeout_ms=10000&max_records=1",
            &[],
            b"",
        )
    });
    assert_eq!(s.post("/recs/lp", JSON, b"[4,5]").status, 204);
    let r = ok(waiter.join().unwrap());
    assert_eq!((r.json(), records(&r)), (json!([4]), (0, 3, 4)));
    assert!(r.header("stream-cursor").is_some(), "{}", r.describe());
    // Records already there are answered at once.
    let r = ok(s.get("/recs/lp?record=4&live=long-poll&timeout_ms=10000"));
    assert_eq!((r.json(), records(&r)), (json!([5]), (0, 4, 5)));
    assert_eq!(r.header("stream-up-to-date"), Some("true"));
}

fn control(sse: &mut SseStream, deadline: Instant) -> (Vec<Value>, Value) {
    let mut data = Vec::new();
    loop {
        let ev = sse
            .next_event(deadline)
            .expect("an event in time")
            .expect("the response goes on");
        if ev.event == "control" {
            return (data, ev.control());
        }
        assert_eq!(ev.event, "data", "{ev:?}");
        data.push(serde_json::from_str(&ev.data).unwrap());
    }
}

#[test]
fn sse_record_reads() {
    let s = Server::start();
    assert_eq!(s.put("/recs/sse", JSON, b"[1,2,3]").status, 201);
    let deadline = Instant::now() + Duration::from_secs(20);

    // Default view: arrays of complete records, max_records per batch, record fields in
    // every control event.
    let mut sse = SseStream::open(s.addr(), "/recs/sse?record=1&live=sse&max_records=1").unwrap();
    assert_eq!(sse.status, 200);
    assert_eq!(sse.header("stream-data-content-type"), Some(JSON));
    let (d, c) = control(&mut sse, deadline);
    assert_eq!(d, vec![json!([2])]);
    assert_eq!(
        (
            c["streamFirstRecord"].clone(),
            c["streamNextRecord"].clone()
        ),
        (json!(0), json!(2))
    );
    let (d, c) = control(&mut sse, deadline);
    assert_eq!(d, vec![json!([3])]);
    assert_eq!(c["streamNextRecord"], json!(3));
    assert_eq!(c["upToDate"], json!(true));
    assert_eq!(s.post("/recs/sse", JSON, b"[4]").status, 204);
    let (d, c) = control(&mut sse, deadline);
    assert_eq!(d, vec![json!([4])]);
    assert_eq!(c["streamNextRecord"], json!(4));
    assert_eq!(
        c["streamNextOffset"].as_str().map(common::parse_off20),
        Some(s.head("/recs/sse").next_offset())
    );

    // Envelope view: exactly one envelope object per data event.
    let mut env = SseStream::open(
        s.addr(),
        "/recs/sse?tail_records=2&live=sse&record_view=envelope",
    )
    .unwrap();
    assert_eq!(
        env.header("stream-data-content-type"),
        Some("application/vnd.durable-stream-record+json")
    );
    let (d, c) = control(&mut env, deadline);
    assert_eq!(d, vec![json!({ "record": 2, "value": 3 })]);
    assert_eq!(c["streamNextRecord"], json!(3));
    let (d, c) = control(&mut env, deadline);
    assert_eq!(d, vec![json!({ "record": 3, "value": 4 })]);
    assert_eq!(c["streamNextRecord"], json!(4));

    // record=now on SSE: a first control event at the record tail.
    let mut now = SseStream::open(s.addr(), "/recs/sse?record=now&live=sse").unwrap();
    let (d, c) = control(&mut now, deadline);
    assert!(d.is_empty());
    assert_eq!(
        (
            c["streamFirstRecord"].clone(),
            c["streamNextRecord"].clone()
        ),
        (json!(0), json!(4))
    );
}

#[test]
fn conditional_append_with_stream_record_match() {
    let s = Server::start();
    assert_eq!(s.put("/recs/m", JSON, b"[1,2]").status, 201);
    assert_eq!(s.put("/recs/t", "text/plain", b"x").status, 201);
    let post = |path: &str, ct: &str, m: &str, body: &[u8], extra: &[(&str, &str)]| {
        let mut h = vec![("Content-Type", ct), ("Stream-Record-Match", m)];
        h.extend_from_slice(extra);
        s.req("POST", path, &h, body)
    };
    // N == value: the append goes in and reports its range.
    let r = post("/recs/m", JSON, "2", b"[3,4]", &[]);
    assert_eq!(r.status, 204, "{}", r.describe());
    assert_eq!(r.header("stream-record-start"), Some("2"));
    assert_eq!(r.header("stream-record-next"), Some("4"));
    // A stale value: 412 with the record tail, the byte tail and the extension.
    let tail = s.head("/recs/m").next_offset();
    let r = post("/recs/m", JSON, "2", b"[5]", &[]);
    assert_error(&r, 412, "RECORD_PRECONDITION_FAILED");
    assert_eq!(r.header("stream-record-next"), Some("4"));
    assert_eq!(r.next_offset(), tail);
    assert_eq!(
        r.header("stream-extensions"),
        Some("json-record-coordinates-v1")
    );
    // Checked after duplicate detection: a producer's retry reports its original range
    // even though N has moved on.
    let producer = [
        ("Producer-Id", "p"),
        ("Producer-Epoch", "0"),
        ("Producer-Seq", "0"),
    ];
    let first = post("/recs/m", JSON, "4", b"[5]", &producer);
    assert_eq!(first.status, 200, "{}", first.describe());
    let retry = post("/recs/m", JSON, "4", b"[5]", &producer);
    assert_eq!(retry.status, 204, "{}", retry.describe());
    assert_eq!(retry.header("stream-record-start"), Some("4"));
    assert_eq!(retry.header("stream-record-next"), Some("5"));
    // Malformed, or on a stream that is not JSON: 400.
    assert_error(
        &post("/recs/m", JSON, "x", b"[6]", &[]),
        400,
        "INVALID_HEADER",
    );
    assert_error(
        &post("/recs/t", "text/plain", "1", b"y", &[]),
        400,
        "INVALID_RECORD_BOUNDARIES",
    );
    // And after the closed check.
    let close = s.req("POST", "/recs/m", &[("Stream-Closed", "true")], b"");
    assert_eq!(close.status, 204, "{}", close.describe());
    assert_error(
        &post("/recs/m", JSON, "0", b"[6]", &[]),
        409,
        "STREAM_CLOSED",
    );
    let r = ok(s.get("/recs/m?record=0"));
    assert_eq!(r.json(), json!([1, 2, 3, 4, 5]));
}

#[test]
fn record_reads_on_a_fork_continue_the_source_ordinals() {
    let s = Server::start();
    assert_eq!(s.put("/recs/src", JSON, b"[1,2,3]").status, 201);
    // O(2): where the read of record 1 alone ends.
    let at = ok(s.get("/recs/src?record=1&max_records=1")).next_offset();
    let r = s.req(
        "PUT",
        "/recs/fork",
        &[
            ("Stream-Forked-From", "/recs/src"),
            ("Stream-Fork-Offset", &format!("{at:020}")),
        ],
        b"",
    );
    assert_eq!(r.status, 201, "{}", r.describe());
    let a = s.post("/recs/fork", JSON, b"[30]");
    assert_eq!(a.header("stream-record-start"), Some("2"));
    let r = ok(s.get("/recs/fork?record=1"));
    assert_eq!((r.json(), records(&r)), (json!([2, 30]), (0, 1, 3)));
    let r = ok(s.get("/recs/fork?tail_records=1&record_view=envelope"));
    assert_eq!(r.text(), "{\"record\":2,\"value\":30}\n");
}
