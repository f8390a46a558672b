//! Atomic, checksummed single-blob files, used for Raft state-machine snapshots.
//!
//! Layout (little-endian): magic `b"URSULASN"` (8) | version u32 = 1 | payload length u64 |
//! crc32c(payload) u32 | payload. A write goes to `<path>.tmp`, is fsynced, renamed over
//! `<path>`, and the directory is fsynced, so readers see either the old or the new blob.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};

use crate::format::{read_u32, read_u64};
use crate::fs::{FileSystem, OpenMode};
use crate::pace::Pace;
use crate::wal::WalError;

const MAGIC: [u8; 8] = *b"URSULASN";
const VERSION: u32 = 1;
const HEADER_LEN: usize = 24;

fn tmp_path(path: &Path) -> PathBuf {
    let mut name = OsString::from(path.as_os_str());
    name.push(".tmp");
    PathBuf::from(name)
}

fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Atomically replaces `path` with a checksummed blob holding `payload`:
/// writes `path.tmp` at `pace`, fsyncs it, renames it over `path`, and fsyncs the directory.
/// On any failure the temporary file is removed (a full disk needs its space back) and
/// `path` is untouched.
pub fn write_atomic(
    fs: &dyn FileSystem,
    path: &Path,
    payload: &[u8],
    pace: Pace,
) -> Result<(), WalError> {
    let mut header = [0u8; HEADER_LEN];
    header[0..8].copy_from_slice(&MAGIC);
    header[8..12].copy_from_slice(&VERSION.to_le_bytes());
    header[12..20].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    header[20..24].copy_from_slice(&crc32c::crc32c(payload).to_le_bytes());

    let tmp = tmp_path(path);
    let result = (|| -> io::Result<()> {
        let file = fs.open(&tmp, OpenMode::CreateTruncate)?;
        // Written back as it goes (`Pace`): a blob written in one piece would leave megabytes
        // of dirty pages for the WAL's next fdatasync to wait behind.
        pace.write(
            [&header[..], payload],
            |bufs, at| file.write_all_vectored_at(bufs, at),
            |at, len| file.write_back(at, len),
        )?;
        file.sync_all()?;
        drop(file);
        fs.rename(&tmp, path)?;
        fs.sync_dir(parent_dir(path))
    })();
    if result.is_err() {
        // Best effort: do not leave a partial temp file behind.
        let _ = fs.remove_file(&tmp);
    }
    Ok(result?)
}

/// Bytes in front of the payload of a blob file.
pub const HEADER_BYTES: u64 = HEADER_LEN as u64;

/// Checks the first [`HEADER_BYTES`] of a blob file (magic, version) and returns the payload
/// length it announces. The checksum is not verified: that needs the whole payload
/// ([`read_checked`]); this is for streaming a file elsewhere, where it is verified on arrival.
pub fn parse_header(header: &[u8]) -> Result<u64, String> {
    if header.len() < HEADER_LEN || header.get(0..8) != Some(&MAGIC[..]) {
        return Err("bad snapshot magic".into());
    }
    let version = read_u32(header, 8).unwrap_or(0);
    if version != VERSION {
        return Err(format!(
            "unsupported snapshot format version {version} (expected {VERSION})"
        ));
    }
    read_u64(header, 12).ok_or_else(|| "truncated snapshot header".into())
}

