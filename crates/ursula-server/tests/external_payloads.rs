//! External payloads on the real binary (cluster.md §6.4): with a cold backend, a body of at
//! least `runtime.external_payload_min_size` (1 MiB) goes to the cold store before it is
//! proposed, so the WAL never holds it; it reads back byte-exact through every read path
//! (catch-up, bootstrap, forks, after a restart and after SIGKILL); a store that fails the
//! write answers `502 COLD_STORE_FAILED` and appends nothing; without a cold backend large
//! bodies still travel inline.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use common::{Server, assert_error, off20, wait_until};
use std::path::Path;
use std::time::Duration;

const OCTET: &str = "application/octet-stream";
const MIB: usize = 1 << 20;

fn pattern(seed: u8, start: usize, len: usize) -> Vec<u8> {
    (start..start + len)
        .map(|i| (i as u8).wrapping_mul(13) ^ seed ^ ((i >> 11) as u8))
        .collect()
}

fn metric(s: &Server, name: &str) -> u64 {
    s.metrics()[name].as_u64().unwrap_or(0)
}

/// Total bytes of the files below `dir`.
fn bytes_below(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => bytes_below(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// A node with a small flush threshold (so hot bytes around external payloads get flushed),
/// in `dir/data`.
fn start(dir: &Path) -> Server {
    let cfg = dir.join("ursula.toml");
    if !cfg.exists() {
        std::fs::create_dir_all(dir).unwrap();
        let text = "[storage.cold]\n\
             backend = \"local\"\n\
             flush_size = \"64KiB\"\n\
             max_hot_size_per_group = \"4MiB\"\n\
             flush_interval = \"50ms\"\n\
             gc_interval = \"100ms\"\n";
        std::fs::write(&cfg, text).unwrap();
    }
    let args = ["--config", cfg.to_str().unwrap(), "--group-count", "2"];
    Server::start_in_with_args(&dir.join("data"), &args)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let head = &needle[..64.min(needle.len())];
    (0..hay.len().saturating_sub(needle.len()) + 1)
        .find(|&i| hay[i..i + head.len()] == *head && hay[i..].starts_with(needle))
}

#[test]
fn large_appends_go_to_the_cold_store_and_read_back_exact_everywhere() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut s = start(tmp.path());
    assert_eq!(s.put("/extp/a", OCTET, b"").status, 201);
    // Hot bytes, an external payload, hot bytes, another external, hot bytes.
    let mut want = Vec::new();
    let sizes = [100 * 1024, 2 * MIB, 100 * 1024, MIB, 3000];
    for (i, n) in sizes.into_iter().enumerate() {
        let body = pattern(1, want.len(), n);
        let r = s.post("/extp/a", OCTET, &body);
        assert_eq!(r.status, 204, "append {i}: {}", r.text());
        want.extend_from_slice(&body);
        assert_eq!(r.next_offset(), want.len() as u64);
    }
    // The externals are objects of their own; the WAL holds references, not their bytes.
    let external = data.join("cold/external");
    assert_eq!(
        common::files_below(&external),
        2,
        "one object per external payload"
    );
    assert_eq!(metric(&s, "external_payloads_total"), 2);
    assert_eq!(metric(&s, "external_payload_bytes_total"), 3 * MIB as u64);
    assert!(bytes_below(&external) >= 3 * MIB as u64);
    let wal = metric(&s, "wal_disk_bytes");
    assert!(
        wal < MIB as u64,
        "the WAL grew by the payloads: {wal} bytes"
    );
    // The hot bytes between them are flushed; the externals are not uploaded again.
    assert!(
        wait_until(Duration::from_secs(20), || metric(&s, "hot_bytes")
            < 64 * 1024),
        "hot bytes were not flushed: {}",
        s.metrics()
    );
    let flushed = metric(&s, "cold_flushed_bytes_total");
    assert!(
        flushed < MIB as u64,
        "a flush re-uploaded external bytes: {flushed}"
    );

    let (got, next) = s.read_all("/extp/a");
    assert_eq!(next, want.len() as u64);
    assert!(got == want, "bytes differ");
    // Catch-up reads starting inside the first external, and inside the hot run after it.
    for at in [100 * 1024 + 12_345, 100 * 1024 + 2 * MIB + 7] {
        let r = s.get(&format!("/extp/a?offset={}", off20(at as u64)));
        assert_eq!(r.status, 200);
        assert!(!r.body.is_empty());
        assert!(r.body[..] == want[at..at + r.body.len()], "read at {at}");
    }
    // Bootstrap (no snapshot: every retained message) carries the payload whole.
    let r = s.get("/extp/a/bootstrap");
    assert_eq!(r.status, 200, "{}", r.text());
    let ext = &want[100 * 1024..100 * 1024 + 2 * MIB];
    assert!(find(&r.body, ext).is_some(), "bootstrap lacks the payload");
    // A fork reads the external bytes it inherits, and appends one of its own.
    let r = s.req(
        "PUT",
        "/extp/f",
        &[("Stream-Forked-From", "/extp/a"), ("Content-Type", OCTET)],
        b"",
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let own = pattern(2, want.len(), MIB + 5);
    assert_eq!(s.post("/extp/f", OCTET, &own).status, 204);
    let mut fork_want = want.clone();
    fork_want.extend_from_slice(&own);
    let (fork, _) = s.read_all("/extp/f");
    assert!(fork == fork_want, "the fork's bytes differ");

    // A create with a large initial body, on a JSON stream: records stay countable.
    let records: Vec<String> = (0..300)
        .map(|i| format!("{{\"n\":{i},\"pad\":\"{}\"}}", "x".repeat(4000)))
        .collect();
    let body = format!("[{}]", records.join(","));
    let r = s.put("/extp/j", "application/json", body.as_bytes());
    assert_eq!(r.status, 201, "{}", r.text());
    let ndjson: String = records.iter().map(|r| format!("{r}\n")).collect();
    assert!(ndjson.len() >= MIB);
    assert_eq!(common::files_below(&external), 4);

    // Restart, then SIGKILL and restart: everything reads back from the references.
    s.terminate();
    let mut s = start(tmp.path());
    let (got, _) = s.read_all("/extp/a");
    assert!(got == want, "bytes differ after a restart");
    s.kill9();
    let s = start(tmp.path());
    let (got, _) = s.read_all("/extp/a");
    assert!(got == want, "bytes differ after SIGKILL");
    let (fork, _) = s.read_all("/extp/f");
    assert!(fork == fork_want, "the fork differs after SIGKILL");
    let (j, next) = s.read_all("/extp/j");
    assert_eq!(next, ndjson.len() as u64);
    // JSON reads answer arrays of the records: every record is there, in order.
    let text = String::from_utf8(j).unwrap();
    let mut at = 0;
    for r in &records {
        at += text[at..]
            .find(r.as_str())
            .expect("a record is missing or out of order");
    }
    // Record reads: the last record is record 299 (the index came from the command).
    let r = s.get("/extp/j?record=299");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.text().contains("\"n\":299"),
        "{}",
        &r.text()[..80.min(r.text().len())]
    );

    // Deleting the source while the fork lives keeps the objects the fork reads (its pin).
    assert_eq!(s.delete("/extp/a").status, 204);
    assert_eq!(s.delete("/extp/j").status, 204);
    // The stream deleted last (j) has had its object removed once nothing is queued, so
    // anything the source's delete had queued would be gone by then too.
    let settled =
        || metric(&s, "cold_gc_queued_objects") == 0 && common::files_below(&external) <= 3;
    assert!(wait_until(Duration::from_secs(20), settled));
    assert_eq!(
        common::files_below(&external),
        3,
        "GC deleted what the fork reads"
    );
    let (fork, _) = s.read_all("/extp/f");
    assert!(
        fork == fork_want,
        "the fork differs once its source is deleted"
    );
    // Deleting the fork releases the pin, the source goes, and GC removes every object.
    assert_eq!(s.delete("/extp/f").status, 204);
    assert!(
        wait_until(Duration::from_secs(20), || common::files_below(&external)
            == 0),
        "external objects left after the deletes: {}",
        common::files_below(&external)
    );
}

#[test]
fn a_producer_retry_of_a_large_append_appends_once_and_leaks_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let s = start(tmp.path());
    let external = tmp.path().join("data/cold/external");
    assert_eq!(s.put("/dupe/a", OCTET, b"").status, 201);
    let body = pattern(3, 0, 2 * MIB);
    let hdrs = [
        ("Content-Type", OCTET),
        ("Producer-Id", "w1"),
        ("Producer-Epoch", "0"),
        ("Producer-Seq", "0"),
    ];
    let first = s.req("POST", "/dupe/a", &hdrs, &body);
    assert!(matches!(first.status, 200 | 204), "{}", first.text());
    assert_eq!(common::files_below(&external), 1);
    // The retry is answered as a duplicate without uploading the body again.
    let again = s.req("POST", "/dupe/a", &hdrs, &body);
    assert!(matches!(again.status, 200 | 204), "{}", again.text());
    assert_eq!(again.next_offset(), 2 * MIB as u64);
    assert_eq!(
        common::files_below(&external),
        1,
        "the retry uploaded its body"
    );
    let (got, _) = s.read_all("/dupe/a");
    assert!(got == body, "appended twice or lost");
    // Another producer's append whose command finds a duplicate only when applied (its
    // epoch/seq taken by a racing write) is covered in core: the apply queues its object.
    // A refused large append (wrong content type) leaves no object either.
    let r = s.post("/dupe/a", "text/plain", &body);
    assert_error(&r, 409, "CONTENT_TYPE_MISMATCH");
    assert!(wait_until(Duration::from_secs(20), || common::files_below(
        &external
    ) == 1));
}

