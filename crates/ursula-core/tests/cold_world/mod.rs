//! The model world of the cold-tier property tests (`tests/cold.rs`): a group state driven
//! through `GroupState::apply` the way a leader drives it, a model of every stream's bytes and
//! a model object store, and the checks run after every step.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    dead_code,
    reason = "test code"
)]

use bytes::Bytes;
use std::collections::{BTreeMap, HashMap};
use ursula_core::cold::{FlushReq, FlushRule, FlushSlice, ObjectId, Piece};
use ursula_core::command::*;
use ursula_core::snapshot::Digest;
use ursula_core::{Command, GroupState, Op, Reply, Response, StreamKey};

pub const OCTET: &str = "application/octet-stream";
pub const NAMES: [&str; 3] = ["a", "b", "c"];

pub struct World {
    pub g: GroupState,
    pub index: u64,
    pub now: u64,
    /// Everything each live stream (by name) ever had appended, from offset 0.
    pub model: HashMap<String, Vec<u8>>,
    /// The object store: what was uploaded and not yet deleted.
    pub store: BTreeMap<ObjectId, Vec<u8>>,
    /// Objects the GC deleted.
    pub deleted: Vec<ObjectId>,
    pub next_pin: u64,
    pub forks: u64,
    /// Per stream: the next producer seq of producer `p` (reset when the stream goes).
    pub seqs: HashMap<String, u64>,
    /// Ids handed to external payload uploads.
    pub next_external: u64,
}

impl World {
    pub fn new() -> World {
        World {
            g: GroupState::new(0),
            index: 0,
            now: 1_000_000,
            model: HashMap::new(),
            store: BTreeMap::new(),
            deleted: Vec::new(),
            next_pin: 1,
            forks: 0,
            seqs: HashMap::new(),
            next_external: 1,
        }
    }

