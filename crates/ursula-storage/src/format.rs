//! Byte-level encoding of WAL segments and records (see the crate docs for the layout).
//!
//! Everything here is pure: no I/O, no panics on any input bytes.

/// Magic bytes at offset 0 of every segment file.
pub(crate) const SEGMENT_MAGIC: [u8; 8] = *b"URSULAWL";
/// Current segment format version.
pub(crate) const SEGMENT_VERSION: u32 = 1;
/// Segment header: magic (8) + version (4) + first LSN (8) + crc32c of the previous 20 bytes (4).
pub(crate) const SEGMENT_HEADER_LEN: usize = 24;

/// Record frame prefix: body length (4) + crc32c of the body (4).
pub(crate) const FRAME_PREFIX_LEN: usize = 8;
/// Fixed part of a record body: lsn (8) + group (4) + kind (1).
pub(crate) const BODY_FIXED_LEN: usize = 13;
/// Total fixed overhead of one record on disk.
pub(crate) const RECORD_OVERHEAD: usize = FRAME_PREFIX_LEN + BODY_FIXED_LEN;

/// Largest accepted payload of a single record (1 GiB).
pub const MAX_PAYLOAD_LEN: usize = 1 << 30;

/// Encodes a segment header for a segment whose first record has LSN `first_lsn`.
pub(crate) fn encode_segment_header(first_lsn: u64) -> [u8; SEGMENT_HEADER_LEN] {
    let mut h = [0u8; SEGMENT_HEADER_LEN];
    h[0..8].copy_from_slice(&SEGMENT_MAGIC);
    h[8..12].copy_from_slice(&SEGMENT_VERSION.to_le_bytes());
    h[12..20].copy_from_slice(&first_lsn.to_le_bytes());
    let crc = crc32c::crc32c(&h[0..20]);
    h[20..24].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Why a segment header was rejected.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum HeaderError {
    /// Fewer than [`SEGMENT_HEADER_LEN`] bytes.
    Short,
    BadMagic,
    BadVersion(u32),
    BadChecksum,
}

impl std::fmt::Display for HeaderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeaderError::Short => write!(f, "segment header is truncated"),
            HeaderError::BadMagic => write!(f, "bad segment magic"),
            HeaderError::BadVersion(v) => write!(
                f,
                "unsupported segment format version {v} (expected {SEGMENT_VERSION})"
            ),
            HeaderError::BadChecksum => write!(f, "segment header checksum mismatch"),
        }
    }
}

/// Decodes a segment header, returning its first LSN.
pub(crate) fn decode_segment_header(data: &[u8]) -> Result<u64, HeaderError> {
    let h = data.get(..SEGMENT_HEADER_LEN).ok_or(HeaderError::Short)?;
    if h.get(0..8) != Some(&SEGMENT_MAGIC[..]) {
        return Err(HeaderError::BadMagic);
    }
    let version = read_u32(h, 8).ok_or(HeaderError::Short)?;
    if version != SEGMENT_VERSION {
        return Err(HeaderError::BadVersion(version));
    }
    let first_lsn = read_u64(h, 12).ok_or(HeaderError::Short)?;
    let crc = read_u32(h, 20).ok_or(HeaderError::Short)?;
    let body = h.get(0..20).ok_or(HeaderError::Short)?;
    if crc32c::crc32c(body) != crc {
        return Err(HeaderError::BadChecksum);
    }
    Ok(first_lsn)
}

/// Number of bytes [`encode_record`] appends for a payload of `payload_len` bytes.
pub(crate) fn encoded_len(payload_len: usize) -> usize {
    RECORD_OVERHEAD + payload_len
}

