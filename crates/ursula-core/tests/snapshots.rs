//! Snapshots, retention and their interplay with forks, through `GroupState::apply`
//! (extensions.md §6-§7, forks.md §9.1): scenario tests and a property test over random
//! interleavings of appends, publishes, snapshot deletes and retention calls.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

use bytes::Bytes;
use proptest::prelude::*;
use ursula_core::command::*;
use ursula_core::snapshot::Digest;
use ursula_core::{Command, ErrorCode, GroupState, Incarnation, Op, Reply, Response, StreamKey};

struct Group {
    g: GroupState,
    index: u64,
    now: u64,
}

impl Group {
    fn new() -> Group {
        Group {
            g: GroupState::new(0),
            index: 0,
            now: 1_000_000,
        }
    }

    fn apply(&mut self, op: Op) -> Response {
        self.index += 1;
        self.now += 1;
        self.g.apply(
            self.index,
            &Command {
                now_ms: self.now,
                op,
            },
        )
    }

    fn create(&mut self, name: &str, ct: &str, payload: &[u8], messages: u64) -> Incarnation {
        self.create_with(name, ct, payload, messages, Lifetime::default())
    }

    fn create_with(
        &mut self,
        name: &str,
        ct: &str,
        payload: &[u8],
        messages: u64,
        lifetime: Lifetime,
    ) -> Incarnation {
        let r = self.apply(Op::Create(Box::new(CreateReq {
            content_type: Some(ct.into()),
            lifetime,
            payload: Bytes::copy_from_slice(payload),
            messages,
            ..CreateReq::new(key(name))
        })));
        match r {
            Ok(Reply::Created(c)) => c.incarnation,
            other => panic!("create {name}: {other:?}"),
        }
    }

    fn append(&mut self, name: &str, ct: &str, payload: &[u8]) -> AppendReply {
        let r = self.apply(Op::Append(Box::new(AppendReq {
            content_type: Some(ct.into()),
            messages: payload.iter().filter(|b| **b == b'\n').count() as u64,
            ..AppendReq::new(key(name), Bytes::copy_from_slice(payload))
        })));
        match r {
            Ok(Reply::Appended(a)) => a,
            other => panic!("append {name}: {other:?}"),
        }
    }

    fn publish_with(
        &mut self,
        name: &str,
        at: At,
        blob: &[u8],
        snapshot_match: Option<&str>,
        incarnation: Option<Incarnation>,
    ) -> Response {
        let ct = "application/octet-stream".to_owned();
        self.apply(Op::PublishSnapshot(Box::new(PublishSnapshotReq {
            key: key(name),
            incarnation,
            at,
            digest: Digest::of(&ct, blob),
            content_type: ct,
            snapshot_match: snapshot_match.map(str::to_owned),
            blob: Bytes::copy_from_slice(blob),
        })))
    }

    fn publish(&mut self, name: &str, offset: u64, blob: &[u8]) -> Response {
        self.publish_with(name, At::Offset(offset), blob, None, None)
    }

    fn retain(&mut self, name: &str, at: At) -> Response {
        self.apply(Op::Retain {
            key: key(name),
            at,
            incarnation: None,
        })
    }

    fn delete_snapshot(&mut self, name: &str, offset: u64) -> Response {
        self.apply(Op::DeleteSnapshot {
            key: key(name),
            offset,
            incarnation: None,
        })
    }

    fn fork(&mut self, name: &str, source: &str, anchor: Option<u64>) -> Response {
        let pinned = match self.apply(Op::Pin(Box::new(PinReq {
            source: key(source),
            fork_key: key(name),
            pin_id: self.index + 1000,
            deadline_ms: self.now + 60_000,
            anchor,
            sub: 0,
            content_type: None,
        }))) {
            Ok(Reply::Pinned(p)) => p,
            other => return other,
        };
        self.apply(Op::Create(Box::new(CreateReq {
            fork: Some(ForkCreate {
                source: key(source),
                anchor,
                sub: 0,
                pinned: Some(*pinned),
            }),
            ..CreateReq::new(key(name))
        })))
    }

