//! The wire format of a batch: several Raft RPC frames (of any groups) to one peer in one
//! round trip, whose answers stream back in the order they complete (`coalesce.rs` sends
//! them, `Node::handle_batch` answers them).
//!
//! ```text
//! batch   = magic "URPB", version u8 (1), count u32 LE, count × (len u32 LE, request frame)
//! answers = magic "URPA", version u8 (1), then per answered frame, in completion order:
//!           index u32 LE, status u8 (0 = answer frame, 1 = error text), len u32 LE, bytes
//! ```
//!
//! Each request frame is exactly one frame of `wire.rs`, so a batch adds nothing a single RPC
//! could not carry. The answers are not in request order: a heartbeat of one group must not
//! wait for another group's append, which waits for an fsync.

use bytes::{Buf, Bytes, BytesMut};

const BATCH_MAGIC: &[u8; 4] = b"URPB";
const ANSWERS_MAGIC: &[u8; 4] = b"URPA";
/// Version of the batch and answer-stream framing.
pub const BATCH_VERSION: u8 = 1;
/// Most frames one batch may carry (a bound on what a peer makes this node hold at once).
pub const MAX_BATCH_FRAMES: usize = 1024;

const STATUS_ANSWER: u8 = 0;
const STATUS_ERROR: u8 = 1;

/// Encodes `frames` as one batch.
pub fn encode_batch(frames: &[Vec<u8>]) -> Vec<u8> {
    let len: usize = frames.iter().map(|f| f.len() + 4).sum();
    let mut out = Vec::with_capacity(9 + len);
    out.extend_from_slice(BATCH_MAGIC);
    out.push(BATCH_VERSION);
    out.extend_from_slice(&(frames.len() as u32).to_le_bytes());
    for f in frames {
        out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        out.extend_from_slice(f);
    }
    out
}

/// Splits a batch into its request frames (slices of `body`, not copies).
pub fn decode_batch(mut body: Bytes) -> Result<Vec<Bytes>, String> {
    if body.len() < 9 || &body[..4] != BATCH_MAGIC {
        return Err("not an ursula raft batch".into());
    }
    if body[4] != BATCH_VERSION {
        return Err(format!(
            "raft batch version {} is not supported (this node speaks {BATCH_VERSION})",
            body[4]
        ));
    }
    body.advance(5);
    let count = body.get_u32_le() as usize;
    if count > MAX_BATCH_FRAMES {
        return Err(format!(
            "a batch of {count} frames is over the limit of {MAX_BATCH_FRAMES}"
        ));
    }
    let mut frames = Vec::with_capacity(count);
    for _ in 0..count {
        if body.len() < 4 {
            return Err("truncated batch".into());
        }
        let len = body.get_u32_le() as usize;
        if body.len() < len {
            return Err("truncated batch".into());
        }
        frames.push(body.split_to(len));
    }
    if !body.is_empty() {
        return Err("trailing bytes after the last frame of a batch".into());
    }
    Ok(frames)
}

/// The first bytes of an answer stream.
pub fn answers_header() -> Vec<u8> {
    let mut out = Vec::with_capacity(5);
    out.extend_from_slice(ANSWERS_MAGIC);
    out.push(BATCH_VERSION);
    out
}

/// One answer of the stream: frame `index` answered `result` (an answer frame, or why the
/// peer could not handle the request).
pub fn encode_answer(index: u32, result: &Result<Vec<u8>, String>) -> Vec<u8> {
    let (status, bytes) = match result {
        Ok(a) => (STATUS_ANSWER, a.as_slice()),
        Err(e) => (STATUS_ERROR, e.as_bytes()),
    };
    let mut out = Vec::with_capacity(9 + bytes.len());
    out.extend_from_slice(&index.to_le_bytes());
    out.push(status);
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
    out
}

/// Reads an answer stream as its chunks arrive.
#[derive(Default)]
pub struct AnswerReader {
    buf: BytesMut,
    header_read: bool,
}

/// One decoded answer: the frame's index, and its answer frame or the peer's error text.
pub type Answer = (usize, Result<Vec<u8>, String>);

