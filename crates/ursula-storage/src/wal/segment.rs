//! Segment files: names, creation, the prepared next segment, preallocation, the lock file.

use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::path::{Path, PathBuf};

use super::{Lsn, WalError};
use crate::format::{SEGMENT_HEADER_LEN, encode_segment_header};
use crate::fs::{FileSystem, FsFile, OpenMode, ZeroFill, is_no_space};

/// Name of the lock file that keeps two `Wal`s from opening the same directory.
const LOCK_FILE_NAME: &str = "LOCK";
/// Name of the zero-filled file prepared for the next segment.
pub(super) const PREPARED_SEGMENT_NAME: &str = "wal-next.prepared";

/// The segment the writer appends to.
#[derive(Debug)]
pub(super) struct ActiveSegment {
    pub file: Box<dyn FsFile>,
    pub path: PathBuf,
    /// Bytes of header and records (the rest of the file is preallocated zeros).
    pub len: u64,
    /// Format version 2 or later: appends are written as batches with a batch header.
    pub batched: bool,
}

pub(crate) fn segment_file_name(first_lsn: Lsn) -> String {
    format!("wal-{first_lsn:020}.log")
}

pub(crate) fn parse_segment_file_name(name: &str) -> Option<Lsn> {
    let digits = name.strip_prefix("wal-")?.strip_suffix(".log")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Segment files of `dir`, ascending by first LSN.
pub(crate) fn list_segments(fs: &dyn FileSystem, dir: &Path) -> io::Result<Vec<(Lsn, PathBuf)>> {
    let mut out: Vec<(Lsn, PathBuf)> = fs
        .read_dir(dir)?
        .into_iter()
        .filter_map(|p| {
            let lsn = p.file_name()?.to_str().and_then(parse_segment_file_name)?;
            Some((lsn, p))
        })
        .collect();
    out.sort_unstable_by_key(|(lsn, _)| *lsn);
    Ok(out)
}

pub(super) fn ensure_dir(fs: &dyn FileSystem, dir: &Path, fsync: bool) -> io::Result<()> {
    if fs.exists(dir)? {
        return Ok(());
    }
    fs.create_dir_all(dir)?;
    if fsync
        && let Some(parent) = dir.parent()
        && !parent.as_os_str().is_empty()
    {
        fs.sync_dir(parent)?;
    }
    Ok(())
}

/// Takes the directory's lock file (a real `flock`, outside the fault boundary: it is not a
/// storage write).
pub(crate) fn lock_dir(dir: &Path) -> Result<File, WalError> {
    let path = dir.join(LOCK_FILE_NAME);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(TryLockError::WouldBlock) => Err(WalError::Locked(dir.to_path_buf())),
        Err(TryLockError::Error(e)) => Err(e.into()),
    }
}

/// Whether `dir` has room for `bytes` more while keeping `reserve` free. Unknown free space
/// (the query failed) counts as room: the write itself then tells.
pub(super) fn has_room(fs: &dyn FileSystem, dir: &Path, bytes: u64, reserve: u64) -> bool {
    fs.available_bytes(dir)
        .map_or(true, |avail| avail >= bytes.saturating_add(reserve))
}

/// Preallocates the rest of the active segment with zeros (durably), so appends overwrite
/// allocated blocks instead of growing the file. Skipped (with a warning) when it would take
/// the space kept in reserve, or when the disk is full: the segment then grows as it is
/// written.
pub(super) fn preallocate_active(
    fs: &dyn FileSystem,
    dir: &Path,
    seg: &ActiveSegment,
    segment_bytes: u64,
    reserve: u64,
) -> io::Result<()> {
    let file_len = seg.file.len()?;
    if file_len >= segment_bytes {
        return Ok(());
    }
    let from = file_len.max(seg.len);
    if !has_room(fs, dir, segment_bytes - from, reserve) {
        tracing::warn!(path = %seg.path.display(), "wal: too little free space to preallocate the segment; it grows as written");
        return Ok(());
    }
    match seg
        .file
        .zero_fill(from, segment_bytes, ZeroFill::Bulk)
        .and_then(|()| seg.file.sync_all())
    {
        Err(e) if is_no_space(&e) => {
            tracing::warn!(path = %seg.path.display(), error = %e, "wal: disk full while preallocating; the segment grows as written");
            // Give back what was allocated: a full disk needs every block.
            let _ = seg.file.set_len(seg.len);
            Ok(())
        }
        other => other,
    }
}

/// Turns a prepared zero-filled file into the segment starting at `first_lsn`. A crash
/// before the header is durable leaves an all-zero segment, which recovery treats as torn
/// during creation; zeros after the last record are an unwritten tail, not corruption.
pub(super) fn adopt_segment(
    fs: &dyn FileSystem,
    dir: &Path,
    prepared: &Path,
    first_lsn: Lsn,
    fsync: bool,
) -> io::Result<ActiveSegment> {
    let path = dir.join(segment_file_name(first_lsn));
    fs.rename(prepared, &path)?;
    let file = fs.open(&path, OpenMode::Write)?;
    file.write_all_at(&encode_segment_header(first_lsn), 0)?;
    if fsync {
        file.sync_data()?;
        fs.sync_dir(dir)?;
    }
    Ok(ActiveSegment {
        file,
        path,
        len: SEGMENT_HEADER_LEN as u64,
        batched: true,
    })
}

/// Creates a new segment file with its header, durably (file and directory entry). A file of
/// that name can only be a leftover of an earlier attempt of this writer (its first LSN was
/// never written anywhere else), so it is truncated.
pub(super) fn create_segment(
    fs: &dyn FileSystem,
    dir: &Path,
    first_lsn: Lsn,
    fsync: bool,
) -> io::Result<ActiveSegment> {
    let path = dir.join(segment_file_name(first_lsn));
    let file = fs.open(&path, OpenMode::CreateTruncate)?;
    file.write_all_at(&encode_segment_header(first_lsn), 0)?;
    if fsync {
        file.sync_all()?;
        fs.sync_dir(dir)?;
    }
    Ok(ActiveSegment {
        file,
        path,
        len: SEGMENT_HEADER_LEN as u64,
        batched: true,
    })
}
