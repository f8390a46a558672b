//! The node's in-flight body budget (`--http-inflight-body-size`, cluster.md §6.6): request
//! bodies held at once are bounded; a body that does not fit answers
//! `503 INGRESS_BODY_BYTES_LIMIT_REACHED` with `Retry-After: 1` before it is sent, and the
//! budget is given back when the holder is answered.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use common::{Conn, Server, assert_error, wait_until};
use std::time::Duration;

const OCTET: &str = "application/octet-stream";

#[test]
fn bodies_in_flight_are_bounded_and_released() {
    let s = Server::start_with_args(&[
        "--cold-backend",
        "none",
        "--max-request-bytes",
        "1000000",
        "--http-inflight-body-size",
        "1000000",
    ]);
    assert_eq!(s.put("/budget/s", OCTET, b"").status, 201);
    let held = |s: &Server| s.metrics()["http_inflight_body_bytes"].as_u64().unwrap();

    // A slow client declares 800 000 bytes and sends only some of them.
    let mut slow = Conn::open(s.addr(), Duration::from_secs(10)).unwrap();
    let head = format!(
        "POST /budget/s HTTP/1.1\r\nHost: {}\r\nContent-Type: {OCTET}\r\nContent-Length: 800000\r\n\r\n",
        s.addr()
    );
    slow.write_raw(head.as_bytes()).unwrap();
    slow.write_raw(&vec![1u8; 1000]).unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || held(&s) >= 800_000),
        "the declared body was not charged: {}",
        s.metrics()
    );

    // A second body that would not fit is refused before it is sent.
    let r = s.req(
        "POST",
        "/budget/s",
        &[("Content-Type", OCTET), ("Content-Length", "500000")],
        b"",
    );
    assert_error(&r, 503, "INGRESS_BODY_BYTES_LIMIT_REACHED");
    assert_eq!(r.header("retry-after"), Some("1"));
    // A chunked body reserves the route's limit (protocol.md §2.4): it does not fit either.
    let mut chunked = Conn::open(s.addr(), Duration::from_secs(10)).unwrap();
    chunked
        .write_raw(
            format!(
                "POST /budget/s HTTP/1.1\r\nHost: {}\r\nContent-Type: {OCTET}\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
                s.addr()
            )
            .as_bytes(),
        )
        .unwrap();
    let r = chunked.read_response(false).unwrap();
    assert_error(&r, 503, "INGRESS_BODY_BYTES_LIMIT_REACHED");
    // A request with neither a length nor chunked framing has an empty body: it reserves
    // nothing and goes through.
    let mut bare = Conn::open(s.addr(), Duration::from_secs(10)).unwrap();
    bare.write_raw(
        format!(
            "PUT /budget/bare HTTP/1.1\r\nHost: {}\r\nContent-Type: {OCTET}\r\n\r\n",
            s.addr()
        )
        .as_bytes(),
    )
    .unwrap();
    let r = bare.read_response(false).unwrap();
    assert_eq!(r.status, 201, "{}", r.text());
    // One that fits goes through meanwhile.
    assert_eq!(s.post("/budget/s", OCTET, &[2u8; 1000]).status, 204);

    // The slow body completes; its charge is given back and the large body now fits.
    slow.write_raw(&vec![1u8; 799_000]).unwrap();
    let r = slow.read_response(false).unwrap();
    assert_eq!(r.status, 204, "{}", r.text());
    assert!(
        wait_until(Duration::from_secs(10), || held(&s) == 0),
        "{}",
        s.metrics()
    );
    assert_eq!(s.post("/budget/s", OCTET, &vec![3u8; 500_000]).status, 204);
    let (got, _) = s.read_all("/budget/s");
    assert_eq!(got.len(), 1000 + 800_000 + 500_000);
    assert!(got[..1000].iter().all(|b| *b == 2));
    assert!(got[1000..801_000].iter().all(|b| *b == 1));
}

/// Concurrent writers to one group each reserve their bytes before proposing, so together
/// they cannot take the group past its hot bound (`503 COLD_BACKPRESSURE` for the rest).
#[test]
fn concurrent_writes_cannot_overshoot_the_hot_bound() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("ursula.toml");
    // No flush during the test: the bound alone decides.
    std::fs::write(
        &cfg,
        "[storage.cold]\nflush_size = \"256KiB\"\nmax_hot_size_per_group = \"512KiB\"\nflush_interval = \"1h\"\n",
    )
    .unwrap();
    let s = Server::start_in_with_args(
        &dir.path().join("data"),
        &["--config", cfg.to_str().unwrap(), "--group-count", "1"],
    );
    assert_eq!(s.put("/hotb/s", OCTET, b"").status, 201);
    let addr = s.addr();
    let accepted: Vec<u64> = std::thread::scope(|sc| {
        let workers: Vec<_> = (0..12)
            .map(|_| {
                sc.spawn(move || {
                    let mut ok = 0u64;
                    for _ in 0..4 {
                        let r = common::request(
                            addr,
                            "POST",
                            "/hotb/s",
                            &[("Content-Type", OCTET)],
                            &[5u8; 48 * 1024],
                        );
                        match r.status {
                            204 => ok += 48 * 1024,
                            503 => assert_error(&r, 503, "COLD_BACKPRESSURE"),
                            other => panic!("unexpected {other}: {}", r.text()),
                        }
                    }
                    ok
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let total: u64 = accepted.iter().sum();
    assert!(total > 0);
    assert!(
        total <= 512 * 1024,
        "accepted {total} bytes past the 512 KiB bound"
    );
    let (got, _) = s.read_all("/hotb/s");
    assert_eq!(got.len() as u64, total);
    assert!(s.metrics()["hot_bytes"].as_u64().unwrap() <= 512 * 1024);
}
