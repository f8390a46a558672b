//! Golden bytes of the durable encoding (`ursula_core::encoding`): one command of every `Op`
//! variant with every optional field set, and a group state holding a stream with producers,
//! a pin, a snapshot, retention and an outbox item. Schema 1 is frozen: if these bytes change,
//! a persisted type changed, and the change needs a new schema (docs/storage.md, "Adding a field
//! or a variant"), not a new golden file.
//!
//! `golden/schema-v1.hex` was written by the code of commit 2914ec9 itself (its
//! `Command::encode_into` and `GroupState::encode` over these same samples, in a worktree of
//! that commit). `URSULA_BLESS_GOLDEN=1 cargo test -p ursula-core --test encoding_golden` rewrites the golden
//! file of [`Schema::CURRENT`] only when it does not exist yet (a new schema's first run).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

use bytes::Bytes;
use proptest::prelude::*;
use std::path::PathBuf;
use ursula_core::cold::{FlushReq, FlushSlice, ObjectId};
use ursula_core::command::*;
use ursula_core::external::{ExternalAppend, ExternalCreate, ExternalPayload};
use ursula_core::snapshot::{Digest, Snapshot};
use ursula_core::{Command, GroupState, Incarnation, Op, Schema, StreamKey};

fn key() -> StreamKey {
    StreamKey::new("golden", "s")
}

fn inc() -> Incarnation {
    Incarnation(0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10)
}

fn producer() -> ProducerHdr {
    ProducerHdr {
        id: "writer-1".into(),
        epoch: 3,
        seq: 7,
    }
}

fn lifetime() -> Lifetime {
    Lifetime {
        ttl_s: Some(3600),
        expires_at_ms: Some(1_900_000_000_000),
    }
}

fn snapshot() -> Snapshot {
    Snapshot {
        offset: 8,
        content_type: "application/octet-stream".into(),
        digest: Digest::of("application/octet-stream", b"blob"),
        blob: Bytes::from_static(b"blob"),
    }
}

/// Index of `op`'s variant. No wildcard arm: a new variant does not compile until it is given an
/// index here and a sample in [`samples`].
fn variant(op: &Op) -> usize {
    match op {
        Op::CreateBucket { .. } => 0,
        Op::DeleteBucket { .. } => 1,
        Op::Create(_) => 2,
        Op::Append(_) => 3,
        Op::Delete { .. } => 4,
        Op::Touch { .. } => 5,
        Op::Expire { .. } => 6,
        Op::Pin(_) => 7,
        Op::Unpin { .. } => 8,
        Op::OutboxDone { .. } => 9,
        Op::Noop => 10,
        Op::PublishSnapshot(_) => 11,
        Op::DeleteSnapshot { .. } => 12,
        Op::Retain { .. } => 13,
        Op::PurgeBucket { .. } => 14,
        Op::ColdFlush(_) => 15,
        Op::ColdGcDone { .. } => 16,
        Op::PublishColdSnapshot(_) => 17,
        Op::AppendExternal(_) => 18,
        Op::CreateExternal(_) => 19,
    }
}
const VARIANTS: usize = 20;

/// How many variants (the first ones) each schema has.
fn variants_in(schema: Schema) -> usize {
    match schema {
        Schema::V1 => 15,
        Schema::V2 => 18,
        Schema::V3 | Schema::V4 => 20,
    }
}

/// The samples a schema's golden file holds.
fn samples_of(schema: Schema) -> Vec<Command> {
    samples()
        .into_iter()
        .filter(|c| variant(&c.op) < variants_in(schema))
        .collect()
}

fn external() -> ExternalPayload {
    ExternalPayload {
        namespace: 0x0123_4567_89ab_cdef,
        object: ObjectId(ObjectId::EXTERNAL_BIT | 0x55),
        len: 2 << 20,
        object_size: (2 << 20) + 96,
        ends: vec![1 << 20, 2 << 20],
    }
}

