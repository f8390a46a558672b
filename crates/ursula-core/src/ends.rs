//! The end offsets of a stream's messages ([`crate::stream::StreamState::ends`]), kept so that
//! a clone is cheap.
//!
//! A group's state is cloned for every Raft snapshot, on the task that applies the log; a
//! stream's message ends are 8 bytes per message since its retained start (millions for a
//! busy stream), and a `Vec` of them was copied whole each time. Here they are kept in
//! chunks of [`CHUNK`]: full chunks are immutable and shared between clones (`Arc`), so a
//! clone copies one pointer per chunk and the open chunk. A full chunk keeps its ends as 4-byte
//! offsets from its first unless it spans 4 GiB or more: 4 bytes a message in memory. Dropping ends from the front
//! (retention) frees whole chunks.
//!
//! Persisted (schema 4, [`crate::encoding`]) as the count, then each end's difference from the
//! one before (the first's from 0) in LEB128: about two bytes a message where a `Vec<u64>`
//! (schemas 1 to 3, read through the frozen types of `encoding::v3`) took eight. A group
//! snapshot carries every stream's ends, so they were most of a busy stream's snapshot.

use serde::de::{Error as _, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::VecDeque;
use std::sync::Arc;

/// Ends per shared chunk (16 KiB as 4-byte offsets; 32 KiB for a chunk spanning 4 GiB or more).
pub const CHUNK: usize = 4096;

/// A full chunk of [`CHUNK`] ends, shared with clones. Most chunks span less than 4 GiB, so
/// they hold each end as a 4-byte offset from the chunk's first: half the memory.
#[derive(Clone)]
enum Sealed {
    Near { base: u64, offsets: Arc<[u32]> },
    Far(Arc<[u64]>),
}

impl Sealed {
    fn of(ends: Vec<u64>) -> Sealed {
        let base = ends.first().copied().unwrap_or(0);
        let near: Option<Vec<u32>> = ends
            .iter()
            .map(|e| e.checked_sub(base).and_then(|d| u32::try_from(d).ok()))
            .collect();
        match near {
            Some(offsets) => Sealed::Near {
                base,
                offsets: Arc::from(offsets),
            },
            None => Sealed::Far(Arc::from(ends)),
        }
    }

    fn heap_bytes(&self) -> u64 {
        match self {
            Sealed::Near { offsets, .. } => offsets.len() as u64 * 4,
            Sealed::Far(ends) => ends.len() as u64 * 8,
        }
    }

    fn get(&self, i: usize) -> Option<u64> {
        match self {
            Sealed::Near { base, offsets } => offsets.get(i).map(|o| base + u64::from(*o)),
            Sealed::Far(ends) => ends.get(i).copied(),
        }
    }

    fn iter_from(&self, from: usize) -> impl Iterator<Item = u64> + '_ {
        (from..CHUNK).filter_map(move |i| self.get(i))
    }

    #[cfg(test)]
    fn shares(&self, other: &Sealed) -> bool {
        match (self, other) {
            (Sealed::Near { offsets: a, .. }, Sealed::Near { offsets: b, .. }) => Arc::ptr_eq(a, b),
            (Sealed::Far(a), Sealed::Far(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

/// Increasing `u64`s, appended at the back and dropped from the front.
#[derive(Clone, Default)]
pub struct Ends {
    /// Full chunks, each exactly [`CHUNK`] long, shared with clones.
    full: VecDeque<Sealed>,
    /// Ends of `full[0]` already dropped (`< CHUNK`; 0 when `full` is empty).
    skip: usize,
    /// The chunk being filled (`< CHUNK` long).
    open: Vec<u64>,
}

impl Ends {
    pub fn len(&self) -> usize {
        self.full.len() * CHUNK - self.skip + self.open.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, i: usize) -> Option<u64> {
        let j = i.checked_add(self.skip)?;
        let in_full = self.full.len() * CHUNK;
        if j < in_full {
            self.full.get(j / CHUNK)?.get(j % CHUNK)
        } else {
            self.open.get(j - in_full).copied()
        }
    }

    pub fn last(&self) -> Option<u64> {
        self.len().checked_sub(1).and_then(|i| self.get(i))
    }

    pub fn push(&mut self, end: u64) {
        self.open.push(end);
        if self.open.len() == CHUNK {
            // A stream that filled one chunk will likely fill the next: give it the room.
            let full = std::mem::replace(&mut self.open, Vec::with_capacity(CHUNK));
            self.full.push_back(Sealed::of(full));
        }
    }

    /// The index of the first end in `[from, to)` for which `pred` is false (`to` if none),
    /// given that `pred` holds for a prefix of them, as [`slice::partition_point`].
    pub fn partition_point_in(&self, from: usize, to: usize, pred: impl Fn(u64) -> bool) -> usize {
        let (mut lo, mut hi) = (from, to.min(self.len()).max(from));
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.get(mid) {
                Some(e) if pred(e) => lo = mid + 1,
                _ => hi = mid,
            }
        }
        lo
    }

    /// [`Ends::partition_point_in`] over all of them.
    pub fn partition_point(&self, pred: impl Fn(u64) -> bool) -> usize {
        self.partition_point_in(0, self.len(), pred)
    }

    /// Where `end` is, as [`slice::binary_search`].
    pub fn binary_search(&self, end: u64) -> Result<usize, usize> {
        let i = self.partition_point(|e| e < end);
        match self.get(i) {
            Some(e) if e == end => Ok(i),
            _ => Err(i),
        }
    }

    /// The ends `[from, to)` (clamped to the ends there are).
    pub fn to_vec(&self, from: usize, to: usize) -> Vec<u64> {
        let to = to.min(self.len());
        (from.min(to)..to).filter_map(|i| self.get(i)).collect()
    }

    /// Every end, in order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        let first = self.full.iter().enumerate().flat_map(move |(k, c)| {
            let from = if k == 0 { self.skip } else { 0 };
            c.iter_from(from)
        });
        first.chain(self.open.iter().copied())
    }

    /// Bytes of memory the ends take (their chunks and the open chunk's buffer).
    pub fn heap_bytes(&self) -> u64 {
        let full: u64 = self.full.iter().map(Sealed::heap_bytes).sum();
        full + self.open.capacity() as u64 * 8
    }

    /// Drops the first `n` ends (all of them if there are fewer); returns the bytes of memory
    /// that freed (whole chunks, and the open chunk's buffer once nothing is left).
    pub fn drop_front(&mut self, n: usize) -> u64 {
        let mut n = n.min(self.len());
        let mut freed = 0;
        while n > 0 {
            if self.full.is_empty() {
                self.open.drain(..n);
                break;
            }
            let here = CHUNK - self.skip;
            if n >= here {
                freed += self.full.pop_front().map_or(0, |c| c.heap_bytes());
                self.skip = 0;
                n -= here;
            } else {
                self.skip += n;
                n = 0;
            }
        }
        if self.open.is_empty() && self.full.is_empty() {
            freed += self.open.capacity() as u64 * 8;
            self.open = Vec::new();
        }
        freed
    }
}

impl Extend<u64> for Ends {
    fn extend<I: IntoIterator<Item = u64>>(&mut self, ends: I) {
        for e in ends {
            self.push(e);
        }
    }
}

impl From<Vec<u64>> for Ends {
    fn from(v: Vec<u64>) -> Ends {
        let mut e = Ends::default();
        for x in v {
            e.push(x);
        }
        e
    }
}

impl PartialEq for Ends {
    fn eq(&self, other: &Ends) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for Ends {}

impl PartialEq<Vec<u64>> for Ends {
    fn eq(&self, other: &Vec<u64>) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter().copied())
    }
}

