//! Spare segments: sealed segments the log no longer needs, kept to become a later segment.
//!
//! A segment is only fast to sync once its blocks are written (an `fdatasync` of an allocated,
//! written file has no metadata to flush), so a fresh segment is zero-filled before it is used
//! (`prepare`): as many bytes of background writes as the log itself writes, and on the
//! benchmark VM a stall of every WAL sync behind each piece of the fill (docs/benchmarks.md,
//! session 30). A released segment's blocks are already written: instead of deleting it,
//! [`super::Wal::remove_segments_before`] renames it to `wal-<first LSN>.free` (up to
//! [`MAX_SPARES`] of them) and the next segment is made of it. Readying one zeroes its header
//! (so that a crash before its new header is durable reads as a segment torn during creation)
//! and syncs it; its old batches stay, and format version 3 says how recovery tells them from
//! the log's own (their LSNs are below the next one; `recovery::scan_batches`).
//!
//! Spares are found again when the WAL opens, and deleted with the prepared segment when the
//! disk is full.

use std::io;
use std::path::{Path, PathBuf};

use super::Shared;
use crate::format::SEGMENT_HEADER_LEN;
use crate::fs::{FileSystem, OpenMode, ZeroFill};

/// Released segments kept at most; more are deleted.
pub(super) const MAX_SPARES: usize = 2;
const SUFFIX: &str = ".free";

/// The spare name of the segment at `segment` (same stem, so the name stays unique).
pub(super) fn spare_path(segment: &Path) -> PathBuf {
    segment.with_extension(&SUFFIX[1..])
}

/// Whether the file at `path` is a spare.
pub(super) fn is_spare(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("wal-") && n.ends_with(SUFFIX))
}

/// The spares in `dir`.
pub(super) fn list(fs: &dyn FileSystem, dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = fs
        .read_dir(dir)?
        .into_iter()
        .filter(|p| is_spare(p))
        .collect();
    out.sort_unstable();
    Ok(out)
}

/// Keeps at most [`MAX_SPARES`] of `found` and deletes the rest (best effort).
pub(super) fn keep(fs: &dyn FileSystem, mut found: Vec<PathBuf>) -> Vec<PathBuf> {
    for extra in found.split_off(found.len().min(MAX_SPARES)) {
        if let Err(e) = fs.remove_file(&extra) {
            tracing::warn!(path = %extra.display(), error = %e, "wal: could not delete a spare segment");
        }
    }
    found
}

/// A spare to make the next segment of, if there is one.
pub(super) fn take(shared: &Shared) -> Option<PathBuf> {
    shared.spares().pop()
}

/// Whether a spare is waiting.
pub(super) fn any(shared: &Shared) -> bool {
    !shared.spares().is_empty()
}

/// Makes the spare at `path` ready to become a segment of `len` bytes: its header zeroed, its
/// length `len` (a spare cut short, from a segment sealed early for a large append, is
/// zero-filled to it at the pace `after` keeps, as a fresh segment is), durably. Its other
/// bytes are left as they are. A spare that fails is deleted.
pub(super) fn ready(
    fs: &dyn FileSystem,
    path: &Path,
    len: u64,
    after: &mut dyn FnMut(u64) -> io::Result<()>,
) -> io::Result<()> {
    let res = (|| {
        let file = fs.open(path, OpenMode::Write)?;
        file.write_all_at(&[0u8; SEGMENT_HEADER_LEN], 0)?;
        let had = file.len()?;
        if had < len {
            let chunk = super::prepare::CHUNK;
            file.zero_fill(had, len, ZeroFill::Paced { chunk, after })?;
        } else if had > len {
            file.set_len(len)?;
        }
        if had == len {
            file.sync_data()
        } else {
            file.sync_all()
        }
    })();
    if res.is_err() {
        let _ = fs.remove_file(path);
    }
    res
}

/// Deletes every spare, to give its space back to a full disk.
pub(super) fn discard_all(shared: &Shared) {
    let spares = std::mem::take(&mut *shared.spares());
    for path in spares {
        match shared.fs.remove_file(&path) {
            Ok(()) => {
                tracing::info!(path = %path.display(), "wal: deleted a spare segment to free space")
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "wal: could not delete a spare segment")
            }
        }
    }
}
