//! `Create`: a new stream, an idempotent re-create, or a fork with its pinned source
//! metadata (protocol.md §5, forks.md §9).

use super::{GroupState, incarnation_mismatch, not_found};
use crate::command::*;
use crate::content_type;
use crate::error::{ErrorCode, Rejection};
use crate::external::{Body, malformed};
use crate::ids::Incarnation;
use crate::producer::{self, Receipt};
use crate::stream::{ForkLink, StreamState};
use std::collections::BTreeMap;

impl GroupState {
    pub(super) fn create(&mut self, log_index: u64, now: u64, req: &CreateReq) -> Response {
        self.create_body(log_index, now, req, Body::Inline(&req.payload))
    }

    /// A create with initial `body` (the request's inline payload, or an external payload).
    pub(crate) fn create_body(
        &mut self,
        log_index: u64,
        now: u64,
        req: &CreateReq,
        body: Body<'_>,
    ) -> Response {
        let bucket = req.key.bucket();
        if self.fenced.contains(bucket) {
            return Err(Rejection::new(
                ErrorCode::BUCKET_NOT_FOUND,
                "bucket not found",
            ));
        }
        if let Some(p) = &req.producer
            && p.seq != 0
        {
            return Err(Rejection::new(
                ErrorCode::PRODUCER_SEQ_CONFLICT,
                "a create's Producer-Seq must be 0",
            )
            .with(|f| {
                f.expected_seq = Some(0);
                f.received_seq = Some(p.seq);
            }));
        }
        self.lapse_if_expired(&req.key, now);
        if let Some(s) = self.streams.get(&req.key) {
            if s.soft_deleted {
                return Err(Rejection::new(
                    ErrorCode::PATH_SOFT_DELETED,
                    "the path belongs to a deleted stream that still has forks",
                ));
            }
            if let Some(i) = req.incarnation
                && i != s.incarnation
            {
                return Err(incarnation_mismatch(Some(s.incarnation)));
            }
            let same = match &req.fork {
                Some(f) => same_fork(s, req, f),
                None => same_config(s, req),
            };
            if !same {
                return Err(Rejection::new(
                    ErrorCode::STREAM_ALREADY_EXISTS_CONFLICT,
                    "stream already exists with a different configuration",
                ));
            }
            let s = self.streams.get_mut(&req.key).ok_or_else(not_found)?;
            s.last_touch_ms = now;
            return Ok(Reply::Created(Box::new(create_reply(
                s,
                false,
                req,
                s.record_next(),
            ))));
        }
        if req.incarnation.is_some() {
            return Err(incarnation_mismatch(None));
        }
        let incarnation = Incarnation(
            (u128::from(self.group) << 112)
                | (u128::from(log_index & 0xffff_ffff_ffff) << 64)
                | u128::from(now.saturating_mul(1_000_000)),
        );
        let (content_type, lifetime, inherited, fork, depth, own_start, history) = match &req.fork {
            None => (
                req.content_type
                    .clone()
                    .unwrap_or_else(|| "application/octet-stream".into()),
                req.lifetime,
                false,
                None,
                0,
                0,
                Inherited::default(),
            ),
            Some(f) => {
                let Some(p) = &f.pinned else {
                    return Ok(Reply::NeedsPin);
                };
                if now > p.deadline_ms {
                    return Err(Rejection::new(
                        ErrorCode::LEADER_UNAVAILABLE,
                        "the fork source pin expired before the fork was created; retry",
                    ));
                }
                let inherited = req.lifetime.is_none();
                let link = ForkLink {
                    source: f.source.clone(),
                    source_incarnation: p.source_incarnation,
                    pin_id: p.pin_id,
                    anchor: p.anchor,
                    sub: f.sub,
                    point: p.point,
                };
                (
                    p.content_type.clone(),
                    if inherited { p.lifetime } else { req.lifetime },
                    inherited,
                    Some(link),
                    p.depth,
                    p.point,
                    Inherited::of(p),
                )
            }
        };
        let json = content_type::is_json(&content_type);
        let Inherited {
            mut ends,
            ends_cut,
            cut_offset,
            retained,
            snapshot,
        } = history;
        let (snapshot, snapshot_object) = match snapshot {
            Some(v) => {
                let (v, r) = crate::snapshot::ColdSnapshotRef::from_inherited(v);
                (Some(v), r)
            }
            None => (None, None),
        };
        // A non-JSON fork point inside an append ends that unit for the fork (bootstrap
        // parts never span the fork point).
        if !json && own_start > ends.last().copied().unwrap_or(cut_offset) {
            ends.push(own_start);
        }
        let mut s = StreamState {
            incarnation,
            content_type,
            json,
            closed: req.closed,
            lifetime,
            lifetime_inherited: inherited,
            created_at_ms: now,
            last_write_ms: now,
            last_touch_ms: now,
            stream_seq: req.stream_seq.clone(),
            producers: BTreeMap::new(),
            fork,
            depth,
            pins: BTreeMap::new(),
            soft_deleted: false,
            own_start,
            data_start: own_start,
            data: crate::bytelog::ByteLog::new(),
            tail: own_start,
            ends: ends.into(),
            ends_cut,
            cut_offset,
            retained,
            snapshot,
            snapshot_object,
            cold: Default::default(),
        };
        if let Body::External(x) = body
            && !x.well_formed(json)
        {
            return Err(malformed());
        }
        let record_start = s.record_next();
        s.push_body(body, &mut self.cold);
        if let Some(p) = &req.producer {
            let mut st = None;
            producer::record(
                &mut st,
                p,
                Receipt {
                    seq: 0,
                    next_offset: s.tail,
                    record_start,
                    record_next: s.record_next(),
                },
            );
            if let Some(st) = st {
                s.producers.insert(p.id.clone(), st);
            }
        }
        let reply = create_reply(&s, true, req, record_start);
        self.buckets.insert(bucket.to_owned());
        self.streams.insert(req.key.clone(), s);
        Ok(Reply::Created(Box::new(reply)))
    }
}

