//! Live readers against a busy group: an SSE reader keeps a TTL stream alive while other
//! streams of its group are written, notices a delete + re-create, and long-polls end at
//! their deadline even when the group keeps committing.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use common::{Server, SseStream, request};
use std::time::{Duration, Instant};

/// Opens an SSE read of `path` on `s` and checks its first event is the control event.
fn open_sse(s: &Server, path: &str) -> SseStream {
    let mut sse = SseStream::open(s.addr(), path).expect("sse");
    let first = sse
        .next_event(Instant::now() + Duration::from_secs(5))
        .expect("read")
        .expect("event");
    assert_eq!(first.event, "control");
    sse
}

#[test]
fn sse_reader_keeps_its_stream_alive_while_the_group_is_busy() {
    // One group: every stream shares it, so other writes wake the reader constantly.
    let s = Server::start_with_args(&["--group-count", "1"]);
    let r = s.req(
        "PUT",
        "/live/ttl",
        &[("Content-Type", "text/plain"), ("Stream-TTL", "2")],
        b"",
    );
    assert_eq!(r.status, 201);
    assert_eq!(s.put("/live/busy", "text/plain", b"").status, 201);
    let _sse = open_sse(&s, "/live/ttl?offset=now&live=sse");
    // Keep the group busy for 3.5 s (well past the 2 s TTL) with writes to another stream.
    let end = Instant::now() + Duration::from_millis(3500);
    let mut n = 0;
    while Instant::now() < end && n < 200 {
        assert_eq!(s.post("/live/busy", "text/plain", b"x").status, 204);
        std::thread::sleep(Duration::from_millis(50));
        n += 1;
    }
    assert_eq!(
        s.head("/live/ttl").status,
        200,
        "the connected SSE reader renewed the TTL"
    );
}

#[test]
fn an_idle_sse_response_sends_a_keep_alive_comment_after_15_s_and_stays_live() {
    let s = Server::start();
    assert_eq!(s.put("/live/idle", "text/plain", b"").status, 201);
    let mut sse = open_sse(&s, "/live/idle?offset=now&live=sse");
    let opened = Instant::now();
    let got = sse
        .wait_for(b":\n", opened + Duration::from_secs(25))
        .expect("read");
    let after = opened.elapsed();
    assert!(got, "the response ended instead of keeping alive");
    assert!(
        after >= Duration::from_secs(14),
        "a keep-alive comment after only {after:?} of silence"
    );
    // Still live: the next append arrives as a data event.
    assert_eq!(s.post("/live/idle", "text/plain", b"hi").status, 204);
    let ev = sse
        .next_event(Instant::now() + Duration::from_secs(5))
        .expect("read")
        .expect("event");
    assert_eq!((ev.event.as_str(), ev.data.as_str()), ("data", "hi"));
}

#[test]
fn sse_reader_ends_when_the_stream_is_recreated() {
    let s = Server::start();
    assert_eq!(s.put("/live/re", "text/plain", b"old").status, 201);
    let mut sse = SseStream::open(s.addr(), "/live/re?offset=now&live=sse").expect("sse");
    let deadline = Instant::now() + Duration::from_secs(5);
    assert_eq!(
        sse.next_event(deadline)
            .expect("read")
            .expect("event")
            .event,
        "control"
    );
    // Delete and re-create (longer than before) back to back.
    let addr = s.addr();
    assert_eq!(request(addr, "DELETE", "/live/re", &[], b"").status, 204);
    assert_eq!(
        s.put("/live/re", "text/plain", b"new stream bytes").status,
        201
    );
    let mut saw_error = false;
    while let Some(ev) = sse.next_event(deadline).expect("read") {
        assert_ne!(
            ev.event, "data",
            "bytes of the new incarnation must not reach the old reader"
        );
        if ev.event == "error" {
            saw_error = true;
            break;
        }
    }
    assert!(saw_error, "the reader is told its stream is gone");
}

