//! The cold tier on the real binary (cluster.md §6): streams larger than the hot bound move
//! to the default `local` cold store and read back byte-exact across tiers (catch-up, forks,
//! after SIGKILL and restart); hot bytes stay bounded (`503 COLD_BACKPRESSURE` while a flush
//! is due); retention lets GC delete objects; a store that fails answers cold reads with
//! `502 COLD_STORE_FAILED` while hot reads and writes go on, and heals when it comes back.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use common::multipart::parse_multipart;
use common::{Server, assert_error, off20, wait_until};
use std::path::Path;
use std::time::{Duration, Instant};

const OCTET: &str = "application/octet-stream";

/// A node with a small hot tier: flushes at 64 KiB per group, at most 512 KiB hot per group.
fn start(dir: &Path) -> Server {
    start_with(dir, "")
}

/// [`start`] with more TOML after the `[storage.cold]` keys (written on the first start).
fn start_with(dir: &Path, more: &str) -> Server {
    start_with_args(dir, more, &[])
}

/// [`start_with`] plus command-line flags (which override the TOML file).
fn start_with_args(dir: &Path, more: &str, args: &[&str]) -> Server {
    let cfg = dir.join("ursula.toml");
    if !cfg.exists() {
        std::fs::create_dir_all(dir).unwrap();
        let text = "[storage.cold]\n\
             backend = \"local\"\n\
             flush_size = \"64KiB\"\n\
             max_hot_size_per_group = \"512KiB\"\n\
             flush_interval = \"50ms\"\n\
             gc_interval = \"100ms\"\n"
            .to_owned()
            + more;
        std::fs::write(&cfg, text).unwrap();
    }
    let mut all = vec!["--config", cfg.to_str().unwrap(), "--group-count", "2"];
    all.extend_from_slice(args);
    Server::start_in_with_args(&dir.join("data"), &all)
}

fn pattern(stream: u8, start: usize, len: usize) -> Vec<u8> {
    (start..start + len)
        .map(|i| (i as u8).wrapping_mul(7) ^ stream ^ ((i >> 9) as u8))
        .collect()
}

