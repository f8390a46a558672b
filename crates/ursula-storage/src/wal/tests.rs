#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use super::segment::{
    list_segments as list_segments_in, parse_segment_file_name, segment_file_name,
};
use super::*;
use crate::format::{
    BATCH_HEADER_LEN, RECORD_OVERHEAD, SEGMENT_HEADER_LEN, encode_record, encode_segment_header,
    encode_segment_header_v1, encoded_len,
};
use std::fs;

fn list_segments(dir: &Path) -> io::Result<Vec<(Lsn, PathBuf)>> {
    list_segments_in(&RealFs, dir)
}
use proptest::prelude::*;
use std::time::Duration;

fn test_opts(segment_bytes: u64) -> WalOptions {
    WalOptions {
        segment_bytes,
        fsync: false,
        ..Default::default()
    }
}

fn rec(group: u32, kind: u8, payload: &[u8]) -> WalRecord {
    WalRecord {
        group,
        kind,
        payload: payload.to_vec(),
    }
}

/// Deterministic, LSN-dependent record so tests can check content cheaply.
fn numbered(n: u64, len: usize) -> WalRecord {
    WalRecord {
        group: (n % 7) as u32,
        kind: (n % 3) as u8,
        payload: (0..len).map(|i| (n as usize * 31 + i) as u8).collect(),
    }
}

fn append_blocking(wal: &Wal, records: Vec<WalRecord>) -> Result<Lsn, WalError> {
    let (tx, rx) = std::sync::mpsc::channel();
    wal.append_with(
        records,
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
    );
    rx.recv_timeout(Duration::from_secs(10))
        .expect("append callback not called")
}

fn segment_files(dir: &Path) -> Vec<PathBuf> {
    list_segments(dir)
        .unwrap()
        .into_iter()
        .map(|(_, p)| p)
        .collect()
}

fn files_total_bytes(dir: &Path) -> u64 {
    segment_files(dir)
        .iter()
        .map(|p| fs::metadata(p).unwrap().len())
        .sum()
}

fn reopen(dir: &Path, segment_bytes: u64) -> Result<(Wal, Vec<(Lsn, WalRecord)>), WalError> {
    Wal::open(dir, test_opts(segment_bytes))
}

/// Writes `n` single-record appends of `len`-byte payloads, closes, and returns what was written.
fn write_numbered(dir: &Path, segment_bytes: u64, n: u64, len: usize) -> Vec<(Lsn, WalRecord)> {
    let (wal, existing) = reopen(dir, segment_bytes).unwrap();
    assert!(existing.is_empty());
    let mut out = Vec::new();
    for i in 1..=n {
        let r = numbered(i, len);
        assert_eq!(append_blocking(&wal, vec![r.clone()]).unwrap(), i);
        out.push((i, r));
    }
    wal.close();
    out
}

fn assert_corrupt(res: Result<(Wal, Vec<(Lsn, WalRecord)>), WalError>) -> (PathBuf, u64, String) {
    match res {
        Err(WalError::Corrupt {
            file,
            offset,
            reason,
        }) => (file, offset, reason),
        Err(e) => panic!("expected Corrupt, got {e}"),
        Ok((_, recs)) => panic!("expected Corrupt, got {} records", recs.len()),
    }
}

#[test]
fn fresh_directory_is_empty_wal() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("a/b/wal");
    let (wal, recs) = reopen(&dir, 1 << 20).unwrap();
    assert!(recs.is_empty());
    assert_eq!(wal.disk_bytes(), SEGMENT_HEADER_LEN as u64);
    assert_eq!(wal.segment_count(), 1);
    let files = segment_files(&dir);
    assert_eq!(files.len(), 1);
    assert!(files[0].ends_with("wal-00000000000000000001.log"));
    assert_eq!(append_blocking(&wal, vec![]).unwrap(), 0);
}

