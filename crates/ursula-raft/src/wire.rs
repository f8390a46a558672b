//! The cluster-plane wire format of one Raft RPC: a request names its group and kind, so one
//! connection pool per peer carries every group.
//!
//! ```text
//! request  = magic "URPC", version u8 (1), kind u8, group u32 LE, body
//! response = magic "URPR", version u8 (1), body
//! ```
//!
//! | kind | request body | response body |
//! |-----:|--------------|---------------|
//! | 1 append-entries | `bincode((vote, prev_log_id, leader_commit))`, `count u32 LE`, per entry `len u32 LE` + the WAL entry encoding ([`crate::codec::encode_entry`]) | `bincode(Result<AppendEntriesResponse, RaftError>)` |
//! | 2 vote | `bincode(VoteRequest)` | `bincode(Result<VoteResponse, RaftError>)` |
//! | 4 propose (a cross-group request to the group's leader) | `Command::encode` (current schema) | `bincode(Result<Response, RemoteProposeError>)` |
//! | 5 elect (a leader hands a group's leadership to this node) | empty | `bincode(Result<(), String>)` |
//! | 6 allow-next-revert (a leader's one-shot permission to a wiped node, `node/rejoin.rs`) | `commit_index u64 LE` | `bincode(Result<u8, String>)`: 0 not awaiting, 1 armed, 2 already rehydrating |
//! | 3 install-snapshot chunk | `bincode(InstallSnapshotRequest)` (one chunk of at most `snapshot_max_chunk_size` bytes) | `bincode(Result<InstallSnapshotResponse, RaftError<InstallSnapshotError>>)` |
//!
//! Entries travel in the WAL's own entry encoding (versioned, and the one every node already
//! decodes), so the log and the wire never disagree on what a command is. The transport below
//! (TCP) checksums the bytes; an undecodable frame is refused with an error answer, never
//! applied.

use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use ursula_core::{Command, Response, Schema};

use crate::codec;
use crate::error::ProposeError;
use crate::types::{LogId, NodeId, TypeConfig, Vote};

const REQUEST_MAGIC: &[u8; 4] = b"URPC";
const RESPONSE_MAGIC: &[u8; 4] = b"URPR";
/// Version of the RPC frames.
pub const WIRE_VERSION: u8 = 1;

pub(crate) const KIND_APPEND: u8 = 1;
pub(crate) const KIND_VOTE: u8 = 2;
pub(crate) const KIND_SNAPSHOT: u8 = 3;
pub(crate) const KIND_PROPOSE: u8 = 4;
pub(crate) const KIND_ELECT: u8 = 5;
pub(crate) const KIND_ALLOW: u8 = 6;

/// A decoded request.
pub(crate) enum Request {
    Append(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    Snapshot(InstallSnapshotRequest<TypeConfig>),
    Propose(Command),
    /// Campaign now: the group's leader is handing its leadership over (transfer.rs).
    Elect,
}

/// A [`ProposeError`] as it travels back from the node that was asked to propose.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum RemoteProposeError {
    Unavailable(String),
    Storage(String),
    StorageUnavailable(String),
    OutcomeUnknown(String),
    InsufficientStorage(String),
    TooLarge(u64, u64),
    ForwardToLeader(Option<u64>),
    NoSuchGroup(u32),
}

impl From<ProposeError> for RemoteProposeError {
    fn from(e: ProposeError) -> Self {
        match e {
            ProposeError::Unavailable(m) => Self::Unavailable(m),
            ProposeError::Storage(m) => Self::Storage(m),
            ProposeError::StorageUnavailable(m) => Self::StorageUnavailable(m),
            ProposeError::OutcomeUnknown(m) => Self::OutcomeUnknown(m),
            ProposeError::InsufficientStorage(m) => Self::InsufficientStorage(m),
            ProposeError::TooLarge { size, max } => Self::TooLarge(size as u64, max as u64),
            ProposeError::ForwardToLeader { leader } => Self::ForwardToLeader(leader),
            ProposeError::NoSuchGroup(g) => Self::NoSuchGroup(g),
        }
    }
}