/// Appends `body`, retrying (bounded) while the group answers `503 COLD_BACKPRESSURE`.
fn append(s: &Server, path: &str, body: &[u8]) -> u32 {
    let mut refused = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = s.post(path, OCTET, body);
        if r.status == 204 || r.status == 200 {
            return refused;
        }
        assert_error(&r, 503, "COLD_BACKPRESSURE");
        assert_eq!(r.header("retry-after"), Some("1"));
        refused += 1;
        assert!(Instant::now() < deadline, "backpressure never lifted");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn metric(s: &Server, name: &str) -> u64 {
    s.metrics()[name].as_u64().unwrap_or(0)
}

#[test]
fn streams_larger_than_the_hot_tier_read_back_exact_across_tiers() {
    let tmp = tempfile::tempdir().unwrap();
    // A read cache configured: a `local` store does not use it (the page cache serves).
    let cache = "[storage.cold.cache]\nmax_size = \"4MiB\"\nblock_size = \"128KiB\"\n";
    let mut s = start_with(tmp.path(), cache);
    let mut want: Vec<Vec<u8>> = vec![Vec::new(); 3];
    for (i, w) in want.iter_mut().enumerate() {
        assert_eq!(s.put(&format!("/cold/s{i}"), OCTET, b"").status, 201);
        let _ = w;
    }
    // 3 streams x 40 appends of 16 KiB: 1.9 MiB, far above the 512 KiB hot bound per group.
    let mut refused = 0;
    for round in 0..40 {
        for (i, w) in want.iter_mut().enumerate() {
            let body = pattern(i as u8, w.len(), 16 * 1024 + round);
            refused += append(&s, &format!("/cold/s{i}"), &body);
            w.extend_from_slice(&body);
        }
    }
    assert!(
        wait_until(Duration::from_secs(20), || metric(&s, "cold_bytes")
            > 1 << 20),
        "nothing was flushed: {}",
        s.metrics()
    );
    let hot = metric(&s, "hot_bytes");
    assert!(
        hot <= 2 * 512 * 1024 + 64 * 1024,
        "hot bytes unbounded: {hot}"
    );
    assert!(metric(&s, "cold_flushes_total") > 0);
    eprintln!("backpressure answers while writing: {refused}");

    for (i, w) in want.iter().enumerate() {
        let (got, next) = s.read_all(&format!("/cold/s{i}"));
        assert_eq!(next, w.len() as u64);
        assert!(got == *w, "stream s{i} differs after the flush");
    }
    assert!(
        metric(&s, "cold_reads_total") > 0,
        "no read reached the cold tier"
    );
    // A `local` store's objects are read from their files, not through the block cache: the
    // first read of a block checks it, later reads send it from the file with sendfile.
    assert_eq!(metric(&s, "cold_cache_misses_total"), 0);
    let sent = metric(&s, "cold_sendfile_bytes_total");
    let (again, _) = s.read_all("/cold/s0");
    assert!(again == want[0]);
    assert!(
        metric(&s, "cold_sendfile_bytes_total") >= sent + 256 * 1024,
        "the second pass was not sent from the files: {}",
        s.metrics()
    );

    // The `local` backend writes its objects in layout version 2 (checksums first, then the
    // payload in one run), which is what lets a checked range leave in one `sendfile`.
    let versions = chunk_files(&tmp.path().join("data/cold/chunks"))
        .iter()
        .map(|f| {
            let head = std::fs::read(f).unwrap();
            assert_eq!(&head[..4], b"UCHK", "{}", f.display());
            u16::from_le_bytes([head[4], head[5]])
        })
        .collect::<Vec<_>>();
    assert!(
        !versions.is_empty() && versions.iter().all(|v| *v == 2),
        "{versions:?}"
    );

    // A read that starts inside a cold chunk and ends in the hot tail.
    let mid = want[1].len() / 3;
    let r = s.get(&format!("/cold/s1?offset={}", off20(mid as u64)));
    assert_eq!(r.status, 200);
    assert!(r.body[..] == want[1][mid..mid + r.body.len()]);

    // Bootstrap streams every message across the tiers: one part per append, byte-exact.
    let r = s.get("/cold/s1/bootstrap");
    assert_eq!(r.status, 200, "{}", r.text());
    let parts = parse_multipart(&r);
    assert_eq!(
        parts.len(),
        1 + 40,
        "the snapshot part and one part per append"
    );
    let updates: Vec<u8> = parts[1..].iter().flat_map(|p| p.body.clone()).collect();
    assert!(updates == want[1], "bootstrap bytes differ across tiers");
    assert_eq!(parts[1].body.len(), 16 * 1024);

    // A fork of a flushed stream reads its inherited bytes from the cold tier.
    let r = s.req(
        "PUT",
        "/cold/fork",
        &[("Stream-Forked-From", "/cold/s2"), ("Content-Type", OCTET)],
        b"",
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let (fork, _) = s.read_all("/cold/fork");
    assert!(fork == want[2], "the fork's inherited bytes differ");

    // SIGKILL and restart: the replicated state holds references, the bytes are in objects.
    s.kill9();
    let mut s = start(tmp.path());
    for (i, w) in want.iter().enumerate() {
        let (got, _) = s.read_all(&format!("/cold/s{i}"));
        assert!(got == *w, "stream s{i} differs after a restart");
    }
    // Writes go on after the restart.
    let more = pattern(0, want[0].len(), 1000);
    append(&s, "/cold/s0", &more);
    want[0].extend_from_slice(&more);
    let (got, _) = s.read_all("/cold/s0");
    assert!(got == want[0]);
    s.terminate();
}

#[test]
fn retention_and_deletes_let_gc_remove_cold_objects() {
    let tmp = tempfile::tempdir().unwrap();
    let s = start(tmp.path());
    assert_eq!(s.put("/gcbk/a", OCTET, b"").status, 201);
    let mut want = Vec::new();
    for _ in 0..48 {
        let body = pattern(9, want.len(), 16 * 1024);
        append(&s, "/gcbk/a", &body);
        want.extend_from_slice(&body);
    }
    assert!(wait_until(Duration::from_secs(20), || metric(
        &s,
        "cold_objects"
    ) >= 3));
    let objects = metric(&s, "cold_objects");
    let chunk_files = || common::files_below(&tmp.path().join("data/cold"));
    let files_before = chunk_files();
    assert!(files_before >= objects as usize);

    // Retain the newest quarter: objects wholly below it become garbage and are deleted.
    let keep = (want.len() / 4 * 3) as u64;
    let snap = s.req(
        "PUT",
        &format!("/gcbk/a/snapshot/{}", off20(keep)),
        &[("Content-Type", OCTET)],
        b"state",
    );
    assert_eq!(snap.status, 204, "{}", snap.text());
    let r = s.req(
        "PUT",
        &format!("/gcbk/a/retention/{}", off20(keep)),
        &[],
        b"",
    );
    assert_eq!(r.status, 204, "{}", r.text());
    assert!(
        wait_until(Duration::from_secs(20), || metric(
            &s,
            "cold_gc_deleted_total"
        ) > 0
            && chunk_files() < files_before),
        "GC deleted nothing: {}",
        s.metrics()
    );
    let r = s.get(&format!("/gcbk/a?offset={}", off20(keep)));
    assert_eq!(r.status, 200);
    assert!(r.body[..] == want[keep as usize..keep as usize + r.body.len()]);
    let r = s.get(&format!("/gcbk/a?offset={}", off20(keep - 1)));
    assert_eq!(r.status, 410);

    // Deleting the stream releases every object it referenced.
    assert_eq!(s.delete("/gcbk/a").status, 204);
    assert!(
        wait_until(Duration::from_secs(20), || metric(&s, "cold_objects") == 0
            && metric(&s, "cold_gc_queued_objects") == 0),
        "objects left after delete: {}",
        s.metrics()
    );
}

#[test]
fn a_failing_cold_store_fails_cold_reads_only_and_heals() {
    let tmp = tempfile::tempdir().unwrap();
    let s = start(tmp.path());
    assert_eq!(s.put("/fail/a", OCTET, b"").status, 201);
    let mut want = Vec::new();
    for _ in 0..16 {
        let body = pattern(3, want.len(), 16 * 1024);
        append(&s, "/fail/a", &body);
        want.extend_from_slice(&body);
    }
    // Flushed, and no flush due or in flight (one in flight still counts its bytes as hot).
    let settled = || metric(&s, "cold_bytes") >= 128 * 1024 && metric(&s, "hot_bytes") < 64 * 1024;
    assert!(wait_until(Duration::from_secs(20), settled));
    // The store goes away: its directory is replaced by a file, so neither reads nor
    // uploads (which would create missing directories) can succeed.
    let cold = tmp.path().join("data/cold");
    let away = tmp.path().join("cold.away");
    std::fs::rename(&cold, &away).unwrap();
    std::fs::write(&cold, b"not a directory").unwrap();

    let r = s.get(&format!("/fail/a?offset={}", off20(0)));
    assert_error(&r, 502, "COLD_STORE_FAILED");
    let ready = s.get("/__ursula/ready");
    assert_eq!(ready.status, 503, "readiness must say the cold store fails");
    assert!(ready.text().contains("cold store"), "{}", ready.text());
    assert_eq!(metric(&s, "cold_store_healthy"), 0);
    // The hot tail still reads, and writes are still taken (below the hot bound).
    let tail = want.len() as u64;
    let r = s.post("/fail/a", OCTET, b"hot");
    assert_eq!(r.status, 204, "{}", r.text());
    want.extend_from_slice(b"hot");
    let r = s.get(&format!("/fail/a?offset={}", off20(tail)));
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"hot");

    // Writes go on until the hot bound, then answer 503 COLD_BACKPRESSURE: nothing can
    // be flushed.
    let mut refused = None;
    for i in 0..200 {
        let body = pattern(3, want.len(), 16 * 1024);
        let r = s.post("/fail/a", OCTET, &body);
        if r.status == 503 {
            assert_error(&r, 503, "COLD_BACKPRESSURE");
            assert_eq!(r.header("retry-after"), Some("1"));
            refused = Some(i);
            break;
        }
        assert_eq!(r.status, 204, "{}", r.text());
        want.extend_from_slice(&body);
    }
    assert!(refused.is_some(), "the hot tier grew without bound");
    // The bound can be reached before the next flush tick tries (and fails) to upload.
    assert!(
        wait_until(Duration::from_secs(10), || metric(
            &s,
            "cold_flush_errors_total"
        ) > 0),
        "no flush failed while the store was away: {}",
        s.metrics()
    );
    let r = s.get(&format!("/fail/a?offset={}", off20(tail)));
    assert_eq!(r.status, 200, "hot reads must go on during backpressure");

    // The store comes back: flushes catch up and writes are taken again, no restart.
    std::fs::remove_file(&cold).unwrap();
    std::fs::rename(&away, &cold).unwrap();
    let body = pattern(3, want.len(), 1000);
    append(&s, "/fail/a", &body);
    want.extend_from_slice(&body);
    let (got, _) = s.read_all("/fail/a");
    assert!(got == want, "bytes differ once the store is back");
    assert!(
        wait_until(Duration::from_secs(10), || s.get("/__ursula/ready").status
            == 200),
        "readiness did not recover: {}",
        s.get("/__ursula/ready").text()
    );
}

#[test]
fn a_node_without_a_cold_backend_keeps_everything_hot() {
    let tmp = tempfile::tempdir().unwrap();
    let s = Server::start_in_with_args(&tmp.path().join("data"), &["--cold-backend", "none"]);
    assert_eq!(s.put("/none/a", OCTET, b"").status, 201);
    let mut want = Vec::new();
    for _ in 0..8 {
        let body = pattern(5, want.len(), 64 * 1024);
        assert_eq!(s.post("/none/a", OCTET, &body).status, 204);
        want.extend_from_slice(&body);
    }
    let (got, _) = s.read_all("/none/a");
    assert!(got == want);
    assert!(s.metrics().get("cold_bytes").is_none());
}

/// SIGKILL at random moments while flushes run: after every restart each stream holds exactly
/// the appends it acknowledged, in order, and the cold tier's references still resolve.
#[test]
fn sigkill_during_flushes_loses_nothing_acknowledged() {
    let tmp = tempfile::tempdir().unwrap();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("seed {seed}");
    let mut rng = seed | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    // Per stream: every body sent, and how many were acknowledged.
    let mut sent: Vec<Vec<Vec<u8>>> = vec![Vec::new(); 3];
    let mut acked = [0usize; 3];
    let mut s = start(tmp.path());
    for i in 0..3 {
        assert_eq!(s.put(&format!("/kill/s{i}"), OCTET, b"").status, 201);
    }
    for cycle in 0..6 {
        let addr = s.addr();
        let deadline = Instant::now() + Duration::from_millis(100 + next() % 400);
        // Write until the deadline, then kill: the flush worker is busy with what was just
        // written (the flush threshold is 64 KiB, one round is 24 KiB).
        'write: while Instant::now() < deadline {
            for i in 0..3 {
                let body = pattern(i as u8 + 10 * cycle, sent[i].len(), 8 * 1024);
                sent[i].push(body.clone());
                let r = common::try_request(
                    addr,
                    "POST",
                    &format!("/kill/s{i}"),
                    &[("Content-Type", OCTET)],
                    &body,
                    Duration::from_secs(10),
                );
                match r {
                    Ok(r) if r.status == 204 => acked[i] = sent[i].len(),
                    Ok(r) if r.status == 503 => {
                        sent[i].pop(); // refused before the log: not written
                    }
                    other => panic!("append: {other:?}"),
                }
                if Instant::now() >= deadline {
                    break 'write;
                }
            }
        }
        s.kill9();
        s = start(tmp.path());
        for i in 0..3 {
            let (got, _) = s.read_all(&format!("/kill/s{i}"));
            // The stream is the first k bodies sent, acked <= k <= sent.
            let mut k = 0;
            let mut at = 0;
            while k < sent[i].len() && at + sent[i][k].len() <= got.len() {
                assert!(
                    got[at..at + sent[i][k].len()] == sent[i][k][..],
                    "cycle {cycle} stream {i}: append {k} differs (seed {seed})"
                );
                at += sent[i][k].len();
                k += 1;
            }
            assert_eq!(at, got.len(), "cycle {cycle} stream {i}: a torn append");
            assert!(
                k >= acked[i],
                "cycle {cycle} stream {i}: lost acknowledged appends"
            );
            // What the restart kept is what the stream holds from now on.
            sent[i].truncate(k);
            acked[i] = k;
        }
    }
    assert!(
        metric(&s, "cold_bytes") > 0,
        "no flush happened: {}",
        s.metrics()
    );
}