#[tokio::test]
async fn append_round_trip_and_lsn_continuity() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (wal, _) = Wal::open(dir, test_opts(1 << 20)).unwrap();
    let batch1 = vec![
        rec(1, 0, b"a"),
        rec(2, 1, b""),
        rec(u32::MAX, 255, &[7; 1000]),
    ];
    assert_eq!(wal.append(batch1.clone()).await.unwrap(), 3);
    assert_eq!(wal.append(vec![rec(9, 9, b"x")]).await.unwrap(), 4);
    assert_eq!(wal.append(vec![]).await.unwrap(), 4);
    // Two batches (the empty append writes nothing), each with its header.
    let expect_bytes = SEGMENT_HEADER_LEN as u64
        + (2 * BATCH_HEADER_LEN + 4 * RECORD_OVERHEAD + 1 + 1000 + 1) as u64;
    assert_eq!(wal.disk_bytes(), expect_bytes);
    drop(wal); // dropping the last handle closes it

    let (wal, recs) = Wal::open(dir, test_opts(1 << 20)).unwrap();
    let mut expected: Vec<(Lsn, WalRecord)> = batch1
        .into_iter()
        .enumerate()
        .map(|(i, r)| (i as u64 + 1, r))
        .collect();
    expected.push((4, rec(9, 9, b"x")));
    assert_eq!(recs, expected);
    assert_eq!(wal.disk_bytes(), expect_bytes);
    assert_eq!(
        wal.append(vec![rec(1, 1, b"y"), rec(1, 1, b"z")])
            .await
            .unwrap(),
        6
    );
    wal.close();

    let (_wal, recs) = Wal::open(dir, test_opts(1 << 20)).unwrap();
    assert_eq!(recs.len(), 6);
    assert_eq!(
        recs.iter().map(|(l, _)| *l).collect::<Vec<_>>(),
        vec![1, 2, 3, 4, 5, 6]
    );
}

#[test]
fn rotation_creates_named_segments_and_recovers() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let written = write_numbered(dir, 300, 40, 50);
    let files = segment_files(dir);
    // 71-byte records in 95-byte batches, 24-byte header: 2 appends per 300-byte segment.
    assert_eq!(files.len(), 20);
    let mut first = 1u64;
    for f in &files {
        let name = f.file_name().unwrap().to_str().unwrap();
        assert_eq!(name, segment_file_name(first));
        assert!(fs::metadata(f).unwrap().len() <= 300);
        first += 2;
    }
    let (wal, recs) = reopen(dir, 300).unwrap();
    assert_eq!(recs, written);
    assert_eq!(wal.disk_bytes(), files_total_bytes(dir));
    assert_eq!(wal.segment_count(), 20);
    assert_eq!(append_blocking(&wal, vec![numbered(41, 50)]).unwrap(), 41);
    assert_eq!(wal.disk_bytes(), files_total_bytes(dir));
}

#[test]
fn oversized_append_gets_its_own_segment_and_is_not_split() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (wal, _) = reopen(dir, 200).unwrap();
    append_blocking(&wal, vec![numbered(1, 10)]).unwrap();
    let big: Vec<WalRecord> = (2..=11).map(|i| numbered(i, 100)).collect();
    assert_eq!(append_blocking(&wal, big).unwrap(), 11);
    append_blocking(&wal, vec![numbered(12, 10)]).unwrap();
    wal.close();
    let names: Vec<String> = segment_files(dir)
        .iter()
        .map(|p| p.file_name().unwrap().to_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        names,
        vec![
            segment_file_name(1),
            segment_file_name(2),
            segment_file_name(12)
        ]
    );
    let (_wal, recs) = reopen(dir, 200).unwrap();
    assert_eq!(recs.len(), 12);
}

