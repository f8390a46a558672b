//! Spare segments end to end, and recovery of files that hold an earlier use's batches.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use super::segment::segment_file_name;
use super::*;
use crate::format::{SEGMENT_HEADER_LEN, SEGMENT_VERSION_V2, encode_segment_header_of};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

/// Equal records, so that every batch of one record has the same length and the batches of
/// two files lie at the same offsets.
fn numbered(n: u64) -> WalRecord {
    WalRecord {
        group: (n % 5) as u32,
        kind: 1,
        payload: (0..200).map(|i| (n as usize * 7 + i) as u8).collect(),
    }
}

fn append_blocking(wal: &Wal, records: Vec<WalRecord>) -> Lsn {
    let (tx, rx) = std::sync::mpsc::channel();
    wal.append_with(
        records,
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
    );
    rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap()
}

fn open(
    dir: &Path,
    segment_bytes: u64,
    fsync: bool,
) -> Result<(Wal, Vec<(Lsn, WalRecord)>), WalError> {
    Wal::open(
        dir,
        WalOptions {
            segment_bytes,
            fsync,
            ..Default::default()
        },
    )
}

fn files_ending(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_str().unwrap().ends_with(suffix))
        .collect();
    v.sort();
    v
}

fn inode(p: &Path) -> u64 {
    fs::metadata(p).unwrap().ino()
}

/// Waits (bounded) until `cond` holds.
fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn released_segments_become_spares_and_later_segments_are_made_of_them() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let seg = 64 << 10;
    let (wal, _) = open(dir, seg, true).unwrap();
    let mut lsn = 0;
    while wal.segment_count() < 5 {
        lsn = append_blocking(&wal, vec![numbered(lsn + 1)]);
    }
    // Release all but the active segment: two are kept as spares, the rest deleted (a fill
    // under way when they came free stops and takes one: it keeps its name until it is made
    // the next segment).
    wal.remove_segments_before(lsn + 1).unwrap();
    let spares = files_ending(dir, ".free");
    assert!(
        (spare::MAX_SPARES..=spare::MAX_SPARES + 1).contains(&spares.len()),
        "{spares:?}"
    );
    let spare_inodes: Vec<u64> = spares.iter().map(|p| inode(p)).collect();
    // The active segment holds the log from here on.
    let kept_from = first_lsn(&files_ending(dir, ".log")[0]);
    assert!(kept_from <= lsn);
    // The next segments are made of them (the one prepared before the release is used first).
    while wal.segment_count() < 4 {
        lsn = append_blocking(&wal, vec![numbered(lsn + 1)]);
        assert!(lsn < kept_from + 10_000, "no new segment");
    }
    wait_for("a segment made of a spare", || {
        files_ending(dir, ".log")
            .iter()
            .any(|p| spare_inodes.contains(&inode(p)))
    });
    // Fill the segments made of spares past their old contents' first batches, then read it
    // all back: the old batches after each segment's own are not records of the log.
    while wal.segment_count() < 6 {
        lsn = append_blocking(&wal, vec![numbered(lsn + 1)]);
    }
    wal.close();
    drop(wal);
    for _ in 0..2 {
        let (wal, recs) = open(dir, seg, true).unwrap();
        let lsns: Vec<Lsn> = recs.iter().map(|(l, _)| *l).collect();
        assert_eq!(lsns.first(), Some(&kept_from));
        assert_eq!(lsns.last(), Some(&lsn));
        assert_eq!(lsns.len() as u64, lsn - kept_from + 1);
        for (l, r) in &recs {
            assert_eq!(r, &numbered(*l));
        }
        lsn = append_blocking(&wal, vec![numbered(lsn + 1)]);
        wal.close();
    }
}

#[test]
fn without_syncs_released_segments_are_deleted() {
    let tmp = tempfile::tempdir().unwrap();
    let (wal, _) = open(tmp.path(), 64 << 10, false).unwrap();
    let mut lsn = 0;
    while wal.segment_count() < 3 {
        lsn = append_blocking(&wal, vec![numbered(lsn + 1)]);
    }
    wal.remove_segments_before(lsn + 1).unwrap();
    assert!(files_ending(tmp.path(), ".free").is_empty());
}

