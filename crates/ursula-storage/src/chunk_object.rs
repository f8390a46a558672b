//! The layout of a cold chunk object: the flushed bytes of one or more streams, packed by a
//! group's leader (cluster.md §6.2). Pure encoding and decoding, no IO.
//!
//! A chunk object is a [`crate::cold::object`] frame with magic `UCHK`. Readers fetch ranges
//! of an object, not whole objects, and the frame's checksum covers the whole object, so the
//! body carries checksums of its own: the payload is cut into blocks of [`BLOCK_SIZE`] bytes
//! (the last one shorter), each with its crc32c, and a ranged read checks just the blocks it
//! touches. The frame's own checksum still lets a whole-object read (a copy, a compaction, a
//! scrub) check everything at once. Two layouts of the body, both readable:
//!
//! ```text
//! version 1, interleaved:  block 0 | crc 0 | block 1 | crc 1 | ...
//! version 2, contiguous:   crc 0 | crc 1 | ... | block 0 | block 1 | ...
//! ```
//!
//! In version 1 payload position `p` is at object offset `HEADER_LEN + (p / B) * (B + 4) +
//! p % B`: one ranged request fetches a range's blocks with their checksums, which suits a
//! remote store. In version 2 it is at `HEADER_LEN + 4 * blocks + p`: the payload is one run of
//! the file, so a `local` store sends any checked range of it with a single `sendfile`
//! (version 1 needs one call per block, and the kernel cuts each call into its own packets).
//! A reader learns the version from the object's header (a `local` file) or knows it from
//! where the object lives (see [`ChunkVersion::for_local_files`]).

use crate::cold::Body;
use crate::cold::object::{HEADER_LEN, ObjectWriter, magic};
use bytes::Bytes;
use std::fmt;
use std::ops::Range;

/// Payload bytes per block, in both versions. Persisted: must stay stable.
pub const BLOCK_SIZE: u64 = 64 * 1024;
const CRC_LEN: u64 = 4;

/// The body layouts of chunk objects (the frame's version field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChunkVersion {
    /// Version 1: each block followed by its checksum.
    Interleaved,
    /// Version 2: every block's checksum first, then the payload in one run.
    Contiguous,
}

impl ChunkVersion {
    /// The frame version.
    pub fn number(self) -> u16 {
        match self {
            ChunkVersion::Interleaved => 1,
            ChunkVersion::Contiguous => 2,
        }
    }

    /// The layout of frame version `v`, if this build reads it.
    pub fn from_number(v: u16) -> Option<ChunkVersion> {
        match v {
            1 => Some(ChunkVersion::Interleaved),
            2 => Some(ChunkVersion::Contiguous),
            _ => None,
        }
    }

    /// Every version this build reads.
    pub const READABLE: [u16; 2] = [1, 2];

    /// The layout to write for an object that is read from a local file (`true`: sent with
    /// `sendfile`, so contiguous) or by ranged requests to a store (interleaved: one request
    /// per range).
    pub fn for_local_files(local: bool) -> ChunkVersion {
        if local {
            ChunkVersion::Contiguous
        } else {
            ChunkVersion::Interleaved
        }
    }
}

/// Why a chunk read was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChunkError {
    /// The requested range is empty or not inside the payload.
    OutOfRange { pos: u64, len: u64, payload: u64 },
    /// The fetched bytes are not the blocks the range needs.
    Short { expected: u64, got: u64 },
    /// A block failed its checksum: the object is corrupt.
    BadBlock { block: u64 },
    /// The object's header is not that of a chunk object of the expected payload.
    BadHeader { reason: String },
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
            ChunkError::BadHeader { reason } => write!(f, "chunk object header: {reason}"),
        }
    }
}

impl std::error::Error for ChunkError {}

/// Where the blocks and checksums of a chunk object of `payload_len` payload bytes lie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkLayout {
    pub payload_len: u64,
    pub version: ChunkVersion,
}

/// The object ranges a read of part of the payload fetches: the blocks it touches and, in
/// version 2, their checksums apart from them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetch {
    /// Version 1: the blocks with their checksums. Version 2: the blocks.
    pub blocks: Range<u64>,
    /// Version 2: the checksums of those blocks.
    pub crcs: Option<Range<u64>>,
}

