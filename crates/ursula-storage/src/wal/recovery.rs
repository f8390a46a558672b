//! Recovery (read every segment, validate, drop a torn tail) and the operator's repair.
//!
//! The rules are in the crate docs. In short: damage confined to the last batch of the last
//! segment (nothing whole after it) is a torn, never-acknowledged write and is cut off; any
//! other damage is [`WalError::Corrupt`], which only [`repair`] (an explicit operator command)
//! cuts away.

use std::fmt;
use std::path::{Path, PathBuf};

use super::segment::{list_segments, lock_dir};
use super::{Lsn, WalError, WalRecord};
use crate::format::{
    SEGMENT_HEADER_LEN, SEGMENT_VERSION_V1, SEGMENT_VERSION_V2, decode_batch, decode_record,
    decode_segment_header, encode_segment_header, find_valid_batch_after, find_valid_record_after,
};
use crate::fs::{FileSystem, OpenMode, RealFs};

pub(super) struct SegmentMeta {
    pub first_lsn: Lsn,
    pub path: PathBuf,
    pub bytes: u64,
    pub version: u32,
}

pub(super) struct Recovered {
    pub segments: Vec<SegmentMeta>,
    pub records: Vec<(Lsn, WalRecord)>,
    pub next_lsn: Lsn,
    /// Torn tails cut off (or, without `write`, that would be).
    pub torn: Vec<RepairAction>,
}

fn corrupt(file: &Path, offset: usize, reason: impl Into<String>) -> WalError {
    WalError::Corrupt {
        file: file.to_path_buf(),
        offset: offset as u64,
        reason: reason.into(),
    }
}

/// A last segment whose header is missing, partial or still all zeros, holding nothing of its
/// own after it: a file being made a segment (a recycled one keeps its earlier records, whose
/// LSNs are below `first_lsn`, the name's) when the process stopped.
fn is_torn_creation(data: &[u8], first_lsn: Lsn) -> bool {
    match data.get(..SEGMENT_HEADER_LEN) {
        None => true,
        Some(h) if h.iter().all(|&b| b == 0) => {
            let rest = written(data);
            let from = SEGMENT_HEADER_LEN - 1;
            find_valid_batch_after(rest, from, first_lsn).is_none()
                && find_valid_record_after(rest, from, first_lsn).is_none()
        }
        Some(_) => false,
    }
}

/// How a segment's records ended.
enum End {
    /// At this offset (the end of the data, or where the zeros of preallocation start).
    Clean(usize),
    /// Damage at this offset that is a torn tail (only in the last segment).
    Torn(usize, String),
    /// At this offset, before bytes that are not a batch of this log: a recycled file's
    /// earlier contents (version 3), or damage at the end of the segment, which the next
    /// segment's first LSN tells apart.
    Unsure(usize, String),
}

