//! A data dir written by the release before versioned payloads (commit 2914ec9, fixture made by
//! `scripts/make-datadir-fixture.sh`) starts under this binary with every stream, producer,
//! published snapshot and retention point intact; new writes on top of it survive a restart.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use common::{Response, Server, assert_error, off20};
use std::path::{Path, PathBuf};

/// Streams of the fixture and the offset their bytes are compared from (the first retained).
const STREAMS: &[(&str, u64)] = &[
    ("bytes", 0),
    ("json", 16),
    ("closed", 0),
    ("ttl", 0),
    ("many", 0),
    ("prod", 0),
    ("fork", 16),
];

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/datadir-v1")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// The headers of a HEAD that the fixture recorded, in its `name: value` lines, sorted.
fn kept_headers(r: &Response, names: &[String]) -> String {
    let mut lines: Vec<String> = names
        .iter()
        .filter_map(|n| r.header(n).map(|v| format!("{n}: {}", v.to_lowercase())))
        .collect();
    lines.sort();
    lines.iter().map(|l| format!("{l}\n")).collect()
}

#[track_caller]
fn assert_status(r: &Response, status: u16) {
    assert_eq!(r.status, status, "unexpected answer: {}", r.describe());
}

fn producer_post(s: &Server, seq: u64, body: &[u8]) -> Response {
    let q = seq.to_string();
    s.req(
        "POST",
        "/fixture/prod",
        &[
            ("Content-Type", "text/plain"),
            ("Producer-Id", "writer-1"),
            ("Producer-Epoch", "0"),
            ("Producer-Seq", &q),
        ],
        body,
    )
}

/// Every stream answers what the old binary answered, byte for byte and header for header.
fn assert_fixture_intact(s: &Server, expected: &Path) {
    for (name, from) in STREAMS {
        let want = std::fs::read_to_string(expected.join(format!("{name}.headers"))).unwrap();
        let names: Vec<String> = want
            .lines()
            .filter_map(|l| l.split_once(':').map(|(n, _)| n.to_owned()))
            .collect();
        let head = s.head(&format!("/fixture/{name}"));
        assert_status(&head, 200);
        assert_eq!(kept_headers(&head, &names), want, "HEAD /fixture/{name}");
        let body = std::fs::read(expected.join(format!("{name}.body"))).unwrap();
        let r = s.get(&format!("/fixture/{name}?offset={}", off20(*from)));
        assert_status(&r, 200);
        assert!(
            r.body == body,
            "GET /fixture/{name}: {:?}",
            String::from_utf8_lossy(&r.body)
        );
    }
}

#[test]
fn v1_data_dir_starts_with_everything_intact() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    copy_dir(&fixture().join("data"), &dir);
    let expected = fixture().join("expected");
    // Snapshots every 100 entries, so the new binary writes group snapshots of its own.
    let mut s = Server::start_in_with_args(&dir, &["--snapshot-logs", "100"]);

    tracing_phase("--- streams, headers and bytes as the old binary answered them");
    assert_fixture_intact(&s, &expected);

    tracing_phase("--- published snapshot and retention");
    let snap = s.get(&format!("/fixture/json/snapshot/{}", off20(24)));
    assert_status(&snap, 200);
    assert!(snap.body == std::fs::read(expected.join("json.snapshot")).unwrap());
    assert_error(
        &s.get(&format!("/fixture/json?offset={}", off20(0))),
        410,
        "STREAM_GONE",
    );
    let boot = s.get("/fixture/json/bootstrap");
    assert_status(&boot, 200);
    let text = String::from_utf8_lossy(&boot.body);
    assert!(text.contains("snapshot-blob-at-24"), "{text}");
    assert!(text.contains(r#"{"n":4}"#), "{text}");

    tracing_phase("--- producer state: the last request is a duplicate, the next is new");
    let dup = producer_post(&s, 2, b"retry");
    assert_status(&dup, 204);
    assert_eq!(dup.next_offset(), 9);
    assert_error(&producer_post(&s, 4, b"gap"), 409, "PRODUCER_SEQ_CONFLICT");
    assert_status(&producer_post(&s, 3, b"p3;"), 200);

    tracing_phase("--- closed, expired, bucket, compatibility layout");
    assert_error(
        &s.post("/fixture/closed", "text/plain", b"more"),
        409,
        "STREAM_CLOSED",
    );
    assert_error(&s.get("/fixture/expired"), 404, "STREAM_NOT_FOUND");
    let bucket = s.get("/fixture");
    assert_status(&bucket, 200);
    assert_eq!(bucket.json()["bucket_id"], "fixture");
    let compat = s.get("/v1/stream/compat/abc?offset=-1");
    assert_status(&compat, 200);
    assert_eq!(compat.body, br#"[{"c":1}]"#);

    tracing_phase("--- new writes in the current format beside the old ones, across a restart");
    assert_status(
        &s.post("/fixture/bytes", "application/octet-stream", b"+new"),
        204,
    );
    assert_status(&s.put("/fixture/fresh", "text/plain", b"fresh"), 201);
    let snaps = dir.join("snapshots");
    let before = snapshot_files(&snaps);
    for i in 0..150 {
        let body = format!("n{i};");
        assert_status(&s.post("/fixture/many", "text/plain", body.as_bytes()), 204);
    }
    assert!(
        common::wait_until(std::time::Duration::from_secs(20), || {
            snapshot_files(&snaps) != before
        }),
        "the new binary wrote a group snapshot"
    );
    s.kill9();
    s.restart();
    let (bytes, _) = s.read_all("/fixture/bytes");
    assert_eq!(bytes, b"hello byte stream+new");
    assert_eq!(s.read_all("/fixture/fresh").0, b"fresh");
    assert_eq!(s.read_all("/fixture/prod").0, b"p0;p1;p2;p3;");
    assert_status(&producer_post(&s, 3, b"retry"), 204);
    let snap = s.get(&format!("/fixture/json/snapshot/{}", off20(24)));
    assert_status(&snap, 200);
    let many = s.read_all("/fixture/many").0;
    assert!(many.starts_with(b"m1;m2;"));
    assert!(many.ends_with(b"n149;"));
}

/// Name and contents of every snapshot file.
fn snapshot_files(dir: &Path) -> Vec<(std::ffi::OsString, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| (e.file_name(), std::fs::read(e.path()).unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

fn tracing_phase(msg: &str) {
    eprintln!("{msg}");
}
