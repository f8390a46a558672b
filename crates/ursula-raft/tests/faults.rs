//! Storage-fault policies at the node level, through the faulty filesystem twin
//! (docs/storage.md): WAL sync failure, full disk, snapshot write failure.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ursula_core::{Command, Op, Reply, StreamKey};
use ursula_raft::{Node, NodeConfig, ProposeError, WalOptions};
use ursula_storage::fs::{EIO, FaultOp, FaultyFs};

const T: Duration = Duration::from_secs(60);

fn config(dir: &Path, fs: &FaultyFs, fsync: bool, snapshot_logs: u64) -> NodeConfig {
    NodeConfig {
        data_dir: dir.to_path_buf(),
        node_id: 1,
        group_count: 1,
        wal: WalOptions {
            segment_bytes: 1 << 20,
            fsync,
            fs: Arc::new(fs.clone()),
            ..Default::default()
        },
        snapshot_logs,
        snapshot_min_log_bytes: 64 << 20,
        listener: None,
        ..NodeConfig::new(dir)
    }
}

fn noop() -> Command {
    Command {
        now_ms: 1_000,
        op: Op::Noop,
    }
}

fn create(n: u32) -> Command {
    Command {
        now_ms: 1_000,
        op: Op::Create(Box::new(ursula_core::command::CreateReq {
            content_type: Some("text/plain".into()),
            ..ursula_core::command::CreateReq::new(StreamKey::new("test", &format!("s{n}")))
        })),
    }
}

async fn open(cfg: NodeConfig) -> Arc<Node> {
    tokio::time::timeout(T, Node::open(cfg))
        .await
        .expect("open timed out")
        .expect("open failed")
}

async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_wal_sync_is_outcome_unknown_then_storage_unavailable() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = FaultyFs::new();
    let node = open(config(tmp.path(), &fs, true, 20_000)).await;
    assert!(matches!(
        node.propose(0, create(1)).await,
        Ok(Ok(Reply::Created { .. }))
    ));
    // Every sync from now on fails: a background sync (upkeep, snapshot) may come first and
    // poison the WAL before the create's own sync, so the create is never acknowledged
    // either way: its outcome is unknown, or it was refused before reaching the log.
    fs.fail(FaultOp::Sync, 1, 1_000_000, EIO);
    let err = node.propose(0, create(2)).await.unwrap_err();
    assert!(
        matches!(
            err,
            ProposeError::OutcomeUnknown(_) | ProposeError::StorageUnavailable(_)
        ),
        "{err}"
    );
    let err = node.propose(0, noop()).await.unwrap_err();
    assert!(matches!(err, ProposeError::StorageUnavailable(_)), "{err}");
    assert!(node.storage_health().failed().is_some());
    node.shutdown().await;
    drop(node);
    // Recovery re-reads the disk: the acknowledged create is there.
    let node = open(config(tmp.path(), &FaultyFs::new(), true, 20_000)).await;
    let state = node.read(0, |st| st.streams.len());
    assert!(state == 1 || state == 2, "{state}");
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_writes_with_nothing_changed_and_heals_by_itself() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = FaultyFs::new();
    let node = open(config(tmp.path(), &fs, true, 20_000)).await;
    assert!(node.propose(0, create(1)).await.is_ok());
    fs.set_full(true);
    let health = Arc::clone(node.storage_health());
    wait_for("the free-space check to see the full disk", || {
        health.disk_full()
    })
    .await;
    let err = node.propose(0, create(2)).await.unwrap_err();
    assert!(matches!(err, ProposeError::InsufficientStorage(_)), "{err}");
    assert_eq!(node.read(0, |st| st.streams.len()), 1, "nothing changed");
    fs.set_full(false);
    wait_for("the disk to count as free again", || !health.disk_full()).await;
    assert!(node.propose(0, create(3)).await.is_ok());
    assert!(health.counts().no_space >= 1);
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_snapshot_write_is_retried_and_never_stops_the_group() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = FaultyFs::new();
    // The WAL does not sync here, so every rename is a snapshot file's.
    let node = open(config(tmp.path(), &fs, false, 10)).await;
    fs.fail(FaultOp::Rename, 1, 3, EIO);
    for _ in 0..30 {
        assert!(node.propose(0, noop()).await.is_ok(), "writes go on");
    }
    let health = Arc::clone(node.storage_health());
    wait_for("a snapshot write to fail", || {
        health.counts().snapshot_failures >= 1
    })
    .await;
    // Writes still go on while the snapshot is being retried.
    for _ in 0..10 {
        assert!(node.propose(0, noop()).await.is_ok(), "writes go on");
    }
    wait_for("the snapshot to be written on a retry", || {
        health.reasons().is_empty() && fs.count(FaultOp::Rename) > 3
    })
    .await;
    assert!(tmp.path().join("snapshots/group-0.snap").exists());
    assert!(node.propose(0, noop()).await.is_ok());
    node.shutdown().await;
}
