//! The per-group batcher: packs queued proposals into one Raft entry and answers them.

use super::*;

/// Why a proposal that openraft refused at once failed: it was not logged.
fn fatal_error(e: &Fatal<u64>) -> ProposeError {
    match e {
        Fatal::Stopped => ProposeError::Unavailable("the raft group stopped".into()),
        Fatal::StorageError(e) => ProposeError::StorageUnavailable(e.to_string()),
        Fatal::Panicked => ProposeError::Storage("the raft group panicked".into()),
    }
}

/// Why a proposal openraft had accepted failed when its group's core stopped. A core stopped
/// by a storage error (a WAL sync that failed) may have logged the proposal before the sync
/// failed, so its outcome is unknown: it may reappear after the restart.
fn stopped_error(raft: &Raft) -> ProposeError {
    match &raft.metrics().borrow().running_state {
        Err(Fatal::StorageError(e)) => ProposeError::OutcomeUnknown(e.to_string()),
        Err(e) => fatal_error(e),
        Ok(()) => ProposeError::Unavailable("the raft group stopped".into()),
    }
}

/// Gathers a group's queued proposals into batches and submits them to openraft in order.
pub(super) async fn run_batcher(
    group: u32,
    raft: Raft,
    mut rx: mpsc::Receiver<Pending>,
    inflight: Arc<Semaphore>,
    mut stop: watch::Receiver<bool>,
    wal: ursula_storage::Wal,
    linger: Duration,
) {
    let health = Arc::clone(wal.health());
    let mut stopping = false;
    // A proposal taken from the queue that did not fit in the previous batch.
    let mut carry: Option<Pending> = None;
    // Proposals the previous batch carried (their answers just went out).
    let mut answered = 0usize;
    loop {
        // Seen here too, not only while waiting: a queue that never runs empty must not keep
        // the batcher from stopping.
        if !stopping && stop.has_changed().unwrap_or(true) {
            stopping = true;
            rx.close();
        }
        // Whether the batcher had to wait for this batch's first proposal.
        let mut waited = true;
        let first = if carry.is_some() {
            carry.take()
        } else if let Ok(p) = rx.try_recv() {
            waited = false;
            Some(p)
        } else if stopping {
            wal.release(group);
            rx.recv().await
        } else {
            // Nothing queued: the WAL should not hold its next sync for this group.
            wal.release(group);
            tokio::select! {
                m = rx.recv() => m,
                _ = stop.changed() => {
                    // Refuse new proposals, but finish the queued ones.
                    stopping = true;
                    rx.close();
                    continue;
                }
            }
        };
        let Some(first) = first else { break };
        // Taken only once there is something to submit, so that a leadership transfer can
        // pause an idle group by holding every permit (see transfer.rs).
        let Ok(permit) = Arc::clone(&inflight).acquire_owned().await else {
            let _ = first.tx.send(Err(ProposeError::Unavailable(
                "the raft group stopped".into(),
            )));
            break;
        };
        // Let every task that is ready to run (HTTP connections parsing their requests) queue
        // its proposal first, so that this batch carries all of them. Not when proposals were
        // queued already (they gathered while the previous batch was in flight): the tasks
        // ready then are mostly that batch's answers, and the WAL sync this batch waits for
        // should not wait for them too.
        let sole = sole_voter(&raft);
        if waited {
            tokio::task::yield_now().await;
        } else if sole && !stopping && answered > 1 && !linger.is_zero() && !wal.awaits(group) {
            // Group commit for closed-loop writers: the proposals queued now gathered while
            // the previous batch synced; the writers it just answered are about to send their
            // next ones. Wait (a little) for as many as it carried, so that one sync takes
            // them all instead of this batch syncing a few and the next the rest. Not when
            // the WAL holds its next sync for this group (a sync shared by several groups):
            // the writer's wait already gathers them, and this one would only delay it.
            let until = Instant::now() + linger;
            while keep_lingering(rx.len() + 1, answered, Instant::now(), until) {
                tokio::task::yield_now().await;
            }
        }
        let mut bytes = first.size;
        let mut cmds = vec![first.cmd];
        let mut txs = vec![first.tx];
        while cmds.len() < MAX_BATCH_COMMANDS {
            match rx.try_recv() {
                Ok(p) if bytes + p.size > MAX_BATCH_BYTES => {
                    carry = Some(p);
                    break;
                }
                Ok(p) => {
                    bytes += p.size;
                    cmds.push(p.cmd);
                    txs.push(p.tx);
                }
                Err(_) => break,
            }
        }
        // While proposals keep coming, the next batch follows this one's answer at once, and
        // the answer follows the local sync when this node is the group's only voter. (With
        // peers the answer waits for a quorum's round trip; the WAL must not hold other
        // groups' entries, followers' included, for that.)
        if sole {
            wal.expect_next(group);
        }
        match raft.client_write_ff(Batch(cmds)).await {
            // Answered here rather than in a task of its own: with one batch in flight the
            // batcher could not submit another before this one is answered anyway, and a
            // spawn per batch was a measurable share of an append's cost. The next batch
            // gathers what queues meanwhile.
            Ok(resp) => {
                let result = resp.await;
                answered = txs.len();
                deliver(group, &raft, &health, result, txs);
                drop(permit);
            }
            Err(e) => {
                let err = match health.failed() {
                    Some(reason) => ProposeError::StorageUnavailable(reason),
                    None => fatal_error(&e),
                };
                for tx in txs {
                    let _ = tx.send(Err(err.clone()));
                }
            }
        }
    }
    wal.release(group);
    // Wait for a leadership transfer that holds the permits.
    let _ = inflight.acquire_many(MAX_INFLIGHT_BATCHES as u32).await;
}