    fn stream(&self, name: &str) -> &ursula_core::stream::StreamState {
        self.g.streams.get(&key(name)).expect("stream exists")
    }

    /// The bytes `[start, tail)` of a stream, following fork links like the read path.
    fn read(&self, name: &str, start: u64) -> Vec<u8> {
        let s = self.stream(name);
        let mut out = Vec::new();
        if start < s.own_start {
            let link = s.fork.as_ref().expect("inherited bytes have a source");
            let src = self.g.streams.get(&link.source).expect("source exists");
            assert!(src.holds(start, s.own_start), "source trimmed pinned bytes");
            src.copy_own_bytes(start, s.own_start, &mut out);
        }
        let from = start.max(s.own_start);
        assert!(s.holds(from, s.tail), "stream trimmed retained bytes");
        s.copy_own_bytes(from, s.tail, &mut out);
        out
    }
}

fn key(name: &str) -> StreamKey {
    StreamKey::new("demo", name)
}

fn code(r: &Response) -> Option<ErrorCode> {
    r.as_ref().err().map(|e| e.code)
}

fn snap(r: Response) -> SnapshotReply {
    match r {
        Ok(Reply::Snapshot(s)) => *s,
        other => panic!("expected a published snapshot, got {other:?}"),
    }
}

fn retained(r: Response) -> RetainReply {
    match r {
        Ok(Reply::Retained(r)) => r,
        other => panic!("expected a retention reply, got {other:?}"),
    }
}

const JSON: &str = "application/json";

/// `{"n":0}\n{"n":1}\n...`: record `i` ends at `8 * (i + 1)`.
fn records(from: u64, count: u64) -> Vec<u8> {
    (from..from + count)
        .flat_map(|i| format!("{{\"n\":{i}}}\n").into_bytes())
        .collect()
}

#[test]
fn publish_checks_run_in_the_specified_order() {
    let mut g = Group::new();
    let inc = g.create("s", JSON, &records(0, 4), 4); // tail 32
    let other = Incarnation(inc.0 ^ 1);
    let first = snap(g.publish("s", 16, b"two"));
    assert_eq!((first.offset, first.tail), (16, 32));
    assert_eq!((first.record_first, first.record_next), (0, 4));

    // Incarnation before the key; the key before Stream-Snapshot-Match.
    let r = g.publish_with("s", At::Offset(16), b"two", None, Some(other));
    assert_eq!(code(&r), Some(ErrorCode::INCARNATION_MISMATCH));
    let stale_match = "0".repeat(64);
    let again = snap(g.publish_with("s", At::Offset(16), b"two", Some(&stale_match), Some(inc)));
    assert_eq!(
        again.digest, first.digest,
        "an unchanged repeat is idempotent"
    );

    // Same offset, other content; an older offset: both stale.
    let r = g.publish("s", 16, b"other");
    assert_eq!(code(&r), Some(ErrorCode::SNAPSHOT_CONFLICT));
    let facts = &r.as_ref().unwrap_err().facts;
    assert_eq!(facts.snapshot, Some((16, first.digest)));
    assert_eq!(facts.next_offset, Some(32));
    assert_eq!(
        code(&g.publish("s", 8, b"old")),
        Some(ErrorCode::SNAPSHOT_CONFLICT)
    );

    // Beyond the tail; a match that names another digest; an offset inside a record.
    assert_eq!(
        code(&g.publish("s", 40, b"x")),
        Some(ErrorCode::SNAPSHOT_CONFLICT)
    );
    let r = g.publish_with("s", At::Offset(24), b"x", Some(&stale_match), None);
    assert_eq!(code(&r), Some(ErrorCode::SNAPSHOT_CONFLICT));
    assert_eq!(
        code(&g.publish("s", 20, b"x")),
        Some(ErrorCode::INVALID_SNAPSHOT)
    );

    // A conditional publish naming the visible digest succeeds, at the tail too.
    let d = first.digest.to_string().to_uppercase();
    let r = snap(g.publish_with("s", At::Offset(32), b"tail", Some(&d), None));
    assert_eq!(r.offset, 32);
    assert_eq!(g.stream("s").snapshot.as_ref().unwrap().blob, &b"tail"[..]);

    // Publishing never moves retention and never touches the TTL.
    assert_eq!(g.stream("s").retained, 0);
    assert_eq!(g.stream("s").last_touch_ms, 1_000_001);
}

