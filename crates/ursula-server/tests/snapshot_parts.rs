//! Multi-part snapshot upload (snapshot-parts.md) and cold snapshot blobs, black-box over
//! HTTP against the real binary: staging, commits and every answer's effect on the parts,
//! discards, staged bounds, commit slots, stream delete and re-create, the orphan sweep, a
//! SIGKILL during a commit, and a failing cold store.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use common::*;
use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

const OCTETS: &str = "application/octet-stream";
const WAIT: Duration = Duration::from_secs(20);

/// The snapshot digest of extensions.md §6.3.
fn digest(ct: &str, blob: &[u8]) -> String {
    let mut h = blake3::Hasher::new();
    h.update(&(ct.len() as u64).to_le_bytes());
    h.update(ct.as_bytes());
    h.update(blob);
    h.finalize().to_hex().to_string()
}

fn stage(s: &Server, p: &str, body: &[u8]) -> Response {
    s.req("POST", &format!("{p}/snapshot/0/parts"), &[], body)
}

fn part_id(s: &Server, p: &str, body: &[u8]) -> String {
    let r = stage(s, p, body);
    assert_eq!(r.status, 201, "{}", r.describe());
    assert!(r.header("stream-incarnation").is_some());
    r.header("stream-snapshot-part").unwrap().to_owned()
}

fn manifest(ids: &[&str]) -> Vec<u8> {
    ids.iter()
        .flat_map(|i| format!("{i}\n").into_bytes())
        .collect()
}

fn commit(
    s: &Server,
    p: &str,
    off: u64,
    ids: &[&str],
    digest: &str,
    extra: &[(&str, &str)],
) -> Response {
    let n = ids.len().to_string();
    let mut hs = vec![
        ("Content-Type", OCTETS),
        ("Stream-Snapshot-Parts", n.as_str()),
        ("Stream-Snapshot-Digest", digest),
    ];
    hs.extend_from_slice(extra);
    s.req("PUT", &format!("{p}/snapshot/{off}"), &hs, &manifest(ids))
}

/// Every file below `dir` (recursively) whose path contains `needle`.
fn files(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let path = e.path();
            if path.is_dir() {
                todo.push(path);
            } else if path.to_string_lossy().contains(needle) {
                out.push(path);
            }
        }
    }
    out
}

/// The error code of an answer, or its status for one without an error body.
fn code_of(r: &Response) -> String {
    check_error_body(r).unwrap_or_else(|_| r.status.to_string())
}

fn parts_on_disk(s: &Server) -> usize {
    files(&s.dir().join("cold"), "snapshot-parts").len()
}

fn config(dir: &Path, body: &str) -> String {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("ursula.toml");
    std::fs::write(&path, body).unwrap();
    path.to_str().unwrap().to_owned()
}