/// The same flush and reads against a real S3-compatible server: `scripts/s3-suite.sh` starts
/// one and runs this test with `URSULA_TEST_S3_ENDPOINT` set (it is ignored otherwise).
#[test]
#[ignore = "needs an S3-compatible server: run scripts/s3-suite.sh"]
fn the_cold_tier_works_on_a_real_s3_server() {
    let endpoint = std::env::var("URSULA_TEST_S3_ENDPOINT").expect("URSULA_TEST_S3_ENDPOINT");
    let bucket = std::env::var("URSULA_TEST_S3_BUCKET").unwrap_or("ursula-test".into());
    let root = format!(
        "tier-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    );
    let tmp = tempfile::tempdir().unwrap();
    let args = [
        "--cold-backend",
        "s3",
        "--cold-s3-endpoint",
        endpoint.as_str(),
        "--cold-s3-bucket",
        bucket.as_str(),
        "--cold-root",
        root.as_str(),
    ];
    // With the read cache: a second pass over the data must hit it.
    let cache = "[storage.cold.cache]\nmax_size = \"4MiB\"\nblock_size = \"128KiB\"\n";
    let mut s = start_with_args(tmp.path(), cache, &args);
    assert_eq!(s.put("/sss3/a", OCTET, b"").status, 201);
    let mut want = Vec::new();
    for _ in 0..40 {
        let body = pattern(4, want.len(), 16 * 1024);
        append(&s, "/sss3/a", &body);
        want.extend_from_slice(&body);
    }
    assert!(
        wait_until(Duration::from_secs(30), || metric(&s, "cold_bytes")
            >= 256 * 1024),
        "nothing was flushed to S3: {}",
        s.metrics()
    );
    let (got, _) = s.read_all("/sss3/a");
    assert!(got == want, "bytes differ across tiers on S3");
    s.kill9();
    let s = start_with_args(tmp.path(), "", &args);
    let (got, _) = s.read_all("/sss3/a");
    assert!(got == want, "bytes differ after a restart on S3");
    assert!(metric(&s, "cold_reads_total") > 0);
    assert!(metric(&s, "cold_cache_misses_total") > 0);
    let (again, _) = s.read_all("/sss3/a");
    assert!(again == want);
    assert!(metric(&s, "cold_cache_hits_total") > 0, "{}", s.metrics());
    assert!(metric(&s, "cold_cache_bytes") <= 4 << 20);
    assert_eq!(
        metric(&s, "cold_sendfile_bytes_total"),
        0,
        "S3 bytes are not files"
    );
}

/// An object left by a flush that uploaded but never committed (a crash between the two) is
/// found by the next flush of its group, queued for deletion and deleted; the flush goes on
/// with the next id.
/// Every `.chunk` file below `dir`.
fn chunk_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "chunk") {
                found.push(p);
            }
        }
    }
    found
}

