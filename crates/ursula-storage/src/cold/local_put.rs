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
//!    with `O_EXCL`, after missing parent directories are made; every directory from the
//!    parent up to the store's is synced once ([`DurableDirs`]);
//! 2. the staging file is synced and hard-linked to `{path}`: the link fails if an object is
//!    already there (the conditional create), and the parent directory is synced;
//! 3. the staging file is removed (a crash before leaves it to [`super::staging::sweep`]).

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{self, ErrorKind};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::{Body, ColdError};
use crate::pace::Pace;

/// Directories of a store known to be durable, with their ancestors up to the store's
/// directory: a directory enters only once its whole chain was synced, so a create that finds
/// its parent here has nothing to sync above it.
#[derive(Debug, Default)]
pub(super) struct DurableDirs(Mutex<HashSet<PathBuf>>);

impl DurableDirs {
    /// Makes `dir` and its ancestors, `levels` directories in all, durable unless known to be.
    /// Every create checks: another create may have made a shared parent without syncing it
    /// yet, or failed before it did.
    fn ensure(&self, dir: &Path, levels: usize) -> io::Result<()> {
        let known = |d: &Path| self.lock().contains(d);
        if known(dir) {
            return Ok(());
        }
        let chain: Vec<&Path> = dir.ancestors().take(levels.max(1)).collect();
        for d in &chain {
            if !known(d) {
                File::open(d)?.sync_all()?;
            }
        }
        let mut set = self.lock();
        set.extend(chain.iter().map(|d| d.to_path_buf()));
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<PathBuf>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Creates the object at `dest` holding `body`, unless one is there (blocking). `key` names
/// it in errors; `levels` is how many directories lie between `dest` and the store's
/// directory, both included.
pub(super) fn put_if_absent(
    dest: &Path,
    key: &str,
    body: &Body,
    pace: Pace,
    dirs: &DurableDirs,
    levels: usize,
) -> Result<(), ColdError> {
    let failed = |source: io::Error| ColdError::Unavailable {
        operation: "put",
        source: Box::new(source),
    };
    let (file, staging) = create_staging(dest).map_err(failed)?;
    let written = match dest.parent() {
        Some(parent) => dirs.ensure(parent, levels),
        None => Ok(()),
    }
    .and_then(|()| write_and_link(&file, &staging, dest, body, pace));
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
    pace.write(
        body.pieces().iter().map(|p| &p[..]),
        |piece, at| file.write_all_at(piece, at),
        || file.sync_data(),
    )?;
    file.sync_all()?;
    std::fs::hard_link(staging, dest)?;
    sync_parent(dest)
}

/// Opens a fresh staging file beside `dest`, making missing directories (synced by the
/// caller, [`DurableDirs::ensure`]).
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
                if let Some(parent) = dest.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                made_dirs = true;
            }
            Err(e) => return Err(e),
        }
    }
}

fn sync_parent(path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(p) => File::open(p)?.sync_all(),
        None => Ok(()),
    }
}