/// Sends a request's head (and `body`) but not the rest of its declared body.
fn stalled(
    s: &Server,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> TcpStream {
    let mut c = TcpStream::connect(s.addr()).unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    c.write_all(head.as_bytes()).unwrap();
    c.write_all(body).unwrap();
    c.flush().unwrap();
    c
}

#[test]
fn without_a_cold_backend_every_part_route_answers_501() {
    let s = Server::start_with_args(&["--cold-backend", "none"]);
    assert_eq!(s.put("/nopart/s", OCTETS, b"abc").status, 201);
    assert_error(
        &stage(&s, "/nopart/s", b"x"),
        501,
        "COLD_STORE_NOT_CONFIGURED",
    );
    assert_error(
        &s.req("POST", "/nopart/s/snapshot/bad/parts", &[], b"x"),
        501,
        "COLD_STORE_NOT_CONFIGURED",
    );
    assert_error(
        &commit(&s, "/nopart/s", 1, &["x"], "bad", &[]),
        501,
        "COLD_STORE_NOT_CONFIGURED",
    );
    assert_error(
        &s.delete("/nopart/s/snapshot/parts"),
        501,
        "COLD_STORE_NOT_CONFIGURED",
    );
    assert_error(
        &s.delete("/nopart/missing/snapshot/parts"),
        501,
        "COLD_STORE_NOT_CONFIGURED",
    );
    // Single-request snapshots stay inline and work.
    assert_eq!(
        s.req("PUT", "/nopart/s/snapshot/3", &[], b"inline").status,
        204
    );
    assert_eq!(s.get("/nopart/s/snapshot/3").body, b"inline");
}

#[test]
fn stage_commit_read_back_and_repeat() {
    let s = Server::start();
    let p = "/mpart/doc";
    assert_eq!(s.put(p, OCTETS, &[7u8; 42]).status, 201);
    let h = s.head(p);
    assert_eq!(h.header("ursula-max-snapshot-bytes"), Some("1073741824"));
    assert_eq!(h.header("ursula-max-request-bytes"), Some("33554432"));
    let a: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let b = b"tail of the snapshot".to_vec();
    let (pa, pb) = (part_id(&s, p, &a), part_id(&s, p, &b));
    assert_ne!(pa, pb);
    assert!(pa.ends_with(".part") && pa.starts_with(&h.incarnation()));
    // Staging changes nothing a reader sees.
    assert_error(&s.get(&format!("{p}/snapshot")), 404, "SNAPSHOT_NOT_FOUND");
    let whole = [a.clone(), b.clone()].concat();
    let d = digest(OCTETS, &whole);
    let inc = h.incarnation();
    let r = commit(&s, p, 42, &[&pa, &pb], &d, &[("Stream-Incarnation", &inc)]);
    assert_eq!(r.status, 204, "{}", r.describe());
    assert_eq!(r.header("stream-snapshot-digest"), Some(d.as_str()));
    assert_eq!(r.header("stream-snapshot-offset"), Some(off20(42).as_str()));
    assert_eq!(r.header("stream-incarnation"), Some(inc.as_str()));
    let got = s.get(&format!("{p}/snapshot/42"));
    assert_eq!(got.status, 200);
    assert!(got.body == whole, "snapshot bytes differ");
    let boot = s.get(&format!("{p}/bootstrap"));
    assert_eq!(boot.status, 200);
    assert!(boot.body.windows(b.len()).any(|w| w == b.as_slice()));
    // The parts are deleted after the answer; a repeat still answers 204 by its key.
    assert!(
        wait_until(WAIT, || parts_on_disk(&s) == 0),
        "spent parts deleted"
    );
    assert_eq!(commit(&s, p, 42, &[&pa, &pb], &d, &[]).status, 204);
    // Another digest at the same offset: 409 naming the latest.
    let r = commit(&s, p, 42, &[&pa], &digest(OCTETS, b"x"), &[]);
    assert_error(&r, 409, "SNAPSHOT_CONFLICT");
    assert_eq!(r.header("stream-snapshot-digest"), Some(d.as_str()));
    // The snapshot lives in the cold tier as objects.
    assert!(!files(&s.dir().join("cold"), ".man").is_empty());
    // Survives a restart (the state references the object).
    let mut s = s;
    s.restart();
    assert!(s.get(&format!("{p}/snapshot/42")).body == whole);
}

#[test]
fn commit_answers_and_what_they_do_to_the_parts() {
    let s = Server::start();
    let p = "/mpart/rules";
    assert_eq!(s.put(p, OCTETS, &[1u8; 10]).status, 201);
    assert_eq!(s.put("/mpart/other", OCTETS, b"o").status, 201);
    let (x, y) = (part_id(&s, p, b"xx"), part_id(&s, p, b"yyy"));
    let other = part_id(&s, "/mpart/other", b"o");
    let good = digest(OCTETS, b"xxyyy");
    // Syntax.
    assert_error(
        &commit(&s, p, 5, &[&x], "nothex", &[]),
        400,
        "INVALID_HEADER",
    );
    let r = s.req(
        "PUT",
        &format!("{p}/snapshot/5"),
        &[
            ("Stream-Snapshot-Parts", "0"),
            ("Stream-Snapshot-Digest", &good),
        ],
        b"",
    );
    assert_error(&r, 400, "INVALID_SNAPSHOT_MANIFEST");
    let r = s.req(
        "PUT",
        &format!("{p}/snapshot/5"),
        &[
            ("Stream-Snapshot-Parts", "4097"),
            ("Stream-Snapshot-Digest", &good),
        ],
        b"",
    );
    assert_error(&r, 400, "INVALID_SNAPSHOT_MANIFEST");
    let r = s.req(
        "PUT",
        &format!("{p}/snapshot/x1"),
        &[
            ("Stream-Snapshot-Parts", "1"),
            ("Stream-Snapshot-Digest", &good),
        ],
        b"",
    );
    assert_error(&r, 400, "INVALID_OFFSET");
    // 400s that copy nothing keep the parts.
    let n2 = [
        ("Stream-Snapshot-Parts", "2"),
        ("Stream-Snapshot-Digest", good.as_str()),
    ];
    let path = format!("{p}/snapshot/5");
    assert_error(
        &s.req("PUT", &path, &n2, format!("{x}\r\n{y}\n").as_bytes()),
        400,
        "INVALID_SNAPSHOT_MANIFEST",
    );
    assert_error(
        &s.req("PUT", &path, &n2, format!("{x}\n{x}\n").as_bytes()),
        400,
        "INVALID_SNAPSHOT_MANIFEST",
    );
    assert_error(
        &s.req("PUT", &path, &n2, format!("{x}\n").as_bytes()),
        400,
        "INVALID_SNAPSHOT_MANIFEST",
    );
    assert_error(
        &s.req("PUT", &path, &n2, &vec![b'a'; 262_145]),
        400,
        "INVALID_SNAPSHOT_MANIFEST",
    );
    assert_error(
        &commit(&s, p, 5, &[&x, &other], &good, &[]),
        400,
        "UNKNOWN_SNAPSHOT_PART",
    );
    let unknown = format!("{}-0000000000000001.part", &x[..32]);
    assert_error(
        &commit(&s, p, 5, &[&x, &unknown], &good, &[]),
        400,
        "UNKNOWN_SNAPSHOT_PART",
    );
    // 412 and 404 are final for the key: checked before the body, and the parts go.
    let r = commit(
        &s,
        p,
        5,
        &[&x, &y],
        &good,
        &[("Stream-Incarnation", "00000000000000000000000000000001")],
    );
    assert_error(&r, 412, "INCARNATION_MISMATCH");
    assert!(r.header("stream-incarnation").is_some());
    assert!(
        wait_until(WAIT, || parts_on_disk(&s) == 1),
        "412 deleted the listed parts: {}",
        parts_on_disk(&s)
    );
    // Stage again: a digest mismatch uses the parts up.
    let (x, y) = (part_id(&s, p, b"xx"), part_id(&s, p, b"yyy"));
    assert_error(
        &commit(&s, p, 5, &[&x, &y], &digest(OCTETS, b"nope"), &[]),
        400,
        "SNAPSHOT_DIGEST_MISMATCH",
    );
    assert!(wait_until(WAIT, || parts_on_disk(&s) == 1));
    assert_error(
        &commit(&s, p, 5, &[&x, &y], &good, &[]),
        400,
        "UNKNOWN_SNAPSHOT_PART",
    );
    assert!(
        files(&s.dir().join("cold"), "/snapshots/").is_empty()
            || wait_until(WAIT, || files(&s.dir().join("cold"), ".p0").is_empty())
    );
    // After a 400 that keeps them, a corrected commit publishes.
    let (x, y) = (part_id(&s, p, b"xx"), part_id(&s, p, b"yyy"));
    assert_error(
        &s.req("PUT", &path, &n2, format!("{x}\n{x}\n").as_bytes()),
        400,
        "INVALID_SNAPSHOT_MANIFEST",
    );
    assert_eq!(commit(&s, p, 5, &[&x, &y], &good, &[]).status, 204);
    // 409 (beyond the tail / older than the latest) and 410 delete the listed parts.
    let z = part_id(&s, p, b"z");
    assert_error(
        &commit(&s, p, 11, &[&z], &digest(OCTETS, b"z"), &[]),
        409,
        "SNAPSHOT_CONFLICT",
    );
    assert!(wait_until(WAIT, || parts_on_disk(&s) == 1));
    assert_error(
        &commit(&s, "/mpart/missing", 0, &[&z], &good, &[]),
        404,
        "STREAM_NOT_FOUND",
    );
    // A JSON stream: an offset inside a message is 400 INVALID_SNAPSHOT.
    assert_eq!(
        s.put("/mpart/json", "application/json", b"[{\"a\":1}]")
            .status,
        201
    );
    let j = part_id(&s, "/mpart/json", b"{}");
    assert_error(
        &commit(&s, "/mpart/json", 2, &[&j], &digest(OCTETS, b"{}"), &[]),
        400,
        "INVALID_SNAPSHOT",
    );
    // Staging rules: empty part, unknown stream, bad offset, bad incarnation.
    assert_error(&stage(&s, p, b""), 400, "INVALID_SNAPSHOT");
    assert_error(&stage(&s, "/mpart/missing", b"x"), 404, "STREAM_NOT_FOUND");
    assert_error(
        &s.req("POST", &format!("{p}/snapshot/x/parts"), &[], b"x"),
        400,
        "INVALID_OFFSET",
    );
    let r = s.req(
        "POST",
        &format!("{p}/snapshot/0/parts"),
        &[("Stream-Incarnation", "00000000000000000000000000000001")],
        b"x",
    );
    assert_error(&r, 412, "INCARNATION_MISMATCH");
    let r = s.req(
        "POST",
        &format!("{p}/snapshot/0/parts"),
        &[("Content-Length", "33554433")],
        b"",
    );
    assert_error(&r, 413, "PAYLOAD_TOO_LARGE");
}

#[test]
fn discard_delete_and_recreate() {
    let s = Server::start();
    let p = "/mpart/discard";
    assert_eq!(s.put(p, OCTETS, b"0123456789").status, 201);
    let inc = s.head(p).incarnation();
    let (a, b) = (part_id(&s, p, b"a"), part_id(&s, p, b"b"));
    assert_error(
        &s.req(
            "DELETE",
            &format!("{p}/snapshot/parts"),
            &[("Stream-Incarnation", "00000000000000000000000000000001")],
            b"",
        ),
        412,
        "INCARNATION_MISMATCH",
    );
    assert_error(
        &s.delete("/mpart/none/snapshot/parts"),
        404,
        "STREAM_NOT_FOUND",
    );
    let r = s.delete(&format!("{p}/snapshot/parts"));
    assert_eq!(r.status, 204, "{}", r.describe());
    assert_eq!(r.header("stream-incarnation"), Some(inc.as_str()));
    assert_eq!(parts_on_disk(&s), 0);
    assert_error(
        &commit(&s, p, 2, &[&a, &b], &digest(OCTETS, b"ab"), &[]),
        400,
        "UNKNOWN_SNAPSHOT_PART",
    );
    // Deleting the stream deletes its parts; a recreated stream cannot use them.
    let c = part_id(&s, p, b"c");
    assert_eq!(s.delete(p).status, 204);
    assert!(
        wait_until(WAIT, || parts_on_disk(&s) == 0),
        "delete removed the parts"
    );
    assert_eq!(s.put(p, OCTETS, b"0123456789").status, 201);
    assert_error(
        &commit(&s, p, 2, &[&c], &digest(OCTETS, b"c"), &[]),
        400,
        "UNKNOWN_SNAPSHOT_PART",
    );
    let d = part_id(&s, p, b"d");
    assert_ne!(&d[..32], &c[..32], "a new incarnation");
}

#[test]
fn staged_bytes_bound_is_charged_before_the_body_and_stalled_uploads_time_out() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), "body_timeout_ms = 8000\n");
    let s = Server::start_with_args(&["--config", &cfg]);
    let p = "/mpart/bound";
    assert_eq!(s.put(p, OCTETS, b"x").status, 201);
    let path = format!("{p}/snapshot/0/parts");
    // 64 uploads of a declared 32 MiB fill the 2 GiB bound before any body byte arrives:
    // of 65, exactly one is answered at once, with 429, while the others wait for bodies.
    let held: Vec<TcpStream> = (0..65)
        .map(|_| {
            let c = stalled(&s, "POST", &path, &[("Content-Length", "33554432")], b"");
            c.set_nonblocking(true).unwrap();
            c
        })
        .collect();
    let mut answers: Vec<String> = vec![String::new(); held.len()];
    assert!(
        wait_until(WAIT, || {
            for (c, got) in held.iter().zip(answers.iter_mut()) {
                let mut buf = [0u8; 2048];
                if let Ok(n) = std::io::Read::read(&mut &*c, &mut buf) {
                    got.push_str(&String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase());
                }
            }
            answers.iter().any(|a| a.contains("\r\n\r\n"))
        }),
        "one upload is refused"
    );
    let refused: Vec<&String> = answers.iter().filter(|a| !a.is_empty()).collect();
    assert_eq!(refused.len(), 1, "{refused:?}");
    let r = refused[0];
    assert!(r.starts_with("http/1.1 429"), "{r}");
    assert!(r.contains("staged_parts_limit"), "{r}");
    assert!(r.contains("ursula-max-staged-bytes: 2147483648"), "{r}");
    assert!(!r.contains("ursula-max-staged-parts"), "{r}");
    assert!(!r.contains("retry-after"), "{r}");
    assert!(r.contains("stream-incarnation: "), "{r}");
    // The stalled uploads time out and free their charge.
    assert!(wait_until(WAIT, || stage(&s, p, b"fits again").status == 201));
    drop(held);
}

