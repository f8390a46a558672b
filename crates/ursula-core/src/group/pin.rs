//! `Pin`: the source side of a fork (forks.md §10.1): validate the fork point, record a pin,
//! and describe what the fork inherits.

use super::{GroupState, MAX_FORK_DEPTH};
use crate::command::*;
use crate::content_type;
use crate::error::{ErrorCode, Rejection};
use crate::stream::Pin;

impl GroupState {
    pub(super) fn pin(&mut self, now: u64, req: &PinReq) -> Response {
        self.lapse_if_expired(&req.source, now);
        let s = self.streams.get_mut(&req.source).ok_or_else(|| {
            Rejection::new(
                ErrorCode::FORK_SOURCE_NOT_FOUND,
                "fork source stream not found",
            )
        })?;
        if s.soft_deleted {
            return Err(Rejection::new(
                ErrorCode::FORK_SOURCE_SOFT_DELETED,
                "fork source stream was deleted",
            ));
        }
        if let Some(ct) = &req.content_type
            && !content_type::matches(ct, &s.content_type)
        {
            return Err(Rejection::new(
                ErrorCode::CONTENT_TYPE_MISMATCH,
                format!(
                    "fork content type does not match the source's {}",
                    s.content_type
                ),
            ));
        }
        let anchor = req.anchor.unwrap_or(s.tail);
        if anchor > s.tail {
            return Err(Rejection::new(
                ErrorCode::INVALID_FORK_OFFSET,
                format!("fork offset {anchor} is beyond the source tail {}", s.tail),
            ));
        }
        if anchor < s.retained {
            let r = s.retained;
            return Err(Rejection::new(
                ErrorCode::STREAM_GONE,
                format!("fork offset {anchor} is before the retained history ({r})"),
            )
            .with(|f| {
                f.earliest_offset = Some(r);
                f.next_offset = Some(r);
            }));
        }
        let overshoot = || {
            Rejection::new(
                ErrorCode::INVALID_FORK_SUB_OFFSET,
                "fork sub-offset goes beyond the source's data",
            )
        };
        let (point, record_at_point) = if s.json {
            let r_a = s.record_at(anchor).ok_or_else(|| {
                Rejection::new(
                    ErrorCode::INVALID_FORK_OFFSET,
                    format!("fork offset {anchor} is not a message boundary"),
                )
            })?;
            let r = r_a
                .checked_add(req.sub)
                .filter(|r| *r <= s.record_next())
                .ok_or_else(overshoot)?;
            (s.offset_of_record(r).ok_or_else(overshoot)?, r)
        } else {
            let p = anchor
                .checked_add(req.sub)
                .filter(|p| *p <= s.tail)
                .ok_or_else(overshoot)?;
            (p, 0)
        };
        let snapshot = match &s.snapshot {
            Some(v) if v.offset > point && s.retained > 0 => {
                return Err(s.snapshot_conflict(format!(
                    "the source's history before its snapshot at {} is trimmed, so a fork at {point} \
                     could not be rebuilt",
                    v.offset
                )));
            }
            Some(v) if v.offset <= point => s.inheritable_snapshot(),
            _ => None,
        };
        if s.depth + 1 > MAX_FORK_DEPTH {
            return Err(Rejection::new(
                ErrorCode::FORK_DEPTH_EXCEEDED,
                format!("fork chains are limited to {MAX_FORK_DEPTH} levels"),
            ));
        }
        s.pins.insert(
            req.pin_id,
            Pin {
                fork_key: req.fork_key.clone(),
                point,
                deadline_ms: req.deadline_ms,
                floor: s.retained,
            },
        );
        let upto = s.ends.partition_point(|e| e <= point);
        Ok(Reply::Pinned(Box::new(PinnedSource {
            pin_id: req.pin_id,
            deadline_ms: req.deadline_ms,
            source_incarnation: s.incarnation,
            content_type: s.content_type.clone(),
            lifetime: s.lifetime,
            anchor,
            point,
            record_at_point,
            retained: s.retained,
            depth: s.depth + 1,
            ends_prefix: s.ends.to_vec(0, upto),
            ends_cut: s.ends_cut,
            cut_offset: s.cut_offset,
            snapshot,
        })))
    }
}