#[test]
fn a_failing_store_refuses_large_appends_and_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let s = start(tmp.path());
    assert_eq!(s.put("/fail/a", OCTET, b"before").status, 201);
    // The store goes away: its directory is replaced by a file.
    let cold = tmp.path().join("data/cold");
    let away = tmp.path().join("cold.away");
    std::fs::rename(&cold, &away).unwrap();
    std::fs::write(&cold, b"not a directory").unwrap();
    let body = pattern(4, 6, 2 * MIB);
    let r = s.post("/fail/a", OCTET, &body);
    assert_error(&r, 502, "COLD_STORE_FAILED");
    assert_eq!(metric(&s, "external_payload_errors_total"), 1);
    let r = s.put("/fail/b", OCTET, &body);
    assert_error(&r, 502, "COLD_STORE_FAILED");
    assert_eq!(s.head("/fail/b").status, 404, "the create created nothing");
    let r = s.head("/fail/a");
    assert_eq!(r.next_offset(), 6, "the failed append changed the stream");
    // Small appends still go inline.
    assert_eq!(s.post("/fail/a", OCTET, b"!").status, 204);
    // The store comes back: large appends are taken again.
    std::fs::remove_file(&cold).unwrap();
    std::fs::rename(&away, &cold).unwrap();
    assert_eq!(s.post("/fail/a", OCTET, &body).status, 204);
    let mut want = b"before!".to_vec();
    want.extend_from_slice(&body);
    let (got, _) = s.read_all("/fail/a");
    assert!(got == want);
}