#[test]
fn running_commits_refuse_discards_and_a_third_copy() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), "body_timeout_ms = 6000\n");
    let s = Server::start_with_args(&["--config", &cfg]);
    for n in ["c1", "c2", "c3"] {
        assert_eq!(s.put(&format!("/mpart/{n}"), OCTETS, b"0123").status, 201);
    }
    let id = part_id(&s, "/mpart/c1", b"ab");
    let d = digest(OCTETS, b"ab");
    let line = format!("{id}\n");
    let hs = |len: &str| -> Vec<(String, String)> {
        vec![
            ("Stream-Snapshot-Parts".into(), "1".into()),
            ("Stream-Snapshot-Digest".into(), d.clone()),
            ("Content-Length".into(), len.into()),
        ]
    };
    let as_refs = |v: &Vec<(String, String)>| {
        v.iter()
            .map(|(a, b)| (a.clone(), b.clone()))
            .collect::<Vec<_>>()
    };
    let h = as_refs(&hs(&(line.len() + 5).to_string()));
    let hr: Vec<(&str, &str)> = h.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    // Two commits whose manifests stall hold both copy slots.
    let _c1 = stalled(&s, "PUT", "/mpart/c1/snapshot/4", &hr, line.as_bytes());
    let _c2 = stalled(&s, "PUT", "/mpart/c2/snapshot/4", &hr, b"");
    assert!(wait_until(WAIT, || code_of(
        &s.delete("/mpart/c1/snapshot/parts")
    ) == "SNAPSHOT_COMMIT_IN_PROGRESS"));
    let r = s.delete("/mpart/c1/snapshot/parts");
    assert_error(&r, 503, "SNAPSHOT_COMMIT_IN_PROGRESS");
    assert!(r.header("retry-after").is_some());
    assert_error(
        &commit(&s, "/mpart/c1", 4, &[&id], &d, &[]),
        503,
        "SNAPSHOT_COMMIT_IN_PROGRESS",
    );
    assert!(wait_until(WAIT, || code_of(&commit(
        &s,
        "/mpart/c3",
        4,
        &[&id],
        &d,
        &[]
    )) == "SNAPSHOT_COMMITS_BUSY"));
    // Once they time out, the slots and the stream are free again; the part stayed.
    assert!(wait_until(WAIT, || s
        .delete("/mpart/c1/snapshot/parts")
        .status
        == 204));
}

