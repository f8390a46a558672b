//! Idempotent producers and offsets through `GroupState::apply`: random interleavings of new
//! appends, retries, sequence gaps, epoch bumps and plain appends never duplicate or lose a
//! write, and offsets only grow. Plus sliding-TTL decisions driven by an injected clock.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

use bytes::Bytes;
use proptest::prelude::*;
use ursula_core::command::*;
use ursula_core::{Command, ErrorCode, GroupState, Op, Reply, Response, StreamKey};

const CT: &str = "application/octet-stream";

fn key() -> StreamKey {
    StreamKey::new("test", "s")
}

struct Harness {
    g: GroupState,
    index: u64,
    now: u64,
}

impl Harness {
    fn new() -> Self {
        Harness {
            g: GroupState::new(0),
            index: 0,
            now: 1_000_000,
        }
    }

    fn apply(&mut self, op: Op) -> Response {
        self.index += 1;
        self.g.apply(
            self.index,
            &Command {
                now_ms: self.now,
                op,
            },
        )
    }

    fn create(&mut self, lifetime: Lifetime) -> Response {
        self.apply(Op::Create(Box::new(CreateReq {
            content_type: Some(CT.into()),
            lifetime,
            ..CreateReq::new(key())
        })))
    }

    fn append(&mut self, producer: Option<ProducerHdr>, body: &[u8]) -> Response {
        self.apply(Op::Append(Box::new(AppendReq {
            content_type: Some(CT.into()),
            producer,
            ..AppendReq::new(key(), Bytes::copy_from_slice(body))
        })))
    }

    fn bytes(&self) -> Vec<u8> {
        self.g
            .streams
            .get(&key())
            .map(|s| s.data.to_vec())
            .unwrap_or_default()
    }

    fn tail(&self) -> u64 {
        self.g.streams.get(&key()).map_or(0, |s| s.tail)
    }
}

#[derive(Debug, Clone)]
enum Action {
    /// The producer's next request.
    Send(usize),
    /// A retry of the producer's last accepted request (same epoch and seq).
    Retry(usize),
    /// A request that skips a sequence number.
    Gap(usize),
    /// The producer restarts with a higher epoch.
    Bump(usize),
    /// A zombie with the previous epoch tries to write.
    Stale(usize),
    /// An append without producer headers.
    Plain,
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        4 => (0..3usize).prop_map(Action::Send),
        2 => (0..3usize).prop_map(Action::Retry),
        1 => (0..3usize).prop_map(Action::Gap),
        1 => (0..3usize).prop_map(Action::Bump),
        1 => (0..3usize).prop_map(Action::Stale),
        1 => Just(Action::Plain),
    ]
}

#[derive(Default, Clone)]
struct Model {
    epoch: u64,
    next_seq: u64,
    /// (seq, body, next offset the original request received)
    last: Option<(u64, Vec<u8>, u64)>,
    /// The server has accepted a request of this producer (in any epoch).
    sent_any: bool,
    /// The server has accepted a request in the current epoch.
    established: bool,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn producers_never_duplicate_and_offsets_only_grow(actions in prop::collection::vec(action(), 1..80)) {
        let mut h = Harness::new();
        prop_assert!(h.create(Lifetime::default()).is_ok());
        let mut models = vec![Model::default(); 3];
        let mut expected: Vec<u8> = Vec::new();
        let mut counter = 0u64;
        let mut last_tail = 0u64;
        for a in actions {
            counter += 1;
            match a {
                Action::Send(p) => {
                    let m = &mut models[p];
                    let body = format!("p{p}-e{}-s{}-{counter}\n", m.epoch, m.next_seq).into_bytes();
                    let hdr = ProducerHdr { id: format!("p{p}"), epoch: m.epoch, seq: m.next_seq };
                    match h.append(Some(hdr), &body) {
                        Ok(Reply::Appended(r)) => {
                            prop_assert!(!r.duplicate);
                            prop_assert_eq!(r.producer, Some((m.epoch, m.next_seq)));
                            expected.extend_from_slice(&body);
                            prop_assert_eq!(r.next_offset, expected.len() as u64);
                            m.last = Some((m.next_seq, body, r.next_offset));
                            m.next_seq += 1;
                            m.sent_any = true;
                            m.established = true;
                        }
                        other => prop_assert!(false, "send refused: {:?}", other),
                    }
                }
                Action::Retry(p) => {
                    let m = models[p].clone();
                    let Some((seq, body, next)) = m.last else { continue };
                    let hdr = ProducerHdr { id: format!("p{p}"), epoch: m.epoch, seq };
                    match h.append(Some(hdr), &body) {
                        Ok(Reply::Appended(r)) => {
                            prop_assert!(r.duplicate, "a retry must be recognised");
                            prop_assert_eq!(r.next_offset, next, "a retry reports the original offset");
                        }
                        other => prop_assert!(false, "retry refused: {:?}", other),
                    }
                }
                Action::Gap(p) => {
                    let m = &models[p];
                    let seq = m.next_seq + 1;
                    let hdr = ProducerHdr { id: format!("p{p}"), epoch: m.epoch, seq };
                    let err = h.append(Some(hdr), b"gap\n").expect_err("a gap is refused");
                    if m.established || !m.sent_any {
                        prop_assert_eq!(err.code, ErrorCode::PRODUCER_SEQ_CONFLICT);
                        prop_assert_eq!(err.facts.expected_seq, Some(m.next_seq));
                    } else {
                        // A new epoch must start at sequence 0.
                        prop_assert_eq!(err.code, ErrorCode::INVALID_PRODUCER);
                    }
                }
                Action::Bump(p) => {
                    let m = &mut models[p];
                    m.epoch += 1;
                    m.next_seq = 0;
                    m.last = None;
                    m.established = false;
                }
                Action::Stale(p) => {
                    let m = &models[p];
                    if m.epoch == 0 || !m.established {
                        continue; // the new epoch is not on the server yet
                    }
                    let hdr = ProducerHdr { id: format!("p{p}"), epoch: m.epoch - 1, seq: 0 };
                    let err = h.append(Some(hdr), b"zombie\n").expect_err("a stale epoch is fenced");
                    prop_assert_eq!(err.code, ErrorCode::PRODUCER_EPOCH_STALE);
                    prop_assert_eq!(err.facts.producer_epoch, Some(m.epoch));
                }
                Action::Plain => {
                    let body = format!("plain-{counter}\n").into_bytes();
                    prop_assert!(h.append(None, &body).is_ok());
                    expected.extend_from_slice(&body);
                }
            }
            let tail = h.tail();
            prop_assert!(tail >= last_tail, "offsets only grow");
            last_tail = tail;
            prop_assert_eq!(h.bytes(), expected.clone(), "stream holds exactly the accepted writes");
        }
    }
}

