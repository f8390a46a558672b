//! Timestamped text payloads for delivery-latency scenarios.
//!
//! One append carries one record `"{seq},{sent_ns},{padding};"` where
//! `sent_ns` is nanoseconds since the process-wide `Clock` origin (writer
//! and readers live in the same process, so a monotonic clock works). The
//! `;` terminator lets a reader split records when a server coalesces
//! several appends into one SSE event or one long-poll body.

use std::sync::OnceLock;
use std::time::Instant;

fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

/// Monotonic nanoseconds since the first call in this process.
pub fn now_ns() -> u64 {
    origin().elapsed().as_nanos() as u64
}

/// Make the record for `seq`, padded with '.' to at least `size` bytes.
pub fn encode(seq: u64, sent_ns: u64, size: usize) -> String {
    let mut s = format!("{seq},{sent_ns},");
    while s.len() + 1 < size {
        s.push('.');
    }
    s.push(';');
    s
}

/// Parse every complete record in `text`; calls `f(seq, sent_ns)`.
/// Returns the number of records that did not parse.
pub fn decode(text: &str, mut f: impl FnMut(u64, u64)) -> u64 {
    let mut bad = 0;
    for rec in text.split(';') {
        let rec = rec.trim_matches(|c| c == '\n' || c == '\r');
        if rec.is_empty() {
            continue;
        }
        let mut it = rec.splitn(3, ',');
        let seq = it.next().and_then(|x| x.parse::<u64>().ok());
        let ts = it.next().and_then(|x| x.parse::<u64>().ok());
        match (seq, ts) {
            (Some(seq), Some(ts)) => f(seq, ts),
            _ => bad += 1,
        }
    }
    bad
}

/// Which sequence numbers a reader has seen (growable bitset).
#[derive(Default, Debug, Clone)]
pub struct SeqSet {
    bits: Vec<u64>,
    unique: u64,
    duplicates: u64,
}

impl SeqSet {
    /// Returns true if `seq` was new.
    pub fn insert(&mut self, seq: u64) -> bool {
        let word = (seq / 64) as usize;
        if word >= self.bits.len() {
            self.bits.resize(word + 1, 0);
        }
        let mask = 1u64 << (seq % 64);
        if self.bits[word] & mask != 0 {
            self.duplicates += 1;
            return false;
        }
        self.bits[word] |= mask;
        self.unique += 1;
        true
    }

    #[cfg(test)]
    pub fn contains(&self, seq: u64) -> bool {
        self.bits
            .get((seq / 64) as usize)
            .is_some_and(|w| w & (1u64 << (seq % 64)) != 0)
    }

    pub fn unique(&self) -> u64 {
        self.unique
    }

    pub fn duplicates(&self) -> u64 {
        self.duplicates
    }

    /// How many of `sent` are absent here.
    pub fn missing_from(&self, sent: &SeqSet) -> u64 {
        let mut n = 0u64;
        for (i, w) in sent.bits.iter().enumerate() {
            let mine = self.bits.get(i).copied().unwrap_or(0);
            n += u64::from((w & !mine).count_ones());
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_with_padding_and_coalescing() {
        let a = encode(7, 123_456, 64);
        assert_eq!(a.len(), 64);
        assert!(a.ends_with(';'));
        let b = encode(8, 9, 0);
        assert_eq!(b, "8,9,;");
        let joined = format!("{a}{b}\n");
        let mut got = Vec::new();
        let bad = decode(&joined, |s, t| got.push((s, t)));
        assert_eq!(bad, 0);
        assert_eq!(got, vec![(7, 123_456), (8, 9)]);
    }

    #[test]
    fn garbage_is_counted() {
        let mut n = 0;
        let bad = decode("x,y;1,2,...;", |_, _| n += 1);
        assert_eq!((bad, n), (1, 1));
    }

    #[test]
    fn seqset_tracks_unique_and_missing() {
        let mut sent = SeqSet::default();
        for s in 0..200 {
            sent.insert(s);
        }
        let mut got = SeqSet::default();
        assert!(got.insert(3));
        assert!(!got.insert(3));
        got.insert(150);
        assert!(got.contains(150));
        assert!(!got.contains(151));
        assert!(!got.contains(100_000));
        assert_eq!(got.unique(), 2);
        assert_eq!(got.duplicates(), 1);
        assert_eq!(got.missing_from(&sent), 198);
    }

    #[test]
    fn clock_is_monotonic() {
        let a = now_ns();
        let b = now_ns();
        assert!(b >= a);
    }
}