/// Appends one framed record to `buf`. The caller guarantees `payload.len() <= MAX_PAYLOAD_LEN`.
pub(crate) fn encode_record(buf: &mut Vec<u8>, lsn: u64, group: u32, kind: u8, payload: &[u8]) {
    let start = buf.len();
    // MAX_PAYLOAD_LEN + BODY_FIXED_LEN always fits in a u32; saturate defensively anyway.
    let body_len = u32::try_from(BODY_FIXED_LEN + payload.len()).unwrap_or(u32::MAX);
    buf.reserve(RECORD_OVERHEAD + payload.len());
    buf.extend_from_slice(&body_len.to_le_bytes());
    buf.extend_from_slice(&[0u8; 4]); // crc placeholder
    buf.extend_from_slice(&lsn.to_le_bytes());
    buf.extend_from_slice(&group.to_le_bytes());
    buf.push(kind);
    buf.extend_from_slice(payload);
    let body_start = start + FRAME_PREFIX_LEN;
    let crc = buf.get(body_start..).map(crc32c::crc32c).unwrap_or(0);
    if let Some(slot) = buf.get_mut(start + 4..start + 8) {
        slot.copy_from_slice(&crc.to_le_bytes());
    }
}

/// A record decoded in place from a segment buffer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct DecodedRecord<'a> {
    pub lsn: u64,
    pub group: u32,
    pub kind: u8,
    pub payload: &'a [u8],
    /// Total framed length (prefix + body).
    pub frame_len: usize,
}

/// Why the bytes at some offset are not a valid record.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum RecordError {
    /// The frame prefix or body extends past the end of the data.
    Incomplete { needed: usize, available: usize },
    /// The length field is too small to hold the fixed body fields.
    BadLength(u32),
    /// The body does not match its checksum.
    BadChecksum,
}

impl std::fmt::Display for RecordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecordError::Incomplete { needed, available } => write!(
                f,
                "incomplete record: needs {needed} bytes, {available} available"
            ),
            RecordError::BadLength(len) => write!(f, "invalid record length {len}"),
            RecordError::BadChecksum => write!(f, "record checksum mismatch"),
        }
    }
}

/// Decodes the record starting at `data[off..]`.
pub(crate) fn decode_record(data: &[u8], off: usize) -> Result<DecodedRecord<'_>, RecordError> {
    let available = data.len().saturating_sub(off);
    let (Some(len), Some(crc)) = (read_u32(data, off), read_u32(data, off.saturating_add(4)))
    else {
        return Err(RecordError::Incomplete {
            needed: FRAME_PREFIX_LEN,
            available,
        });
    };
    let body_len = len as usize;
    if body_len < BODY_FIXED_LEN {
        return Err(RecordError::BadLength(len));
    }
    let frame_len = FRAME_PREFIX_LEN + body_len;
    let body_start = off + FRAME_PREFIX_LEN;
    let Some(body) = data.get(body_start..body_start.saturating_add(body_len)) else {
        return Err(RecordError::Incomplete {
            needed: frame_len,
            available,
        });
    };
    if crc32c::crc32c(body) != crc {
        return Err(RecordError::BadChecksum);
    }
    let (Some(lsn), Some(group), Some(&kind), Some(payload)) = (
        read_u64(body, 0),
        read_u32(body, 8),
        body.get(12),
        body.get(BODY_FIXED_LEN..),
    ) else {
        return Err(RecordError::BadLength(len));
    };
    Ok(DecodedRecord {
        lsn,
        group,
        kind,
        payload,
        frame_len,
    })
}

/// After a bad record at `bad_off`, looks for any later offset holding a complete,
/// checksum-valid record whose LSN is plausible (`>= min_lsn` and not absurdly far ahead).
/// Returns the offset of the first such record.
///
/// A torn tail never contains such a record; a corrupted record in the middle of the log
/// almost always is followed by one. The LSN filter makes the scan cheap: the checksum is
/// only computed where the 8 bytes at the LSN position already look like a nearby LSN.
pub(crate) fn find_valid_record_after(data: &[u8], bad_off: usize, min_lsn: u64) -> Option<usize> {
    let tail = data.len().saturating_sub(bad_off);
    // Upper bound on how many records could follow: every record takes at least RECORD_OVERHEAD bytes.
    let max_records = (tail / RECORD_OVERHEAD) as u64 + 1;
    let max_lsn = min_lsn.saturating_add(max_records);
    let last_start = data.len().checked_sub(RECORD_OVERHEAD)?;
    let mut p = bad_off.checked_add(1)?;
    while p <= last_start {
        if let Some(lsn) = read_u64(data, p + FRAME_PREFIX_LEN)
            && lsn >= min_lsn
            && lsn <= max_lsn
            && decode_record(data, p).is_ok()
        {
            return Some(p);
        }
        p += 1;
    }
    None
}