impl ChunkLayout {
    pub fn new(version: ChunkVersion, payload_len: u64) -> Self {
        ChunkLayout {
            payload_len,
            version,
        }
    }

    /// Reads the layout from an object's first [`HEADER_LEN`] bytes, checking that it is a
    /// chunk object of a readable version whose body fits `payload_len` payload bytes.
    pub fn from_header(header: &[u8], payload_len: u64) -> Result<Self, ChunkError> {
        let bad = |reason: String| ChunkError::BadHeader { reason };
        let h: &[u8; HEADER_LEN] = header
            .get(..HEADER_LEN)
            .and_then(|h| h.try_into().ok())
            .ok_or_else(|| bad(format!("{} bytes, not {HEADER_LEN}", header.len())))?;
        if h[0..4] != magic::CHUNK {
            return Err(bad(format!("magic {:?} is not UCHK", &h[0..4])));
        }
        let v = u16::from_le_bytes([h[4], h[5]]);
        let version =
            ChunkVersion::from_number(v).ok_or_else(|| bad(format!("unknown version {v}")))?;
        let layout = ChunkLayout::new(version, payload_len);
        let mut body = [0u8; 8];
        body.copy_from_slice(&h[8..16]);
        let body = u64::from_le_bytes(body);
        if body != layout.body_len() {
            return Err(bad(format!(
                "a {body}-byte body, not the {} bytes of a {payload_len}-byte payload",
                layout.body_len()
            )));
        }
        Ok(layout)
    }

    /// Body bytes (blocks and their checksums).
    pub fn body_len(&self) -> u64 {
        self.payload_len + self.blocks() * CRC_LEN
    }

    /// Where the body ends in the object (the footer follows).
    pub fn body_end(&self) -> u64 {
        HEADER_LEN as u64 + self.body_len()
    }

    /// Blocks of the payload.
    pub fn blocks(&self) -> u64 {
        self.payload_len.div_ceil(BLOCK_SIZE)
    }

    /// Whether the payload is one run of the object (version 2).
    pub fn contiguous(&self) -> bool {
        self.version == ChunkVersion::Contiguous
    }

    /// Where payload position `pos` lies in the object.
    pub fn offset_of(&self, pos: u64) -> u64 {
        let header = HEADER_LEN as u64;
        match self.version {
            ChunkVersion::Interleaved => {
                header + (pos / BLOCK_SIZE) * (BLOCK_SIZE + CRC_LEN) + pos % BLOCK_SIZE
            }
            ChunkVersion::Contiguous => header + self.blocks() * CRC_LEN + pos,
        }
    }

    fn block_len(&self, block: u64) -> u64 {
        (self.payload_len - block * BLOCK_SIZE).min(BLOCK_SIZE)
    }

    /// The object ranges holding every block that payload `[pos, pos + len)` touches, with
    /// their checksums.
    pub fn fetch(&self, pos: u64, len: u64) -> Result<Fetch, ChunkError> {
        let end = pos.checked_add(len).filter(|e| *e <= self.payload_len);
        let Some(end) = end.filter(|_| len > 0) else {
            return Err(ChunkError::OutOfRange {
                pos,
                len,
                payload: self.payload_len,
            });
        };
        let (first, last) = (pos / BLOCK_SIZE, (end - 1) / BLOCK_SIZE);
        let start = self.offset_of(first * BLOCK_SIZE);
        let stop = self.offset_of(last * BLOCK_SIZE) + self.block_len(last);
        Ok(match self.version {
            ChunkVersion::Interleaved => Fetch {
                blocks: start..stop + CRC_LEN,
                crcs: None,
            },
            ChunkVersion::Contiguous => {
                let table = HEADER_LEN as u64;
                Fetch {
                    blocks: start..stop,
                    crcs: Some(table + first * CRC_LEN..table + (last + 1) * CRC_LEN),
                }
            }
        })
    }