#[test]
fn single_request_snapshots_are_cold_objects_and_superseded_ones_are_deleted() {
    let s = Server::start();
    let p = "/mpart/single";
    assert_eq!(s.put(p, OCTETS, b"0123456789").status, 201);
    assert_eq!(
        s.req("PUT", &format!("{p}/snapshot/4"), &[], b"four")
            .status,
        204
    );
    let cold = s.dir().join("cold");
    assert_eq!(files(&cold, ".snap").len(), 1);
    assert_eq!(s.get(&format!("{p}/snapshot/4")).body, b"four");
    // A fork inherits the cold snapshot and reads it.
    assert_eq!(
        s.req("PUT", "/mpart/fork", &[("Stream-Forked-From", p)], b"")
            .status,
        201
    );
    assert_eq!(s.get("/mpart/fork/snapshot/4").body, b"four");
    // The pin protects the superseded object while the fork lives.
    assert_eq!(
        s.req("PUT", &format!("{p}/snapshot/6"), &[], b"six").status,
        204
    );
    assert_eq!(files(&cold, ".snap").len(), 2);
    assert_eq!(s.get("/mpart/fork/snapshot/4").body, b"four");
    // Without a fork, a superseded object is deleted.
    assert_eq!(s.put("/mpart/solo", OCTETS, b"0123456789").status, 201);
    assert_eq!(
        s.req("PUT", "/mpart/solo/snapshot/1", &[], b"one").status,
        204
    );
    assert_eq!(
        s.req("PUT", "/mpart/solo/snapshot/2", &[], b"two").status,
        204
    );
    assert!(wait_until(WAIT, || files(&cold, ".snap").len() == 3));
    assert_eq!(s.get("/mpart/solo/snapshot/2").body, b"two");
}

