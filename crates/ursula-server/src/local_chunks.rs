//! Reads of chunk objects in a `local` cold store, straight from their files: the bytes go
//! to the client with `sendfile` ([`crate::send_file`]), not through a fetch into memory.
//!
//! Each block's checksum is still checked: the first read of a block since its object was
//! opened reads it (and its crc32c) into memory, checks it and sends that copy. Later reads of
//! a checked block hand out slices of the object's mapping, which leave by `sendfile` from the
//! page cache without another check. An object written in layout version 2 (the default for
//! this backend, see `ursula_storage::chunk_object`) holds its payload in one run, so a run of
//! checked blocks leaves as one slice, one `sendfile` call as large as the socket takes; a
//! version 1 object (written before) leaves one block per call. The layout is read from the
//! object's header when it is opened. A check holds for [`RECHECK_AFTER`] at most: an open
//! object older than that is opened afresh, its blocks unchecked again, so a block that went
//! bad on disk after its check is caught within that time (and by every whole-object read).
//! Pieces under [`SENDFILE_MIN`] are always read and checked (they would not be sent by
//! `sendfile` anyway).
//!
//! An open object is read only while its file is still in the store (one `stat` per read, on
//! the calling thread), so a deleted object or a store that went away answers as a fetch from
//! the store would.
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
use ursula_storage::cold::object::HEADER_LEN;

/// How long a block's check is trusted (see the module docs).
pub const RECHECK_AFTER: Duration = Duration::from_secs(60);
/// The most bytes one [`LocalChunks::read`] reads and checks into memory; mapped bytes of
/// checked blocks are not counted (they are the page cache's).
pub const COPY_MAX: u64 = crate::tiering::FETCH_PIECE;
/// Objects kept open (one file descriptor and one mapping each).
const OPEN_OBJECTS: usize = 256;

