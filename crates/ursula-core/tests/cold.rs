//! The cold tier's replicated bookkeeping (cluster.md §6.2-§6.5), through `GroupState::apply`:
//! random appends, flushes, retention, forks, deletes and GC passes against a model of
//! every stream's bytes and a model object store. After every step every byte a stream
//! still holds reads back, through its read plan, equal to what was appended, and GC never
//! deletes an object a reference still uses.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod cold_world;

use cold_world::{NAMES, World, key};
use proptest::prelude::*;
use ursula_core::cold::{FlushReq, FlushRule, FlushSlice, GroupSizes, ObjectId};
use ursula_core::{GroupState, Op};

#[derive(Debug, Clone)]
enum Step {
    Append(usize, usize),
    External(usize, usize, u8),
    Flush(u64, bool),
    Retain(usize, u8),
    Delete(usize),
    Fork(usize),
    DropFork,
    Gc,
    Snapshot,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0..NAMES.len(), 1usize..200_000).prop_map(|(s, n)| Step::Append(s, n)),
        3 => (0..NAMES.len(), 1usize..300_000, 0u8..3).prop_map(|(s, n, k)| Step::External(s, n, k)),
        3 => (1u64..300_000, any::<bool>()).prop_map(|(m, r)| Step::Flush(m, r)),
        2 => (0..NAMES.len(), any::<u8>()).prop_map(|(s, f)| Step::Retain(s, f)),
        1 => (0..NAMES.len()).prop_map(Step::Delete),
        1 => (0..NAMES.len()).prop_map(Step::Fork),
        1 => Just(Step::DropFork),
        2 => Just(Step::Gc),
        1 => Just(Step::Snapshot),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn cold_bytes_read_back_exact_and_gc_never_deletes_what_is_used(
        steps in prop::collection::vec(step(), 1..60)
    ) {
        let mut w = World::new();
        for st in steps {
            match st {
                Step::Append(s, n) => w.append(NAMES[s], n),
                Step::External(s, n, k) => w.append_external(NAMES[s], n, k),
                Step::Flush(m, r) => w.flush(m, r),
                Step::Retain(s, f) => w.retain(NAMES[s], f),
                Step::Delete(s) => w.delete(NAMES[s]),
                Step::Fork(s) => w.fork(NAMES[s]),
                Step::DropFork => w.drop_fork(),
                Step::Gc => w.gc(),
                Step::Snapshot => {
                    // A replica restarting from a snapshot sees the same state.
                    let bytes = w.g.encode().unwrap();
                    w.g = GroupState::decode(ursula_core::Schema::CURRENT, &bytes).unwrap();
                }
            }
            w.check();
        }
    }
}

#[test]
fn a_stale_flush_publishes_nothing_and_its_object_is_collected() {
    let mut w = World::new();
    w.append("a", 100);
    let c = w.g.pick_flush(&FlushRule::any(1 << 20)).picked;
    assert_eq!(c.len(), 1);
    // Retention drops every byte before the flush commits.
    w.retain("a", 255);
    let req = FlushReq {
        namespace: 0,
        object: ObjectId(w.g.cold.next_object),
        object_len: 100,
        slices: vec![FlushSlice {
            key: c[0].key.clone(),
            incarnation: c[0].incarnation,
            start: c[0].start,
            end: c[0].end,
            pos: 0,
        }],
    };
    w.store.insert(req.object, vec![0; 100]);
    w.apply(Op::ColdFlush(Box::new(req.clone()))).unwrap();
    assert!(w.g.cold.gc.contains(&req.object));
    assert!(w.g.cold.objects.is_empty());
    w.check();
}

#[test]
fn a_flush_after_partial_retention_references_only_what_is_left() {
    let mut w = World::new();
    w.append("a", 100);
    let c = w.g.pick_flush(&FlushRule::any(1 << 20)).picked;
    w.retain("a", 128); // retains from offset 50
    let held = w.g.streams[&key("a")].data_start;
    assert!(held > 0 && held < 100);
    let object = ObjectId(w.g.cold.next_object);
    w.store.insert(object, w.model["a"].clone());
    w.apply(Op::ColdFlush(Box::new(FlushReq {
        namespace: 0,
        object,
        object_len: 100,
        slices: vec![FlushSlice {
            key: c[0].key.clone(),
            incarnation: c[0].incarnation,
            start: 0,
            end: 100,
            pos: 0,
        }],
    })))
    .unwrap();
    let s = &w.g.streams[&key("a")];
    assert_eq!(s.hot_len(), 0);
    assert_eq!(s.held_start(), held);
    w.check();
}

