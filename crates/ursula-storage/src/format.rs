//! Byte-level encoding of WAL segments and records (see the crate docs for the layout).
//!
//! Everything here is pure: no I/O, no panics on any input bytes.

/// Magic bytes at offset 0 of every segment file.
pub(crate) const SEGMENT_MAGIC: [u8; 8] = *b"URSULAWL";
/// Current segment format version: version 2's batches in a file that may be a recycled
/// segment, so whole batches with LSNs below the log's next one, after its last batch, are
/// the file's earlier contents and end its records (see the crate docs). Versions 1 (bare
/// records) and 2 are still read, and a version-1 last segment is continued in version-1
/// framing until it is sealed.
pub(crate) const SEGMENT_VERSION: u32 = 3;
/// Records grouped in batches, each with a batch header, in a file that was zero-filled.
pub(crate) const SEGMENT_VERSION_V2: u32 = 2;
/// The first version, still accepted.
pub(crate) const SEGMENT_VERSION_V1: u32 = 1;
/// Segment header: magic (8) + version (4) + first LSN (8) + crc32c of the previous 20 bytes (4).
pub(crate) const SEGMENT_HEADER_LEN: usize = 24;

/// Record frame prefix: body length (4) + crc32c of the body (4).
pub(crate) const FRAME_PREFIX_LEN: usize = 8;
/// Fixed part of a record body: lsn (8) + group (4) + kind (1).
pub(crate) const BODY_FIXED_LEN: usize = 13;
/// Total fixed overhead of one record on disk.
pub(crate) const RECORD_OVERHEAD: usize = FRAME_PREFIX_LEN + BODY_FIXED_LEN;

/// Batch header (version 2): tag (4) + records length (4) + first LSN (8) + count (4) + crc (4).
pub(crate) const BATCH_HEADER_LEN: usize = 24;
/// First field of a batch header. Larger than any record length, so a batch header can never
/// be mistaken for a record frame and vice versa. Must stay stable.
pub(crate) const BATCH_TAG: u32 = 0xFFFF_FFB1;

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

/// Decodes a segment header, returning its first LSN and format version.
pub(crate) fn decode_segment_header(data: &[u8]) -> Result<(u64, u32), HeaderError> {
    let h = data.get(..SEGMENT_HEADER_LEN).ok_or(HeaderError::Short)?;
    if h.get(0..8) != Some(&SEGMENT_MAGIC[..]) {
        return Err(HeaderError::BadMagic);
    }
    let version = read_u32(h, 8).ok_or(HeaderError::Short)?;
    if !(SEGMENT_VERSION_V1..=SEGMENT_VERSION).contains(&version) {
        return Err(HeaderError::BadVersion(version));
    }
    let first_lsn = read_u64(h, 12).ok_or(HeaderError::Short)?;
    let crc = read_u32(h, 20).ok_or(HeaderError::Short)?;
    let body = h.get(0..20).ok_or(HeaderError::Short)?;
    if crc32c::crc32c(body) != crc {
        return Err(HeaderError::BadChecksum);
    }
    Ok((first_lsn, version))
}

/// Encodes a segment header of format version 1 (tests of old data directories only).
#[cfg(test)]
pub(crate) fn encode_segment_header_v1(first_lsn: u64) -> [u8; SEGMENT_HEADER_LEN] {
    encode_segment_header_of(SEGMENT_VERSION_V1, first_lsn)
}

