//! The frame every cold object format shares: a magic naming the format, a version, the body
//! length, and a checksum, so a reader can tell whose object it holds, which decoder it needs,
//! and whether every byte arrived.
//!
//! ```text
//! header (16 bytes)  magic [u8; 4] | version u16 LE | flags u16 LE (0) | body_len u64 LE
//! body               body_len bytes, the format's own layout
//! footer (8 bytes)   crc32c(header ++ body) u32 LE | b"UEND"
//! ```
//!
//! Body byte `i` is object byte `HEADER_LEN + i` ([`body_range`]), so a ranged read of a body
//! needs no header fetch; the checksum covers whole-object reads. Formats register their magic
//! in [`magic`] (persisted: never reuse or change one).

use super::Body;
use bytes::Bytes;
use std::ops::Range;

/// Header length.
pub const HEADER_LEN: usize = 16;
/// Footer length.
pub const FOOTER_LEN: usize = 8;
/// Last four bytes of every object.
pub const FOOTER_MAGIC: [u8; 4] = *b"UEND";

/// Magics of the object formats. Persisted: must stay stable; a new format gets a new magic.
pub mod magic {
    /// A flushed slice of stream bytes (cold chunk).
    pub const CHUNK: [u8; 4] = *b"UCHK";
    /// A published snapshot blob.
    pub const SNAPSHOT: [u8; 4] = *b"USNP";
    /// A staged snapshot part (multi-part upload).
    pub const PART: [u8; 4] = *b"UPRT";
    /// A manifest (e.g. of a committed multi-part snapshot).
    pub const MANIFEST: [u8; 4] = *b"UMAN";
    /// Conformance-suite objects.
    pub const TEST: [u8; 4] = *b"UTST";
}

/// Why an object was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("object of {0} bytes is shorter than its header and footer")]
    Short(usize),
    #[error("object magic {found:?} is not {expected:?}")]
    BadMagic { expected: [u8; 4], found: [u8; 4] },
    #[error("object version {0} is not one this build reads")]
    UnsupportedVersion(u16),
    #[error("object flags {0:#06x} are not zero")]
    BadFlags(u16),
    #[error("object declares a {declared}-byte body but holds {actual}")]
    LengthMismatch { declared: u64, actual: u64 },
    #[error("object checksum mismatch")]
    BadChecksum,
    #[error("object footer is damaged")]
    BadFooter,
}

/// A decoded object: its format version and body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framed<'a> {
    pub version: u16,
    pub body: &'a [u8],
}

/// The header of an object with `body_len` body bytes.
pub fn header(magic: [u8; 4], version: u16, body_len: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(&magic);
    h[4..6].copy_from_slice(&version.to_le_bytes());
    h[8..16].copy_from_slice(&body_len.to_le_bytes());
    h
}

/// One object: header, `body`, footer, in one buffer.
pub fn encode(magic: [u8; 4], version: u16, body: &[u8]) -> Vec<u8> {
    let mut w = ObjectWriter::new(magic, version, body.len() as u64);
    let mut out = Vec::with_capacity(HEADER_LEN + body.len() + FOOTER_LEN);
    out.extend_from_slice(w.header());
    w.update(body);
    out.extend_from_slice(body);
    out.extend_from_slice(&w.finish());
    out
}

/// The object framing `pieces` as a [`Body`]: the header, the pieces themselves (not copied),
/// and the footer. Reads every piece once for the checksum.
pub fn frame(magic: [u8; 4], version: u16, pieces: impl IntoIterator<Item = Bytes>) -> Body {
    let pieces: Vec<Bytes> = pieces.into_iter().collect();
    let len = pieces.iter().map(|p| p.len() as u64).sum();
    let mut w = ObjectWriter::new(magic, version, len);
    let mut body = Body::new();
    body.push(Bytes::copy_from_slice(w.header()));
    for p in pieces {
        w.update(&p);
        body.push(p);
    }
    body.push(Bytes::copy_from_slice(&w.finish()));
    body
}

/// Builds the frame around a body that arrives in pieces (e.g. the parts of a multipart
/// upload): send [`ObjectWriter::header`], every piece (passed to `update` too), then
/// [`ObjectWriter::finish`].
#[derive(Debug, Clone)]
pub struct ObjectWriter {
    header: [u8; HEADER_LEN],
    crc: u32,
}

impl ObjectWriter {
    pub fn new(magic: [u8; 4], version: u16, body_len: u64) -> Self {
        let header = header(magic, version, body_len);
        ObjectWriter {
            crc: crc32c::crc32c(&header),
            header,
        }
    }

    pub fn header(&self) -> &[u8; HEADER_LEN] {
        &self.header
    }

    pub fn update(&mut self, piece: &[u8]) {
        self.crc = crc32c::crc32c_append(self.crc, piece);
    }

    /// As [`ObjectWriter::update`] with a piece of `len` bytes whose crc32c is `crc`, without
    /// reading it again.
    pub fn combine(&mut self, crc: u32, len: u64) {
        if let Ok(n @ 1..) = usize::try_from(len) {
            self.crc = crc32c::crc32c_combine(self.crc, crc, n);
        }
    }

    /// The footer.
    pub fn finish(&self) -> [u8; FOOTER_LEN] {
        let mut f = [0u8; FOOTER_LEN];
        f[0..4].copy_from_slice(&self.crc.to_le_bytes());
        f[4..8].copy_from_slice(&FOOTER_MAGIC);
        f
    }
}