/// Reads a blob written by [`write_atomic`]. `Ok(None)` if the file does not exist;
/// [`WalError::Corrupt`] if the magic, version, length or checksum is wrong.
pub fn read_checked(fs: &dyn FileSystem, path: &Path) -> Result<Option<Vec<u8>>, WalError> {
    let mut data = match fs.read(path) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let corrupt = |offset: u64, reason: String| WalError::Corrupt {
        file: path.to_path_buf(),
        offset,
        reason,
    };
    if data.len() < HEADER_LEN {
        return Err(corrupt(
            0,
            format!(
                "snapshot file is {} bytes, shorter than its header",
                data.len()
            ),
        ));
    }
    if data.get(0..8) != Some(&MAGIC[..]) {
        return Err(corrupt(0, "bad snapshot magic".into()));
    }
    let version = read_u32(&data, 8).unwrap_or(0);
    if version != VERSION {
        return Err(corrupt(
            8,
            format!("unsupported snapshot format version {version} (expected {VERSION})"),
        ));
    }
    let len = read_u64(&data, 12).unwrap_or(u64::MAX);
    let actual = (data.len() - HEADER_LEN) as u64;
    if len != actual {
        return Err(corrupt(
            12,
            format!("header says {len} payload bytes, file holds {actual}"),
        ));
    }
    let crc = read_u32(&data, 20).unwrap_or(0);
    let payload = data.get(HEADER_LEN..).unwrap_or_default();
    if crc32c::crc32c(payload) != crc {
        return Err(corrupt(
            HEADER_LEN as u64,
            "snapshot checksum mismatch".into(),
        ));
    }
    data.drain(..HEADER_LEN);
    Ok(Some(data))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
mod tests {
    use super::*;
    use crate::fs::{EIO, ENOSPC, FaultOp, FaultyFs, RealFs};
    use std::fs;

    fn write_atomic(path: &Path, payload: &[u8]) -> Result<(), WalError> {
        super::write_atomic(&RealFs, path, payload, Pace::FLAT)
    }

    fn read_checked(path: &Path) -> Result<Option<Vec<u8>>, WalError> {
        super::read_checked(&RealFs, path)
    }

    #[test]
    fn a_failed_write_leaves_the_old_blob_and_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snap.bin");
        write_atomic(&path, b"old").unwrap();
        let fs = FaultyFs::new();
        for (op, errno) in [
            (FaultOp::Create, ENOSPC),
            (FaultOp::Write, ENOSPC),
            (FaultOp::Sync, EIO),
            (FaultOp::Rename, EIO),
        ] {
            fs.fail(op, 1, 1, errno);
            let err = super::write_atomic(&fs, &path, b"new", Pace::FLAT).unwrap_err();
            assert!(matches!(err, WalError::Io(_)), "{op:?}: {err}");
            assert_eq!(read_checked(&path).unwrap().unwrap(), b"old", "{op:?}");
            assert!(!tmp_path(&path).exists(), "{op:?}");
        }
        super::write_atomic(&fs, &path, b"new", Pace::FLAT).unwrap();
        assert_eq!(read_checked(&path).unwrap().unwrap(), b"new");
    }

    #[test]
    fn round_trip_and_replace() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snap.bin");
        assert_eq!(read_checked(&path).unwrap(), None);
        write_atomic(&path, b"first snapshot").unwrap();
        assert_eq!(read_checked(&path).unwrap().unwrap(), b"first snapshot");
        write_atomic(&path, b"").unwrap();
        assert_eq!(read_checked(&path).unwrap().unwrap(), b"");
        let big: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
        write_atomic(&path, &big).unwrap();
        assert_eq!(read_checked(&path).unwrap().unwrap(), big);
        assert!(!tmp_path(&path).exists());
    }

    #[test]
    fn a_paced_blob_is_synced_piece_by_piece_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snap.bin");
        let fs = FaultyFs::new();
        let pace = Pace {
            piece: 64 << 10,
            rate: 256 << 20,
            longest: std::time::Duration::from_secs(1),
        };
        let big: Vec<u8> = (0..1_000_000u32).map(|i| (i * 13) as u8).collect();
        super::write_atomic(&fs, &path, &big, pace).unwrap();
        assert_eq!(read_checked(&path).unwrap().unwrap(), big);
        // 1,000,024 bytes: 15 syncs between pieces of 64 KiB, then the file's and the
        // directory's.
        assert_eq!(fs.count(FaultOp::Sync), 17);
    }

    #[test]
    fn every_corruption_detected() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snap.bin");
        write_atomic(&path, b"some snapshot payload").unwrap();
        let good = fs::read(&path).unwrap();
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x01;
            fs::write(&path, &bad).unwrap();
            let err = read_checked(&path).unwrap_err();
            assert!(matches!(err, WalError::Corrupt { .. }), "byte {i}: {err}");
        }
        for cut in 0..good.len() {
            fs::write(&path, &good[..cut]).unwrap();
            let err = read_checked(&path).unwrap_err();
            assert!(matches!(err, WalError::Corrupt { .. }), "cut {cut}: {err}");
        }
        let mut longer = good.clone();
        longer.push(0);
        fs::write(&path, &longer).unwrap();
        assert!(matches!(read_checked(&path), Err(WalError::Corrupt { .. })));
    }

    #[test]
    fn relative_path_in_current_dir_parent() {
        assert_eq!(parent_dir(Path::new("snap.bin")), Path::new("."));
        assert_eq!(parent_dir(Path::new("/a/b")), Path::new("/a"));
    }
}