#[test]
fn long_poll_ends_at_its_deadline_in_a_busy_group() {
    let s = Server::start_with_args(&["--group-count", "1"]);
    assert_eq!(s.put("/live/quiet", "text/plain", b"").status, 201);
    assert_eq!(s.put("/live/noisy", "text/plain", b"").status, 201);
    let addr = s.addr();
    let writer = std::thread::spawn(move || {
        let end = Instant::now() + Duration::from_millis(4000);
        while Instant::now() < end {
            let r = request(
                addr,
                "POST",
                "/live/noisy",
                &[("Content-Type", "text/plain")],
                b"x",
            );
            assert_eq!(r.status, 204);
        }
    });
    let started = Instant::now();
    let r = s.get("/live/quiet?offset=now&live=long-poll&timeout_ms=500");
    let took = started.elapsed();
    writer.join().expect("writer");
    assert_eq!(r.status, 204);
    assert!(
        took < Duration::from_millis(1500),
        "long-poll took {took:?} with a 500 ms timeout"
    );
}

#[test]
fn sse_text_never_splits_a_character_even_with_a_tiny_window() {
    let s = Server::start();
    let text = "añ€😀z";
    assert_eq!(
        s.put("/live/utf8", "text/plain", text.as_bytes()).status,
        201
    );
    let mut sse =
        SseStream::open(s.addr(), "/live/utf8?offset=-1&live=sse&max_bytes=1").expect("sse");
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut got = String::new();
    while let Some(ev) = sse.next_event(deadline).expect("read") {
        match ev.event.as_str() {
            "data" => got.push_str(&ev.data),
            "control" if ev.control()["upToDate"] == true => break,
            _ => {}
        }
    }
    assert_eq!(got, text, "every character arrives whole, one per event");
}

#[test]
fn commits_to_other_streams_do_not_wake_a_waiting_reader() {
    // One group: both streams share it, as they would any group at scale.
    let s = Server::start_with_args(&["--group-count", "1"]);
    assert_eq!(s.put("/live/quiet", "text/plain", b"q").status, 201);
    assert_eq!(s.put("/live/noisy", "text/plain", b"").status, 201);
    let addr = s.addr();
    let waiter = std::thread::spawn(move || {
        common::try_request(
            addr,
            "GET",
            "/live/quiet?offset=now&live=long-poll&timeout_ms=20000",
            &[],
            b"",
            Duration::from_secs(30),
        )
        .unwrap()
    });
    assert!(
        common::wait_until(Duration::from_secs(10), || s.metrics()["live_waiters"] == 1),
        "the long-poll never started waiting"
    );
    let mut sse = open_sse(&s, "/live/quiet?offset=now&live=sse");

    for _ in 0..100 {
        assert_eq!(s.post("/live/noisy", "text/plain", b"x").status, 204);
    }
    assert_eq!(
        s.metrics()["live_wakeups_total"],
        0,
        "100 commits to another stream woke the quiet stream's readers"
    );

    assert_eq!(s.post("/live/quiet", "text/plain", b"!").status, 204);
    let r = waiter.join().unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"!");
    let ev = sse
        .next_event(Instant::now() + Duration::from_secs(5))
        .expect("read")
        .expect("event");
    assert_eq!((ev.event.as_str(), ev.data.as_str()), ("data", "!"));
    let woken = s.metrics()["live_wakeups_total"].as_u64().unwrap();
    assert!(
        (1..=2).contains(&woken),
        "one append wakes each reader once, got {woken}"
    );
}