#[test]
fn a_failing_store_answers_502_and_recovers() {
    let s = Server::start();
    let p = "/mpart/fail";
    assert_eq!(s.put(p, OCTETS, b"0123456789").status, 201);
    assert_eq!(
        s.req("PUT", &format!("{p}/snapshot/3"), &[], b"three")
            .status,
        204
    );
    let cold = s.dir().join("cold");
    let away = s.dir().join("cold-away");
    std::fs::rename(&cold, &away).unwrap();
    std::fs::write(&cold, b"not a directory").unwrap();
    let r = s.get(&format!("{p}/snapshot/3"));
    assert_error(&r, 502, "COLD_STORE_FAILED");
    assert_error(&s.get(&format!("{p}/bootstrap")), 502, "COLD_STORE_FAILED");
    assert_error(&stage(&s, p, b"x"), 502, "COLD_STORE_FAILED");
    assert_error(
        &s.delete(&format!("{p}/snapshot/parts")),
        502,
        "COLD_STORE_FAILED",
    );
    // Hot writes go on.
    assert_eq!(s.post(p, OCTETS, b"more").status, 204);
    std::fs::remove_file(&cold).unwrap();
    std::fs::rename(&away, &cold).unwrap();
    assert_eq!(s.get(&format!("{p}/snapshot/3")).body, b"three");
    assert_eq!(stage(&s, p, b"x").status, 201);
}

