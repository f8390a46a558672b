//! Multi-part snapshot upload under pressure and faults (snapshot-parts.md §8, §10, §11, §9),
//! against the real binary: the staged-bytes bound charged before the body, stalled uploads
//! timed out, commit slots, a failing cold store, SIGKILL during a commit and the sweep.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;
#[path = "snapshot_parts/helpers.rs"]
mod helpers;

use common::*;
use helpers::*;
use std::net::TcpStream;
use std::time::Duration;

#[test]
fn staged_bytes_bound_is_charged_before_the_body_and_stalled_uploads_time_out() {
    let tmp = tempfile::tempdir().unwrap();
    // A budget that holds every declared body: the staged bound is what answers here.
    let cfg = config(
        tmp.path(),
        "body_timeout_ms = 8000\nhttp_inflight_body_size = 4294967296\n",
    );
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
fn a_failing_store_answers_502_and_recovers() {
    let s = Server::start();
    let p = "/mpart/fail";
    assert_eq!(s.put(p, OCTETS, b"0123456789").status, 201);
    assert_eq!(
        s.req("PUT", &format!("{p}/snapshot/3"), &[], b"three")
            .status,
        204
    );
    let staged = part_id(&s, p, b"staged before the failure");
    let d = digest(OCTETS, b"staged before the failure");
    let cold = s.dir().join("cold");
    let away = s.dir().join("cold-away");
    std::fs::rename(&cold, &away).unwrap();
    std::fs::write(&cold, b"not a directory").unwrap();
    // A commit whose parts cannot be read: 502, and the parts stay.
    assert_error(
        &commit(&s, p, 10, &[&staged], &d, &[]),
        502,
        "COLD_STORE_FAILED",
    );
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
    // The same commit, repeated, publishes from the parts that stayed.
    let r = commit(&s, p, 10, &[&staged], &d, &[]);
    assert_eq!(r.status, 204, "{}", r.describe());
    assert_eq!(
        s.get(&format!("{p}/snapshot/10")).body,
        b"staged before the failure"
    );
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