pub(crate) fn read_u32(data: &[u8], off: usize) -> Option<u32> {
    let bytes = data.get(off..off.checked_add(4)?)?;
    Some(u32::from_le_bytes(bytes.try_into().ok()?))
}

pub(crate) fn read_u64(data: &[u8], off: usize) -> Option<u64> {
    let bytes = data.get(off..off.checked_add(8)?)?;
    Some(u64::from_le_bytes(bytes.try_into().ok()?))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let h = encode_segment_header(42);
        assert_eq!(decode_segment_header(&h), Ok(42));
        let mut bad = h;
        bad[0] ^= 1;
        assert_eq!(decode_segment_header(&bad), Err(HeaderError::BadMagic));
        let mut bad = h;
        bad[8] = 9;
        assert_eq!(decode_segment_header(&bad), Err(HeaderError::BadVersion(9)));
        let mut bad = h;
        bad[13] ^= 1;
        assert_eq!(decode_segment_header(&bad), Err(HeaderError::BadChecksum));
        assert_eq!(decode_segment_header(&h[..10]), Err(HeaderError::Short));
    }

    #[test]
    fn record_round_trip() {
        let mut buf = Vec::new();
        encode_record(&mut buf, 7, 3, 2, b"hello");
        encode_record(&mut buf, 8, u32::MAX, 255, b"");
        assert_eq!(buf.len(), encoded_len(5) + encoded_len(0));
        let a = decode_record(&buf, 0).unwrap();
        assert_eq!(
            (a.lsn, a.group, a.kind, a.payload, a.frame_len),
            (7, 3, 2, &b"hello"[..], encoded_len(5))
        );
        let b = decode_record(&buf, a.frame_len).unwrap();
        assert_eq!(
            (b.lsn, b.group, b.kind, b.payload),
            (8, u32::MAX, 255, &b""[..])
        );
        assert!(matches!(
            decode_record(&buf, buf.len()),
            Err(RecordError::Incomplete { .. })
        ));
    }

    #[test]
    fn record_damage_detected() {
        let mut buf = Vec::new();
        encode_record(&mut buf, 1, 1, 1, b"payload bytes");
        for i in 0..buf.len() {
            let mut bad = buf.clone();
            bad[i] ^= 0x40;
            assert!(decode_record(&bad, 0).is_err(), "flip at {i} undetected");
        }
        for cut in 0..buf.len() {
            assert!(decode_record(&buf[..cut], 0).is_err());
        }
        let zeros = [0u8; 64];
        assert_eq!(decode_record(&zeros, 0), Err(RecordError::BadLength(0)));
    }

    #[test]
    fn scan_finds_following_record() {
        let mut buf = Vec::new();
        encode_record(&mut buf, 1, 1, 1, b"first");
        let second = buf.len();
        encode_record(&mut buf, 2, 1, 1, b"second");
        let mut bad = buf.clone();
        bad[0] = 0xff; // length now points past the end
        assert_eq!(find_valid_record_after(&bad, 0, 1), Some(second));
        assert_eq!(find_valid_record_after(&buf[..second + 5], 0, 1), None);
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics() {
        let mut state = 0x1234_5678_u64;
        for len in 0..200 {
            let data: Vec<u8> = (0..len)
                .map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                    (state >> 33) as u8
                })
                .collect();
            for off in 0..=len + 2 {
                let _ = decode_record(&data, off);
                let _ = find_valid_record_after(&data, off, 0);
            }
            let _ = decode_segment_header(&data);
        }
    }
}