/// Reads every segment in order, validating headers, checksums and LSN continuity. With
/// `write`, cuts a torn tail of the last segment off (durably, with `fsync`) and rewrites a
/// header torn during creation; without, only reports them. The last segment is read with
/// [`FileSystem::read_durable`] when `fsync` is on: what the previous process left unsynced is
/// made durable (or the open fails) before anything of it is served.
pub(super) fn recover(
    fs: &dyn FileSystem,
    dir: &Path,
    fsync: bool,
    write: bool,
) -> Result<Recovered, WalError> {
    let files = list_segments(fs, dir)?;
    let count = files.len();
    let mut segments = Vec::with_capacity(count);
    let mut records = Vec::new();
    let mut torn = Vec::new();
    // LSN the next record must have; `None` until the first segment fixes it.
    let mut expected: Option<Lsn> = None;
    // Where the previous segment's records ended before bytes that were not its own, and why.
    let mut unsure: Option<(PathBuf, usize, String)> = None;

    for (index, (name_lsn, path)) in files.into_iter().enumerate() {
        let is_last = index + 1 == count;
        if name_lsn == 0 {
            return Err(corrupt(&path, 0, "segment file name has first LSN 0"));
        }
        if let Some(exp) = expected
            && name_lsn != exp
        {
            if let Some((prev, off, reason)) = unsure {
                return Err(corrupt(
                    &prev,
                    off,
                    format!("{reason}, and the next segment starts at LSN {name_lsn}, not {exp}"),
                ));
            }
            return Err(corrupt(
                &path,
                0,
                format!("LSN gap: segment starts at LSN {name_lsn}, expected {exp}"),
            ));
        }
        let data = if is_last && fsync && write {
            fs.read_durable(&path)?
        } else {
            fs.read(&path)?
        };

        if is_last && is_torn_creation(&data, name_lsn) {
            // Crashed while creating this segment: its header never became durable, so no
            // record in it was ever acknowledged. Rewrite the header.
            tracing::warn!(path = %path.display(), len = data.len(), "wal: rewriting header of a segment torn during creation");
            if write {
                let file = fs.open(&path, OpenMode::Write)?;
                file.set_len(0)?;
                file.write_all_at(&encode_segment_header(name_lsn), 0)?;
                if fsync {
                    file.sync_all()?;
                }
            }
            segments.push(SegmentMeta {
                first_lsn: name_lsn,
                path,
                bytes: SEGMENT_HEADER_LEN as u64,
                version: crate::format::SEGMENT_VERSION,
            });
            expected = Some(name_lsn);
            break;
        }

        let (first_lsn, version) =
            decode_segment_header(&data).map_err(|e| corrupt(&path, 0, e.to_string()))?;
        if first_lsn != name_lsn {
            return Err(corrupt(
                &path,
                0,
                format!("header first LSN {first_lsn} does not match the file name"),
            ));
        }
        let mut lsn = first_lsn;
        let end = if version == SEGMENT_VERSION_V1 {
            scan_records(&data, &path, is_last, &mut lsn, &mut records)?
        } else {
            let recycled = version > SEGMENT_VERSION_V2;
            scan_batches(&data, &path, (is_last, recycled), &mut lsn, &mut records)?
        };
        unsure = None;
        let end = match end {
            End::Clean(end) => end,
            End::Unsure(end, reason) => {
                unsure = Some((path.clone(), end, reason));
                end
            }
            End::Torn(off, reason) => {
                tracing::warn!(
                    path = %path.display(),
                    offset = off,
                    dropped_bytes = data.len() - off,
                    %reason,
                    "wal: cutting off a torn tail (never acknowledged)"
                );
                if write {
                    let file = fs.open(&path, OpenMode::Write)?;
                    file.set_len(off as u64)?;
                    if fsync {
                        file.sync_all()?;
                    }
                }
                torn.push(RepairAction::TornTail {
                    file: path.clone(),
                    offset: off as u64,
                    dropped_bytes: (data.len() - off) as u64,
                    reason,
                });
                off
            }
        };
        segments.push(SegmentMeta {
            first_lsn,
            path,
            bytes: end as u64,
            version,
        });
        expected = Some(lsn);
    }

    Ok(Recovered {
        segments,
        records,
        next_lsn: expected.unwrap_or(1),
        torn,
    })
}

fn push(records: &mut Vec<(Lsn, WalRecord)>, lsn: Lsn, group: u32, kind: u8, payload: &[u8]) {
    records.push((
        lsn,
        WalRecord {
            group,
            kind,
            payload: payload.to_vec(),
        },
    ));
}

/// `data` up to its last non-zero byte: no record or batch lies in the zeros of preallocation,
/// so the scans after damage stop there instead of crossing a mostly empty 64 MiB segment.
fn written(data: &[u8]) -> &[u8] {
    let end = data.iter().rposition(|b| *b != 0).map_or(0, |p| p + 1);
    &data[..end]
}