#[test]
fn publish_by_record() {
    let mut g = Group::new();
    g.create("s", JSON, &records(0, 4), 4);
    g.create("b", "text/plain", b"abc", 0);
    assert_eq!(
        snap(g.publish_with("s", At::Record(2), b"x", None, None)).offset,
        16
    );
    assert_eq!(
        snap(g.publish_with("s", At::Record(4), b"y", None, None)).offset,
        32
    );
    let r = g.publish_with("s", At::Record(5), b"z", None, None);
    assert_eq!(code(&r), Some(ErrorCode::SNAPSHOT_CONFLICT));
    let f = &r.as_ref().unwrap_err().facts;
    assert_eq!((f.record_first, f.record_next), (Some(0), Some(4)));
    let r = g.publish_with("b", At::Record(0), b"z", None, None);
    assert_eq!(code(&r), Some(ErrorCode::INVALID_RECORD_BOUNDARIES));

    retained(g.retain("s", At::Record(3)));
    let r = g.publish_with("s", At::Record(2), b"z", None, None);
    assert_eq!(code(&r), Some(ErrorCode::STREAM_GONE));
    let f = &r.as_ref().unwrap_err().facts;
    assert_eq!((f.earliest_offset, f.record_first), (Some(24), Some(3)));
}

#[test]
fn retention_rules_and_physical_trim() {
    let mut g = Group::new();
    g.create("s", JSON, &records(0, 4), 4);
    g.append("s", JSON, &records(4, 2)); // tail 48, 6 records
    assert_eq!(
        code(&g.retain("s", At::Offset(8))),
        Some(ErrorCode::INVALID_RETENTION),
        "no snapshot yet"
    );
    snap(g.publish("s", 32, b"state"));
    assert_eq!(
        code(&g.retain("s", At::Offset(40))),
        Some(ErrorCode::INVALID_RETENTION)
    );
    assert_eq!(
        code(&g.retain("s", At::Offset(12))),
        Some(ErrorCode::INVALID_RETENTION)
    );
    assert_eq!(
        code(&g.retain("s", At::Record(7))),
        Some(ErrorCode::INVALID_RECORD_BOUNDARIES)
    );

    let r = retained(g.retain("s", At::Offset(16)));
    assert_eq!((r.retained, r.record_first, r.record_next), (16, 2, 6));
    assert!(r.freed_bytes >= 16);
    let s = g.stream("s");
    assert_eq!(
        (s.data_start, s.data.len()),
        (16, 32),
        "bytes below 16 are gone"
    );
    assert_eq!(s.record_at(24), Some(3), "ordinals never change");
    assert_eq!(s.offset_of_record(5), Some(40));
    assert_eq!(s.offset_of_record(1), None);
    assert_eq!(g.read("s", 16), records(2, 4));

    // At or below the current boundary: a no-op that reports the current one.
    let r = retained(g.retain("s", At::Offset(8)));
    assert_eq!((r.retained, r.freed_bytes), (16, 0));
    let r = retained(g.retain("s", At::Record(1)));
    assert_eq!(r.retained, 16);
    let r = retained(g.retain("s", At::Record(4)));
    assert_eq!((r.retained, r.record_first), (32, 4));
    assert_eq!(g.read("s", 32), records(4, 2));

    // Appends after a trim keep offsets and ordinals.
    let a = g.append("s", JSON, &records(6, 1));
    assert_eq!((a.next_offset, a.record_start, a.record_next), (56, 6, 7));
    assert_eq!(g.stream("s").record_at(56), Some(7));
    assert_eq!(g.read("s", 32), records(4, 3));
}