#[test]
fn torn_tail_at_every_byte_of_last_record() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // Two segments, so the torn record sits in the last of several.
    let written = write_numbered(dir, 400, 8, 40);
    let files = segment_files(dir);
    assert!(files.len() >= 2);
    let last = files.last().unwrap().clone();
    let original = fs::read(&last).unwrap();
    let last_start = original.len() - encoded_len(40) - BATCH_HEADER_LEN;
    for cut in last_start..original.len() {
        fs::write(&last, &original[..cut]).unwrap();
        let (wal, recs) = reopen(dir, 400).unwrap();
        assert_eq!(recs, written[..7], "cut at {cut}");
        assert_eq!(fs::metadata(&last).unwrap().len(), last_start as u64);
        assert_eq!(wal.disk_bytes(), files_total_bytes(dir));
        wal.close();
    }
    // And the WAL keeps working after the truncation, reusing the lost LSN.
    let (wal, _) = reopen(dir, 400).unwrap();
    assert_eq!(append_blocking(&wal, vec![numbered(8, 40)]).unwrap(), 8);
    wal.close();
    let (_wal, recs) = reopen(dir, 400).unwrap();
    assert_eq!(recs, written);
}

#[test]
fn torn_tail_of_zeros_or_partial_garbage_is_truncated() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let written = write_numbered(dir, 1 << 20, 5, 30);
    let last = segment_files(dir).pop().unwrap();
    let good_len = fs::metadata(&last).unwrap().len();

    let tails: Vec<Vec<u8>> = vec![vec![0; 4096], vec![0; 3], vec![0xff; 100], {
        // A partially written record followed by zeros (page written out of order).
        let mut buf = Vec::new();
        encode_record(&mut buf, 6, 1, 1, &[5; 200]);
        buf.truncate(50);
        buf.extend_from_slice(&[0; 500]);
        buf
    }];
    for tail in tails {
        let mut data = fs::read(&last).unwrap();
        data.extend_from_slice(&tail);
        fs::write(&last, &data).unwrap();
        let (wal, recs) = reopen(dir, 1 << 20).unwrap();
        assert_eq!(recs, written);
        let len = fs::metadata(&last).unwrap().len();
        if tail.iter().all(|b| *b == 0) {
            // An all-zero tail is the unwritten part of a preallocated segment: kept.
            assert!(len >= good_len);
        } else {
            assert_eq!(len, good_len);
        }
        wal.close();
    }
}

#[test]
fn preallocated_segments_keep_appending_after_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let opts = || WalOptions {
        segment_bytes: 64 * 1024,
        fsync: true,
        ..Default::default()
    };
    let (wal, _) = Wal::open(dir, opts()).unwrap();
    let mut written = Vec::new();
    for i in 0..40u64 {
        let rec = numbered(i, 3000);
        append_blocking(&wal, vec![rec.clone()]).unwrap();
        written.push((i + 1, rec));
    }
    wal.close();
    let (wal, recs) = Wal::open(dir, opts()).unwrap();
    assert_eq!(recs, written);
    let rec = numbered(99, 10);
    append_blocking(&wal, vec![rec.clone()]).unwrap();
    written.push((41, rec));
    wal.close();
    let (_wal, recs) = Wal::open(dir, opts()).unwrap();
    assert_eq!(recs, written);
}

#[test]
fn flipped_byte_in_middle_record_is_corruption() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_numbered(dir, 1 << 20, 5, 30);
    let last = segment_files(dir).pop().unwrap();
    let original = fs::read(&last).unwrap();
    let rec_len = encoded_len(30) + BATCH_HEADER_LEN;
    let second = SEGMENT_HEADER_LEN + rec_len;
    for i in second..second + rec_len {
        let mut bad = original.clone();
        bad[i] ^= 0x10;
        fs::write(&last, &bad).unwrap();
        let (file, offset, reason) = assert_corrupt(reopen(dir, 1 << 20));
        assert_eq!(file, last);
        assert_eq!(offset, second as u64, "flip at {i}: {reason}");
        // The file must not have been touched.
        assert_eq!(fs::read(&last).unwrap(), bad);
    }
}

#[test]
fn flipped_byte_in_sealed_segment_is_corruption() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_numbered(dir, 300, 9, 50);
    let files = segment_files(dir);
    assert_eq!(files.len(), 5);
    let first = &files[0];
    let original = fs::read(first).unwrap();
    // Even the last record of a sealed segment is protected.
    for i in [SEGMENT_HEADER_LEN + 3, original.len() - 1] {
        let mut bad = original.clone();
        bad[i] ^= 1;
        fs::write(first, &bad).unwrap();
        let (file, _, _) = assert_corrupt(reopen(dir, 300));
        assert_eq!(&file, first);
    }
    // A truncated sealed segment is corruption, not a torn tail.
    fs::write(first, &original[..original.len() - 5]).unwrap();
    assert_corrupt(reopen(dir, 300));
}

