//! The commit-stall watchdog over the in-process test network (cluster.md §5.4).
//!
//! What this can and cannot show: a stall that lasts while the node keeps leading needs
//! followers that keep hearing from the leader but never acknowledge its entries (a
//! follower whose disk hangs). Dropping the leader's large appends does not produce it: in
//! openraft 0.9 heartbeats travel the same replication stream and queue behind the stuck
//! append, so the followers' leases run out and they elect a new leader by themselves
//! within about a second (`openraft_steps_down_by_itself_when_appends_vanish` pins that
//! down). What does produce it is a leader whose large appends reach the followers while
//! their answers are lost (an asymmetric path): the followers keep hearing from it, the
//! entry never commits, and the leader stays leader; there the watchdog, run as governance
//! runs it, sees the stall and hands the group away. Besides: the sampler reports no stall
//! on a busy, healthy group, and the stalled-group hand-over moves a leadership whose
//! uncommitted tail the followers never got without acknowledging that tail.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod sim;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sim::*;
use ursula_raft::{RpcFuture, StallWatch, Transport, TransportError};

/// Frames larger than [`CAP`] from the node in `from` are dropped (0: none is); with
/// `deliver`, they reach the peer but its answer is lost.
struct BlackHole {
    from: AtomicU64,
    deliver: AtomicBool,
}

const CAP: usize = 16 << 10;

struct Capped {
    me: u64,
    inner: Arc<dyn Transport>,
    hole: Arc<BlackHole>,
}

impl Transport for Capped {
    fn send(&self, target: u64, frame: Vec<u8>, timeout: Duration) -> RpcFuture<'_> {
        if self.hole.from.load(Ordering::SeqCst) == self.me && frame.len() > CAP {
            if self.hole.deliver.load(Ordering::SeqCst) {
                return Box::pin(async move {
                    let _ = self.inner.send(target, frame, timeout).await;
                    Err(TransportError::Failed(target, "answer lost".into()))
                });
            }
            return Box::pin(async move {
                tokio::time::sleep(timeout.min(Duration::from_millis(50))).await;
                Err(TransportError::Failed(target, "dropped (too large)".into()))
            });
        }
        self.inner.send(target, frame, timeout)
    }
}