#[test]
fn sigkill_during_a_commit_loses_nothing_and_the_sweep_reclaims_what_it_left() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let cfg = config(
        tmp.path(),
        "[storage.cold]\nsnapshot_part_grace = \"3s\"\nsnapshot_part_sweep_interval = \"300ms\"\n",
    );
    let mut s = Server::start_in_with_args(&dir, &["--config", &cfg]);
    let p = "/mpart/kill";
    assert_eq!(s.put(p, OCTETS, &[5u8; 100]).status, 201);
    assert_eq!(
        s.req("PUT", &format!("{p}/snapshot/10"), &[], b"acknowledged")
            .status,
        204
    );
    let big: Vec<u8> = (0..4_000_000u32).map(|i| (i % 253) as u8).collect();
    let ids: Vec<String> = (0..6).map(|_| part_id(&s, p, &big)).collect();
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let whole: Vec<u8> = std::iter::repeat_n(big.as_slice(), 6)
        .flatten()
        .copied()
        .collect();
    let d = digest(OCTETS, &whole);
    let n = ids.len().to_string();
    let body = manifest(&refs);
    let len = body.len().to_string();
    let hs = [
        ("Stream-Snapshot-Parts", n.as_str()),
        ("Stream-Snapshot-Digest", d.as_str()),
        ("Content-Length", len.as_str()),
    ];
    let _c = stalled(&s, "PUT", &format!("{p}/snapshot/50"), &hs, &body);
    // Kill while the copy writes its pieces (or just before / after).
    wait_until(Duration::from_secs(5), || {
        !files(&dir.join("cold"), ".p0").is_empty()
    });
    s.kill9();
    s.restart();
    // Nothing acknowledged is lost: the stream and its published snapshot.
    assert_eq!(s.read_all(p).0, vec![5u8; 100]);
    let snap = s
        .get(&format!("{p}/snapshot"))
        .header("stream-snapshot-offset")
        .map(str::to_owned);
    assert!(
        snap == Some(off20(10)) || snap == Some(off20(50)),
        "{snap:?}"
    );
    // The sweep reclaims every part and every unreferenced snapshot object. (A `#n` file is
    // the local backend's own staging file of an upload the kill interrupted: object_store
    // never lists it, so no sweep over the ColdStore sees it; see docs/storage.md.)
    let objects = |needle: &str| {
        files(&dir.join("cold"), needle)
            .into_iter()
            .filter(|f| !f.to_string_lossy().contains('#'))
            .count()
    };
    let want = if snap == Some(off20(10)) { 1 } else { 7 };
    assert!(
        wait_until(Duration::from_secs(30), || {
            objects("snapshot-parts") == 0 && objects("/snapshots/") == want
        }),
        "left: {:?}",
        files(&dir.join("cold"), "snapshot")
    );
    let r = s.get(&snap.map_or("x".into(), |o| format!("{p}/snapshot/{o}")));
    assert_eq!(r.status, 200);
}

