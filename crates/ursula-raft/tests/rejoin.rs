//! Node replacement in one process (cluster.md §5.3): a node whose data directory was wiped
//! takes no part in any group (no entries, no votes, no campaign) until the group's leader
//! allows it; then it rehydrates, and it grants no vote until it applied the leader's commit
//! index at the time of the permission, also across a restart.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod sim;

use std::time::{Duration, Instant};

use openraft::ServerState;
use sim::*;
use ursula_raft::{AllowError, TransferError};

/// No node of `among` leads `group` for all of `window` (bounded wait on a condition that must
/// stay false).
async fn no_leader_for(c: &Cluster, group: u32, among: &[u64], window: Duration) {
    let end = Instant::now() + window;
    while Instant::now() < end {
        for id in among {
            let m = c.nodes[id].raft(group).metrics().borrow().clone();
            assert_ne!(
                m.state,
                ServerState::Leader,
                "node {id} was elected in term {} with a vote it must not have had",
                m.current_term
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_node_waits_for_permission_and_votes_only_once_caught_up() {
    let mut c = Cluster::start(3, 1, 20_000).await;
    let all = c.ids();
    let key = key_in_group(0, 1, 0);
    assert!(ok(&c.propose(&all, 0, create(&key), T).await.unwrap()));
    let mut want = Vec::new();
    for i in 0..30 {
        assert!(ok(&c.propose(&all, 0, append(&key, i), T).await.unwrap()));
        want.extend(record(i));
    }
    // Wipe a follower and bring it back as a replacement (init_membership off).
    let leader = c.agreed_leader(0, &all).await;
    let wiped = *all.iter().find(|&&i| i != leader).unwrap();
    let other = *all.iter().find(|&&i| i != leader && i != wiped).unwrap();
    c.wipe(wiped).await;
    c.open(wiped, false).await;
    assert_eq!(c.nodes[&wiped].groups_awaiting_permission(), vec![0]);
    // A leadership transfer to it is turned down (its elect is refused), and it leads nothing.
    match c.nodes[&leader]
        .transfer_leader(0, wiped, Duration::from_secs(3))
        .await
    {
        Err(TransferError::Refused { .. } | TransferError::Timeout { .. }) => {}
        r => panic!("a transfer to an awaiting node: {r:?}"),
    }
    assert!(!c.nodes[&wiped].leads(0));

    // It takes nothing from the leader meanwhile, and the others keep committing.
    for i in 30..40 {
        assert!(ok(&c
            .propose(&[leader, other], 0, append(&key, i), T)
            .await
            .unwrap()));
        want.extend(record(i));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(c.bytes(wiped, &key), None, "an awaiting node took entries");
    assert!(
        c.nodes[&wiped]
            .raft(0)
            .metrics()
            .borrow()
            .last_log_index
            .is_none()
    );

    // The leader dies: the survivor needs the wiped node's vote, which it does not get.
    c.kill(leader).await;
    no_leader_for(&c, 0, &[other, wiped], Duration::from_secs(2)).await;

    // Leader back; permission from whoever leads now (a follower answers NotLeader).
    c.open(leader, false).await;
    let now = c.leader(0, &[leader, other]).await;
    let follower = if now == leader { other } else { leader };
    match c.nodes[&follower].allow_next_revert(0, wiped).await {
        Err(AllowError::NotLeader(l)) => assert_eq!(l.filter(|&l| l != now), None),
        r => panic!("a follower gave a permission: {r:?}"),
    }
    assert!(matches!(
        c.nodes[&now].allow_next_revert(0, 99).await,
        Err(AllowError::BadNode(_))
    ));
    // Leadership may still settle between the two survivors: retry like ursulactl does.
    let deadline = Instant::now() + T;
    let (now, a) = loop {
        let now = c.leader(0, &[leader, other]).await;
        match c.nodes[&now].allow_next_revert(0, wiped).await {
            Ok(a) => break (now, a),
            Err(AllowError::NotLeader(_)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("allow-next-revert failed: {e}"),
        }
    };
    assert_eq!(a.state, "armed");
    assert!(a.commit_index > 0);

    // It rehydrates, holds every acknowledged byte, and then takes part normally.
    c.converged(&[wiped], &key, &want).await;
    let deadline = Instant::now() + T;
    while !c.nodes[&wiped].groups_rehydrating().is_empty() {
        assert!(Instant::now() < deadline, "rehydration never completed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(c.nodes[&wiped].groups_awaiting_permission().is_empty());
    let again = c.nodes[&now].allow_next_revert(0, wiped).await.unwrap();
    assert_eq!(again.state, "not-awaiting");

    // Now its vote counts: with the leader gone, the two others elect one.
    c.kill(now).await;
    let rest: Vec<u64> = all.iter().copied().filter(|&i| i != now).collect();
    c.leader(0, &rest).await;
    c.shutdown().await;
}

/// `rejoin.state` holding one group rehydrating until `until` (the documented format).
fn rehydrating_marks(group: u32, until: u64) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(b"URJN");
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&group.to_le_bytes());
    b.push(2);
    b.extend_from_slice(&until.to_le_bytes());
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rehydrating_node_takes_entries_but_never_grants_a_vote() {
    let mut c = Cluster::start(3, 1, 20_000).await;
    let all = c.ids();
    let key = key_in_group(0, 1, 0);
    assert!(ok(&c.propose(&all, 0, create(&key), T).await.unwrap()));
    let leader = c.agreed_leader(0, &all).await;
    let marked = *all.iter().find(|&&i| i != leader).unwrap();
    let other = *all.iter().find(|&&i| i != leader && i != marked).unwrap();
    // A node restarting mid-rehydration (its mark on disk) with an index it has not reached.
    c.kill(marked).await;
    std::fs::write(
        c.dir(marked).join("rejoin.state"),
        rehydrating_marks(0, u64::MAX / 2),
    )
    .unwrap();
    c.open(marked, false).await;
    assert_eq!(
        c.nodes[&marked].groups_rehydrating(),
        vec![(0, u64::MAX / 2)]
    );
    let mut want = Vec::new();
    for i in 0..10 {
        assert!(ok(&c.propose(&all, 0, append(&key, i), T).await.unwrap()));
        want.extend(record(i));
    }
    c.converged(&[marked], &key, &want).await;

    // Without the leader, the survivor cannot get the rehydrating node's vote, and the
    // rehydrating node never campaigns itself.
    c.kill(leader).await;
    no_leader_for(&c, 0, &[other, marked], Duration::from_secs(2)).await;
    assert_eq!(c.nodes[&marked].groups_rehydrating().len(), 1);
    c.shutdown().await;
}
