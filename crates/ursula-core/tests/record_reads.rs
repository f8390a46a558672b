//! Record-aware reads (extensions.md §11.6-§11.7, §11.10) against a model: random appends of
//! JSON records, snapshots with retention at random records, and reads from every kind of
//! start, with and without `max_records` and byte caps, through `GroupState::apply`.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

use bytes::Bytes;
use proptest::prelude::*;
use ursula_core::command::*;
use ursula_core::records::{RecordStart, envelope_into};
use ursula_core::snapshot::Digest;
use ursula_core::stream::StreamState;
use ursula_core::{Command, ErrorCode, GroupState, Op, Reply, Response, StreamKey};

const CT: &str = "application/json";

struct Group {
    g: GroupState,
    index: u64,
}

impl Group {
    fn new() -> Group {
        let mut g = Group {
            g: GroupState::new(0),
            index: 0,
        };
        let r = g.apply(Op::Create(Box::new(CreateReq {
            content_type: Some(CT.into()),
            ..CreateReq::new(key())
        })));
        assert!(matches!(r, Ok(Reply::Created(_))), "{r:?}");
        g
    }

    fn apply(&mut self, op: Op) -> Response {
        self.index += 1;
        self.g.apply(
            self.index,
            &Command {
                now_ms: 1_000_000 + self.index,
                op,
            },
        )
    }

    fn append(&mut self, lines: &[String]) -> AppendReply {
        let payload: String = lines.iter().map(|l| format!("{l}\n")).collect();
        let r = self.apply(Op::Append(Box::new(AppendReq {
            content_type: Some(CT.into()),
            messages: lines.len() as u64,
            ..AppendReq::new(key(), Bytes::from(payload))
        })));
        match r {
            Ok(Reply::Appended(a)) => a,
            other => panic!("append: {other:?}"),
        }
    }

    /// Publishes a snapshot at record `n` (no lower than the last one: a repeat is
    /// idempotent) and retains up to it.
    fn checkpoint(&mut self, n: u64) {
        let blob = format!("state-{n}").into_bytes();
        let ct = "application/octet-stream".to_owned();
        let r = self.apply(Op::PublishSnapshot(Box::new(PublishSnapshotReq {
            key: key(),
            incarnation: None,
            at: At::Record(n),
            digest: Digest::of(&ct, &blob),
            content_type: ct,
            snapshot_match: None,
            blob: Bytes::from(blob),
        })));
        assert!(r.is_ok(), "publish at record {n}: {r:?}");
        let r = self.apply(Op::Retain {
            key: key(),
            at: At::Record(n),
            incarnation: None,
        });
        assert!(r.is_ok(), "retain at record {n}: {r:?}");
    }

    fn stream(&self) -> &StreamState {
        self.g.streams.get(&key()).expect("stream exists")
    }
}

fn key() -> StreamKey {
    StreamKey::new("recs", "s")
}

/// A JSON value of `len` bytes or so, naming its record so that misplaced bytes show.
fn record_text(n: u64, len: usize) -> String {
    format!("{{\"n\":{n},\"pad\":\"{}\"}}", "x".repeat(len))
}

#[derive(Debug, Clone)]
enum Action {
    Append(Vec<usize>),
    Checkpoint(u16),
    Read(StartKind, u64, Option<u64>, u64),
}

#[derive(Debug, Clone, Copy)]
enum StartKind {
    Now,
    Tail,
    At,
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        4 => prop::collection::vec(0usize..40, 1..6).prop_map(Action::Append),
        1 => any::<u16>().prop_map(Action::Checkpoint),
        5 => (
            prop_oneof![Just(StartKind::Now), Just(StartKind::Tail), Just(StartKind::At)],
            0u64..40,
            prop::option::of(1u64..6),
            1u64..200,
        )
            .prop_map(|(k, n, m, b)| Action::Read(k, n, m, b)),
    ]
}

