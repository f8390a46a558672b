//! The conditional create of the `local` backend, written at a background pace.
//!
//! `LocalFileSystem::put_opts` writes the whole object, then syncs it: the disk then holds
//! megabytes of dirty pages that the WAL's next `fdatasync` (which every acknowledgement waits
//! for) queues behind. At 1,000 streams × 256 connections each 8 MiB flush held every
//! connection for 30–40 ms once a second. This is the same create, with the object written
//! through [`Pace`] (pieces, each written back before the next, with pauses), and kept to `object_store`'s layout so
//! that its reads, listings and deletes, and the staging sweep, see nothing different:
//!
//! 1. the bytes go to a staging file `{path}#{n}` (a name no object key can take), created
//!    with `O_EXCL`, after missing parent directories are made; every directory from the
//!    parent up to the store's is synced once ([`DurableDirs`]);
//! 2. the staging file is synced and hard-linked to `{path}`: the link fails if an object is
//!    already there (the conditional create), and the parent directory is synced;
//! 3. the staging file is removed (a crash before leaves it to [`super::staging::sweep`]).
//!
//! Every file operation goes through the project's [`FileSystem`] boundary, so that
//! [`crate::fs::FaultyFs`] can fail any of them in tests.

use std::collections::HashSet;
use std::io::{self, ErrorKind};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::{Body, ColdError};
use crate::fs::{FileSystem, FsFile, OpenMode};
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
    fn ensure(&self, fs: &dyn FileSystem, dir: &Path, levels: usize) -> io::Result<()> {
        let known = |d: &Path| self.lock().contains(d);
        if known(dir) {
            return Ok(());
        }
        let chain: Vec<&Path> = dir.ancestors().take(levels.max(1)).collect();
        for d in &chain {
            if !known(d) {
                fs.sync_dir(d)?;
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
    fs: &dyn FileSystem,
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
    let (file, staging) = create_staging(fs, dest).map_err(failed)?;
    let written = match dest.parent() {
        Some(parent) => dirs.ensure(fs, parent, levels),
        None => Ok(()),
    }
    .and_then(|()| write_and_link(fs, file.as_ref(), &staging, dest, body, pace));
    let _ = fs.remove_file(&staging);
    match written {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Err(ColdError::AlreadyExists {
            key: key.to_owned(),
        }),
        Err(e) => Err(failed(e)),
    }
}

fn write_and_link(
    fs: &dyn FileSystem,
    file: &dyn FsFile,
    staging: &Path,
    dest: &Path,
    body: &Body,
    pace: Pace,
) -> io::Result<()> {
    pace.write(
        body.pieces().iter().map(|p| &p[..]),
        |bufs, at| file.write_all_vectored_at(bufs, at),
        |at, len| file.write_back(at, len),
    )?;
    file.sync_all()?;
    fs.hard_link(staging, dest)?;
    match dest.parent() {
        Some(p) => fs.sync_dir(p),
        None => Ok(()),
    }
}

/// Opens a fresh staging file beside `dest`, making missing directories (synced by the
/// caller, [`DurableDirs::ensure`]).
fn create_staging(fs: &dyn FileSystem, dest: &Path) -> io::Result<(Box<dyn FsFile>, PathBuf)> {
    let mut n = 1u32;
    let mut made_dirs = false;
    loop {
        let mut name = dest.as_os_str().to_owned();
        name.push(format!("#{n}"));
        let path = PathBuf::from(name);
        match fs.open(&path, OpenMode::CreateNew) {
            Ok(f) => return Ok((f, path)),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => n += 1,
            Err(e) if e.kind() == ErrorKind::NotFound && !made_dirs => {
                if let Some(parent) = dest.parent() {
                    fs.create_dir_all(parent)?;
                }
                made_dirs = true;
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use std::sync::Arc;
    use std::time::Duration;

    use bytes::Bytes;
    use object_store::local::LocalFileSystem;

    use crate::cold::store::ObjectColdStore;
    use crate::cold::{Body, ColdStore, ObjectKey};
    use crate::fs::{EIO, ENOSPC, FaultOp, FaultyFs};
    use crate::pace::Pace;

    const BYTES: &[u8] = b"sixteen bytes!!!";

    /// A `local` store over `dir` whose creates go through `faulty`, in pieces of 4 bytes
    /// (each written back but the last) and without pauses.
    fn store(dir: &std::path::Path, faulty: &FaultyFs) -> ObjectColdStore {
        let pace = Pace {
            piece: 4,
            rate: 0,
            longest: Duration::ZERO,
        };
        let local = Arc::new(LocalFileSystem::new_with_prefix(dir).unwrap());
        ObjectColdStore::local(local, None, pace)
            .unwrap()
            .with_filesystem(Arc::new(faulty.clone()))
    }

    fn files(dir: &std::path::Path) -> Vec<String> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    out.push(p.strip_prefix(dir).unwrap().display().to_string());
                }
            }
        }
        out.sort();
        out
    }

    /// Every storage fault on the way to an object fails the create with a transient error,
    /// leaves neither the object nor a staging file, and the same create succeeds once the
    /// fault is gone.
    #[tokio::test]
    async fn a_fault_anywhere_in_a_create_leaves_nothing_and_a_retry_succeeds() {
        let dir = tempfile::tempdir().unwrap();
        let key = ObjectKey::new("chunks/g00001/1.chunk").unwrap();
        let dest = dir.path().join(key.as_str());
        let mut staging = dest.clone().into_os_string();
        staging.push("#1");
        let staging = std::path::PathBuf::from(staging);
        type Plan = fn(&FaultyFs, &std::path::Path);
        let cases: [(&str, Plan); 6] = [
            ("create, disk full", |f, _| {
                f.fail(FaultOp::Create, 1, 1, ENOSPC)
            }),
            ("second piece's write", |f, s| {
                f.fail_at(FaultOp::Write, s, 2, 1, EIO)
            }),
            ("first piece's write, disk full", |f, s| {
                f.fail_at(FaultOp::Write, s, 1, 1, ENOSPC)
            }),
            ("second piece's sync", |f, s| {
                f.fail_at(FaultOp::Sync, s, 2, 1, EIO)
            }),
            ("final sync", |f, s| f.fail_at(FaultOp::Sync, s, 4, 1, EIO)),
            ("link into place", |f, s| {
                f.fail_at(FaultOp::Rename, s, 1, 1, EIO)
            }),
        ];
        for (what, plan) in cases {
            let faulty = FaultyFs::new();
            let store = store(dir.path(), &faulty);
            plan(&faulty, &staging);
            let err = store
                .put_if_absent_paced(&key, Body::from(Bytes::from_static(BYTES)))
                .await
                .unwrap_err();
            assert!(err.is_transient(), "{what}: {err}");
            assert!(
                files(dir.path()).is_empty(),
                "{what}: {:?}",
                files(dir.path())
            );
            store
                .put_if_absent_paced(&key, Body::from(Bytes::from_static(BYTES)))
                .await
                .unwrap();
            assert_eq!(std::fs::read(&dest).unwrap(), BYTES, "{what}");
            assert_eq!(files(dir.path()), vec![key.as_str().to_owned()], "{what}");
            std::fs::remove_file(&dest).unwrap();
        }
    }

    #[tokio::test]
    async fn every_piece_is_written_back_and_the_file_synced_before_the_object_is_linked() {
        let dir = tempfile::tempdir().unwrap();
        let faulty = FaultyFs::new();
        let store = store(dir.path(), &faulty);
        let key = ObjectKey::new("a/1.chunk").unwrap();
        store
            .put_if_absent_paced(&key, Body::from(Bytes::from_static(BYTES)))
            .await
            .unwrap();
        // Four pieces: three write-backs between them (FaultyFs counts them as syncs), the
        // file's final sync, the directories from the object's up to the store's (two), and
        // the parent after the link.
        assert_eq!(faulty.count(FaultOp::Write), 4);
        assert_eq!(faulty.count(FaultOp::Sync), 3 + 1 + 2 + 1);
        assert_eq!(faulty.count(FaultOp::Rename), 1);
    }
}