#[test]
fn byte_streams_retain_at_any_offset() {
    let mut g = Group::new();
    g.create("b", "text/plain", b"hello ", 0);
    g.append("b", "text/plain", b"world");
    snap(g.publish("b", 3, b"hel"));
    assert_eq!(retained(g.retain("b", At::Offset(2))).retained, 2);
    assert_eq!(g.read("b", 2), b"llo world");
    assert_eq!(
        g.stream("b").cut_offset,
        0,
        "the first append still straddles 2"
    );
    let r = g.retain("b", At::Record(1));
    assert_eq!(code(&r), Some(ErrorCode::INVALID_RECORD_BOUNDARIES));
}

#[test]
fn snapshot_delete_never_deletes() {
    let mut g = Group::new();
    g.create("s", "text/plain", b"abc", 0);
    assert_eq!(
        code(&g.delete_snapshot("s", 1)),
        Some(ErrorCode::SNAPSHOT_NOT_FOUND)
    );
    snap(g.publish("s", 1, b"a"));
    snap(g.publish("s", 2, b"ab"));
    assert_eq!(
        code(&g.delete_snapshot("s", 2)),
        Some(ErrorCode::SNAPSHOT_CONFLICT)
    );
    assert_eq!(
        code(&g.delete_snapshot("s", 1)),
        Some(ErrorCode::SNAPSHOT_NOT_FOUND)
    );
    assert_eq!(
        code(&g.delete_snapshot("x", 1)),
        Some(ErrorCode::STREAM_NOT_FOUND)
    );
    let r = g.apply(Op::DeleteSnapshot {
        key: key("s"),
        offset: 2,
        incarnation: Some(Incarnation(7)),
    });
    assert_eq!(code(&r), Some(ErrorCode::INCARNATION_MISMATCH));
    assert_eq!(g.stream("s").snapshot.as_ref().unwrap().offset, 2);
}

#[test]
fn recreate_and_expiry_drop_snapshot_and_retention() {
    let mut g = Group::new();
    let first = g.create("s", "text/plain", b"abc", 0);
    snap(g.publish("s", 2, b"ab"));
    retained(g.retain("s", At::Offset(2)));
    g.apply(Op::Delete {
        key: key("s"),
        incarnation: None,
    })
    .unwrap();
    let second = g.create("s", "text/plain", b"xyz", 0);
    assert_ne!(first, second);
    let s = g.stream("s");
    assert!(s.snapshot.is_none());
    assert_eq!((s.retained, s.data_start), (0, 0));

    let lt = Lifetime {
        ttl_s: Some(1),
        expires_at_ms: None,
    };
    g.create_with("t", "text/plain", b"abc", 0, lt);
    snap(g.publish("t", 3, b"abc"));
    g.now += 5_000;
    assert_eq!(
        code(&g.publish("t", 3, b"abc")),
        Some(ErrorCode::STREAM_NOT_FOUND)
    );
    assert!(!g.g.streams.contains_key(&key("t")));
}

#[test]
fn soft_deleted_streams_refuse_every_subresource_write() {
    let mut g = Group::new();
    g.create("src", "text/plain", b"abc", 0);
    g.fork("f", "src", None).unwrap();
    g.apply(Op::Delete {
        key: key("src"),
        incarnation: None,
    })
    .unwrap();
    assert!(g.stream("src").soft_deleted);
    for r in [
        g.publish("src", 1, b"a"),
        g.retain("src", At::Offset(1)),
        g.delete_snapshot("src", 1),
    ] {
        assert_eq!(code(&r), Some(ErrorCode::STREAM_SOFT_DELETED));
    }
}

