//! Storage faults on the real binary (docs/storage.md): a failed `fdatasync` and a full disk,
//! injected with `strace` attached to the running server; a power-loss-shaped damaged tail;
//! the `repair` command.
//!
//! `strace` is required (`.ci/run` installs it). With `URSULA_SKIP_STRACE=1` the tests that
//! need it are skipped with a message instead.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use common::{Server, assert_error, wait_until};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TEXT: &str = "text/plain";

/// Whether the strace tests can run; panics when strace is missing and skipping was not asked.
fn strace_available(test: &str) -> bool {
    let found = Command::new("strace")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if found {
        return true;
    }
    if std::env::var("URSULA_SKIP_STRACE").is_ok_and(|v| v == "1") {
        eprintln!("SKIPPED {test}: strace is not installed and URSULA_SKIP_STRACE=1");
        return false;
    }
    panic!(
        "{test} needs strace for fault injection (.ci/run installs it); \
         install it, or set URSULA_SKIP_STRACE=1 to skip"
    );
}

/// `strace` attached to every thread of a server, tampering with the syscalls on one file.
struct Strace {
    child: Option<Child>,
    log: PathBuf,
}

impl Strace {
    /// Attaches to `pid` and injects `inject` (an strace `-e inject=` value) into `syscall`
    /// calls on `file`; returns once every thread is attached.
    fn attach(pid: u32, file: &Path, syscall: &str, inject: &str, dir: &Path) -> Strace {
        let log = dir.join(format!("strace-{pid}-{syscall}.log"));
        let child = Command::new("strace")
            .args(["-f", "-p", &pid.to_string(), "-P"])
            .arg(file)
            .args(["-e", &format!("trace={syscall}")])
            .args(["-e", &format!("inject={syscall}:{inject}")])
            .arg("-o")
            .arg(dir.join(format!("strace-{pid}-{syscall}.out")))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("strace log"))
            .spawn()
            .expect("spawn strace");
        let s = Strace {
            child: Some(child),
            log,
        };
        // strace reports "Process N attached with M threads" once every thread is attached
        // (one "attached" line per thread on older versions; the first still comes last).
        let attached = wait_until(Duration::from_secs(10), || {
            std::fs::read_to_string(&s.log).is_ok_and(|t| t.contains("attached"))
        });
        assert!(
            attached,
            "strace did not attach: {}",
            std::fs::read_to_string(&s.log).unwrap_or_default()
        );
        s
    }
}

impl Drop for Strace {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SIGTERM lets strace detach cleanly; a server that already exited ended it.
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(c.id().to_string())
                .status();
            let deadline = Instant::now() + Duration::from_secs(2);
            while c.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The WAL's active segment (a fresh server has exactly one).
fn active_segment(data: &Path) -> PathBuf {
    let mut segs: Vec<PathBuf> = std::fs::read_dir(data.join("wal"))
        .expect("wal dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("wal-0") && n.ends_with(".log"))
        })
        .collect();
    segs.sort();
    segs.pop().expect("a wal segment")
}

/// Offsets and lengths of the whole batches of a version-2 segment (the test's own reading of
/// the documented format: a 24-byte segment header, then batches of a 24-byte header whose
/// first fields are the tag 0xFFFFFFB1 and the records' byte length).
fn batches(data: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut off = 24;
    while off + 24 <= data.len() {
        let tag = u32::from_le_bytes(data[off..off + 4].try_into().unwrap_or_default());
        if tag != 0xFFFF_FFB1 {
            break;
        }
        let len = u32::from_le_bytes(data[off + 4..off + 8].try_into().unwrap_or_default());
        let total = 24 + len as usize;
        out.push((off, total));
        off += total;
    }
    out
}

fn create(s: &Server, path: &str) {
    let r = s.put(path, TEXT, b"");
    assert_eq!(r.status, 201, "create {path}: {}", r.describe());
}

