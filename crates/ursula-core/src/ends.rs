//! The end offsets of a stream's messages ([`crate::stream::StreamState::ends`]), kept so that
//! a clone is cheap.
//!
//! A group's state is cloned for every Raft snapshot, on the task that applies the log; a
//! stream's message ends are 8 bytes per message since its retained start (millions for a
//! busy stream), and a `Vec` of them was copied whole each time. Here they are kept in
//! chunks of [`CHUNK`]: full chunks are immutable and shared between clones (`Arc`), so a
//! clone copies one pointer per chunk and the open chunk. Dropping ends from the front
//! (retention) frees whole chunks. The serialized form is that of a `Vec<u64>` (a length,
//! then the values), so the persisted encoding did not change.

use serde::de::{SeqAccess, Visitor};
use serde::ser::SerializeSeq;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::VecDeque;
use std::sync::Arc;

/// Ends per shared chunk (32 KiB).
pub const CHUNK: usize = 4096;

/// Increasing `u64`s, appended at the back and dropped from the front.
#[derive(Clone, Default)]
pub struct Ends {
    /// Full chunks, each exactly [`CHUNK`] long, shared with clones.
    full: VecDeque<Arc<[u64]>>,
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
            self.full.get(j / CHUNK)?.get(j % CHUNK).copied()
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
            self.full.push_back(Arc::from(full));
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
            c.get(from..).unwrap_or_default().iter().copied()
        });
        first.chain(self.open.iter().copied())
    }

    /// Drops the first `n` ends (all of them if there are fewer).
    pub fn drop_front(&mut self, n: usize) {
        let mut n = n.min(self.len());
        while n > 0 {
            if self.full.is_empty() {
                self.open.drain(..n);
                return;
            }
            let here = CHUNK - self.skip;
            if n >= here {
                self.full.pop_front();
                self.skip = 0;
                n -= here;
            } else {
                self.skip += n;
                n = 0;
            }
        }
        if self.open.is_empty() && self.full.is_empty() {
            self.open = Vec::new();
        }
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
        let mut seq = s.serialize_seq(Some(self.len()))?;
        for e in self.iter() {
            seq.serialize_element(&e)?;
        }
        seq.end()
    }
}

impl<'de> Deserialize<'de> for Ends {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Ends, D::Error> {
        struct Seq;
        impl<'de> Visitor<'de> for Seq {
            type Value = Ends;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a sequence of message ends")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Ends, A::Error> {
                let mut e = Ends::default();
                while let Some(x) = seq.next_element::<u64>()? {
                    e.push(x);
                }
                Ok(e)
            }
        }
        d.deserialize_seq(Seq)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Every operation answers as the same operation on a `Vec<u64>` does.
        #[test]
        fn behaves_as_a_vec(ops in prop::collection::vec((0u8..3, 0usize..3 * CHUNK), 1..40)) {
            let (mut e, mut v) = (Ends::default(), Vec::<u64>::new());
            let mut next = 1u64;
            for (op, n) in ops {
                match op {
                    0 => for _ in 0..n { e.push(next); v.push(next); next += 3; },
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
    fn the_encoding_is_that_of_a_vec() {
        let v: Vec<u64> = (1..=(2 * CHUNK as u64 + 7)).collect();
        let mut e = Ends::from(v.clone());
        e.drop_front(5);
        let bytes = bincode::serialize(&e).unwrap();
        assert_eq!(bytes, bincode::serialize(&v[5..].to_vec()).unwrap());
        let back: Ends = bincode::deserialize(&bytes).unwrap();
        assert_eq!(back, e);
    }

    #[test]
    fn a_clone_shares_the_full_chunks() {
        let e = Ends::from((0..(3 * CHUNK as u64)).collect::<Vec<_>>());
        let c = e.clone();
        assert!(e.full.iter().zip(&c.full).all(|(a, b)| Arc::ptr_eq(a, b)));
        assert_eq!(e.full.len(), 3);
        assert!(e.open.is_empty());
    }
}