#[test]
fn forks_inherit_snapshot_retention_and_pin_their_bytes() {
    let mut g = Group::new();
    g.create("src", JSON, &records(0, 6), 6); // tail 48
    snap(g.publish("src", 16, b"s16"));
    retained(g.retain("src", At::Offset(8)));

    // Fork at 24: inherits the snapshot (16 <= 24) and the retained offset 8.
    match g.fork("f", "src", Some(24)) {
        Ok(Reply::Created(c)) => assert_eq!((c.tail, c.record_next), (24, 3)),
        other => panic!("fork: {other:?}"),
    }
    let f = g.stream("f");
    assert_eq!(f.retained, 8);
    assert_eq!(f.record_first(), 1, "ordinals are the source's");
    assert_eq!(f.snapshot.as_ref().map(|s| s.offset), Some(16));
    assert_eq!(g.read("f", 8), records(1, 2));

    // A trimmed source refuses a fork point before its visible snapshot (rule 7), and a
    // point before its retained offset (rule 3).
    snap(g.publish("src", 40, b"s40"));
    assert_eq!(
        code(&g.fork("g", "src", Some(32))),
        Some(ErrorCode::SNAPSHOT_CONFLICT)
    );
    assert_eq!(
        code(&g.fork("g", "src", Some(0))),
        Some(ErrorCode::STREAM_GONE)
    );

    // The source retains past the fork's floor: logically gone there, physically kept.
    retained(g.retain("src", At::Offset(40)));
    let s = g.stream("src");
    assert_eq!(
        (s.retained, s.data_start),
        (40, 8),
        "the pin's floor keeps [8, 24)"
    );
    assert_eq!(g.read("f", 8), records(1, 2));

    // The fork's own snapshot and retention are its own.
    g.append("f", JSON, &records(100, 1));
    snap(g.publish("f", 24, b"f24"));
    assert_eq!(retained(g.retain("f", At::Offset(24))).retained, 24);
    assert_eq!(g.stream("src").snapshot.as_ref().unwrap().offset, 40);

    // Releasing the pin lets the source trim to its retained offset.
    let pin_id = g.stream("f").fork.as_ref().unwrap().pin_id;
    g.apply(Op::Unpin {
        key: key("src"),
        pin_id,
    })
    .unwrap();
    assert_eq!(g.stream("src").data_start, 40);
}

#[test]
fn untrimmed_source_may_be_forked_before_its_snapshot() {
    let mut g = Group::new();
    g.create("src", "text/plain", b"hello world", 0);
    snap(g.publish("src", 8, b"snap"));
    g.fork("f", "src", Some(5)).unwrap();
    assert!(
        g.stream("f").snapshot.is_none(),
        "a snapshot beyond the fork point stays"
    );
    assert_eq!(g.read("f", 0), b"hello");
    // A byte fork point inside an append ends that unit for the fork.
    assert_eq!(g.stream("f").ends, vec![5]);
}

// ---- property test ----------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Action {
    Append(u8),
    /// Publish at a boundary chosen by index (modulo the candidates), maybe off by one.
    Publish {
        pick: u16,
        skew: i8,
        blob: u8,
    },
    PublishRecord(u16),
    DeleteSnapshot(u16),
    Retain {
        pick: u16,
        skew: i8,
    },
    RetainRecord(u16),
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        3 => (1u8..4).prop_map(Action::Append),
        2 => (any::<u16>(), -1i8..=1, 0u8..3)
            .prop_map(|(pick, skew, blob)| Action::Publish { pick, skew, blob }),
        1 => any::<u16>().prop_map(Action::PublishRecord),
        1 => any::<u16>().prop_map(Action::DeleteSnapshot),
        2 => (any::<u16>(), -1i8..=1).prop_map(|(pick, skew)| Action::Retain { pick, skew }),
        1 => any::<u16>().prop_map(Action::RetainRecord),
    ]
}

