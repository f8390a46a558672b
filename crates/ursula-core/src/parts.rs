//! Multi-part snapshot upload rules (snapshot-parts.md): the constants, part IDs, the
//! `Stream-Snapshot-Parts` header, the manifest, and the per-stream staged bounds. Pure code:
//! the server does the IO and asks these functions what to answer.

use crate::error::{ErrorCode, Rejection};
use crate::ids::Incarnation;
use std::collections::HashSet;
use std::fmt;

/// Largest part (`Ursula-Max-Request-Bytes`).
pub const MAX_PART_BYTES: u64 = 32 << 20;
/// Largest committed snapshot (`Ursula-Max-Snapshot-Bytes`).
pub const MAX_SNAPSHOT_BYTES: u64 = 1 << 30;
/// Most parts one commit lists.
pub const MAX_PARTS_PER_COMMIT: usize = 4096;
/// Longest manifest body (4,096 lines of at most 64 bytes).
pub const MAX_MANIFEST_BYTES: usize = MAX_PARTS_PER_COMMIT * 64;
/// Most unused staged parts per stream (`Ursula-Max-Staged-Parts`).
pub const MAX_STAGED_PARTS: u64 = 8192;
/// Most unused staged bytes per stream (`Ursula-Max-Staged-Bytes`).
pub const MAX_STAGED_BYTES: u64 = 2 << 30;
/// What a part upload without `Content-Length` is charged while it uploads.
pub const UNKNOWN_LENGTH_CHARGE: u64 = MAX_PART_BYTES;
/// Clock-skew margin of the cross-incarnation clean-ups (§7).
pub const SKEW_MARGIN_MS: i64 = 60_000;

/// A part's ID: `<incarnation: 32 hex>-<16 hex>.part` (§3). The unique half is random, so it
/// cannot collide across leader changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PartId {
    pub incarnation: Incarnation,
    pub unique: u64,
}

impl PartId {
    /// Parses the exact lowercase form this server hands out.
    pub fn parse(s: &str) -> Option<PartId> {
        let rest = s.strip_suffix(".part")?;
        let (inc, unique) = rest.split_once('-')?;
        let lower_hex = |t: &str, n: usize| {
            t.len() == n
                && t.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        if !lower_hex(inc, 32) || !lower_hex(unique, 16) {
            return None;
        }
        Some(PartId {
            incarnation: Incarnation::parse(inc)?,
            unique: u64::from_str_radix(unique, 16).ok()?,
        })
    }
}

impl fmt::Display for PartId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{:016x}.part", self.incarnation, self.unique)
    }
}

fn bad_manifest(message: impl Into<String>) -> Rejection {
    Rejection::new(ErrorCode::INVALID_SNAPSHOT_MANIFEST, message)
}

/// `Stream-Snapshot-Parts`: a decimal integer from 1 to 4,096 (`400
/// INVALID_SNAPSHOT_MANIFEST` otherwise).
pub fn parse_parts_count(value: &[u8]) -> Result<usize, Rejection> {
    let text = std::str::from_utf8(value).unwrap_or("").trim();
    let n = (!text.is_empty() && text.len() <= 5 && text.bytes().all(|b| b.is_ascii_digit()))
        .then(|| text.parse::<usize>().ok())
        .flatten()
        .filter(|n| (1..=MAX_PARTS_PER_COMMIT).contains(n));
    n.ok_or_else(|| {
        bad_manifest(format!(
            "Stream-Snapshot-Parts must be a whole number from 1 to {MAX_PARTS_PER_COMMIT}"
        ))
    })
}

