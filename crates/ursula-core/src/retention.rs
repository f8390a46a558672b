//! Retention (extensions.md §7): the monotonic, exact retained offset, and the physical
//! trimming of a stream's bytes and message index below it.
//!
//! Logical retention (what readers of this stream see) and physical trimming differ in one
//! way: bytes a fork still inherits stay, because each fork's pin records the `floor` it
//! reads from (forks.md §10.4). Record ordinals never change: dropped message ends are
//! counted in `ends_cut`.

use crate::cold::ObjectId;
use crate::command::{At, Reply, Response, RetainReply};
use crate::error::{ErrorCode, Rejection};
use crate::snapshot::{not_json, put_records};
use crate::stream::StreamState;

impl StreamState {
    /// Advances retention to `at` after the checks of extensions.md §7 rules 3-7, in order.
    /// The caller has checked existence and the incarnation (rule 2).
    /// Cold objects whose references the trim dropped are added to `released`.
    pub(crate) fn retain(&mut self, at: At, released: &mut Vec<ObjectId>) -> Response {
        let boundary = match at {
            At::Offset(o) => o,
            At::Record(n) => {
                if !self.json {
                    return Err(not_json());
                }
                let (first, next) = (self.record_first(), self.record_next());
                if n > next {
                    let records = Some((first, next));
                    return Err(Rejection::new(
                        ErrorCode::INVALID_RECORD_BOUNDARIES,
                        format!("record {n} is beyond the record tail {next}"),
                    )
                    .with(|f| put_records(f, records)));
                }
                if n <= first {
                    return Ok(self.retain_reply(0));
                }
                self.offset_of_record(n).ok_or_else(|| {
                    Rejection::new(ErrorCode::INTERNAL_ERROR, "record index is inconsistent")
                })?
            }
        };
        if boundary <= self.retained {
            return Ok(self.retain_reply(0));
        }
        match &self.snapshot {
            None => {
                return Err(Rejection::new(
                    ErrorCode::INVALID_RETENTION,
                    "retention needs a visible snapshot at or after the boundary; publish one first",
                ));
            }
            Some(v) if boundary > v.offset => {
                return Err(Rejection::new(
                    ErrorCode::INVALID_RETENTION,
                    format!(
                        "retention boundary {boundary} is beyond the visible snapshot offset {}",
                        v.offset
                    ),
                ));
            }
            Some(_) => {}
        }
        if self.json && !self.is_boundary(boundary) {
            return Err(Rejection::new(
                ErrorCode::INVALID_RETENTION,
                format!(
                    "retention boundary {boundary} is not a message boundary of the JSON stream"
                ),
            ));
        }
        self.retained = boundary;
        let freed = self.trim(released);
        Ok(self.retain_reply(freed))
    }

    fn retain_reply(&self, freed_bytes: u64) -> Reply {
        Reply::Retained(RetainReply {
            retained: self.retained,
            incarnation: self.incarnation,
            json: self.json,
            record_first: self.record_first(),
            record_next: self.record_next(),
            freed_bytes,
        })
    }

    /// The lowest offset this stream must keep of its own bytes: its retained offset, or
    /// lower where a fork's pin still reads from.
    pub fn keep_from(&self) -> u64 {
        self.pins
            .values()
            .map(|p| p.floor)
            .fold(self.retained, u64::min)
    }

    /// Drops own bytes below [`StreamState::keep_from`] (hot bytes, and cold references
    /// that end at or below it, whose objects go to `released`) and message ends at or
    /// below the retained offset. Returns how many bytes of memory that freed (hot bytes, and the
    /// chunks of message ends dropped whole).
    /// Idempotent.
    pub(crate) fn trim(&mut self, released: &mut Vec<ObjectId>) -> u64 {
        let keep = self.keep_from().clamp(self.data_start, self.tail);
        // Hot bytes below `keep`, counted before the references below it go (external
        // payloads between hot bytes are not in memory).
        let drop = usize::try_from(self.hot_before(keep)).unwrap_or(self.data.len());
        self.trim_cold(self.keep_from(), released);
        let mut freed = 0;
        if keep > self.data_start {
            let drop = drop.min(self.data.len());
            self.data.drop_front(drop);
            self.data_start = keep;
            self.settle_hot_start();
            freed = drop as u64;
        }
        // Message ends are not needed below the retained offset: reads, snapshots, forks and
        // retention there all answer 410 (forks copy the ends they inherit when pinned).
        let retained = self.retained;
        let cut = self.ends.partition_point(|e| e <= retained);
        if let Some(last) = cut.checked_sub(1).and_then(|i| self.ends.get(i)) {
            self.cut_offset = last;
            self.ends_cut += cut as u64;
            freed += self.ends.drop_front(cut);
        }
        freed
    }
}
