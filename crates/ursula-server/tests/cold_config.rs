//! The cold-store configuration of the real binary: the default `local` backend in
//! `{data_dir}/cold`, the flag, the environment variable and the TOML key, and start-up
//! failures with a clear message for invalid combinations.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use common::{Server, wait_until};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `ursula server` with `args` and `env`, expecting it to exit before listening; returns
/// its exit status and stderr.
fn failed_start(args: &[&str], env: &[(&str, &str)]) -> (std::process::ExitStatus, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ursula"));
    cmd.arg("server")
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .args(args)
        .env("NO_COLOR", "1")
        .env_remove("URSULA_CONFIG")
        .env_remove("URSULA_COLD_BACKEND")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("server started although it should not have");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    (status, err)
}

#[test]
fn default_node_keeps_its_cold_tier_in_the_data_dir() {
    let s = Server::start();
    assert!(s.dir().join("cold").is_dir(), "{{data_dir}}/cold");
    assert!(
        wait_until(Duration::from_secs(5), || s
            .log_tail(50)
            .contains("cold store ready")),
        "{}",
        s.log_tail(50)
    );
    assert!(s.log_tail(50).contains("local"), "{}", s.log_tail(50));
    // The node serves as before.
    assert_eq!(s.put("/cold-test/s1", "text/plain", b"x").status, 201);
}

#[test]
fn flag_env_and_toml_choose_the_backend() {
    let s = Server::start_with_args(&["--cold-backend", "off"]);
    assert!(!s.dir().join("cold").exists(), "none creates nothing");
    assert!(
        s.log_tail(50).contains("no cold store"),
        "{}",
        s.log_tail(50)
    );

    let s = Server::start_with_args(&["--cold-backend", "inmem"]);
    assert!(!s.dir().join("cold").exists());
    assert!(s.log_tail(50).contains("cold store ready"));

    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("objects");
    let s = Server::start_with_args(&["--cold-local-path", path.to_str().unwrap()]);
    assert!(path.is_dir(), "--cold-local-path");
    drop(s);

    let cfg = tmp.path().join("ursula.toml");
    std::fs::write(&cfg, "[storage.cold]\nbackend = \"bogus\"\n").unwrap();
    let (st, err) = failed_start(&["--config", cfg.to_str().unwrap()], &[]);
    assert!(!st.success());
    assert!(err.contains("unknown cold backend"), "{err}");

    // The flag wins over the file.
    std::fs::write(&cfg, "[storage.cold]\nbackend = \"memory\"\n").unwrap();
    let s = Server::start_with_args(&["--config", cfg.to_str().unwrap()]);
    assert!(s.log_tail(50).contains("cold store ready"));
    assert!(s.log_tail(50).contains("memory"), "{}", s.log_tail(50));
    let s = Server::start_with_args(&["--config", cfg.to_str().unwrap(), "--cold-backend", "none"]);
    assert!(s.log_tail(50).contains("no cold store"));

    let (st, err) = failed_start(&[], &[("URSULA_COLD_BACKEND", "tape")]);
    assert!(!st.success());
    assert!(err.contains("tape"), "{err}");
}

#[test]
fn invalid_combinations_fail_start_up_clearly() {
    let (st, err) = failed_start(&["--cold-backend", "s3"], &[]);
    assert!(!st.success());
    assert!(err.contains("storage.cold.s3.bucket"), "{err}");

    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("ursula.toml");
    std::fs::write(
        &cfg,
        "[storage.cold]\nbackend = \"s3\"\n[storage.cold.s3]\nbucket = \"b\"\naccess_key_id = \"only-the-id\"\n",
    )
    .unwrap();
    let (st, err) = failed_start(&["--config", cfg.to_str().unwrap()], &[]);
    assert!(!st.success());
    assert!(err.contains("secret_access_key"), "{err}");

    let (st, err) = failed_start(&["--cold-root", "a/../b"], &[]);
    assert!(!st.success());
    assert!(err.contains("storage.cold.root"), "{err}");

    // Compaction is a spec key this release does not implement: refused, not ignored.
    std::fs::write(&cfg, "[storage.cold]\ncompaction_enabled = true\n").unwrap();
    let (st, err) = failed_start(&["--config", cfg.to_str().unwrap()], &[]);
    assert!(!st.success());
    assert!(err.contains("compaction_enabled"), "{err}");
    std::fs::write(&cfg, "[storage.cold]\nflush_max_concurrency = 0\n").unwrap();
    let (st, err) = failed_start(&["--config", cfg.to_str().unwrap()], &[]);
    assert!(!st.success());
    assert!(err.contains("flush_max_concurrency"), "{err}");
}