/// Encodes a segment header of an older format `version` (tests of old data directories).
#[cfg(test)]
pub(crate) fn encode_segment_header_of(version: u32, first_lsn: u64) -> [u8; SEGMENT_HEADER_LEN] {
    let mut h = encode_segment_header(first_lsn);
    h[8..12].copy_from_slice(&version.to_le_bytes());
    let crc = crc32c::crc32c(&h[0..20]);
    h[20..24].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Number of bytes [`encode_record`] appends for a payload of `payload_len` bytes.
pub(crate) fn encoded_len(payload_len: usize) -> usize {
    RECORD_OVERHEAD + payload_len
}

/// Appends one framed record to `buf` and returns its 8-byte prefix (length and checksum), which
/// the batch checksum covers. The caller guarantees `payload.len() <= MAX_PAYLOAD_LEN`.
pub(crate) fn encode_record(
    buf: &mut Vec<u8>,
    lsn: u64,
    group: u32,
    kind: u8,
    payload: &[u8],
) -> [u8; FRAME_PREFIX_LEN] {
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
    let mut prefix = [0u8; FRAME_PREFIX_LEN];
    prefix[0..4].copy_from_slice(&body_len.to_le_bytes());
    prefix[4..8].copy_from_slice(&crc.to_le_bytes());
    prefix
}

/// The batch checksum: crc32c over every record's prefix in order (`prefix_crc`, built with
/// `crc32c::crc32c_append` from 0), then over the header's first 20 bytes. Each record's own
/// checksum covers its body, so this binds the whole batch at 8 bytes of work per record.
fn batch_crc(prefix_crc: u32, header: &[u8]) -> u32 {
    crc32c::crc32c_append(prefix_crc, header.get(0..20).unwrap_or_default())
}

/// Fills in the batch header reserved at `buf[at..at + BATCH_HEADER_LEN]`, for the `count`
/// records encoded after it starting at `first_lsn`.
pub(crate) fn finish_batch_header(
    buf: &mut [u8],
    at: usize,
    first_lsn: u64,
    count: u32,
    prefix_crc: u32,
) {
    let records_len = buf.len().saturating_sub(at + BATCH_HEADER_LEN);
    let Some(h) = buf.get_mut(at..at + BATCH_HEADER_LEN) else {
        return;
    };
    h[0..4].copy_from_slice(&BATCH_TAG.to_le_bytes());
    h[4..8].copy_from_slice(&u32::try_from(records_len).unwrap_or(u32::MAX).to_le_bytes());
    h[8..16].copy_from_slice(&first_lsn.to_le_bytes());
    h[16..20].copy_from_slice(&count.to_le_bytes());
    let crc = batch_crc(prefix_crc, h);
    h[20..24].copy_from_slice(&crc.to_le_bytes());
}

/// Why the bytes at some offset are not a whole batch.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum BatchError {
    /// The header or the records extend past the end of the data.
    Incomplete,
    /// No batch tag where a batch must start.
    BadTag,
    /// A record inside the batch is damaged, or the records do not fill the batch.
    BadRecord(RecordError),
    /// The records do not number `count` from the header's first LSN.
    BadLsn { expected: u64, found: u64 },
    /// The batch checksum does not match.
    BadChecksum,
}

impl std::fmt::Display for BatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BatchError::Incomplete => write!(f, "incomplete batch"),
            BatchError::BadTag => write!(f, "no batch header"),
            BatchError::BadRecord(e) => write!(f, "damaged batch: {e}"),
            BatchError::BadLsn { expected, found } => {
                write!(f, "batch record has LSN {found}, expected {expected}")
            }
            BatchError::BadChecksum => write!(f, "batch checksum mismatch"),
        }
    }
}

/// Decodes and fully verifies the batch at `data[off..]`: returns its records and total
/// framed length. A batch is whole or rejected as a unit.
pub(crate) fn decode_batch(
    data: &[u8],
    off: usize,
) -> Result<(Vec<DecodedRecord<'_>>, usize), BatchError> {
    let h = data
        .get(off..off.saturating_add(BATCH_HEADER_LEN))
        .ok_or(BatchError::Incomplete)?;
    if read_u32(h, 0) != Some(BATCH_TAG) {
        return Err(BatchError::BadTag);
    }
    let records_len = read_u32(h, 4).ok_or(BatchError::Incomplete)? as usize;
    let first_lsn = read_u64(h, 8).ok_or(BatchError::Incomplete)?;
    let count = read_u32(h, 16).ok_or(BatchError::Incomplete)?;
    let crc = read_u32(h, 20).ok_or(BatchError::Incomplete)?;
    let start = off + BATCH_HEADER_LEN;
    let body = data
        .get(start..start.saturating_add(records_len))
        .ok_or(BatchError::Incomplete)?;
    let mut records = Vec::with_capacity((count as usize).min(body.len() / RECORD_OVERHEAD + 1));
    let mut prefix_crc = 0u32;
    let mut p = 0usize;
    for i in 0..u64::from(count) {
        let rec = decode_record(body, p).map_err(BatchError::BadRecord)?;
        let expected = first_lsn.saturating_add(i);
        if rec.lsn != expected {
            return Err(BatchError::BadLsn {
                expected,
                found: rec.lsn,
            });
        }
        prefix_crc = crc32c::crc32c_append(
            prefix_crc,
            body.get(p..p + FRAME_PREFIX_LEN).unwrap_or_default(),
        );
        p += rec.frame_len;
        records.push(rec);
    }
    if p != records_len || count == 0 {
        return Err(BatchError::BadRecord(RecordError::BadLength(
            records_len as u32,
        )));
    }
    if batch_crc(prefix_crc, h) != crc {
        return Err(BatchError::BadChecksum);
    }
    Ok((records, BATCH_HEADER_LEN + records_len))
}

