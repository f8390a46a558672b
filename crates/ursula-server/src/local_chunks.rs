//! Reads of chunk objects in a `local` cold store, straight from their files: the bytes go
//! to the client with `sendfile` ([`crate::send_file`]), not through a fetch into memory.
//!
//! Each block's checksum is still checked: the first read of a block since its object was
//! opened reads it (and its crc32c) into memory, checks it and sends that copy. Later reads of
//! a checked block hand out slices of the object's mapping, which leave by `sendfile` from the
//! page cache without another check. A check holds for [`RECHECK_AFTER`] at most: an open
//! object older than that is opened afresh, its blocks unchecked again, so a block that went
//! bad on disk after its check is caught within that time (and by every whole-object read).
//! Pieces under [`SENDFILE_MIN`] are always read and checked (they would not be sent by
//! `sendfile` anyway).
//!
//! An open object is read only while its file is still in the store (one `stat` per read),
//! so a deleted object or a store that went away answers as a fetch from the store would.
//! The OS page cache is the read cache here; `[storage.cold.cache]` serves other backends.

use crate::cold_read::ReadError;
use crate::send_file::{Mapped, SENDFILE_MIN};
use bytes::Bytes;
use quick_cache::sync::Cache;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use ursula_storage::chunk_object::{BLOCK_SIZE, ChunkError, ChunkLayout};
use ursula_storage::cold::ColdError;

/// How long a block's check is trusted (see the module docs).
pub const RECHECK_AFTER: Duration = Duration::from_secs(60);
/// Objects kept open (one file descriptor and one mapping each).
const OPEN_OBJECTS: usize = 256;

/// An open chunk object and which of its blocks were checked.
struct Open {
    file: Arc<Mapped>,
    checked: Box<[AtomicBool]>,
    opened: Instant,
}

/// The chunk objects of a `local` store that were read lately, kept open.
pub struct LocalChunks {
    open: Cache<PathBuf, Arc<Open>>,
}

impl Default for LocalChunks {
    fn default() -> Self {
        LocalChunks {
            open: Cache::new(OPEN_OBJECTS),
        }
    }
}

fn store_error(path: &Path, e: std::io::Error) -> ReadError {
    match e.kind() {
        std::io::ErrorKind::NotFound => ReadError::Store(ColdError::NotFound {
            key: path.display().to_string(),
        }),
        _ => unavailable(e),
    }
}

fn unavailable(e: std::io::Error) -> ReadError {
    ReadError::Store(ColdError::Unavailable {
        operation: "read",
        source: Box::new(e),
    })
}

impl LocalChunks {
    /// The object at `path`, opened if it is not (or was opened too long ago).
    async fn get(&self, path: &Path, layout: ChunkLayout) -> Result<Arc<Open>, ReadError> {
        if let Some(open) = self.open.get(path)
            && open.opened.elapsed() < RECHECK_AFTER
        {
            // An open object is still read only while the store still has that very file: a
            // deleted object, or a store that went away, answers as a fetch from it would,
            // and a key that names another file now (never done, objects are immutable) is
            // opened afresh.
            match tokio::fs::metadata(path).await {
                Ok(meta) if open.file.same_file(&meta) => return Ok(open),
                Ok(_) => {}
                Err(e) => {
                    // Not kept open for a file that is gone (its space is freed once the
                    // responses still sending from it are done).
                    self.open.remove(path);
                    return Err(store_error(path, e));
                }
            }
        }
        self.open.remove(path);
        let p = path.to_owned();
        let file = tokio::task::spawn_blocking(move || Mapped::new(std::fs::File::open(&p)?))
            .await
            .map_err(|e| store_error(path, std::io::Error::other(e)))?
            .map_err(|e| store_error(path, e))?;
        // The layout's last block ends this far into the object; a shorter file is corrupt.
        let need = layout
            .object_range(0, layout.payload_len)
            .map_or(0, |r| r.end);
        if file.len() < need {
            return Err(ReadError::Corrupt(ChunkError::Short {
                expected: need,
                got: file.len(),
            }));
        }
        let open = Arc::new(Open {
            file,
            checked: (0..layout.blocks())
                .map(|_| AtomicBool::new(false))
                .collect(),
            opened: Instant::now(),
        });
        self.open.insert(path.to_owned(), open.clone());
        Ok(open)
    }

