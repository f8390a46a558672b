//! `Append`: producer checks, `Stream-Seq`, record preconditions, close (protocol.md §6).

use super::{GroupState, incarnation_mismatch, not_found, soft_deleted};
use crate::command::*;
use crate::content_type;
use crate::error::{ErrorCode, Rejection};
use crate::external::{Body, malformed};
use crate::producer::{self, Check, Receipt};

impl GroupState {
    pub(super) fn append(&mut self, now: u64, req: &AppendReq) -> Response {
        self.append_body(now, req, Body::Inline(&req.payload))
    }

    /// An append of `body` (the request's inline payload, or an external payload).
    pub(crate) fn append_body(&mut self, now: u64, req: &AppendReq, body: Body<'_>) -> Response {
        self.lapse_if_expired(&req.key, now);
        self.check_not_fenced(&req.key)?;
        let cold = &mut self.cold;
        let s = self.streams.get_mut(&req.key).ok_or_else(not_found)?;
        if s.soft_deleted {
            return Err(soft_deleted());
        }
        if let Some(i) = req.incarnation
            && i != s.incarnation
        {
            return Err(incarnation_mismatch(Some(s.incarnation)));
        }
        let close_only = req.close && body.is_empty();
        if let Some(p) = &req.producer
            && let Some(Check::Duplicate {
                receipt,
                epoch,
                last_seq,
            }) = producer::find_duplicate(s.producers.get(&p.id), p)
        {
            s.last_touch_ms = now;
            return Ok(Reply::Appended(AppendReply {
                next_offset: receipt.next_offset,
                closed: s.closed,
                duplicate: true,
                producer: Some((epoch, last_seq)),
                json: s.json,
                record_start: receipt.record_start,
                record_next: receipt.record_next,
                incarnation: s.incarnation,
                appended: false,
            }));
        }
        if s.closed {
            if close_only {
                s.last_touch_ms = now;
                let n = s.record_next();
                return Ok(Reply::Appended(AppendReply {
                    next_offset: s.tail,
                    closed: true,
                    duplicate: false,
                    producer: req.producer.as_ref().map(|p| (p.epoch, p.seq)),
                    json: s.json,
                    record_start: n,
                    record_next: n,
                    incarnation: s.incarnation,
                    appended: false,
                }));
            }
            let tail = s.tail;
            return Err(
                Rejection::new(ErrorCode::STREAM_CLOSED, "stream is closed").with(|f| {
                    f.closed = true;
                    f.next_offset = Some(tail);
                }),
            );
        }
        if let Some(p) = &req.producer {
            producer::validate(s.producers.get(&p.id), p)?;
        }
        if let Some(m) = req.record_match {
            if !s.json {
                return Err(Rejection::new(
                    ErrorCode::INVALID_RECORD_BOUNDARIES,
                    "Stream-Record-Match applies only to application/json streams",
                ));
            }
            let n = s.record_next();
            if m != n {
                let tail = s.tail;
                return Err(Rejection::new(
                    ErrorCode::RECORD_PRECONDITION_FAILED,
                    format!("record tail is {n}, not {m}"),
                )
                .with(|f| {
                    f.record_next = Some(n);
                    f.next_offset = Some(tail);
                    f.json = true;
                }));
            }
        }
        if body.is_empty() && !req.close {
            return Err(Rejection::new(
                ErrorCode::EMPTY_APPEND,
                "append body is empty",
            ));
        }
        if !body.is_empty() {
            let ok = req
                .content_type
                .as_deref()
                .is_some_and(|ct| content_type::matches(ct, &s.content_type));
            if !ok {
                let tail = s.tail;
                return Err(Rejection::new(
                    ErrorCode::CONTENT_TYPE_MISMATCH,
                    format!(
                        "content type does not match the stream's {}",
                        s.content_type
                    ),
                )
                .with(|f| f.next_offset = Some(tail)));
            }
        }
        if let Some(seq) = &req.stream_seq
            && s.stream_seq
                .as_ref()
                .is_some_and(|old| seq.as_bytes() <= old.as_bytes())
        {
            let tail = s.tail;
            return Err(Rejection::new(
                ErrorCode::STREAM_SEQ_CONFLICT,
                "Stream-Seq is not greater than the last one",
            )
            .with(|f| f.next_offset = Some(tail)));
        }
        if let Body::External(x) = body
            && !x.well_formed(s.json)
        {
            return Err(malformed());
        }
        let record_start = s.record_next();
        s.push_body(body, cold);
        if let Some(seq) = &req.stream_seq {
            s.stream_seq = Some(seq.clone());
        }
        s.closed |= req.close;
        s.last_touch_ms = now;
        s.last_write_ms = now;
        let record_next = s.record_next();
        if let Some(p) = &req.producer {
            let mut st = s.producers.remove(&p.id);
            producer::record(
                &mut st,
                p,
                Receipt {
                    seq: p.seq,
                    next_offset: s.tail,
                    record_start,
                    record_next,
                },
            );
            if let Some(st) = st {
                s.producers.insert(p.id.clone(), st);
            }
        }
        Ok(Reply::Appended(AppendReply {
            next_offset: s.tail,
            closed: s.closed,
            duplicate: false,
            producer: req.producer.as_ref().map(|p| (p.epoch, p.seq)),
            json: s.json,
            record_start,
            record_next,
            incarnation: s.incarnation,
            appended: !body.is_empty(),
        }))
    }
}
