//! The storage-fault policies of the WAL, driven through [`FaultyFs`] (see docs/storage.md).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::segment::{PREPARED_SEGMENT_NAME, segment_file_name};
use super::*;
use crate::format::{
    BATCH_HEADER_LEN, SEGMENT_HEADER_LEN, encode_record, encode_segment_header_v1,
};
use crate::fs::{EIO, ENOSPC, FaultOp, FaultyFs};

/// Syncing options through `fs` (preallocation on, small segments).
fn opts(fs: &FaultyFs, segment_bytes: u64) -> WalOptions {
    WalOptions {
        segment_bytes,
        fsync: true,
        fs: Arc::new(fs.clone()),
        reserve_bytes: 0,
        ..Default::default()
    }
}

fn rec(n: u64) -> WalRecord {
    WalRecord {
        group: (n % 3) as u32,
        kind: 1,
        payload: format!("record {n}").into_bytes(),
    }
}

/// Submits an append and returns the channel its result arrives on.
fn submit(wal: &Wal, records: Vec<WalRecord>) -> mpsc::Receiver<Result<Lsn, WalError>> {
    let (tx, rx) = mpsc::channel();
    wal.append_with(
        records,
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
    );
    rx
}

fn append(wal: &Wal, n: u64) -> Result<Lsn, WalError> {
    submit(wal, vec![rec(n)])
        .recv_timeout(Duration::from_secs(10))
        .expect("append completes")
}

/// Waits (bounded) until `cond` holds.
fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn reopen_real(dir: &Path) -> Vec<(Lsn, WalRecord)> {
    let (wal, recs) = Wal::open(dir, WalOptions::default()).unwrap();
    wal.close();
    recs
}

#[test]
fn a_failed_sync_is_never_acknowledged_and_poisons_the_wal() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = FaultyFs::new();
    let (wal, _) = Wal::open(tmp.path(), opts(&fs, 1 << 16)).unwrap();
    for n in 1..=3 {
        assert_eq!(append(&wal, n).unwrap(), n);
    }
    assert!(wal.health().failed().is_none());
    // The active segment's sync, not the background preparation's of the next segment.
    let active = tmp.path().join(segment_file_name(1));
    fs.fail_at(FaultOp::Sync, &active, 1, 1, EIO);
    let err = append(&wal, 4).unwrap_err();
    assert!(matches!(err, WalError::SyncFailed(_)), "{err}");
    // Nothing more is taken, even though the next sync would succeed.
    assert!(matches!(append(&wal, 5), Err(WalError::Poisoned(_))));
    let health = wal.health();
    assert!(health.failed().is_some_and(|r| r.contains("sync")));
    assert_eq!(health.counts().sync_failures, 1);
    assert!(
        health
            .reasons()
            .iter()
            .any(|r| r.starts_with("storage failed"))
    );
    wal.close();
    // Every acknowledged record is there; the unknown one may be.
    let recs = reopen_real(tmp.path());
    assert!(recs.len() == 3 || recs.len() == 4, "{}", recs.len());
    assert_eq!(
        recs[..3].iter().map(|(l, _)| *l).collect::<Vec<_>>(),
        [1, 2, 3]
    );
}

#[test]
fn a_failed_write_poisons_the_wal() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = FaultyFs::new();
    let (wal, _) = Wal::open(tmp.path(), opts(&fs, 1 << 16)).unwrap();
    assert_eq!(append(&wal, 1).unwrap(), 1);
    fs.fail(FaultOp::Write, 1, 1, EIO);
    assert!(matches!(append(&wal, 2), Err(WalError::SyncFailed(_))));
    assert!(matches!(append(&wal, 3), Err(WalError::Poisoned(_))));
    assert_eq!(wal.health().counts().write_failures, 1);
    wal.close();
    assert_eq!(reopen_real(tmp.path()).len(), 1);
}