#[test]
fn a_failed_fdatasync_fails_stop_and_loses_nothing_acknowledged() {
    if !strace_available("a_failed_fdatasync_fails_stop_and_loses_nothing_acknowledged") {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let data = tmp.path().join("data");
    let mut s = Server::start_in(&data);
    create(&s, "/faults/sync");
    let wal = active_segment(&data);
    let _strace = Strace::attach(
        s.pid().expect("pid"),
        &wal,
        "fdatasync",
        "error=EIO:when=3+",
        tmp.path(),
    );

    // Appends one at a time: each is acknowledged only after its own sync, so every 2xx
    // before the injected failure must survive.
    let mut acked = String::new();
    let mut unknown = None;
    for i in 0..50 {
        let msg = format!("m{i};");
        let r = s.post("/faults/sync", TEXT, msg.as_bytes());
        if r.status == 204 || r.status == 200 {
            acked.push_str(&msg);
            continue;
        }
        assert_error(&r, 503, "WRITE_OUTCOME_UNKNOWN");
        assert_eq!(r.header("retry-after"), Some("1"));
        assert!(r.text().contains("idempotent producer"), "{}", r.text());
        unknown = Some(msg);
        break;
    }
    let unknown = unknown.expect("the injected sync failure answered a write");
    assert!(!acked.is_empty(), "some writes were acknowledged first");

    // Not ready at once, with the reason; later writes are refused; a metric shows it.
    let ready = s.get("/__ursula/ready");
    assert_eq!(ready.status, 503, "{}", ready.describe());
    assert!(ready.text().contains("storage failed"), "{}", ready.text());
    let health = s.get("/__ursula/health");
    assert_eq!(health.status, 200);
    let r = s.post("/faults/sync", TEXT, b"after");
    assert_error(&r, 503, "STORAGE_UNAVAILABLE");
    assert_eq!(r.header("retry-after"), Some("1"));
    let m = s.metrics();
    assert_eq!(m["storage_failed"], 1, "{m}");
    assert!(m["wal_sync_failures_total"].as_u64() >= Some(1), "{m}");
    assert_eq!(m["ready"], 0, "{m}");

    // Fail-stop: the node exits non-zero, saying why.
    let st = s
        .wait_exit(Duration::from_secs(15))
        .expect("the node exits after a failed sync");
    assert_eq!(st.code(), Some(75), "{st}");
    assert!(
        s.log_tail(40).contains("storage failed"),
        "{}",
        s.log_tail(40)
    );

    // Recovery re-reads the disk: every acknowledged write is there, the unknown one may be.
    let s = Server::start_in(&data);
    let (body, _) = s.read_all("/faults/sync");
    let body = String::from_utf8(body).expect("utf8");
    assert!(
        body == acked || body == format!("{acked}{unknown}"),
        "acked {acked:?}, unknown {unknown:?}, found {body:?}"
    );
    assert_eq!(s.get("/__ursula/ready").status, 200);
    let r = s.post("/faults/sync", TEXT, b"again;");
    assert_eq!(r.status, 204, "{}", r.describe());
}

#[test]
fn a_full_disk_answers_507_keeps_reads_and_heals_without_a_restart() {
    if !strace_available("a_full_disk_answers_507_keeps_reads_and_heals_without_a_restart") {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let data = tmp.path().join("data");
    let s = Server::start_in(&data);
    create(&s, "/faults/full");
    assert_eq!(s.post("/faults/full", TEXT, b"a;").status, 204);
    let wal = active_segment(&data);
    // The 2nd write of the WAL after attaching, and the 20 after it, find the disk full: with
    // the writer's backoff the disk stays "full" for several seconds.
    let _strace = Strace::attach(
        s.pid().expect("pid"),
        &wal,
        "pwrite64",
        "error=ENOSPC:when=2..21",
        tmp.path(),
    );
    assert_eq!(s.post("/faults/full", TEXT, b"b;").status, 204);

    // This write meets the full disk: the WAL holds it (its outcome is not lost) and retries.
    let addr = s.addr();
    let held = std::thread::spawn(move || {
        common::request(
            addr,
            "POST",
            "/faults/full",
            &[("Content-Type", TEXT)],
            b"held;",
        )
    });
    let full = wait_until(Duration::from_secs(10), || {
        let r = s.get("/__ursula/ready");
        r.status == 503 && r.text().contains("disk full")
    });
    assert!(full, "readiness never reported the full disk");
    // Meanwhile: writes answer 507 at once and change nothing; reads keep working.
    let r = s.post("/faults/full", TEXT, b"refused;");
    assert_error(&r, 507, "INSUFFICIENT_STORAGE");
    assert_eq!(r.header("retry-after"), Some("5"));
    assert!(r.text().contains("nothing was written"), "{}", r.text());
    let read = s.get("/faults/full?offset=-1");
    assert_eq!(read.status, 200, "{}", read.describe());
    assert!(read.text().starts_with("a;b;"), "{}", read.text());
    assert!(s.metrics()["disk_full_events_total"].as_u64() >= Some(1));

    // Space comes back (the injection ends): the held write lands, writes resume, ready again.
    let held = held.join().expect("held request");
    assert_eq!(held.status, 204, "{}", held.describe());
    let healed = wait_until(Duration::from_secs(20), || {
        s.get("/__ursula/ready").status == 200
    });
    assert!(healed, "readiness never came back");
    let r = s.post("/faults/full", TEXT, b"c;");
    assert_eq!(r.status, 204, "{}", r.describe());
    let (body, _) = s.read_all("/faults/full");
    assert_eq!(String::from_utf8_lossy(&body), "a;b;held;c;");
}

#[test]
fn a_power_loss_shaped_damaged_tail_starts_and_keeps_every_acknowledged_write() {
    if !strace_available("a_power_loss_shaped_damaged_tail_starts") {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let data = tmp.path().join("data");
    let mut s = Server::start_in(&data);
    create(&s, "/faults/tail");
    assert_eq!(s.post("/faults/tail", TEXT, b"acked;").status, 204);
    let wal = active_segment(&data);
    let before = std::fs::read(&wal).expect("wal");
    let end = batches(&before)
        .last()
        .map(|(o, l)| o + l)
        .expect("whole batches");
    // The next sync stalls: its batch is written (in the page cache) but never acknowledged.
    let strace = Strace::attach(
        s.pid().expect("pid"),
        &wal,
        "fdatasync",
        "delay_enter=60000000:when=1",
        tmp.path(),
    );
    let addr = s.addr();
    let big = vec![b'x'; 20_000];
    let _pending = std::thread::spawn(move || {
        common::try_request(
            addr,
            "POST",
            "/faults/tail",
            &[("Content-Type", TEXT)],
            &big,
            Duration::from_secs(90),
        )
    });
    let file = std::fs::File::open(&wal).expect("open wal");
    let written = wait_until(Duration::from_secs(10), || {
        let mut b = [0u8; 1];
        file.read_exact_at(&mut b, (end + 16_000) as u64).is_ok() && b[0] == b'x'
    });
    assert!(written, "the unacknowledged batch never reached the file");
    // Power loss: the process dies and, of the last batch, a later page reached the disk but
    // the first one (with the batch header) did not.
    // SIGKILL first, so the stalled sync never completes; then detach strace (the exit of a
    // traced process is reported to strace first) and reap.
    let killed = Command::new("kill")
        .arg("-KILL")
        .arg(s.pid().expect("pid").to_string())
        .status()
        .expect("run kill");
    assert!(killed.success());
    drop(strace);
    s.kill9();
    let mut damaged = std::fs::read(&wal).expect("wal");
    damaged[end..end + 4096].fill(0);
    std::fs::write(&wal, &damaged).expect("write damaged wal");

    let t = Instant::now();
    let s = Server::start_in(&data);
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "recovery of a damaged tail took {:?}",
        t.elapsed()
    );
    let (body, _) = s.read_all("/faults/tail");
    assert_eq!(String::from_utf8_lossy(&body), "acked;");
    assert!(s.log_tail(200).contains("torn tail"), "{}", s.log_tail(60));
    assert_eq!(s.post("/faults/tail", TEXT, b"after;").status, 204);
}

/// Runs `ursula` with `args` to completion (bounded) and returns (exit code, stdout+stderr).
fn run_ursula(args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ursula"))
        .args(args)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ursula");
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().ok().flatten().is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("ursula output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

#[test]
fn corruption_of_acknowledged_data_is_refused_loudly_and_repair_cuts_it() {
    let tmp = tempfile::tempdir().expect("tmp");
    let data = tmp.path().join("data");
    let mut s = Server::start_in(&data);
    create(&s, "/faults/repair");
    for i in 1..=6 {
        let r = s.post("/faults/repair", TEXT, format!("msg-{i};").as_bytes());
        assert_eq!(r.status, 204, "{}", r.describe());
    }
    assert!(s.terminate().success());
    let wal = active_segment(&data);
    let good = std::fs::read(&wal).expect("wal");
    let at = good
        .windows(6)
        .position(|w| w == b"msg-4;")
        .expect("the fourth append in the wal");
    let mut bad = good.clone();
    bad[at] ^= 0x20;
    std::fs::write(&wal, &bad).expect("damage");

    let data_arg = data.to_str().expect("utf8 path");
    let (code, out) = run_ursula(&["server", "--listen", "127.0.0.1:0", "--data-dir", data_arg]);
    assert_ne!(code, Some(0), "start-up must refuse: {out}");
    assert!(out.contains("corrupt"), "{out}");

    let (code, out) = run_ursula(&["repair", "--data-dir", data_arg, "--dry-run"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("would drop: corruption"), "{out}");
    assert_eq!(
        std::fs::read(&wal).expect("wal"),
        bad,
        "a dry run changes nothing"
    );

    let (code, out) = run_ursula(&["repair", "--data-dir", data_arg]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("dropped: corruption"), "{out}");
    assert!(out.contains("acknowledged"), "{out}");

    let s = Server::start_in(&data);
    let (body, _) = s.read_all("/faults/repair");
    assert_eq!(String::from_utf8_lossy(&body), "msg-1;msg-2;msg-3;");
    let (code, out) = {
        drop(s);
        run_ursula(&["repair", "--data-dir", data_arg])
    };
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("nothing to repair"), "{out}");
}

/// A small tmpfs mounted for one test (needs root); unmounted on drop.
struct SmallDisk {
    mnt: PathBuf,
    _tmp: tempfile::TempDir,
}

impl SmallDisk {
    /// Mounts a `size_mb` tmpfs, or `None` (with a message) where mounting is not permitted.
    fn mount(size_mb: u32, test: &str) -> Option<SmallDisk> {
        let tmp = tempfile::tempdir().expect("tmp");
        let mnt = tmp.path().join("mnt");
        std::fs::create_dir(&mnt).expect("mountpoint");
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mb}m"), "tmpfs"])
            .arg(&mnt)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("SKIPPED {test}: cannot mount a tmpfs here (needs root)");
            return None;
        }
        Some(SmallDisk { mnt, _tmp: tmp })
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mnt).status();
    }
}

/// Fills the filesystem of `dir` with a file until a write finds it full.
fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).expect("filler");
    let chunk = vec![1u8; 1 << 20];
    for _ in 0..4096 {
        if f.write_all(&chunk).is_err() {
            return path;
        }
    }
    panic!("the filesystem never filled up");
}

