//! Preparing the next segment beside a live WAL, at a pace the WAL's syncs do not feel.
//!
//! The next segment is zero-filled ahead of time so that rotating to it is a rename and every
//! later `fdatasync` has only data to flush (writing inside an allocated, already-written file
//! changes no metadata). Written flat out, 64 MiB of zeros hold the disk for a quarter of a
//! second on the benchmark VM: every WAL sync meanwhile took 1.5 to 3.5 ms instead of about
//! 0.1 ms, and at 100 streams × 32 connections each rotation made about 1,500 appends slow,
//! enough on its own to lift that run's p99 from about 1 ms to 3.5 ms (docs/benchmarks.md,
//! session 27). Written in 256 KiB pieces, each synced, with pauses between them, the fill
//! leaves the disk to the WAL most of the time; a sync measured beside such a fill stayed
//! below 0.5 ms at p99.
//!
//! The pace follows the WAL: the fill aims to be done when the WAL has used half of the room
//! the active segment had when the fill began, at the rate the WAL has written since, and
//! never goes slower than [`MIN_RATE`]. A rotation that finds the fill unfinished tells it to
//! stop pausing and waits for it (`Shared::hurry_prepare`); a closing WAL stops it (the partial
//! file is deleted, as after any failed preparation).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use super::{Shared, spare};
use crate::fs::{FileSystem, OpenMode, ZeroFill};

/// Bytes written (and synced) between pauses.
pub(super) const CHUNK: usize = 256 << 10;
/// The slowest fill, in bytes per second: 64 MiB in two seconds (`Shared::prepare_min_rate`;
/// tests lower it).
pub(super) const MIN_RATE: u64 = 32 << 20;
/// Pauses are slept in slices this long, so that a closing WAL is noticed soon.
const SLICE: Duration = Duration::from_millis(10);
/// The WAL's rate is measured over at least this long (a fill's first chunks would otherwise
/// see a burst as the WAL's rate).
const MIN_WINDOW: Duration = Duration::from_millis(100);

/// How long to pause after a chunk of the fill.
///
/// `left`: bytes still to fill; `room`: bytes the active segment can still take; `wal_rate`:
/// bytes per second the WAL is writing; `min_rate`: the slowest fill; `took`: how long the
/// chunk's write and sync took.
pub(super) fn pause_after_chunk(
    chunk: u64,
    left: u64,
    room: u64,
    wal_rate: f64,
    min_rate: f64,
    took: Duration,
) -> Duration {
    if left == 0 || room == 0 {
        return Duration::ZERO;
    }
    let rate = if wal_rate > 0.0 {
        // Done when the WAL has used half of the room left.
        let time_left = room as f64 / wal_rate / 2.0;
        (left as f64 / time_left).max(min_rate)
    } else {
        min_rate
    };
    Duration::from_secs_f64(chunk as f64 / rate).saturating_sub(took)
}

/// What a fill watches: the WAL's bytes written and whether it is closing.
struct Pace {
    shared: Arc<Shared>,
    len: u64,
    started: Instant,
    written_at_start: u64,
    room_at_start: u64,
    chunk_started: Instant,
    /// Whether a spare coming free stops the fill (not while a spare is being readied).
    give_way_to_spares: bool,
}

impl Pace {
    fn after_chunk(&mut self, filled: u64) -> io::Result<()> {
        let closing = || {
            self.shared
                .closed
                .load(Ordering::Acquire)
                .then(|| io::Error::new(io::ErrorKind::Interrupted, "wal closed"))
        };
        if let Some(e) = closing() {
            return Err(e);
        }
        if self.give_way_to_spares && spare::any(&self.shared) {
            return Err(io::Error::other(SpareArrived));
        }
        if self.shared.hurry_prepare.load(Ordering::Acquire) {
            return Ok(());
        }
        let now = Instant::now();
        let wal_bytes = self
            .shared
            .written_bytes
            .load(Ordering::Relaxed)
            .saturating_sub(self.written_at_start);
        let window = now.duration_since(self.started).max(MIN_WINDOW);
        let pause = pause_after_chunk(
            CHUNK as u64,
            self.len.saturating_sub(filled),
            self.room_at_start.saturating_sub(wal_bytes),
            wal_bytes as f64 / window.as_secs_f64(),
            self.shared.prepare_min_rate.load(Ordering::Relaxed).max(1) as f64,
            now.duration_since(self.chunk_started),
        );
        let until = now + pause;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            thread::sleep(left.min(SLICE));
            if let Some(e) = closing() {
                return Err(e);
            }
            if self.shared.hurry_prepare.load(Ordering::Acquire) {
                break;
            }
        }
        self.chunk_started = Instant::now();
        Ok(())
    }
}

