//! The layout of a cold chunk object: the flushed bytes of one or more streams, packed by a
//! group's leader (cluster.md §6.2). Pure encoding and decoding, no IO.
//!
//! Readers fetch ranges of an object, not whole objects, so a checksum over the whole
//! payload could not be checked by a read of a few kilobytes. The payload is therefore cut
//! into blocks of `block_size` bytes, each followed by its own crc32c, and a ranged read
//! fetches (and checks) just the blocks it touches.
//!
//! All integers little-endian:
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 8 | magic `b"URSULACK"` |
//! | 8 | 4 | format version, `1` |
//! | 12 | 4 | `block_size` (1 KiB ..= 16 MiB) |
//! | 16 | 8 | payload length |
//! | 24 | 4 | crc32c of bytes 0..24 |
//! | 28 | 4 | zero |
//! | 32 | | blocks: `min(block_size, rest)` payload bytes, then their crc32c (4) |
//!
//! Payload position `p` is at object offset `32 + (p / B) * (B + 4) + p % B`.

use std::fmt;
use std::ops::Range;

/// Magic bytes at offset 0.
pub const CHUNK_MAGIC: [u8; 8] = *b"URSULACK";
/// Current version.
pub const CHUNK_VERSION: u32 = 1;
/// Header bytes before the first block.
pub const CHUNK_HEADER_LEN: u64 = 32;
/// Block size written by this version (readers accept any size in range).
pub const DEFAULT_BLOCK_SIZE: u32 = 64 * 1024;
const MIN_BLOCK: u32 = 1024;
const MAX_BLOCK: u32 = 16 << 20;
const CRC_LEN: u64 = 4;

/// Why bytes of a chunk object were refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChunkError {
    /// The header is short, has another magic, or fails its checksum.
    BadHeader(&'static str),
    /// A version this build cannot read.
    UnknownVersion(u32),
    /// The requested range is not inside the payload.
    OutOfRange { pos: u64, len: u64, payload: u64 },
    /// The fetched bytes are not the blocks the range needs.
    Short { expected: u64, got: u64 },
    /// A block failed its checksum: the object is corrupt.
    BadBlock { block: u64 },
}

impl fmt::Display for ChunkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChunkError::BadHeader(why) => write!(f, "chunk object header: {why}"),
            ChunkError::UnknownVersion(v) => write!(f, "chunk object version {v} is unknown"),
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

/// The decoded header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    pub block_size: u32,
    pub payload_len: u64,
}

impl ChunkHeader {
    /// Object size for this header.
    pub fn object_len(&self) -> u64 {
        let b = u64::from(self.block_size);
        let blocks = self.payload_len.div_ceil(b);
        CHUNK_HEADER_LEN + self.payload_len + blocks * CRC_LEN
    }

    /// The object byte range holding every block that payload `[pos, pos + len)` touches.
    pub fn blocks_for(&self, pos: u64, len: u64) -> Result<Range<u64>, ChunkError> {
        let end = pos.checked_add(len).filter(|e| *e <= self.payload_len);
        let Some(end) = end.filter(|_| len > 0) else {
            return Err(ChunkError::OutOfRange {
                pos,
                len,
                payload: self.payload_len,
            });
        };
        let b = u64::from(self.block_size);
        let (first, last) = (pos / b, (end - 1) / b);
        let lo = CHUNK_HEADER_LEN + first * (b + CRC_LEN);
        let last_len = (self.payload_len - last * b).min(b);
        let hi = CHUNK_HEADER_LEN + last * (b + CRC_LEN) + last_len + CRC_LEN;
        Ok(lo..hi)
    }

