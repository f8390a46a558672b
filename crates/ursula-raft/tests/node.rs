#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ursula_core::command::{AppendReq, CreateReq};
use ursula_core::{Command, GroupState, Op, Reply, StreamKey};
use ursula_raft::{Node, NodeConfig, ProposeError, RaftError, WalOptions};

const T: Duration = Duration::from_secs(60);

fn config(dir: &Path, groups: u32, fsync: bool) -> NodeConfig {
    NodeConfig {
        data_dir: dir.to_path_buf(),
        node_id: 1,
        group_count: groups,
        wal: WalOptions {
            segment_bytes: 64 << 20,
            fsync,
            ..Default::default()
        },
        snapshot_logs: 20_000,
        snapshot_min_log_bytes: 64 << 20,
        listener: None,
        ..NodeConfig::new(dir)
    }
}

fn key_in_group(group: u32, groups: u32, n: usize) -> StreamKey {
    (0..)
        .map(|i| StreamKey::new("test", &format!("s{n}-{i}")))
        .find(|k| k.group(groups) == group)
        .unwrap()
}

fn create(key: &StreamKey) -> Command {
    Command {
        now_ms: 1_000,
        op: Op::Create(Box::new(CreateReq {
            content_type: Some("application/octet-stream".into()),
            ..CreateReq::new(key.clone())
        })),
    }
}

fn append(key: &StreamKey, payload: &[u8]) -> Command {
    Command {
        now_ms: 2_000,
        op: Op::Append(Box::new(AppendReq {
            content_type: Some("application/octet-stream".into()),
            ..AppendReq::new(key.clone(), Bytes::copy_from_slice(payload))
        })),
    }
}

fn noop() -> Command {
    Command {
        now_ms: 3_000,
        op: Op::Noop,
    }
}

async fn open(cfg: NodeConfig) -> Arc<Node> {
    tokio::time::timeout(T, Node::open(cfg))
        .await
        .expect("open timed out")
        .expect("open failed")
}

fn assert_same_state(a: &GroupState, b: &GroupState) {
    assert_eq!(a.group, b.group);
    assert_eq!(a.streams.len(), b.streams.len());
    assert!(a.streams == b.streams, "streams differ");
    assert_eq!(a.buckets, b.buckets);
    assert_eq!(a.fenced, b.fenced);
    assert_eq!(a.outbox, b.outbox);
    assert_eq!(a.next_outbox_id, b.next_outbox_id);
}

fn snapshot_states(node: &Node) -> Vec<GroupState> {
    (0..node.group_count())
        .map(|g| node.read(g, GroupState::clone))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn propose_apply_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let node = open(config(dir.path(), 4, true)).await;
    assert_eq!(node.group_count(), 4);
    let key = key_in_group(2, 4, 0);
    let mut applied = node.applied(2);
    let before = *applied.borrow_and_update();

    let created = node.propose(2, create(&key)).await.unwrap().unwrap();
    let Reply::Created(c) = created else {
        panic!("unexpected reply {created:?}")
    };
    assert!(c.created);
    let r = node
        .propose(2, append(&key, b"hello"))
        .await
        .unwrap()
        .unwrap();
    let Reply::Appended(a) = r else {
        panic!("unexpected reply {r:?}")
    };
    assert_eq!(a.next_offset, 5);
    // A rejection is a Response, not a ProposeError.
    let missing = key_in_group(2, 4, 1);
    assert!(
        node.propose(2, append(&missing, b"x"))
            .await
            .unwrap()
            .is_err()
    );

    node.read(2, |st| {
        let s = st.streams.get(&key).unwrap();
        assert_eq!(s.data.to_vec(), b"hello");
        assert_eq!(s.tail, 5);
    });
    assert!(*applied.borrow_and_update() > before);
    assert!(node.read(1, |st| st.streams.is_empty()));
    assert!(matches!(
        node.propose(9, noop()).await,
        Err(ProposeError::NoSuchGroup(9))
    ));

    node.shutdown().await;
    let err = node.propose(2, noop()).await.unwrap_err();
    assert!(err.is_retryable(), "{err}");
    node.shutdown().await; // idempotent
}

/// Records what the state machine reports; listens only while `on` is set.
#[derive(Default)]
struct Recorder {
    on: std::sync::atomic::AtomicBool,
    heard: std::sync::Mutex<Vec<(u32, Vec<StreamKey>, bool)>>,
}

