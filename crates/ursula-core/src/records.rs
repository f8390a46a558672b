//! Record-aware reads of JSON streams (extensions.md §11.6-§11.8): the rules of the query
//! parameters, where a read starts, and the window of complete records it returns.
//!
//! Everything here is pure: the HTTP layer hands over the raw parameter values and the
//! stream's state, and gets back either a rejection or ordinals and offsets to serve.

use crate::error::{ErrorCode, Rejection};
use crate::offset::parse_digits;
use crate::stream::StreamState;

/// Where a record-aware read starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordStart {
    /// `record=<n>`.
    At(u64),
    /// `record=now`: the record tail `N`.
    Now,
    /// `tail_records=<k>`: `max(F, N - k)`.
    Tail(u64),
}

/// The record parameters of a read, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordQuery {
    pub start: RecordStart,
    /// `max_records`: at most this many complete records (per batch on SSE).
    pub max_records: Option<u64>,
    /// `record_view=envelope`.
    pub envelope: bool,
}

/// The raw record parameters of a read (a repeated one: its last value), and whether the
/// parameters they exclude were present.
#[derive(Debug, Clone, Copy, Default)]
pub struct RecordParams<'a> {
    pub record: Option<&'a str>,
    pub tail_records: Option<&'a str>,
    pub max_records: Option<&'a str>,
    pub record_view: Option<&'a str>,
    pub offset: bool,
    pub max_bytes: bool,
}

fn bad_query(m: &str) -> Rejection {
    Rejection::new(ErrorCode::INVALID_QUERY, m)
}

impl RecordParams<'_> {
    /// Checks the parameters in the order of extensions.md §11.6 (the first broken rule
    /// answers). `None`: not a record-aware read.
    pub fn check(&self) -> Result<Option<RecordQuery>, Rejection> {
        let start_given = self.record.is_some() || self.tail_records.is_some();
        if self.record.is_some() && self.tail_records.is_some() {
            return Err(bad_query("record and tail_records exclude each other"));
        }
        if start_given && self.offset {
            return Err(bad_query("offset excludes record and tail_records"));
        }
        if self.max_records.is_some() && !start_given {
            return Err(bad_query("max_records needs record or tail_records"));
        }
        if self.max_bytes && start_given {
            return Err(bad_query(
                "max_bytes does not apply to record reads; use max_records",
            ));
        }
        if let Some(v) = self.record_view
            && (!start_given || v != "envelope")
        {
            return Err(bad_query(
                "record_view must be envelope, with record or tail_records",
            ));
        }
        let start = match (self.record, self.tail_records) {
            (Some("now"), _) => RecordStart::Now,
            (Some(v), _) => RecordStart::At(
                parse_digits(v).ok_or_else(|| bad_query("record must be now or an integer"))?,
            ),
            (None, Some(v)) => RecordStart::Tail(
                parse_digits(v).ok_or_else(|| bad_query("tail_records must be an integer"))?,
            ),
            (None, None) => return Ok(None),
        };
        let max_records = match self.max_records {
            None => None,
            Some(v) => Some(
                parse_digits(v)
                    .filter(|m| *m >= 1)
                    .ok_or_else(|| bad_query("max_records must be an integer >= 1"))?,
            ),
        };
        Ok(Some(RecordQuery {
            start,
            max_records,
            envelope: self.record_view.is_some(),
        }))
    }
}

/// The complete records `[start, next)` a read returns, with their offsets, and the stream's
/// record coordinates when it was computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordWindow {
    /// `F`: the first retained record.
    pub first: u64,
    /// The resolved start ordinal.
    pub start: u64,
    /// The ordinal after the last record returned (`start` when none is).
    pub next: u64,
    /// `N`: the record tail.
    pub tail: u64,
    /// `O(start)` and `O(next)`: the canonical bytes to serve are `[start_offset, end_offset)`.
    pub start_offset: u64,
    pub end_offset: u64,
}

impl RecordWindow {
    /// Whether the window reaches the record tail (`Stream-Up-To-Date`).
    pub fn up_to_date(&self) -> bool {
        self.next == self.tail
    }
}