#[test]
fn damaged_last_record_alone_is_treated_as_torn() {
    // Documented limitation: bit rot in the very last record is indistinguishable from a torn
    // write, so the record is dropped.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let written = write_numbered(dir, 1 << 20, 3, 30);
    let last = segment_files(dir).pop().unwrap();
    let mut data = fs::read(&last).unwrap();
    let n = data.len();
    data[n - 1] ^= 1;
    fs::write(&last, &data).unwrap();
    let (_wal, recs) = reopen(dir, 1 << 20).unwrap();
    assert_eq!(recs, written[..2]);
}

#[test]
fn bad_headers_are_corruption() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_numbered(dir, 300, 6, 50);
    let files = segment_files(dir);
    for f in [&files[0], files.last().unwrap()] {
        let original = fs::read(f).unwrap();
        for (pos, what) in [(0, "magic"), (8, "version"), (14, "first lsn"), (21, "crc")] {
            let mut bad = original.clone();
            bad[pos] ^= 0x20;
            fs::write(f, &bad).unwrap();
            let (file, offset, reason) = assert_corrupt(reopen(dir, 300));
            assert_eq!(&file, f, "{what}");
            assert_eq!(offset, 0, "{what}: {reason}");
        }
        fs::write(f, &original).unwrap();
    }
    // A well-formed header whose first LSN disagrees with the file name.
    let f = files.last().unwrap();
    let mut data = fs::read(f).unwrap();
    data[..SEGMENT_HEADER_LEN].copy_from_slice(&encode_segment_header(99));
    fs::write(f, &data).unwrap();
    let (_, _, reason) = assert_corrupt(reopen(dir, 300));
    assert!(reason.contains("file name"), "{reason}");
}

#[test]
fn missing_segment_is_lsn_gap() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_numbered(dir, 300, 9, 50);
    let files = segment_files(dir);
    fs::remove_file(&files[1]).unwrap();
    let (file, offset, reason) = assert_corrupt(reopen(dir, 300));
    assert_eq!(file, files[2]);
    assert_eq!(offset, 0);
    assert!(reason.contains("gap"), "{reason}");
}

#[test]
fn non_increasing_or_skipping_lsn_is_corruption() {
    for lsns in [[1u64, 2, 2, 3], [1, 2, 4, 5], [1, 3, 2, 4], [2, 3, 4, 5]] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        // Bare records: a version-1 segment, as data directories written before version 2 hold.
        let mut data = encode_segment_header_v1(1).to_vec();
        let mut bad_at = None;
        for (i, lsn) in lsns.iter().enumerate() {
            if bad_at.is_none() && *lsn != i as u64 + 1 {
                bad_at = Some(data.len() as u64);
            }
            encode_record(&mut data, *lsn, 0, 0, b"payload");
        }
        fs::write(dir.join(segment_file_name(1)), &data).unwrap();
        let (_, offset, reason) = assert_corrupt(reopen(dir, 1 << 20));
        assert_eq!(Some(offset), bad_at, "{lsns:?}: {reason}");
    }
}

#[test]
fn segment_torn_during_creation_is_repaired() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let written = write_numbered(dir, 1 << 20, 4, 20);
    let next = dir.join(segment_file_name(5));
    for content in [
        vec![],
        vec![0u8; 10],
        vec![0u8; SEGMENT_HEADER_LEN],
        encode_segment_header(5)[..7].to_vec(),
    ] {
        fs::write(&next, &content).unwrap();
        let (wal, recs) = reopen(dir, 1 << 20).unwrap();
        assert_eq!(recs, written);
        assert_eq!(fs::read(&next).unwrap(), encode_segment_header(5));
        wal.close();
    }
    let (wal, _) = reopen(dir, 1 << 20).unwrap();
    assert_eq!(append_blocking(&wal, vec![numbered(5, 20)]).unwrap(), 5);
    wal.close();
    let (_wal, recs) = reopen(dir, 1 << 20).unwrap();
    assert_eq!(recs.len(), 5);

    // A torn-creation file with the wrong name for its position is still a gap.
    let tmp = tempfile::tempdir().unwrap();
    write_numbered(tmp.path(), 1 << 20, 4, 20);
    fs::write(tmp.path().join(segment_file_name(9)), []).unwrap();
    assert_corrupt(reopen(tmp.path(), 1 << 20));
}

