//! Crash consistency: concurrent writers while the server is SIGKILLed at random moments.
//!
//! Two plain appenders and two idempotent producers write unique records, each to its own
//! stream over one keep-alive connection. Every acknowledged append is recorded. The server
//! is killed with SIGKILL 50-500 ms into each cycle (seeded PRNG; the seed is printed and can
//! be fixed with `URSULA_CRASH_SEED`) and restarted on the same data directory. Every eighth
//! cycle stops it with SIGTERM instead, and now and then it is SIGKILLed again right after
//! recovery. At least 20 SIGKILL cycles run; then cycles continue until about 40 s have
//! passed. After every restart and at the end, every stream is read in full and checked:
//!
//! * every acknowledged append is present exactly once, in acknowledgement (send) order;
//! * anything else is a whole record that was in flight when the server died (plain writers:
//!   at most one per cycle, never retried; producers: their retried request);
//! * no torn or unknown records, no duplicates;
//! * what a read returned after a restart is never lost by a later crash (append-only);
//! * producers' retries of the in-flight request after a restart answer 200 or 204.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use common::{Conn, Response, Rng, Server, crash_seed, off20, try_request};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const BUCKET: &str = "crash-test";
/// SIGKILL cycles that must run.
const MIN_CYCLES: usize = 20;
/// Cycles to run at most.
const MAX_CYCLES: usize = 150;
/// After this, stop as soon as `MIN_CYCLES` are done.
const SOFT_BUDGET: Duration = Duration::from_secs(40);
/// Absolute limit for the whole test.
const HARD_BUDGET: Duration = Duration::from_secs(170);
/// Socket timeout of writers' requests.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long reads and retries tolerate `503` (e.g. leader election after a restart).
const UNAVAILABLE_GRACE: Duration = Duration::from_secs(20);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Plain,
    Producer,
}

/// One request a writer sent, in send order.
#[derive(Debug, Clone)]
struct Entry {
    body: Vec<u8>,
    acked: bool,
    /// Producer sequence (producers only).
    seq: u64,
    cycle: usize,
}

#[derive(Debug)]
struct Writer {
    idx: usize,
    kind: Kind,
    path: String,
    producer_id: String,
    epoch: u64,
    next_n: u64,
    next_seq: u64,
    log: Vec<Entry>,
    /// Producer: index in `log` of the request whose outcome is unknown.
    inflight: Option<usize>,
    rng: Rng,
    errors: Vec<String>,
    /// Producer retries after restarts, and how they were answered.
    retries: Vec<(u64, u16)>,
    /// Stream bytes at the previous verification.
    seen: Vec<u8>,
}

impl Writer {
    fn new(idx: usize, kind: Kind, seed: u64) -> Writer {
        Writer {
            idx,
            kind,
            path: format!("/{BUCKET}/w{idx}"),
            producer_id: format!("producer-{idx}"),
            epoch: 7,
            next_n: 0,
            next_seq: 0,
            log: Vec::new(),
            inflight: None,
            rng: Rng::new(seed ^ (idx as u64).wrapping_mul(0x1234_5678_9abc_def1)),
            errors: Vec::new(),
            retries: Vec::new(),
            seen: Vec::new(),
        }
    }

    /// A unique record: `w3-000123-0042-<42 filler bytes>\n`.
    fn make_body(&mut self) -> Vec<u8> {
        let n = self.next_n;
        self.next_n += 1;
        let len = match self.rng.range(0, 9) {
            0 => self.rng.range(1000, 3000),
            1..=3 => 0,
            _ => self.rng.range(1, 200),
        };
        let mut b = format!("w{}-{n:06}-{len:04}-", self.idx).into_bytes();
        b.extend((0..len).map(|i| b'a' + ((n * 31 + i * 7) % 26) as u8));
        b.push(b'\n');
        b
    }

    fn send(&self, conn: &mut Conn, entry: &Entry) -> std::io::Result<Response> {
        match self.kind {
            Kind::Plain => conn.send(
                "POST",
                &self.path,
                &[("Content-Type", "text/plain")],
                &entry.body,
            ),
            Kind::Producer => {
                let (e, s) = (self.epoch.to_string(), entry.seq.to_string());
                conn.send(
                    "POST",
                    &self.path,
                    &[
                        ("Content-Type", "text/plain"),
                        ("Producer-Id", &self.producer_id),
                        ("Producer-Epoch", &e),
                        ("Producer-Seq", &s),
                    ],
                    &entry.body,
                )
            }
        }
    }

