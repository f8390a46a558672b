//! Schemas 2 and 3, frozen: the layout of the persisted group state before schema 4 packed each
//! stream's message ends (a `Vec<u64>` here). Decode-only; every type converts into the live
//! one.
//!
//! Only the types whose layout changed since are copied here; the others (producers,
//! snapshots, pins, fork links, lifetimes, cold-tier references) still have this layout in
//! their live form. Never edit these types: data directories hold their bytes.

use crate::bytelog::ByteLog;
use crate::cold::{ColdChunks, ColdState};
use crate::command::Lifetime;
use crate::group::{GroupState, OutboxItem};
use crate::ids::{Incarnation, StreamKey};
use crate::producer::ProducerState;
use crate::snapshot::{ColdSnapshotRef, Snapshot};
use crate::stream::{ForkLink, Pin, StreamState};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// A stream as schemas 2 and 3 stored it: message ends one `u64` each.
#[derive(Deserialize)]
pub(super) struct StreamStateV3 {
    incarnation: Incarnation,
    content_type: String,
    json: bool,
    closed: bool,
    lifetime: Lifetime,
    lifetime_inherited: bool,
    created_at_ms: u64,
    last_write_ms: u64,
    last_touch_ms: u64,
    stream_seq: Option<String>,
    producers: BTreeMap<String, ProducerState>,
    fork: Option<ForkLink>,
    depth: u32,
    pins: BTreeMap<u64, Pin>,
    soft_deleted: bool,
    own_start: u64,
    data_start: u64,
    data: ByteLog,
    tail: u64,
    ends: Vec<u64>,
    ends_cut: u64,
    cut_offset: u64,
    retained: u64,
    snapshot: Option<Snapshot>,
    snapshot_object: Option<ColdSnapshotRef>,
    cold: ColdChunks,
}

impl From<StreamStateV3> for StreamState {
    fn from(s: StreamStateV3) -> Self {
        StreamState {
            incarnation: s.incarnation,
            content_type: s.content_type,
            json: s.json,
            closed: s.closed,
            lifetime: s.lifetime,
            lifetime_inherited: s.lifetime_inherited,
            created_at_ms: s.created_at_ms,
            last_write_ms: s.last_write_ms,
            last_touch_ms: s.last_touch_ms,
            stream_seq: s.stream_seq,
            producers: s.producers,
            fork: s.fork,
            depth: s.depth,
            pins: s.pins,
            soft_deleted: s.soft_deleted,
            own_start: s.own_start,
            data_start: s.data_start,
            data: s.data,
            tail: s.tail,
            ends: s.ends.into(),
            ends_cut: s.ends_cut,
            cut_offset: s.cut_offset,
            retained: s.retained,
            snapshot: s.snapshot,
            snapshot_object: s.snapshot_object,
            cold: s.cold,
        }
    }
}

/// A group as schemas 2 and 3 stored it.
#[derive(Deserialize)]
pub(super) struct GroupStateV3 {
    group: u32,
    streams: HashMap<StreamKey, StreamStateV3>,
    buckets: BTreeSet<String>,
    fenced: BTreeSet<String>,
    outbox: BTreeMap<u64, OutboxItem>,
    next_outbox_id: u64,
    cold: ColdState,
}

impl From<GroupStateV3> for GroupState {
    fn from(g: GroupStateV3) -> Self {
        GroupState {
            group: g.group,
            streams: g.streams.into_iter().map(|(k, s)| (k, s.into())).collect(),
            buckets: g.buckets,
            fenced: g.fenced,
            outbox: g.outbox,
            next_outbox_id: g.next_outbox_id,
            cold: g.cold,
        }
    }
}
