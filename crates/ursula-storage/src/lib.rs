//! # ursula-storage
//!
//! Durable storage shared by every Raft group of a node:
//!
//! * [`wal`]: one segmented write-ahead log for all groups, with group commit. A dedicated
//!   writer thread drains every queued append, writes the whole batch with one `write`, calls
//!   `fdatasync` once, then completes every append in the batch.
//! * [`snapshot_file`]: atomic, checksummed single-blob files for state-machine snapshots.
//! * [`pace`]: background writes (snapshots, local cold objects) paced so the WAL's syncs do
//!   not queue behind them.
//! * [`chunk_object`]: the block-checksummed layout of cold chunk objects (pure).
//! * [`cold`]: the cold tier's object store ([`cold::ColdStore`] over `object_store`: local
//!   directory, S3, memory), its configuration, object framing, fault twin and conformance suite.
//! * [`fs`]: the filesystem boundary under both, with a fault-injecting twin for tests.
//! * [`health`]: what storage faults the node is going through (readiness, admission, metrics).
//!
//! The per-fault policies (sync failure, full disk, snapshot failure) are described in
//! `docs/storage.md` and in [`wal`]'s writer.
//!
//! ## WAL on-disk format (version 3; versions 1 and 2 still read)
//!
//! All integers are little-endian. A WAL directory holds segment files named
//! `wal-{first_lsn:020}.log` (e.g. `wal-00000000000000000001.log`) plus a `LOCK` file
//! (`flock`ed while a `Wal` has the directory open), at most one `wal-next.prepared` and a
//! few spares, `wal-{first_lsn:020}.free` (released segments kept to be reused; their
//! contents do not matter). Other files are ignored.
//!
//! Every segment starts with a 24-byte header:
//!
//! | offset | size | field                                    |
//! |-------:|-----:|------------------------------------------|
//! | 0      | 8    | magic `b"URSULAWL"`                      |
//! | 8      | 4    | format version, `3` (or `2`, `1`)        |
//! | 12     | 8    | first LSN of the segment (= file name)   |
//! | 20     | 4    | crc32c of bytes 0..20                    |
//!
//! In a version-2 or 3 segment the records come in *batches*, one per write of the writer (one
//! group commit), each preceded by a 24-byte batch header:
//!
//! | offset | size | field                                                            |
//! |-------:|-----:|------------------------------------------------------------------|
//! | 0      | 4    | tag `0xFFFFFFB1` (larger than any record length)                 |
//! | 4      | 4    | byte length of the batch's records                               |
//! | 8      | 8    | LSN of the first record                                          |
//! | 16     | 4    | number of records (at least 1)                                   |
//! | 20     | 4    | crc32c over every record's 8-byte prefix, then header bytes 0..20 |
//!
//! A batch is whole only if its header, every record and the batch checksum are valid; it is
//! replayed or dropped as a unit. A version-1 segment holds bare records. Each record is framed
//! as:
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
//! `segment_bytes` (the next one is prepared in the background and renamed into place), so a
//! write never grows the file and `fdatasync` has no metadata to flush; a sealed segment is
//! trimmed back to its records. Only whole, sealed segments are released
//! ([`wal::Wal::remove_segments_before`]), oldest first: up to two are kept as spares, and the
//! next segment is made of a spare when there is one (its header zeroed and synced first), so
//! its blocks need no zero-fill; else a fresh file, `wal-next.prepared`, is zero-filled: flat
//! out while the WAL opens (before the node serves), at a pace beside the live WAL after. So a version-3 segment may hold, after its own batches, the batches of the file's
//! earlier use, whose LSNs are all below the segment's first one; version 2 segments were
//! always zero-filled.
//!
//! ### Recovery
//!
//! Segments are read in LSN order.
//!
//! * In the **last** segment, a batch that is not whole is a *torn tail* (a write that was
//!   never acknowledged: the writer syncs each batch before it writes the next) when no whole
//!   batch with a plausible LSN follows it anywhere in the file; so any damage confined to the
//!   last batch, such as a later page of it on disk and an earlier one not, is dropped. In a
//!   version-1 segment the unit is the record: a bad record is torn when no valid record
//!   follows it. The file is truncated to the end of
//!   the last good record and fsynced. Trailing zeros (in any segment) are the unwritten part of
//!   a preallocated segment and end the segment's records without truncation. A last segment whose
//!   header is shorter than 24 bytes or entirely zero, and which holds no whole batch of its
//!   own LSNs after it, was torn while being created (a spare keeps its earlier batches); its
//!   header is rewritten.
//! * In a **version-3** segment, a whole batch with an LSN below the expected one ends the
//!   segment's records (the file's earlier use), and so does, in a sealed segment, a batch
//!   that is not whole (earlier bytes its trim did not keep away): unless a whole batch of
//!   this log follows, which makes it damage. A sealed segment's records that end too early
//!   show as an LSN gap at the next segment, reported at the place they ended.
//! * Everything else is [`wal::WalError::Corrupt`] (with file and offset): a bad record that is
//!   followed by a valid record, a bad record in any earlier segment, a bad header (magic,
//!   version, checksum, or first LSN not matching the file name), an LSN gap or a
//!   non-increasing LSN, within or between segments. [`wal::repair`] (the `ursula repair`
//!   command) cuts such damage away on an operator's request and reports what it dropped.
//!
//! The last segment is synced before it is read (and its cached pages dropped), so the tail a
//! previous process left unsynced is durable, or the open fails, before anything of it is
//! served. A missing or empty directory is a fresh WAL whose first LSN is 1.
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
pub mod fs;
pub mod health;
pub mod pace;
pub mod snapshot_file;
pub mod wal;

pub use format::MAX_PAYLOAD_LEN;
pub use health::{FaultCounts, StorageHealth};
pub use wal::{Lsn, RepairAction, RepairReport, Wal, WalError, WalOptions, WalRecord, repair};