/// The highest id among the `{id:020}.chunk` objects in `dir`.
fn last_chunk_id(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            e.ok()?
                .file_name()
                .to_str()?
                .strip_suffix(".chunk")?
                .parse()
                .ok()
        })
        .max()
        .unwrap()
}

#[test]
fn an_orphan_object_from_an_interrupted_flush_is_deleted() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("ursula.toml");
    std::fs::write(
        &cfg,
        "[storage.cold]\nflush_size = \"64KiB\"\nflush_interval = \"50ms\"\ngc_interval = \"100ms\"\n",
    )
    .unwrap();
    let s = Server::start_in_with_args(
        &tmp.path().join("data"),
        &["--group-count", "1", "--config", cfg.to_str().unwrap()],
    );
    assert_eq!(s.put("/orph/a", OCTET, b"").status, 201);
    let mut want = Vec::new();
    let write = |n: usize, want: &mut Vec<u8>| {
        for _ in 0..n {
            let body = pattern(1, want.len(), 16 * 1024);
            append(&s, "/orph/a", &body);
            want.extend_from_slice(&body);
        }
    };
    write(6, &mut want);
    assert!(wait_until(Duration::from_secs(20), || metric(
        &s,
        "cold_objects"
    ) > 0));
    // The group's objects: chunks/{namespace}/g00000/{id}.chunk. What a crashed flush leaves
    // is an object at the next id, uploaded and never published.
    let chunks = tmp.path().join("data/cold/chunks");
    let ns = std::fs::read_dir(&chunks)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let dir = ns.join("g00000");
    let last = last_chunk_id(&dir);
    let orphan = dir.join(format!("{:020}.chunk", last + 1));
    std::fs::write(&orphan, b"left by a crashed flush").unwrap();
    write(6, &mut want);
    assert!(
        wait_until(Duration::from_secs(20), || !orphan.exists()
            && metric(&s, "cold_objects") >= 2),
        "the orphan was not deleted: {}",
        s.metrics()
    );
    let (got, _) = s.read_all("/orph/a");
    assert!(got == want);

    // A crash between upload and commit in a group that then gets no writes: the restarted
    // leader probes its next id once and hands the orphan to GC. A staging file an
    // interrupted local upload left behind is swept too.
    let mut s = s;
    s.terminate();
    let last = last_chunk_id(&dir);
    let orphan = dir.join(format!("{:020}.chunk", last + 1));
    std::fs::write(&orphan, b"left by a crashed flush").unwrap();
    let staging = dir.join(format!("{:020}.chunk#4711", last + 2));
    let f = std::fs::File::create(&staging).unwrap();
    f.set_modified(std::time::SystemTime::now() - Duration::from_secs(600))
        .unwrap();
    drop(f);
    let s = Server::start_in_with_args(
        &tmp.path().join("data"),
        &["--group-count", "1", "--config", cfg.to_str().unwrap()],
    );
    assert!(
        wait_until(Duration::from_secs(20), || !orphan.exists()
            && !staging.exists()),
        "orphan {} staging {}: {}",
        orphan.exists(),
        staging.exists(),
        s.metrics()
    );
    let (got, _) = s.read_all("/orph/a");
    assert!(got == want);
}