#[test]
fn sliding_ttl_follows_the_injected_clock() {
    let mut h = Harness::new();
    let t0 = h.now;
    assert!(
        h.create(Lifetime {
            ttl_s: Some(2),
            expires_at_ms: None
        })
        .is_ok()
    );
    h.now = t0 + 1500;
    assert!(
        h.append(None, b"a").is_ok(),
        "alive before the window ends; the append renews it"
    );
    h.now = t0 + 3400;
    assert!(
        h.append(None, b"b").is_ok(),
        "renewed at 1500, so alive until 3500"
    );
    h.now = t0 + 3400 + 2000;
    let err = h.append(None, b"c").expect_err("expired");
    assert_eq!(err.code, ErrorCode::STREAM_NOT_FOUND);
    assert!(
        h.g.streams.is_empty(),
        "an expired stream without forks is removed"
    );
    assert!(
        matches!(h.create(Lifetime::default()), Ok(Reply::Created(c)) if c.created),
        "the path can be created again"
    );
}

#[test]
fn absolute_expiry_is_never_renewed() {
    let mut h = Harness::new();
    let t0 = h.now;
    assert!(
        h.create(Lifetime {
            ttl_s: None,
            expires_at_ms: Some(t0 + 1000)
        })
        .is_ok()
    );
    h.now = t0 + 999;
    assert!(h.append(None, b"a").is_ok());
    h.now = t0 + 1000;
    assert_eq!(
        h.append(None, b"b").expect_err("expired").code,
        ErrorCode::STREAM_NOT_FOUND
    );
}

#[test]
fn purge_removes_a_bucket_and_fences_it() {
    let mut h = Harness::new();
    assert!(h.create(Lifetime::default()).is_ok());
    assert!(h.append(None, b"x").is_ok());
    let r = h.apply(Op::PurgeBucket {
        bucket: "test".into(),
    });
    assert_eq!(r, Ok(Reply::Purged { removed: 1 }));
    assert_eq!(
        h.create(Lifetime::default()).expect_err("fenced").code,
        ErrorCode::BUCKET_NOT_FOUND
    );
    assert_eq!(
        h.apply(Op::PurgeBucket {
            bucket: "test".into()
        }),
        Ok(Reply::Purged { removed: 0 })
    );
    // The compatibility bucket is emptied but stays usable.
    let compat = StreamKey::new("__compat_v1", "c");
    let create = |key: StreamKey| Op::Create(Box::new(CreateReq::new(key)));
    assert!(h.apply(create(compat.clone())).is_ok());
    assert_eq!(
        h.apply(Op::PurgeBucket {
            bucket: "__compat_v1".into()
        }),
        Ok(Reply::Purged { removed: 1 })
    );
    assert!(h.apply(create(compat)).is_ok());
}
