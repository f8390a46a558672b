//! The conditional create of the `local` backend, written at a background pace.
//!
//! `LocalFileSystem::put_opts` writes the whole object, then syncs it: the disk then holds
//! megabytes of dirty pages that the WAL's next `fdatasync` (which every acknowledgement waits
//! for) queues behind. At 1,000 streams × 256 connections each 8 MiB flush held every
//! connection for 30–40 ms once a second. This is the same create, with the object written
//! through [`Pace`] (pieces, each synced, with pauses), and kept to `object_store`'s layout so
//! that its reads, listings and deletes, and the staging sweep, see nothing different:
//!
//! 1. the bytes go to a staging file `{path}#{n}` (a name no object key can take), created
//!    with `O_EXCL`, missing parent directories made and synced first;
//! 2. the staging file is synced and hard-linked to `{path}`: the link fails if an object is
//!    already there (the conditional create), and the parent directory is synced;
//! 3. the staging file is removed (a crash before leaves it to [`super::staging::sweep`]).

use std::fs::{File, OpenOptions};
use std::io::{self, ErrorKind};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::{Body, ColdError};
use crate::pace::Pace;

/// Creates the object at `dest` holding `body`, unless one is there (blocking). `key` names
/// it in errors.
pub(super) fn put_if_absent(
    dest: &Path,
    key: &str,
    body: &Body,
    pace: Pace,
) -> Result<(), ColdError> {
    let failed = |source: io::Error| ColdError::Unavailable {
        operation: "put",
        source: Box::new(source),
    };
    let (file, staging) = create_staging(dest).map_err(failed)?;
    let written = write_and_link(&file, &staging, dest, body, pace);
    let _ = std::fs::remove_file(&staging);
    match written {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Err(ColdError::AlreadyExists {
            key: key.to_owned(),
        }),
        Err(e) => Err(failed(e)),
    }
}

fn write_and_link(
    file: &File,
    staging: &Path,
    dest: &Path,
    body: &Body,
    pace: Pace,
) -> io::Result<()> {
    let mut at = 0u64;
    pace.write(
        body.pieces().iter().map(|p| &p[..]),
        |piece| {
            file.write_all_at(piece, at)?;
            at += piece.len() as u64;
            Ok(())
        },
        || file.sync_data(),
    )?;
    file.sync_all()?;
    std::fs::hard_link(staging, dest)?;
    sync_parent(dest)
}

/// Opens a fresh staging file beside `dest`, making (and syncing) missing directories.
fn create_staging(dest: &Path) -> io::Result<(File, PathBuf)> {
    let mut n = 1u32;
    let mut made_dirs = false;
    loop {
        let mut name = dest.as_os_str().to_owned();
        name.push(format!("#{n}"));
        let path = PathBuf::from(name);
        match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(f) => return Ok((f, path)),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => n += 1,
            Err(e) if e.kind() == ErrorKind::NotFound && !made_dirs => {
                make_parents(dest)?;
                made_dirs = true;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Creates the missing directories above `path` and syncs each of them and the first one
/// that existed, so the new entries survive a crash.
fn make_parents(path: &Path) -> io::Result<()> {
    let Some(parent) = path.parent() else {
        return Ok(());
    };
    let mut existing = parent;
    while !existing.exists() {
        match existing.parent() {
            Some(p) => existing = p,
            None => break,
        }
    }
    std::fs::create_dir_all(parent)?;
    let mut dir = parent;
    loop {
        File::open(dir)?.sync_all()?;
        if dir == existing {
            return Ok(());
        }
        match dir.parent() {
            Some(p) => dir = p,
            None => return Ok(()),
        }
    }
}

fn sync_parent(path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(p) => File::open(p)?.sync_all(),
        None => Ok(()),
    }
}
