//! Choosing a `multipart/mixed` boundary that occurs in none of the parts (RFC 2046 §5.1.1)
//! when the parts are too large to hold at once: each body is scanned piece by piece for the
//! boundary prefix, noting the bytes that follow each occurrence, and the boundary is a
//! random candidate that none of them starts.

use std::hash::{BuildHasher, RandomState};

/// Hex digits after the prefix in a boundary.
pub const RANDOM_HEX: usize = 32;

/// Scans bodies piece by piece: the up to `n` bytes after each occurrence of `needle`, also
/// across piece boundaries. Holds at most one piece plus a short carry.
#[derive(Debug)]
pub struct SuffixScan {
    needle: Vec<u8>,
    n: usize,
    carry: Vec<u8>,
    found: Vec<Vec<u8>>,
}

impl SuffixScan {
    pub fn new(needle: &[u8], n: usize) -> Self {
        SuffixScan {
            needle: needle.to_vec(),
            n,
            carry: Vec::new(),
            found: Vec::new(),
        }
    }

    /// The next piece of the current body.
    pub fn feed(&mut self, piece: &[u8]) {
        let keep = self.needle.len() + self.n - 1;
        let mut window = std::mem::take(&mut self.carry);
        window.extend_from_slice(piece);
        suffixes_in(&window, &self.needle, self.n, &mut self.found);
        self.carry = window[window.len().saturating_sub(keep)..].to_vec();
    }

    /// Ends the current body (the next piece starts a new one).
    pub fn end_body(&mut self) {
        self.carry.clear();
    }

    /// Everything found (an occurrence near a piece boundary may be listed twice, once cut
    /// short; neither matters to [`choose`]).
    pub fn into_found(self) -> Vec<Vec<u8>> {
        self.found
    }
}

fn suffixes_in(hay: &[u8], needle: &[u8], n: usize, out: &mut Vec<Vec<u8>>) {
    for at in find_all(hay, needle) {
        let from = at + needle.len();
        out.push(hay[from..hay.len().min(from + n)].to_vec());
    }
}

/// Start positions of `needle` in `hay` (non-empty needle).
pub fn find_all(hay: &[u8], needle: &[u8]) -> Vec<usize> {
    let Some((&first, rest)) = needle.split_first() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(p) = hay
        .get(i..)
        .and_then(|h| h.iter().position(|b| *b == first))
    {
        let at = i + p;
        if hay.get(at + 1..at + needle.len()) == Some(rest) {
            out.push(at);
        }
        i = at + 1;
    }
    out
}

/// `prefix` + [`RANDOM_HEX`] random hex digits that no entry of `taken` starts.
pub fn pick(prefix: &str, taken: &[Vec<u8>]) -> String {
    let state = RandomState::new();
    let mut n = 0u64;
    choose(prefix, taken, || {
        n += 1;
        let (a, b) = (state.hash_one(n), state.hash_one(!n));
        format!("{a:016x}{b:016x}")
    })
}

/// `prefix` + the first candidate from `next` that no entry of `taken` starts.
pub fn choose(prefix: &str, taken: &[Vec<u8>], mut next: impl FnMut() -> String) -> String {
    loop {
        let hex = next();
        if !taken.iter().any(|t| t.starts_with(hex.as_bytes())) {
            return format!("{prefix}{hex}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn finds_every_occurrence() {
        assert_eq!(find_all(b"abcabcab", b"ab"), vec![0, 3, 6]);
        assert_eq!(find_all(b"aaa", b"aa"), vec![0, 1]);
        assert!(find_all(b"", b"x").is_empty());
    }

    #[test]
    fn suffixes_are_found_in_a_window() {
        let mut s = SuffixScan::new(b"--b-", 3);
        s.feed(b"xx--b-123--b-45");
        assert_eq!(s.into_found(), vec![b"123".to_vec(), b"45".to_vec()]);
    }

    #[test]
    fn a_candidate_a_body_holds_is_skipped() {
        let first = "0".repeat(RANDOM_HEX);
        let second = "1".repeat(RANDOM_HEX);
        let mut s = SuffixScan::new(b"--p-", RANDOM_HEX);
        s.feed(format!("x\r\n--p-{}", &first[..10]).as_bytes());
        s.feed(format!("{}\r\n", &first[10..]).as_bytes());
        let taken = s.into_found();
        let mut c = [first, second.clone()].into_iter();
        assert_eq!(
            choose("p-", &taken, || c.next().unwrap_or_default()),
            format!("p-{second}")
        );
        let b = pick("p-", &[]);
        assert!(b.len() == 2 + RANDOM_HEX && b[2..].bytes().all(|c| c.is_ascii_hexdigit()));
    }

    proptest! {
        /// However a body is cut into pieces, every occurrence's full suffix is found.
        #[test]
        fn pieces_find_what_the_whole_finds(body in prop::collection::vec(
                prop::sample::select(vec![b'-', b'-', b'b', b'x', b'1']), 0..80),
            cuts in prop::collection::vec(0usize..80, 0..6)) {
            let needle = b"--b";
            let mut whole = Vec::new();
            suffixes_in(&body, needle, 3, &mut whole);
            let mut at: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
            at.sort_unstable();
            let mut s = SuffixScan::new(needle, 3);
            let mut prev = 0;
            for c in at {
                s.feed(&body[prev..c]);
                prev = c;
            }
            s.feed(&body[prev..]);
            let found = s.into_found();
            for w in whole {
                prop_assert!(found.contains(&w), "{:?} missing", w);
            }
        }
    }
}
