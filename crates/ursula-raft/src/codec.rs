//! Encoding of the Raft log records kept in the shared WAL, and of snapshot payloads.
//!
//! See the crate documentation for the byte layouts.

use openraft::EntryPayload;
use serde::{Deserialize, Serialize};
use ursula_core::{Command, GroupState, Schema};

use crate::types::{Batch, Entry, LogId, StoredMembership, Vote};

/// WAL record kind: one log entry.
pub const KIND_ENTRY: u8 = 1;
/// WAL record kind: the group's vote.
pub const KIND_VOTE: u8 = 2;
/// WAL record kind: entries with index >= the given log id's index were truncated.
pub const KIND_TRUNCATE: u8 = 3;
/// WAL record kind: entries up to (inclusive) the given log id were purged.
pub const KIND_PURGE: u8 = 4;

// Entry payload tags. Persisted: must stay stable.
const PAYLOAD_BLANK: u8 = 0;
const PAYLOAD_NORMAL: u8 = 1;
const PAYLOAD_MEMBERSHIP: u8 = 2;

/// First byte of an entry payload that names its version: `VERSIONED | version`. A v1 entry
/// (written before versioning) starts with its payload tag instead, which is below 0x80.
const VERSIONED: u8 = 0x80;

/// The entry layout this build writes (`VERSIONED | 4`); its commands are in
/// [`Schema::CURRENT`]. Formats 2 to 4 share the layout; the number is the commands' schema.
pub const ENTRY_FORMAT: u8 = Schema::CURRENT as u8;

/// Version of the snapshot payload layout ([`SnapshotHeader`] + group state) this build
/// writes. Format `n` holds the group state in schema `n`; formats 1 to 4 are readable.
pub const SNAPSHOT_FORMAT: u32 = Schema::CURRENT as u32;

fn bincode_into<T: Serialize>(buf: &mut Vec<u8>, value: &T) -> Result<(), String> {
    bincode::serialize_into(buf, value).map_err(|e| e.to_string())
}

fn bincode_from<T: for<'de> Deserialize<'de>>(rd: &mut &[u8]) -> Result<T, String> {
    bincode::deserialize_from(rd).map_err(|e| e.to_string())
}

fn take<'a>(rd: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
    if rd.len() < n {
        return Err(format!("truncated: need {n} bytes, have {}", rd.len()));
    }
    let (head, rest) = rd.split_at(n);
    *rd = rest;
    Ok(head)
}

fn take_u32(rd: &mut &[u8]) -> Result<u32, String> {
    let b = take(rd, 4)?;
    let mut a = [0u8; 4];
    a.copy_from_slice(b);
    Ok(u32::from_le_bytes(a))
}

/// Encodes an entry record payload: `0x80|ENTRY_FORMAT u8 | tag u8 | bincode(LogId) | body`.
pub fn encode_entry(entry: &Entry) -> Result<Vec<u8>, String> {
    let mut buf = Vec::with_capacity(64);
    buf.push(VERSIONED | ENTRY_FORMAT);
    match &entry.payload {
        EntryPayload::Blank => {
            buf.push(PAYLOAD_BLANK);
            bincode_into(&mut buf, &entry.log_id)?;
        }
        EntryPayload::Normal(batch) => {
            buf.push(PAYLOAD_NORMAL);
            bincode_into(&mut buf, &entry.log_id)?;
            let count = u32::try_from(batch.0.len()).map_err(|_| "batch too large".to_string())?;
            buf.extend_from_slice(&count.to_le_bytes());
            for cmd in &batch.0 {
                // Length prefix first, patched once the command is encoded in place.
                let at = buf.len();
                buf.extend_from_slice(&[0; 4]);
                cmd.encode_into(&mut buf)?;
                let len = u32::try_from(buf.len() - at - 4)
                    .map_err(|_| "command too large".to_string())?;
                buf[at..at + 4].copy_from_slice(&len.to_le_bytes());
            }
        }
        EntryPayload::Membership(m) => {
            buf.push(PAYLOAD_MEMBERSHIP);
            bincode_into(&mut buf, &entry.log_id)?;
            bincode_into(&mut buf, m)?;
        }
    }
    Ok(buf)
}

