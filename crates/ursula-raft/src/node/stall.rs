//! The commit-stall watchdog's view of a node (cluster.md §5.4): which of the groups this
//! node leads have had entries waiting for a quorum, with no commit progress, for too long,
//! and the hand-over that moves such a group's leadership away.
//!
//! A stall means "behind and not moving": the last log index is above the committed index
//! and the committed index has not advanced since the stall began. Under a steady write
//! load the leader's log is almost always ahead of its commit point, so "behind" alone
//! would fire on every busy group; a commit that moves resets the clock.
//!
//! The hand-over differs from [`Node::transfer_leader`]: a stalled group's followers by
//! definition lack the tail of the leader's log, so waiting for a target to catch up would
//! wait forever. Instead the leader stops campaigning and heartbeating for the group, which
//! lets the followers' leases of it run out, and asks the best-replicated voter to
//! campaign. The followers' logs are equally long, so they elect each other; the old leader's
//! uncommitted tail (never acknowledged to anyone) is truncated when it hears the new term.

use super::*;

use std::collections::BTreeMap;

use crate::network::TransportError;
use crate::wire;

/// When a group's stall began, and at which committed index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StallClock {
    /// The committed index (`None`: nothing committed) when the stall was first seen.
    pub committed: Option<u64>,
    pub since: Instant,
}

/// One watchdog sample of a group: the new clock (`None`: not stalled) given the previous
/// one. Pure; the caller decides with [`stalled_for`] whether the stall lasted too long.
///
/// A group is behind when `last_log > committed`; it stays on the same clock only while
/// it is behind at the very committed index the clock started at, and `leads` holds (a
/// follower's commit lag is not its to fix).
pub fn observe_stall(
    prev: Option<StallClock>,
    leads: bool,
    last_log: Option<u64>,
    committed: Option<u64>,
    now: Instant,
) -> Option<StallClock> {
    let behind = match (last_log, committed) {
        (Some(l), Some(c)) => l > c,
        (Some(_), None) => true,
        (None, _) => false,
    };
    if !leads || !behind {
        return None;
    }
    match prev {
        Some(p) if p.committed == committed => Some(p),
        _ => Some(StallClock {
            committed,
            since: now,
        }),
    }
}

/// How long the stall of `clock` has lasted at `now` (zero without one).
pub fn stalled_for(clock: Option<StallClock>, now: Instant) -> Duration {
    clock.map_or(Duration::ZERO, |c| now.saturating_duration_since(c.since))
}

/// The watchdog's memory between samples: one clock per stalled group.
#[derive(Debug, Default)]
pub struct StallWatch {
    clocks: BTreeMap<u32, StallClock>,
}

impl StallWatch {
    /// The group's clock, if it is stalled.
    pub fn clock(&self, group: u32) -> Option<StallClock> {
        self.clocks.get(&group).copied()
    }
}

/// How long one committed-index query may take before the sample counts the group as not
/// measurable this time (it keeps its clock).
const COMMITTED_ASK: Duration = Duration::from_millis(200);

impl Node {
    /// Samples every group this node leads into `watch` and returns those stalled for longer
    /// than `threshold`, longest first, with their stall duration.
    pub async fn commit_stalls(
        &self,
        watch: &mut StallWatch,
        threshold: Duration,
    ) -> Vec<(u32, Duration)> {
        let mut out = Vec::new();
        for group in 0..self.group_count() {
            let leads = self.not_leading(group).is_none();
            let prev = watch.clocks.get(&group).copied();
            let next = if leads {
                let last = self.groups[group as usize]
                    .raft
                    .metrics()
                    .borrow()
                    .last_log_index;
                let Some(committed) = self.committed_index(group).await else {
                    continue;
                };
                observe_stall(prev, true, last, committed, Instant::now())
            } else {
                None
            };
            match next {
                Some(c) => watch.clocks.insert(group, c),
                None => watch.clocks.remove(&group),
            };
            let d = stalled_for(next, Instant::now());
            if next.is_some() && d > threshold {
                out.push((group, d));
            }
        }
        out.sort_by_key(|(g, d)| (std::cmp::Reverse(*d), *g));
        out
    }