#[test]
fn a_really_full_disk_answers_507_starts_for_reads_and_heals_when_space_is_freed() {
    let test = "a_really_full_disk_answers_507_starts_for_reads_and_heals_when_space_is_freed";
    let Some(disk) = SmallDisk::mount(256, test) else {
        return;
    };
    let data = disk.mnt.join("data");
    let mut s = Server::start_in(&data);
    create(&s, "/faults/disk");
    assert_eq!(s.post("/faults/disk", TEXT, b"a;").status, 204);
    let prepared = data.join("wal/wal-next.prepared");
    assert!(
        wait_until(Duration::from_secs(30), || prepared.exists()
            && std::fs::metadata(&prepared).is_ok_and(|m| m.len() == 64 << 20)),
        "the next segment is prepared"
    );
    let filler = fill(&disk.mnt);

    // Within the free-space check's period the node refuses writes and says why.
    let full = wait_until(Duration::from_secs(10), || {
        let r = s.get("/__ursula/ready");
        r.status == 503 && r.text().contains("disk full")
    });
    assert!(full, "readiness never reported the full disk");
    let r = s.post("/faults/disk", TEXT, b"refused;");
    assert_error(&r, 507, "INSUFFICIENT_STORAGE");
    assert_eq!(r.header("retry-after"), Some("5"));
    assert_eq!(s.get("/faults/disk?offset=-1").text(), "a;");
    assert_eq!(s.metrics()["disk_full"], 1);

    // A restart on the full disk works, for reads.
    s.restart();
    assert_eq!(s.get("/faults/disk?offset=-1").text(), "a;");
    let r = s.post("/faults/disk", TEXT, b"refused;");
    assert_error(&r, 507, "INSUFFICIENT_STORAGE");
    assert_eq!(s.get("/__ursula/ready").status, 503);

    // Space is freed: writes resume by themselves.
    std::fs::remove_file(&filler).expect("free space");
    let healed = wait_until(Duration::from_secs(10), || {
        s.get("/__ursula/ready").status == 200
    });
    assert!(healed, "readiness never came back");
    assert_eq!(s.post("/faults/disk", TEXT, b"b;").status, 204);
    let (body, _) = s.read_all("/faults/disk");
    assert_eq!(String::from_utf8_lossy(&body), "a;b;");
    drop(s);
}