#[test]
fn remove_segments_before_frees_only_sealed_fully_covered_segments() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let written = write_numbered(dir, 300, 20, 50); // segments start at 1,3,5,...,19
    let (wal, _) = reopen(dir, 300).unwrap();
    assert_eq!(wal.segment_count(), 10);
    let before = wal.disk_bytes();

    // Segment 1..=2 holds LSN 2, which is not < 2.
    assert_eq!(wal.remove_segments_before(2).unwrap(), 0);
    // LSN 3: segment [1,2] is entirely below it.
    let freed = wal.remove_segments_before(3).unwrap();
    assert_eq!(
        freed,
        (SEGMENT_HEADER_LEN + 2 * (BATCH_HEADER_LEN + encoded_len(50))) as u64
    );
    assert_eq!(wal.disk_bytes(), before - freed);
    assert_eq!(wal.disk_bytes(), files_total_bytes(dir));
    // LSN 12 removes [3,4] up to [9,10] but not [11,12].
    wal.remove_segments_before(12).unwrap();
    assert_eq!(
        segment_files(dir)[0].file_name().unwrap().to_str().unwrap(),
        segment_file_name(11)
    );
    // Never the active segment.
    wal.remove_segments_before(u64::MAX).unwrap();
    assert_eq!(wal.segment_count(), 1);
    assert_eq!(segment_files(dir).len(), 1);
    assert_eq!(wal.disk_bytes(), files_total_bytes(dir));
    assert_eq!(wal.remove_segments_before(u64::MAX).unwrap(), 0);
    wal.close();

    // Reopen: only the surviving records, LSNs continue.
    let (wal, recs) = reopen(dir, 300).unwrap();
    assert_eq!(recs, written[18..]);
    assert_eq!(append_blocking(&wal, vec![numbered(21, 50)]).unwrap(), 21);
    assert_eq!(wal.disk_bytes(), files_total_bytes(dir));
}

#[test]
fn lsn_survives_reopen_when_only_an_empty_segment_remains() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_numbered(dir, 100, 5, 60); // one record per segment
    let (wal, _) = reopen(dir, 100).unwrap();
    // One record per segment: this append rolls over into segment 6.
    assert_eq!(append_blocking(&wal, vec![numbered(6, 60)]).unwrap(), 6);
    wal.remove_segments_before(u64::MAX).unwrap();
    wal.close();
    let (wal, recs) = reopen(dir, 100).unwrap();
    assert_eq!(recs, vec![(6, numbered(6, 60))]);
    // Now with an empty active segment: truncate its only record as if torn.
    wal.close();
    let only = segment_files(dir).pop().unwrap();
    fs::write(&only, encode_segment_header(6)).unwrap();
    let (wal, recs) = reopen(dir, 100).unwrap();
    assert!(recs.is_empty());
    assert_eq!(append_blocking(&wal, vec![numbered(6, 1)]).unwrap(), 6);
}