/// Every `[storage.cold]` key of cluster.md §7.5 is accepted with its documented form.
#[test]
fn every_spec_key_of_the_cold_section_is_accepted() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("ursula.toml");
    std::fs::write(
        &cfg,
        "[storage.cold]\nbackend = \"local\"\nflush_interval = \"1s\"\nflush_size = \"8MiB\"\n\
         flush_min_hot_size = \"8MiB\"\nflush_max_size = \"8MiB\"\n\
         flush_pressure_hot_size = \"128MiB\"\nflush_max_concurrency = 4\n\
         max_hot_size_per_group = \"64MiB\"\ngc_interval = \"5s\"\ngc_max_entries = 256\n\
         compaction_enabled = false\ncompaction_interval = \"30s\"\n\
         compaction_target_size = \"8MiB\"\ncompaction_max_size = \"16MiB\"\n\
         compaction_max_streams_per_pass = 16\ncompaction_gc_grace = \"300s\"\n\
         snapshot_part_grace = \"1d\"\nsnapshot_part_sweep_interval = \"1h\"\n\
         [storage.cold.cache]\nmax_size = \"256MiB\"\nblock_size = \"1MiB\"\nreadahead_blocks = 4\n",
    )
    .unwrap();
    let s = Server::start_in_with_args(
        &tmp.path().join("data"),
        &["--config", cfg.to_str().unwrap()],
    );
    let r = s.put("/keys/s", "text/plain", b"x");
    assert_eq!(r.status, 201, "{}", r.text());
}

/// A node with no settings moves a group's bytes to its `local` cold tier once the group holds
/// 1 MiB (not `flush_size`'s 8 MiB; docs/configuration.md), and reads them back exact, also
/// after a restart.
#[test]
fn a_default_node_flushes_from_one_mib() {
    let mut s = Server::start();
    let path = "/one-mib/s";
    assert_eq!(s.put(path, "application/octet-stream", b"").status, 201);
    // 1.5 MiB in 24 appends of 64 KiB, each with its own bytes.
    let mut want = Vec::new();
    for i in 0..24u32 {
        let chunk: Vec<u8> = (0..64 * 1024u32)
            .map(|j| (j.wrapping_mul(31) ^ i) as u8)
            .collect();
        assert_eq!(s.post(path, "application/octet-stream", &chunk).status, 204);
        want.extend_from_slice(&chunk);
    }
    let metric = |s: &Server, n: &str| s.metrics()[n].as_u64().unwrap_or(0);
    assert!(
        wait_until(Duration::from_secs(20), || metric(&s, "cold_bytes")
            >= 1 << 20),
        "a default node did not flush 1.5 MiB: {}",
        s.metrics()
    );
    assert!(metric(&s, "hot_bytes") < 1 << 20, "{}", s.metrics());
    let (got, _) = s.read_all(path);
    assert!(got == want, "bytes differ after the flush");
    s.restart();
    let (got, _) = s.read_all(path);
    assert!(got == want, "bytes differ after a restart");
}

/// Groups below the flush threshold still flush when the hot bytes of all led groups pass
/// `flush_pressure_hot_size`, so many small groups cannot hold unbounded memory together.
#[test]
fn hot_pressure_flushes_undersized_groups() {
    let s = Server::start_with_config(
        "[storage.cold]\nflush_size = \"4MiB\"\nflush_pressure_hot_size = \"256KiB\"\n\
         flush_interval = \"50ms\"\n",
        &["--group-count", "4"],
    );
    let chunk = vec![7u8; 32 * 1024];
    for i in 0..16 {
        let path = format!("/press/s{i}");
        assert_eq!(s.put(&path, "application/octet-stream", b"").status, 201);
        assert_eq!(
            s.post(&path, "application/octet-stream", &chunk).status,
            204
        );
    }
    let metric = |n: &str| s.metrics()[n].as_u64().unwrap_or(0);
    assert!(
        wait_until(Duration::from_secs(20), || metric("hot_bytes")
            <= 256 * 1024),
        "pressure did not flush: {}",
        s.metrics()
    );
    assert!(metric("cold_bytes") >= 256 * 1024, "{}", s.metrics());
    let (got, _) = s.read_all("/press/s3");
    assert!(got == chunk);
}