/// One command of every variant, every optional field set.
fn samples() -> Vec<Command> {
    let pinned = PinnedSource {
        pin_id: 5,
        deadline_ms: 99,
        source_incarnation: inc(),
        content_type: "application/json".into(),
        lifetime: lifetime(),
        anchor: 40,
        point: 32,
        record_at_point: 4,
        retained: 16,
        depth: 1,
        ends_prefix: vec![24, 32],
        ends_cut: 2,
        cut_offset: 16,
        snapshot: Some(snapshot()),
    };
    let ops = vec![
        Op::CreateBucket {
            bucket: "golden".into(),
        },
        Op::DeleteBucket {
            bucket: "gone".into(),
        },
        Op::Create(Box::new(CreateReq {
            content_type: Some("text/plain".into()),
            closed: true,
            lifetime: lifetime(),
            stream_seq: Some("a".into()),
            producer: Some(producer()),
            incarnation: Some(inc()),
            payload: Bytes::from_static(b"hello"),
            messages: 1,
            fork: Some(ForkCreate {
                source: StreamKey::new("golden", "src"),
                anchor: Some(40),
                sub: 2,
                pinned: Some(pinned),
            }),
            ..CreateReq::new(key())
        })),
        Op::Append(Box::new(AppendReq {
            content_type: Some("text/plain".into()),
            close: true,
            stream_seq: Some("b".into()),
            producer: Some(producer()),
            incarnation: Some(inc()),
            record_match: Some(3),
            messages: 2,
            ..AppendReq::new(key(), Bytes::from_static(b"world"))
        })),
        Op::Delete {
            key: key(),
            incarnation: Some(inc()),
        },
        Op::Touch {
            key: key(),
            incarnation: inc(),
        },
        Op::Expire {
            key: key(),
            incarnation: inc(),
        },
        Op::Pin(Box::new(PinReq {
            source: StreamKey::new("golden", "src"),
            fork_key: key(),
            pin_id: 5,
            deadline_ms: 99,
            anchor: Some(40),
            sub: 1,
            content_type: Some("application/json".into()),
        })),
        Op::Unpin {
            key: key(),
            pin_id: 5,
        },
        Op::OutboxDone { id: 11 },
        Op::Noop,
        Op::PublishSnapshot(Box::new(PublishSnapshotReq {
            key: key(),
            incarnation: Some(inc()),
            at: At::Record(3),
            content_type: "application/octet-stream".into(),
            digest: Digest::of("application/octet-stream", b"blob"),
            snapshot_match: Some("abc".into()),
            blob: Bytes::from_static(b"blob"),
        })),
        Op::DeleteSnapshot {
            key: key(),
            offset: 8,
            incarnation: Some(inc()),
        },
        Op::Retain {
            key: key(),
            at: At::Offset(4),
            incarnation: None,
        },
        Op::PurgeBucket {
            bucket: "purged".into(),
        },
        Op::ColdFlush(Box::new(FlushReq {
            namespace: 0x0123_4567_89ab_cdef,
            object: ObjectId(7),
            object_len: 300,
            slices: vec![FlushSlice {
                key: key(),
                incarnation: inc(),
                start: 8,
                end: 308,
                pos: 0,
            }],
        })),
        Op::ColdGcDone {
            objects: vec![ObjectId(3), ObjectId(4)],
        },
        Op::PublishColdSnapshot(Box::new(PublishColdSnapshotReq {
            key: key(),
            incarnation: Some(inc()),
            parts_incarnation: Some(inc()),
            at: At::Offset(8),
            content_type: "application/octet-stream".into(),
            digest: Digest([9; 32]),
            snapshot_match: Some("abc".into()),
            object: ursula_core::snapshot::ColdSnapshotRef {
                key: "snapshots/golden/s/x.snap".into(),
                len: 1 << 30,
            },
        })),
        Op::AppendExternal(Box::new(ExternalAppend {
            req: AppendReq {
                content_type: Some("application/json".into()),
                close: true,
                stream_seq: Some("b".into()),
                producer: Some(producer()),
                incarnation: Some(inc()),
                record_match: Some(4),
                messages: 2,
                ..AppendReq::new(key(), Bytes::new())
            },
            payload: external(),
        })),
        Op::CreateExternal(Box::new(ExternalCreate {
            req: CreateReq {
                content_type: Some("application/json".into()),
                closed: true,
                lifetime: lifetime(),
                stream_seq: Some("a".into()),
                producer: Some(producer()),
                messages: 2,
                ..CreateReq::new(key())
            },
            payload: external(),
        })),
    ];
    ops.into_iter()
        .enumerate()
        .map(|(i, op)| Command {
            now_ms: 1_800_000_000_000 + i as u64,
            op,
        })
        .collect()
}