/// Decodes what [`encode_entry`] produced, or a v1 entry (no version byte; schema 1 commands).
pub fn decode_entry(bytes: &[u8]) -> Result<Entry, String> {
    let mut rd = bytes;
    let first = take(&mut rd, 1)?[0];
    let (schema, tag) = if first & VERSIONED == 0 {
        (Schema::V1, first)
    } else {
        match first & !VERSIONED {
            2 => (Schema::V2, take(&mut rd, 1)?[0]),
            3 => (Schema::V3, take(&mut rd, 1)?[0]),
            4 => (Schema::V4, take(&mut rd, 1)?[0]),
            v => return Err(format!("unknown entry format {v} (this build reads 1..=4)")),
        }
    };
    let log_id: LogId = bincode_from(&mut rd)?;
    let payload = match tag {
        PAYLOAD_BLANK => EntryPayload::Blank,
        PAYLOAD_NORMAL => {
            let count = take_u32(&mut rd)? as usize;
            // Each command takes at least its 4-byte length prefix.
            if count > rd.len() / 4 {
                return Err(format!(
                    "batch claims {count} commands in {} bytes",
                    rd.len()
                ));
            }
            let mut cmds = Vec::with_capacity(count);
            for _ in 0..count {
                let len = take_u32(&mut rd)? as usize;
                cmds.push(Command::decode(schema, take(&mut rd, len)?)?);
            }
            EntryPayload::Normal(Batch(cmds))
        }
        PAYLOAD_MEMBERSHIP => EntryPayload::Membership(bincode_from(&mut rd)?),
        other => return Err(format!("unknown entry payload tag {other}")),
    };
    if !rd.is_empty() {
        return Err(format!("{} trailing bytes after entry", rd.len()));
    }
    Ok(Entry { log_id, payload })
}

pub fn encode_vote(vote: &Vote) -> Result<Vec<u8>, String> {
    bincode::serialize(vote).map_err(|e| e.to_string())
}

pub fn decode_vote(bytes: &[u8]) -> Result<Vote, String> {
    bincode::deserialize(bytes).map_err(|e| e.to_string())
}

pub fn encode_log_id(log_id: &LogId) -> Result<Vec<u8>, String> {
    bincode::serialize(log_id).map_err(|e| e.to_string())
}

pub fn decode_log_id(bytes: &[u8]) -> Result<LogId, String> {
    bincode::deserialize(bytes).map_err(|e| e.to_string())
}

/// Everything a snapshot holds besides the group state itself.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SnapshotHeader {
    pub format: u32,
    pub group: u32,
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
    /// Number of commands applied so far (the ordinal passed to `GroupState::apply`).
    pub applied_commands: u64,
    pub snapshot_id: String,
}

/// Snapshot payload: `bincode(SnapshotHeader) | group state`; `state` must be encoded in the
/// schema `header.format` names.
pub fn encode_snapshot(header: &SnapshotHeader, state: &[u8]) -> Result<Vec<u8>, String> {
    Schema::from_number(header.format)?;
    let mut buf = Vec::with_capacity(state.len() + 256);
    bincode_into(&mut buf, header)?;
    buf.extend_from_slice(state);
    Ok(buf)
}

/// The snapshot payload of `state`, encoded straight into one exactly sized buffer: the same
/// bytes as `encode_snapshot(header, &state.encode()?)` without the intermediate copy.
pub fn encode_snapshot_of(header: &SnapshotHeader, state: &GroupState) -> Result<Vec<u8>, String> {
    if header.format != SNAPSHOT_FORMAT {
        return Err(format!("snapshots are written in format {SNAPSHOT_FORMAT}"));
    }
    let head = bincode::serialized_size(header).map_err(|e| e.to_string())?;
    let head = usize::try_from(head).map_err(|e| e.to_string())?;
    let mut buf = Vec::with_capacity(head + state.encoded_len()?);
    bincode_into(&mut buf, header)?;
    state.encode_into(&mut buf)?;
    Ok(buf)
}

/// A snapshot payload split into its parts, the group state still encoded.
#[derive(Debug)]
pub struct SnapshotParts<'a> {
    pub header: SnapshotHeader,
    /// The schema of `state` (from `header.format`).
    pub schema: Schema,
    pub state: &'a [u8],
}

impl SnapshotParts<'_> {
    pub fn decode_state(&self) -> Result<GroupState, String> {
        GroupState::decode(self.schema, self.state)
    }
}

/// Splits a snapshot payload into its header and the encoded group state. The header layout is
/// the same in every format so far; its first field, `format u32`, is read first so that a
/// future format may change the rest.
pub fn decode_snapshot(bytes: &[u8]) -> Result<SnapshotParts<'_>, String> {
    let mut peek = bytes;
    let format = take_u32(&mut peek)?;
    let schema = Schema::from_number(format)
        .map_err(|_| format!("unsupported snapshot format {format} (this build reads 1..=3)"))?;
    let mut rd = bytes;
    let header: SnapshotHeader = bincode_from(&mut rd)?;
    Ok(SnapshotParts {
        header,
        schema,
        state: rd,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
#[path = "codec_tests.rs"]
mod tests;