impl AnswerReader {
    /// Adds the next chunk of the stream.
    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The next complete answer, if the chunks so far hold one; `Err` if the stream is not an
    /// answer stream of this version.
    pub fn next_answer(&mut self) -> Result<Option<Answer>, String> {
        if !self.header_read {
            if self.buf.len() < 5 {
                return Ok(None);
            }
            if &self.buf[..4] != ANSWERS_MAGIC || self.buf[4] != BATCH_VERSION {
                return Err("not an ursula raft answer stream of this version".into());
            }
            self.buf.advance(5);
            self.header_read = true;
        }
        if self.buf.len() < 9 {
            return Ok(None);
        }
        let index = u32::from_le_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]);
        let status = self.buf[4];
        let len = u32::from_le_bytes([self.buf[5], self.buf[6], self.buf[7], self.buf[8]]);
        let len = len as usize;
        if self.buf.len() < 9 + len {
            return Ok(None);
        }
        self.buf.advance(9);
        let bytes = self.buf.split_to(len).to_vec();
        let result = match status {
            STATUS_ANSWER => Ok(bytes),
            STATUS_ERROR => Err(String::from_utf8_lossy(&bytes).into_owned()),
            s => return Err(format!("unknown answer status {s}")),
        };
        Ok(Some((index as usize, result)))
    }

    /// Whether bytes of an unfinished answer are left over.
    pub fn has_partial(&self) -> bool {
        !self.buf.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn refuses_what_is_not_a_batch() {
        assert!(decode_batch(Bytes::from_static(b"URPC\x01\0\0\0\0")).is_err());
        let mut v = encode_batch(&[b"abc".to_vec()]);
        v[4] = 9;
        assert!(
            decode_batch(Bytes::from(v))
                .unwrap_err()
                .contains("version 9")
        );
        let v = encode_batch(&[b"abc".to_vec()]);
        assert!(decode_batch(Bytes::from(v[..v.len() - 1].to_vec())).is_err());
        let mut v = encode_batch(&[b"abc".to_vec()]);
        v.push(0);
        assert!(decode_batch(Bytes::from(v)).is_err());
        let mut v = encode_batch(&[]);
        v[5..9].copy_from_slice(&(MAX_BATCH_FRAMES as u32 + 1).to_le_bytes());
        assert!(decode_batch(Bytes::from(v)).unwrap_err().contains("limit"));
    }

    #[test]
    fn refuses_an_unknown_answer_stream() {
        let mut r = AnswerReader::default();
        r.push(b"URPX\x01");
        assert!(r.next_answer().is_err());
        let mut r = AnswerReader::default();
        r.push(&answers_header());
        r.push(&[0, 0, 0, 0, 7, 0, 0, 0, 0]);
        assert!(r.next_answer().unwrap_err().contains("status 7"));
    }

    proptest! {
        #[test]
        fn batches_round_trip(frames in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..20)) {
            let decoded = decode_batch(Bytes::from(encode_batch(&frames))).unwrap();
            let decoded: Vec<Vec<u8>> = decoded.iter().map(|b| b.to_vec()).collect();
            prop_assert_eq!(decoded, frames);
        }

        /// However the stream is cut into chunks, every answer comes out once, whole.
        #[test]
        fn answers_survive_any_chunking(
            answers in proptest::collection::vec((any::<u32>(), any::<bool>(), proptest::collection::vec(any::<u8>(), 0..40)), 0..12),
            cuts in proptest::collection::vec(1usize..17, 1..40),
        ) {
            let mut stream = answers_header();
            let mut want = Vec::new();
            for (i, ok, bytes) in &answers {
                let r = if *ok { Ok(bytes.clone()) } else { Err(String::from_utf8_lossy(bytes).into_owned()) };
                stream.extend_from_slice(&encode_answer(*i, &r));
                want.push((*i as usize, r));
            }
            let mut reader = AnswerReader::default();
            let mut got = Vec::new();
            let mut rest = stream.as_slice();
            let mut cut = cuts.iter().cycle();
            while !rest.is_empty() {
                let n = (*cut.next().unwrap()).min(rest.len());
                reader.push(&rest[..n]);
                rest = &rest[n..];
                while let Some(a) = reader.next_answer().unwrap() {
                    got.push(a);
                }
            }
            prop_assert!(!reader.has_partial());
            prop_assert_eq!(got, want);
        }
    }
}