#[test]
fn a_full_disk_holds_the_batch_and_resumes_by_itself() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = FaultyFs::new();
    let (wal, _) = Wal::open(tmp.path(), opts(&fs, 1 << 16)).unwrap();
    assert_eq!(append(&wal, 1).unwrap(), 1);
    fs.set_full(true);
    let held = submit(&wal, vec![rec(2)]);
    wait_for("the writer to find the disk full", || {
        wal.health().disk_full()
    });
    assert!(
        wal.health()
            .reasons()
            .iter()
            .any(|r| r.contains("disk full"))
    );
    assert!(
        held.recv_timeout(Duration::from_millis(100)).is_err(),
        "held, not failed"
    );
    let queued = submit(&wal, vec![rec(3)]);
    fs.set_full(false);
    assert_eq!(
        held.recv_timeout(Duration::from_secs(5)).unwrap().unwrap(),
        2
    );
    assert_eq!(
        queued
            .recv_timeout(Duration::from_secs(5))
            .unwrap()
            .unwrap(),
        3
    );
    assert!(!wal.health().disk_full());
    assert!(wal.health().failed().is_none());
    assert_eq!(wal.health().counts().no_space, 1);
    wal.close();
    assert_eq!(reopen_real(tmp.path()).len(), 3);
}

#[test]
fn enospc_from_a_sync_is_a_sync_failure_not_a_full_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = FaultyFs::new();
    let (wal, _) = Wal::open(tmp.path(), opts(&fs, 1 << 16)).unwrap();
    let active = tmp.path().join(segment_file_name(1));
    fs.fail_at(FaultOp::Sync, &active, 1, 1, ENOSPC);
    assert!(matches!(append(&wal, 1), Err(WalError::SyncFailed(_))));
    assert!(wal.health().failed().is_some());
}

#[test]
fn a_full_disk_at_rotation_is_retried_and_the_prepared_segment_given_back() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = FaultyFs::new();
    // Room for a few appends per segment.
    let (wal, _) = Wal::open(tmp.path(), opts(&fs, 200)).unwrap();
    assert_eq!(append(&wal, 1).unwrap(), 1);
    let prepared = tmp.path().join(PREPARED_SEGMENT_NAME);
    wait_for("the next segment to be prepared", || prepared.exists());
    // The adoption (rename) and the fallback (create) both find the disk full, twice.
    fs.fail(FaultOp::Rename, 1, 2, ENOSPC);
    fs.fail(FaultOp::Create, 1, 2, ENOSPC);
    let mut n = 2;
    while wal.segment_count() == 1 {
        assert!(n < 20, "never rotated");
        assert_eq!(append(&wal, n).unwrap(), n);
        n += 1;
    }
    assert!(wal.health().counts().no_space >= 1);
    assert!(!wal.health().disk_full());
    wal.close();
    assert_eq!(reopen_real(tmp.path()).len() as u64, n - 1);
}

#[test]
fn preallocation_never_takes_the_reserve() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = FaultyFs::new();
    fs.set_full(true);
    // A fresh directory still gets its first (small) segment when creation itself succeeds:
    // only allocation is refused here.
    fs.set_full(false);
    let mut o = opts(&fs, 1 << 20);
    o.reserve_bytes = u64::MAX / 2; // no filesystem has that much free
    let (wal, _) = Wal::open(tmp.path(), o).unwrap();
    let seg = tmp.path().join(segment_file_name(1));
    assert_eq!(
        std::fs::metadata(&seg).unwrap().len(),
        SEGMENT_HEADER_LEN as u64
    );
    assert!(!tmp.path().join(PREPARED_SEGMENT_NAME).exists());
    assert_eq!(append(&wal, 1).unwrap(), 1);
    // The free-space check reports the disk full while below the reserve.
    wal.check_space();
    assert!(wal.health().disk_full());
    wal.close();
}