/// A write whose batch a full disk holds does not hang its client: after
/// `write_stall_timeout_ms` it answers `503 WRITE_OUTCOME_UNKNOWN`, and it lands once the disk
/// has room again (so the answer was right to say "unknown", not "failed").
#[test]
fn a_write_held_by_a_full_disk_answers_outcome_unknown_in_bounded_time() {
    if !strace_available("a_write_held_by_a_full_disk_answers_outcome_unknown_in_bounded_time") {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let data = tmp.path().join("data");
    let cfg = tmp.path().join("ursula.toml");
    std::fs::write(&cfg, "write_stall_timeout_ms = 500\n").expect("config");
    let s = Server::start_in_with_args(&data, &["--config", cfg.to_str().expect("utf-8")]);
    create(&s, "/faults/stall");
    assert_eq!(s.post("/faults/stall", TEXT, b"a;").status, 204);
    let wal = active_segment(&data);
    // Every WAL write from the 2nd on, 15 in a row, finds the disk full: with the writer's
    // backoff that holds the batch for several seconds.
    let _strace = Strace::attach(
        s.pid().expect("pid"),
        &wal,
        "pwrite64",
        "error=ENOSPC:when=2..16",
        tmp.path(),
    );
    assert_eq!(s.post("/faults/stall", TEXT, b"b;").status, 204);
    let started = Instant::now();
    let r = s.post("/faults/stall", TEXT, b"held;");
    let waited = started.elapsed();
    assert_error(&r, 503, "WRITE_OUTCOME_UNKNOWN");
    assert!(r.text().contains("idempotent producer"), "{}", r.text());
    assert!(waited < Duration::from_secs(5), "answered after {waited:?}");
    // The disk heals: the held write was not lost, it lands.
    let landed = wait_until(Duration::from_secs(30), || {
        s.get("/faults/stall?offset=-1").text() == "a;b;held;"
    });
    assert!(landed, "{}", s.get("/faults/stall?offset=-1").text());
    let r = s.post("/faults/stall", TEXT, b"c;");
    assert_eq!(r.status, 204, "{}", r.describe());
}

#[test]
fn writes_past_the_uncommitted_bound_of_a_stalled_group_answer_503_until_it_commits() {
    if !strace_available("writes_past_the_uncommitted_bound") {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let data = tmp.path().join("data");
    let s = Server::start_in_with_args(&data, &["--max-uncommitted-size-per-group", "1000"]);
    create(&s, "/faults/bound");
    let held = |s: &Server| {
        s.metrics()["raft_uncommitted_bytes"]
            .as_u64()
            .expect("gauge")
    };
    assert_eq!(held(&s), 0);
    // The next sync takes 3 s: an 800-byte append waits for it, counted against the bound.
    let strace = Strace::attach(
        s.pid().expect("pid"),
        &active_segment(&data),
        "fdatasync",
        "delay_enter=3000000:when=1",
        tmp.path(),
    );
    let addr = s.addr();
    let first = std::thread::spawn(move || {
        common::try_request(
            addr,
            "POST",
            "/faults/bound",
            &[("Content-Type", TEXT)],
            &[b'a'; 800],
            Duration::from_secs(30),
        )
    });
    assert!(
        wait_until(Duration::from_secs(10), || held(&s) == 800),
        "the stalled append was never counted"
    );
    // Another 800 bytes would take the group past 1000: refused at once, nothing appended.
    let r = s.post("/faults/bound", TEXT, &[b'b'; 800]);
    assert_error(&r, 503, "RAFT_UNCOMMITTED_BACKPRESSURE");
    assert_eq!(r.header("retry-after"), Some("1"));
    // A small one still fits.
    let small = std::thread::spawn(move || {
        common::try_request(
            addr,
            "POST",
            "/faults/bound",
            &[("Content-Type", TEXT)],
            b"c",
            Duration::from_secs(30),
        )
    });
    let first = first.join().expect("first").expect("answered");
    assert_eq!(first.status, 204, "{}", first.text());
    assert_eq!(small.join().expect("small").expect("answered").status, 204);
    drop(strace);
    assert_eq!(held(&s), 0, "every answered write gave its bytes back");
    assert_eq!(s.post("/faults/bound", TEXT, &[b'd'; 800]).status, 204);
    let (body, _) = s.read_all("/faults/bound");
    assert_eq!(body.len(), 800 + 1 + 800, "the refused write left nothing");
    let m = s.metrics();
    assert_eq!(m["raft_uncommitted_backpressure_total"], 1);
}
