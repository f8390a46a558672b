//! [`ByteLog`]: the bytes a stream still holds, in fixed-size chunks.
//!
//! A single `Vec<u8>` per stream reallocates, and copies everything it holds, each time it
//! doubles; that copy ran under the group's write lock (stalling every reader of the group) and
//! pulled fresh pages from the OS on every growth. Dropping a prefix for retention shifted the
//! whole remainder. Here full chunks never move: an append copies only its own bytes, and
//! retention frees whole chunks. A small stream stays one small, exactly grown buffer, so an
//! idle stream costs no more than before.
//!
//! Chunks are shared (`Arc`), so cloning a log costs one reference count per chunk, not a
//! copy of its bytes: a Raft snapshot clones the group state on the state-machine task and
//! encodes it elsewhere while appends go on. An append to a last chunk that a clone still
//! shares copies that chunk first (at most [`CHUNK_BYTES`]).

use bytes::Bytes;
use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};

/// Size of every chunk but the last.
pub const CHUNK_BYTES: usize = 64 * 1024;

/// Append-only bytes with a droppable prefix. Positions are relative to the first byte held.
#[derive(Clone, Default)]
pub struct ByteLog {
    /// Every chunk but the last holds exactly [`CHUNK_BYTES`]; the first `skip` bytes of the
    /// first chunk were dropped.
    chunks: VecDeque<Arc<Vec<u8>>>,
    skip: usize,
    len: usize,
}

impl ByteLog {
    /// An empty log (allocates nothing).
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no bytes are held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `bytes`.
    pub fn push(&mut self, mut bytes: &[u8]) {
        self.len += bytes.len();
        while !bytes.is_empty() {
            if self.chunks.back().is_none_or(|c| c.len() >= CHUNK_BYTES) {
                if self.chunks.is_empty() {
                    self.chunks.reserve_exact(1);
                }
                self.chunks.push_back(Arc::new(Vec::new()));
            }
            let only = self.chunks.len() == 1;
            let Some(last) = self.chunks.back_mut() else {
                return; // unreachable: a chunk with room was just ensured
            };
            // Copies the chunk only if a clone (a snapshot being encoded) still shares it.
            let last = Arc::make_mut(last);
            let n = (CHUNK_BYTES - last.len()).min(bytes.len());
            if last.capacity() - last.len() < n {
                // The first chunk grows by doubling (small streams stay small); later chunks
                // are allocated whole, once.
                let want = if only {
                    (last.len() + n)
                        .max(last.capacity().saturating_mul(2))
                        .min(CHUNK_BYTES)
                } else {
                    CHUNK_BYTES
                };
                last.reserve_exact(want - last.len());
            }
            let (head, rest) = bytes.split_at(n);
            last.extend_from_slice(head);
            bytes = rest;
        }
    }

    /// Drops the first `n` bytes (all of them if `n >= len`), freeing whole chunks.
    pub fn drop_front(&mut self, n: usize) {
        let n = n.min(self.len);
        self.len -= n;
        self.skip += n;
        while let Some(first) = self.chunks.front() {
            if self.skip < first.len() {
                break;
            }
            self.skip -= first.len();
            self.chunks.pop_front();
        }
        if self.chunks.is_empty() {
            self.skip = 0;
            self.chunks = VecDeque::new();
        } else if self.chunks.len() == 1 && self.skip > 0 {
            // A lone chunk is the whole log: compact it so a trimmed small stream gives its
            // memory back (positions stay consistent: it is chunk 0 either way).
            if let Some(c) = self.chunks.front_mut() {
                let c = Arc::make_mut(c);
                c.drain(..self.skip);
                c.shrink_to_fit();
            }
            self.skip = 0;
        }
    }

    /// The bytes of `[lo, hi)` as at most a few slices, in order. Out-of-range bounds are
    /// clamped to what is held.
    pub fn slices(&self, lo: usize, hi: usize) -> Slices<'_> {
        let hi = hi.min(self.len);
        let lo = lo.min(hi);
        Slices {
            log: self,
            pos: lo + self.skip,
            end: hi + self.skip,
        }
    }

    /// Appends the bytes of `[lo, hi)` (clamped) to `out`.
    pub fn copy_into(&self, lo: usize, hi: usize, out: &mut Vec<u8>) {
        for s in self.slices(lo, hi) {
            out.extend_from_slice(s);
        }
    }

    /// Hands the bytes of `[lo, hi)` (clamped) to `f` as [`Bytes`], one per chunk touched. A
    /// full chunk is shared, not copied: it stays alive as long as the `Bytes` do, and no
    /// append changes it. Bytes of the last chunk, still being filled, are copied (less than
    /// [`CHUNK_BYTES`]): shared, it would make the stream's next append copy the whole chunk
    /// under the group's lock, for as long as the `Bytes` live (a paced upload, say).
    pub fn share_into(&self, lo: usize, hi: usize, mut f: impl FnMut(Bytes)) {
        let hi = hi.min(self.len);
        let mut pos = lo.min(hi) + self.skip;
        let end = hi + self.skip;
        while pos < end {
            let Some(chunk) = self.chunks.get(pos / CHUNK_BYTES) else {
                return;
            };
            let at = pos % CHUNK_BYTES;
            let n = (end - pos).min(chunk.len().saturating_sub(at));
            if n == 0 {
                return;
            }
            if chunk.len() < CHUNK_BYTES {
                f(Bytes::copy_from_slice(&chunk[at..at + n]));
            } else {
                f(Bytes::from_owner(SharedChunk(Arc::clone(chunk))).slice(at..at + n));
            }
            pos += n;
        }
    }

    /// All bytes held, as one vector (tests and tools).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len);
        self.copy_into(0, self.len, &mut v);
        v
    }

    /// Builds a log holding `v`, reusing its buffer when it fits in one chunk.
    pub fn from_vec(v: Vec<u8>) -> Self {
        if v.len() <= CHUNK_BYTES {
            let len = v.len();
            let chunks = if v.is_empty() {
                VecDeque::new()
            } else {
                VecDeque::from([Arc::new(v)])
            };
            return ByteLog {
                chunks,
                skip: 0,
                len,
            };
        }
        let mut log = ByteLog::new();
        log.push(&v);
        log
    }
}