    /// Checks the blocks fetched for [`ChunkHeader::blocks_for`]`(pos, len)` and appends
    /// payload `[pos, pos + len)` to `out`.
    pub fn extract(
        &self,
        fetched: &[u8],
        pos: u64,
        len: u64,
        out: &mut Vec<u8>,
    ) -> Result<(), ChunkError> {
        let range = self.blocks_for(pos, len)?;
        if fetched.len() as u64 != range.end - range.start {
            return Err(ChunkError::Short {
                expected: range.end - range.start,
                got: fetched.len() as u64,
            });
        }
        let b = u64::from(self.block_size);
        let mut block = pos / b;
        let mut rest = fetched;
        let end = pos + len;
        while !rest.is_empty() {
            let start = block * b;
            let n = (self.payload_len - start).min(b) as usize;
            let (data, tail) = rest.split_at(n.min(rest.len()));
            let (crc, tail) = tail.split_at((CRC_LEN as usize).min(tail.len()));
            let want = crc.try_into().map(u32::from_le_bytes).ok();
            if data.len() != n || want != Some(crc32c::crc32c(data)) {
                return Err(ChunkError::BadBlock { block });
            }
            let lo = pos.max(start) - start;
            let hi = end.min(start + n as u64) - start;
            out.extend_from_slice(&data[lo as usize..hi as usize]);
            rest = tail;
            block += 1;
        }
        Ok(())
    }
}

/// Decodes and checks the header at the start of an object.
pub fn decode_header(bytes: &[u8]) -> Result<ChunkHeader, ChunkError> {
    let h = bytes
        .get(..CHUNK_HEADER_LEN as usize)
        .ok_or(ChunkError::BadHeader("truncated"))?;
    if h[0..8] != CHUNK_MAGIC {
        return Err(ChunkError::BadHeader("bad magic"));
    }
    let u32_at = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
    if u32_at(24) != crc32c::crc32c(&h[0..24]) {
        return Err(ChunkError::BadHeader("checksum mismatch"));
    }
    let version = u32_at(8);
    if version != CHUNK_VERSION {
        return Err(ChunkError::UnknownVersion(version));
    }
    let block_size = u32_at(12);
    if !(MIN_BLOCK..=MAX_BLOCK).contains(&block_size) {
        return Err(ChunkError::BadHeader("block size out of range"));
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&h[16..24]);
    Ok(ChunkHeader {
        block_size,
        payload_len: u64::from_le_bytes(len),
    })
}

/// Builds a chunk object from payload pieces, written in order, without first joining them.
pub struct ChunkWriter {
    out: Vec<u8>,
    block_size: usize,
    /// Payload bytes in the block being filled.
    in_block: usize,
    /// Payload bytes written so far, and how many the header promises.
    payload_len: u64,
    expected: u64,
}

impl ChunkWriter {
    /// A writer for an object of exactly `payload_len` bytes, in blocks of `block_size`
    /// (clamped to the accepted range).
    pub fn new(payload_len: u64, block_size: u32) -> ChunkWriter {
        let block_size = block_size.clamp(MIN_BLOCK, MAX_BLOCK);
        let header = ChunkHeader {
            block_size,
            payload_len,
        };
        let mut out = Vec::with_capacity(usize::try_from(header.object_len()).unwrap_or(0));
        out.extend_from_slice(&CHUNK_MAGIC);
        out.extend_from_slice(&CHUNK_VERSION.to_le_bytes());
        out.extend_from_slice(&block_size.to_le_bytes());
        out.extend_from_slice(&payload_len.to_le_bytes());
        let crc = crc32c::crc32c(&out[0..24]);
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        ChunkWriter {
            out,
            block_size: block_size as usize,
            in_block: 0,
            payload_len: 0,
            expected: payload_len,
        }
    }

