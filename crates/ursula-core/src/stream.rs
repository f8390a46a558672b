//! The state of one stream incarnation.

use crate::bytelog::ByteLog;
use crate::cold::ColdChunks;
use crate::command::Lifetime;
use crate::ends::Ends;
use crate::ids::{Incarnation, StreamKey};
use crate::producer::ProducerState;
use crate::snapshot::{ColdSnapshotRef, Snapshot};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A fork's link to its direct source; bytes below `point` are the source's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkLink {
    pub source: StreamKey,
    pub source_incarnation: Incarnation,
    pub pin_id: u64,
    /// The anchor the fork was created with (explicit, or the tail used as default).
    pub anchor: u64,
    pub sub: u64,
    pub point: u64,
}

/// A reference a fork holds on this stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pin {
    pub fork_key: StreamKey,
    pub point: u64,
    pub deadline_ms: u64,
    /// This stream's retained offset when the pin was taken (the fork's initial retained
    /// offset). The fork reads `[floor, point)` from here, so those bytes are never trimmed
    /// while the pin lives, whatever this stream's own retention says (forks.md §10.4).
    pub floor: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamState {
    pub incarnation: Incarnation,
    pub content_type: String,
    pub json: bool,
    pub closed: bool,
    pub lifetime: Lifetime,
    /// True when a fork took its lifetime from its source.
    pub lifetime_inherited: bool,
    pub created_at_ms: u64,
    pub last_write_ms: u64,
    pub last_touch_ms: u64,
    pub stream_seq: Option<String>,
    pub producers: BTreeMap<String, ProducerState>,
    pub fork: Option<ForkLink>,
    pub depth: u32,
    pub pins: BTreeMap<u64, Pin>,
    pub soft_deleted: bool,
    /// First offset this stream wrote itself (the fork point for forks, else 0).
    pub own_start: u64,
    /// First offset still held in memory in `data` (`>= own_start`); retention and cold
    /// flushes move it forward. Own bytes below it that are still held are in `cold`.
    pub data_start: u64,
    /// This stream's own bytes that are still held: offsets `[data_start, tail)`.
    pub data: ByteLog,
    pub tail: u64,
    /// End offsets of the messages in `[cut_offset, tail)` (JSON: records; others: appends),
    /// after the `ends_cut` messages retention dropped from the front.
    pub ends: Ends,
    /// How many message ends retention dropped from the front of `ends`, so that record
    /// ordinals never change: `ends[i]` is the end of record `ends_cut + i`.
    pub ends_cut: u64,
    /// Where record `ends_cut` starts (the end of the last dropped message, else 0).
    pub cut_offset: u64,
    /// Earliest retained offset.
    pub retained: u64,
    /// The visible (latest) snapshot.
    pub snapshot: Option<Snapshot>,
    /// Where the visible snapshot's blob is when it lives in the cold tier (then
    /// `snapshot.blob` is empty). Schema 2.
    pub snapshot_object: Option<ColdSnapshotRef>,
    /// Own bytes below `data_start` that were flushed to the cold tier (see [`crate::cold`]).
    pub cold: ColdChunks,
}

impl StreamState {
    /// Whether the lifetime lapsed at `now_ms`.
    pub fn expired(&self, now_ms: u64) -> bool {
        if let Some(t) = self.lifetime.expires_at_ms
            && now_ms >= t
        {
            return true;
        }
        if let Some(ttl) = self.lifetime.ttl_s {
            return now_ms >= self.last_touch_ms.saturating_add(ttl.saturating_mul(1000));
        }
        false
    }

    /// Whether a read at `now_ms` should renew the sliding TTL (at most once per quarter).
    pub fn read_should_touch(&self, now_ms: u64) -> bool {
        match self.lifetime.ttl_s {
            Some(ttl) => {
                let quarter = ttl.saturating_mul(1000).div_ceil(4);
                now_ms.saturating_sub(self.last_touch_ms) >= quarter
            }
            None => false,
        }
    }

    /// Record tail `N` (JSON streams).
    pub fn record_next(&self) -> u64 {
        self.ends_cut + self.ends.len() as u64
    }

    /// First retained record `F`.
    pub fn record_first(&self) -> u64 {
        self.record_at(self.retained).unwrap_or(0)
    }

    /// Ordinal of the record that starts at boundary `offset`, if it is a boundary.
    /// Offsets below `cut_offset` are no longer known (`None`).
    pub fn record_at(&self, offset: u64) -> Option<u64> {
        if offset == self.cut_offset {
            return Some(self.ends_cut);
        }
        self.ends
            .binary_search(offset)
            .ok()
            .map(|i| self.ends_cut + i as u64 + 1)
    }