    pub fn apply(&mut self, op: Op) -> Response {
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

    pub fn ensure(&mut self, name: &str) {
        if self.model.contains_key(name) {
            return;
        }
        let r = self.apply(Op::Create(Box::new(CreateReq {
            content_type: Some(OCTET.into()),
            ..CreateReq::new(key(name))
        })));
        assert!(matches!(r, Ok(Reply::Created(_))), "create {name}: {r:?}");
        self.model.insert(name.to_owned(), Vec::new());
    }

    pub fn append(&mut self, name: &str, len: usize) {
        if self
            .g
            .streams
            .get(&key(name))
            .is_some_and(|s| s.soft_deleted)
        {
            return; // deleted while a fork still reads it: its path stays taken
        }
        self.ensure(name);
        let m = self.model.get_mut(name).unwrap();
        let start = m.len();
        let bytes: Vec<u8> = (start..start + len)
            .map(|i| (i as u8) ^ name.as_bytes()[0])
            .collect();
        m.extend_from_slice(&bytes);
        let r = self.apply(Op::Append(Box::new(AppendReq {
            content_type: Some(OCTET.into()),
            ..AppendReq::new(key(name), Bytes::from(bytes))
        })));
        assert!(matches!(r, Ok(Reply::Appended(_))), "append {name}: {r:?}");
    }

    /// An append whose body goes to the store first (cluster.md §6.4). `kind` 0: a plain
    /// one; 1: a producer append, then its retry (a duplicate, which must not append twice
    /// and must not leak its second upload); 2: one the stream refuses (content type).
    pub fn append_external(&mut self, name: &str, len: usize, kind: u8) {
        if self
            .g
            .streams
            .get(&key(name))
            .is_some_and(|s| s.soft_deleted)
        {
            return;
        }
        let fresh = !self.model.contains_key(name);
        let start = self.model.get(name).map_or(0, Vec::len);
        let bytes: Vec<u8> = (start..start + len)
            .map(|i| (i as u8) ^ name.as_bytes()[0] ^ 0x5a)
            .collect();
        let producer = (kind == 1).then(|| ProducerHdr {
            id: "p".into(),
            epoch: 0,
            seq: *self.seqs.get(name).unwrap_or(&0),
        });
        let payload = self.upload(&bytes);
        let r = if fresh && kind != 2 {
            self.apply(Op::CreateExternal(Box::new(
                ursula_core::external::ExternalCreate {
                    req: CreateReq {
                        content_type: Some(OCTET.into()),
                        producer: producer.clone(),
                        ..CreateReq::new(key(name))
                    },
                    payload,
                },
            )))
            .map(|_| ())
        } else {
            self.ensure(name);
            let ct = if kind == 2 { "text/plain" } else { OCTET };
            self.apply(Op::AppendExternal(Box::new(
                ursula_core::external::ExternalAppend {
                    req: AppendReq {
                        content_type: Some(ct.into()),
                        producer: producer.clone(),
                        ..AppendReq::new(key(name), Bytes::new())
                    },
                    payload,
                },
            )))
            .map(|_| ())
        };
        if kind == 2 {
            assert!(r.is_err(), "a mismatched content type is refused");
            return;
        }
        r.unwrap();
        self.model
            .entry(name.to_owned())
            .or_default()
            .extend_from_slice(&bytes);
        let tail = self.model[name].len() as u64;
        assert_eq!(self.g.streams[&key(name)].tail, tail);
        if let Some(p) = producer {
            self.seqs.insert(name.to_owned(), p.seq + 1);
            // The client retries: a new upload, the same seq. Nothing is appended again.
            let again = self.upload(&bytes);
            let r = self.apply(Op::AppendExternal(Box::new(
                ursula_core::external::ExternalAppend {
                    req: AppendReq {
                        content_type: Some(OCTET.into()),
                        producer: Some(p),
                        ..AppendReq::new(key(name), Bytes::new())
                    },
                    payload: again,
                },
            )));
            match r {
                Ok(Reply::Appended(a)) => assert!(a.duplicate && a.next_offset == tail),
                other => panic!("retry: {other:?}"),
            }
            assert_eq!(self.g.streams[&key(name)].tail, tail);
        }
    }

    /// Writes `bytes` as an external payload object of the store.
    pub fn upload(&mut self, bytes: &[u8]) -> ursula_core::external::ExternalPayload {
        let object = ObjectId(ObjectId::EXTERNAL_BIT | self.next_external);
        self.next_external += 1;
        self.store.insert(object, bytes.to_vec());
        ursula_core::external::ExternalPayload {
            namespace: 0,
            object,
            len: bytes.len() as u64,
            object_size: bytes.len() as u64 + 64,
            ends: Vec::new(),
        }
    }

    /// What a leader does: pick ranges, upload their bytes as one object, propose the flush.
    pub fn flush(&mut self, max: u64, repeat: bool) {
        let picked = self.g.pick_flush(&FlushRule::any(max)).picked;
        if picked.is_empty() {
            return;
        }
        let id = ObjectId(self.g.cold.next_object);
        let mut object = Vec::new();
        let mut slices = Vec::new();
        for c in picked {
            let s = self.g.streams.get(&c.key).unwrap();
            let mut plan = Vec::new();
            assert!(s.plan_own(c.start, c.end, &mut plan));
            let pos = object.len() as u64;
            for p in plan {
                match p {
                    Piece::Hot(b) => object.extend_from_slice(&b),
                    Piece::Cold { .. } => panic!("a flush candidate must be hot"),
                }
            }
            slices.push(FlushSlice {
                key: c.key,
                incarnation: c.incarnation,
                start: c.start,
                end: c.end,
                pos,
            });
        }
        let req = FlushReq {
            namespace: 0,
            object: id,
            object_len: object.len() as u64,
            slices,
        };
        self.store.insert(id, object);
        self.apply(Op::ColdFlush(Box::new(req.clone()))).unwrap();
        if repeat {
            // A leader that retries the proposal must not double-count.
            self.apply(Op::ColdFlush(Box::new(req))).unwrap();
        }
    }

    pub fn retain(&mut self, name: &str, frac: u8) {
        let Some(m) = self.model.get(name) else {
            return;
        };
        let at = m.len() as u64 * u64::from(frac) / 255;
        let blob = b"state".to_vec();
        let r = self.apply(Op::PublishSnapshot(Box::new(PublishSnapshotReq {
            key: key(name),
            incarnation: None,
            at: At::Offset(at),
            digest: Digest::of(OCTET, &blob),
            content_type: OCTET.into(),
            snapshot_match: None,
            blob: Bytes::from(blob),
        })));
        if r.is_err() {
            return; // e.g. an older offset than the visible snapshot
        }
        self.apply(Op::Retain {
            key: key(name),
            at: At::Offset(at),
            incarnation: None,
        })
        .unwrap();
    }

    pub fn delete(&mut self, name: &str) {
        self.seqs.remove(name);
        if self.model.remove(name).is_some() {
            self.apply(Op::Delete {
                key: key(name),
                incarnation: None,
            })
            .unwrap();
        }
    }

    /// Forks `name` at its tail: the source's bytes `[retained, tail)` stay held while the
    /// fork lives, whatever its own retention says.
    pub fn fork(&mut self, name: &str) {
        if !self.model.contains_key(name) {
            return;
        }
        self.forks += 1;
        let fork = format!("f{}", self.forks);
        let pin_id = self.next_pin;
        self.next_pin += 1;
        let pinned = match self.apply(Op::Pin(Box::new(PinReq {
            source: key(name),
            fork_key: key(&fork),
            pin_id,
            deadline_ms: self.now + 3_600_000,
            anchor: None,
            sub: 0,
            content_type: None,
        }))) {
            Ok(Reply::Pinned(p)) => p,
            other => panic!("pin: {other:?}"),
        };
        let r = self.apply(Op::Create(Box::new(CreateReq {
            fork: Some(ForkCreate {
                source: key(name),
                anchor: None,
                sub: 0,
                pinned: Some(*pinned),
            }),
            ..CreateReq::new(key(&fork))
        })));
        assert!(matches!(r, Ok(Reply::Created(_))), "fork: {r:?}");
    }

    /// Removes the oldest fork, which releases its pin on the source (the outbox item is
    /// delivered at once, as the server does).
    pub fn drop_fork(&mut self) {
        let Some((fk, _)) = self
            .g
            .streams
            .iter()
            .filter(|(k, s)| k.stream().starts_with('f') && s.fork.is_some())
            .min_by_key(|(k, _)| k.stream().to_owned())
            .map(|(k, s)| (k.clone(), s.clone()))
        else {
            return;
        };
        self.apply(Op::Delete {
            key: fk,
            incarnation: None,
        })
        .unwrap();
        let items: Vec<_> = self.g.outbox.values().cloned().collect();
        for it in items {
            self.apply(Op::Unpin {
                key: it.source,
                pin_id: it.pin_id,
            })
            .unwrap();
            self.apply(Op::OutboxDone { id: it.id }).unwrap();
        }
    }

    /// The leader's GC pass: deletes every queued object, then forgets them.
    pub fn gc(&mut self) {
        let queued: Vec<ObjectId> = self.g.cold.gc.iter().copied().collect();
        for id in &queued {
            self.store.remove(id);
            self.deleted.push(*id);
        }
        self.apply(Op::ColdGcDone { objects: queued }).unwrap();
    }

    /// Reads own bytes `[start, end)` of a stream through its plan and the model store.
    pub fn read(&self, k: &StreamKey, start: u64, end: u64) -> Vec<u8> {
        let s = &self.g.streams[k];
        let mut plan = Vec::new();
        assert!(s.plan_own(start, end, &mut plan), "{k:?} [{start},{end})");
        let mut out = Vec::new();
        for p in plan {
            match p {
                Piece::Hot(b) => out.extend_from_slice(&b),
                Piece::Cold {
                    object,
                    pos,
                    len,
                    object_len,
                } => {
                    let o = self
                        .store
                        .get(&object)
                        .unwrap_or_else(|| panic!("object {object:?} was deleted but is used"));
                    assert_eq!(o.len() as u64, object_len, "object length");
                    out.extend_from_slice(&o[pos as usize..(pos + len) as usize]);
                }
            }
        }
        assert_eq!(out.len() as u64, end - start);
        out
    }

    pub fn check(&self) {
        // Every held byte of every source stream reads back exact, in any sub-range too.
        for (name, m) in &self.model {
            let k = key(name);
            let s = &self.g.streams[&k];
            // Only real hot bytes are in memory: the hot region less its external payloads.
            let ahead: u64 = s
                .cold
                .iter()
                .filter(|c| c.start >= s.data_start)
                .map(|c| c.end - c.start)
                .sum();
            assert_eq!(
                s.hot_len() + ahead,
                s.tail - s.data_start,
                "{name}: hot bytes"
            );
            assert!(
                s.cold
                    .iter()
                    .all(|c| c.end <= s.data_start || c.start > s.data_start),
                "{name}: the hot start sits on a hot byte"
            );
            let lo = s.held_start();
            assert!(lo <= s.keep_from(), "{name}: dropped bytes it must keep");
            assert_eq!(s.tail, m.len() as u64);
            assert_eq!(
                self.read(&k, lo, s.tail),
                m[lo as usize..],
                "{name}: bytes differ"
            );
            let mid = lo + (s.tail - lo) / 3;
            assert_eq!(
                self.read(&k, mid, s.tail - (s.tail - mid) / 2).len() as u64,
                {
                    let e = s.tail - (s.tail - mid) / 2;
                    e - mid
                }
            );
        }
        // Forks' inherited bytes are still held by their sources (pins protect them).
        for s in self.g.streams.values() {
            if let Some(link) = &s.fork
                && let Some(src) = self.g.streams.get(&link.source)
            {
                let floor = s.retained.min(link.point);
                let mut plan = Vec::new();
                assert!(src.plan_own(floor.max(src.own_start), link.point, &mut plan));
            }
        }
        // Reference counts are exact; queued objects are used by nobody.
        let mut refs: BTreeMap<ObjectId, u32> = BTreeMap::new();
        for s in self.g.streams.values() {
            assert!(
                s.cold.iter().all(|c| c.end > s.keep_from()),
                "a reference below what the stream must keep was not released"
            );
            for c in s.cold.iter() {
                *refs.entry(c.object).or_default() += 1;
                assert!(!self.g.cold.gc.contains(&c.object));
            }
        }
        let counted: BTreeMap<ObjectId, u32> = self
            .g
            .cold
            .objects
            .iter()
            .map(|(id, u)| (*id, u.refs))
            .collect();
        assert_eq!(refs, counted, "reference counts");
        for id in &self.deleted {
            assert!(
                !refs.contains_key(id),
                "deleted object {id:?} is referenced"
            );
        }
        // Every uploaded object is either used, queued, or was deleted (nothing leaks).
        for id in self.store.keys() {
            assert!(refs.contains_key(id) || self.g.cold.gc.contains(id));
        }
    }
}

pub fn key(name: &str) -> StreamKey {
    StreamKey::new("demo", name)
}
