//! What `/__ursula/metrics` tells an operator (cluster.md §9.1): request latency by
//! operation and group, answers by status, the cold store, resident memory and its cap; and
//! the log filter an operator sets.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod common;

use common::{Server, wait_until};
use serde_json::Value;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::Duration;

fn count(m: &Value, op: &str) -> u64 {
    m["request_latency"][op]["count"]
        .as_u64()
        .unwrap_or_else(|| panic!("request_latency.{op}.count in {m}"))
}

fn answers(m: &Value, status: &str) -> u64 {
    m["http_responses"][status].as_u64().unwrap_or(0)
}

#[test]
fn requests_are_timed_by_operation_and_answers_counted_by_status() {
    let s = Server::start();
    let before = s.metrics();
    assert_eq!(s.put("/mtrc/one", "text/plain", b"").status, 201);
    for _ in 0..3 {
        assert_eq!(s.post("/mtrc/one", "text/plain", b"abc").status, 204);
    }
    assert_eq!(s.get("/mtrc/one?offset=-1").status, 200);
    assert_eq!(s.head("/mtrc/one").status, 200);
    assert_eq!(s.get("/mtrc/missing").status, 404);
    // A live read waits by design: answered, but not timed.
    let tail = "offset=9";
    let r = s.get(&format!("/mtrc/one?{tail}&live=long-poll&timeout_ms=50"));
    assert_eq!(r.status, 204);
    let m = s.metrics();

    let delta = |f: &dyn Fn(&Value) -> u64| f(&m) - f(&before);
    assert_eq!(delta(&|v| count(v, "append")), 3);
    assert_eq!(delta(&|v| count(v, "mutation")), 1);
    assert_eq!(delta(&|v| count(v, "read")), 3, "GET, HEAD and the 404");
    assert_eq!(delta(&|v| answers(v, "201")), 1);
    assert_eq!(
        delta(&|v| answers(v, "204")),
        4,
        "3 appends and the long-poll"
    );
    assert_eq!(delta(&|v| answers(v, "404")), 1);

    // Every append took some time, less than the longest bound; buckets are cumulative.
    let append = &m["request_latency"]["append"];
    assert!(append["sum_us"].as_u64().unwrap() > 0, "{append}");
    assert_eq!(append["le_us"]["+Inf"], 3);
    assert_eq!(append["le_us"]["10000000"], 3);
    assert!(append["p99_le_us"].as_u64().is_some(), "{append}");
    // The single node's one group timed them.
    let groups = m["request_latency_by_group"].as_array().unwrap();
    assert_eq!(groups.len(), 1, "{groups:?}");
    assert_eq!(groups[0]["group"], 0);
    assert_eq!(groups[0]["append"]["count"], 3);

    // The default cold store: the local directory in the data dir.
    let cold = &m["cold_store"];
    assert_eq!(cold["backend"], "local", "{cold}");
    assert!(cold["path"].as_str().unwrap().ends_with("cold"), "{cold}");
    assert!(
        cold["bucket"].is_null() && cold["encryption"].is_null(),
        "{cold}"
    );
    assert!(m["process_rss_bytes"].as_u64().unwrap() > 1 << 20);
    // The 9 bytes are hot (no flush of 1 MiB yet), in the node's one group.
    assert_eq!(m["hot_bytes_by_group"][0]["hot_bytes"], 9);
    assert_eq!(m["hot_bytes"], 9);
    assert_eq!(m["node_memory_abort_cap_bytes"], 0, "no cap by default");

    let text = s.get("/__ursula/metrics/prometheus").text();
    for line in [
        "# TYPE ursula_request_duration_seconds histogram",
        "ursula_request_duration_seconds_count{op=\"append\"} 3",
        "ursula_request_duration_seconds_bucket{op=\"append\",le=\"+Inf\"} 3",
        "ursula_http_responses_total{status=\"201\"} 1",
        "# TYPE ursula_process_rss_bytes gauge",
        "ursula_group_hot_bytes{group=\"0\"} 9",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
}

#[test]
fn sse_responses_and_their_data_events_are_counted() {
    let s = Server::start();
    assert_eq!(s.put("/mtrc/live", "text/plain", b"first").status, 201);
    let before = s.metrics();
    // An SSE read of a closed stream: one data event, then the response ends.
    let r = s.req(
        "POST",
        "/mtrc/live",
        &[("Content-Type", "text/plain"), ("Stream-Closed", "true")],
        b"",
    );
    assert_eq!(r.status, 204, "close: {}", r.text());
    let r = s.get("/mtrc/live?offset=-1&live=sse");
    assert_eq!(r.status, 200);
    assert!(r.text().contains("event: data"), "{}", r.text());
    let m = s.metrics();
    let d = |k: &str| m[k].as_u64().unwrap() - before[k].as_u64().unwrap();
    assert_eq!(d("sse_responses_total"), 1);
    assert_eq!(d("sse_data_events_total"), 1);
    assert_eq!(m["sse_connections"], 0, "the response ended");
}

#[test]
fn the_memory_cap_is_reported() {
    let s = Server::start_with_args(&["--node-memory-abort-cap-size", "64GiB"]);
    let m = s.metrics();
    assert_eq!(m["node_memory_abort_cap_bytes"], 64u64 << 30);
    assert!(m["process_rss_bytes"].as_u64().unwrap() < 64 << 30);
}

#[test]
fn a_node_above_its_memory_cap_aborts_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ursula"))
        .args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .env("URSULA_NODE_MEMORY_ABORT_CAP_SIZE", "1MiB")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut status = None;
    wait_until(Duration::from_secs(20), || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    let Some(status) = status else {
        let _ = child.kill();
        panic!("a node far above its 1 MiB cap was still running after 20 s");
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.signal(), Some(6), "SIGABRT: {status:?}\n{stderr}");
    assert!(
        stderr.contains("node_memory_abort_cap_size"),
        "the reason is logged:\n{stderr}"
    );
}

/// Starts a node with `env`, waits until it serves, stops it, and returns what it logged.
fn logged_with(env: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ursula"));
    cmd.args([
        "server",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--data-dir",
    ])
    .arg(dir.path().join("data"))
    .env_remove("URSULA_LOG")
    .env_remove("RUST_LOG")
    .env("NO_COLOR", "1")
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let up = wait_until(Duration::from_secs(20), || {
        common::try_request(
            addr,
            "GET",
            "/__ursula/health",
            &[],
            b"",
            Duration::from_secs(2),
        )
        .is_ok_and(|r| r.status == 200)
    });
    let _ = child.kill();
    let _ = child.wait();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(up, "the node served:\n{stderr}");
    stderr
}

#[test]
fn the_log_filter_is_ursula_log_then_rust_log_then_info() {
    assert!(logged_with(&[]).contains(" INFO "));
    let quiet = logged_with(&[("RUST_LOG", "error")]);
    assert!(
        !quiet.contains(" INFO "),
        "RUST_LOG=error still logged info:\n{quiet}"
    );
    let wins = logged_with(&[("RUST_LOG", "error"), ("URSULA_LOG", "info")]);
    assert!(wins.contains(" INFO "), "URSULA_LOG did not win:\n{wins}");
}