impl ursula_raft::ApplyListener for Recorder {
    fn wanted(&self, _group: u32) -> bool {
        self.on.load(std::sync::atomic::Ordering::SeqCst)
    }
    fn applied(&self, group: u32, changed: &[&StreamKey], everything: bool) {
        let keys = changed.iter().map(|k| (*k).clone()).collect();
        self.heard.lock().unwrap().push((group, keys, everything));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listener_hears_the_streams_each_batch_changed() {
    let dir = tempfile::tempdir().unwrap();
    let rec = Arc::new(Recorder::default());
    let mut cfg = config(dir.path(), 4, false);
    cfg.listener = Some(rec.clone());
    let node = open(cfg).await;
    let a = key_in_group(1, 4, 0);
    let b = key_in_group(1, 4, 1);
    node.propose(1, create(&a)).await.unwrap().unwrap();
    node.propose(1, create(&b)).await.unwrap().unwrap();
    assert!(rec.heard.lock().unwrap().is_empty(), "nobody listened yet");

    rec.on.store(true, std::sync::atomic::Ordering::SeqCst);
    node.propose(1, append(&a, b"x")).await.unwrap().unwrap();
    node.propose(1, noop()).await.unwrap().unwrap();
    node.propose(1, append(&b, b"y")).await.unwrap().unwrap();
    let heard = rec.heard.lock().unwrap().clone();
    let keys: Vec<_> = heard.iter().flat_map(|(_, k, _)| k.clone()).collect();
    assert_eq!(keys, vec![a.clone(), b.clone()], "{heard:?}");
    assert!(heard.iter().all(|(g, _, all)| *g == 1 && !*all));
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_recovers_state() {
    let dir = tempfile::tempdir().unwrap();
    let groups = 4;
    let node = open(config(dir.path(), groups, false)).await;
    let keys: Vec<_> = (0..groups).map(|g| key_in_group(g, groups, 7)).collect();
    for (g, k) in keys.iter().enumerate() {
        node.propose(g as u32, create(k)).await.unwrap().unwrap();
    }
    for i in 0..200u32 {
        let g = i % groups;
        let payload = format!("record-{i};");
        node.propose(g, append(&keys[g as usize], payload.as_bytes()))
            .await
            .unwrap()
            .unwrap();
    }
    let before = snapshot_states(&node);
    let applied_before: Vec<u64> = (0..groups).map(|g| *node.applied(g).borrow()).collect();
    node.shutdown().await;
    drop(node);

    let node = open(config(dir.path(), groups, false)).await;
    let after = snapshot_states(&node);
    for (a, b) in before.iter().zip(&after) {
        assert_same_state(a, b);
    }
    for g in 0..groups {
        assert!(*node.applied(g).borrow() >= applied_before[g as usize]);
    }
    // Writing continues where it left off.
    let r = node
        .propose(0, append(&keys[0], b"more"))
        .await
        .unwrap()
        .unwrap();
    let Reply::Appended(a) = r else {
        panic!("unexpected reply {r:?}")
    };
    let expected: u64 = (0..200u32)
        .filter(|i| i % groups == 0)
        .map(|i| format!("record-{i};").len() as u64)
        .sum::<u64>()
        + 4;
    assert_eq!(a.next_offset, expected);
    node.shutdown().await;

    // The identity file refuses another group count or node id.
    let mut other = config(dir.path(), groups + 1, false);
    assert!(matches!(
        Node::open(other.clone()).await,
        Err(RaftError::DataDir(_))
    ));
    other.group_count = groups;
    other.node_id = 2;
    assert!(matches!(
        Node::open(other).await,
        Err(RaftError::DataDir(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_after_crash_without_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let node = open(config(dir.path(), 2, true)).await;
    let key = key_in_group(1, 2, 3);
    node.propose(1, create(&key)).await.unwrap().unwrap();
    for i in 0..50u8 {
        node.propose(1, append(&key, &[i])).await.unwrap().unwrap();
    }
    let before = snapshot_states(&node);
    // No shutdown: everything acknowledged must already be durable.
    drop(node);

    let deadline = Instant::now() + T;
    let node = loop {
        match Node::open(config(dir.path(), 2, true)).await {
            Ok(n) => break n,
            Err(RaftError::Wal(ursula_storage::WalError::Locked(_)))
                if Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("reopen failed: {e}"),
        }
    };
    for (a, b) in before.iter().zip(&snapshot_states(&node)) {
        assert_same_state(a, b);
    }
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_and_purges_keep_the_wal_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let groups = 3;
    let segment = 32 << 10;
    let cfg = NodeConfig {
        data_dir: dir.path().to_path_buf(),
        node_id: 1,
        group_count: groups,
        wal: WalOptions {
            segment_bytes: segment,
            fsync: false,
            ..Default::default()
        },
        snapshot_logs: 20,
        snapshot_min_log_bytes: 64 << 20,
        listener: None,
        ..NodeConfig::new(dir.path())
    };
    let node = open(cfg.clone()).await;
    let key = key_in_group(0, groups, 11);
    node.propose(0, create(&key)).await.unwrap().unwrap();
    let payload = [b'x'; 200];

    // Sequential proposals: one entry each, so snapshots trigger every 20 commands.
    let mut peaks = Vec::new();
    let mut written = 0u64;
    for _round in 0..4 {
        for _ in 0..400 {
            node.propose(0, append(&key, &payload))
                .await
                .unwrap()
                .unwrap();
            written += payload.len() as u64;
        }
        peaks.push(node.wal_disk_bytes());
    }
    // Idle groups hold their first segment only until upkeep moves them along.
    let deadline = Instant::now() + Duration::from_secs(20);
    while node.wal_disk_bytes() > 4 * segment && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let settled = node.wal_disk_bytes();
    eprintln!("wrote {written} bytes; wal peaks {peaks:?}, settled at {settled}");
    if settled > 4 * segment {
        for g in 0..groups {
            let m = node.raft(g).metrics().borrow().clone();
            eprintln!(
                "group {g}: applied {:?} snapshot {:?} purged {:?} last_log {:?}",
                m.last_applied, m.snapshot, m.purged, m.last_log_index
            );
        }
    }
    assert!(
        settled <= 4 * segment,
        "wal holds {settled} bytes after writing {written} (peaks {peaks:?})"
    );
    assert!(written > 8 * segment);
    assert!(dir.path().join("snapshots/group-0.snap").exists());
    let metrics = node.raft(0).metrics().borrow().clone();
    assert!(metrics.snapshot.is_some());
    assert!(metrics.purged.is_some());

    let before = snapshot_states(&node);
    node.shutdown().await;
    let node = open(cfg).await;
    for (a, b) in before.iter().zip(&snapshot_states(&node)) {
        assert_same_state(a, b);
    }
    let tail = node.read(0, |st| st.streams.get(&key).unwrap().tail);
    assert_eq!(tail, written);
    node.propose(0, append(&key, b"after"))
        .await
        .unwrap()
        .unwrap();
    node.shutdown().await;
}

async fn concurrent_run(
    node: &Arc<Node>,
    tasks: usize,
    per_task: usize,
    spread: bool,
) -> (Duration, u64) {
    let groups = node.group_count();
    let syncs = node.wal_sync_count();
    let start = Instant::now();
    let mut handles = Vec::with_capacity(tasks);
    for t in 0..tasks {
        let node = Arc::clone(node);
        handles.push(tokio::spawn(async move {
            for i in 0..per_task {
                let g = if spread { ((t + i) as u32) % groups } else { 0 };
                node.propose(g, noop()).await.unwrap().unwrap();
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    (start.elapsed(), node.wal_sync_count() - syncs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_proposals_share_fsyncs() {
    let dir = tempfile::tempdir().unwrap();
    let node = open(config(dir.path(), 4, true)).await;
    let tasks = 200;
    let per_task = 10;
    let total = (tasks * per_task) as u64;

    let (elapsed, syncs) = tokio::time::timeout(T, concurrent_run(&node, tasks, per_task, false))
        .await
        .unwrap();
    eprintln!(
        "one group: {total} proposals in {elapsed:?} ({:.0}/s), {syncs} syncs",
        total as f64 / elapsed.as_secs_f64()
    );
    assert!(syncs * 5 < total, "{syncs} syncs for {total} proposals");

    let (elapsed, syncs) = tokio::time::timeout(T, concurrent_run(&node, tasks, per_task, true))
        .await
        .unwrap();
    eprintln!(
        "all groups: {total} proposals in {elapsed:?} ({:.0}/s), {syncs} syncs",
        total as f64 / elapsed.as_secs_f64()
    );
    assert!(syncs * 5 < total, "{syncs} syncs for {total} proposals");
    node.shutdown().await;
}

/// Throughput probe: `cargo test -p ursula-raft --release --test node -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "benchmark"]
async fn bench_concurrent_proposals() {
    let dir = tempfile::tempdir().unwrap();
    let t0 = Instant::now();
    let node = open(config(dir.path(), 16, true)).await;
    eprintln!("fresh open of 16 groups: {:?}", t0.elapsed());
    for (tasks, per_task, spread) in [(200, 200, false), (200, 200, true), (1000, 50, true)] {
        let total = (tasks * per_task) as u64;
        let (elapsed, syncs) = concurrent_run(&node, tasks, per_task, spread).await;
        eprintln!(
            "{tasks} tasks x {per_task} ({}): {:.0} proposals/s, {syncs} syncs ({:.1} proposals/sync)",
            if spread { "16 groups" } else { "1 group" },
            total as f64 / elapsed.as_secs_f64(),
            total as f64 / syncs.max(1) as f64
        );
    }
    node.shutdown().await;
    let t0 = Instant::now();
    let node = open(config(dir.path(), 16, true)).await;
    eprintln!(
        "reopen of 16 groups after 130000 proposals: {:?}",
        t0.elapsed()
    );
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_crashes_and_restarts_with_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    let groups = 4;
    let cfg = NodeConfig {
        data_dir: dir.path().to_path_buf(),
        node_id: 1,
        group_count: groups,
        wal: WalOptions {
            segment_bytes: 16 << 10,
            fsync: false,
            ..Default::default()
        },
        snapshot_logs: 10,
        snapshot_min_log_bytes: 64 << 20,
        listener: None,
        ..NodeConfig::new(dir.path())
    };
    let keys: Vec<_> = (0..groups).map(|g| key_in_group(g, groups, 5)).collect();
    let mut expected = vec![0u64; groups as usize];
    let mut previous: Option<Vec<GroupState>> = None;
    for round in 0..6 {
        let deadline = Instant::now() + T;
        let node = loop {
            match Node::open(cfg.clone()).await {
                Ok(n) => break n,
                Err(RaftError::Wal(ursula_storage::WalError::Locked(_)))
                    if Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("round {round}: reopen failed: {e}"),
            }
        };
        if let Some(prev) = &previous {
            for (a, b) in prev.iter().zip(&snapshot_states(&node)) {
                assert_same_state(a, b);
            }
        } else {
            for (g, k) in keys.iter().enumerate() {
                node.propose(g as u32, create(k)).await.unwrap().unwrap();
            }
        }
        let mut handles = Vec::new();
        for t in 0..16u32 {
            let node = Arc::clone(&node);
            let keys = keys.clone();
            handles.push(tokio::spawn(async move {
                let g = t % groups;
                for i in 0..25u32 {
                    let payload = format!("{round}:{t}:{i};");
                    node.propose(g, append(&keys[g as usize], payload.as_bytes()))
                        .await
                        .unwrap()
                        .unwrap();
                }
            }));
        }
        for h in handles {
            h.await.unwrap();
        }
        for t in 0..16u32 {
            for i in 0..25u32 {
                expected[(t % groups) as usize] += format!("{round}:{t}:{i};").len() as u64;
            }
        }
        for g in 0..groups {
            let tail = node.read(g, |st| st.streams.get(&keys[g as usize]).unwrap().tail);
            assert_eq!(tail, expected[g as usize]);
        }
        previous = Some(snapshot_states(&node));
        if round % 2 == 0 {
            drop(node); // crash
        } else {
            node.shutdown().await;
        }
    }
}

/// A shutdown while proposals keep arriving: queued ones finish, later ones are refused, the
/// batchers stop promptly (not at the drain timeout), and what was acknowledged is what a
/// restart finds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_under_load_keeps_exactly_the_acknowledged_appends() {
    const BODY: &[u8] = b"0123456789abcdef";
    let dir = tempfile::tempdir().unwrap();
    let node = open(config(dir.path(), 1, true)).await;
    let key = key_in_group(0, 1, 0);
    node.propose(0, create(&key)).await.unwrap().unwrap();

    let acked = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut writers = Vec::new();
    for _ in 0..32 {
        let (node, key, acked) = (Arc::clone(&node), key.clone(), Arc::clone(&acked));
        writers.push(tokio::spawn(async move {
            loop {
                match node.propose(0, append(&key, BODY)).await {
                    Ok(r) => {
                        r.unwrap();
                        acked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    Err(ProposeError::Unavailable(_)) => return,
                    Err(e) => panic!("unexpected error {e:?}"),
                }
            }
        }));
    }
    // Wait until the writers keep the group's queue busy.
    let deadline = Instant::now() + T;
    while acked.load(std::sync::atomic::Ordering::SeqCst) < 500 {
        assert!(Instant::now() < deadline, "appends did not start");
        tokio::task::yield_now().await;
    }
    let started = Instant::now();
    tokio::time::timeout(T, node.shutdown()).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "shutdown took {:?}",
        started.elapsed()
    );
    for w in writers {
        tokio::time::timeout(T, w).await.unwrap().unwrap();
    }
    let acked = acked.load(std::sync::atomic::Ordering::SeqCst);
    drop(node);

    let node = open(config(dir.path(), 1, true)).await;
    let tail = node.read(0, |st| st.streams.get(&key).unwrap().tail);
    assert_eq!(tail, acked * BODY.len() as u64);
    node.shutdown().await;
}