/// Parses a manifest (B1): `count` part IDs, each followed by one LF, no blank line, no CR,
/// no ID twice, at most [`MAX_MANIFEST_BYTES`].
pub fn parse_manifest(body: &[u8], count: usize) -> Result<Vec<PartId>, Rejection> {
    if body.len() > MAX_MANIFEST_BYTES {
        return Err(bad_manifest(format!(
            "the manifest is longer than {MAX_MANIFEST_BYTES} bytes"
        )));
    }
    let text = std::str::from_utf8(body).map_err(|_| bad_manifest("the manifest is not UTF-8"))?;
    let Some(text) = text.strip_suffix('\n') else {
        return Err(bad_manifest(
            "the manifest must list part IDs, each followed by a line feed",
        ));
    };
    let mut ids = Vec::new();
    let mut seen = HashSet::new();
    for (i, line) in text.split('\n').enumerate() {
        let id = PartId::parse(line).ok_or_else(|| {
            bad_manifest(format!(
                "manifest line {} is not a part ID (no blank lines or CR)",
                i + 1
            ))
        })?;
        if !seen.insert(id) {
            return Err(bad_manifest(format!(
                "manifest line {} lists part {id} a second time",
                i + 1
            )));
        }
        if ids.len() == count {
            return Err(bad_manifest(format!(
                "the manifest lists more than the {count} parts Stream-Snapshot-Parts announces"
            )));
        }
        ids.push(id);
    }
    if ids.len() != count {
        return Err(bad_manifest(format!(
            "the manifest lists {} parts but Stream-Snapshot-Parts announces {count}",
            ids.len()
        )));
    }
    Ok(ids)
}

/// B3: the parts add up to at most [`MAX_SNAPSHOT_BYTES`].
pub fn check_total(sizes: &[u64]) -> Result<u64, Rejection> {
    let total = sizes.iter().try_fold(0u64, |a, s| a.checked_add(*s));
    total.filter(|t| *t <= MAX_SNAPSHOT_BYTES).ok_or_else(|| {
        bad_manifest(format!(
            "the parts add up to more than Ursula-Max-Snapshot-Bytes ({MAX_SNAPSHOT_BYTES})"
        ))
    })
}

/// Which staged bound a part would exceed (§8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BoundHit {
    pub parts: bool,
    pub bytes: bool,
}

/// Whether one more part charged `charge` bytes fits beside `parts` parts and `bytes` bytes
/// already staged or uploading.
pub fn staged_bounds(parts: u64, bytes: u64, charge: u64) -> Result<(), BoundHit> {
    let hit = BoundHit {
        parts: parts + 1 > MAX_STAGED_PARTS,
        bytes: bytes.saturating_add(charge) > MAX_STAGED_BYTES,
    };
    if hit.parts || hit.bytes {
        Err(hit)
    } else {
        Ok(())
    }
}

/// What a part upload is charged while it uploads: its `Content-Length`, or 32 MiB.
pub fn upload_charge(content_length: Option<u64>) -> u64 {
    content_length.unwrap_or(UNKNOWN_LENGTH_CHARGE)
}

/// Whether a listed part of incarnation `part` staged at `modified_ms` is an earlier
/// incarnation's part that a listing, discard or delete removes: older than `since_ms` (the
/// current incarnation's creation, or the discard) by more than the skew margin (§6, §7).
pub fn stale_other_incarnation(
    part: Incarnation,
    current: Incarnation,
    modified_ms: i64,
    since_ms: i64,
) -> bool {
    part != current && modified_ms < since_ms - SKEW_MARGIN_MS
}

/// The copy charge against `server.http_inflight_body_size` (§10): 56 MiB from a 128 MiB
/// budget up, otherwise 32 MiB.
pub fn copy_charge(budget: u64) -> u64 {
    if budget >= 128 << 20 {
        56 << 20
    } else {
        32 << 20
    }
}

