//! Multi-part snapshot upload (snapshot-parts.md) and cold snapshot blobs, black-box over
//! HTTP against the real binary: staging, commits and every answer's effect on the parts,
//! discards, stream delete and re-create, soft deletes, forks. Bounds, commit slots, faults
//! and the sweep are in `snapshot_parts_faults.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;
#[path = "snapshot_parts/helpers.rs"]
mod helpers;

use common::*;
use helpers::*;

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
    // The first part ends inside a `--bootstrap-` marker that the second completes.
    let mut a = a;
    a.extend_from_slice(b"\r\n--bootstr");
    let b = b"ap-0123 tail of the snapshot".to_vec();
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
    // The snapshot part is the whole blob, streamed, and the boundary is not in it.
    let ct = boot.header("content-type").unwrap().to_owned();
    let boundary = ct.split("boundary=").nth(1).unwrap();
    let head = format!("--{boundary}\r\nContent-Type: {OCTETS}\r\n\r\n");
    assert!(boot.body.starts_with(head.as_bytes()));
    let rest = &boot.body[head.len()..];
    assert!(rest.starts_with(&whole), "bootstrap carries the snapshot");
    assert!(rest[whole.len()..].starts_with(format!("\r\n--{boundary}").as_bytes()));
    let marker = format!("--{boundary}");
    assert!(!whole.windows(marker.len()).any(|w| w == marker.as_bytes()));
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