#[test]
fn without_a_cold_backend_large_appends_travel_inline() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut s = Server::start_in_with_args(&data, &["--cold-backend", "none"]);
    assert_eq!(s.put("/none/a", OCTET, b"").status, 201);
    let body = pattern(5, 0, 2 * MIB);
    assert_eq!(s.post("/none/a", OCTET, &body).status, 204);
    let wal = metric(&s, "wal_disk_bytes");
    assert!(wal >= 2 * MIB as u64, "not inline in the WAL: {wal}");
    s.kill9();
    let s = Server::start_in_with_args(&data, &["--cold-backend", "none"]);
    let (got, _) = s.read_all("/none/a");
    assert!(got == body);
}

#[test]
fn the_threshold_is_configurable() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let s = Server::start_in_with_args(&data, &["--external-payload-min-size", "64KiB"]);
    assert_eq!(s.put("/thre/a", OCTET, b"").status, 201);
    let body = pattern(6, 0, 100 * 1024);
    assert_eq!(s.post("/thre/a", OCTET, &body).status, 204);
    assert_eq!(common::files_below(&data.join("cold/external")), 1);
    let (got, _) = s.read_all("/thre/a");
    assert!(got == body);
}

#[test]
fn the_orphan_sweep_deletes_unreferenced_external_objects_after_the_grace() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::create_dir_all(dir).unwrap();
    let cfg = dir.join("ursula.toml");
    let text = "[storage.cold]\n\
         backend = \"local\"\n\
         snapshot_part_grace = \"1s\"\n\
         snapshot_part_sweep_interval = \"200ms\"\n";
    std::fs::write(&cfg, text).unwrap();
    let args = ["--config", cfg.to_str().unwrap(), "--group-count", "1"];
    let s = Server::start_in_with_args(&dir.join("data"), &args);
    assert_eq!(s.put("/swep/a", OCTET, b"").status, 201);
    let body = pattern(7, 0, MIB);
    assert_eq!(s.post("/swep/a", OCTET, &body).status, 204);
    // An upload whose command never committed (a crash between the two) looks like this:
    // an object of the group's prefix that nothing references.
    let external = dir.join("data/cold/external");
    let mut found = Vec::new();
    let mut stack = vec![external.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.path().is_dir() {
                stack.push(e.path());
            } else {
                found.push(e.path());
            }
        }
    }
    assert_eq!(found.len(), 1);
    let used = found.pop().unwrap();
    let orphan = used.with_file_name("8000000000000001.payload");
    std::fs::copy(&used, &orphan).unwrap();
    assert!(
        wait_until(Duration::from_secs(20), || !orphan.exists()),
        "the orphan was not swept"
    );
    assert!(used.exists(), "the sweep deleted a referenced object");
    assert_eq!(metric(&s, "external_payloads_swept_total"), 1);
    let (got, _) = s.read_all("/swep/a");
    assert!(got == body);
}