impl StreamState {
    /// Resolves a record start to an ordinal in `[F, N]` (extensions.md §11.6):
    /// `400 INVALID_RECORD_BOUNDARIES` for a stream that is not JSON or a start beyond `N`,
    /// `410 STREAM_GONE` for one before `F` (both with `Stream-Record-First`/`-Next`).
    pub fn resolve_record_start(&self, start: RecordStart) -> Result<u64, Rejection> {
        if !self.json {
            return Err(Rejection::new(
                ErrorCode::INVALID_RECORD_BOUNDARIES,
                "record reads apply only to application/json streams",
            ));
        }
        let (first, next) = (self.record_first(), self.record_next());
        let facts = |f: &mut crate::error::Facts| {
            f.record_first = Some(first);
            f.record_next = Some(next);
            f.json = true;
        };
        let n = match start {
            RecordStart::Now => next,
            RecordStart::Tail(k) => next.saturating_sub(k).max(first),
            RecordStart::At(n) => n,
        };
        if n > next {
            return Err(Rejection::new(
                ErrorCode::INVALID_RECORD_BOUNDARIES,
                format!("record {n} is beyond the record tail {next}"),
            )
            .with(facts));
        }
        if n < first {
            let retained = self.retained;
            return Err(Rejection::new(
                ErrorCode::STREAM_GONE,
                format!(
                    "record {n} is before the first retained record {first}; read the \
                     bootstrap and continue from its Stream-Next-Offset"
                ),
            )
            .with(|f| {
                facts(f);
                f.next_offset = Some(retained);
                f.earliest_offset = Some(retained);
            }));
        }
        Ok(n)
    }

    /// The complete records from ordinal `start` (resolved, so `F <= start <= N`): at most
    /// `max_records`, and no more than `max_bytes` canonical bytes unless the first record
    /// alone is larger (it is then returned alone, so every read makes progress).
    pub fn record_window(
        &self,
        start: u64,
        max_records: Option<u64>,
        max_bytes: u64,
    ) -> RecordWindow {
        let tail = self.record_next();
        let offset_of = |r: u64| self.offset_of_record(r).unwrap_or(self.tail);
        let start_offset = offset_of(start);
        let mut next = match max_records {
            Some(m) => start.saturating_add(m).min(tail),
            None => tail,
        };
        let limit = start_offset.saturating_add(max_bytes);
        if next > start && offset_of(next) > limit {
            // `ends[i]` ends record `ends_cut + i`; the last record ending within the limit
            // closes the window, and at least one record goes out.
            let index = |r: u64| {
                r.checked_sub(self.ends_cut)
                    .and_then(|i| usize::try_from(i).ok())
            };
            let fit = match (index(start), index(next)) {
                (Some(from), Some(to)) if from <= to && to <= self.ends.len() => {
                    self.ends.partition_point_in(from, to, |e| e <= limit) - from
                }
                _ => 0,
            };
            next = start + (fit as u64).max(1).min(next - start);
        }
        RecordWindow {
            first: self.record_first(),
            start,
            next,
            tail,
            start_offset,
            end_offset: offset_of(next),
        }
    }
}

/// Renders canonical NDJSON lines, the first of them record `first`, as the envelope view:
/// `{"record":<n>,"value":<line>}` and a line feed per record (extensions.md §11.7).
pub fn envelope_into(ndjson: &[u8], first: u64, out: &mut Vec<u8>) {
    use std::io::Write as _;
    let lines = ndjson.split(|b| *b == b'\n').filter(|l| !l.is_empty());
    out.reserve(ndjson.len() + 32 * ndjson.iter().filter(|b| **b == b'\n').count());
    for (i, line) in lines.enumerate() {
        // Writing a number into a Vec cannot fail.
        let _ = write!(out, "{{\"record\":{},\"value\":", first + i as u64);
        out.extend_from_slice(line);
        out.extend_from_slice(b"}\n");
    }
}

#[cfg(test)]
#[path = "records_tests.rs"]
mod tests;