/// A directory of `count` sealed segments and a last one with a few records, written by the
/// WAL (no preallocation), and their paths.
fn sealed_segments(dir: &Path, count: usize) -> Vec<PathBuf> {
    let (wal, _) = open(dir, 16 << 10, false).unwrap();
    let mut lsn = 0;
    while wal.segment_count() < count + 1 {
        lsn = append_blocking(&wal, vec![numbered(lsn + 1)]);
    }
    for _ in 0..3 {
        lsn = append_blocking(&wal, vec![numbered(lsn + 1)]);
    }
    wal.close();
    files_ending(dir, ".log")
}

/// [`sealed_segments`] (three), and every record they hold, as recovery reads them.
fn sealed_segments_and_records(dir: &Path) -> (Vec<PathBuf>, Vec<(Lsn, WalRecord)>) {
    let segs = sealed_segments(dir, 3);
    let (wal, recs) = open(dir, 16 << 10, false).unwrap();
    wal.close();
    (segs, recs)
}

/// The first LSN in a segment file's header.
fn first_lsn(path: &Path) -> Lsn {
    crate::format::decode_segment_header(&fs::read(path).unwrap())
        .unwrap()
        .0
}

/// Makes segment `keep` the last one of `dir`, its own bytes followed by those of `stale` at
/// the same offsets (as a recycled file holds them), under a header of format `header` (or a
/// zeroed one).
fn with_stale_tail(dir: &Path, keep: usize, stale: &[u8], header: Option<u32>) -> (PathBuf, Lsn) {
    let segs = files_ending(dir, ".log");
    for extra in &segs[keep + 1..] {
        fs::remove_file(extra).unwrap();
    }
    let last = segs[keep].clone();
    let mut data = fs::read(&last).unwrap();
    let own = data.len();
    let first = first_lsn(&last);
    match header {
        Some(v) => data[..SEGMENT_HEADER_LEN].copy_from_slice(&encode_segment_header_of(v, first)),
        None => data[..SEGMENT_HEADER_LEN].fill(0),
    }
    data.extend_from_slice(stale.get(own..).unwrap_or_default());
    fs::write(&last, data).unwrap();
    (last, first)
}

#[test]
fn a_recycled_last_segment_ends_where_the_earlier_use_begins() {
    for misaligned in [0usize, 5] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let segs = sealed_segments(dir, 3);
        // Segment 0's bytes (lower LSNs) after the last segment's own, at a batch boundary
        // or inside a batch.
        let mut old = fs::read(&segs[0]).unwrap();
        old.drain(SEGMENT_HEADER_LEN..SEGMENT_HEADER_LEN + misaligned);
        let last_own = fs::read(&segs[3]).unwrap();
        assert!(old.len() > last_own.len() + 1000);
        let v3 = Some(crate::format::SEGMENT_VERSION);
        let (last, first) = with_stale_tail(dir, 3, &old, v3);
        let (wal, recs) = open(dir, 16 << 10, false).unwrap();
        let end = recs.last().unwrap().0;
        assert!(end >= first);
        assert_eq!(recs.len() as u64, end, "every record from LSN 1 on");
        // Appends go on after the segment's own records, and survive another recovery.
        assert_eq!(append_blocking(&wal, vec![numbered(end + 1)]), end + 1);
        wal.close();
        let (_wal, recs) = open(dir, 16 << 10, false).unwrap();
        assert_eq!(recs.last().unwrap(), &(end + 1, numbered(end + 1)));
        assert!(fs::metadata(&last).unwrap().len() >= last_own.len() as u64);
    }
}

#[test]
fn a_version_2_segment_with_an_earlier_batch_after_its_own_is_corrupt() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let segs = sealed_segments(dir, 3);
    let old = fs::read(&segs[0]).unwrap();
    with_stale_tail(dir, 3, &old, Some(SEGMENT_VERSION_V2));
    assert!(matches!(
        open(dir, 16 << 10, false),
        Err(WalError::Corrupt { .. })
    ));
}