/// Checks the whole frame of `bytes` (magic `expected`, a version in `readable`, flags, length,
/// footer, checksum) and returns the body.
pub fn decode<'a>(
    expected: [u8; 4],
    readable: &[u16],
    bytes: &'a [u8],
) -> Result<Framed<'a>, FormatError> {
    if bytes.len() < HEADER_LEN + FOOTER_LEN {
        return Err(FormatError::Short(bytes.len()));
    }
    let (h, rest) = bytes.split_at(HEADER_LEN);
    let (body, f) = rest.split_at(rest.len() - FOOTER_LEN);
    let field = |r: Range<usize>| h.get(r).unwrap_or_default();
    let mut found = [0u8; 4];
    found.copy_from_slice(field(0..4));
    if found != expected {
        return Err(FormatError::BadMagic { expected, found });
    }
    let version = u16::from_le_bytes([h[4], h[5]]);
    if !readable.contains(&version) {
        return Err(FormatError::UnsupportedVersion(version));
    }
    let flags = u16::from_le_bytes([h[6], h[7]]);
    if flags != 0 {
        return Err(FormatError::BadFlags(flags));
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(field(8..16));
    let declared = u64::from_le_bytes(len);
    if declared != body.len() as u64 {
        return Err(FormatError::LengthMismatch {
            declared,
            actual: body.len() as u64,
        });
    }
    if f[4..8] != FOOTER_MAGIC {
        return Err(FormatError::BadFooter);
    }
    let crc = crc32c::crc32c_append(crc32c::crc32c(h), body);
    if crc.to_le_bytes() != f[0..4] {
        return Err(FormatError::BadChecksum);
    }
    Ok(Framed { version, body })
}

/// The object bytes that hold body bytes `body`.
pub fn body_range(body: Range<u64>) -> Range<u64> {
    body.start + HEADER_LEN as u64..body.end + HEADER_LEN as u64
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn layout_is_stable() {
        let o = encode(magic::TEST, 1, b"abc");
        assert_eq!(&o[0..4], b"UTST");
        assert_eq!(&o[4..8], &[1, 0, 0, 0]);
        assert_eq!(&o[8..16], &3u64.to_le_bytes());
        assert_eq!(&o[16..19], b"abc");
        assert_eq!(&o[o.len() - 4..], b"UEND");
        let crc = crc32c::crc32c(&o[..19]);
        assert_eq!(&o[19..23], &crc.to_le_bytes());
    }

    #[test]
    fn rejects_each_kind_of_damage() {
        let o = encode(magic::CHUNK, 2, b"hello");
        assert_eq!(decode(magic::CHUNK, &[2], &o).unwrap().body, b"hello");
        assert!(matches!(
            decode(magic::PART, &[2], &o),
            Err(FormatError::BadMagic { .. })
        ));
        assert_eq!(
            decode(magic::CHUNK, &[1], &o),
            Err(FormatError::UnsupportedVersion(2))
        );
        let mut flags = o.clone();
        flags[6] = 1;
        assert_eq!(
            decode(magic::CHUNK, &[2], &flags),
            Err(FormatError::BadFlags(1))
        );
        let mut extra = o.clone();
        extra.insert(HEADER_LEN, b'x');
        assert!(matches!(
            decode(magic::CHUNK, &[2], &extra),
            Err(FormatError::LengthMismatch { .. })
        ));
        let mut footer = o.clone();
        let n = footer.len();
        footer[n - 1] = b'x';
        assert_eq!(
            decode(magic::CHUNK, &[2], &footer),
            Err(FormatError::BadFooter)
        );
        let mut body = o.clone();
        body[HEADER_LEN] ^= 1;
        assert_eq!(
            decode(magic::CHUNK, &[2], &body),
            Err(FormatError::BadChecksum)
        );
        for cut in 0..o.len() {
            assert!(decode(magic::CHUNK, &[2], &o[..cut]).is_err(), "cut {cut}");
        }
    }

    proptest! {
        #[test]
        fn round_trip(version in any::<u16>(), body in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let o = encode(magic::SNAPSHOT, version, &body);
            let got = decode(magic::SNAPSHOT, &[version], &o).unwrap();
            prop_assert_eq!(got.version, version);
            prop_assert_eq!(got.body, &body[..]);
            if !body.is_empty() {
                let r = body_range(0..body.len() as u64);
                prop_assert_eq!(&o[r.start as usize..r.end as usize], &body[..]);
            }
        }

        #[test]
        fn pieces_frame_like_one_body(body in proptest::collection::vec(any::<u8>(), 0..2048), cut in any::<usize>()) {
            let at = cut % (body.len() + 1);
            let mut w = ObjectWriter::new(magic::PART, 1, body.len() as u64);
            let mut out = w.header().to_vec();
            for piece in [&body[..at], &body[at..]] {
                w.update(piece);
                out.extend_from_slice(piece);
            }
            out.extend_from_slice(&w.finish());
            prop_assert_eq!(out, encode(magic::PART, 1, &body));
        }

        #[test]
        fn framed_pieces_are_the_encoded_object(
            pieces in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..5)
        ) {
            let whole: Vec<u8> = pieces.concat();
            let body = frame(magic::CHUNK, 3, pieces.into_iter().map(Bytes::from));
            prop_assert_eq!(body.to_bytes().to_vec(), encode(magic::CHUNK, 3, &whole));
            prop_assert_eq!(body.len(), (HEADER_LEN + whole.len() + FOOTER_LEN) as u64);
        }

        #[test]
        fn any_single_bit_flip_is_caught(body in proptest::collection::vec(any::<u8>(), 0..512), at in any::<usize>(), bit in 0u8..8) {
            let mut o = encode(magic::MANIFEST, 1, &body);
            let i = at % o.len();
            o[i] ^= 1 << bit;
            prop_assert!(decode(magic::MANIFEST, &[1], &o).is_err());
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
            let _ = decode(magic::CHUNK, &[1], &bytes);
        }
    }
}