#[test]
fn group_commit_shares_syncs_deterministically() {
    let tmp = tempfile::tempdir().unwrap();
    let (wal, _) = Wal::open(tmp.path(), test_opts(1 << 20)).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    {
        // Hold the writer right after it picks up the first request.
        let _gate = wal.inner.shared.gate.lock().unwrap();
        for i in 0..200u64 {
            let tx = tx.clone();
            wal.append_with(
                vec![numbered(i, 16)],
                Box::new(move |r| {
                    let _ = tx.send(r);
                }),
            );
        }
    }
    let mut lsns: Vec<Lsn> = (0..200)
        .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap())
        .collect();
    lsns.sort_unstable();
    assert_eq!(lsns, (1..=200).collect::<Vec<_>>());
    assert!(wal.sync_count() <= 2, "sync_count = {}", wal.sync_count());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_share_fsyncs() {
    let tmp = tempfile::tempdir().unwrap();
    let (wal, _) = Wal::open(
        tmp.path(),
        WalOptions {
            segment_bytes: 1 << 20,
            fsync: true,
            ..Default::default()
        },
    )
    .unwrap();
    let start = tokio::sync::Barrier::new(200);
    let start = Arc::new(start);
    let mut tasks = Vec::new();
    for i in 0..200u64 {
        let wal = wal.clone();
        let start = Arc::clone(&start);
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            wal.append(vec![numbered(i, 100), numbered(i + 1000, 10)])
                .await
        }));
    }
    let mut lsns = Vec::new();
    for t in tasks {
        lsns.push(t.await.unwrap().unwrap());
    }
    lsns.sort_unstable();
    assert_eq!(lsns, (1..=200).map(|i| 2 * i).collect::<Vec<_>>());
    let syncs = wal.sync_count();
    assert!(syncs < 100, "200 appends took {syncs} syncs");
    wal.close();
    let (_wal, recs) = Wal::open(tmp.path(), test_opts(1 << 20)).unwrap();
    assert_eq!(recs.len(), 400);
}

#[tokio::test]
async fn closed_wal_rejects_appends() {
    let tmp = tempfile::tempdir().unwrap();
    let (wal, _) = Wal::open(tmp.path(), test_opts(1 << 20)).unwrap();
    let other = wal.clone();
    assert_eq!(wal.append(vec![rec(1, 1, b"a")]).await.unwrap(), 1);
    wal.close();
    wal.close(); // idempotent
    assert!(matches!(
        other.append(vec![rec(1, 1, b"b")]).await,
        Err(WalError::Closed)
    ));
    assert!(matches!(
        append_blocking(&other, vec![rec(1, 1, b"c")]),
        Err(WalError::Closed)
    ));
    // The lock was released by close even though a handle is still alive.
    let (_wal2, recs) = Wal::open(tmp.path(), test_opts(1 << 20)).unwrap();
    assert_eq!(recs.len(), 1);
}

#[test]
fn second_open_of_same_directory_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let (wal, _) = reopen(tmp.path(), 1 << 20).unwrap();
    assert!(matches!(
        reopen(tmp.path(), 1 << 20),
        Err(WalError::Locked(_))
    ));
    drop(wal);
    reopen(tmp.path(), 1 << 20).unwrap();
}

#[test]
fn oversized_payload_is_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    let (wal, _) = reopen(tmp.path(), 1 << 20).unwrap();
    // Zeroed allocation is lazily mapped; the WAL only looks at its length.
    let huge = vec![0u8; MAX_PAYLOAD_LEN + 1];
    let res = append_blocking(
        &wal,
        vec![
            rec(1, 1, b"ok"),
            WalRecord {
                group: 1,
                kind: 1,
                payload: huge,
            },
        ],
    );
    assert!(matches!(res, Err(WalError::RecordTooLarge { .. })));
    assert_eq!(append_blocking(&wal, vec![rec(1, 1, b"ok")]).unwrap(), 1);
}

#[test]
fn panicking_callback_does_not_kill_writer() {
    let tmp = tempfile::tempdir().unwrap();
    let (wal, _) = reopen(tmp.path(), 1 << 20).unwrap();
    wal.append_with(
        vec![rec(1, 1, b"a")],
        Box::new(|_| panic!("callback panic (expected in test)")),
    );
    assert_eq!(append_blocking(&wal, vec![rec(1, 1, b"b")]).unwrap(), 2);
}