/// Why a fill stopped: a spare segment came free meanwhile, and the next segment is made of it.
#[derive(Debug)]
struct SpareArrived;

impl std::fmt::Display for SpareArrived {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a spare segment came free")
    }
}

impl std::error::Error for SpareArrived {}

/// The next segment: being prepared on a thread of its own, or ready.
pub(super) enum Next {
    Filling(thread::JoinHandle<io::Result<PathBuf>>),
    Ready(PathBuf),
}

impl Next {
    pub(super) fn is_finished(&self) -> bool {
        match self {
            Next::Filling(h) => h.is_finished(),
            Next::Ready(_) => true,
        }
    }

    /// The prepared file once it is durable (waits for a fill to end); `None` if it failed.
    pub(super) fn wait(self) -> Option<PathBuf> {
        match self {
            Next::Filling(h) => h.join().ok().and_then(Result::ok),
            Next::Ready(path) => Some(path),
        }
    }
}

/// Makes the next segment, of `len` bytes, at `path` on the calling thread: what a WAL with
/// no spare does before it serves (`Writer::prepare_before_serving`). A whole file left there
/// by the last run (a fill finishes before the WAL closes) is taken as it is, after a sync;
/// anything else is zero-filled flat out. Returns the path once the file is durable.
pub(super) fn now(fs: &dyn FileSystem, path: PathBuf, len: u64) -> io::Result<PathBuf> {
    if fs.exists(&path)? {
        let file = fs.open(&path, OpenMode::Write)?;
        if file.len()? == len {
            // Only its zeros matter, and a crash mid-fill leaves zeros or holes, which read
            // as zeros: recovery reads either as the end of the records.
            file.sync_all()?;
            return Ok(path);
        }
    }
    prepare_segment(fs, &path, len, ZeroFill::Bulk)?;
    Ok(path)
}

/// Starts preparing the next segment, of `len` bytes, on a thread of its own: a spare segment
/// if there is one (`spare`), else a file zero-filled at `path`, given up for a spare that
/// comes free meanwhile; `room`: bytes the active segment can still take. The thread returns
/// the prepared file's path once it is durable.
pub(super) fn spawn(shared: &Arc<Shared>, path: PathBuf, len: u64, room: u64) -> io::Result<Next> {
    shared.hurry_prepare.store(false, Ordering::Release);
    let now = Instant::now();
    let mut pace = Pace {
        shared: Arc::clone(shared),
        len,
        started: now,
        written_at_start: shared.written_bytes.load(Ordering::Relaxed),
        room_at_start: room,
        chunk_started: now,
        give_way_to_spares: true,
    };
    let fs = Arc::clone(&shared.fs);
    let shared = Arc::clone(shared);
    let filling = thread::Builder::new()
        .name("ursula-wal-prep".into())
        .spawn(move || {
            let from_spare = |spare: PathBuf, pace: &mut Pace| {
                tracing::debug!(path = %spare.display(), "wal: the next segment is a spare");
                pace.give_way_to_spares = false;
                spare::ready(fs.as_ref(), &spare, len, &mut |filled| {
                    pace.after_chunk(filled)
                })
                .map(|()| spare)
            };
            if let Some(spare) = spare::take(&shared) {
                return from_spare(spare, &mut pace);
            }
            let after = &mut |filled| pace.after_chunk(filled);
            let how = ZeroFill::Paced {
                chunk: CHUNK,
                after,
            };
            let filled = prepare_segment(fs.as_ref(), &path, len, how);
            match filled {
                Ok(()) => Ok(path),
                Err(e) if e.get_ref().is_some_and(|e| e.is::<SpareArrived>()) => {
                    match spare::take(&shared) {
                        Some(spare) => from_spare(spare, &mut pace),
                        None => Err(e),
                    }
                }
                Err(e) => Err(e),
            }
        })?;
    Ok(Next::Filling(filling))
}