/// A group state built by applying real commands: a stream with bytes, two producers, a
/// published snapshot, advanced retention, a pin held by a fork, and a fork with an outbox item.
fn sample_state() -> GroupState {
    let mut g = GroupState::new(3);
    let now = 1_800_000_000_000;
    let apply = |g: &mut GroupState, i: u64, op: Op| {
        let r = g.apply(i, &Command { now_ms: now, op });
        assert!(r.is_ok(), "{r:?}");
    };
    apply(
        &mut g,
        1,
        Op::CreateBucket {
            bucket: "golden".into(),
        },
    );
    apply(
        &mut g,
        2,
        Op::Create(Box::new(CreateReq {
            content_type: Some("text/plain".into()),
            lifetime: Lifetime {
                ttl_s: Some(3600),
                expires_at_ms: None,
            },
            producer: Some(ProducerHdr {
                id: "p0".into(),
                epoch: 0,
                seq: 0,
            }),
            payload: Bytes::from_static(b"0123456789abcdef"),
            ..CreateReq::new(key())
        })),
    );
    apply(
        &mut g,
        3,
        Op::Append(Box::new(AppendReq {
            content_type: Some("text/plain".into()),
            producer: Some(ProducerHdr {
                id: "p1".into(),
                epoch: 2,
                seq: 0,
            }),
            ..AppendReq::new(key(), Bytes::from_static(b"ghij"))
        })),
    );
    apply(
        &mut g,
        4,
        Op::PublishSnapshot(Box::new(PublishSnapshotReq {
            key: key(),
            incarnation: None,
            at: At::Offset(8),
            content_type: "application/octet-stream".into(),
            digest: Digest::of("application/octet-stream", b"blob"),
            snapshot_match: None,
            blob: Bytes::from_static(b"blob"),
        })),
    );
    apply(
        &mut g,
        5,
        Op::Retain {
            key: key(),
            at: At::Offset(4),
            incarnation: None,
        },
    );
    apply(
        &mut g,
        6,
        Op::Pin(Box::new(PinReq {
            source: key(),
            fork_key: StreamKey::new("golden", "other-group-fork"),
            pin_id: 9,
            deadline_ms: now + 60_000,
            anchor: None,
            sub: 0,
            content_type: None,
        })),
    );
    g
}

fn golden_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name)
}

fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for (i, b) in bytes.iter().enumerate() {
        s.push_str(&format!("{b:02x}"));
        if i % 32 == 31 {
            s.push('\n');
        }
    }
    s.push('\n');
    s
}

fn unhex(text: &str) -> Vec<u8> {
    let digits: Vec<u8> = text.bytes().filter(u8::is_ascii_hexdigit).collect();
    digits
        .chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap())
        .collect()
}

/// Golden file text: one `# label` line and the hex of each encoded value.
fn golden_text() -> String {
    let mut out = String::new();
    for cmd in samples() {
        let mut buf = Vec::new();
        cmd.encode_into(&mut buf).unwrap();
        out.push_str(&format!("# command {}\n", variant(&cmd.op)));
        out.push_str(&hex(&buf));
    }
    out.push_str("# group-state\n");
    out.push_str(&hex(&sample_state().encode().unwrap()));
    out
}

/// The sections of a golden file, in order.
fn sections(text: &str) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        if let Some(label) = line.strip_prefix("# ") {
            out.push((label.to_owned(), String::new()));
        } else if let Some(last) = out.last_mut() {
            last.1.push_str(line);
        }
    }
    out.into_iter().map(|(l, h)| (l, unhex(&h))).collect()
}

#[test]
fn samples_cover_every_variant() {
    let mut seen: Vec<usize> = samples().iter().map(|c| variant(&c.op)).collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..VARIANTS).collect::<Vec<_>>());
}

#[test]
fn every_readable_schema_decodes_its_golden_bytes() {
    let current = format!("schema-v{}.hex", Schema::CURRENT.number());
    if std::env::var_os("URSULA_BLESS_GOLDEN").is_some() && !golden_path(&current).exists() {
        std::fs::write(golden_path(&current), golden_text()).unwrap();
    }
    for schema in Schema::READABLE {
        let path = golden_path(&format!("schema-v{}.hex", schema.number()));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (every readable schema has one)", path.display()));
        let sections = sections(&text);
        let samples = samples_of(schema);
        assert_eq!(sections.len(), samples.len() + 1, "{}", path.display());
        for ((label, bytes), want) in sections.iter().zip(&samples) {
            let cmd = Command::decode(schema, bytes).unwrap_or_else(|e| panic!("{label}: {e}"));
            // Decoding loses nothing: the decoded value re-encodes to the current bytes.
            let (mut got, mut exp) = (Vec::new(), Vec::new());
            cmd.encode_into(&mut got).unwrap();
            want.encode_into(&mut exp).unwrap();
            assert_eq!(got, exp, "{schema:?} {label}");
        }
        let (label, bytes) = sections.last().unwrap();
        assert_eq!(label, "group-state");
        let state = GroupState::decode(schema, bytes).unwrap();
        assert_eq!(
            state.encode().unwrap(),
            sample_state().encode().unwrap(),
            "{schema:?} group state"
        );
    }
}

