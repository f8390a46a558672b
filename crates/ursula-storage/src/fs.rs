//! The filesystem boundary under the WAL and the snapshot files.
//!
//! Everything the WAL and [`crate::snapshot_file`] do to disk goes through [`FileSystem`] and
//! the [`FsFile`] handles it opens: the real implementation ([`RealFs`]) calls `std::fs`, and
//! [`FaultyFs`] wraps it to fail the Nth write, sync, rename, allocation or creation with
//! `EIO` or `ENOSPC`, so that every storage-fault policy has a unit test.
//!
//! The WAL holds the boundary as `Arc<dyn FileSystem>` and its active segment as
//! `Box<dyn FsFile>`. On the hot path that is two indirect calls per *batch* (one write, one
//! `fdatasync`), each next to a system call that costs microseconds, so it is free in practice;
//! encoding a record (per append) never crosses it.

mod faulty;

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

pub use faulty::{EIO, ENOSPC, FaultOp, FaultyFs};

/// How [`FileSystem::open`] opens a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// An existing file, for writing.
    Write,
    /// Create if missing, keep what is there.
    CreateKeep,
    /// Create if missing, truncate to zero length.
    CreateTruncate,
    /// Create; fail with `AlreadyExists` if the file is there (`O_EXCL`).
    CreateNew,
}

/// An open file of a [`FileSystem`]. Positional writes only: the WAL always knows its offset.
pub trait FsFile: Send + Sync + std::fmt::Debug {
    /// Writes all of `buf` at `offset`.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Writes `bufs` one after another at `offset`, in one vectored write where the file
    /// allows (the default writes them one by one).
    fn write_all_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        let mut at = offset;
        for b in bufs {
            self.write_all_at(b, at)?;
            at += b.len() as u64;
        }
        Ok(())
    }
    /// `fdatasync`.
    fn sync_data(&self) -> io::Result<()>;
    /// `fsync`.
    fn sync_all(&self) -> io::Result<()>;
    /// Writes the dirty pages of `[offset, offset + len)` to the device and waits for them,
    /// without the device cache flush or the metadata commit of a sync: bounds the dirty
    /// pages that a later sync (ours or the WAL's) has to wait behind. Makes nothing durable;
    /// a [`FsFile::sync_data`] or [`FsFile::sync_all`] must follow.
    fn write_back(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Truncates or extends the file.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Current length in bytes.
    fn len(&self) -> io::Result<u64>;
    /// Whether the file is empty.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
    /// Allocates `[from, to)` by writing zeros over it (so later writes there change no
    /// metadata), as `how` says. Counted as one *allocation*.
    fn zero_fill(&self, from: u64, to: u64, how: ZeroFill<'_>) -> io::Result<()>;
}

/// How [`FsFile::zero_fill`] spreads its writes.
pub enum ZeroFill<'a> {
    /// Megabyte writes one after another, no sync (the caller syncs once).
    Bulk,
    /// Writes of `chunk` bytes, each written back ([`FsFile::write_back`]); after each, `after(filled)` is told the bytes
    /// filled so far and may pause (an error from it stops the fill). Keeps a fill beside a
    /// live WAL from holding the disk for long at a time.
    Paced {
        chunk: usize,
        after: &'a mut dyn FnMut(u64) -> io::Result<()>,
    },
}

/// The operations the WAL and snapshot files need from a filesystem.
pub trait FileSystem: Send + Sync + std::fmt::Debug {
    /// Opens a file for writing.
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn FsFile>>;
    /// Reads a whole file.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// Reads a whole file *from the disk*: first makes whatever an earlier process left in the
    /// page cache durable (`fsync`, an error is returned), then drops the file's cached pages,
    /// so the bytes returned are the ones the disk holds, not pages whose write-back failed.
    fn read_durable(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// Renames `from` over `to`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Links `to` to the file at `from`; fails with `AlreadyExists` if `to` is there.
    fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Deletes a file.
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Creates a directory and its parents.
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Makes a directory's entries durable.
    fn sync_dir(&self, path: &Path) -> io::Result<()>;
    /// The paths of the entries of a directory.
    fn read_dir(&self, path: &Path) -> io::Result<Vec<PathBuf>>;
    /// Whether `path` exists.
    fn exists(&self, path: &Path) -> io::Result<bool>;
    /// Bytes an unprivileged writer can still allocate on the filesystem holding `path`.
    fn available_bytes(&self, path: &Path) -> io::Result<u64>;
}

/// Whether `e` means the filesystem is full (`ENOSPC`, or `EDQUOT` for a quota).
pub fn is_no_space(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
    )
}

/// The operating system's filesystem.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealFs;

#[derive(Debug)]
struct RealFile(File);