    /// Checks the bytes fetched for [`ChunkLayout::fetch`]`(pos, len)` (`blocks`, and `crcs`
    /// in version 2) and appends payload `[pos, pos + len)` to `out` as slices of `blocks`, no
    /// copy: one per block in version 1, one in all in version 2. Nothing is appended on an
    /// error.
    pub fn extract(
        &self,
        (blocks, crcs): (&Bytes, Option<&Bytes>),
        pos: u64,
        len: u64,
        out: &mut Vec<Bytes>,
    ) -> Result<(), ChunkError> {
        let want = self.fetch(pos, len)?;
        let short = |expected: u64, got: usize| ChunkError::Short {
            expected,
            got: got as u64,
        };
        if blocks.len() as u64 != want.blocks.end - want.blocks.start {
            return Err(short(want.blocks.end - want.blocks.start, blocks.len()));
        }
        let end = pos + len;
        let first = pos / BLOCK_SIZE;
        let stride = match self.version {
            ChunkVersion::Interleaved => CRC_LEN as usize,
            ChunkVersion::Contiguous => 0,
        };
        let table = match (want.crcs, crcs) {
            (None, _) => None,
            (Some(r), Some(c)) if c.len() as u64 == r.end - r.start => Some(c),
            (Some(r), c) => return Err(short(r.end - r.start, c.map_or(0, Bytes::len))),
        };
        let crc_at = |i: usize, data_end: usize| -> Option<u32> {
            let c = match table {
                Some(t) => t.get(i * 4..i * 4 + 4),
                None => blocks.get(data_end..data_end + 4),
            };
            c.and_then(|c| <[u8; 4]>::try_from(c).ok())
                .map(u32::from_le_bytes)
        };
        let mark = out.len();
        let mut at = 0usize;
        let mut block = first;
        while at < blocks.len() {
            let n = self.block_len(block) as usize;
            let data = blocks.get(at..at + n);
            let expected = crc_at((block - first) as usize, at + n);
            if data.is_none_or(|d| expected != Some(crc32c::crc32c(d))) {
                out.truncate(mark);
                return Err(ChunkError::BadBlock { block });
            }
            if stride > 0 {
                let start = block * BLOCK_SIZE;
                let lo = (pos.max(start) - start) as usize;
                let hi = (end.min(start + n as u64) - start) as usize;
                out.push(blocks.slice(at + lo..at + hi));
            }
            at += n + stride;
            block += 1;
        }
        if stride == 0 {
            let lo = (pos - first * BLOCK_SIZE) as usize;
            out.push(blocks.slice(lo..lo + len as usize));
        }
        Ok(())
    }
}

/// Input pieces shorter than this are copied into a shared buffer instead of kept as their
/// own piece, so that an object of many tiny runs (or an interleaved object's 4-byte
/// checksums) is not written with one system call per run.
const COPY_BELOW: usize = 4 * 1024;

/// [`BLOCK_SIZE`] as a length in memory.
const BLOCK: usize = BLOCK_SIZE as usize;

/// Builds a chunk object from payload pieces, written in order, without joining them: a
/// [`Bytes`] piece of at least 4 KiB becomes a piece of the object's [`Body`] as it is (a
/// flush sends the hot ring's chunks, not a copy of them). Each piece is checksummed for its
/// block and again for the frame while it is still in cache; the frame of the contiguous
/// layout, whose table lies before the payload, combines the payload's checksum once at the
/// end. A `crc32c_combine` costs about ten times a second pass over a 64 KiB block (29 µs
/// against 2.6 µs on the bench VM), so it is not used per block.
pub struct ChunkWriter {
    frame: ObjectWriter,
    layout: ChunkLayout,
    /// The object's pieces so far: for the contiguous layout, the payload only (the header
    /// and checksum table go in front when the writer finishes).
    body: Body,
    /// Small pieces waiting to become one piece of `body`.
    small: Vec<u8>,
    /// The contiguous layout's checksum table, filled as blocks are sealed.
    table: Vec<u8>,
    /// Checksum and payload bytes of the block being filled.
    block_crc: u32,
    in_block: usize,
    /// Checksum of the payload written so far (contiguous layout).
    payload_crc: u32,
    written: u64,
}

impl ChunkWriter {
    /// A writer for an object of exactly `payload_len` payload bytes in layout `version`.
    pub fn new(version: ChunkVersion, payload_len: u64) -> ChunkWriter {
        let layout = ChunkLayout::new(version, payload_len);
        let frame = ObjectWriter::new(magic::CHUNK, version.number(), layout.body_len());
        let mut w = ChunkWriter {
            frame,
            layout,
            body: Body::new(),
            small: Vec::new(),
            table: Vec::new(),
            block_crc: 0,
            in_block: 0,
            payload_crc: 0,
            written: 0,
        };
        if layout.contiguous() {
            w.table
                .reserve(usize::try_from(layout.blocks() * CRC_LEN).unwrap_or(0));
        } else {
            let header = *w.frame.header();
            w.put_small(&header);
        }
        w
    }

