//! A catch-up body streamed from the cold tier piece by piece: when GC deletes the objects
//! of a stream under a body still being sent (the stream was deleted) and a new stream is
//! created under the same name, the rest of the body is never the new stream's bytes; and a
//! read that starts in hot bytes before a cold piece still answers a failing store with `502`.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use common::{Server, wait_until};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const OCTET: &str = "application/octet-stream";
const CHUNK: usize = 512 * 1024;

/// A body longer than anything the server can have sent ahead of a client that stopped
/// reading: the kernel's largest send buffer (`tcp_wmem`, which autotuning may reach and which
/// differs between machines) twice over, plus a margin for the pieces hyper holds. At least
/// 16 MiB.
fn body_len() -> usize {
    let wmem_max = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_wmem")
        .ok()
        .and_then(|s| s.split_whitespace().nth(2)?.parse::<usize>().ok())
        .unwrap_or(4 << 20);
    (2 * wmem_max + (8 << 20)).max(16 << 20).div_ceil(CHUNK) * CHUNK
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed ^ ((i >> 11) as u8))
        .collect()
}

fn metric(s: &Server, name: &str) -> u64 {
    s.metrics()[name].as_u64().unwrap_or(0)
}

fn fill(s: &Server, path: &str, all: &[u8]) {
    assert_eq!(s.put(path, OCTET, b"").status, 201);
    for c in all.chunks(CHUNK) {
        let r = s.post(path, OCTET, c);
        assert!(r.status == 204 || r.status == 200, "{}", r.describe());
    }
}

#[test]
fn a_streamed_body_never_continues_with_a_recreated_streams_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("ursula.toml");
    std::fs::write(
        &cfg,
        "[storage.cold]\nbackend = \"local\"\nflush_size = \"1MiB\"\n\
         max_hot_size_per_group = \"64MiB\"\nflush_interval = \"50ms\"\ngc_interval = \"100ms\"\n",
    )
    .unwrap();
    let s = Server::start_in_with_args(
        &tmp.path().join("data"),
        &["--config", cfg.to_str().unwrap(), "--group-count", "1"],
    );
    let len = body_len();
    let old = pattern(1, len);
    fill(&s, "/srbk/s", &old);
    assert!(
        wait_until(Duration::from_secs(30), || metric(&s, "hot_bytes") == 0),
        "never flushed: {}",
        s.metrics()
    );

    // Start the read and take only the head: the server stops sending once the socket is
    // full, with most of the body still to fetch from the cold tier.
    // A small receive buffer (set before connecting, so the window stays small): the kernel
    // would otherwise take the whole 16 MiB body before the stream is deleted.
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(64 * 1024).unwrap();
    sock.connect(&s.addr().into()).unwrap();
    let mut c: TcpStream = sock.into();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"GET /srbk/s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let head_end = loop {
        let n = c.read(&mut buf).unwrap();
        assert!(n > 0, "no answer");
        got.extend_from_slice(&buf[..n]);
        if let Some(p) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
    };
    assert!(got.starts_with(b"HTTP/1.1 200"), "{:?}", &got[..head_end]);

    // The stream goes, GC deletes its objects, and a stream of the same name takes its place.
    assert_eq!(s.delete("/srbk/s").status, 204);
    // `cold_objects` drops when the delete applies; the objects are gone from the store once
    // GC has emptied its queue.
    assert!(
        wait_until(Duration::from_secs(30), || {
            let m = s.metrics();
            m["cold_objects"].as_u64() == Some(0) && m["cold_gc_queued_objects"].as_u64() == Some(0)
        }),
        "GC left objects: {}",
        s.metrics()
    );
    // The scenario needs a body the server had not finished fetching when its objects went.
    let fetched = metric(&s, "cold_read_bytes_total");
    assert!(
        fetched < old.len() as u64,
        "the server fetched all {fetched} bytes before the delete: socket buffers hold more \
         than the {} byte body",
        old.len()
    );
    let new = pattern(2, len);
    fill(&s, "/srbk/s", &new);

    // The rest of the body: a prefix of the old stream's bytes, cut short where they went.
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        match c.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    let body = &got[head_end..];
    assert!(body.len() <= old.len());
    let first_wrong = body.iter().zip(&old).position(|(a, b)| a != b);
    assert_eq!(
        first_wrong,
        None,
        "the body has other bytes than the old stream's ({} of {} received)",
        body.len(),
        old.len()
    );
    assert!(
        body.len() < old.len(),
        "the whole body arrived although its objects were deleted"
    );
}

#[test]
fn a_failing_store_answers_502_even_when_the_read_starts_in_hot_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("ursula.toml");
    std::fs::write(
        &cfg,
        "[storage.cold]\nbackend = \"local\"\nflush_size = \"64MiB\"\n\
         max_hot_size_per_group = \"64MiB\"\nflush_interval = \"50ms\"\n",
    )
    .unwrap();
    let s = Server::start_in_with_args(
        &tmp.path().join("data"),
        &["--config", cfg.to_str().unwrap(), "--group-count", "1"],
    );
    // Hot bytes, then an external payload (in the cold store), then hot bytes.
    assert_eq!(s.put("/srbk/x", OCTET, b"before").status, 201);
    let large = pattern(3, 2 * 1024 * 1024);
    assert_eq!(s.post("/srbk/x", OCTET, &large).status, 204);
    assert_eq!(s.post("/srbk/x", OCTET, b"after").status, 204);
    let mut want = b"before".to_vec();
    want.extend_from_slice(&large);
    want.extend_from_slice(b"after");
    let r = s.get("/srbk/x");
    assert_eq!(r.status, 200);
    assert!(r.body == want);
    // The store goes away: its directory is replaced by a file.
    let cold = tmp.path().join("data/cold");
    std::fs::rename(&cold, tmp.path().join("cold.away")).unwrap();
    std::fs::write(&cold, b"not a directory").unwrap();
    let r = s.get("/srbk/x");
    common::assert_error(&r, 502, "COLD_STORE_FAILED");
}
