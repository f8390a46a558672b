//! Durable encoding of the core types that the Raft log and snapshots hold: [`Command`]s (inside
//! log entries) and [`GroupState`] (inside snapshot payloads).
//!
//! Every persisted encoding names its [`Schema`]; the container (the entry's version byte, the
//! snapshot header's `format`) carries it, and this module has a decoder for every schema still
//! readable. Both schemas decode with bincode 1.x in its legacy configuration (fixed-width
//! little-endian integers, `u64` lengths, variant index as `u32`), which is what the release
//! before versioning wrote:
//!
//! - [`Schema::V1`]: data written by that release (entries without a version byte, snapshot
//!   format 1). Frozen: `tests/encoding_golden.rs` pins its bytes for every variant.
//! - [`Schema::V2`]: V1 plus the cold tier's references (a stream's chunk references, a group's
//!   object bookkeeping) and the cold commands. Commands of V1 decode as V2 (the new variants
//!   come last); group states of V1 decode through the frozen types of [`v1`].
//! - [`Schema::V3`]: V2 plus the external-payload commands (`Op::AppendExternal`,
//!   `Op::CreateExternal`, cluster.md §6.4). Strictly additive: the new variants come last and
//!   no existing type changed, so V1 and V2 commands decode as V3 and the group state has V2's
//!   layout (an external payload is one more chunk reference). The number still changes, so
//!   that a build before it refuses such entries by their version instead of failing on an
//!   unknown variant.
//! - [`Schema::V4`]: what this build writes: a stream's message ends packed (the count, then
//!   LEB128 differences, [`crate::ends`]) instead of a `Vec<u64>`: about two bytes a message
//!   instead of eight, in every group snapshot. Commands did not change (V1 to V3 commands
//!   decode as V4); group states of V2 and V3 decode through the frozen types of [`v3`].
//!
//! # Adding a field or a variant
//!
//! The layout is positional, so a change to any persisted type (here and in every type they
//! contain) is a new schema: copy the types as they are into a frozen `encoding/v4.rs` module
//! (decode-only, with `From` conversions into the live types), add `Schema::V5` and make it
//! [`Schema::CURRENT`], then change the live types. The golden test fails on any change to the
//! bytes of an existing schema, which is the reminder. docs/storage.md has the full rule.

mod v1;
mod v3;

use crate::command::Command;
use crate::group::GroupState;
use bincode::Options;
use serde::{Deserialize, Serialize};

/// A version of the encoding of [`Command`] and [`GroupState`].
///
/// Persisted: the discriminants must stay stable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Schema {
    /// Written by the release before versioned payloads (commit 2914ec9). Read-only.
    V1 = 1,
    /// Cold-tier references (the release before external payloads). Read-only.
    V2 = 2,
    /// External payloads (the release before packed message ends). Read-only.
    V3 = 3,
    /// Written by this build.
    V4 = 4,
}

impl Schema {
    /// The schema this build writes.
    pub const CURRENT: Schema = Schema::V4;

    /// Every schema this build reads, oldest first.
    pub const READABLE: [Schema; 4] = [Schema::V1, Schema::V2, Schema::V3, Schema::V4];

    /// The schema numbered `n`, if this build reads it.
    pub fn from_number(n: u32) -> Result<Schema, String> {
        match n {
            1 => Ok(Schema::V1),
            2 => Ok(Schema::V2),
            3 => Ok(Schema::V3),
            4 => Ok(Schema::V4),
            other => Err(format!(
                "unknown encoding schema {other} (this build reads 1..={})",
                Schema::CURRENT as u8
            )),
        }
    }

    pub fn number(self) -> u32 {
        self as u32
    }
}

/// The bincode configuration of every schema so far: the legacy one (`bincode::serialize`),
/// but rejecting trailing bytes and never reading past the input.
fn options(limit: usize) -> impl Options {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_little_endian()
        .reject_trailing_bytes()
        .with_limit(limit as u64)
}

fn encode_into<T: Serialize>(buf: &mut Vec<u8>, value: &T) -> Result<(), String> {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_little_endian()
        .serialize_into(buf, value)
        .map_err(|e| e.to_string())
}

fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, String> {
    options(bytes.len())
        .deserialize(bytes)
        .map_err(|e| e.to_string())
}

impl Command {
    /// Appends the [`Schema::CURRENT`] encoding of the command to `buf` (no intermediate copy).
    pub fn encode_into(&self, buf: &mut Vec<u8>) -> Result<(), String> {
        encode_into(buf, self)
    }

    /// Decodes one command, exactly `bytes`, written in `schema`.
    pub fn decode(schema: Schema, bytes: &[u8]) -> Result<Self, String> {
        match schema {
            // V2 and V3 only added variants after those before, and V4 changed no command
            // type, so older commands decode as the current ones.
            Schema::V1 | Schema::V2 | Schema::V3 | Schema::V4 => decode(bytes),
        }
    }
}

impl GroupState {
    /// The [`Schema::CURRENT`] encoding of the whole group state.
    pub fn encode(&self) -> Result<Vec<u8>, String> {
        let mut buf = Vec::with_capacity(self.encoded_len()?);
        self.encode_into(&mut buf)?;
        Ok(buf)
    }

    /// Appends the [`Schema::CURRENT`] encoding of the group state to `buf`.
    pub fn encode_into(&self, buf: &mut Vec<u8>) -> Result<(), String> {
        encode_into(buf, self)
    }

    /// Length of [`GroupState::encode`]'s output, without encoding.
    pub fn encoded_len(&self) -> Result<usize, String> {
        let n = bincode::DefaultOptions::new()
            .with_fixint_encoding()
            .with_little_endian()
            .serialized_size(self)
            .map_err(|e| e.to_string())?;
        usize::try_from(n).map_err(|e| e.to_string())
    }

    /// Decodes a group state, exactly `bytes`, written in `schema`.
    pub fn decode(schema: Schema, bytes: &[u8]) -> Result<Self, String> {
        match schema {
            Schema::V1 => decode::<v1::GroupStateV1>(bytes).map(GroupState::from),
            // V3 changed no type of the group state; V4 packed the message ends.
            Schema::V2 | Schema::V3 => decode::<v3::GroupStateV3>(bytes).map(GroupState::from),
            Schema::V4 => decode(bytes),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;
    use crate::command::Op;

    #[test]
    fn schema_numbers_are_stable() {
        assert_eq!(Schema::V1.number(), 1);
        assert_eq!(Schema::V2.number(), 2);
        assert_eq!(Schema::V3.number(), 3);
        assert_eq!(Schema::V4.number(), 4);
        for s in Schema::READABLE {
            assert_eq!(Schema::from_number(s.number()).unwrap(), s);
        }
        assert!(Schema::from_number(0).is_err());
        assert!(Schema::from_number(5).is_err());
    }

    #[test]
    fn current_encoding_is_the_legacy_bincode_layout() {
        let cmd = Command {
            now_ms: 9,
            op: Op::CreateBucket {
                bucket: "abcd".into(),
            },
        };
        let mut buf = Vec::new();
        cmd.encode_into(&mut buf).unwrap();
        assert_eq!(buf, bincode::serialize(&cmd).unwrap());
    }

    #[test]
    fn trailing_and_missing_bytes_are_rejected() {
        let cmd = Command {
            now_ms: 1,
            op: Op::Noop,
        };
        let mut buf = Vec::new();
        cmd.encode_into(&mut buf).unwrap();
        for s in Schema::READABLE {
            assert!(Command::decode(s, &buf).is_ok());
            for cut in 0..buf.len() {
                assert!(Command::decode(s, &buf[..cut]).is_err(), "cut {cut}");
            }
            let mut long = buf.clone();
            long.push(0);
            assert!(Command::decode(s, &long).is_err());
        }
        // A huge length prefix must not allocate or read past the input.
        let mut bad = 1u64.to_le_bytes().to_vec();
        bad.extend_from_slice(&0u32.to_le_bytes()); // Op::CreateBucket
        bad.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(Command::decode(Schema::CURRENT, &bad).is_err());
        assert!(GroupState::decode(Schema::CURRENT, &[0xff; 64]).is_err());
    }
}