impl From<RemoteProposeError> for ProposeError {
    fn from(e: RemoteProposeError) -> Self {
        match e {
            RemoteProposeError::Unavailable(m) => Self::Unavailable(m),
            RemoteProposeError::Storage(m) => Self::Storage(m),
            RemoteProposeError::StorageUnavailable(m) => Self::StorageUnavailable(m),
            RemoteProposeError::OutcomeUnknown(m) => Self::OutcomeUnknown(m),
            RemoteProposeError::InsufficientStorage(m) => Self::InsufficientStorage(m),
            RemoteProposeError::TooLarge(size, max) => Self::TooLarge {
                size: size as usize,
                max: max as usize,
            },
            RemoteProposeError::ForwardToLeader(leader) => Self::ForwardToLeader { leader },
            RemoteProposeError::NoSuchGroup(g) => Self::NoSuchGroup(g),
        }
    }
}

pub(crate) type ProposeResult = Result<Response, RemoteProposeError>;

pub(crate) fn encode_propose(group: u32, cmd: &Command) -> Result<Vec<u8>, String> {
    let mut out = header(KIND_PROPOSE, group);
    cmd.encode_into(&mut out)?;
    Ok(out)
}

/// The answer to an elect request: `Err` says why the node will not campaign.
pub(crate) type ElectResult = Result<(), String>;

pub(crate) fn encode_elect(group: u32) -> Vec<u8> {
    header(KIND_ELECT, group)
}

pub(crate) type AppendResult = Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>;
pub(crate) type VoteResult = Result<VoteResponse<NodeId>, RaftError<NodeId>>;
pub(crate) type SnapshotResult =
    Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>;

fn header(kind: u8, group: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(REQUEST_MAGIC);
    out.push(WIRE_VERSION);
    out.push(kind);
    out.extend_from_slice(&group.to_le_bytes());
    out
}

fn bincode_into<T: Serialize>(out: &mut Vec<u8>, v: &T) -> Result<(), String> {
    bincode::serialize_into(out, v).map_err(|e| e.to_string())
}

pub(crate) fn encode_append(
    group: u32,
    rpc: &AppendEntriesRequest<TypeConfig>,
) -> Result<Vec<u8>, String> {
    let mut out = header(KIND_APPEND, group);
    bincode_into(&mut out, &(&rpc.vote, &rpc.prev_log_id, &rpc.leader_commit))?;
    out.extend_from_slice(&(rpc.entries.len() as u32).to_le_bytes());
    for e in &rpc.entries {
        let bytes = codec::encode_entry(e)?;
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(&bytes);
    }
    Ok(out)
}

pub(crate) fn encode_vote(group: u32, rpc: &VoteRequest<NodeId>) -> Result<Vec<u8>, String> {
    let mut out = header(KIND_VOTE, group);
    bincode_into(&mut out, rpc)?;
    Ok(out)
}

pub(crate) fn encode_snapshot(
    group: u32,
    rpc: &InstallSnapshotRequest<TypeConfig>,
) -> Result<Vec<u8>, String> {
    let mut out = header(KIND_SNAPSHOT, group);
    bincode_into(&mut out, rpc)?;
    Ok(out)
}

fn take<'a>(rd: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
    if rd.len() < n {
        return Err("truncated frame".into());
    }
    let (head, rest) = rd.split_at(n);
    *rd = rest;
    Ok(head)
}

