//! Encoding of the Raft log records kept in the shared WAL, and of snapshot payloads.
//!
//! See the crate documentation for the byte layouts.

use openraft::EntryPayload;
use serde::{Deserialize, Serialize};
use ursula_core::{Command, GroupState};

use crate::types::{Batch, Entry, LogId, StoredMembership, Vote};

/// WAL record kind: one log entry.
pub const KIND_ENTRY: u8 = 1;
/// WAL record kind: the group's vote.
pub const KIND_VOTE: u8 = 2;
/// WAL record kind: entries with index >= the given log id's index were truncated.
pub const KIND_TRUNCATE: u8 = 3;
/// WAL record kind: entries up to (inclusive) the given log id were purged.
pub const KIND_PURGE: u8 = 4;

const PAYLOAD_BLANK: u8 = 0;
const PAYLOAD_NORMAL: u8 = 1;
const PAYLOAD_MEMBERSHIP: u8 = 2;

/// Version of the snapshot payload layout ([`SnapshotHeader`] + group state).
pub const SNAPSHOT_FORMAT: u32 = 1;

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

/// Encodes an entry record payload: `tag u8 | bincode(LogId) | body`.
pub fn encode_entry(entry: &Entry) -> Result<Vec<u8>, String> {
    let mut buf = Vec::with_capacity(64);
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

/// Decodes what [`encode_entry`] produced.
pub fn decode_entry(bytes: &[u8]) -> Result<Entry, String> {
    let mut rd = bytes;
    let tag = take(&mut rd, 1)?[0];
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
                cmds.push(Command::decode(take(&mut rd, len)?)?);
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

/// Snapshot payload: `bincode(SnapshotHeader) | GroupState::encode()`.
pub fn encode_snapshot(header: &SnapshotHeader, state: &[u8]) -> Result<Vec<u8>, String> {
    let mut buf = Vec::with_capacity(state.len() + 256);
    bincode_into(&mut buf, header)?;
    buf.extend_from_slice(state);
    Ok(buf)
}

/// The snapshot payload of `state`, encoded straight into one exactly sized buffer: the same
/// bytes as `encode_snapshot(header, &state.encode()?)` without the intermediate copy.
pub fn encode_snapshot_of(header: &SnapshotHeader, state: &GroupState) -> Result<Vec<u8>, String> {
    let size = bincode::serialized_size(header)
        .and_then(|h| Ok(h + bincode::serialized_size(state)?))
        .map_err(|e| e.to_string())?;
    let mut buf = Vec::with_capacity(usize::try_from(size).map_err(|e| e.to_string())?);
    bincode_into(&mut buf, header)?;
    bincode_into(&mut buf, state)?;
    Ok(buf)
}

/// Splits a snapshot payload into its header and the encoded group state.
pub fn decode_snapshot(bytes: &[u8]) -> Result<(SnapshotHeader, &[u8]), String> {
    let mut rd = bytes;
    let header: SnapshotHeader = bincode_from(&mut rd)?;
    if header.format != SNAPSHOT_FORMAT {
        return Err(format!(
            "unsupported snapshot format {} (this build reads {SNAPSHOT_FORMAT})",
            header.format
        ));
    }
    Ok((header, rd))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;
    use openraft::{BasicNode, CommittedLeaderId};
    use std::collections::{BTreeMap, BTreeSet};
    use ursula_core::Op;

    fn lid(term: u64, index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    #[test]
    fn snapshot_of_a_state_is_the_same_bytes_as_encoding_it_first() {
        use ursula_core::command::CreateReq;
        let mut state = GroupState::new(2);
        // Several chunks of stream bytes, so the multi-chunk encoding is covered.
        let payload: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let create = Op::Create(Box::new(CreateReq {
            content_type: Some("application/octet-stream".into()),
            payload: bytes::Bytes::from(payload),
            ..CreateReq::new(ursula_core::StreamKey::new("demo", "s"))
        }));
        let reply = state.apply(
            1,
            &Command {
                now_ms: 7,
                op: create,
            },
        );
        assert!(reply.is_ok(), "{reply:?}");
        let header = SnapshotHeader {
            format: SNAPSHOT_FORMAT,
            group: 2,
            last_applied: Some(lid(1, 1)),
            membership: StoredMembership::default(),
            applied_commands: 1,
            snapshot_id: "g2-1-1-x".into(),
        };
        let direct = encode_snapshot_of(&header, &state).unwrap();
        assert_eq!(
            direct,
            encode_snapshot(&header, &state.encode().unwrap()).unwrap()
        );
        assert_eq!(direct.len(), direct.capacity(), "sized exactly");
        let (back, rest) = decode_snapshot(&direct).unwrap();
        assert_eq!(back.snapshot_id, "g2-1-1-x");
        let decoded = GroupState::decode(rest).unwrap();
        assert_eq!(decoded.encode().unwrap(), state.encode().unwrap());
    }

    #[test]
    fn entry_round_trip() {
        let cmds = vec![
            Command {
                now_ms: 5,
                op: Op::Noop,
            },
            Command {
                now_ms: 6,
                op: Op::CreateBucket {
                    bucket: "abcd".into(),
                },
            },
        ];
        let normal = Entry {
            log_id: lid(3, 17),
            payload: EntryPayload::Normal(Batch(cmds)),
        };
        let back = decode_entry(&encode_entry(&normal).unwrap()).unwrap();
        assert_eq!(back.log_id, lid(3, 17));
        let EntryPayload::Normal(b) = back.payload else {
            panic!("not normal")
        };
        assert_eq!(b.0.len(), 2);
        assert_eq!(b.0[1].now_ms, 6);

        let blank = Entry {
            log_id: lid(1, 2),
            payload: EntryPayload::Blank,
        };
        let back = decode_entry(&encode_entry(&blank).unwrap()).unwrap();
        assert!(matches!(back.payload, EntryPayload::Blank));

        let m = crate::types::Membership::new(
            vec![BTreeSet::from([1u64])],
            BTreeMap::from([(1u64, BasicNode::new("a"))]),
        );
        let mem = Entry {
            log_id: lid(0, 0),
            payload: EntryPayload::Membership(m.clone()),
        };
        let back = decode_entry(&encode_entry(&mem).unwrap()).unwrap();
        let EntryPayload::Membership(back_m) = back.payload else {
            panic!("not membership")
        };
        assert_eq!(back_m, m);

        let enc = encode_entry(&normal).unwrap();
        for cut in 0..enc.len() {
            assert!(decode_entry(&enc[..cut]).is_err(), "cut {cut}");
        }
    }

    #[test]
    fn vote_and_log_id_round_trip() {
        let mut v = Vote::new(4, 9);
        v.commit();
        assert_eq!(decode_vote(&encode_vote(&v).unwrap()).unwrap(), v);
        assert_eq!(
            decode_log_id(&encode_log_id(&lid(2, 3)).unwrap()).unwrap(),
            lid(2, 3)
        );
    }
}
