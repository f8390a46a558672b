//! # ursula-storage
//!
//! Durable storage shared by every Raft group of a node:
//!
//! * [`wal`]: one segmented write-ahead log for all groups, with group commit. A dedicated
//!   writer thread drains every queued append, writes the whole batch with one `write`, calls
//!   `fdatasync` once, then completes every append in the batch.
//! * [`snapshot_file`]: atomic, checksummed single-blob files for state-machine snapshots.
//! * [`chunk_object`]: the block-checksummed layout of cold chunk objects (pure).
//! * [`cold`]: the cold tier's object store ([`cold::ColdStore`] over `object_store`: local
//!   directory, S3, memory), its configuration, object framing, fault twin and conformance suite.
//!
//! ## WAL on-disk format (version 1)
//!
//! All integers are little-endian. A WAL directory holds segment files named
//! `wal-{first_lsn:020}.log` (e.g. `wal-00000000000000000001.log`) plus a `LOCK` file
//! (`flock`ed while a `Wal` has the directory open). Other files are ignored.
//!
//! Every segment starts with a 24-byte header:
//!
//! | offset | size | field                                    |
//! |-------:|-----:|------------------------------------------|
//! | 0      | 8    | magic `b"URSULAWL"`                      |
//! | 8      | 4    | format version, `1`                      |
//! | 12     | 8    | first LSN of the segment (= file name)   |
//! | 20     | 4    | crc32c of bytes 0..20                    |
//!
//! followed by records, each framed as:
//!
//! | offset | size | field                                              |
//! |-------:|-----:|----------------------------------------------------|
//! | 0      | 4    | `len`: body length = 13 + payload length           |
//! | 4      | 4    | crc32c (Castagnoli) of the body (bytes 8..8+len)   |
//! | 8      | 8    | lsn (body starts here)                             |
//! | 16     | 4    | group                                              |
//! | 20     | 1    | kind                                               |
//! | 21     | len-13 | payload (opaque, at most 1 GiB)                  |
//!
//! LSNs start at 1 and increase by exactly one per record across segments: the first record of
//! a segment has the header's first LSN, and each segment's first LSN is one past the last LSN
//! of the previous one. A segment is rotated (a new file is created, fsynced, and the directory
//! fsynced) before an append would grow the active one past `segment_bytes`; one append is
//! never split across segments. When syncing is on, the active segment is zero-filled to
//! `segment_bytes` (the next one is prepared in the background as `wal-next.prepared` and
//! renamed into place), so a write never grows the file and `fdatasync` has no metadata to
//! flush; a sealed segment is trimmed back to its records. Only whole, sealed segments are deleted
//! ([`wal::Wal::remove_segments_before`]), oldest first.
//!
//! ### Recovery
//!
//! Segments are read in LSN order.
//!
//! * In the **last** segment, a record that is incomplete, has an impossible length, or fails
//!   its checksum is a *torn tail* (a write that was never acknowledged) when no valid record
//!   with a plausible LSN follows it anywhere in the file. The file is truncated to the end of
//!   the last good record and fsynced. Trailing zeros (in any segment) are the unwritten part of
//!   a preallocated segment and end the segment's records without truncation. A last segment whose
//!   header is shorter than 24 bytes or entirely zero was torn while being created; its header
//!   is rewritten.
//! * Everything else is [`wal::WalError::Corrupt`] (with file and offset): a bad record that is
//!   followed by a valid record, a bad record in any earlier segment, a bad header (magic,
//!   version, checksum, or first LSN not matching the file name), an LSN gap or a
//!   non-increasing LSN, within or between segments.
//!
//! A missing or empty directory is a fresh WAL whose first LSN is 1.
//!
//! ## Snapshot file format (version 1)
//!
//! | offset | size | field                          |
//! |-------:|-----:|--------------------------------|
//! | 0      | 8    | magic `b"URSULASN"`            |
//! | 8      | 4    | format version, `1`            |
//! | 12     | 8    | payload length                 |
//! | 20     | 4    | crc32c of the payload          |
//! | 24     | len  | payload                        |
//!
//! Written to `<path>.tmp`, fsynced, renamed over `<path>`, then the directory is fsynced.

pub mod chunk_object;
pub mod cold;
mod format;
pub mod snapshot_file;
pub mod wal;

pub use format::MAX_PAYLOAD_LEN;
pub use wal::{Lsn, Wal, WalError, WalOptions, WalRecord};
