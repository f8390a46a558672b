//! Three-node clusters in one process over the test network: elections, quorum
//! acknowledgement, partitions, loss and delay, catch-up by snapshot, a killed leader.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod sim;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sim::*;
use ursula_raft::ProposeError;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_elect_replicate_and_redirect() {
    let c = Cluster::start(3, 2, 20_000).await;
    let all = c.ids();
    for g in 0..c.groups {
        // Every node learns who leads, and a follower refuses to propose, naming the leader.
        let leader = c.agreed_leader(g, &all).await;
        for &id in &all {
            assert_eq!(
                c.nodes[&id].peer_url(leader),
                Some(format!("http://node-{leader}").as_str())
            );
            if id != leader {
                // (A new election may move the leadership meanwhile: then this node may lead.)
                let key = key_in_group(g, c.groups, 0);
                match c.nodes[&id].propose(g, create(&key)).await {
                    Err(ProposeError::ForwardToLeader { leader }) => assert_ne!(leader, Some(id)),
                    Ok(_) if c.nodes[&id].leads(g) => {}
                    other => panic!("a follower proposed: {other:?}"),
                }
                match c.nodes[&id].ensure_linearizable(g).await {
                    Err(ProposeError::ForwardToLeader { .. }) => {}
                    Ok(()) if c.nodes[&id].leads(g) => {}
                    other => panic!("a follower confirmed a leader read: {other:?}"),
                }
                // A cross-group request is proposed by the leader on the follower's behalf.
                let other = key_in_group(g, c.groups, 10 + id as usize);
                let deadline = Instant::now() + T;
                loop {
                    match c.nodes[&id].propose_via_leader(g, create(&other)).await {
                        Ok(r) => {
                            assert!(ok(&r), "{r:?}");
                            break;
                        }
                        Err(e) if e.is_retryable() && Instant::now() < deadline => {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        Err(e) => panic!("forwarded proposal failed: {e}"),
                    }
                }
                let leader_now = c.leader(g, &all).await;
                c.nodes[&leader_now].ensure_linearizable(g).await.unwrap();
                assert!(c.nodes[&leader_now].read(g, |st| st.streams.contains_key(&other)));
            }
        }
        let key = key_in_group(g, c.groups, 1);
        assert!(ok(&c.propose(&all, g, create(&key), T).await.unwrap()));
        let mut want = Vec::new();
        for i in 0..20 {
            assert!(ok(&c.propose(&all, g, append(&key, i), T).await.unwrap()));
            want.extend(record(i));
        }
        let leader = c.leader(g, &all).await;
        c.nodes[&leader].ensure_linearizable(g).await.unwrap();
        assert_eq!(c.bytes(leader, &key).unwrap(), want);
        c.converged(&all, &key, &want).await;
    }
    for n in c.nodes.values() {
        assert!(n.leaderless_groups().is_empty());
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minority_cannot_commit_majority_elects_and_healing_converges() {
    let c = Cluster::start(3, 1, 20_000).await;
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = c.watch_safety(Arc::clone(&stop));
    let all = c.ids();
    let key = key_in_group(0, 1, 0);
    let old = c.leader(0, &all).await;
    assert!(ok(&c.propose(&[old], 0, create(&key), T).await.unwrap()));
    let mut acked = Vec::new();
    for i in 0..5 {
        assert!(ok(&c.propose(&[old], 0, append(&key, i), T).await.unwrap()));
        acked.push(i);
    }

    // The old leader alone cannot commit: its write is never acknowledged.
    let rest: Vec<u64> = all.iter().copied().filter(|&id| id != old).collect();
    c.net.partition(&[&[old], &rest]);
    let started = Instant::now();
    let lonely = tokio::time::timeout(
        Duration::from_secs(2),
        c.nodes[&old].propose(0, append(&key, 900)),
    )
    .await;
    assert!(
        !matches!(lonely, Ok(Ok(Ok(_)))),
        "the minority acknowledged a write: {lonely:?}"
    );

    // The majority elects one of its own and goes on.
    let new = c.leader(0, &rest).await;
    assert_ne!(new, old);
    for i in 5..15 {
        assert!(ok(&c.propose(&rest, 0, append(&key, i), T).await.unwrap()));
        acked.push(i);
    }
    eprintln!(
        "majority side wrote again {:?} after the partition",
        started.elapsed()
    );

    // Healed, the old leader drops its unacknowledged entry and converges.
    c.net.heal();
    let want: Vec<u8> = acked.iter().flat_map(|&i| record(i)).collect();
    c.converged(&all, &key, &want).await;
    assert!(!records(&c.bytes(old, &key).unwrap()).contains(&900));

    stop.store(true, Ordering::SeqCst);
    watcher.await.unwrap();
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lagging_follower_catches_up_by_snapshot() {
    let c = Cluster::start(3, 1, 10).await;
    let all = c.ids();
    let key = key_in_group(0, 1, 0);
    let leader = c.leader(0, &all).await;
    let lagging = *all.iter().find(|&&id| id != leader).unwrap();
    assert!(ok(&c.propose(&[leader], 0, create(&key), T).await.unwrap()));
    c.net.isolate(lagging, &all);
    let live: Vec<u64> = all.iter().copied().filter(|&id| id != lagging).collect();
    let mut want = Vec::new();
    for i in 0..60 {
        assert!(ok(&c.propose(&live, 0, append(&key, i), T).await.unwrap()));
        want.extend(record(i));
    }
    // Both live nodes snapshotted and purged what the lagging node misses: whichever of them
    // leads once the partition heals (the lagging node's higher term may force an election)
    // can only catch it up by snapshot.
    let deadline = Instant::now() + T;
    for l in &live {
        loop {
            let m = c.nodes[l].raft(0).metrics();
            let purged = m.borrow().purged.map_or(0, |p| p.index);
            if purged > 10 {
                break;
            }
            assert!(Instant::now() < deadline, "node {l} never purged its log");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    c.net.heal();
    c.converged(&all, &key, &want).await;
    // Counted on the wire: the node's own snapshot metric trails its state machine (and
    // its own upkeep would snapshot a log catch-up too), so it cannot tell the two apart.
    assert!(
        c.net.snapshot_chunks_to(lagging) > 0,
        "the lagging node caught up without a snapshot"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_of_several_chunks_reaches_a_lagging_follower() {
    // 40 appends of 100 KiB: the snapshot (about 4 MiB) travels as several 1 MiB chunks.
    let c = Cluster::start(3, 1, 10).await;
    let all = c.ids();
    let key = key_in_group(0, 1, 0);
    let leader = c.leader(0, &all).await;
    let lagging = *all.iter().find(|&&id| id != leader).unwrap();
    let live: Vec<u64> = all.iter().copied().filter(|&id| id != lagging).collect();
    assert!(ok(&c.propose(&live, 0, create(&key), T).await.unwrap()));
    c.net.isolate(lagging, &all);
    let mut want = Vec::new();
    for i in 0..40u32 {
        let payload: Vec<u8> = (0..100 << 10).map(|b: u32| (b ^ i) as u8).collect();
        want.extend_from_slice(&payload);
        let r = c.propose(&live, 0, append_bytes(&key, payload), T).await;
        assert!(ok(&r.unwrap()));
    }
    // As in the test above: both live nodes purged, so whichever leads after the heal can
    // only catch the lagging node up by snapshot.
    let deadline = Instant::now() + T;
    for l in &live {
        while c.nodes[l]
            .raft(0)
            .metrics()
            .borrow()
            .purged
            .is_none_or(|p| p.index < 20)
        {
            assert!(Instant::now() < deadline, "node {l} never purged its log");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    c.net.heal();
    c.converged(&all, &key, &want).await;
    let chunks = c.net.snapshot_chunks_to(lagging);
    assert!(chunks >= 2, "the snapshot came in {chunks} chunk(s)");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_leader_fails_over_and_rejoins_under_a_lossy_network() {
    let mut c = Cluster::start(3, 2, 50).await;
    c.net.set_delay(Duration::from_millis(2));
    c.net.set_loss(50, 7);
    let all = c.ids();
    let key = key_in_group(0, 2, 0);
    let old = c.leader(0, &all).await;
    assert!(ok(&c.propose(&all, 0, create(&key), T).await.unwrap()));

    // A writer appends records one after the other; each acknowledged one is noted.
    let mut acked: Vec<u32> = Vec::new();
    let mut unknown: Vec<u32> = Vec::new();
    let mut i = 0u32;
    for _ in 0..30 {
        match write(&c, &all, &key, i).await {
            Ok(r) if ok(&r) => acked.push(i),
            _ => unknown.push(i),
        }
        i += 1;
    }

    c.kill(old).await;
    let killed_at = Instant::now();
    let survivors = c.ids();
    let mut failover = None;
    for _ in 0..60 {
        match write(&c, &survivors, &key, i).await {
            Ok(r) if ok(&r) => {
                failover.get_or_insert(killed_at.elapsed());
                acked.push(i);
            }
            _ => unknown.push(i),
        }
        i += 1;
    }
    let failover = failover.expect("no write succeeded after the leader died");
    eprintln!("writes succeeded again {failover:?} after the leader was killed");
    assert!(
        failover < Duration::from_secs(5),
        "failover took {failover:?}"
    );

    // The killed node comes back (not bootstrapping again) and catches up.
    c.open(old, false).await;
    c.net.set_loss(0, 0);
    for _ in 0..5 {
        let r = write(&c, &c.ids(), &key, i).await.unwrap();
        assert!(ok(&r));
        acked.push(i);
        i += 1;
    }
    let leader = c.leader(0, &c.ids()).await;
    c.nodes[&leader].ensure_linearizable(0).await.unwrap();
    let final_bytes = c.bytes(leader, &key).unwrap();
    let held = records(&final_bytes);
    // Every acknowledged append exactly once and in order; nothing never proposed.
    let mut pos = 0;
    for a in &acked {
        let at = held[pos..]
            .iter()
            .position(|h| h == a)
            .unwrap_or_else(|| panic!("acknowledged record {a} is missing or out of order"));
        pos += at + 1;
        assert_eq!(
            held.iter().filter(|h| *h == a).count(),
            1,
            "record {a} twice"
        );
    }
    assert!(
        held.iter()
            .all(|h| acked.contains(h) || unknown.contains(h))
    );
    c.converged(&c.ids(), &key, &final_bytes).await;
    c.shutdown().await;
}

async fn write(
    c: &Cluster,
    among: &[u64],
    key: &ursula_core::StreamKey,
    i: u32,
) -> Result<ursula_core::Response, ProposeError> {
    c.propose(among, 0, append(key, i), Duration::from_secs(10))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_nodes_survive_losing_two_including_the_leader() {
    let mut c = Cluster::start(5, 1, 20_000).await;
    let all = c.ids();
    let key = key_in_group(0, 1, 0);
    assert!(ok(&c.propose(&all, 0, create(&key), T).await.unwrap()));
    let mut acked = Vec::new();
    for i in 0..10 {
        assert!(ok(&c.propose(&all, 0, append(&key, i), T).await.unwrap()));
        acked.push(i);
    }
    let leader = c.leader(0, &all).await;
    let other = *all.iter().find(|&&id| id != leader).unwrap();
    c.kill(leader).await;
    c.kill(other).await;
    let survivors = c.ids();
    assert_eq!(survivors.len(), 3);
    for i in 10..30 {
        assert!(ok(&c
            .propose(&survivors, 0, append(&key, i), T)
            .await
            .unwrap()));
        acked.push(i);
    }
    let want: Vec<u8> = acked.iter().flat_map(|&i| record(i)).collect();
    c.converged(&survivors, &key, &want).await;
    // The two come back and catch up.
    c.open(leader, false).await;
    c.open(other, false).await;
    c.converged(&c.ids(), &key, &want).await;
    c.shutdown().await;
}