    /// Writes until the server dies or `stop` is set.
    fn run_cycle(mut self, addr: SocketAddr, stop: Arc<AtomicBool>, cycle: usize) -> Writer {
        let mut conn = None;
        for _ in 0..200 {
            if stop.load(Ordering::SeqCst) {
                return self;
            }
            match Conn::open(addr, WRITE_TIMEOUT) {
                Ok(c) => {
                    conn = Some(c);
                    break;
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        let Some(mut conn) = conn else { return self };

        // A producer first retries its in-flight request with the same (id, epoch, seq).
        if let Some(i) = self.inflight {
            let entry = self.log[i].clone();
            match self.send_until_answered(&mut conn, &entry, &stop) {
                None => return self, // died again; still in flight
                Some(r) if r.status == 200 || r.status == 204 => {
                    self.retries.push((entry.seq, r.status));
                    self.log[i].acked = true;
                    self.inflight = None;
                }
                Some(r) => {
                    self.errors.push(format!(
                        "cycle {cycle}: retry of seq {} answered {}",
                        entry.seq,
                        r.describe()
                    ));
                    return self;
                }
            }
        }

        for _ in 0..1_000_000 {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            let body = self.make_body();
            let seq = self.next_seq;
            if self.kind == Kind::Producer {
                self.next_seq += 1;
            }
            self.log.push(Entry {
                body,
                acked: false,
                seq,
                cycle,
            });
            let i = self.log.len() - 1;
            let entry = self.log[i].clone();
            match self.send_until_answered(&mut conn, &entry, &stop) {
                None => {
                    // Outcome unknown: the server died (or we stopped) mid-request.
                    if self.kind == Kind::Producer {
                        self.inflight = Some(i);
                    }
                    break;
                }
                Some(r) => {
                    let ok = match self.kind {
                        Kind::Plain => r.status == 204,
                        Kind::Producer => r.status == 200,
                    };
                    if ok {
                        self.log[i].acked = true;
                    } else {
                        self.errors.push(format!(
                            "cycle {cycle}: append {} answered {}",
                            String::from_utf8_lossy(&entry.body[..entry.body.len().min(24)]),
                            r.describe()
                        ));
                        break;
                    }
                }
            }
        }
        self
    }

    /// Sends `entry`, retrying on `503` (not executed) for a bounded time. `None` when the
    /// connection failed, i.e. the outcome is unknown.
    fn send_until_answered(
        &self,
        conn: &mut Conn,
        entry: &Entry,
        stop: &AtomicBool,
    ) -> Option<Response> {
        let deadline = Instant::now() + UNAVAILABLE_GRACE;
        loop {
            match self.send(conn, entry) {
                Err(_) => return None,
                Ok(r)
                    if r.status == 503
                        && Instant::now() < deadline
                        && !stop.load(Ordering::SeqCst) =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Ok(r) if r.status == 503 => return None,
                Ok(r) => return Some(r),
            }
        }
    }
}

/// Reads a whole stream, tolerating `503` right after a restart.
fn read_stream(addr: SocketAddr, path: &str) -> Vec<u8> {
    let deadline = Instant::now() + UNAVAILABLE_GRACE;
    let mut out = Vec::new();
    let mut off = 0u64;
    for _ in 0..100_000 {
        let r = try_request(
            addr,
            "GET",
            &format!("{path}?offset={}", off20(off)),
            &[],
            b"",
            Duration::from_secs(15),
        )
        .unwrap_or_else(|e| panic!("read {path}: {e}"));
        if r.status == 503 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        assert_eq!(r.status, 200, "read {path} at {off}: {}", r.describe());
        let next = r.next_offset();
        assert_eq!(
            next,
            off + r.body.len() as u64,
            "Stream-Next-Offset does not match the body"
        );
        out.extend_from_slice(&r.body);
        if r.header("stream-up-to-date") == Some("true") {
            return out;
        }
        assert!(next > off, "no progress at {off}");
        off = next;
    }
    panic!("read {path}: too many rounds");
}

/// Checks one stream against its writer's log. `final_check`: nothing may be unresolved.
fn check_stream(w: &Writer, bytes: &[u8], when: &str, final_check: bool) -> Result<(), String> {
    let ctx = |m: String| format!("{} ({:?}, {when}): {m}", w.path, w.kind);
    if !bytes.starts_with(&w.seen) {
        let common = bytes
            .iter()
            .zip(&w.seen)
            .take_while(|(a, b)| a == b)
            .count();
        return Err(ctx(format!(
            "stream lost data it had returned before: previously {} bytes, now {}, first difference at byte {common}",
            w.seen.len(),
            bytes.len()
        )));
    }
    if !bytes.is_empty() && bytes.last() != Some(&b'\n') {
        let start = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |p| p + 1);
        return Err(ctx(format!(
            "torn record at the end (offset {start}): {:?}",
            String::from_utf8_lossy(&bytes[start..bytes.len().min(start + 60)])
        )));
    }
    let index: HashMap<&[u8], usize> = w
        .log
        .iter()
        .enumerate()
        .map(|(i, e)| (e.body.as_slice(), i))
        .collect();
    let mut last: Option<usize> = None;
    let mut present = vec![false; w.log.len()];
    let mut unacked_present_per_cycle: HashMap<usize, usize> = HashMap::new();
    let mut off = 0usize;
    for rec in bytes.split_inclusive(|b| *b == b'\n') {
        let Some(&i) = index.get(rec) else {
            return Err(ctx(format!(
                "unknown or torn record at offset {off} ({} bytes): {:?}",
                rec.len(),
                String::from_utf8_lossy(&rec[..rec.len().min(60)])
            )));
        };
        if present[i] {
            return Err(ctx(format!(
                "record #{i} appears twice (second at offset {off})"
            )));
        }
        if let Some(l) = last
            && i < l
        {
            return Err(ctx(format!(
                "records out of send/acknowledgement order: #{i} after #{l} at offset {off}"
            )));
        }
        present[i] = true;
        last = Some(i);
        if !w.log[i].acked {
            *unacked_present_per_cycle.entry(w.log[i].cycle).or_default() += 1;
            if final_check && w.kind == Kind::Producer {
                return Err(ctx(format!(
                    "unacknowledged producer record #{i} present at the end"
                )));
            }
        }
        off += rec.len();
    }
    for (i, e) in w.log.iter().enumerate() {
        if e.acked && !present[i] {
            return Err(ctx(format!(
                "acknowledged record #{i} (cycle {}, {:?}) is missing",
                e.cycle,
                String::from_utf8_lossy(&e.body[..e.body.len().min(24)])
            )));
        }
    }
    if w.kind == Kind::Plain
        && let Some((c, n)) = unacked_present_per_cycle.iter().find(|(_, n)| **n > 1)
    {
        return Err(ctx(format!(
            "{n} unacknowledged records from cycle {c} (at most one)"
        )));
    }
    Ok(())
}

fn verify_all(s: &Server, writers: &mut [Writer], when: &str, final_check: bool) {
    for w in writers.iter_mut() {
        let bytes = read_stream(s.addr(), &w.path);
        if let Err(e) = check_stream(w, &bytes, when, final_check) {
            panic!("{e}");
        }
        w.seen = bytes;
    }
}

#[test]
fn acknowledged_appends_survive_random_sigkills() {
    let seed = crash_seed("crash test");
    let mut rng = Rng::new(seed);
    let t0 = Instant::now();

    let mut s = Server::start();
    let mut writers: Vec<Writer> = (0..4)
        .map(|i| Writer::new(i, if i < 2 { Kind::Plain } else { Kind::Producer }, seed))
        .collect();
    for w in &writers {
        let r = s.put(&w.path, "text/plain", b"");
        assert_eq!(r.status, 201, "create {}: {}", w.path, r.describe());
    }

    let mut cycles = 0usize;
    let (mut sigkills, mut sigterms, mut double_kills) = (0usize, 0usize, 0usize);
    loop {
        let stop = Arc::new(AtomicBool::new(false));
        let addr = s.addr();
        let handles: Vec<_> = writers
            .drain(..)
            .map(|w| {
                let stop = stop.clone();
                let cycle = cycles;
                std::thread::spawn(move || w.run_cycle(addr, stop, cycle))
            })
            .collect();
        // The random moment of the crash: letting time pass, not synchronization.
        let delay = Duration::from_millis(rng.range(50, 500));
        std::thread::sleep(delay);
        assert!(
            s.is_running(),
            "server died on its own in cycle {cycles}; log:\n{}",
            s.log_tail(60)
        );
        // Every eighth cycle shuts down gracefully instead (writes still in flight).
        let graceful = cycles % 8 == 7;
        if graceful {
            let st = s.terminate();
            assert!(
                st.success(),
                "SIGTERM exit status {st}; log:\n{}",
                s.log_tail(40)
            );
            sigterms += 1;
        } else {
            s.kill9();
            sigkills += 1;
        }
        stop.store(true, Ordering::SeqCst);
        for h in handles {
            writers.push(h.join().expect("writer thread panicked"));
        }
        writers.sort_by_key(|w| w.idx);
        cycles += 1;
        let errors: Vec<&String> = writers.iter().flat_map(|w| &w.errors).collect();
        assert!(errors.is_empty(), "seed {seed}: writer errors: {errors:#?}");

        s.restart();
        // Sometimes crash again right after recovery, before anything else happens.
        if rng.range(0, 7) == 0 {
            s.kill9();
            s.restart();
            double_kills += 1;
        }
        verify_all(
            &s,
            &mut writers,
            &format!("after restart {cycles}, seed {seed}"),
            false,
        );

        let acked: usize = writers
            .iter()
            .map(|w| w.log.iter().filter(|e| e.acked).count())
            .sum();
        eprintln!(
            "cycle {cycles}: stopped after {delay:?}; {acked} acknowledged appends so far; elapsed {:?}",
            t0.elapsed()
        );
        if cycles >= MAX_CYCLES || (sigkills >= MIN_CYCLES && t0.elapsed() > SOFT_BUDGET) {
            break;
        }
        assert!(
            t0.elapsed() < HARD_BUDGET,
            "only {cycles} cycles within {HARD_BUDGET:?} (restarts too slow?)"
        );
    }

    // Resolve the producers' in-flight requests on the live server.
    for w in writers.iter_mut().filter(|w| w.kind == Kind::Producer) {
        if let Some(i) = w.inflight.take() {
            let entry = w.log[i].clone();
            let mut conn = Conn::open(s.addr(), WRITE_TIMEOUT).expect("connect");
            let never = AtomicBool::new(false);
            let r = w
                .send_until_answered(&mut conn, &entry, &never)
                .unwrap_or_else(|| panic!("final retry of {} seq {} failed", w.path, entry.seq));
            assert!(
                r.status == 200 || r.status == 204,
                "final retry of {} seq {}: {}",
                w.path,
                entry.seq,
                r.describe()
            );
            w.retries.push((entry.seq, r.status));
            w.log[i].acked = true;
        }
    }
    verify_all(&s, &mut writers, &format!("final, seed {seed}"), true);

    // Producer streams hold exactly their acknowledged records; the tail matches.
    for w in &writers {
        let acked: Vec<u8> = w
            .log
            .iter()
            .filter(|e| e.acked)
            .flat_map(|e| e.body.clone())
            .collect();
        if w.kind == Kind::Producer {
            assert!(
                w.seen == acked,
                "{}: content is not exactly the acknowledged records",
                w.path
            );
        }
        let h = s.head(&w.path);
        assert_eq!(h.status, 200);
        assert_eq!(
            h.next_offset(),
            w.seen.len() as u64,
            "{}: HEAD tail",
            w.path
        );
        let n_acked = w.log.iter().filter(|e| e.acked).count();
        let unacked_present = w.seen.split_inclusive(|b| *b == b'\n').count() - n_acked;
        let dup = w.retries.iter().filter(|(_, st)| *st == 204).count();
        eprintln!(
            "{} ({:?}): {} sent, {n_acked} acknowledged, {unacked_present} unacknowledged present; \
             {} retries after restarts ({dup} were duplicates: 204)",
            w.path,
            w.kind,
            w.log.len(),
            w.retries.len()
        );
    }
    let total: usize = writers
        .iter()
        .map(|w| w.log.iter().filter(|e| e.acked).count())
        .sum();
    assert!(total > 0, "no append was ever acknowledged");
    eprintln!(
        "{cycles} cycles ({sigkills} SIGKILL, {sigterms} SIGTERM, {double_kills} extra SIGKILLs right \
         after recovery) in {:?}, seed {seed}",
        t0.elapsed()
    );
    assert!(sigkills >= MIN_CYCLES, "only {sigkills} SIGKILL cycles");
}