/// Writes `len` zero bytes to `path` (flat out, or chunk by chunk as `how` says) and syncs it.
/// A failed (or stopped) preparation deletes the file.
fn prepare_segment(
    fs: &dyn FileSystem,
    path: &Path,
    len: u64,
    how: ZeroFill<'_>,
) -> io::Result<()> {
    let file = fs.open(path, OpenMode::CreateTruncate)?;
    let res = file.zero_fill(0, len, how).and_then(|()| file.sync_all());
    if res.is_err() {
        // Never leave a half-allocated file holding space a full disk needs.
        let _ = fs.remove_file(path);
    }
    res
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use crate::wal::segment::PREPARED_SEGMENT_NAME;
    use crate::wal::{Wal, WalOptions, WalRecord};

    const MIB: u64 = 1 << 20;
    const MIN: f64 = MIN_RATE as f64;

    /// A fresh WAL with segments of `segment_bytes`, and the directory holding it.
    fn open_wal(segment_bytes: u64) -> (tempfile::TempDir, Wal) {
        let tmp = tempfile::tempdir().unwrap();
        let opts = WalOptions {
            segment_bytes,
            ..Default::default()
        };
        let (wal, _) = Wal::open(tmp.path(), opts).unwrap();
        (tmp, wal)
    }

    fn rec(len: usize) -> WalRecord {
        WalRecord {
            group: 0,
            kind: 0,
            payload: vec![7; len],
        }
    }

    /// Rotates once (to the segment made before the WAL served), so that the next segment is
    /// filled in the background from here on, with the WAL seen as nearly idle: the record
    /// that rotates is small, so the fill goes at the slowest pace.
    fn rotate_once(wal: &Wal, rt: &tokio::runtime::Runtime, segment_bytes: u64) {
        let almost_full = segment_bytes as usize - (64 << 10);
        for len in [100, almost_full, 128 << 10] {
            rt.block_on(wal.append(vec![rec(len)])).unwrap();
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    }

    #[test]
    fn a_fresh_wal_makes_its_next_segment_before_it_serves() {
        let (tmp, wal) = open_wal(8 * MIB);
        let prepared = tmp.path().join(PREPARED_SEGMENT_NAME);
        // Already whole when `open` returned: no fill runs beside the first appends.
        assert_eq!(std::fs::metadata(&prepared).unwrap().len(), 8 * MIB);
        let rt = runtime();
        rotate_once(&wal, &rt, 8 * MIB);
        assert_eq!(wal.segments_reused(), 0);
        wal.close();
        // Without syncs there is no stall to spare, and no file is made.
        let tmp = tempfile::tempdir().unwrap();
        let opts = WalOptions {
            segment_bytes: 8 * MIB,
            fsync: false,
            ..Default::default()
        };
        let (wal, _) = Wal::open(tmp.path(), opts).unwrap();
        assert!(!tmp.path().join(PREPARED_SEGMENT_NAME).exists());
        wal.close();
    }

    #[test]
    fn a_restart_takes_the_next_segment_its_last_run_made() {
        let (tmp, wal) = open_wal(8 * MIB);
        wal.close();
        // Counts what a reopen of the same directory writes.
        let reopen = || {
            let faulty = crate::fs::FaultyFs::new();
            let opts = WalOptions {
                segment_bytes: 8 * MIB,
                fs: Arc::new(faulty.clone()),
                ..Default::default()
            };
            (Wal::open(tmp.path(), opts).unwrap().0, faulty)
        };
        let (wal, faulty) = reopen();
        // Nothing was zero-filled again: neither the active segment nor the next one.
        assert_eq!(faulty.count(crate::fs::FaultOp::Allocate), 0);
        let prepared = tmp.path().join(PREPARED_SEGMENT_NAME);
        assert_eq!(std::fs::metadata(&prepared).unwrap().len(), 8 * MIB);
        wal.close();
        // One cut short (a fill the last run did not finish) is filled again.
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&prepared)
            .unwrap();
        file.set_len(MIB).unwrap();
        let (wal, faulty) = reopen();
        assert_eq!(faulty.count(crate::fs::FaultOp::Allocate), 1);
        assert_eq!(std::fs::metadata(&prepared).unwrap().len(), 8 * MIB);
        wal.close();
    }

    #[test]
    fn a_rotation_does_not_wait_for_a_slow_paced_fill() {
        let (_tmp, wal) = open_wal(8 * MIB);
        // At 1 MiB/s the next segment's fill would take eight seconds.
        wal.inner
            .shared
            .prepare_min_rate
            .store(MIB, Ordering::Relaxed);
        let rt = runtime();
        rotate_once(&wal, &rt, 8 * MIB);
        // Larger than the room left: the active segment rotates now, mid-fill.
        let started = Instant::now();
        rt.block_on(wal.append(vec![rec(9 << 20)])).unwrap();
        let took = started.elapsed();
        assert!(
            took < Duration::from_millis(1500),
            "the rotation waited {took:?}"
        );
        wal.close();
    }

    #[test]
    fn closing_the_wal_stops_a_paced_fill_and_deletes_its_file() {
        let (tmp, wal) = open_wal(32 * MIB);
        rotate_once(&wal, &runtime(), 32 * MIB);
        let prepared = tmp.path().join(PREPARED_SEGMENT_NAME);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !prepared.exists() {
            assert!(
                Instant::now() < deadline,
                "the next segment was never started"
            );
            thread::sleep(Duration::from_millis(1));
        }
        // At the slowest pace the fill takes a second; closing must not wait for it.
        let closing = Instant::now();
        wal.close();
        assert!(
            closing.elapsed() < Duration::from_millis(500),
            "{:?}",
            closing.elapsed()
        );
        assert!(!prepared.exists(), "a stopped fill leaves no partial file");
    }

    #[test]
    fn an_idle_wal_gets_its_next_segment_at_the_slowest_pace() {
        let p = pause_after_chunk(CHUNK as u64, 64 * MIB, 64 * MIB, 0.0, MIN, Duration::ZERO);
        let expected = CHUNK as f64 / MIN;
        assert!((p.as_secs_f64() - expected).abs() < 1e-6, "{p:?}");
    }

    #[test]
    fn the_time_a_chunk_took_counts_against_its_pause() {
        let full = pause_after_chunk(CHUNK as u64, 64 * MIB, 64 * MIB, 0.0, MIN, Duration::ZERO);
        let less = pause_after_chunk(
            CHUNK as u64,
            64 * MIB,
            64 * MIB,
            0.0,
            MIN,
            Duration::from_millis(3),
        );
        assert_eq!(full - less, Duration::from_millis(3));
        let none = pause_after_chunk(CHUNK as u64, 64 * MIB, 64 * MIB, 0.0, MIN, full * 2);
        assert_eq!(none, Duration::ZERO);
    }

    #[test]
    fn a_busy_wal_makes_the_fill_finish_by_half_of_the_room_left() {
        // 100 MiB/s into 64 MiB of room: full in 0.64 s, so the fill (64 MiB) must go at
        // 200 MiB/s, above the slowest pace.
        let rate = 100.0 * MIB as f64;
        let p = pause_after_chunk(CHUNK as u64, 64 * MIB, 64 * MIB, rate, MIN, Duration::ZERO);
        let expected = CHUNK as f64 / (2.0 * rate);
        assert!((p.as_secs_f64() - expected).abs() < 1e-6, "{p:?}");
    }

    #[test]
    fn a_full_active_segment_or_a_finished_fill_does_not_pause() {
        let z = Duration::ZERO;
        assert_eq!(pause_after_chunk(CHUNK as u64, 8 * MIB, 0, 1e6, MIN, z), z);
        assert_eq!(pause_after_chunk(CHUNK as u64, 0, 8 * MIB, 1e6, MIN, z), z);
    }

    #[test]
    fn the_pause_never_exceeds_the_slowest_pace() {
        for room in [MIB, 64 * MIB, 1 << 40] {
            for rate in [0.0, 1.0, 1e3, 1e9] {
                let p = pause_after_chunk(CHUNK as u64, 64 * MIB, room, rate, MIN, Duration::ZERO);
                assert!(
                    p.as_secs_f64() <= CHUNK as f64 / MIN + 1e-9,
                    "{room} {rate}"
                );
            }
        }
    }
}