/// An open chunk object, its layout (from its header) and which of its blocks were checked.
struct Open {
    file: Arc<Mapped>,
    layout: ChunkLayout,
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
    /// The object at `path`, of `payload_len` payload bytes, opened if it is not (or was
    /// opened too long ago).
    async fn get(&self, path: &Path, payload_len: u64) -> Result<Arc<Open>, ReadError> {
        if let Some(open) = self.open.get(path)
            && open.opened.elapsed() < RECHECK_AFTER
        {
            // An open object is still read only while the store still has that very file: a
            // deleted object, or a store that went away, answers as a fetch from it would,
            // and a key that names another file now (never done, objects are immutable) is
            // opened afresh. The `stat` runs here, not on a blocking thread: this thread
            // sends the object's bytes with `sendfile` anyway, so a store that stalls stalls
            // it either way, and the hop to a blocking thread and back cost two context
            // switches per object read (a `read-cold` GET spans about sixteen).
            match std::fs::metadata(path) {
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
        let opened = tokio::task::spawn_blocking(move || {
            let file = Mapped::new(std::fs::File::open(&p)?)?;
            let header = file.read(0, HEADER_LEN.min(file.len() as usize) as u64)?;
            Ok::<_, std::io::Error>((file, header))
        });
        let (file, header) = opened
            .await
            .map_err(|e| store_error(path, std::io::Error::other(e)))?
            .map_err(|e| store_error(path, e))?;
        // The header says the layout (both versions are read); a header that does not fit
        // the payload the reference records, or a file shorter than its body, is corrupt.
        let layout = ChunkLayout::from_header(&header, payload_len).map_err(ReadError::Corrupt)?;
        if file.len() < layout.body_end() {
            return Err(ReadError::Corrupt(ChunkError::Short {
                expected: layout.body_end(),
                got: file.len(),
            }));
        }
        let open = Arc::new(Open {
            file,
            layout,
            checked: (0..layout.blocks())
                .map(|_| AtomicBool::new(false))
                .collect(),
            opened: Instant::now(),
        });
        self.open.insert(path.to_owned(), open.clone());
        Ok(open)
    }

    /// Appends a prefix of payload `[pos, pos + len)` of the chunk object at `path` (of
    /// `object_len` payload bytes) to `out` and returns its length (all of it, or less where
    /// [`COPY_MAX`] bytes had to be read and checked into memory first); nothing is appended
    /// on an error.
    pub async fn read(
        &self,
        path: &Path,
        (pos, len, object_len): (u64, u64, u64),
        out: &mut Vec<Bytes>,
    ) -> Result<u64, ReadError> {
        let open = self.get(path, object_len).await?;
        let layout = open.layout;
        layout.fetch(pos, len).map_err(ReadError::Corrupt)?;
        let mark = out.len();
        let end = pos + len;
        let mut at = pos;
        let mut copied = 0;
        // The end of payload position `from`'s block, or of `end` if that comes first.
        let piece_end = |from: u64| end.min((from / BLOCK_SIZE + 1) * BLOCK_SIZE);
        while at < end && copied < COPY_MAX {
            // A run of checked blocks to send from the mapping (a version 2 object's blocks
            // lie end to end, so such a run is one slice however many blocks it spans; a
            // version 1 run is one block), or a run of unchecked blocks to read and check.
            let checked = Self::checked(&open, at / BLOCK_SIZE);
            let mut run_end = piece_end(at);
            while run_end < end
                && (layout.contiguous() || !checked)
                && (checked || copied + (run_end - at) < COPY_MAX)
                && Self::checked(&open, run_end / BLOCK_SIZE) == checked
            {
                run_end = piece_end(run_end);
            }
            // Pieces under `SENDFILE_MIN` would not be sent by `sendfile` anyway: read them.
            if checked && run_end - at >= SENDFILE_MIN as u64 {
                let lo = layout.offset_of(at);
                out.push(open.file.bytes(lo as usize, (lo + run_end - at) as usize));
            } else if let Err(e) = check_run(&open, (at, run_end), out).await {
                out.truncate(mark);
                return Err(e);
            } else {
                copied += run_end - at;
            }
            at = run_end;
        }
        Ok(at - pos)
    }

    fn checked(open: &Open, block: u64) -> bool {
        open.checked
            .get(block as usize)
            .is_some_and(|c| c.load(Ordering::Acquire))
    }
}

/// Reads payload `[start, end)` with the blocks it touches, checks them, appends the payload
/// and marks the blocks checked.
async fn check_run(
    open: &Arc<Open>,
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
    crate::cold_read::fetch_checked(open.layout, (start, end), out, fetch).await?;
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
    use ursula_storage::chunk_object::{ChunkVersion, ChunkWriter};

    const BOTH: [ChunkVersion; 2] = [ChunkVersion::Interleaved, ChunkVersion::Contiguous];

    fn object(n: usize) -> (tempfile::TempDir, PathBuf, Vec<u8>) {
        object_in(ChunkVersion::Contiguous, n)
    }

    fn object_in(v: ChunkVersion, n: usize) -> (tempfile::TempDir, PathBuf, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("o.chunk");
        let p: Vec<u8> = (0..n).map(|i| (i * 31 % 251) as u8).collect();
        let mut w = ChunkWriter::new(v, n as u64);
        w.write(&p);
        std::fs::write(&path, w.finish().unwrap()).unwrap();
        (dir, path, p)
    }

    /// The whole range, in as many reads as that takes.
    async fn read(c: &LocalChunks, path: &Path, (pos, len, n): (u64, u64, u64)) -> Vec<Bytes> {
        let mut out = Vec::new();
        let mut at = pos;
        while at < pos + len {
            let got = c
                .read(path, (at, pos + len - at, n), &mut out)
                .await
                .unwrap();
            assert!(got > 0);
            at += got;
        }
        out
    }

    #[tokio::test]
    async fn one_read_copies_about_copy_max_then_maps_whole_checked_runs() {
        let block = BLOCK_SIZE as usize;
        let n = 3 * COPY_MAX as usize + 5 * block + 123;
        let (_d, path, p) = object(n);
        let c = LocalChunks::default();
        let mut out = Vec::new();
        let first = c
            .read(&path, (0, n as u64, n as u64), &mut out)
            .await
            .unwrap();
        assert!(
            (COPY_MAX..COPY_MAX + BLOCK_SIZE).contains(&first),
            "{first}"
        );
        assert!(out.concat() == p[..first as usize]);
        // The rest in reads of about `COPY_MAX`; then all of it is one mapped slice.
        let rest = read(&c, &path, (first, n as u64 - first, n as u64)).await;
        assert!(rest.concat() == p[first as usize..]);
        let mut all = Vec::new();
        let whole = c
            .read(&path, (0, n as u64, n as u64), &mut all)
            .await
            .unwrap();
        assert_eq!(whole, n as u64);
        assert_eq!(all.len(), 1);
        assert!(crate::send_file::tests_source_of(&all[0]));
    }

    #[tokio::test]
    async fn reads_match_the_payload_and_checked_blocks_are_mapped() {
        let n = 5 * BLOCK_SIZE as usize + 777;
        for v in BOTH {
            let (_d, path, p) = object_in(v, n);
            let c = LocalChunks::default();
            for (pos, len) in [(0, n), (3, 10), (70_000, 200_000), (n - 5, 5)] {
                let got = read(&c, &path, (pos as u64, len as u64, n as u64)).await;
                assert!(got.concat() == p[pos..pos + len], "{v:?} {pos}+{len}");
            }
            // Everything was checked once: a whole read now maps every big piece, as one
            // slice per whole block (version 1; the short last block is read) or one slice
            // for the whole payload (version 2).
            let got = read(&c, &path, (0, n as u64, n as u64)).await;
            assert!(got.concat() == p);
            let mapped: Vec<usize> = got
                .iter()
                .filter(|b| crate::send_file::tests_source_of(b))
                .map(Bytes::len)
                .collect();
            let block = BLOCK_SIZE as usize;
            match v {
                ChunkVersion::Interleaved => assert_eq!(mapped, [block; 5]),
                ChunkVersion::Contiguous => assert_eq!(mapped, [n]),
            }
            // A range across checked blocks, starting and ending inside them.
            let got = read(&c, &path, (1000, 3 * block as u64, n as u64)).await;
            assert!(got.concat() == p[1000..1000 + 3 * block]);
            if v == ChunkVersion::Contiguous {
                assert_eq!(got.len(), 1);
            }
        }
    }

    #[tokio::test]
    async fn a_run_of_unchecked_blocks_between_checked_ones_is_checked_and_read() {
        let block = BLOCK_SIZE as usize;
        let n = 6 * block;
        let (_d, path, p) = object(n);
        let c = LocalChunks::default();
        // Check blocks 0 and 4, then read everything: mapped, checked, mapped, checked.
        for b in [0, 4] {
            read(&c, &path, ((b * block) as u64, block as u64, n as u64)).await;
        }
        let got = read(&c, &path, (0, n as u64, n as u64)).await;
        assert!(got.concat() == p);
        let lens: Vec<usize> = got.iter().map(Bytes::len).collect();
        assert_eq!(lens, [block, 3 * block, block, block]);
        let mapped: Vec<bool> = got
            .iter()
            .map(|b| crate::send_file::tests_source_of(b))
            .collect();
        assert_eq!(mapped, [true, false, true, false]);
    }

    #[tokio::test]
    async fn a_bad_block_is_refused_before_it_was_checked_and_nothing_is_appended() {
        let n = 3 * BLOCK_SIZE as usize;
        let (_d, path, _p) = object(n);
        let mut bytes = std::fs::read(&path).unwrap();
        let at = ChunkLayout::new(ChunkVersion::Contiguous, n as u64).offset_of(BLOCK_SIZE)
            as usize
            + 100;
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
        let mut w = ChunkWriter::new(ChunkVersion::Contiguous, n as u64);
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
        // A reference to a longer payload than the object's header declares.
        let other = c.read(&path, (0, 10, 200_000), &mut out).await;
        assert!(matches!(
            other,
            Err(ReadError::Corrupt(ChunkError::BadHeader { .. }))
        ));
        // A file cut short after its header.
        let bytes = std::fs::read(&path).unwrap();
        let cut = path.with_extension("cut");
        std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
        let short = c.read(&cut, (0, 10, 100_000), &mut out).await;
        assert!(matches!(
            short,
            Err(ReadError::Corrupt(ChunkError::Short { .. }))
        ));
        assert!(out.is_empty());
    }
}