#[test]
fn candidates_prefer_the_largest_hot_ranges_and_respect_the_size() {
    let mut w = World::new();
    w.append("a", 10);
    w.append("b", 1000);
    w.append("c", 100);
    let c = w.g.pick_flush(&FlushRule::any(1050)).picked;
    let names: Vec<(&str, u64)> = c
        .iter()
        .map(|c| (c.key.stream(), c.end - c.start))
        .collect();
    assert_eq!(names, vec![("b", 1000), ("c", 50)]);
    assert_eq!(w.g.hot_bytes(), 1110);
}

#[test]
fn sizes_count_streams_hot_and_cold_bytes_and_objects() {
    let mut w = World::new();
    w.append("a", 100);
    w.append("b", 50);
    let before = GroupSizes {
        streams: 2,
        hot_bytes: 150,
        ..GroupSizes::default()
    };
    assert_eq!(w.g.sizes(), before);
    w.flush(1 << 20, false);
    let after = w.g.sizes();
    assert_eq!(
        (
            after.streams,
            after.hot_bytes,
            after.cold_bytes,
            after.cold_objects
        ),
        (2, 0, 150, 1)
    );
    assert_eq!(after.hot_bytes, w.g.hot_bytes());
    w.check();
}

#[test]
fn orphans_and_flushes_that_lost_a_race_are_collected() {
    let mut w = World::new();
    w.append("a", 100);
    // A leader found object 0 already uploaded by an attempt that never committed.
    w.apply(Op::ColdFlush(Box::new(FlushReq {
        namespace: 0,
        object: ObjectId(0),
        object_len: 0,
        slices: Vec::new(),
    })))
    .unwrap();
    assert!(w.g.cold.gc.contains(&ObjectId(0)));
    assert_eq!(w.g.cold.next_object, 1);
    w.store.insert(ObjectId(0), Vec::new());
    w.flush(1 << 20, false); // object 1
    assert!(w.g.cold.objects.contains_key(&ObjectId(1)));
    // A flush of an id already passed (a former leader's late proposal) references nothing.
    let c = FlushSlice {
        key: key("a"),
        incarnation: w.g.streams[&key("a")].incarnation,
        start: 0,
        end: 100,
        pos: 0,
    };
    w.store.insert(ObjectId(0), vec![0; 100]);
    w.apply(Op::ColdFlush(Box::new(FlushReq {
        namespace: 0,
        object: ObjectId(0),
        object_len: 100,
        slices: vec![c],
    })))
    .unwrap();
    assert!(w.g.cold.gc.contains(&ObjectId(0)));
    w.check();
    w.gc();
    assert!(w.g.cold.gc.is_empty());
    w.check();
}

#[test]
fn the_first_flush_sets_the_namespace_and_others_are_ignored() {
    let mut w = World::new();
    w.append("a", 100);
    let inc = w.g.streams[&key("a")].incarnation;
    let slice = |start, end| FlushSlice {
        key: key("a"),
        incarnation: inc,
        start,
        end,
        pos: 0,
    };
    let first = w.model["a"][..50].to_vec();
    w.store.insert(ObjectId(0), first);
    w.apply(Op::ColdFlush(Box::new(FlushReq {
        namespace: 7,
        object: ObjectId(0),
        object_len: 50,
        slices: vec![slice(0, 50)],
    })))
    .unwrap();
    assert_eq!(w.g.cold.namespace, 7);
    // A flush under another namespace (a racing former leader's) is not this group's.
    w.apply(Op::ColdFlush(Box::new(FlushReq {
        namespace: 8,
        object: ObjectId(1),
        object_len: 50,
        slices: vec![slice(50, 100)],
    })))
    .unwrap();
    assert_eq!(w.g.streams[&key("a")].hot_len(), 50);
    assert!(!w.g.cold.gc.contains(&ObjectId(1)) && w.g.cold.next_object == 1);
    w.check();
}