#[test]
fn an_unreachable_s3_store_does_not_keep_the_node_down() {
    // Nothing listens on port 9 of loopback: the probe fails, the node serves anyway. Static
    // credentials, so the client never looks for instance credentials off the machine.
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("ursula.toml");
    std::fs::write(
        &cfg,
        "[storage.cold.s3]\naccess_key_id = \"k\"\nsecret_access_key = \"s\"\nmax_retries = 0\n",
    )
    .unwrap();
    let s = Server::start_with_args(&[
        "--config",
        cfg.to_str().unwrap(),
        "--cold-backend",
        "s3",
        "--cold-s3-bucket",
        "b",
        "--cold-s3-endpoint",
        "http://127.0.0.1:9",
    ]);
    assert!(
        wait_until(Duration::from_secs(10), || s
            .log_tail(50)
            .contains("cold store unreachable")),
        "{}",
        s.log_tail(50)
    );
    assert_eq!(s.put("/cold-test/s1", "text/plain", b"x").status, 201);
}

/// A flush takes the streams whose hot runs reach `flush_min_run` once they hold
/// `flush_min_hot_size` together; smaller tails stay hot until the group holds
/// `flush_any_hot_size`, then go too until it holds less (docs/configuration.md).
#[test]
fn small_tails_stay_hot_until_the_group_holds_flush_any_hot_size() {
    let s = Server::start_with_config(
        "[storage.cold]\nflush_size = \"256KiB\"\nflush_min_run = \"16KiB\"\n\
         flush_any_hot_size = \"512KiB\"\nflush_interval = \"50ms\"\n",
        &["--group-count", "1"],
    );
    let metric = |n: &str| s.metrics()[n].as_u64().unwrap_or(0);
    let tail = |i: u32| vec![i as u8; 4 * 1024];
    let fill = |range: std::ops::Range<u32>| {
        for i in range {
            let path = format!("/tails/s{i}");
            assert_eq!(s.put(&path, "application/octet-stream", b"").status, 201);
            let r = s.post(&path, "application/octet-stream", &tail(i));
            assert_eq!(r.status, 204);
        }
    };
    // 256 KiB of 4 KiB tails: the flush threshold in bytes, but not in runs worth a flush.
    fill(0..64);
    // One stream of 256 KiB (one object) is: it goes, the tails stay.
    let big = vec![9u8; 256 * 1024];
    assert_eq!(
        s.put("/tails/big", "application/octet-stream", b"").status,
        201
    );
    assert_eq!(
        s.post("/tails/big", "application/octet-stream", &big)
            .status,
        204
    );
    // Waits until `cold` bytes were flushed, then expects `hot` bytes left in memory.
    let settles = |cold: u64, hot: u64, what: &str| {
        assert!(
            wait_until(Duration::from_secs(20), || metric("cold_bytes") >= cold),
            "{what}: {}",
            s.metrics()
        );
        assert_eq!(metric("hot_bytes"), hot, "{what}: {}", s.metrics());
    };
    settles(
        256 * 1024,
        256 * 1024,
        "the large stream goes, the tails stay",
    );
    // Another 256 KiB of tails takes the group to `flush_any_hot_size`: tails go, one object
    // at a time, until the group holds less.
    fill(64..128);
    settles(512 * 1024, 256 * 1024, "tails flush at flush_any_hot_size");
    for i in [0, 63, 127] {
        let (got, _) = s.read_all(&format!("/tails/s{i}"));
        assert!(got == tail(i), "tail {i} differs after its flush");
    }
}