#[test]
fn check_space_follows_the_free_space() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = FaultyFs::new();
    let mut o = opts(&fs, 1 << 16);
    o.reserve_bytes = 1;
    let (wal, _) = Wal::open(tmp.path(), o).unwrap();
    wal.check_space();
    assert!(!wal.health().disk_full());
    fs.set_full(true);
    wal.check_space();
    assert!(wal.health().disk_full());
    fs.set_full(false);
    wal.check_space();
    assert!(!wal.health().disk_full());
    wal.close();
}

#[test]
fn start_up_on_a_full_disk_serves_what_is_there() {
    let tmp = tempfile::tempdir().unwrap();
    {
        let fs = FaultyFs::new();
        let (wal, _) = Wal::open(tmp.path(), opts(&fs, 1 << 16)).unwrap();
        for n in 1..=5 {
            append(&wal, n).unwrap();
        }
        wal.close();
    }
    // Trim the active segment so that reopening would want to preallocate it again.
    let seg = tmp.path().join(segment_file_name(1));
    let len = std::fs::metadata(&seg).unwrap().len();
    let used = std::fs::read(&seg)
        .unwrap()
        .iter()
        .rposition(|b| *b != 0)
        .unwrap()
        + 1;
    assert!(used < len as usize);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&seg)
        .unwrap()
        .set_len(used as u64)
        .unwrap();
    let _ = std::fs::remove_file(tmp.path().join(PREPARED_SEGMENT_NAME));

    let fs = FaultyFs::new();
    fs.set_full(true);
    let mut o = opts(&fs, 1 << 16);
    o.reserve_bytes = 1;
    let (wal, recs) = Wal::open(tmp.path(), o).unwrap();
    assert_eq!(recs.len(), 5);
    wal.check_space();
    assert!(wal.health().disk_full());
    wal.close();
}

#[test]
fn a_failed_sync_of_the_replayed_tail_refuses_to_start() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = FaultyFs::new();
    let (wal, _) = Wal::open(tmp.path(), opts(&fs, 1 << 16)).unwrap();
    append(&wal, 1).unwrap();
    wal.close();
    fs.fail(FaultOp::Sync, 1, 1, EIO);
    let err = Wal::open(tmp.path(), opts(&fs, 1 << 16)).unwrap_err();
    assert!(matches!(err, WalError::Io(_)), "{err}");
    // Once the disk behaves, it starts.
    let (_wal, recs) = Wal::open(tmp.path(), opts(&fs, 1 << 16)).unwrap();
    assert_eq!(recs.len(), 1);
}

/// Writes `n` appends of one record each (one batch each) and returns the segment's bytes.
fn write_batches(dir: &Path, n: u64) -> Vec<u8> {
    let (wal, _) = Wal::open(
        dir,
        WalOptions {
            fsync: false,
            ..Default::default()
        },
    )
    .unwrap();
    for i in 1..=n {
        append(&wal, i).unwrap();
    }
    wal.close();
    std::fs::read(dir.join(segment_file_name(1))).unwrap()
}

/// Offsets of the batches of a version-2 segment.
fn batch_offsets(data: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut off = SEGMENT_HEADER_LEN;
    while let Ok((_, len)) = crate::format::decode_batch(data, off) {
        out.push(off);
        off += len;
    }
    out
}