/// A JSON stream with an external payload between hot bytes: record boundaries come from the
/// command, flushes take only the hot runs around it, retention inside it keeps the whole
/// reference, and past it releases the object.
#[test]
fn json_external_payloads_keep_records_and_flush_around_them() {
    use bytes::Bytes;
    use ursula_core::cold::Piece;
    use ursula_core::command::{AppendReq, At, CreateReq, PublishSnapshotReq};
    use ursula_core::external::{ExternalAppend, ExternalPayload};
    use ursula_core::snapshot::Digest;
    use ursula_core::{Command, Reply};
    const JSON: &str = "application/json";
    let mut g = GroupState::new(0);
    let mut i = 0;
    let mut apply = |g: &mut GroupState, op: Op| {
        i += 1;
        g.apply(
            i,
            &Command {
                now_ms: 1000 + i,
                op,
            },
        )
    };
    let k = key("j");
    let ok = apply(
        &mut g,
        Op::Create(Box::new(CreateReq {
            content_type: Some(JSON.into()),
            ..CreateReq::new(k.clone())
        })),
    );
    assert!(ok.is_ok());
    let inline = |body: &'static [u8], n| {
        Op::Append(Box::new(AppendReq {
            content_type: Some(JSON.into()),
            messages: n,
            ..AppendReq::new(k.clone(), Bytes::from_static(body))
        }))
    };
    let ext = |id: u64, len: u64, ends: Vec<u64>| {
        Op::AppendExternal(Box::new(ExternalAppend {
            req: AppendReq {
                content_type: Some(JSON.into()),
                messages: ends.len() as u64,
                ..AppendReq::new(k.clone(), Bytes::new())
            },
            payload: ExternalPayload {
                namespace: 0,
                object: ObjectId(ObjectId::EXTERNAL_BIT | id),
                len,
                object_size: len + 32,
                ends,
            },
        }))
    };
    apply(&mut g, inline(b"{\"a\":1}\n", 1)).unwrap(); // [0, 8)
    apply(&mut g, ext(1, 9, vec![2, 5, 9])).unwrap(); // "1\n22\n333\n" at [8, 17)
    apply(&mut g, inline(b"4\n", 1)).unwrap(); // [17, 19)
    // A reference whose message ends do not close the payload is refused, and its object
    // queued for deletion.
    let bad = apply(&mut g, ext(2, 9, vec![2, 5]));
    assert!(bad.is_err());
    assert!(g.cold.gc.contains(&ObjectId(ObjectId::EXTERNAL_BIT | 2)));
    let s = &g.streams[&k];
    assert_eq!((s.tail, s.record_next(), s.hot_len()), (19, 5, 10));
    assert_eq!(s.ends, vec![8, 10, 13, 17, 19]);
    // The flush takes the two hot runs, never the external bytes.
    let c = g.pick_flush(&FlushRule::any(1 << 20)).picked;
    let runs: Vec<(u64, u64)> = c.iter().map(|c| (c.start, c.end)).collect();
    assert_eq!(runs, vec![(0, 8), (17, 19)]);
    // Retention at record 2 (offset 10, inside the external payload).
    let blob = Bytes::from_static(b"{}");
    apply(
        &mut g,
        Op::PublishSnapshot(Box::new(PublishSnapshotReq {
            key: k.clone(),
            incarnation: None,
            at: At::Record(4),
            content_type: JSON.into(),
            digest: Digest::of(JSON, &blob),
            snapshot_match: None,
            blob,
        })),
    )
    .unwrap();
    let r = apply(
        &mut g,
        Op::Retain {
            key: k.clone(),
            at: At::Record(2),
            incarnation: None,
        },
    );
    assert!(matches!(r, Ok(Reply::Retained(_))), "{r:?}");
    let s = &g.streams[&k];
    assert_eq!((s.hot_len(), s.data_start, s.held_start()), (2, 17, 8));
    let mut plan = Vec::new();
    assert!(s.plan_own(10, 19, &mut plan));
    assert!(
        matches!(plan[0], Piece::Cold { pos: 2, len: 7, .. }),
        "{plan:?}"
    );
    assert!(matches!(&plan[1], Piece::Hot(b) if &b[..] == b"4\n"));
    // Retention past it releases the object.
    apply(
        &mut g,
        Op::Retain {
            key: k.clone(),
            at: At::Record(4),
            incarnation: None,
        },
    )
    .unwrap();
    assert!(g.cold.gc.contains(&ObjectId(ObjectId::EXTERNAL_BIT | 1)));
    assert!(g.cold.objects.is_empty());
    assert_eq!(g.streams[&k].record_next(), 5);
}