fn take_u32(rd: &mut &[u8]) -> Result<u32, String> {
    let b = take(rd, 4)?;
    Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// Decodes a request frame into its group and request.
/// The kind byte of a request frame of this wire version, without decoding its body.
pub(crate) fn request_kind(bytes: &[u8]) -> Option<u8> {
    match bytes {
        [m0, m1, m2, m3, WIRE_VERSION, kind, ..] if [*m0, *m1, *m2, *m3] == *REQUEST_MAGIC => {
            Some(*kind)
        }
        _ => None,
    }
}

pub(crate) fn decode_request(bytes: &[u8]) -> Result<(u32, Request), String> {
    let mut rd = bytes;
    if take(&mut rd, 4)? != REQUEST_MAGIC {
        return Err("not an ursula raft request".into());
    }
    let version = take(&mut rd, 1)?[0];
    if version != WIRE_VERSION {
        return Err(format!(
            "raft wire version {version} is not supported (this node speaks {WIRE_VERSION})"
        ));
    }
    let kind = take(&mut rd, 1)?[0];
    let group = take_u32(&mut rd)?;
    let req = match kind {
        KIND_APPEND => {
            let (vote, prev_log_id, leader_commit): (Vote, Option<LogId>, Option<LogId>) =
                bincode::deserialize_from(&mut rd).map_err(|e| e.to_string())?;
            let count = take_u32(&mut rd)? as usize;
            let mut entries = Vec::with_capacity(count.min(4096));
            for _ in 0..count {
                let len = take_u32(&mut rd)? as usize;
                entries.push(codec::decode_entry(take(&mut rd, len)?)?);
            }
            Request::Append(AppendEntriesRequest {
                vote,
                prev_log_id,
                leader_commit,
                entries,
            })
        }
        KIND_VOTE => Request::Vote(bincode::deserialize(rd).map_err(|e| e.to_string())?),
        KIND_SNAPSHOT => Request::Snapshot(bincode::deserialize(rd).map_err(|e| e.to_string())?),
        KIND_PROPOSE => Request::Propose(Command::decode(Schema::CURRENT, rd)?),
        KIND_ELECT => Request::Elect,
        k => return Err(format!("unknown raft rpc kind {k}")),
    };
    Ok((group, req))
}

/// Encodes a response frame.
pub(crate) fn encode_response<T: Serialize>(result: &T) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(RESPONSE_MAGIC);
    out.push(WIRE_VERSION);
    // Serializing openraft's plain data types into a Vec cannot fail.
    let _ = bincode::serialize_into(&mut out, result);
    out
}

/// Decodes a response frame.
pub(crate) fn decode_response<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    let mut rd = bytes;
    if take(&mut rd, 4)? != RESPONSE_MAGIC {
        return Err("not an ursula raft response".into());
    }
    let version = take(&mut rd, 1)?[0];
    if version != WIRE_VERSION {
        return Err(format!("raft wire version {version} is not supported"));
    }
    bincode::deserialize(rd).map_err(|e| e.to_string())
}

/// The answer to an allow-next-revert frame (see the table above).
pub(crate) type AllowAnswer = Result<u8, String>;

pub(crate) fn encode_allow(group: u32, commit_index: u64) -> Vec<u8> {
    let mut out = header(KIND_ALLOW, group);
    out.extend_from_slice(&commit_index.to_le_bytes());
    out
}

/// `Some((group, commit_index))` if `bytes` is an allow-next-revert request, `None` for any
/// other kind (left to [`decode_request`]).
pub(crate) fn decode_allow(bytes: &[u8]) -> Result<Option<(u32, u64)>, String> {
    if bytes.get(5) != Some(&KIND_ALLOW) {
        return Ok(None);
    }
    let mut rd = bytes;
    if take(&mut rd, 4)? != REQUEST_MAGIC || take(&mut rd, 1)?[0] != WIRE_VERSION {
        return Err("not an ursula raft request of this version".into());
    }
    take(&mut rd, 1)?;
    let group = take_u32(&mut rd)?;
    let b = take(&mut rd, 8)?;
    let mut index = [0u8; 8];
    index.copy_from_slice(b);
    Ok(Some((group, u64::from_le_bytes(index))))
}
