//! [`FaultyFs`]: the real filesystem with injected failures, for tests of every fault policy.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{FileSystem, FsFile, OpenMode, RealFs, ZeroFill};

/// The operations a fault can be attached to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultOp {
    /// A positional write ([`FsFile::write_all_at`]).
    Write,
    /// `fdatasync`, `fsync` of a file, a directory sync, or a write-back of a range.
    Sync,
    /// A rename, or a hard link (both change a directory's entries).
    Rename,
    /// Allocation of file space ([`FsFile::zero_fill`]).
    Allocate,
    /// Opening a file with a create mode.
    Create,
}

impl FaultOp {
    fn index(self) -> usize {
        self as usize
    }
}

/// `EIO`.
pub const EIO: i32 = 5;
/// `ENOSPC`.
pub const ENOSPC: i32 = 28;

#[derive(Debug)]
struct Rule {
    op: FaultOp,
    /// Only occurrences on this file (or directory) count, when set.
    path: Option<PathBuf>,
    /// Occurrences of `op` (on `path`) seen since the rule was planned.
    seen: u64,
    /// The first failing occurrence (1-based).
    nth: u64,
    /// How many occurrences from `nth` on fail.
    times: u64,
    errno: i32,
}

#[derive(Debug, Default)]
struct State {
    counts: [u64; 5],
    rules: Vec<Rule>,
    /// Every write, allocation and create fails with `ENOSPC`; no bytes are available.
    full: bool,
}

/// The real filesystem, except where a test asked for a failure. Cheap to clone; clones share
/// their fault plan and counters.
#[derive(Debug, Clone, Default)]
pub struct FaultyFs {
    state: Arc<Mutex<State>>,
}

impl FaultyFs {
    /// No faults planned yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes the `nth` next occurrence of `op` (1 = the very next) and the `times - 1` after
    /// it fail with `errno` ([`EIO`] or [`ENOSPC`]).
    pub fn fail(&self, op: FaultOp, nth: u64, times: u64, errno: i32) {
        self.plan(op, None, nth, times, errno);
    }

    /// Like [`FaultyFs::fail`], but only occurrences on `path` count and fail: a test that
    /// means the WAL's own sync is not fooled by a background thread syncing another file.
    pub fn fail_at(&self, op: FaultOp, path: &Path, nth: u64, times: u64, errno: i32) {
        self.plan(op, Some(path.to_path_buf()), nth, times, errno);
    }

    fn plan(&self, op: FaultOp, path: Option<PathBuf>, nth: u64, times: u64, errno: i32) {
        self.lock().rules.push(Rule {
            op,
            path,
            seen: 0,
            nth: nth.max(1),
            times,
            errno,
        });
    }

    /// While `full`, every write, allocation and file creation fails with `ENOSPC` and
    /// [`FileSystem::available_bytes`] reports 0: a full disk. Clearing it frees the space.
    pub fn set_full(&self, full: bool) {
        self.lock().full = full;
    }

    /// How many times `op` was attempted so far.
    pub fn count(&self, op: FaultOp) -> u64 {
        self.lock().counts[op.index()]
    }

    /// Counts one occurrence of `op` on `path` and returns the error planned for it, if any.
    fn check(&self, op: FaultOp, path: &Path) -> io::Result<()> {
        let mut s = self.lock();
        s.counts[op.index()] += 1;
        if s.full && matches!(op, FaultOp::Write | FaultOp::Allocate | FaultOp::Create) {
            return Err(io::Error::from_raw_os_error(ENOSPC));
        }
        let mut failure = None;
        for r in &mut s.rules {
            if r.op != op || r.path.as_deref().is_some_and(|p| p != path) {
                continue;
            }
            r.seen += 1;
            if failure.is_none() && r.seen >= r.nth && r.seen < r.nth.saturating_add(r.times) {
                failure = Some(r.errno);
            }
        }
        failure.map_or(Ok(()), |errno| Err(io::Error::from_raw_os_error(errno)))
    }
}