    /// Payload bytes written so far (the payload position of the next byte).
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Appends payload bytes (copied).
    pub fn write(&mut self, bytes: &[u8]) {
        self.push(Bytes::copy_from_slice(bytes));
    }

    /// Appends payload bytes, kept as they are unless small.
    pub fn push(&mut self, mut bytes: Bytes) {
        while !bytes.is_empty() {
            let part = bytes.split_to((BLOCK - self.in_block).min(bytes.len()));
            self.block_crc = crc32c::crc32c_append(self.block_crc, &part);
            if self.layout.contiguous() {
                self.payload_crc = crc32c::crc32c_append(self.payload_crc, &part);
            } else {
                self.frame.update(&part);
            }
            self.in_block += part.len();
            self.written += part.len() as u64;
            self.put(part);
            if self.in_block == BLOCK {
                self.seal_block();
            }
        }
    }

    fn put(&mut self, piece: Bytes) {
        if piece.len() < COPY_BELOW {
            self.put_small(&piece);
        } else {
            self.cut_small();
            self.body.push(piece);
        }
    }

    fn put_small(&mut self, bytes: &[u8]) {
        self.small.extend_from_slice(bytes);
        if self.small.len() >= BLOCK {
            self.cut_small();
        }
    }

    fn cut_small(&mut self) {
        if !self.small.is_empty() {
            self.body.push(Bytes::from(std::mem::take(&mut self.small)));
        }
    }

    fn seal_block(&mut self) {
        let crc = std::mem::take(&mut self.block_crc);
        let bytes = crc.to_le_bytes();
        self.in_block = 0;
        if self.layout.contiguous() {
            self.table.extend_from_slice(&bytes);
        } else {
            self.frame.update(&bytes);
            self.put_small(&bytes);
        }
    }

    /// The finished object, or `None` when the payload written differs from the length the
    /// writer was made for (the header would lie).
    pub fn finish(self) -> Option<Vec<u8>> {
        self.finish_body().map(|b| b.to_bytes().to_vec())
    }