impl FsFile for RealFile {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_all_at(buf, offset)
    }
    fn write_all_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        write_vectored_at(&self.0, bufs, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn sync_all(&self) -> io::Result<()> {
        self.0.sync_all()
    }
    fn write_back(&self, offset: u64, len: u64) -> io::Result<()> {
        write_back(&self.0, offset, len)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
    fn zero_fill(&self, from: u64, to: u64, mut how: ZeroFill<'_>) -> io::Result<()> {
        let size = match &how {
            ZeroFill::Bulk => 1 << 20,
            ZeroFill::Paced { chunk, .. } => (*chunk).max(1),
        };
        let zeros = vec![0u8; size];
        let mut at = from;
        while at < to {
            let n = size.min(usize::try_from(to - at).unwrap_or(size));
            self.0.write_all_at(&zeros[..n], at)?;
            at += n as u64;
            if let ZeroFill::Paced { after, .. } = &mut how {
                write_back(&self.0, at - n as u64, n as u64)?;
                after(at - from)?;
            }
        }
        Ok(())
    }
}

/// `pwritev` until every byte of `bufs` is written (a short write goes on where it stopped).
/// Not in `std` (its `write_vectored_at` is unstable).
fn write_vectored_at(file: &File, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
    let mut slices: Vec<io::IoSlice<'_>> = bufs.iter().map(|b| io::IoSlice::new(b)).collect();
    let mut rest = &mut slices[..];
    let mut at = offset;
    while !rest.is_empty() {
        // `rustix` passes at most `IOV_MAX` buffers per call: the rest go in the next.
        match rustix::io::pwritev(file, rest, at) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                at += n as u64;
                io::IoSlice::advance_slices(&mut rest, n);
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// `sync_file_range(WAIT_BEFORE | WRITE | WAIT_AFTER)`. Written by hand because neither
/// the standard library nor `rustix` offers it; elsewhere than Linux, `fdatasync`.
#[cfg(target_os = "linux")]
#[allow(unsafe_code, reason = "one system call on a file descriptor we own")]
fn write_back(file: &File, offset: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let to_off = |n: u64| libc::off64_t::try_from(n).map_err(io::Error::other);
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    // SAFETY: the descriptor is open for as long as `file` is borrowed; the call reads no
    // memory of ours.
    let rc =
        unsafe { libc::sync_file_range(file.as_raw_fd(), to_off(offset)?, to_off(len)?, flags) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn write_back(file: &File, _offset: u64, _len: u64) -> io::Result<()> {
    file.sync_data()
}

impl FileSystem for RealFs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn FsFile>> {
        let mut o = OpenOptions::new();
        o.write(true);
        match mode {
            OpenMode::Write => {}
            OpenMode::CreateKeep => {
                o.create(true).truncate(false);
            }
            OpenMode::CreateTruncate => {
                o.create(true).truncate(true);
            }
            OpenMode::CreateNew => {
                o.create_new(true);
            }
        }
        Ok(Box::new(RealFile(o.open(path)?)))
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        fs::read(path)
    }

    fn read_durable(&self, path: &Path) -> io::Result<Vec<u8>> {
        let mut file = OpenOptions::new().read(true).write(true).open(path)?;
        file.sync_all()?;
        // Best effort: some filesystems ignore the advice; the sync above is what matters.
        let _ = rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed);
        let mut data = Vec::new();
        file.read_to_end(&mut data)?;
        Ok(data)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::hard_link(from, to)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::create_dir_all(path)
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        File::open(path)?.sync_all()
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
        fs::read_dir(path)?.map(|e| e.map(|e| e.path())).collect()
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        path.try_exists()
    }

    fn available_bytes(&self, path: &Path) -> io::Result<u64> {
        let st = rustix::fs::statvfs(path)?;
        Ok(st.f_bavail.saturating_mul(st.f_frsize))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn a_write_back_leaves_the_bytes_as_written_and_refuses_a_bad_range() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = RealFs.open(&path, OpenMode::CreateNew).unwrap();
        file.write_all_at(b"hello, world", 0).unwrap();
        file.write_back(0, 5).unwrap();
        file.write_back(5, 7).unwrap();
        file.sync_all().unwrap();
        assert_eq!(RealFs.read(&path).unwrap(), b"hello, world");
        // An offset past what `off64_t` holds is an error, not a wrapped range.
        assert!(file.write_back(u64::MAX, 1).is_err());
    }

    #[test]
    fn a_vectored_write_lands_every_part_in_order_on_the_real_fs_and_its_faulty_twin() {
        let dir = tempfile::tempdir().unwrap();
        let faulty = FaultyFs::new();
        let systems: [&dyn FileSystem; 2] = [&RealFs, &faulty];
        // More parts than one `pwritev` takes on Linux (IOV_MAX 1024), some empty.
        let parts: Vec<Vec<u8>> = (0..1500u32)
            .map(|i| vec![(i % 251) as u8; (i % 7) as usize])
            .collect();
        let bufs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        for (n, fs) in systems.into_iter().enumerate() {
            let path = dir.path().join(format!("f{n}"));
            let file = fs.open(&path, OpenMode::CreateNew).unwrap();
            file.write_all_at(b"head", 0).unwrap();
            file.write_all_vectored_at(&bufs, 4).unwrap();
            let mut want = b"head".to_vec();
            want.extend(parts.concat());
            assert_eq!(fs.read(&path).unwrap(), want);
        }
    }
}