    /// Appends payload `[pos, pos + len)` of the chunk object at `path` (of `object_len`
    /// payload bytes) to `out`; nothing is appended on an error.
    pub async fn read(
        &self,
        path: &Path,
        (pos, len, object_len): (u64, u64, u64),
        out: &mut Vec<Bytes>,
    ) -> Result<(), ReadError> {
        let layout = ChunkLayout::new(object_len);
        layout.object_range(pos, len).map_err(ReadError::Corrupt)?;
        let open = self.get(path, layout).await?;
        let mark = out.len();
        let end = pos + len;
        let mut at = pos;
        while at < end {
            // The next run of blocks to read and check, or one checked block to map.
            let block = at / BLOCK_SIZE;
            let piece_end = end.min((block + 1) * BLOCK_SIZE);
            if self.mappable(&open, block, piece_end - at) {
                let lo = layout.block_offset(block) + at % BLOCK_SIZE;
                out.push(open.file.bytes(lo as usize, (lo + piece_end - at) as usize));
                at = piece_end;
                continue;
            }
            let mut run_end = piece_end;
            while run_end < end {
                let b = run_end / BLOCK_SIZE;
                let n = end.min((b + 1) * BLOCK_SIZE) - run_end;
                if self.mappable(&open, b, n) {
                    break;
                }
                run_end = end.min((b + 1) * BLOCK_SIZE);
            }
            if let Err(e) = check_run(&open, layout, (at, run_end), out).await {
                out.truncate(mark);
                return Err(e);
            }
            at = run_end;
        }
        Ok(())
    }

    fn mappable(&self, open: &Open, block: u64, piece: u64) -> bool {
        piece >= SENDFILE_MIN as u64
            && open
                .checked
                .get(block as usize)
                .is_some_and(|c| c.load(Ordering::Acquire))
    }
}