    /// [`ChunkWriter::finish`], as the pieces of the object (nothing is joined).
    pub fn finish_body(mut self) -> Option<Body> {
        if self.in_block > 0 {
            self.seal_block();
        }
        if self.written != self.layout.payload_len {
            return None;
        }
        let contiguous = self.layout.contiguous();
        if contiguous {
            // The table was complete only now; it lies before the payload.
            self.frame.update(&self.table);
            self.frame.combine(self.payload_crc, self.written);
        }
        let header = *self.frame.header();
        let footer = self.frame.finish();
        self.put_small(&footer);
        self.cut_small();
        if !contiguous {
            return Some(self.body);
        }
        let mut head = Vec::with_capacity(HEADER_LEN + self.table.len());
        head.extend_from_slice(&header);
        head.extend_from_slice(&self.table);
        let mut body = Body::from(Bytes::from(head));
        for p in self.body.into_pieces() {
            body.push(p);
        }
        Some(body)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;
    use crate::cold::object;
    use proptest::prelude::*;

    const BOTH: [ChunkVersion; 2] = [ChunkVersion::Interleaved, ChunkVersion::Contiguous];

    fn object_of(v: ChunkVersion, payload: &[u8], cuts: &[usize]) -> Vec<u8> {
        let mut w = ChunkWriter::new(v, payload.len() as u64);
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

    /// What a store hands back for `f`: the ranges of `obj` it names.
    fn fetched(obj: &[u8], f: &Fetch) -> (Bytes, Option<Bytes>) {
        let cut = |r: &Range<u64>| Bytes::copy_from_slice(&obj[r.start as usize..r.end as usize]);
        (cut(&f.blocks), f.crcs.as_ref().map(cut))
    }

    fn read(
        layout: &ChunkLayout,
        obj: &[u8],
        pos: u64,
        len: u64,
        out: &mut Vec<Bytes>,
    ) -> Result<(), ChunkError> {
        let (blocks, crcs) = fetched(obj, &layout.fetch(pos, len)?);
        layout.extract((&blocks, crcs.as_ref()), pos, len, out)
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
            v in prop::sample::select(BOTH.to_vec()),
        ) {
            let payload = payload(n, seed);
            let obj = object_of(v, &payload, &cuts);
            let framed = object::decode(magic::CHUNK, &ChunkVersion::READABLE, &obj).unwrap();
            prop_assert_eq!(framed.version, v.number());
            let layout = ChunkLayout::from_header(&obj, n as u64).unwrap();
            prop_assert_eq!(layout, ChunkLayout::new(v, n as u64));
            prop_assert_eq!(framed.body.len() as u64, layout.body_len());
            let pos = a % n as u64;
            let len = 1 + b % (n as u64 - pos);
            let mut out = Vec::new();
            read(&layout, &obj, pos, len, &mut out).unwrap();
            prop_assert!(out.iter().all(|b| !b.is_empty()));
            if v == ChunkVersion::Contiguous {
                prop_assert_eq!(out.len(), 1);
                let at = layout.offset_of(pos) as usize;
                prop_assert_eq!(&obj[at..at + len as usize], &payload[pos as usize..(pos + len) as usize]);
            } else {
                prop_assert!(out.iter().all(|b| b.len() as u64 <= BLOCK_SIZE));
            }
            prop_assert_eq!(&out.concat()[..], &payload[pos as usize..(pos + len) as usize]);
        }

        #[test]
        fn a_flipped_byte_in_a_read_block_or_its_checksum_is_refused(
            n in 1usize..200_000,
            flip in any::<u64>(),
            v in prop::sample::select(BOTH.to_vec()),
        ) {
            let mut obj = object_of(v, &payload(n, 7), &[]);
            let layout = ChunkLayout::new(v, n as u64);
            // Any byte of the body: every one is a block byte or a checksum of one.
            let body = HEADER_LEN as u64..layout.body_end();
            let at = body.start + flip % (body.end - body.start);
            obj[at as usize] ^= 0x40;
            let mut out = vec![Bytes::from_static(b"kept")];
            prop_assert!(read(&layout, &obj, 0, n as u64, &mut out).is_err());
            prop_assert_eq!(out, vec![Bytes::from_static(b"kept")]);
            prop_assert!(object::decode(magic::CHUNK, &ChunkVersion::READABLE, &obj).is_err());
        }
    }

    #[test]
    fn ranges_outside_the_payload_and_short_fetches_are_refused() {
        for v in BOTH {
            let obj = object_of(v, &[7; 3000], &[]);
            let layout = ChunkLayout::new(v, 3000);
            assert!(matches!(
                layout.fetch(2999, 2),
                Err(ChunkError::OutOfRange { .. })
            ));
            assert!(layout.fetch(0, 0).is_err());
            let (blocks, crcs) = fetched(&obj, &layout.fetch(1000, 100).unwrap());
            let short = blocks.slice(..blocks.len() - 1);
            assert!(matches!(
                layout.extract((&short, crcs.as_ref()), 1000, 100, &mut Vec::new()),
                Err(ChunkError::Short { .. })
            ));
        }
        let layout = ChunkLayout::new(ChunkVersion::Contiguous, 3000);
        let obj = object_of(ChunkVersion::Contiguous, &[7; 3000], &[]);
        let (blocks, _) = fetched(&obj, &layout.fetch(0, 10).unwrap());
        assert!(matches!(
            layout.extract((&blocks, None), 0, 10, &mut Vec::new()),
            Err(ChunkError::Short { .. })
        ));
    }

    /// The object for `payload` in layout `v`, built from the layout's description above,
    /// not by [`ChunkWriter`].
    fn reference(v: ChunkVersion, payload: &[u8]) -> Vec<u8> {
        let blocks = payload.chunks(BLOCK_SIZE as usize);
        let crc = |b: &[u8]| crc32c::crc32c(b).to_le_bytes();
        let mut body = Vec::new();
        match v {
            ChunkVersion::Interleaved => {
                for b in blocks {
                    body.extend_from_slice(b);
                    body.extend_from_slice(&crc(b));
                }
            }
            ChunkVersion::Contiguous => {
                for b in blocks {
                    body.extend_from_slice(&crc(b));
                }
                body.extend_from_slice(payload);
            }
        }
        object::encode(magic::CHUNK, v.number(), &body)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Pieces of any sizes, kept or copied, make the bytes the format describes; large
        /// pieces are sent as they are, and no piece is tiny unless the object is.
        #[test]
        fn pieces_of_any_size_make_the_described_object(
            sizes in prop::collection::vec(0usize..150_000, 0..12),
            copied in any::<u16>(),
            v in prop::sample::select(BOTH.to_vec()),
        ) {
            let n: usize = sizes.iter().sum();
            let payload = payload(n, 5);
            let mut w = ChunkWriter::new(v, n as u64);
            let mut at = 0;
            for (i, len) in sizes.iter().enumerate() {
                let piece = Bytes::copy_from_slice(&payload[at..at + len]);
                if copied >> (i % 16) & 1 == 1 {
                    w.write(&piece);
                } else {
                    w.push(piece);
                }
                at += len;
            }
            let body = w.finish_body().unwrap();
            prop_assert_eq!(body.to_bytes().to_vec(), reference(v, &payload));
            let pieces = body.pieces();
            let (first, last) = (pieces.first().unwrap(), pieces.last().unwrap());
            // Small bytes were gathered: after the first piece (the header, and the table in
            // front of the payload), no two small pieces follow each other.
            let small = |p: &Bytes| p.len() < COPY_BELOW;
            prop_assert!(pieces[1..].windows(2).all(|w| !(small(&w[0]) && small(&w[1]))));
            prop_assert!(first.len() >= HEADER_LEN && last.len() >= 8);
        }
    }

    #[test]
    fn a_writer_given_the_wrong_length_refuses_to_finish() {
        for v in BOTH {
            let mut w = ChunkWriter::new(v, 10);
            w.write(b"short");
            assert!(w.finish().is_none());
        }
    }

    #[test]
    fn a_header_of_another_object_or_length_is_refused() {
        let obj = object_of(ChunkVersion::Contiguous, &payload(5000, 3), &[]);
        assert!(ChunkLayout::from_header(&obj, 5000).is_ok());
        assert!(ChunkLayout::from_header(&obj, 5001).is_err());
        assert!(ChunkLayout::from_header(&obj[..10], 5000).is_err());
        let mut other = obj.clone();
        other[0] = b'X';
        assert!(ChunkLayout::from_header(&other, 5000).is_err());
        let mut later = obj;
        later[4] = 3;
        let e = ChunkLayout::from_header(&later, 5000).unwrap_err();
        assert!(e.to_string().contains("unknown version 3"), "{e}");
    }

    #[test]
    fn the_block_layouts_are_stable() {
        let b = BLOCK_SIZE as usize;
        let p = payload(b + 5, 1);
        let (first, rest) = (crc32c::crc32c(&p[..b]), crc32c::crc32c(&p[b..]));
        // Version 1: block, crc, block, crc.
        let obj = object_of(ChunkVersion::Interleaved, &p, &[]);
        assert_eq!(&obj[4..6], &1u16.to_le_bytes());
        assert_eq!(&obj[HEADER_LEN..HEADER_LEN + b], &p[..b]);
        assert_eq!(
            &obj[HEADER_LEN + b..HEADER_LEN + b + 4],
            first.to_le_bytes()
        );
        assert_eq!(&obj[HEADER_LEN + b + 4..HEADER_LEN + b + 9], &p[b..]);
        assert_eq!(obj.len(), HEADER_LEN + b + 4 + 5 + 4 + 8);
        // Version 2: crc, crc, then the payload in one run.
        let obj = object_of(ChunkVersion::Contiguous, &p, &[]);
        assert_eq!(&obj[4..6], &2u16.to_le_bytes());
        assert_eq!(&obj[HEADER_LEN..HEADER_LEN + 4], first.to_le_bytes());
        assert_eq!(&obj[HEADER_LEN + 4..HEADER_LEN + 8], rest.to_le_bytes());
        assert_eq!(&obj[HEADER_LEN + 8..HEADER_LEN + 8 + b + 5], &p[..]);
        assert_eq!(obj.len(), HEADER_LEN + 8 + b + 5 + 8);
    }
}