#[test]
fn sse_subscribers_that_leave_are_forgotten_and_the_others_keep_receiving() {
    let s = Server::start();
    assert_eq!(s.put("/live/fan", "text/plain", b"").status, 201);
    let open = || open_sse(&s, "/live/fan?offset=now&live=sse");
    let mut stay = open();
    let leaving: Vec<SseStream> = (0..3).map(|_| open()).collect();
    let connections = |s: &Server| s.metrics()["sse_connections"].as_u64().unwrap();
    assert_eq!(connections(&s), 4);
    drop(leaving);
    // Each append is a delivery attempt to the closed connections, which ends them.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut sent = 0;
    while connections(&s) > 1 {
        assert!(
            Instant::now() < deadline,
            "closed SSE responses are never released"
        );
        assert_eq!(s.post("/live/fan", "text/plain", b"x").status, 204);
        sent += 1;
        common::wait_until(Duration::from_millis(200), || connections(&s) <= 1);
    }
    assert_eq!(connections(&s), 1);
    assert_eq!(s.post("/live/fan", "text/plain", b"!").status, 204);
    let mut got = String::new();
    while !got.ends_with('!') {
        let ev = stay
            .next_event(deadline)
            .expect("read")
            .expect("the remaining subscriber is still served");
        if ev.event == "data" {
            got.push_str(&ev.data);
        }
    }
    assert_eq!(got, format!("{}!", "x".repeat(sent)));
}

/// Collects an SSE reader's data until it holds `len` bytes; returns them and the cursors of
/// its control events.
fn collect_sse(sse: &mut SseStream, len: usize) -> (String, Vec<u64>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut data, mut cursors) = (String::new(), Vec::new());
    while data.len() < len {
        let ev = sse.next_event(deadline).expect("read").expect("event");
        match ev.event.as_str() {
            "data" => data.push_str(&ev.data),
            "control" => {
                let c: serde_json::Value = serde_json::from_str(&ev.data).unwrap();
                cursors.push(c["streamCursor"].as_str().unwrap().parse().unwrap());
            }
            other => panic!("unexpected event {other}"),
        }
    }
    (data, cursors)
}

#[test]
fn sse_readers_of_one_stream_each_get_their_own_windows_and_cursors() {
    // Readers at the same position share the rendered data of a commit; readers with another
    // window size, or their own cursor, must still get exactly their own events.
    let s = Server::start();
    assert_eq!(s.put("/live/share", "text/plain", b"").status, 201);
    let mut plain: Vec<SseStream> = (0..3)
        .map(|_| open_sse(&s, "/live/share?offset=now&live=sse"))
        .collect();
    let mut small = open_sse(&s, "/live/share?offset=now&live=sse&max_bytes=2");
    let mut cursored = open_sse(&s, "/live/share?offset=now&live=sse&cursor=90000");
    let mut sent = String::new();
    for word in ["alpha", "beta", "gamma-delta", "é!"] {
        assert_eq!(
            s.post("/live/share", "text/plain", word.as_bytes()).status,
            204
        );
        sent.push_str(word);
        // Each commit reaches every follower of the tail as one data event, followed by a
        // control event whose cursor is the new tail (the chunk they may share).
        for r in &mut plain {
            assert_eq!(collect_sse(r, word.len()).0, word);
            let deadline = Instant::now() + Duration::from_secs(10);
            let ev = r
                .next_event(deadline)
                .expect("read")
                .expect("control event");
            let c = ev.control();
            assert_eq!(
                c["streamNextOffset"],
                common::off20(sent.len() as u64),
                "{c}"
            );
            assert_eq!(c["streamCursor"], common::off20(sent.len() as u64), "{c}");
            assert_eq!(c["upToDate"], true, "{c}");
        }
    }
    // A late reader from the start takes the catch-up path, not the shared frame.
    let mut late = SseStream::open(s.addr(), "/live/share?offset=-1&live=sse").expect("sse");
    let (got, _) = collect_sse(&mut late, sent.len());
    assert_eq!(got, sent);
    let (got, cursors) = collect_sse(&mut small, sent.len());
    assert_eq!(got, sent, "two-byte windows, characters whole");
    // 23 bytes in windows of two bytes (a character whole), per commit: 13 data events, each
    // with its control event; a frame shared from the readers of whole commits would be 4.
    assert!(cursors.len() >= 12, "{cursors:?}");
    let (got, cursors) = collect_sse(&mut cursored, sent.len());
    assert_eq!(got, sent);
    assert!(
        cursors.windows(2).all(|w| w[1] > w[0]) && cursors[0] > 90000,
        "a cursor never repeats and passes the echoed one: {cursors:?}"
    );
}