#[test]
fn close_from_callback_does_not_deadlock() {
    let tmp = tempfile::tempdir().unwrap();
    let (wal, _) = reopen(tmp.path(), 1 << 20).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let w = wal.clone();
    wal.append_with(
        vec![rec(1, 1, b"a")],
        Box::new(move |r| {
            w.close();
            drop(w);
            let _ = tx.send(r);
        }),
    );
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap(),
        1
    );
    assert!(matches!(
        append_blocking(&wal, vec![rec(1, 1, b"b")]),
        Err(WalError::Closed)
    ));
}

#[test]
fn segment_file_names_parse() {
    assert_eq!(parse_segment_file_name(&segment_file_name(1)), Some(1));
    assert_eq!(
        parse_segment_file_name(&segment_file_name(u64::MAX)),
        Some(u64::MAX)
    );
    assert_eq!(parse_segment_file_name("wal-1.log"), None);
    assert_eq!(
        parse_segment_file_name("wal-0000000000000000000x.log"),
        None
    );
    assert_eq!(
        parse_segment_file_name("wal-00000000000000000001.log.tmp"),
        None
    );
    assert_eq!(parse_segment_file_name("LOCK"), None);
}

#[derive(Clone, Debug)]
enum Op {
    Append(Vec<(u32, u8, Vec<u8>)>),
    /// Close and reopen.
    Reopen,
    /// Close, append the first `cut` bytes of an unacknowledged record (a torn write), reopen.
    TornReopen {
        payload_len: usize,
        cut: usize,
    },
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let record = (
        0u32..5,
        any::<u8>(),
        prop::collection::vec(any::<u8>(), 0..200),
    );
    prop_oneof![
        6 => prop::collection::vec(record, 0..6).prop_map(Op::Append),
        1 => Just(Op::Reopen),
        1 => (0usize..100, 0usize..200).prop_map(|(payload_len, cut)| Op::TornReopen { payload_len, cut }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_appends_and_reopens_preserve_exactly_what_was_appended(
        segment_bytes in 64u64..2048,
        ops in prop::collection::vec(op_strategy(), 1..25),
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let (mut wal, recs) = reopen(dir, segment_bytes).unwrap();
        prop_assert!(recs.is_empty());
        let mut model: Vec<(Lsn, WalRecord)> = Vec::new();
        for op in ops {
            match op {
                Op::Append(records) => {
                    let records: Vec<WalRecord> = records
                        .into_iter()
                        .map(|(group, kind, payload)| WalRecord { group, kind, payload })
                        .collect();
                    let lsn = append_blocking(&wal, records.clone()).unwrap();
                    for r in records {
                        model.push((model.len() as u64 + 1, r));
                    }
                    prop_assert_eq!(lsn, model.len() as u64);
                }
                Op::Reopen | Op::TornReopen { .. } => {
                    wal.close();
                    if let Op::TornReopen { payload_len, cut } = op {
                        let mut torn = Vec::new();
                        encode_record(&mut torn, model.len() as u64 + 1, 1, 1, &vec![0xab; payload_len]);
                        torn.truncate(cut.min(torn.len() - 1));
                        let last = segment_files(dir).pop().unwrap();
                        let mut data = fs::read(&last).unwrap();
                        data.extend_from_slice(&torn);
                        fs::write(&last, &data).unwrap();
                    }
                    let (w, recs) = reopen(dir, segment_bytes).unwrap();
                    prop_assert_eq!(&recs, &model);
                    prop_assert_eq!(w.disk_bytes(), files_total_bytes(dir));
                    wal = w;
                }
            }
        }
        wal.close();
        let (_w, recs) = reopen(dir, segment_bytes).unwrap();
        prop_assert_eq!(&recs, &model);
    }
}

#[test]
fn lsn_overflow_is_corruption_not_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let mut data = encode_segment_header_v1(u64::MAX).to_vec();
    encode_record(&mut data, u64::MAX, 0, 0, b"last");
    fs::write(tmp.path().join(segment_file_name(u64::MAX)), &data).unwrap();
    assert_corrupt(reopen(tmp.path(), 1 << 20));

    let tmp = tempfile::tempdir().unwrap();
    fs::write(
        tmp.path().join(segment_file_name(u64::MAX)),
        encode_segment_header(u64::MAX),
    )
    .unwrap();
    let (wal, recs) = reopen(tmp.path(), 1 << 20).unwrap();
    assert!(recs.is_empty());
    assert!(matches!(
        append_blocking(&wal, vec![rec(1, 1, b"x")]),
        Err(WalError::Poisoned(_))
    ));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Recovery never panics on arbitrary segment contents, and either succeeds or reports
    /// corruption.
    #[test]
    fn recovery_never_panics_on_arbitrary_bytes(
        name_lsn in prop_oneof![Just(1u64), Just(u64::MAX), any::<u64>()],
        valid_header in any::<bool>(),
        records in 0u64..4,
        garbage in prop::collection::vec(any::<u8>(), 0..300),
        sealed_before in any::<bool>(),
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let mut data = if valid_header {
            encode_segment_header(name_lsn).to_vec()
        } else {
            Vec::new()
        };
        for i in 0..records {
            encode_record(&mut data, name_lsn.wrapping_add(i), 0, 0, b"p");
        }
        data.extend_from_slice(&garbage);
        if sealed_before && name_lsn > 1 {
            fs::write(dir.join(segment_file_name(name_lsn - 1)), encode_segment_header(name_lsn - 1)).unwrap();
        }
        fs::write(dir.join(segment_file_name(name_lsn)), &data).unwrap();
        match reopen(dir, 1 << 20) {
            Ok((wal, _)) => {
                prop_assert_eq!(wal.disk_bytes(), files_total_bytes(dir));
            }
            Err(WalError::Corrupt { .. }) => {}
            Err(e) => prop_assert!(false, "unexpected error {}", e),
        }
    }
}

#[test]
fn remove_segments_concurrently_with_appends() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (wal, _) = reopen(dir, 256).unwrap();
    let writer = {
        let wal = wal.clone();
        std::thread::spawn(move || {
            for i in 1..=300u64 {
                assert_eq!(append_blocking(&wal, vec![numbered(i, 40)]).unwrap(), i);
            }
        })
    };
    let mut freed = 0;
    while !writer.is_finished() {
        freed += wal.remove_segments_before(u64::MAX).unwrap();
        std::thread::yield_now();
    }
    writer.join().unwrap();
    freed += wal.remove_segments_before(u64::MAX).unwrap();
    assert!(freed > 0);
    assert_eq!(wal.segment_count(), 1);
    assert_eq!(wal.disk_bytes(), files_total_bytes(dir));
    wal.close();
    let (_wal, recs) = reopen(dir, 256).unwrap();
    assert_eq!(recs.last().map(|(l, _)| *l), Some(300));
    assert_eq!(recs.first().map(|(l, _)| *l), Some(301 - recs.len() as u64));
}

