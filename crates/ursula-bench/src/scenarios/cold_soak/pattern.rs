//! The deterministic bytes of each soak stream, so nothing is stored to verify them.

use bytes::Bytes;

/// The bytes of one stream: position p holds byte p % 8 (little-endian) of
/// splitmix64(seed + p / 8), with the seed derived from the stream's name.
#[derive(Clone, Copy, Debug)]
pub struct Pattern {
    seed: u64,
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Pattern {
    pub fn for_stream(name: &str) -> Self {
        // FNV-1a of the name, then mixed.
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for b in name.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        Self {
            seed: splitmix64(h),
        }
    }

    fn word(&self, w: u64) -> [u8; 8] {
        splitmix64(
            self.seed
                .wrapping_add(w.wrapping_mul(0x2545_f491_4f6c_dd1d)),
        )
        .to_le_bytes()
    }

    /// Fill `out` with the stream's bytes from position `start`.
    pub fn fill(&self, start: u64, out: &mut [u8]) {
        let mut pos = start;
        let mut i = 0usize;
        // Unaligned head.
        while i < out.len() && !pos.is_multiple_of(8) {
            out[i] = self.word(pos / 8)[(pos % 8) as usize];
            i += 1;
            pos += 1;
        }
        let mut chunks = out[i..].chunks_exact_mut(8);
        let mut w = pos / 8;
        for c in &mut chunks {
            c.copy_from_slice(&self.word(w));
            w += 1;
        }
        let tail = chunks.into_remainder();
        if !tail.is_empty() {
            let word = self.word(w);
            tail.copy_from_slice(&word[..tail.len()]);
        }
    }

    pub fn bytes(&self, start: u64, len: usize) -> Bytes {
        let mut v = vec![0u8; len];
        self.fill(start, &mut v);
        Bytes::from(v)
    }

    /// Position (relative to `start`) of the first byte of `got` that differs, if any.
    pub fn first_mismatch(&self, start: u64, got: &[u8], scratch: &mut Vec<u8>) -> Option<u64> {
        scratch.resize(got.len(), 0);
        self.fill(start, scratch);
        if scratch.as_slice() == got {
            return None;
        }
        got.iter()
            .zip(scratch.iter())
            .position(|(a, b)| a != b)
            .map(|p| p as u64)
    }
}

/// Bytes stream `i` of `streams` holds when `total` are spread over them.
pub fn stream_len(total: u64, streams: usize, i: usize) -> u64 {
    let s = streams as u64;
    total / s + u64::from((i as u64) < total % s)
}