#[test]
fn a_last_batch_with_a_lost_earlier_page_and_a_kept_later_one_is_dropped_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // One big last batch of several records, as a group commit writes it.
    let (wal, _) = Wal::open(
        dir,
        WalOptions {
            fsync: false,
            ..Default::default()
        },
    )
    .unwrap();
    append(&wal, 1).unwrap();
    append(&wal, 2).unwrap();
    let big: Vec<WalRecord> = (3..=12)
        .map(|n| WalRecord {
            group: 0,
            kind: 1,
            payload: vec![n as u8; 500],
        })
        .collect();
    submit(&wal, big).recv().unwrap().unwrap();
    wal.close();
    let path = dir.join(segment_file_name(1));
    let data = std::fs::read(&path).unwrap();
    let last = *batch_offsets(&data).last().unwrap();
    // The earlier "page" of the last batch (its header and first records) never reached the
    // disk; a later one (the last records, each valid on its own) did.
    let mut damaged = data.clone();
    damaged[last..last + 2000].fill(0);
    std::fs::write(&path, &damaged).unwrap();
    let (wal, recs) = Wal::open(dir, WalOptions::default()).unwrap();
    assert_eq!(recs.iter().map(|(l, _)| *l).collect::<Vec<_>>(), [1, 2]);
    // The tail was cut durably, and the WAL goes on from LSN 3.
    let after = std::fs::read(&path).unwrap();
    assert!(
        after[last..].iter().all(|b| *b == 0),
        "the torn batch is gone"
    );
    assert_eq!(append(&wal, 3).unwrap(), 3);
    wal.close();
}

#[test]
fn damage_followed_by_a_whole_batch_is_refused_and_repair_cuts_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let data = write_batches(dir, 6);
    let offs = batch_offsets(&data);
    assert_eq!(offs.len(), 6);
    let path = dir.join(segment_file_name(1));
    let mut bad = data.clone();
    bad[offs[2] + BATCH_HEADER_LEN + 10] ^= 0x55;
    std::fs::write(&path, &bad).unwrap();
    let err = Wal::open(dir, WalOptions::default()).unwrap_err();
    let WalError::Corrupt { offset, reason, .. } = err else {
        panic!("expected corruption, got {err}");
    };
    assert_eq!(offset as usize, offs[2]);
    assert!(reason.contains("followed by a whole batch"), "{reason}");

    let dry = repair(dir, true).unwrap();
    assert!(dry.dry_run && dry.dropped_acknowledged());
    assert_eq!(
        std::fs::read(&path).unwrap(),
        bad,
        "a dry run changes nothing"
    );
    let report = repair(dir, false).unwrap();
    assert_eq!(report.records, 2);
    assert_eq!(report.next_lsn, 3);
    assert!(matches!(
        &report.actions[..],
        [RepairAction::Cut { offset, .. }] if *offset as usize == offs[2]
    ));
    let (_wal, recs) = Wal::open(dir, WalOptions::default()).unwrap();
    assert_eq!(recs.len(), 2);
}

#[test]
fn version_1_segments_stay_readable_and_are_continued() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // A data directory as version 1 wrote it: a sealed segment and an active one, bare records.
    let mut first = encode_segment_header_v1(1).to_vec();
    for lsn in 1..=3 {
        let _ = encode_record(&mut first, lsn, 0, 1, format!("v1 {lsn}").as_bytes());
    }
    let mut second = encode_segment_header_v1(4).to_vec();
    let _ = encode_record(&mut second, 4, 1, 1, b"v1 4");
    second.resize(second.len() + 512, 0); // preallocated zeros
    std::fs::write(dir.join(segment_file_name(1)), &first).unwrap();
    std::fs::write(dir.join(segment_file_name(4)), &second).unwrap();

    let o = || WalOptions {
        segment_bytes: 700,
        ..Default::default()
    };
    let (wal, recs) = Wal::open(dir, o()).unwrap();
    assert_eq!(recs.len(), 4);
    assert_eq!(recs[3].1.payload, b"v1 4");
    // Appends continue the version-1 segment in its own framing, then rotate into version 2.
    for n in 5..=60 {
        assert_eq!(append(&wal, n).unwrap(), n);
    }
    assert!(wal.segment_count() > 2);
    wal.close();
    let (_wal, recs) = Wal::open(dir, o()).unwrap();
    assert_eq!(
        recs.iter().map(|(l, _)| *l).collect::<Vec<_>>(),
        (1..=60).collect::<Vec<_>>()
    );
    let head = std::fs::read(dir.join(segment_file_name(4))).unwrap();
    assert_eq!(crate::format::decode_segment_header(&head).unwrap().1, 1);
}