/// After a damaged batch at `bad_off`, the offset of the first later whole batch whose first
/// LSN is plausible (`>= min_lsn`, not absurdly far ahead), if any. A later whole batch proves
/// the damaged one was synced (the writer syncs each batch before it writes the next), so the
/// damage is corruption, not a torn tail.
pub(crate) fn find_valid_batch_after(data: &[u8], bad_off: usize, min_lsn: u64) -> Option<usize> {
    let tail = data.len().saturating_sub(bad_off);
    let max_lsn = min_lsn.saturating_add((tail / RECORD_OVERHEAD) as u64 + 1);
    let last_start = data.len().checked_sub(BATCH_HEADER_LEN + RECORD_OVERHEAD)?;
    let mut p = bad_off.checked_add(1)?;
    while p <= last_start {
        if read_u32(data, p) == Some(BATCH_TAG)
            && let Some(lsn) = read_u64(data, p + 8)
            && lsn >= min_lsn
            && lsn <= max_lsn
            && decode_batch(data, p).is_ok()
        {
            return Some(p);
        }
        p += 1;
    }
    None
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
        assert_eq!(decode_segment_header(&h), Ok((42, SEGMENT_VERSION)));
        assert_eq!(
            decode_segment_header(&encode_segment_header_v1(42)),
            Ok((42, SEGMENT_VERSION_V1))
        );
        assert_eq!(
            decode_segment_header(&encode_segment_header_of(SEGMENT_VERSION_V2, 42)),
            Ok((42, SEGMENT_VERSION_V2))
        );
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

    fn batch(first_lsn: u64, payloads: &[&[u8]]) -> Vec<u8> {
        let mut buf = vec![0u8; BATCH_HEADER_LEN];
        let mut crc = 0;
        for (i, p) in payloads.iter().enumerate() {
            let prefix = encode_record(&mut buf, first_lsn + i as u64, 1, 1, p);
            crc = crc32c::crc32c_append(crc, &prefix);
        }
        finish_batch_header(&mut buf, 0, first_lsn, payloads.len() as u32, crc);
        buf
    }

    #[test]
    fn batch_round_trip_and_every_damage_rejects_it_whole() {
        let b = batch(5, &[b"one", b"two", b"three"]);
        let (recs, len) = decode_batch(&b, 0).unwrap();
        assert_eq!(len, b.len());
        assert_eq!(
            recs.iter().map(|r| r.lsn).collect::<Vec<_>>(),
            vec![5, 6, 7]
        );
        for i in 0..b.len() {
            let mut bad = b.clone();
            bad[i] ^= 0x10;
            assert!(decode_batch(&bad, 0).is_err(), "flip at {i} undetected");
        }
        for cut in 0..b.len() {
            assert!(decode_batch(&b[..cut], 0).is_err());
        }
        // A page of zeros in the middle (an earlier page lost, a later one kept).
        let mut holed = b.clone();
        holed[BATCH_HEADER_LEN + 2..BATCH_HEADER_LEN + 30].fill(0);
        assert!(decode_batch(&holed, 0).is_err());
        // A later whole batch is found after damage; a lone record is not a batch.
        let mut two = holed.clone();
        let second = two.len();
        two.extend_from_slice(&batch(8, &[b"four"]));
        assert_eq!(find_valid_batch_after(&two, 0, 5), Some(second));
        assert_eq!(find_valid_batch_after(&holed, 0, 5), None);
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
            for off in 0..=len {
                let _ = decode_batch(&data, off);
                let _ = find_valid_batch_after(&data, off, 0);
            }
        }
    }
}