/// Version 1: bare records. A bad record is torn only if no valid record follows it.
fn scan_records(
    data: &[u8],
    path: &Path,
    is_last: bool,
    lsn: &mut Lsn,
    records: &mut Vec<(Lsn, WalRecord)>,
) -> Result<End, WalError> {
    let mut off = SEGMENT_HEADER_LEN;
    while off < data.len() {
        match decode_record(data, off) {
            Ok(rec) => {
                if rec.lsn != *lsn {
                    return Err(corrupt(
                        path,
                        off,
                        format!("expected LSN {lsn}, found LSN {}", rec.lsn),
                    ));
                }
                push(records, *lsn, rec.group, rec.kind, rec.payload);
                *lsn = lsn
                    .checked_add(1)
                    .ok_or_else(|| corrupt(path, off, "LSN overflows u64"))?;
                off += rec.frame_len;
            }
            Err(e) => {
                if data[off..].iter().all(|b| *b == 0) {
                    // The unwritten part of a preallocated segment. For a sealed segment the
                    // next segment's first LSN proves nothing is missing.
                    return Ok(End::Clean(off));
                }
                if !is_last {
                    return Err(corrupt(path, off, format!("{e} in a sealed segment")));
                }
                if let Some(next) = find_valid_record_after(written(data), off, *lsn) {
                    return Err(corrupt(
                        path,
                        off,
                        format!("{e}, followed by a valid record at offset {next}"),
                    ));
                }
                return Ok(End::Torn(off, e.to_string()));
            }
        }
    }
    Ok(End::Clean(data.len()))
}

/// Versions 2 and 3: batches, each whole or rejected as a unit. A damaged batch is torn only
/// if it is in the last segment and no whole batch follows it: anything inside the last batch
/// (a lost earlier page, a kept later one) was never acknowledged.
///
/// A version-3 segment may be a recycled file (`spare`): after its last batch lie the file's
/// earlier contents, whole batches with LSNs below the expected one or pieces of them. They
/// end the segment's records, in a sealed segment too (its trim to the records may not have
/// reached the disk), unless a whole batch of this log follows them: that is damage. What a
/// sealed segment lost at its end shows as an LSN gap at the next segment.
fn scan_batches(
    data: &[u8],
    path: &Path,
    (is_last, recycled): (bool, bool),
    lsn: &mut Lsn,
    records: &mut Vec<(Lsn, WalRecord)>,
) -> Result<End, WalError> {
    let mut off = SEGMENT_HEADER_LEN;
    // A whole batch of this log after `off`, which makes what is at `off` damage.
    let followed = |off: usize, lsn: Lsn| find_valid_batch_after(written(data), off, lsn);
    while off < data.len() {
        match decode_batch(data, off) {
            Ok((batch, len)) => {
                if recycled
                    && let Some(first) = batch.first()
                    && first.lsn < *lsn
                {
                    let reason = format!("a batch from LSN {}, expected {lsn}", first.lsn);
                    if let Some(next) = followed(off, *lsn) {
                        return Err(corrupt(
                            path,
                            off,
                            format!("{reason}, followed by a whole batch at offset {next}"),
                        ));
                    }
                    return Ok(match is_last {
                        true => End::Clean(off),
                        false => End::Unsure(off, reason),
                    });
                }
                if let Some(first) = batch.first()
                    && first.lsn != *lsn
                {
                    return Err(corrupt(
                        path,
                        off,
                        format!("expected LSN {lsn}, found a batch from LSN {}", first.lsn),
                    ));
                }
                for rec in batch {
                    push(records, *lsn, rec.group, rec.kind, rec.payload);
                    *lsn = lsn
                        .checked_add(1)
                        .ok_or_else(|| corrupt(path, off, "LSN overflows u64"))?;
                }
                off += len;
            }
            Err(e) => {
                if data[off..].iter().all(|b| *b == 0) {
                    return Ok(End::Clean(off));
                }
                if !is_last && !recycled {
                    return Err(corrupt(path, off, format!("{e} in a sealed segment")));
                }
                if let Some(next) = followed(off, *lsn) {
                    return Err(corrupt(
                        path,
                        off,
                        format!("{e}, followed by a whole batch at offset {next}"),
                    ));
                }
                if !is_last {
                    // A recycled file's earlier contents after a sealed segment's records.
                    return Ok(End::Unsure(off, e.to_string()));
                }
                if recycled {
                    let reason =
                        format!("{e} (a torn write, or a recycled file's earlier contents)");
                    return Ok(End::Torn(off, reason));
                }
                return Ok(End::Torn(off, e.to_string()));
            }
        }
    }
    Ok(End::Clean(data.len()))
}