/// Whether a copy charged [`copy_charge`] may start beside `reserved` bytes (§10).
pub fn copy_fits(reserved: u64, budget: u64) -> bool {
    reserved + copy_charge(budget) + MAX_PART_BYTES <= budget
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn id(inc: u128, u: u64) -> PartId {
        PartId {
            incarnation: Incarnation(inc),
            unique: u,
        }
    }

    #[test]
    fn part_ids() {
        let p = id(0x186f2b3a1c0d9e00, 7);
        assert_eq!(
            p.to_string(),
            "0000000000000000186f2b3a1c0d9e00-0000000000000007.part"
        );
        assert_eq!(PartId::parse(&p.to_string()), Some(p));
        for bad in [
            "",
            "0000000000000000186F2B3A1C0D9E00-0000000000000007.part",
            "0000000000000000186f2b3a1c0d9e00-0000000000000007",
            "0000000000000000186f2b3a1c0d9e00-000000000000007.part",
            "0000000000000000186f2b3a1c0d9e00_0000000000000007.part",
            "0000000000000000186f2b3a1c0d9e00-0000000000000007.part\r",
        ] {
            assert_eq!(PartId::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn parts_counts() {
        assert_eq!(parse_parts_count(b"1").ok(), Some(1));
        assert_eq!(parse_parts_count(b"4096").ok(), Some(4096));
        for bad in [&b"0"[..], b"4097", b"", b"-1", b"1.0", b"x", b"99999999999"] {
            assert!(parse_parts_count(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn manifests() {
        let (a, b) = (id(1, 1), id(1, 2));
        let m = format!("{a}\n{b}\n");
        assert_eq!(parse_manifest(m.as_bytes(), 2).unwrap(), vec![a, b]);
        for (bad, n) in [
            (format!("{a}\n{b}"), 2),
            (format!("{a}\n\n{b}\n"), 2),
            (format!("{a}\r\n{b}\n"), 2),
            (format!("{a}\n{a}\n"), 2),
            (format!("{a}\n{b}\n"), 1),
            (format!("{a}\n{b}\n"), 3),
            (String::new(), 1),
            ("\n".to_owned(), 1),
        ] {
            assert_eq!(
                parse_manifest(bad.as_bytes(), n).err().map(|r| r.code),
                Some(ErrorCode::INVALID_SNAPSHOT_MANIFEST),
                "{bad:?}"
            );
        }
        let long = vec![b'a'; MAX_MANIFEST_BYTES + 1];
        assert!(parse_manifest(&long, 1).is_err());
    }

    #[test]
    fn totals_and_bounds() {
        assert_eq!(check_total(&[1, 2]).ok(), Some(3));
        assert!(check_total(&[MAX_SNAPSHOT_BYTES, 1]).is_err());
        assert!(check_total(&[u64::MAX, 2]).is_err());
        assert!(staged_bounds(MAX_STAGED_PARTS - 1, 0, 1).is_ok());
        assert_eq!(
            staged_bounds(MAX_STAGED_PARTS, 0, 1),
            Err(BoundHit {
                parts: true,
                bytes: false
            })
        );
        assert!(staged_bounds(0, MAX_STAGED_BYTES - 10, 10).is_ok());
        assert_eq!(
            staged_bounds(0, MAX_STAGED_BYTES - 10, upload_charge(None)),
            Err(BoundHit {
                parts: false,
                bytes: true
            })
        );
        assert!(stale_other_incarnation(
            Incarnation(1),
            Incarnation(2),
            0,
            SKEW_MARGIN_MS + 1
        ));
        assert!(!stale_other_incarnation(
            Incarnation(2),
            Incarnation(2),
            0,
            i64::MAX
        ));
        assert!(!stale_other_incarnation(
            Incarnation(1),
            Incarnation(2),
            0,
            SKEW_MARGIN_MS
        ));
    }

    #[test]
    fn copy_admission() {
        let mib = 1u64 << 20;
        assert!(copy_fits(0, 256 * mib));
        assert!(copy_fits(56 * mib, 256 * mib));
        assert!(!copy_fits(112 * mib + 1, 256 * mib) || copy_fits(112 * mib, 256 * mib));
        assert!(copy_fits(0, 64 * mib));
        assert!(!copy_fits(32 * mib, 64 * mib));
        assert!(!copy_fits(0, 63 * mib));
    }

    proptest! {
        #[test]
        fn manifests_round_trip(ids in proptest::collection::btree_set((any::<u128>(), any::<u64>()), 1..50)) {
            let ids: Vec<PartId> = ids.into_iter().map(|(i, u)| id(i, u)).collect();
            let text: String = ids.iter().map(|p| format!("{p}\n")).collect();
            prop_assert_eq!(parse_manifest(text.as_bytes(), ids.len()).unwrap(), ids);
        }

        #[test]
        fn arbitrary_manifests_never_panic(body in proptest::collection::vec(any::<u8>(), 0..300), n in 1usize..5) {
            let _ = parse_manifest(&body, n);
        }
    }
}