#[derive(Debug)]
struct FaultyFile {
    inner: Box<dyn FsFile>,
    path: PathBuf,
    fs: FaultyFs,
}

impl FsFile for FaultyFile {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.fs.check(FaultOp::Write, &self.path)?;
        self.inner.write_all_at(buf, offset)
    }
    fn write_all_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        self.fs.check(FaultOp::Write, &self.path)?;
        self.inner.write_all_vectored_at(bufs, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.fs.check(FaultOp::Sync, &self.path)?;
        self.inner.sync_data()
    }
    fn sync_all(&self) -> io::Result<()> {
        self.fs.check(FaultOp::Sync, &self.path)?;
        self.inner.sync_all()
    }
    fn write_back(&self, offset: u64, len: u64) -> io::Result<()> {
        self.fs.check(FaultOp::Sync, &self.path)?;
        self.inner.write_back(offset, len)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn zero_fill(&self, from: u64, to: u64, how: ZeroFill<'_>) -> io::Result<()> {
        self.fs.check(FaultOp::Allocate, &self.path)?;
        self.inner.zero_fill(from, to, how)
    }
}

impl FileSystem for FaultyFs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn FsFile>> {
        if mode != OpenMode::Write {
            self.check(FaultOp::Create, path)?;
        }
        Ok(Box::new(FaultyFile {
            inner: RealFs.open(path, mode)?,
            path: path.to_path_buf(),
            fs: self.clone(),
        }))
    }
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        RealFs.read(path)
    }
    fn read_durable(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.check(FaultOp::Sync, path)?;
        RealFs.read_durable(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.check(FaultOp::Rename, from)?;
        RealFs.rename(from, to)
    }
    fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.check(FaultOp::Rename, from)?;
        RealFs.hard_link(from, to)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        RealFs.remove_file(path)
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        RealFs.create_dir_all(path)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.check(FaultOp::Sync, path)?;
        RealFs.sync_dir(path)
    }
    fn read_dir(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
        RealFs.read_dir(path)
    }
    fn exists(&self, path: &Path) -> io::Result<bool> {
        RealFs.exists(path)
    }
    fn available_bytes(&self, path: &Path) -> io::Result<u64> {
        if self.lock().full {
            return Ok(0);
        }
        RealFs.available_bytes(path)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn fails_exactly_the_planned_occurrences() {
        let dir = tempfile::tempdir().unwrap();
        let fs = FaultyFs::new();
        let f = fs
            .open(&dir.path().join("a"), OpenMode::CreateTruncate)
            .unwrap();
        fs.fail(FaultOp::Sync, 2, 2, EIO);
        assert!(f.sync_data().is_ok());
        assert_eq!(f.sync_data().unwrap_err().raw_os_error(), Some(EIO));
        assert!(f.sync_all().is_err());
        assert!(f.sync_data().is_ok());
        fs.set_full(true);
        let e = f.write_all_at(b"x", 0).unwrap_err();
        assert!(super::super::is_no_space(&e));
        assert_eq!(fs.available_bytes(dir.path()).unwrap(), 0);
        fs.set_full(false);
        f.write_all_at(b"x", 0).unwrap();
        assert_eq!(fs.count(FaultOp::Write), 2);
    }

    #[test]
    fn a_fault_on_one_file_spares_the_others() {
        let dir = tempfile::tempdir().unwrap();
        let fs = FaultyFs::new();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        let fa = fs.open(&a, OpenMode::CreateTruncate).unwrap();
        let fb = fs.open(&b, OpenMode::CreateTruncate).unwrap();
        fs.fail_at(FaultOp::Sync, &a, 2, 1, EIO);
        assert!(fb.sync_all().is_ok());
        assert!(fb.sync_all().is_ok());
        assert!(fa.sync_data().is_ok());
        assert_eq!(fa.sync_data().unwrap_err().raw_os_error(), Some(EIO));
        assert!(fb.sync_data().is_ok());
        assert!(fa.sync_data().is_ok());
    }
}