#[test]
fn soft_deleted_streams_answer_410_and_match_is_checked_before_the_copy() {
    let s = Server::start();
    let p = "/mpart/src";
    assert_eq!(s.put(p, OCTETS, b"0123456789").status, 201);
    let a = part_id(&s, p, b"a");
    // Stream-Snapshot-Match that names nothing: 409, decided before the copy; parts deleted.
    let m = digest(OCTETS, b"none");
    let r = commit(
        &s,
        p,
        4,
        &[&a],
        &digest(OCTETS, b"a"),
        &[("Stream-Snapshot-Match", &m)],
    );
    assert_error(&r, 409, "SNAPSHOT_CONFLICT");
    assert!(wait_until(WAIT, || parts_on_disk(&s) == 0));
    // A fork keeps its deleted source soft-deleted: every part route answers 410 there.
    let b = part_id(&s, p, b"b");
    assert_eq!(
        s.req("PUT", "/mpart/fork", &[("Stream-Forked-From", p)], b"")
            .status,
        201
    );
    assert_eq!(s.delete(p).status, 204);
    assert_error(&stage(&s, p, b"x"), 410, "STREAM_SOFT_DELETED");
    assert_error(
        &commit(&s, p, 4, &[&b], &digest(OCTETS, b"b"), &[]),
        410,
        "STREAM_SOFT_DELETED",
    );
    assert_error(
        &s.delete(&format!("{p}/snapshot/parts")),
        410,
        "STREAM_SOFT_DELETED",
    );
    // The soft delete deleted the source's parts too; the fork has its own.
    assert!(wait_until(WAIT, || parts_on_disk(&s) == 0));
    let f = part_id(&s, "/mpart/fork", b"fork part");
    let r = commit(
        &s,
        "/mpart/fork",
        10,
        &[&f],
        &digest(OCTETS, b"fork part"),
        &[],
    );
    assert_eq!(r.status, 204, "{}", r.describe());
    assert_eq!(s.get("/mpart/fork/snapshot/10").body, b"fork part");
}