/// Checks one read against the model: `records` holds every record ever appended, the
/// first `first` of them retired by retention.
fn check_read(
    g: &Group,
    records: &[String],
    first: u64,
    start: RecordStart,
    max: Option<u64>,
    cap: u64,
) {
    let s = g.stream();
    let tail = records.len() as u64;
    assert_eq!((s.record_first(), s.record_next()), (first, tail));
    let resolved = s.resolve_record_start(start);
    let want = match start {
        RecordStart::Now => Ok(tail),
        RecordStart::Tail(k) => Ok(tail.saturating_sub(k).max(first)),
        RecordStart::At(n) if n > tail => Err(ErrorCode::INVALID_RECORD_BOUNDARIES),
        RecordStart::At(n) if n < first => Err(ErrorCode::STREAM_GONE),
        RecordStart::At(n) => Ok(n),
    };
    assert_eq!(
        resolved.as_ref().map_err(|r| r.code).copied(),
        want,
        "{start:?}"
    );
    let Ok(n) = resolved else {
        let facts = &resolved.unwrap_err().facts;
        assert_eq!(
            (facts.record_first, facts.record_next),
            (Some(first), Some(tail))
        );
        return;
    };
    let w = s.record_window(n, max, cap);
    assert_eq!((w.first, w.start, w.tail), (first, n, tail));
    let limit = max.map_or(tail, |m| (n + m).min(tail));
    assert!(w.next <= limit, "{w:?} passes {limit}");
    assert_eq!(w.next > n, n < tail, "progress iff records remain: {w:?}");
    let mut bytes = Vec::new();
    s.copy_own_bytes(w.start_offset, w.end_offset, &mut bytes);
    let want: String = records[n as usize..w.next as usize]
        .iter()
        .map(|r| format!("{r}\n"))
        .collect();
    assert_eq!(String::from_utf8(bytes.clone()).unwrap(), want, "{w:?}");
    // The byte cap holds unless one record alone is larger, and the window is the
    // longest that fits.
    let len = |a: u64, b: u64| -> u64 {
        records[a as usize..b as usize]
            .iter()
            .map(|r| r.len() as u64 + 1)
            .sum()
    };
    assert!(len(n, w.next) <= cap || w.next == n + 1, "{w:?} over {cap}");
    if w.next < limit {
        assert!(len(n, w.next + 1) > cap, "{w:?} stopped early under {cap}");
    }
    // The offsets are the records' own: an offset read from O(start) sees the same bytes.
    assert_eq!(s.offset_of_record(n), Some(w.start_offset));
    assert_eq!(s.record_at(w.end_offset), Some(w.next));
    // The envelope names each record by its ordinal and holds its value.
    let mut env = Vec::new();
    envelope_into(&bytes, n, &mut env);
    for (i, line) in env
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .enumerate()
    {
        let v: serde_json::Value = serde_json::from_slice(line).unwrap();
        let r = n + i as u64;
        assert_eq!(v["record"], r);
        assert_eq!(
            v["value"],
            serde_json::from_str::<serde_json::Value>(&records[r as usize]).unwrap()
        );
    }
}

fn run(actions: Vec<Action>) {
    let mut g = Group::new();
    let mut records: Vec<String> = Vec::new();
    let mut first = 0u64;
    for a in actions {
        match a {
            Action::Append(sizes) => {
                let start = records.len() as u64;
                let lines: Vec<String> = sizes
                    .iter()
                    .enumerate()
                    .map(|(i, len)| record_text(start + i as u64, *len))
                    .collect();
                let ack = g.append(&lines);
                assert_eq!(
                    (ack.record_start, ack.record_next),
                    (start, start + lines.len() as u64)
                );
                records.extend(lines);
            }
            Action::Checkpoint(pick) => {
                let tail = records.len() as u64;
                let n = first + u64::from(pick) % (tail - first + 1);
                g.checkpoint(n);
                first = first.max(n);
            }
            Action::Read(kind, n, max, cap) => {
                let start = match kind {
                    StartKind::Now => RecordStart::Now,
                    StartKind::Tail => RecordStart::Tail(n),
                    StartKind::At => RecordStart::At(n),
                };
                check_read(&g, &records, first, start, max, cap);
            }
        }
        // Retention never renumbers: N - F is the number of retained records.
        let s = g.stream();
        assert_eq!(
            s.record_next() - s.record_first(),
            records.len() as u64 - first
        );
    }
    // Finally every retained record is read back in windows, continuing from each
    // window's next ordinal, and the whole history before F is gone.
    let tail = records.len() as u64;
    let mut at = first;
    while at < tail {
        let s = g.stream();
        let w = s.record_window(
            s.resolve_record_start(RecordStart::At(at)).unwrap(),
            Some(3),
            64,
        );
        assert!(w.next > at);
        at = w.next;
    }
    if first > 0 {
        let gone = g.stream().resolve_record_start(RecordStart::At(first - 1));
        assert_eq!(gone.unwrap_err().code, ErrorCode::STREAM_GONE);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn record_reads_match_the_model(actions in prop::collection::vec(action(), 1..40)) {
        run(actions);
    }
}

#[test]
fn non_json_streams_have_no_record_reads() {
    let mut g = Group::new();
    let r = g.apply(Op::Create(Box::new(CreateReq {
        content_type: Some("text/plain".into()),
        ..CreateReq::new(StreamKey::new("recs", "t"))
    })));
    assert!(r.is_ok());
    let s = g.g.streams.get(&StreamKey::new("recs", "t")).unwrap();
    for start in [RecordStart::Now, RecordStart::At(0), RecordStart::Tail(1)] {
        assert_eq!(
            s.resolve_record_start(start).unwrap_err().code,
            ErrorCode::INVALID_RECORD_BOUNDARIES
        );
    }
}

#[test]
fn the_issue_example_record_now_is_empty_at_the_tail() {
    let mut g = Group::new();
    g.append(&["1".into(), "2".into(), "3".into()]);
    let s = g.stream();
    let n = s.resolve_record_start(RecordStart::Now).unwrap();
    let w = s.record_window(n, None, 1 << 20);
    assert_eq!(
        (w.start, w.next, w.start_offset, w.end_offset),
        (3, 3, 6, 6)
    );
    assert!(w.up_to_date());
}
