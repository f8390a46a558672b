//! The layout of a cold chunk object: the flushed bytes of one or more streams, packed by a
//! group's leader (cluster.md §6.2). Pure encoding and decoding, no IO.
//!
//! A chunk object is a [`crate::cold::object`] frame with magic `UCHK`, version 1. Readers
//! fetch ranges of an object, not whole objects, and the frame's checksum covers the whole
//! object, so the body carries checksums of its own: the payload is cut into blocks of
//! [`BLOCK_SIZE`] bytes (the last one shorter), each followed by its crc32c, and a ranged
//! read fetches and checks just the blocks it touches. Payload position `p` is at object
//! offset `HEADER_LEN + (p / B) * (B + 4) + p % B`. The frame's own checksum still lets a
//! whole-object read (a copy, a compaction, a scrub) check everything at once.

use crate::cold::object::{HEADER_LEN, ObjectWriter, magic};
use bytes::Bytes;
use std::fmt;
use std::ops::Range;

/// Frame version of chunk objects written by this build.
pub const CHUNK_VERSION: u16 = 1;
/// Payload bytes per block in version 1. Persisted: must stay stable for version 1.
pub const BLOCK_SIZE: u64 = 64 * 1024;
const CRC_LEN: u64 = 4;

/// Why a chunk read was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChunkError {
    /// The requested range is empty or not inside the payload.
    OutOfRange { pos: u64, len: u64, payload: u64 },
    /// The fetched bytes are not the blocks the range needs.
    Short { expected: u64, got: u64 },
    /// A block failed its checksum: the object is corrupt.
    BadBlock { block: u64 },
}

impl fmt::Display for ChunkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChunkError::OutOfRange { pos, len, payload } => write!(
                f,
                "range {pos}+{len} is outside the chunk payload of {payload} bytes"
            ),
            ChunkError::Short { expected, got } => {
                write!(
                    f,
                    "fetched {got} bytes of chunk blocks, expected {expected}"
                )
            }
            ChunkError::BadBlock { block } => write!(f, "chunk block {block} fails its checksum"),
        }
    }
}

impl std::error::Error for ChunkError {}

/// Where the blocks of a version-1 chunk object of `payload_len` payload bytes lie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkLayout {
    pub payload_len: u64,
}

impl ChunkLayout {
    pub fn new(payload_len: u64) -> Self {
        ChunkLayout { payload_len }
    }

    /// Body bytes (blocks and their checksums).
    pub fn body_len(&self) -> u64 {
        self.payload_len + self.payload_len.div_ceil(BLOCK_SIZE) * CRC_LEN
    }

    /// The object byte range holding every block that payload `[pos, pos + len)` touches.
    pub fn object_range(&self, pos: u64, len: u64) -> Result<Range<u64>, ChunkError> {
        let end = pos.checked_add(len).filter(|e| *e <= self.payload_len);
        let Some(end) = end.filter(|_| len > 0) else {
            return Err(ChunkError::OutOfRange {
                pos,
                len,
                payload: self.payload_len,
            });
        };
        let (first, last) = (pos / BLOCK_SIZE, (end - 1) / BLOCK_SIZE);
        let last_len = (self.payload_len - last * BLOCK_SIZE).min(BLOCK_SIZE);
        Ok(self.block_offset(first)..self.block_offset(last) + last_len + CRC_LEN)
    }

    /// Blocks of the payload.
    pub fn blocks(&self) -> u64 {
        self.payload_len.div_ceil(BLOCK_SIZE)
    }

    /// Where payload block `block`'s bytes start in the object (its checksum follows them).
    pub fn block_offset(&self, block: u64) -> u64 {
        HEADER_LEN as u64 + block * (BLOCK_SIZE + CRC_LEN)
    }

    /// Checks the blocks fetched for [`ChunkLayout::object_range`]`(pos, len)` and appends
    /// payload `[pos, pos + len)` to `out` as slices of `fetched` (one per block touched, no
    /// copy).
    pub fn extract(
        &self,
        fetched: &Bytes,
        pos: u64,
        len: u64,
        out: &mut Vec<Bytes>,
    ) -> Result<(), ChunkError> {
        let range = self.object_range(pos, len)?;
        let expected = range.end - range.start;
        if fetched.len() as u64 != expected {
            return Err(ChunkError::Short {
                expected,
                got: fetched.len() as u64,
            });
        }
        let mark = out.len();
        let mut block = pos / BLOCK_SIZE;
        let mut at = 0usize;
        let end = pos + len;
        while at < fetched.len() {
            let start = block * BLOCK_SIZE;
            let n = (self.payload_len - start).min(BLOCK_SIZE) as usize;
            let data = fetched.get(at..at + n);
            let crc = fetched.get(at + n..at + n + CRC_LEN as usize);
            let want = crc.and_then(|c| <[u8; 4]>::try_from(c).ok().map(u32::from_le_bytes));
            if data.is_none_or(|d| want != Some(crc32c::crc32c(d))) {
                out.truncate(mark);
                return Err(ChunkError::BadBlock { block });
            }
            let lo = (pos.max(start) - start) as usize;
            let hi = (end.min(start + n as u64) - start) as usize;
            out.push(fetched.slice(at + lo..at + hi));
            at += n + CRC_LEN as usize;
            block += 1;
        }
        Ok(())
    }
}

/// Builds a chunk object from payload pieces, written in order, without joining them first.
pub struct ChunkWriter {
    out: Vec<u8>,
    frame: ObjectWriter,
    /// Payload bytes in the block being filled, and where that block starts in `out`.
    in_block: usize,
    block_at: usize,
    written: u64,
    expected: u64,
}

