//! A data directory whose WAL is in format version 1 (bare records, as every node wrote before
//! batches) still starts, keeps its state, and takes writes.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::path::Path;
use std::time::Duration;

use ursula_core::command::CreateReq;
use ursula_core::{Command, Op, StreamKey};
use ursula_raft::{Node, NodeConfig, WalOptions};

fn config(dir: &Path) -> NodeConfig {
    NodeConfig {
        data_dir: dir.to_path_buf(),
        node_id: 1,
        group_count: 2,
        wal: WalOptions {
            segment_bytes: 1 << 20,
            ..Default::default()
        },
        snapshot_logs: 20_000,
        snapshot_min_log_bytes: 64 << 20,
        listener: None,
        ..NodeConfig::new(dir)
    }
}

fn create(n: u32) -> Command {
    Command {
        now_ms: 1_000,
        op: Op::Create(Box::new(CreateReq {
            content_type: Some("text/plain".into()),
            ..CreateReq::new(StreamKey::new("test", &format!("s{n}")))
        })),
    }
}

async fn open(dir: &Path) -> std::sync::Arc<Node> {
    tokio::time::timeout(Duration::from_secs(60), Node::open(config(dir)))
        .await
        .expect("open timed out")
        .expect("open failed")
}

/// Rewrites a version-2 segment as version 1 wrote it: the same records, bare (the batch
/// headers dropped), under a version-1 segment header; the preallocated zeros stay.
fn to_version_1(path: &Path) {
    let v2 = std::fs::read(path).unwrap();
    let mut v1 = v2[..24].to_vec();
    v1[8..12].copy_from_slice(&1u32.to_le_bytes());
    let crc = crc32c::crc32c(&v1[..20]);
    v1[20..24].copy_from_slice(&crc.to_le_bytes());
    let mut off = 24;
    while off + 24 <= v2.len() && v2[off..off + 4] == 0xFFFF_FFB1u32.to_le_bytes() {
        let len = u32::from_le_bytes(v2[off + 4..off + 8].try_into().unwrap()) as usize;
        v1.extend_from_slice(&v2[off + 24..off + 24 + len]);
        off += 24 + len;
    }
    assert!(off > 24, "{} held no batch", path.display());
    v1.resize(v2.len(), 0);
    std::fs::write(path, v1).unwrap();
}

fn stream_count(node: &Node) -> usize {
    (0..node.group_count())
        .map(|g| node.read(g, |st| st.streams.len()))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_data_directory_starts_and_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let node = open(tmp.path()).await;
    for n in 0..20 {
        let key = StreamKey::new("test", &format!("s{n}"));
        node.propose(key.group(2), create(n))
            .await
            .unwrap()
            .unwrap();
    }
    node.shutdown().await;
    drop(node);
    let wal = tmp.path().join("wal");
    let mut converted = 0;
    for e in std::fs::read_dir(&wal).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "log") {
            to_version_1(&p);
            converted += 1;
        }
    }
    assert_eq!(converted, 1);

    let node = open(tmp.path()).await;
    assert_eq!(stream_count(&node), 20);
    for n in 20..30 {
        let key = StreamKey::new("test", &format!("s{n}"));
        node.propose(key.group(2), create(n))
            .await
            .unwrap()
            .unwrap();
    }
    node.shutdown().await;
    drop(node);
    let node = open(tmp.path()).await;
    assert_eq!(stream_count(&node), 30);
    node.shutdown().await;
}
