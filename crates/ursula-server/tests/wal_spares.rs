//! WAL spare segments, end to end: a node with small segments releases them after its
//! snapshots, makes later segments of them, and is SIGKILLed while a writer appends into such
//! segments. Every acknowledged append survives each restart whole, in order, and nothing
//! else appears but at most the one append in flight when the node died.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use common::{Rng, Server, crash_seed, try_request, wait_until};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const STREAM: &str = "/spares/log";
const BIN: &str = "application/octet-stream";
/// Bytes per append.
const PIECE: usize = 64 << 10;
const CYCLES: usize = 4;

/// The `n`th append's body: its number, then bytes that depend on it.
fn piece(n: u64) -> Vec<u8> {
    let mut b: Vec<u8> = (0..PIECE)
        .map(|i| (n as usize * 13 + i * 7) as u8)
        .collect();
    b[..8].copy_from_slice(&n.to_le_bytes());
    b
}

/// Appends pieces from `next` on until `stop`, counting the acknowledged ones in `acked`.
fn writer(addr: SocketAddr, next: u64, acked: Arc<AtomicU64>, stop: Arc<AtomicBool>) {
    let mut n = next;
    while !stop.load(Ordering::Relaxed) {
        let r = try_request(
            addr,
            "POST",
            STREAM,
            &[("Content-Type", BIN)],
            &piece(n),
            Duration::from_secs(5),
        );
        match r {
            Ok(r) if r.status == 204 => {
                n += 1;
                acked.store(n, Ordering::Release);
            }
            // The node is going away: the outcome of this one is unknown.
            _ => return,
        }
    }
}

/// The stream's pieces, checked whole and in order; returns how many.
fn check(s: &Server) -> u64 {
    let (body, _) = s.read_all(STREAM);
    assert_eq!(body.len() % PIECE, 0, "a torn append is visible");
    for (n, got) in body.chunks(PIECE).enumerate() {
        assert!(got == piece(n as u64), "append {n} is not what was written");
    }
    (body.len() / PIECE) as u64
}

fn reused(s: &Server) -> u64 {
    s.metrics()["wal_segments_reused_total"]
        .as_u64()
        .unwrap_or(0)
}

#[test]
fn appends_into_reused_segments_survive_sigkill() {
    let mut s = Server::start_with_config("[raft.wal]\nsegment_size = \"1MiB\"\n", &[]);
    assert_eq!(s.put(STREAM, BIN, b"").status, 201);
    let mut rng = Rng::new(crash_seed("wal_spares"));
    let mut held = 0u64;
    let mut reused_seen = false;
    for cycle in 0..CYCLES {
        let acked = Arc::new(AtomicU64::new(held));
        let stop = Arc::new(AtomicBool::new(false));
        let w = {
            let (acked, stop, addr) = (acked.clone(), stop.clone(), s.addr());
            std::thread::spawn(move || writer(addr, held, acked, stop))
        };
        // Write until segments are being made of spares (the first cycle) or for a while.
        let started = Instant::now();
        let run = Duration::from_millis(300 + rng.next_u64() % 700);
        let deadline = started + Duration::from_secs(60);
        while started.elapsed() < run || (!reused_seen && cycle == 0) {
            assert!(Instant::now() < deadline, "no segment was ever reused");
            reused_seen |= reused(&s) > 0;
            std::thread::sleep(Duration::from_millis(20));
        }
        s.kill9();
        stop.store(true, Ordering::Relaxed);
        w.join().unwrap();
        let acked = acked.load(Ordering::Acquire);
        s.restart();
        assert!(
            wait_until(Duration::from_secs(20), || s.get("/__ursula/ready").status
                == 200),
            "not ready after restart {cycle}"
        );
        let have = check(&s);
        assert!(
            (acked..=acked + 1).contains(&have),
            "cycle {cycle}: {acked} acknowledged, {have} after the restart"
        );
        held = have;
    }
    assert!(reused_seen);
    assert!(held > 0);
}