/// What a fork takes over from its source besides bytes: the message index of the prefix,
/// the retained offset and the visible snapshot (forks.md §9.1).
#[derive(Default)]
struct Inherited {
    ends: Vec<u64>,
    ends_cut: u64,
    cut_offset: u64,
    retained: u64,
    snapshot: Option<crate::snapshot::Snapshot>,
}

impl Inherited {
    fn of(p: &PinnedSource) -> Self {
        Inherited {
            ends: p.ends_prefix.clone(),
            ends_cut: p.ends_cut,
            cut_offset: p.cut_offset,
            retained: p.retained,
            snapshot: p.snapshot.clone(),
        }
    }
}

fn same_config(s: &StreamState, req: &CreateReq) -> bool {
    let ct = req
        .content_type
        .as_deref()
        .unwrap_or("application/octet-stream");
    content_type::matches(ct, &s.content_type)
        && req.closed == s.closed
        && req.lifetime == s.lifetime
}

fn same_fork(s: &StreamState, req: &CreateReq, f: &ForkCreate) -> bool {
    let Some(link) = &s.fork else { return false };
    if link.source != f.source {
        return false;
    }
    if let Some(a) = f.anchor
        && (a != link.anchor || f.sub != link.sub)
    {
        return false;
    }
    if let Some(ct) = &req.content_type
        && !content_type::matches(ct, &s.content_type)
    {
        return false;
    }
    let lifetime_ok = if req.lifetime.is_none() {
        s.lifetime_inherited || s.lifetime.is_none()
    } else {
        req.lifetime == s.lifetime
    };
    lifetime_ok && req.closed == s.closed
}

fn create_reply(s: &StreamState, created: bool, req: &CreateReq, record_start: u64) -> CreateReply {
    CreateReply {
        created,
        content_type: s.content_type.clone(),
        tail: s.tail,
        incarnation: s.incarnation,
        lifetime: s.lifetime,
        closed: s.closed,
        json: s.json,
        producer: req.producer.as_ref().map(|p| (p.epoch, p.seq)),
        record_start: if created {
            record_start
        } else {
            s.record_next()
        },
        record_next: s.record_next(),
    }
}