/// What the stream must look like: every appended byte, record ends, the visible snapshot
/// and the retained offset, as a client that saw every answer knows them.
#[derive(Default)]
struct Model {
    bytes: Vec<u8>,
    ends: Vec<u64>,
    snapshot: Option<(u64, Digest)>,
    retained: u64,
    next_record: u64,
}

impl Model {
    fn boundary(&self, pick: u16, skew: i8) -> u64 {
        let mut all = vec![0];
        all.extend(&self.ends);
        let b = all[pick as usize % all.len()];
        b.saturating_add_signed(i64::from(skew))
    }

    fn first_record(&self) -> u64 {
        if self.retained == 0 {
            0
        } else {
            self.ends.iter().position(|e| *e == self.retained).unwrap() as u64 + 1
        }
    }
}

fn json_snapshot_expected(m: &Model, offset: u64, digest: Digest) -> Result<(), ErrorCode> {
    if let Some((o, d)) = m.snapshot {
        if o == offset && d == digest {
            return Ok(());
        }
        if o >= offset {
            return Err(ErrorCode::SNAPSHOT_CONFLICT);
        }
    }
    if offset < m.retained {
        return Err(ErrorCode::STREAM_GONE);
    }
    if offset > m.bytes.len() as u64 {
        return Err(ErrorCode::SNAPSHOT_CONFLICT);
    }
    if offset != 0 && !m.ends.contains(&offset) {
        return Err(ErrorCode::INVALID_SNAPSHOT);
    }
    Ok(())
}

fn retain_expected(m: &Model, boundary: u64) -> Result<bool, ErrorCode> {
    if boundary <= m.retained {
        return Ok(false);
    }
    match m.snapshot {
        Some((o, _)) if boundary <= o => {}
        _ => return Err(ErrorCode::INVALID_RETENTION),
    }
    if !m.ends.contains(&boundary) {
        return Err(ErrorCode::INVALID_RETENTION);
    }
    Ok(true)
}

fn run(actions: Vec<Action>) {
    let mut g = Group::new();
    let mut m = Model::default();
    g.create("s", JSON, b"", 0);
    let ct = "application/octet-stream";
    for (step, a) in actions.into_iter().enumerate() {
        let ctx = format!("step {step}: {a:?}");
        match a {
            Action::Append(n) => {
                let payload = records(m.next_record, u64::from(n));
                let r = g.append("s", JSON, &payload);
                assert_eq!(r.record_start, m.next_record, "{ctx}");
                for line in payload.split_inclusive(|b| *b == b'\n') {
                    m.bytes.extend_from_slice(line);
                    m.ends.push(m.bytes.len() as u64);
                }
                m.next_record += u64::from(n);
                assert_eq!(r.next_offset, m.bytes.len() as u64, "{ctx}");
            }
            Action::Publish { pick, skew, blob } => {
                let offset = m.boundary(pick, skew);
                let body = vec![blob; usize::from(blob)];
                let digest = Digest::of(ct, &body);
                let want = json_snapshot_expected(&m, offset, digest);
                let got = g.publish("s", offset, &body);
                assert_eq!(got.as_ref().err().map(|e| e.code), want.err(), "{ctx}");
                if want.is_ok() {
                    m.snapshot = Some((offset, digest));
                }
            }
            Action::PublishRecord(n) => {
                let n = u64::from(n) % (m.next_record + 2);
                let got = g.publish_with("s", At::Record(n), b"r", None, None);
                let want = if n < m.first_record() {
                    Err(ErrorCode::STREAM_GONE)
                } else if n > m.next_record {
                    Err(ErrorCode::SNAPSHOT_CONFLICT)
                } else {
                    let offset = if n == 0 { 0 } else { m.ends[n as usize - 1] };
                    json_snapshot_expected(&m, offset, Digest::of(ct, b"r")).map(|()| offset)
                };
                assert_eq!(got.as_ref().err().map(|e| e.code), want.err(), "{ctx}");
                if let Ok(offset) = want {
                    m.snapshot = Some((offset, Digest::of(ct, b"r")));
                }
            }
            Action::DeleteSnapshot(pick) => {
                let offset = m.boundary(pick, 0);
                let want = match m.snapshot {
                    Some((o, _)) if o == offset => ErrorCode::SNAPSHOT_CONFLICT,
                    _ => ErrorCode::SNAPSHOT_NOT_FOUND,
                };
                assert_eq!(code(&g.delete_snapshot("s", offset)), Some(want), "{ctx}");
            }
            Action::Retain { pick, skew } => {
                let boundary = m.boundary(pick, skew);
                let want = retain_expected(&m, boundary);
                let got = g.retain("s", At::Offset(boundary));
                assert_eq!(got.as_ref().err().map(|e| e.code), want.err(), "{ctx}");
                if want == Ok(true) {
                    m.retained = boundary;
                }
                if let Ok(Reply::Retained(r)) = got {
                    assert_eq!(r.retained, m.retained, "{ctx}");
                }
            }
            Action::RetainRecord(n) => {
                let n = u64::from(n) % (m.next_record + 2);
                let got = g.retain("s", At::Record(n));
                let want = if n > m.next_record {
                    Err(ErrorCode::INVALID_RECORD_BOUNDARIES)
                } else if n <= m.first_record() {
                    Ok(false)
                } else {
                    retain_expected(&m, m.ends[n as usize - 1])
                };
                assert_eq!(got.as_ref().err().map(|e| e.code), want.err(), "{ctx}");
                if want == Ok(true) {
                    m.retained = m.ends[n as usize - 1];
                }
            }
        }
        check_invariants(&g, &m, &ctx);
    }
}