#[test]
fn a_recycled_file_whose_new_header_never_landed_is_a_segment_torn_during_creation() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (segs, expected) = sealed_segments_and_records(dir);
    // The file made the next segment: its header zeroed, nothing of its own written, its
    // earlier contents (segment 0's) after.
    let last_first = expected.last().unwrap().0 + 1;
    let path = dir.join(segment_file_name(last_first));
    let mut data = fs::read(&segs[0]).unwrap();
    data[..SEGMENT_HEADER_LEN].fill(0);
    fs::write(&path, &data).unwrap();
    let (wal, recs) = open(dir, 16 << 10, false).unwrap();
    assert_eq!(recs, expected);
    assert_eq!(
        append_blocking(&wal, vec![numbered(last_first)]),
        last_first
    );
    wal.close();
}

#[test]
fn a_zeroed_header_before_batches_of_its_own_is_corruption_not_a_torn_creation() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    sealed_segments(dir, 3);
    let (last, _) = with_stale_tail(dir, 3, &[], None);
    let before = fs::read(&last).unwrap();
    assert!(matches!(
        open(dir, 16 << 10, false),
        Err(WalError::Corrupt { .. })
    ));
    assert_eq!(fs::read(&last).unwrap(), before, "nothing was cut");
}

#[test]
fn a_sealed_recycled_segment_whose_trim_was_lost_reads_to_its_own_end() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (segs, expected) = sealed_segments_and_records(dir);
    // Segment 1 still carries segment 0's later bytes after its own (its trim never reached
    // the disk): at a batch boundary, or inside a batch.
    for cut in [0usize, 7] {
        let own = fs::read(&segs[1]).unwrap();
        let mut data = own.clone();
        let old = fs::read(&segs[0]).unwrap();
        data.extend_from_slice(&old[(own.len() - cut).min(old.len())..]);
        fs::write(&segs[1], &data).unwrap();
        let (wal, recs) = open(dir, 16 << 10, false).unwrap();
        assert_eq!(recs[..expected.len()], expected[..]);
        wal.close();
        fs::write(&segs[1], &own).unwrap();
    }
    // Damage at the end of a sealed segment still shows: the next segment does not follow.
    let own = fs::read(&segs[1]).unwrap();
    fs::write(&segs[1], &own[..own.len() - 3]).unwrap();
    let Err(WalError::Corrupt { file, .. }) = open(dir, 16 << 10, false) else {
        panic!("a cut sealed segment must be corruption");
    };
    assert_eq!(file, segs[1]);
}

#[test]
fn readying_a_spare_zeroes_its_header_and_sizes_it_to_a_segment() {
    let tmp = tempfile::tempdir().unwrap();
    let fs_ = RealFs;
    let len = 3 * super::prepare::CHUNK as u64 + 100;
    // Cut short (a segment sealed early for a large append): filled up with zeros, paced.
    let short = tmp.path().join("wal-00000000000000000001.free");
    fs::write(&short, vec![0xAB; 5000]).unwrap();
    let mut paced = Vec::new();
    spare::ready(&fs_, &short, len, &mut |filled| {
        paced.push(filled);
        Ok(())
    })
    .unwrap();
    let data = fs::read(&short).unwrap();
    assert_eq!(data.len() as u64, len);
    assert!(data[..SEGMENT_HEADER_LEN].iter().all(|b| *b == 0));
    assert!(data[SEGMENT_HEADER_LEN..5000].iter().all(|b| *b == 0xAB));
    assert!(data[5000..].iter().all(|b| *b == 0));
    assert!(paced.len() >= 3, "{paced:?}");
    // Longer than a segment: cut to one.
    let long = tmp.path().join("wal-00000000000000000009.free");
    fs::write(&long, vec![0xCD; len as usize * 2]).unwrap();
    spare::ready(&fs_, &long, len, &mut |_| Ok(())).unwrap();
    assert_eq!(fs::metadata(&long).unwrap().len(), len);
    // A spare that cannot be readied is deleted.
    let gone = tmp.path().join("wal-00000000000000000010.free");
    fs::write(&gone, vec![1; 10]).unwrap();
    let stop = spare::ready(&fs_, &gone, len, &mut |_| Err(io::Error::other("stop")));
    assert!(stop.is_err());
    assert!(!gone.exists());
}