#[test]
fn schema_1_is_what_the_release_before_versioning_wrote() {
    // That release encoded with `bincode::serialize` (legacy configuration).
    let text = std::fs::read_to_string(golden_path("schema-v1.hex")).unwrap();
    let sections = sections(&text);
    for ((label, bytes), cmd) in sections.iter().zip(samples_of(Schema::V1)) {
        assert!(*bytes == bincode::serialize(&cmd).unwrap(), "{label}");
    }
    // The group state's layout has changed since (schema 2 added the cold tier), so its
    // schema-1 bytes are checked by decoding them through the frozen types instead
    // (`every_readable_schema_decodes_its_golden_bytes`).
    let (label, _) = sections.last().unwrap();
    assert_eq!(label, "group-state");
}

#[test]
fn the_current_schema_writes_its_golden_bytes() {
    let path = golden_path(&format!("schema-v{}.hex", Schema::CURRENT.number()));
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text == golden_text(),
        "the encoding of a persisted type changed: add a schema instead (docs/storage.md)"
    );
}

fn arb_op() -> impl Strategy<Value = Op> {
    let text = "[a-z0-9]{1,12}";
    prop_oneof![
        text.prop_map(|bucket| Op::CreateBucket { bucket }),
        (text, text, any::<Vec<u8>>(), any::<u64>(), any::<bool>()).prop_map(
            |(b, s, payload, messages, close)| Op::Append(Box::new(AppendReq {
                close,
                messages,
                ..AppendReq::new(StreamKey::new(&b, &s), Bytes::from(payload))
            }))
        ),
        (text, any::<u128>()).prop_map(|(s, i)| Op::Touch {
            key: StreamKey::new("b", &s),
            incarnation: Incarnation(i),
        }),
        any::<u64>().prop_map(|id| Op::OutboxDone { id }),
        Just(Op::Noop),
    ]
}

proptest! {
    #[test]
    fn commands_round_trip_in_every_schema(now_ms in any::<u64>(), op in arb_op()) {
        let cmd = Command { now_ms, op };
        let mut buf = Vec::new();
        cmd.encode_into(&mut buf).unwrap();
        for schema in Schema::READABLE {
            let back = Command::decode(schema, &buf).unwrap();
            let mut again = Vec::new();
            back.encode_into(&mut again).unwrap();
            prop_assert_eq!(&again, &buf);
        }
    }

    #[test]
    fn group_states_round_trip_in_the_current_schema(
        appends in proptest::collection::vec((proptest::collection::vec(any::<u8>(), 1..64), 0u64..3), 0..20),
    ) {
        // One stream, so the encoding's map order is fixed; producers, bytes and buckets vary.
        let mut g = GroupState::new(1);
        let _ = g.apply(1, &Command { now_ms: 1, op: Op::CreateBucket { bucket: "golden".into() } });
        let create = Op::Create(Box::new(CreateReq {
            content_type: Some("text/plain".into()),
            ..CreateReq::new(key())
        }));
        let r = g.apply(2, &Command { now_ms: 1, op: create });
        prop_assert!(r.is_ok(), "create: {:?}", r);
        let mut seqs = [0u64; 3];
        for (i, (payload, p)) in appends.into_iter().enumerate() {
            let producer = (p > 0).then(|| {
                let seq = seqs[p as usize];
                seqs[p as usize] += 1;
                ProducerHdr { id: format!("p{p}"), epoch: 0, seq }
            });
            let op = Op::Append(Box::new(AppendReq {
                content_type: Some("text/plain".into()),
                producer,
                ..AppendReq::new(key(), Bytes::from(payload))
            }));
            let r = g.apply(i as u64 + 3, &Command { now_ms: 2, op });
            prop_assert!(r.is_ok(), "append: {:?}", r);
        }
        let enc = g.encode().unwrap();
        prop_assert_eq!(enc.len(), g.encoded_len().unwrap());
        // Only the current schema reads what this build writes (schema-1 bytes decode through
        // the frozen types; see the golden files): that schema-2 bytes also parsed as schema 1
        // was a coincidence of the layouts, which the snapshot reference ended.
        let back = GroupState::decode(Schema::CURRENT, &enc).unwrap();
        prop_assert_eq!(&back.encode().unwrap(), &enc);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        for schema in Schema::READABLE {
            let _ = Command::decode(schema, &bytes);
            let _ = GroupState::decode(schema, &bytes);
        }
    }

    #[test]
    fn corrupted_golden_commands_decode_or_fail_cleanly(at in any::<usize>(), bit in 0u8..8) {
        for cmd in samples() {
            let mut buf = Vec::new();
            cmd.encode_into(&mut buf).unwrap();
            let i = at % buf.len();
            buf[i] ^= 1 << bit;
            let _ = Command::decode(Schema::CURRENT, &buf);
            prop_assert!(Command::decode(Schema::CURRENT, &buf[..i]).is_err());
        }
    }
}
