//! Offsets: byte positions in a stream, exchanged as 20-digit tokens.

use std::fmt;

/// Formats an offset in its canonical 20-digit form.
pub struct Off(pub u64);

impl Off {
    /// The 20-digit form as ASCII bytes, without allocating (`u64::MAX` has 20 digits).
    pub fn digits(&self) -> [u8; 20] {
        let mut out = [b'0'; 20];
        let mut n = self.0;
        for d in out.iter_mut().rev() {
            *d = b'0' + (n % 10) as u8;
            n /= 10;
        }
        out
    }
}

impl fmt::Display for Off {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Always ASCII digits.
        f.write_str(std::str::from_utf8(&self.digits()).map_err(|_| fmt::Error)?)
    }
}

/// A read start position as given in the `offset` query parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadStart {
    /// `-1` or absent: the beginning of the stream.
    Beginning,
    /// `now`: the tail at the time the request is processed.
    Now,
    /// A byte position.
    At(u64),
}

/// Parses 1 to 20 ASCII digits that fit in u64.
pub fn parse_digits(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse::<u64>().ok()
}

/// Parses the `offset` query parameter value.
pub fn parse_read_offset(s: &str) -> Option<ReadStart> {
    match s {
        "-1" => Some(ReadStart::Beginning),
        "now" => Some(ReadStart::Now),
        _ => parse_digits(s).map(ReadStart::At),
    }
}

/// Parses the `Stream-Fork-Offset` header: digits, or `0000000000000000_<16 digits>`.
pub fn parse_fork_offset(s: &str) -> Option<u64> {
    if let Some((hi, lo)) = s.split_once('_') {
        if hi.len() == 16 && hi.bytes().all(|b| b == b'0') && lo.len() == 16 {
            return parse_digits(lo);
        }
        return None;
    }
    parse_digits(s)
}

/// Parses a non-negative integer without sign or leading zeros (`0` itself allowed).
pub fn parse_canonical_uint(s: &str) -> Option<u64> {
    if s.len() > 1 && s.starts_with('0') {
        return None;
    }
    parse_digits(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_twenty_digits() {
        assert_eq!(Off(42).to_string(), "00000000000000000042");
        assert_eq!(Off(0).to_string(), "00000000000000000000");
        assert_eq!(Off(u64::MAX).to_string(), "18446744073709551615");
    }

    proptest::proptest! {
        #[test]
        fn digits_match_zero_padded_decimal(n in proptest::prelude::any::<u64>()) {
            let digits = Off(n).digits();
            let expected = format!("{n:020}");
            proptest::prop_assert_eq!(&digits[..], expected.as_bytes());
            proptest::prop_assert_eq!(parse_read_offset(&Off(n).to_string()), Some(ReadStart::At(n)));
        }
    }

    #[test]
    fn read_offsets() {
        assert_eq!(parse_read_offset("-1"), Some(ReadStart::Beginning));
        assert_eq!(parse_read_offset("now"), Some(ReadStart::Now));
        assert_eq!(parse_read_offset("42"), Some(ReadStart::At(42)));
        assert_eq!(
            parse_read_offset("00000000000000000042"),
            Some(ReadStart::At(42))
        );
        for bad in [
            "",
            "-2",
            "+1",
            " 1",
            "0x10",
            "000000000000000000001",
            "18446744073709551616",
        ] {
            assert_eq!(parse_read_offset(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn fork_offsets() {
        assert_eq!(
            parse_fork_offset("0000000000000000_0000000000000000"),
            Some(0)
        );
        assert_eq!(
            parse_fork_offset("0000000000000000_0000000000000005"),
            Some(5)
        );
        assert_eq!(parse_fork_offset("9999999999999999_9999999999999999"), None);
        assert_eq!(parse_fork_offset("-1"), None);
        assert_eq!(parse_fork_offset("7"), Some(7));
    }

    #[test]
    fn canonical_uints() {
        assert_eq!(parse_canonical_uint("0"), Some(0));
        assert_eq!(parse_canonical_uint("120"), Some(120));
        for bad in ["05", "-1", "+1", "1.5", "abc", ""] {
            assert_eq!(parse_canonical_uint(bad), None);
        }
    }
}