    /// Offset where record `r` starts (`tail` for `N`); `None` beyond `N` or below the cut.
    pub fn offset_of_record(&self, r: u64) -> Option<u64> {
        if r == self.ends_cut {
            return Some(self.cut_offset);
        }
        let i = r.checked_sub(self.ends_cut + 1)?;
        self.ends.get(usize::try_from(i).ok()?)
    }

    /// Whether `offset` is a message boundary.
    pub fn is_boundary(&self, offset: u64) -> bool {
        self.record_at(offset).is_some()
    }

    /// The last boundary `<= limit` that is `> start`, else the first boundary `> start`.
    /// Used to end reads of JSON streams on whole messages. Returns `start` when there is
    /// no boundary after it (start == tail).
    pub fn boundary_end(&self, start: u64, limit: u64) -> u64 {
        let after = self.ends.partition_point(|e| e <= start);
        let upto = self.ends.partition_point(|e| e <= limit);
        match upto.checked_sub(1) {
            Some(last) if upto > after => self.ends.get(last).unwrap_or(start),
            _ => self.ends.get(after).unwrap_or(start),
        }
    }

    /// Appends own bytes of `[start, end)` to `out`; the caller guarantees they are hot
    /// (see [`StreamState::holds`]). Outside that: a `start` below `data_start` appends
    /// nothing, an `end` past the tail is clamped.
    pub fn copy_own_bytes(&self, start: u64, end: u64, out: &mut Vec<u8>) {
        if start < self.data_start || start > end {
            return;
        }
        let lo = usize::try_from(self.hot_before(start)).unwrap_or(usize::MAX);
        let n = usize::try_from(end.min(self.tail) - start).unwrap_or(usize::MAX);
        self.data.copy_into(lo, lo.saturating_add(n), out);
    }

    /// Whether this stream still holds its own bytes `[start, end)` in memory (hot, with no
    /// external payload in between).
    pub fn holds(&self, start: u64, end: u64) -> bool {
        self.data_start <= start
            && start <= end
            && end <= self.tail
            && self
                .cold
                .range_from(self.first_ahead())
                .all(|c| c.end <= start || c.start >= end)
    }

    /// Appends canonical bytes and records message ends.
    pub(crate) fn push(&mut self, payload: &[u8]) {
        if payload.is_empty() {
            return;
        }
        let start = self.tail;
        self.data.push(payload);
        self.tail += payload.len() as u64;
        if self.json {
            for (i, b) in payload.iter().enumerate() {
                if *b == b'\n' {
                    self.ends.push(start + i as u64 + 1);
                }
            }
        } else {
            self.ends.push(self.tail);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json_stream(lines: &[&str]) -> StreamState {
        let mut s = StreamState {
            incarnation: Incarnation(1),
            content_type: "application/json".into(),
            json: true,
            closed: false,
            lifetime: Lifetime::default(),
            lifetime_inherited: false,
            created_at_ms: 0,
            last_write_ms: 0,
            last_touch_ms: 0,
            stream_seq: None,
            producers: BTreeMap::new(),
            fork: None,
            depth: 0,
            pins: BTreeMap::new(),
            soft_deleted: false,
            own_start: 0,
            data_start: 0,
            data: ByteLog::new(),
            tail: 0,
            ends: Ends::default(),
            ends_cut: 0,
            cut_offset: 0,
            retained: 0,
            snapshot: None,
            snapshot_object: None,
            cold: ColdChunks::default(),
        };
        for l in lines {
            s.push(format!("{l}\n").as_bytes());
        }
        s
    }

    #[test]
    fn boundaries_and_records() {
        let s = json_stream(&["1", "22", "333"]); // ends 2, 5, 9
        assert_eq!(s.ends, vec![2, 5, 9]);
        assert!(s.is_boundary(0) && s.is_boundary(5) && !s.is_boundary(3));
        assert_eq!(s.record_at(5), Some(2));
        assert_eq!(s.offset_of_record(3), Some(9));
        assert_eq!(s.boundary_end(0, 6), 5);
        assert_eq!(
            s.boundary_end(0, 1),
            2,
            "one oversize message is returned alone"
        );
        assert_eq!(
            s.boundary_end(3, 4),
            5,
            "a read inside a message ends at its end"
        );
        assert_eq!(s.boundary_end(9, 100), 9);
    }

    #[test]
    fn ttl_rules() {
        let mut s = json_stream(&[]);
        s.lifetime.ttl_s = Some(2);
        s.last_touch_ms = 1000;
        assert!(!s.expired(2999));
        assert!(s.expired(3000));
        assert!(!s.read_should_touch(1499));
        assert!(s.read_should_touch(1500));
        s.lifetime = Lifetime {
            ttl_s: None,
            expires_at_ms: Some(5000),
        };
        assert!(!s.expired(4999) && s.expired(5000));
        assert!(!s.read_should_touch(1_000_000));
    }
}