fn check_invariants(g: &Group, m: &Model, ctx: &str) {
    let s = g.stream("s");
    assert_eq!(
        s.snapshot_key(),
        m.snapshot,
        "{ctx}: the visible snapshot is the newest"
    );
    if let Some((o, _)) = m.snapshot {
        assert!(s.retained <= o, "{ctx}: retention passed the snapshot");
    } else {
        assert_eq!(s.retained, 0, "{ctx}");
    }
    assert_eq!(s.retained, m.retained, "{ctx}");
    assert_eq!(s.tail, m.bytes.len() as u64, "{ctx}");
    // Reads at or after retention return exactly the appended bytes; nothing below is held.
    assert_eq!(
        g.read("s", s.retained),
        m.bytes[s.retained as usize..],
        "{ctx}"
    );
    assert_eq!(
        s.data_start, s.retained,
        "{ctx}: bytes below retention are dropped"
    );
    assert_eq!(s.data.len() as u64, s.tail - s.retained, "{ctx}");
    // Every retained boundary keeps its ordinal, and the record tail is exact.
    assert_eq!(s.record_next(), m.next_record, "{ctx}");
    assert_eq!(s.record_first(), m.first_record(), "{ctx}");
    for (i, e) in m.ends.iter().enumerate() {
        if *e >= s.retained {
            assert_eq!(s.record_at(*e), Some(i as u64 + 1), "{ctx}: record at {e}");
            assert_eq!(s.offset_of_record(i as u64 + 1), Some(*e), "{ctx}");
        }
    }
    assert!(
        s.ends.iter().all(|e| e > s.retained),
        "{ctx}: index below retention"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_interleavings_keep_the_invariants(
        actions in proptest::collection::vec(action(), 1..60)
    ) {
        run(actions);
    }
}

#[test]
fn digest_is_stable_across_the_wire_form() {
    // The digest a client computes (extensions.md §6.3) for a known input.
    let d = Digest::of("application/octet-stream", b"");
    let mut h = blake3::Hasher::new();
    h.update(&24u64.to_le_bytes());
    h.update(b"application/octet-stream");
    assert_eq!(d.to_string(), h.finalize().to_hex().to_string());
}