    /// Appends payload bytes.
    pub fn write(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let n = (self.block_size - self.in_block).min(bytes.len());
            self.out.extend_from_slice(&bytes[..n]);
            self.in_block += n;
            self.payload_len += n as u64;
            bytes = &bytes[n..];
            if self.in_block == self.block_size {
                self.seal_block();
            }
        }
    }

    fn seal_block(&mut self) {
        let start = self.out.len() - self.in_block;
        let crc = crc32c::crc32c(&self.out[start..]);
        self.out.extend_from_slice(&crc.to_le_bytes());
        self.in_block = 0;
    }

    /// The finished object, or `None` when the bytes written differ from the length the
    /// writer was made for (the header would lie).
    pub fn finish(mut self) -> Option<Vec<u8>> {
        if self.in_block > 0 {
            self.seal_block();
        }
        (self.payload_len == self.expected).then_some(self.out)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;
    use proptest::prelude::*;

    fn object(payload: &[u8], block: u32, cuts: &[usize]) -> Vec<u8> {
        let mut w = ChunkWriter::new(payload.len() as u64, block);
        let mut at = 0;
        for c in cuts {
            let c = (*c).min(payload.len()).max(at);
            w.write(&payload[at..c]);
            at = c;
        }
        w.write(&payload[at..]);
        w.finish().unwrap()
    }

    proptest! {
        #[test]
        fn every_range_reads_back(
            payload in prop::collection::vec(any::<u8>(), 1..9000),
            block in 1024u32..3000,
            cuts in prop::collection::vec(0usize..9000, 0..4),
            a in any::<u64>(),
            b in any::<u64>(),
        ) {
            let obj = object(&payload, block, &cuts);
            let h = decode_header(&obj).unwrap();
            prop_assert_eq!(h.object_len(), obj.len() as u64);
            let n = payload.len() as u64;
            let pos = a % n;
            let len = 1 + b % (n - pos);
            let r = h.blocks_for(pos, len).unwrap();
            let mut out = Vec::new();
            h.extract(&obj[r.start as usize..r.end as usize], pos, len, &mut out).unwrap();
            prop_assert_eq!(&out[..], &payload[pos as usize..(pos + len) as usize]);
        }

        #[test]
        fn a_flipped_byte_is_refused(
            payload in prop::collection::vec(any::<u8>(), 1..5000),
            flip in any::<u64>(),
        ) {
            let mut obj = object(&payload, 1024, &[]);
            let at = (flip % obj.len() as u64) as usize;
            obj[at] ^= 0x40;
            let n = payload.len() as u64;
            let refused = match decode_header(&obj) {
                Err(_) => true,
                Ok(h) => match h.blocks_for(0, n) {
                    Err(_) => true,
                    Ok(r) => {
                        let fetched = obj.get(r.start as usize..r.end as usize);
                        fetched.is_none_or(|f| h.extract(f, 0, n, &mut Vec::new()).is_err())
                    }
                },
            };
            // Bytes 28..32 are padding no reader depends on.
            prop_assert!(refused || (28..32).contains(&at));
        }
    }

    #[test]
    fn ranges_outside_the_payload_and_short_fetches_are_refused() {
        let obj = object(&[7; 3000], 1024, &[]);
        let h = decode_header(&obj).unwrap();
        assert!(matches!(
            h.blocks_for(2999, 2),
            Err(ChunkError::OutOfRange { .. })
        ));
        assert!(h.blocks_for(0, 0).is_err());
        let r = h.blocks_for(1000, 100).unwrap();
        let short = &obj[r.start as usize..r.end as usize - 1];
        assert!(matches!(
            h.extract(short, 1000, 100, &mut Vec::new()),
            Err(ChunkError::Short { .. })
        ));
        let mut v2 = obj.clone();
        v2[8] = 2;
        let crc = crc32c::crc32c(&v2[0..24]);
        v2[24..28].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(decode_header(&v2), Err(ChunkError::UnknownVersion(2)));
        assert!(decode_header(&obj[..31]).is_err());
    }

    #[test]
    fn a_writer_given_the_wrong_length_refuses_to_finish() {
        let mut w = ChunkWriter::new(10, 1024);
        w.write(b"short");
        assert!(w.finish().is_none());
    }
}