    /// The committed index of `group` as its Raft core knows it: `Some(None)` when nothing
    /// is committed, `None` when the core did not answer in time.
    async fn committed_index(&self, group: u32) -> Option<Option<u64>> {
        let ask = self.groups[group as usize]
            .raft
            .with_raft_state(|st| st.committed.map(|c| c.index));
        tokio::time::timeout(COMMITTED_ASK, ask).await.ok()?.ok()
    }

    /// Moves the leadership of a stalled `group` away (see the module docs); returns the new
    /// leader. Bounded by `timeout`. Refuses (`NotLeader`) if this node does not lead it.
    pub async fn hand_over_stalled(
        &self,
        group: u32,
        timeout: Duration,
    ) -> Result<u64, TransferError> {
        let g = self
            .groups
            .get(group as usize)
            .ok_or(TransferError::NoSuchGroup(group))?;
        if let Some(leader) = self.not_leading(group) {
            return Err(TransferError::NotLeader { leader });
        }
        let Some(transport) = &self.transport else {
            return Err(TransferError::NotVoter(self.node_id));
        };
        let deadline = Instant::now() + timeout;
        let left = || deadline.saturating_duration_since(Instant::now());
        g.raft.runtime_config().elect(false);
        self.set_heartbeats(group, false);
        let result = async {
            // Let the followers' lease of this leader run out, then ask the voter with the
            // longest replicated log to campaign (or, if none answers, let their own
            // election timers pick one).
            let lease = self.timing.election_max_ms + self.timing.heartbeat_ms;
            tokio::time::sleep(Duration::from_millis(lease).min(left())).await;
            let mut asked = Vec::new();
            loop {
                if let Some(l) = self.leader_of(group).filter(|&l| l != self.node_id) {
                    return Ok(l);
                }
                if left().is_zero() {
                    return Err(TransferError::Timeout {
                        leader: self.leader_of(group),
                    });
                }
                let target = self
                    .transfer_target(group, &asked)
                    .or_else(|| {
                        asked.clear();
                        self.transfer_target(group, &[])
                    });
                if let Some(target) = target {
                    asked.push(target);
                    let sent = transport
                        .send(target, wire::encode_elect(group), ELECT_ASK_TIMEOUT.min(left()))
                        .await;
                    if let Err(e @ TransportError::Unreachable(..)) = sent {
                        tracing::info!(group, target, error = %e, "stalled group: target unreachable");
                    }
                }
                let _ = g
                    .raft
                    .wait(Some(Duration::from_millis(self.timing.election_min_ms).min(left())))
                    .metrics(
                        |m| m.current_leader.is_some_and(|l| l != self.node_id),
                        "another leader after a commit stall",
                    )
                    .await;
            }
        }
        .await;
        self.set_heartbeats(group, true);
        self.rejoin
            .set_elect(group, &g.raft, self.shed_state().should_campaign());
        result
    }
}

/// How long the stalled leader waits for a target's answer to an elect request.
const ELECT_ASK_TIMEOUT: Duration = Duration::from_millis(500);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stall_is_behind_and_not_moving() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        // Caught up, or a follower: no clock.
        assert_eq!(observe_stall(None, true, Some(5), Some(5), t0), None);
        assert_eq!(observe_stall(None, true, None, None, t0), None);
        assert_eq!(observe_stall(None, false, Some(9), Some(5), t0), None);
        // Behind: a clock starts, and keeps its start while the commit does not move.
        let c = observe_stall(None, true, Some(9), Some(5), t0);
        assert_eq!(c.map(|c| c.since), Some(t0));
        let c2 = observe_stall(c, true, Some(12), Some(5), t0 + s);
        assert_eq!(c2.map(|c| c.since), Some(t0));
        assert_eq!(stalled_for(c2, t0 + 3 * s), 3 * s);
        // Nothing committed yet and an entry waiting counts as behind.
        assert!(observe_stall(None, true, Some(0), None, t0).is_some());
        // The commit moved: the clock restarts even though the log is still ahead.
        let c3 = observe_stall(c2, true, Some(12), Some(6), t0 + 2 * s);
        assert_eq!(c3.map(|c| c.since), Some(t0 + 2 * s));
        // Caught up, or no longer leading: the clock is gone.
        assert_eq!(
            observe_stall(c3, true, Some(12), Some(12), t0 + 3 * s),
            None
        );
        assert_eq!(
            observe_stall(c3, false, Some(12), Some(6), t0 + 3 * s),
            None
        );
        assert_eq!(stalled_for(None, t0), Duration::ZERO);
    }
}