#[test]
fn json_streams_read_back_across_tiers_in_every_view() {
    let tmp = tempfile::tempdir().unwrap();
    let s = start(tmp.path());
    const JSON: &str = "application/json";
    assert_eq!(s.put("/cold/j", JSON, b"").status, 201);
    // 300 messages of about 4 KiB: well past the 512 KiB hot bound, so most are cold.
    let msgs: Vec<String> = (0..300)
        .map(|i| format!("{{\"i\":{i},\"pad\":\"{}\"}}", "x".repeat(4000 + i % 7)))
        .collect();
    for m in &msgs {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let r = s.post("/cold/j", JSON, m.as_bytes());
            if r.status == 204 {
                break;
            }
            assert_error(&r, 503, "COLD_BACKPRESSURE");
            assert!(Instant::now() < deadline, "backpressure never lifted");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    assert!(
        wait_until(Duration::from_secs(20), || metric(&s, "cold_bytes")
            > 512 * 1024),
        "nothing was flushed: {}",
        s.metrics()
    );
    let before = metric(&s, "cold_reads_total");
    let r = s.get("/cold/j");
    assert_eq!(r.status, 200, "{}", r.text());
    let array = format!("[{}]", msgs.join(","));
    assert!(r.body == array.as_bytes(), "the array view differs");
    assert!(
        metric(&s, "cold_reads_total") > before,
        "the read did not reach the cold tier"
    );

    let r = s.req("GET", "/cold/j", &[("Accept", "application/x-ndjson")], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    let ndjson: String = msgs.iter().map(|m| format!("{m}\n")).collect();
    assert!(r.body == ndjson.as_bytes(), "the NDJSON view differs");
    assert_eq!(r.header("content-length"), Some(&*ndjson.len().to_string()));

    // Starting at a message boundary inside the cold tier.
    let at: usize = msgs[..10].iter().map(|m| m.len() + 1).sum();
    let r = s.get(&format!("/cold/j?offset={}", off20(at as u64)));
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.body == format!("[{}]", msgs[10..].join(",")).as_bytes());

    let parts = parse_multipart(&s.get("/cold/j/bootstrap"));
    assert_eq!(parts.len(), 1 + msgs.len());
    for (p, m) in parts[1..].iter().zip(&msgs) {
        assert_eq!(p.content_type, JSON);
        assert!(p.body.strip_suffix(b"\n").unwrap_or(&p.body) == m.as_bytes());
    }
}