#[test]
fn completions_run_on_the_given_runtime_in_commit_order() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("deliver-rt")
        .build()
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let (wal, _) = Wal::open(
        tmp.path(),
        WalOptions {
            deliver_on: Some(rt.handle().clone()),
            ..test_opts(1 << 20)
        },
    )
    .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    for i in 0..300u64 {
        let tx = tx.clone();
        wal.append_with(
            vec![numbered(i, 16)],
            Box::new(move |r| {
                let thread = thread::current().name().map(str::to_owned);
                let _ = tx.send((r.unwrap(), thread));
            }),
        );
    }
    let got: Vec<(Lsn, Option<String>)> = (0..300)
        .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap())
        .collect();
    let lsns: Vec<Lsn> = got.iter().map(|(l, _)| *l).collect();
    assert_eq!(
        lsns,
        (1..=300).collect::<Vec<_>>(),
        "completed out of order"
    );
    for (_, thread) in &got {
        assert_eq!(thread.as_deref(), Some("deliver-rt"));
    }

    // Once the runtime is gone, appends still complete, with their true result, on the
    // writer thread; they never hang.
    drop(rt);
    let res = append_blocking(&wal, vec![numbered(301, 16)]);
    assert_eq!(res.unwrap(), 301);
    assert_eq!(append_blocking(&wal, vec![numbered(302, 16)]).unwrap(), 302);
}