impl std::fmt::Debug for Ends {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Serialize for Ends {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut packed = Vec::with_capacity(self.len().saturating_mul(2));
        let mut prev = 0u64;
        for e in self.iter() {
            // Wrapping, so that any sequence comes back exactly (ends only ever increase).
            put_varint(&mut packed, e.wrapping_sub(prev));
            prev = e;
        }
        (self.len() as u64, Packed(packed)).serialize(s)
    }
}

impl<'de> Deserialize<'de> for Ends {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Ends, D::Error> {
        let (count, Packed(packed)) = <(u64, Packed)>::deserialize(d)?;
        let mut e = Ends::default();
        let (mut rest, mut prev) = (&packed[..], 0u64);
        while !rest.is_empty() {
            let delta = take_varint(&mut rest).ok_or_else(|| {
                D::Error::custom("a message end's varint is cut short or too long")
            })?;
            prev = prev.wrapping_add(delta);
            e.push(prev);
        }
        if e.len() as u64 != count {
            return Err(D::Error::custom(format!(
                "{count} message ends announced, {} packed",
                e.len()
            )));
        }
        Ok(e)
    }
}

/// Bytes serialized as one run (`serialize_bytes`: a length and the bytes in bincode).
struct Packed(Vec<u8>);

impl Serialize for Packed {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Packed {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Packed, D::Error> {
        struct Run;
        impl<'de> Visitor<'de> for Run {
            type Value = Packed;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("packed message ends")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Packed, E> {
                Ok(Packed(v.to_vec()))
            }
            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Packed, E> {
                Ok(Packed(v))
            }
        }
        d.deserialize_byte_buf(Run)
    }
}

// LEB128 by hand: a dozen lines, less than a dependency for them.

/// Appends `v` in LEB128: seven bits a byte, low bits first, the high bit set on all but the
/// last byte.
fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Takes one LEB128 value from the front of `rest`; `None` if it is cut short or does not fit
/// in 64 bits.
fn take_varint(rest: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for (i, &b) in rest.iter().enumerate().take(10) {
        let bits = u64::from(b & 0x7f);
        if i == 9 && bits > 1 {
            return None;
        }
        v |= bits << (7 * i);
        if b & 0x80 == 0 {
            *rest = &rest[i + 1..];
            return Some(v);
        }
    }
    None
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn dropping_whole_chunks_frees_their_memory_and_a_part_of_one_frees_none() {
        let mut e = Ends::default();
        for i in 0..(3 * CHUNK as u64) {
            e.push(10 * i);
        }
        // Three full chunks of 4-byte offsets, and the room made for the next chunk.
        let chunk = CHUNK as u64 * 4;
        let open = CHUNK as u64 * 8;
        assert_eq!(e.heap_bytes(), 3 * chunk + open);
        assert_eq!(e.drop_front(CHUNK / 2), 0);
        assert_eq!(e.heap_bytes(), 3 * chunk + open);
        assert_eq!(e.drop_front(CHUNK), chunk);
        assert_eq!(e.heap_bytes(), 2 * chunk + open);
        assert_eq!(e.drop_front(usize::MAX), 2 * chunk + open);
        assert_eq!(e.heap_bytes(), 0);
    }

    proptest! {
        /// Every operation answers as the same operation on a `Vec<u64>` does.
        #[test]
        fn behaves_as_a_vec(ops in prop::collection::vec((0u8..4, 0usize..3 * CHUNK), 1..40)) {
            let (mut e, mut v) = (Ends::default(), Vec::<u64>::new());
            let mut next = 1u64;
            for (op, n) in ops {
                match op {
                    0 => for _ in 0..n { e.push(next); v.push(next); next += 3; },
                    // Ends far apart: chunks that span more than a 4-byte offset can reach.
                    3 => for _ in 0..n.min(16) { e.push(next); v.push(next); next += 1 << 31; },
                    1 => { let k = n.min(v.len()); e.drop_front(n); v.drain(..k); }
                    _ => {
                        let c = e.clone();
                        prop_assert_eq!(c.iter().collect::<Vec<_>>(), v.clone());
                    }
                }
                prop_assert_eq!(e.len(), v.len());
                prop_assert_eq!(e.iter().collect::<Vec<_>>(), v.clone());
                prop_assert_eq!(e.last(), v.last().copied());
                for probe in [0, 1, next / 2, next / 2 + 1, next] {
                    prop_assert_eq!(e.binary_search(probe), v.binary_search(&probe));
                    prop_assert_eq!(e.partition_point(|x| x <= probe), v.partition_point(|x| *x <= probe));
                }
                let (a, b) = (v.len() / 3, 2 * v.len() / 3);
                prop_assert_eq!(e.to_vec(a, b), v[a..b].to_vec());
                let within = v[a..b].partition_point(|x| *x <= next / 2);
                prop_assert_eq!(e.partition_point_in(a, b, |x| x <= next / 2), a + within);
            }
        }
    }

    #[test]
    fn the_encoding_is_the_count_and_packed_differences() {
        let e = Ends::from(vec![5, 133, 261, 16_645]);
        let bytes = bincode::serialize(&e).unwrap();
        let mut want = 4u64.to_le_bytes().to_vec();
        let packed = [5, 0x80, 0x01, 0x80, 0x01, 0x80, 0x80, 0x01];
        want.extend_from_slice(&(packed.len() as u64).to_le_bytes());
        want.extend_from_slice(&packed);
        assert_eq!(bytes, want);
        let back: Ends = bincode::deserialize(&bytes).unwrap();
        assert_eq!(back, e);
    }

    #[test]
    fn damaged_packed_ends_are_refused() {
        let bytes = bincode::serialize(&Ends::from(vec![1, 200, 70_000])).unwrap();
        // A count that does not match, a varint cut short, a varint past 64 bits.
        let mut wrong = bytes.clone();
        wrong[0] = 2;
        assert!(bincode::deserialize::<Ends>(&wrong).is_err());
        let mut cut = 3u64.to_le_bytes().to_vec();
        cut.extend_from_slice(&2u64.to_le_bytes());
        cut.extend_from_slice(&[1, 0x80]);
        assert!(bincode::deserialize::<Ends>(&cut).is_err());
        let mut long = 1u64.to_le_bytes().to_vec();
        long.extend_from_slice(&11u64.to_le_bytes());
        long.extend_from_slice(&[0xff; 10]);
        long.push(0x01);
        assert!(bincode::deserialize::<Ends>(&long).is_err());
    }

    proptest! {
        /// Any sequence comes back exactly, in about two bytes a message for typical appends.
        #[test]
        fn packed_ends_round_trip(v in prop::collection::vec(any::<u64>(), 0..300), drop in 0usize..50) {
            let mut e = Ends::from(v.clone());
            e.drop_front(drop);
            let bytes = bincode::serialize(&e).unwrap();
            let back: Ends = bincode::deserialize(&bytes).unwrap();
            prop_assert_eq!(back, e);
        }

        #[test]
        fn varints_round_trip(x in any::<u64>()) {
            let mut buf = Vec::new();
            put_varint(&mut buf, x);
            let mut rest = &buf[..];
            prop_assert_eq!(take_varint(&mut rest), Some(x));
            prop_assert!(rest.is_empty());
        }
    }

    #[test]
    fn full_chunks_keep_four_byte_offsets_unless_they_span_4_gib() {
        let near = Ends::from(
            (0..CHUNK as u64)
                .map(|i| (1 << 40) + i * 1000)
                .collect::<Vec<_>>(),
        );
        assert!(matches!(near.full[0], Sealed::Near { .. }));
        let mut far: Vec<u64> = (1..CHUNK as u64).collect();
        far.push(1 << 33);
        let far = Ends::from(far);
        assert!(matches!(far.full[0], Sealed::Far(_)));
        assert_eq!(far.get(CHUNK - 1), Some(1 << 33));
        assert_eq!(
            near.get(CHUNK - 1),
            Some((1 << 40) + (CHUNK as u64 - 1) * 1000)
        );
    }

    #[test]
    fn appends_of_a_few_hundred_bytes_pack_into_two_bytes_each() {
        let e = Ends::from((1..=10_000u64).map(|i| i * 230).collect::<Vec<_>>());
        let bytes = bincode::serialize(&e).unwrap();
        assert_eq!(bytes.len(), 16 + 2 * 10_000);
    }

    #[test]
    fn a_clone_shares_the_full_chunks() {
        let e = Ends::from((0..(3 * CHUNK as u64)).collect::<Vec<_>>());
        let c = e.clone();
        assert!(e.full.iter().zip(&c.full).all(|(a, b)| a.shares(b)));
        assert_eq!(e.full.len(), 3);
        assert!(e.open.is_empty());
    }
}