#[test]
fn sse_and_long_poll_read_external_payloads() {
    use std::time::Instant;
    let tmp = tempfile::tempdir().unwrap();
    let s = start(tmp.path());
    const TEXT: &str = "text/plain";
    assert_eq!(s.put("/ssex/t", TEXT, b"head-").status, 201);
    let body: Vec<u8> = (0..2 * MIB).map(|i| b'a' + (i % 26) as u8).collect();
    assert_eq!(s.post("/ssex/t", TEXT, &body).status, 204);
    assert_eq!(s.post("/ssex/t", TEXT, b"-tail").status, 204);
    let mut want = b"head-".to_vec();
    want.extend_from_slice(&body);
    want.extend_from_slice(b"-tail");
    // A long-poll from inside the payload answers at once with its bytes.
    let at = 5 + MIB;
    let r = s.get(&format!(
        "/ssex/t?offset={}&live=long-poll",
        off20(at as u64)
    ));
    assert_eq!(r.status, 200);
    assert!(!r.body.is_empty() && r.body[..] == want[at..at + r.body.len()]);
    // SSE from the start delivers every byte, in order, across the tiers.
    let mut sse =
        common::SseStream::open(s.addr(), "/ssex/t?offset=-1&live=sse").expect("open SSE");
    assert_eq!(sse.status, 200);
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while got.len() < want.len() {
        match sse.next_event(deadline) {
            Ok(Some(e)) if e.event == "data" => got.extend_from_slice(e.data.as_bytes()),
            Ok(Some(_)) => {}
            other => panic!("SSE ended early after {} bytes: {other:?}", got.len()),
        }
        assert!(Instant::now() < deadline, "SSE too slow");
    }
    assert!(got == want, "SSE bytes differ");
}