impl ChunkWriter {
    /// A writer for an object of exactly `payload_len` payload bytes.
    pub fn new(payload_len: u64) -> ChunkWriter {
        let layout = ChunkLayout::new(payload_len);
        let frame = ObjectWriter::new(magic::CHUNK, CHUNK_VERSION, layout.body_len());
        let cap = HEADER_LEN as u64 + layout.body_len() + 8;
        let mut out = Vec::with_capacity(usize::try_from(cap).unwrap_or(0));
        out.extend_from_slice(frame.header());
        ChunkWriter {
            block_at: out.len(),
            out,
            frame,
            in_block: 0,
            written: 0,
            expected: payload_len,
        }
    }

    /// Payload bytes written so far (the payload position of the next byte).
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Appends payload bytes.
    pub fn write(&mut self, mut bytes: &[u8]) {
        let block = BLOCK_SIZE as usize;
        while !bytes.is_empty() {
            let n = (block - self.in_block).min(bytes.len());
            self.out.extend_from_slice(&bytes[..n]);
            self.in_block += n;
            self.written += n as u64;
            bytes = &bytes[n..];
            if self.in_block == block {
                self.seal_block();
            }
        }
    }

    fn seal_block(&mut self) {
        let crc = crc32c::crc32c(&self.out[self.block_at..]);
        self.out.extend_from_slice(&crc.to_le_bytes());
        self.frame.update(&self.out[self.block_at..]);
        self.block_at = self.out.len();
        self.in_block = 0;
    }

    /// The finished object, or `None` when the payload written differs from the length the
    /// writer was made for (the header would lie).
    pub fn finish(mut self) -> Option<Vec<u8>> {
        if self.in_block > 0 {
            self.seal_block();
        }
        if self.written != self.expected {
            return None;
        }
        let footer = self.frame.finish();
        self.out.extend_from_slice(&footer);
        Some(self.out)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;
    use crate::cold::object;
    use proptest::prelude::*;

    fn object_of(payload: &[u8], cuts: &[usize]) -> Vec<u8> {
        let mut w = ChunkWriter::new(payload.len() as u64);
        let mut at = 0;
        for c in cuts {
            let c = (*c).min(payload.len()).max(at);
            w.write(&payload[at..c]);
            at = c;
        }
        w.write(&payload[at..]);
        w.finish().unwrap()
    }

    fn payload(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn every_range_reads_back_and_the_frame_checks(
            n in 1usize..300_000,
            seed in any::<u8>(),
            cuts in prop::collection::vec(0usize..300_000, 0..4),
            a in any::<u64>(),
            b in any::<u64>(),
        ) {
            let payload = payload(n, seed);
            let obj = object_of(&payload, &cuts);
            let framed = object::decode(magic::CHUNK, &[CHUNK_VERSION], &obj).unwrap();
            let layout = ChunkLayout::new(n as u64);
            prop_assert_eq!(framed.body.len() as u64, layout.body_len());
            let pos = a % n as u64;
            let len = 1 + b % (n as u64 - pos);
            let r = layout.object_range(pos, len).unwrap();
            let mut out = Vec::new();
            let fetched = Bytes::copy_from_slice(&obj[r.start as usize..r.end as usize]);
            layout.extract(&fetched, pos, len, &mut out).unwrap();
            prop_assert!(out.iter().all(|b| !b.is_empty() && b.len() as u64 <= BLOCK_SIZE));
            prop_assert_eq!(&out.concat()[..], &payload[pos as usize..(pos + len) as usize]);
        }

        #[test]
        fn a_flipped_byte_in_a_read_block_is_refused(
            n in 1usize..200_000,
            flip in any::<u64>(),
        ) {
            let mut obj = object_of(&payload(n, 7), &[]);
            let layout = ChunkLayout::new(n as u64);
            let r = layout.object_range(0, n as u64).unwrap();
            let at = r.start + flip % (r.end - r.start);
            obj[at as usize] ^= 0x40;
            let fetched = Bytes::copy_from_slice(&obj[r.start as usize..r.end as usize]);
            let mut out = vec![Bytes::from_static(b"kept")];
            prop_assert!(layout.extract(&fetched, 0, n as u64, &mut out).is_err());
            prop_assert_eq!(out, vec![Bytes::from_static(b"kept")]);
            prop_assert!(object::decode(magic::CHUNK, &[CHUNK_VERSION], &obj).is_err());
        }
    }

    #[test]
    fn ranges_outside_the_payload_and_short_fetches_are_refused() {
        let obj = object_of(&[7; 3000], &[]);
        let layout = ChunkLayout::new(3000);
        assert!(matches!(
            layout.object_range(2999, 2),
            Err(ChunkError::OutOfRange { .. })
        ));
        assert!(layout.object_range(0, 0).is_err());
        let r = layout.object_range(1000, 100).unwrap();
        let short = Bytes::copy_from_slice(&obj[r.start as usize..r.end as usize - 1]);
        assert!(matches!(
            layout.extract(&short, 1000, 100, &mut Vec::new()),
            Err(ChunkError::Short { .. })
        ));
    }

    #[test]
    fn a_writer_given_the_wrong_length_refuses_to_finish() {
        let mut w = ChunkWriter::new(10);
        w.write(b"short");
        assert!(w.finish().is_none());
    }

    #[test]
    fn the_block_layout_is_stable() {
        let obj = object_of(&payload(BLOCK_SIZE as usize + 5, 1), &[]);
        let b = BLOCK_SIZE as usize;
        let first = &obj[HEADER_LEN..HEADER_LEN + b];
        let crc = &obj[HEADER_LEN + b..HEADER_LEN + b + 4];
        assert_eq!(crc, crc32c::crc32c(first).to_le_bytes());
        assert_eq!(obj.len(), HEADER_LEN + b + 4 + 5 + 4 + 8);
    }
}