type WriteResult = Result<
    Result<
        openraft::raft::ClientWriteResponse<crate::types::TypeConfig>,
        ClientWriteError<u64, BasicNode>,
    >,
    oneshot::error::RecvError,
>;

fn deliver(
    group: u32,
    raft: &Raft,
    health: &ursula_storage::StorageHealth,
    result: WriteResult,
    txs: Vec<oneshot::Sender<Result<Response, ProposeError>>>,
) {
    let err = match result {
        Ok(Ok(resp)) => {
            let responses = resp.data.0;
            if responses.len() == txs.len() {
                for (tx, r) in txs.into_iter().zip(responses) {
                    let _ = tx.send(Ok(r));
                }
                return;
            }
            tracing::error!(
                group,
                expected = txs.len(),
                got = responses.len(),
                "state machine answered a batch with the wrong number of responses"
            );
            ProposeError::Storage("the state machine answered the wrong number of responses".into())
        }
        Ok(Err(ClientWriteError::ForwardToLeader(f))) => ProposeError::ForwardToLeader {
            leader: f.leader_id.filter(|&l| l != raft_id(raft)),
        },
        Ok(Err(e)) => ProposeError::Unavailable(e.to_string()),
        // The core stopped with this batch accepted: if the WAL failed, the batch may have
        // been in the failed sync (the core may report its error only after this).
        Err(_) => match health.failed() {
            Some(reason) => ProposeError::OutcomeUnknown(reason),
            None => stopped_error(raft),
        },
    };
    for tx in txs {
        let _ = tx.send(Err(err.clone()));
    }
}

/// Whether a batch of `queued` proposals should wait for more: fewer are queued than the
/// previous batch carried (`answered`), and the linger has not run out.
fn keep_lingering(queued: usize, answered: usize, now: Instant, until: Instant) -> bool {
    queued < answered && now < until
}

/// Whether this node is the group's only voter (a single node).
fn sole_voter(raft: &Raft) -> bool {
    let m = raft.metrics();
    let m = m.borrow();
    let mut voters = m.membership_config.membership().voter_ids();
    voters.next() == Some(m.id) && voters.next().is_none()
}

fn raft_id(raft: &Raft) -> u64 {
    raft.metrics().borrow().id
}

#[cfg(test)]
mod tests {
    use super::keep_lingering;
    use std::time::{Duration, Instant};

    #[test]
    fn a_batch_lingers_only_until_the_answered_writers_are_back_or_time_is_up() {
        let now = Instant::now();
        let until = now + Duration::from_micros(250);
        assert!(keep_lingering(3, 16, now, until));
        assert!(
            !keep_lingering(16, 16, now, until),
            "every answered writer is back"
        );
        assert!(!keep_lingering(20, 16, now, until));
        assert!(!keep_lingering(3, 16, until, until), "the linger ran out");
        assert!(
            !keep_lingering(1, 1, now, until),
            "one answered, one queued"
        );
    }
}
