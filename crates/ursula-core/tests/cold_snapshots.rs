//! Cold snapshot references through `GroupState::apply` (snapshot-parts.md §4.2 Phase C):
//! the publish of a cold object, the incarnation its parts belong to, repeats and conflicts,
//! and a fork inheriting the reference.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

use bytes::Bytes;
use ursula_core::command::*;
use ursula_core::snapshot::{ColdSnapshotRef, Digest};
use ursula_core::{Command, ErrorCode, GroupState, Incarnation, Op, Reply, Response, StreamKey};

fn key(n: &str) -> StreamKey {
    StreamKey::new("b", n)
}

struct G {
    g: GroupState,
    i: u64,
}

impl G {
    fn apply(&mut self, op: Op) -> Response {
        self.i += 1;
        self.g.apply(
            self.i,
            &Command {
                now_ms: 1_000_000 + self.i,
                op,
            },
        )
    }

    fn create(&mut self, n: &str) -> Incarnation {
        match self.apply(Op::Create(Box::new(CreateReq {
            content_type: Some("application/octet-stream".into()),
            payload: Bytes::from_static(b"0123456789"),
            messages: 1,
            ..CreateReq::new(key(n))
        }))) {
            Ok(Reply::Created(c)) => c.incarnation,
            other => panic!("create: {other:?}"),
        }
    }

    fn publish(
        &mut self,
        n: &str,
        inc: Option<Incarnation>,
        parts: Option<Incarnation>,
        off: u64,
        obj: &str,
    ) -> Response {
        self.apply(Op::PublishColdSnapshot(Box::new(PublishColdSnapshotReq {
            key: key(n),
            incarnation: inc,
            parts_incarnation: parts,
            at: At::Offset(off),
            content_type: "application/octet-stream".into(),
            digest: Digest::of("application/octet-stream", obj.as_bytes()),
            snapshot_match: None,
            object: ColdSnapshotRef {
                key: obj.into(),
                len: 1 << 30,
            },
        })))
    }
}

fn code(r: Response) -> Option<ErrorCode> {
    r.err().map(|e| e.code)
}

#[test]
fn cold_publishes_check_the_parts_incarnation_and_keys() {
    let mut g = G {
        g: GroupState::new(0),
        i: 0,
    };
    g.apply(Op::CreateBucket { bucket: "b".into() }).unwrap();
    let old = g.create("s");
    g.apply(Op::Delete {
        key: key("s"),
        incarnation: None,
    })
    .unwrap();
    let new = g.create("s");
    // Parts of the earlier incarnation: never published; 412 when the commit named it.
    assert_eq!(
        code(g.publish("s", None, Some(old), 4, "o1")),
        Some(ErrorCode::UNKNOWN_SNAPSHOT_PART)
    );
    assert_eq!(
        code(g.publish("s", Some(old), Some(old), 4, "o1")),
        Some(ErrorCode::INCARNATION_MISMATCH)
    );
    assert!(g.g.streams[&key("s")].snapshot.is_none());
    // The current incarnation's parts publish the reference, not bytes.
    assert!(matches!(
        g.publish("s", Some(new), Some(new), 4, "o1"),
        Ok(Reply::Snapshot(_))
    ));
    let s = &g.g.streams[&key("s")];
    assert_eq!(
        s.snapshot_object.as_ref().map(|r| r.key.as_str()),
        Some("o1")
    );
    assert!(s.snapshot.as_ref().unwrap().blob.is_empty());
    // A repeat answers as published and keeps the first reference; a conflict is refused.
    assert!(matches!(
        g.publish("s", None, Some(new), 4, "o1"),
        Ok(Reply::Snapshot(_))
    ));
    assert_eq!(
        code(g.publish("s", None, Some(new), 4, "o2")),
        Some(ErrorCode::SNAPSHOT_CONFLICT)
    );
    assert_eq!(
        code(g.publish("s", None, Some(new), 11, "o3")),
        Some(ErrorCode::SNAPSHOT_CONFLICT)
    );
    // An inline publish replaces the reference.
    let r = g.apply(Op::PublishSnapshot(Box::new(PublishSnapshotReq {
        key: key("s"),
        incarnation: None,
        at: At::Offset(6),
        content_type: "application/octet-stream".into(),
        digest: Digest::of("application/octet-stream", b"six"),
        snapshot_match: None,
        blob: Bytes::from_static(b"six"),
    })));
    assert!(r.is_ok());
    assert!(g.g.streams[&key("s")].snapshot_object.is_none());
}

#[test]
fn a_fork_inherits_the_cold_reference() {
    let mut g = G {
        g: GroupState::new(0),
        i: 0,
    };
    g.apply(Op::CreateBucket { bucket: "b".into() }).unwrap();
    g.create("src");
    g.publish("src", None, None, 4, "snapshots/b/src/x.snap")
        .unwrap();
    let pinned = match g.apply(Op::Pin(Box::new(PinReq {
        source: key("src"),
        fork_key: key("f"),
        pin_id: 1,
        deadline_ms: u64::MAX / 2,
        anchor: None,
        sub: 0,
        content_type: None,
    }))) {
        Ok(Reply::Pinned(p)) => p,
        other => panic!("pin: {other:?}"),
    };
    let r = g.apply(Op::Create(Box::new(CreateReq {
        fork: Some(ForkCreate {
            source: key("src"),
            anchor: None,
            sub: 0,
            pinned: Some(*pinned),
        }),
        ..CreateReq::new(key("f"))
    })));
    assert!(matches!(r, Ok(Reply::Created(_))), "{r:?}");
    let f = &g.g.streams[&key("f")];
    assert_eq!(
        f.snapshot_object,
        Some(ColdSnapshotRef {
            key: "snapshots/b/src/x.snap".into(),
            len: 1 << 30
        })
    );
    let snap = f.snapshot.as_ref().unwrap();
    assert_eq!((snap.offset, snap.blob.len()), (4, 0));
}