async fn capped_cluster() -> (Arc<Cluster>, Arc<BlackHole>) {
    let hole = Arc::new(BlackHole {
        from: AtomicU64::new(0),
        deliver: AtomicBool::new(false),
    });
    let h = Arc::clone(&hole);
    let wrap: WrapTransport = Arc::new(move |me, inner| {
        Arc::new(Capped {
            me,
            inner,
            hole: Arc::clone(&h),
        }) as Arc<dyn Transport>
    });
    let c = Arc::new(Cluster::start_wrapped(3, 1, 20_000, Some(wrap)).await);
    (c, hole)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_healthy_group_is_not_stalled() {
    let (c, _hole) = capped_cluster().await;
    let all = c.ids();
    let key = key_in_group(0, 1, 0);
    assert!(ok(&c.propose(&all, 0, create(&key), T).await.unwrap()));
    let all2 = all.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let (cw, st, k) = (Arc::clone(&c), Arc::clone(&stop), key.clone());
    let w = tokio::spawn(async move {
        let mut i = 0;
        while !st.load(Ordering::SeqCst) && i < 100_000 {
            assert!(ok(&cw.propose(&all2, 0, append(&k, i), T).await.unwrap()));
            i += 1;
        }
        i
    });
    // A threshold far below the time the log is ahead of the commit point under this load:
    // only a commit that does not move counts.
    let mut watches: Vec<StallWatch> = all.iter().map(|_| StallWatch::default()).collect();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(2) {
        for (id, watch) in all.iter().zip(&mut watches) {
            let stalls = c.nodes[id]
                .commit_stalls(watch, Duration::from_millis(300))
                .await;
            assert!(stalls.is_empty(), "node {id} reports {stalls:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::SeqCst);
    assert!(w.await.unwrap() > 10, "the writer made no progress");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stalled_group_hand_over_moves_leadership_and_acknowledges_nothing_uncommitted() {
    let (c, hole) = capped_cluster().await;
    let all = c.ids();
    let key = key_in_group(0, 1, 0);
    assert!(ok(&c.propose(&all, 0, create(&key), T).await.unwrap()));
    assert!(ok(&c.propose(&all, 0, append(&key, 1), T).await.unwrap()));
    let old = c.leader(0, &all).await;
    let node = Arc::clone(&c.nodes[&old]);

    // The leader's large appends vanish from now on; a large append stays uncommitted.
    hole.from.store(old, Ordering::SeqCst);
    let big = Arc::clone(&node);
    let k = key.clone();
    let stuck =
        tokio::spawn(async move { big.propose(0, append_bytes(&k, noise(64 << 10))).await });
    let mut watch = StallWatch::default();
    let deadline = Instant::now() + T;
    while node
        .commit_stalls(&mut watch, Duration::ZERO)
        .await
        .is_empty()
    {
        assert!(Instant::now() < deadline, "the large append never stalled");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(watch.clock(0).is_some());

    let new = node
        .hand_over_stalled(0, Duration::from_secs(10))
        .await
        .expect("hand-over of the stalled group");
    assert_ne!(new, old);
    assert_ne!(c.agreed_leader(0, &all).await, old);
    // The old leader may campaign again once the hand-over is over.
    assert!(node.shed_state().should_campaign());

    // The stuck append was never acknowledged.
    let answer = tokio::time::timeout(T, stuck)
        .await
        .expect("stuck append answered")
        .unwrap();
    assert!(
        !matches!(&answer, Ok(r) if ok(r)),
        "the uncommitted append was acknowledged: {answer:?}"
    );
    // The group commits again, and every node converges without the lost entry.
    hole.from.store(0, Ordering::SeqCst);
    assert!(ok(&c.propose(&all, 0, append(&key, 2), T).await.unwrap()));
    let mut want = record(1);
    want.extend(record(2));
    c.converged(&all, &key, &want).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_acknowledgements_vanish_is_handed_away_by_the_watchdog() {
    let (c, hole) = capped_cluster().await;
    let all = c.ids();
    let key = key_in_group(0, 1, 0);
    assert!(ok(&c.propose(&all, 0, create(&key), T).await.unwrap()));
    assert!(ok(&c.propose(&all, 0, append(&key, 1), T).await.unwrap()));
    let old = c.leader(0, &all).await;
    let node = Arc::clone(&c.nodes[&old]);

    // The followers get the leader's large appends (and so keep hearing from it), but
    // their answers never come back: the entry cannot commit, and nobody else campaigns.
    hole.deliver.store(true, Ordering::SeqCst);
    hole.from.store(old, Ordering::SeqCst);
    let big = Arc::clone(&node);
    let k = key.clone();
    let stuck =
        tokio::spawn(async move { big.propose(0, append_bytes(&k, noise(64 << 10))).await });

    // The watchdog as governance runs it, with a short threshold.
    let threshold = Duration::from_millis(1500);
    let mut watch = StallWatch::default();
    let started = Instant::now();
    let stalled = loop {
        if let Some(&s) = node.commit_stalls(&mut watch, threshold).await.first() {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no stall seen; node {old} leads: {}",
            node.leads(0)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(stalled.0, 0);
    assert!(stalled.1 > threshold);
    assert!(node.leads(0), "node {old} stopped leading on its own");

    let new = node
        .hand_over_stalled(0, Duration::from_secs(10))
        .await
        .expect("hand-over of the stalled group");
    assert_ne!(new, old);
    assert_ne!(c.agreed_leader(0, &all).await, old);
    hole.from.store(0, Ordering::SeqCst);
    // The followers hold the entry, so the new leader commits it; the old leader's answer
    // is then a success (the write is durable) or an error (it stopped leading first): in
    // no case a success for a write the group does not hold.
    let answer = tokio::time::timeout(T, stuck)
        .await
        .expect("stuck append answered")
        .unwrap();
    let acked = matches!(&answer, Ok(r) if ok(r));
    // The group commits again, everywhere.
    assert!(ok(&c.propose(&all, 0, append(&key, 2), T).await.unwrap()));
    let mut want = record(1);
    if acked {
        want.extend(noise(64 << 10));
    }
    want.extend(record(2));
    let got = c.bytes(new, &key).unwrap();
    if !acked && got.len() > want.len() {
        // Not acknowledged, but committed anyway (an answer lost, not a write).
        want = got.clone();
    }
    assert_eq!(got.len(), want.len());
    assert!(got == want, "node {new} holds other bytes");
    c.converged(&all, &key, &want).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_steps_down_by_itself_when_appends_vanish() {
    let (c, hole) = capped_cluster().await;
    let all = c.ids();
    let key = key_in_group(0, 1, 0);
    assert!(ok(&c.propose(&all, 0, create(&key), T).await.unwrap()));
    let old = c.leader(0, &all).await;
    hole.from.store(old, Ordering::SeqCst);
    let big = Arc::clone(&c.nodes[&old]);
    let k = key.clone();
    let _stuck =
        tokio::spawn(async move { big.propose(0, append_bytes(&k, noise(64 << 10))).await });
    // Without any watchdog the followers elect another leader: the stuck append holds up
    // the heartbeats too.
    let deadline = Instant::now() + T;
    let others: Vec<u64> = all.iter().copied().filter(|&n| n != old).collect();
    loop {
        let l = c.nodes[&others[0]].leader_of(0);
        if l.is_some_and(|l| l != old) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the followers kept node {old} as leader"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Bytes that do not compress.
fn noise(n: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