/// One thing [`repair`] did (or, in a dry run, would do).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RepairAction {
    /// A torn tail (never acknowledged) cut off, as every start-up does by itself.
    TornTail {
        file: PathBuf,
        offset: u64,
        dropped_bytes: u64,
        reason: String,
    },
    /// Damage that start-up refuses: the segment was cut at the damage.
    Cut {
        file: PathBuf,
        offset: u64,
        dropped_bytes: u64,
        reason: String,
    },
    /// A segment after a cut, deleted whole.
    Removed { file: PathBuf, bytes: u64 },
}

impl fmt::Display for RepairAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RepairAction::TornTail {
                file,
                offset,
                dropped_bytes,
                reason,
            } => write!(
                f,
                "torn tail: {}: dropped {dropped_bytes} bytes from offset {offset} ({reason})",
                file.display()
            ),
            RepairAction::Cut {
                file,
                offset,
                dropped_bytes,
                reason,
            } => write!(
                f,
                "corruption: {}: dropped {dropped_bytes} bytes from offset {offset} ({reason})",
                file.display()
            ),
            RepairAction::Removed { file, bytes } => {
                write!(f, "removed {} ({bytes} bytes)", file.display())
            }
        }
    }
}

/// What [`repair`] found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairReport {
    /// Every cut and removal, in order.
    pub actions: Vec<RepairAction>,
    /// Records that remain (all whole batches up to the first damage).
    pub records: usize,
    /// LSN the next record will get; every record below it remains.
    pub next_lsn: Lsn,
    /// Whether this was a dry run (nothing changed on disk).
    pub dry_run: bool,
}

impl RepairReport {
    /// Whether acknowledged data may have been dropped (anything beyond a torn tail).
    pub fn dropped_acknowledged(&self) -> bool {
        self.actions
            .iter()
            .any(|a| !matches!(a, RepairAction::TornTail { .. }))
    }
}

/// The operator's repair of a WAL directory that start-up refuses: cuts every segment at its
/// first damage, keeping the whole batches before it, and deletes every later segment.
/// Reports what it dropped. With `dry_run`, changes nothing and reports what it would do.
///
/// Data after the first damage is lost, including acknowledged writes: this is the explicit
/// choice start-up never makes by itself.
pub fn repair(dir: &Path, dry_run: bool) -> Result<RepairReport, WalError> {
    let fs = RealFs;
    let _lock = lock_dir(dir)?;
    let mut actions = Vec::new();
    let rounds = list_segments(&fs, dir)?.len() + 2;
    for _ in 0..rounds {
        match recover(&fs, dir, true, !dry_run) {
            Ok(rec) => {
                actions.extend(rec.torn);
                return Ok(RepairReport {
                    actions,
                    records: rec.records.len(),
                    next_lsn: rec.next_lsn,
                    dry_run,
                });
            }
            Err(WalError::Corrupt {
                file,
                offset,
                reason,
            }) => {
                let len = fs.read(&file)?.len() as u64;
                let cut_to = if offset <= SEGMENT_HEADER_LEN as u64 {
                    0
                } else {
                    offset
                };
                actions.push(RepairAction::Cut {
                    file: file.clone(),
                    offset: cut_to,
                    dropped_bytes: len.saturating_sub(cut_to),
                    reason,
                });
                let later: Vec<PathBuf> = list_segments(&fs, dir)?
                    .into_iter()
                    .map(|(_, p)| p)
                    .skip_while(|p| *p != file)
                    .skip(1)
                    .collect();
                for p in &later {
                    let bytes = fs.read(p).map_or(0, |d| d.len() as u64);
                    actions.push(RepairAction::Removed {
                        file: p.clone(),
                        bytes,
                    });
                }
                if dry_run {
                    return Ok(RepairReport {
                        actions,
                        records: 0,
                        next_lsn: 0,
                        dry_run,
                    });
                }
                for p in later.iter().rev() {
                    fs.remove_file(p)?;
                    fs.sync_dir(dir)?;
                }
                if cut_to == 0 {
                    fs.remove_file(&file)?;
                } else {
                    let f = fs.open(&file, OpenMode::Write)?;
                    f.set_len(cut_to)?;
                    f.sync_all()?;
                }
                fs.sync_dir(dir)?;
            }
            Err(e) => return Err(e),
        }
    }
    Err(WalError::Corrupt {
        file: dir.to_path_buf(),
        offset: 0,
        reason: "repair did not converge".into(),
    })
}