/// A chunk shared with a [`Bytes`] handed out by [`ByteLog::share_into`].
struct SharedChunk(Arc<Vec<u8>>);

impl AsRef<[u8]> for SharedChunk {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

/// Iterator over the slices of a range of a [`ByteLog`].
#[derive(Debug)]
pub struct Slices<'a> {
    log: &'a ByteLog,
    /// Positions counted from the start of the first chunk (i.e. including `skip`).
    pos: usize,
    end: usize,
}

impl<'a> Iterator for Slices<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.pos >= self.end {
            return None;
        }
        let chunk = self.log.chunks.get(self.pos / CHUNK_BYTES)?;
        let at = self.pos % CHUNK_BYTES;
        let n = (self.end - self.pos).min(chunk.len().saturating_sub(at));
        if n == 0 {
            self.pos = self.end;
            return None;
        }
        self.pos += n;
        chunk.get(at..at + n)
    }
}

impl PartialEq for ByteLog {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len
            && self
                .slices(0, self.len)
                .flatten()
                .eq(other.slices(0, other.len).flatten())
    }
}

impl Eq for ByteLog {}

impl fmt::Debug for ByteLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ByteLog")
            .field("len", &self.len)
            .field("chunks", &self.chunks.len())
            .finish()
    }
}

/// Serialized as one byte string. With bincode (snapshots) that is exactly the encoding of the
/// `Vec<u8>` this type replaced (a `u64` length, then the bytes), so snapshot files keep their
/// format, and it is written and read in bulk rather than byte by byte.
impl Serialize for ByteLog {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.chunks.len() {
            0 => serializer.serialize_bytes(&[]),
            1 => serializer.serialize_bytes(self.slices(0, self.len).next().unwrap_or(&[])),
            _ => serializer.serialize_bytes(&self.to_vec()),
        }
    }
}

struct ByteLogVisitor;

impl<'de> Visitor<'de> for ByteLogVisitor {
    type Value = ByteLog;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a byte string")
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<ByteLog, E> {
        let mut log = ByteLog::new();
        log.push(v);
        Ok(log)
    }

    fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<ByteLog, E> {
        Ok(ByteLog::from_vec(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ByteLog, A::Error> {
        let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(CHUNK_BYTES));
        while let Some(b) = seq.next_element::<u8>()? {
            v.push(b);
        }
        Ok(ByteLog::from_vec(v))
    }
}

impl<'de> Deserialize<'de> for ByteLog {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_byte_buf(ByteLogVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn small_log_is_one_exact_buffer() {
        let mut log = ByteLog::new();
        log.push(b"hello");
        assert_eq!(log.chunks.len(), 1);
        assert!(log.chunks[0].capacity() < 64);
        assert_eq!(log.to_vec(), b"hello");
    }

    #[test]
    fn spans_chunks_and_reads_across_them() {
        let mut log = ByteLog::new();
        let data: Vec<u8> = (0..3 * CHUNK_BYTES + 17).map(|i| (i % 251) as u8).collect();
        log.push(&data[..100]);
        log.push(&data[100..]);
        assert_eq!(log.len(), data.len());
        assert_eq!(log.chunks.len(), 4);
        let lo = CHUNK_BYTES - 3;
        let hi = 2 * CHUNK_BYTES + 5;
        let mut out = Vec::new();
        log.copy_into(lo, hi, &mut out);
        assert_eq!(out, &data[lo..hi]);
        assert_eq!(log.slices(lo, hi).count(), 3);
    }

    #[test]
    fn a_clone_shares_chunks_and_keeps_its_bytes_while_the_original_changes() {
        let data: Vec<u8> = (0..3 * CHUNK_BYTES + 100)
            .map(|i| (i % 251) as u8)
            .collect();
        let mut a = ByteLog::new();
        a.push(&data);
        let b = a.clone();
        assert!(
            Arc::ptr_eq(&a.chunks[0], &b.chunks[0]),
            "full chunks are shared"
        );
        a.push(b"more");
        a.drop_front(CHUNK_BYTES + 5);
        assert_eq!(b.to_vec(), data);
        let mut want = data[CHUNK_BYTES + 5..].to_vec();
        want.extend_from_slice(b"more");
        assert_eq!(a.to_vec(), want);

        // A small log (one shared chunk) compacted by retention.
        let mut small = ByteLog::from_vec(b"hello world".to_vec());
        let snap = small.clone();
        small.drop_front(6);
        small.push(b"!");
        assert_eq!(small.to_vec(), b"world!");
        assert_eq!(snap.to_vec(), b"hello world");
    }

    #[test]
    fn shared_bytes_reference_full_chunks_and_copy_the_one_being_filled() {
        let data: Vec<u8> = (0..2 * CHUNK_BYTES + 100)
            .map(|i| (i % 251) as u8)
            .collect();
        let mut log = ByteLog::new();
        log.push(&data);
        let mut out = Vec::new();
        log.share_into(10, data.len(), |b| out.push(b));
        assert_eq!(out.concat(), &data[10..]);
        assert_eq!(out.len(), 3);
        let last = Arc::clone(&log.chunks[2]);
        assert!(
            std::ptr::eq(out[1].as_ptr(), log.chunks[1].as_ptr()),
            "shared"
        );
        assert!(!std::ptr::eq(out[2].as_ptr(), last.as_ptr()), "copied");
        drop(last);
        // The chunk being filled is not shared, so an append extends it in place.
        let before = log.chunks[2].as_ptr();
        log.push(b"more");
        assert_eq!(log.chunks[2].as_ptr(), before);
        assert_eq!(out.concat(), &data[10..]);
    }

    #[test]
    fn drop_front_frees_whole_chunks() {
        let mut log = ByteLog::new();
        let data = vec![7u8; 2 * CHUNK_BYTES + 10];
        log.push(&data);
        log.drop_front(CHUNK_BYTES + 1);
        assert_eq!(log.chunks.len(), 2);
        assert_eq!(log.len(), CHUNK_BYTES + 9);
        log.drop_front(usize::MAX);
        assert!(log.is_empty());
        assert!(log.chunks.is_empty());
        log.push(b"again");
        assert_eq!(log.to_vec(), b"again");
    }

    #[test]
    fn serializes_like_a_vec() {
        let data: Vec<u8> = (0..CHUNK_BYTES + 300).map(|i| (i % 7) as u8).collect();
        let mut log = ByteLog::new();
        log.push(&data);
        log.drop_front(5);
        let a = bincode::serialize(&log).unwrap();
        let b = bincode::serialize(&data[5..].to_vec()).unwrap();
        assert_eq!(a, b);
        let back: ByteLog = bincode::deserialize(&a).unwrap();
        assert_eq!(back, log);
        assert_eq!(back.to_vec(), &data[5..]);
        // A one-chunk and an empty log too, and old files (a serialized Vec) load.
        for v in [b"small".to_vec(), Vec::new()] {
            let one = ByteLog::from_vec(v.clone());
            assert_eq!(
                bincode::serialize(&one).unwrap(),
                bincode::serialize(&v).unwrap()
            );
            let back: ByteLog = bincode::deserialize(&bincode::serialize(&v).unwrap()).unwrap();
            assert_eq!(back.to_vec(), v);
        }
    }

    proptest! {
        /// Any sequence of appends, prefix drops and range reads behaves like one `Vec<u8>`.
        #[test]
        fn behaves_like_a_vec(
            ops in proptest::collection::vec(
                prop_oneof![
                    (1usize..3 * CHUNK_BYTES).prop_map(|n| (0u8, n, 0usize)),
                    (0usize..2 * CHUNK_BYTES).prop_map(|n| (1u8, n, 0usize)),
                    (0usize..4 * CHUNK_BYTES, 0usize..4 * CHUNK_BYTES).prop_map(|(a, b)| (2u8, a, b)),
                ],
                1..40,
            )
        ) {
            let mut log = ByteLog::new();
            let mut model: Vec<u8> = Vec::new();
            let mut next = 0u32;
            for (op, a, b) in ops {
                match op {
                    0 => {
                        let bytes: Vec<u8> = (0..a).map(|i| (next as usize + i) as u8).collect();
                        next = next.wrapping_add(a as u32);
                        log.push(&bytes);
                        model.extend_from_slice(&bytes);
                    }
                    1 => {
                        log.drop_front(a);
                        model.drain(..a.min(model.len()));
                    }
                    _ => {
                        let hi = b.min(model.len());
                        let lo = a.min(hi);
                        let mut out = Vec::new();
                        log.copy_into(a, b, &mut out);
                        prop_assert_eq!(&out[..], &model[lo..hi]);
                    }
                }
                prop_assert_eq!(log.len(), model.len());
            }
            prop_assert_eq!(log.to_vec(), model);
        }
    }
}