/// Reads payload `[start, end)` with the blocks it touches, checks them, appends the payload
/// and marks the blocks checked.
async fn check_run(
    open: &Arc<Open>,
    layout: ChunkLayout,
    (start, end): (u64, u64),
    out: &mut Vec<Bytes>,
) -> Result<(), ReadError> {
    let fetch = |range: std::ops::Range<u64>| async move {
        let file = open.file.clone();
        let expected = range.end - range.start;
        match tokio::task::spawn_blocking(move || file.read(range.start, range.end)).await {
            Ok(Ok(bytes)) => Ok(Bytes::from(bytes)),
            // The file is shorter than when it was opened: not what a store does.
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                Err(ReadError::Corrupt(ChunkError::Short { expected, got: 0 }))
            }
            Ok(Err(e)) => Err(unavailable(e)),
            Err(e) => Err(unavailable(std::io::Error::other(e))),
        }
    };
    crate::cold_read::fetch_checked(layout, (start, end), out, fetch).await?;
    for b in start / BLOCK_SIZE..=(end - 1) / BLOCK_SIZE {
        if let Some(c) = open.checked.get(b as usize) {
            c.store(true, Ordering::Release);
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;
    use crate::send_file::SENDFILE_MIN;
    use ursula_storage::chunk_object::ChunkWriter;

    fn object(n: usize) -> (tempfile::TempDir, PathBuf, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("o.chunk");
        let p: Vec<u8> = (0..n).map(|i| (i * 31 % 251) as u8).collect();
        let mut w = ChunkWriter::new(n as u64);
        w.write(&p);
        std::fs::write(&path, w.finish().unwrap()).unwrap();
        (dir, path, p)
    }

    async fn read(c: &LocalChunks, path: &Path, (pos, len, n): (u64, u64, u64)) -> Vec<Bytes> {
        let mut out = Vec::new();
        c.read(path, (pos, len, n), &mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn reads_match_the_payload_and_checked_blocks_are_mapped() {
        let n = 5 * BLOCK_SIZE as usize + 777;
        let (_d, path, p) = object(n);
        let c = LocalChunks::default();
        for (pos, len) in [(0, n), (3, 10), (70_000, 200_000), (n - 5, 5)] {
            let got = read(&c, &path, (pos as u64, len as u64, n as u64)).await;
            assert!(got.concat() == p[pos..pos + len], "{pos}+{len}");
        }
        // Everything was checked once: a whole read now maps every big piece.
        let got = read(&c, &path, (0, n as u64, n as u64)).await;
        assert!(got.concat() == p);
        let mapped = got
            .iter()
            .filter(|b| b.len() >= SENDFILE_MIN)
            .filter(|b| crate::send_file::tests_source_of(b))
            .count();
        assert_eq!(mapped, 5, "the five whole blocks are slices of the mapping");
    }

    #[tokio::test]
    async fn a_bad_block_is_refused_before_it_was_checked_and_nothing_is_appended() {
        let n = 3 * BLOCK_SIZE as usize;
        let (_d, path, _p) = object(n);
        let mut bytes = std::fs::read(&path).unwrap();
        let at = ChunkLayout::new(n as u64).block_offset(1) as usize + 100;
        bytes[at] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        let c = LocalChunks::default();
        let mut out = vec![Bytes::from_static(b"x")];
        let got = c.read(&path, (0, n as u64, n as u64), &mut out).await;
        assert!(matches!(
            got,
            Err(ReadError::Corrupt(ChunkError::BadBlock { block: 1 }))
        ));
        assert_eq!(out.len(), 1);
        // The blocks before it read fine.
        let ok = read(&c, &path, (0, 1000, n as u64)).await;
        assert_eq!(ok.concat().len(), 1000);
    }

    #[tokio::test]
    async fn an_open_object_that_was_deleted_is_missing() {
        let n = 2 * BLOCK_SIZE as usize;
        let (_d, path, p) = object(n);
        let c = LocalChunks::default();
        let got = read(&c, &path, (0, n as u64, n as u64)).await;
        assert!(got.concat() == p);
        std::fs::remove_file(&path).unwrap();
        let mut out = Vec::new();
        let gone = c.read(&path, (0, n as u64, n as u64), &mut out).await;
        assert!(matches!(
            gone,
            Err(ReadError::Store(ColdError::NotFound { .. }))
        ));
        assert!(out.is_empty());
    }

    #[tokio::test]
    async fn a_key_that_names_another_file_is_opened_afresh() {
        let n = 2 * BLOCK_SIZE as usize;
        let (_d, path, p) = object(n);
        let c = LocalChunks::default();
        for _ in 0..2 {
            assert!(read(&c, &path, (0, n as u64, n as u64)).await.concat() == p);
        }
        // Replaced by another file of the same length (a rename over it, as a store writes).
        let other: Vec<u8> = p.iter().map(|b| b ^ 0x55).collect();
        let mut w = ChunkWriter::new(n as u64);
        w.write(&other);
        let aside = path.with_extension("new");
        std::fs::write(&aside, w.finish().unwrap()).unwrap();
        std::fs::rename(&aside, &path).unwrap();
        assert!(read(&c, &path, (0, n as u64, n as u64)).await.concat() == other);
    }

    #[tokio::test]
    async fn a_missing_or_short_object_is_an_error() {
        let (_d, path, _p) = object(100_000);
        let c = LocalChunks::default();
        let mut out = Vec::new();
        let missing = c
            .read(&path.with_extension("x"), (0, 10, 100_000), &mut out)
            .await;
        assert!(matches!(
            missing,
            Err(ReadError::Store(ColdError::NotFound { .. }))
        ));
        let short = c.read(&path, (0, 10, 200_000), &mut out).await;
        assert!(matches!(
            short,
            Err(ReadError::Corrupt(ChunkError::Short { .. }))
        ));
        assert!(out.is_empty());
    }
}
