//! Leadership transfer, shedding and balancing (cluster.md §5.4, §9.6).
//!
//! openraft 0.9 has no transfer call, so a transfer is built from what it has:
//!
//! 1. the leader pauses the group: it takes every batcher permit, so no new entry reaches its
//!    log (queued writes wait; once the transfer is over they get `ForwardToLeader`, which
//!    the HTTP layer turns into a `307` to the new leader);
//! 2. it waits until the target has replicated its whole log;
//! 3. it asks the target to campaign (wire kind 5). The target's vote request carries a
//!    log as long as the leader's, and the old leader grants it: a leader's own leader lease
//!    is not refreshed by its heartbeats, so once it has led for longer than the lease
//!    (`election_max_ms`) it votes for an up-to-date candidate and steps down. With three
//!    voters that vote and the candidate's own are a majority, so the new leader is in place
//!    after one round trip. With five, the target needs the other followers too, and they
//!    turn it down while their lease of the leader runs, so the leader first stops
//!    heartbeating for one lease (`election_max_ms`, 300 ms): their own election timers
//!    would fire only after lease + election timeout, so the target campaigns first.
//! 4. if no new leader shows up soon, it asks again, until the deadline. (A leader that led
//!    for less than its lease turns the first campaign down, but steps down on seeing the
//!    target's higher term, and then grants the second.)
//!
//! Shedding: a node that is draining (maintenance mark), shutting down, whose storage is
//! unhealthy or whose cluster-plane egress fails stops campaigning, refuses transfers to itself, and hands its leaderships away.
//! One whose cold store is unhealthy does the last two but keeps campaigning (see
//! [`ShedState::should_campaign`]).

use super::*;

use std::sync::atomic::AtomicU32;

use crate::network::TransportError;
use crate::wire::{self, ElectResult};

/// How long the leader waits for a target's answer to an elect request.
const ELECT_RPC_TIMEOUT: Duration = Duration::from_millis(500);
/// A transfer pauses the group only once the target is at most this many entries behind.
const CATCH_UP_SLACK: u64 = 64;
/// The longest a transfer keeps a group's writes paused; then it gives up (`Timeout`).
const MAX_PAUSE: Duration = Duration::from_millis(1000);

/// How many entries `target` is behind this node's log, by a leader's metrics (`None`: this
/// node does not replicate, i.e. does not lead).
fn behind(m: &openraft::RaftMetrics<u64, BasicNode>, target: u64) -> Option<u64> {
    let next = m.last_log_index.map_or(0, |i| i + 1);
    let have = m
        .replication
        .as_ref()?
        .get(&target)
        .copied()
        .flatten()
        .map_or(0, |l| l.index + 1);
    Some(next.saturating_sub(have))
}

/// Why a transfer did not happen.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TransferError {
    #[error("raft group {0} does not exist")]
    NoSuchGroup(u32),
    #[error("this node does not lead the group (leader: {leader:?})")]
    NotLeader { leader: Option<u64> },
    #[error("node {0} is not a voter of the group")]
    NotVoter(u64),
    #[error("node {target} refused to take the leadership: {reason}")]
    Refused { target: u64, reason: String },
    #[error("the transfer did not complete in time (leader now: {leader:?})")]
    Timeout { leader: Option<u64> },
}

/// Why a node sheds leadership (bit flags; `0` = normal).
pub mod shed {
    /// An operator marked the node for maintenance (`POST /__ursula/leadership-shed/maintenance`).
    pub const MAINTENANCE: u32 = 1;
    /// The node is shutting down.
    pub const SHUTDOWN: u32 = 2;
    /// The node's WAL failed or its disk is full.
    pub const STORAGE: u32 = 4;
    /// The cold store is unhealthy.
    pub const COLD_STORE: u32 = 8;
    /// Cluster-plane probes from this node to a majority of its peers fail (its egress is
    /// unhealthy; `governance.cluster_probe`).
    pub const EGRESS: u32 = 16;
}

/// What a node's shed state means for leadership (`GET /__ursula/leadership-shed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShedState {
    pub bits: u32,
}

impl ShedState {
    pub fn state(&self) -> &'static str {
        let b = self.bits;
        if b == 0 {
            "normal"
        } else if b & shed::SHUTDOWN != 0 {
            "shutting-down"
        } else if b & shed::STORAGE != 0 {
            "storage-unhealthy"
        } else if b & shed::EGRESS != 0 {
            "egress-unhealthy"
        } else if b & shed::COLD_STORE != 0 {
            "cold-store-unhealthy"
        } else {
            "maintenance-drain"
        }
    }
    pub fn should_accept_transfer(&self) -> bool {
        self.bits == 0
    }
    /// An unhealthy cold store alone does not stop campaigning: every node shares that store,
    /// so a peer is likely no better off, and a group that nobody campaigns for loses its hot
    /// writes too.
    pub fn should_campaign(&self) -> bool {
        self.bits & !shed::COLD_STORE == 0
    }
    pub fn should_shed_current_leaders(&self) -> bool {
        self.bits != 0
    }
}

/// The shed bits of a node.
#[derive(Debug, Default)]
pub(super) struct Shed(AtomicU32);

impl Node {
    /// This node's shed state (the storage bit reflects the WAL's health right now).
    pub fn shed_state(&self) -> ShedState {
        let mut bits = self.shed.0.load(Ordering::SeqCst);
        let health = self.wal.health();
        if health.failed().is_some() || health.disk_full() {
            bits |= shed::STORAGE;
        }
        ShedState { bits }
    }

    /// Sets or clears one shed reason ([`shed`]); campaigning follows the result.
    pub fn set_shed(&self, bit: u32, on: bool) -> ShedState {
        if on {
            self.shed.0.fetch_or(bit, Ordering::SeqCst);
        } else {
            self.shed.0.fetch_and(!bit, Ordering::SeqCst);
        }
        let state = self.shed_state();
        for (i, g) in self.groups.iter().enumerate() {
            // A replaced node's groups stay quiet until they rehydrated (rejoin.rs).
            self.rejoin
                .set_elect(i as u32, &g.raft, state.should_campaign());
        }
        state
    }

    /// Brings the storage shed bit in line with the WAL's health right now (a failed WAL, a
    /// full disk): while it is set the node does not campaign, and its leaderships should be
    /// handed away. Returns the new state (`true`: unhealthy) when it changed.
    pub fn follow_storage_health(&self) -> Option<bool> {
        let health = self.wal.health();
        let unhealthy = health.failed().is_some() || health.disk_full();
        let marked = self.shed.0.load(Ordering::SeqCst) & shed::STORAGE != 0;
        if unhealthy == marked {
            return None;
        }
        self.set_shed(shed::STORAGE, unhealthy);
        Some(unhealthy)
    }

    /// Hands `group`'s leadership to `target`; returns the new leader. See the module docs.
    pub async fn transfer_leader(
        &self,
        group: u32,
        target: u64,
        timeout: Duration,
    ) -> Result<u64, TransferError> {
        let g = self
            .groups
            .get(group as usize)
            .ok_or(TransferError::NoSuchGroup(group))?;
        if let Some(leader) = self.not_leading(group) {
            return Err(TransferError::NotLeader { leader });
        }
        let is_voter = g
            .raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .any(|v| v == target);
        if !is_voter {
            return Err(TransferError::NotVoter(target));
        }
        if target == self.node_id {
            return Ok(target);
        }
        if self.transport.is_none() {
            return Err(TransferError::NotVoter(target));
        }
        let deadline = Instant::now() + timeout;
        let left = || deadline.saturating_duration_since(Instant::now());
        let timed_out = || TransferError::Timeout {
            leader: self.leader_of(group),
        };
        // 1. Before pausing anything, let the target come within a few entries of this log
        // (a node that just restarted may be far behind).
        let near = g
            .raft
            .wait(Some(left()))
            .metrics(
                |m| {
                    m.current_leader != Some(self.node_id)
                        || behind(m, target).is_some_and(|n| n <= CATCH_UP_SLACK)
                },
                "transfer target nearly caught up",
            )
            .await;
        match near {
            Ok(m) if m.current_leader != Some(self.node_id) => {
                return Err(TransferError::NotLeader {
                    leader: m.current_leader,
                });
            }
            Ok(_) => {}
            Err(_) => return Err(timed_out()),
        }
        // Then pause: no batch in flight, none submitted until the permits are dropped. The
        // pause is bounded by MAX_PAUSE whatever the caller's deadline: writes wait at most
        // that long for a hand-over that does not come.
        let deadline = deadline.min(Instant::now() + MAX_PAUSE);
        let left = || deadline.saturating_duration_since(Instant::now());
        let paused =
            tokio::time::timeout(left(), g.inflight.acquire_many(MAX_INFLIGHT_BATCHES as u32))
                .await;
        let Ok(Ok(_paused)) = paused else {
            return Err(timed_out());
        };
        // While handing over, this node must not campaign itself: after it votes for the
        // target it would otherwise compete with it (with five voters the target needs the
        // other followers too, whose leases run out only later).
        g.raft.runtime_config().elect(false);
        let result = self.hand_over(g, group, target, deadline).await;
        self.set_heartbeats(group, true);
        self.rejoin
            .set_elect(group, &g.raft, self.shed_state().should_campaign());
        result
    }

    async fn hand_over(
        &self,
        g: &Group,
        group: u32,
        target: u64,
        deadline: Instant,
    ) -> Result<u64, TransferError> {
        let Some(transport) = &self.transport else {
            return Err(TransferError::NotVoter(target));
        };
        let left = || deadline.saturating_duration_since(Instant::now());
        let timed_out = || TransferError::Timeout {
            leader: self.leader_of(group),
        };
        let started = Instant::now();
        // How long to wait for the hand-over before asking again.
        let retry_after = Duration::from_millis(self.timing.election_min_ms);
        let mut asked = 0u32;
        let leader = loop {
            if left().is_zero() {
                return Err(timed_out());
            }
            let m = g.raft.metrics().borrow().clone();
            match m.current_leader {
                Some(l) if l != self.node_id => break l,
                Some(_) => {
                    // 2. The target holds the whole log (or this node stopped leading).
                    let caught_up = g
                        .raft
                        .wait(Some(left()))
                        .metrics(
                            |m| {
                                m.current_leader != Some(self.node_id)
                                    || behind(m, target) == Some(0)
                            },
                            "transfer target caught up",
                        )
                        .await;
                    let Ok(m) = caught_up else {
                        return Err(timed_out());
                    };
                    if m.current_leader != Some(self.node_id) {
                        continue;
                    }
                    // With more than three voters the target needs votes from followers,
                    // which turn it down while their lease of this leader runs: stop
                    // heartbeating and let it run out first (their own election timers fire
                    // only after lease + election timeout, so the target campaigns first).
                    // The same when this node's own storage is unhealthy: it cannot persist
                    // the vote it would grant, so the target needs the other followers.
                    let voters = m.membership_config.membership().voter_ids().count();
                    let storage_down = self.shed_state().bits & shed::STORAGE != 0;
                    if (voters > 3 || storage_down) && asked == 0 {
                        self.set_heartbeats(group, false);
                        let lease = self.timing.election_max_ms + self.timing.heartbeat_ms;
                        tokio::time::sleep(Duration::from_millis(lease).min(left())).await;
                    }
                }
                // This node stepped down and no one leads yet: if the target's first campaign
                // was turned down (this node had led for less than its lease), it stepped
                // down on seeing the target's higher term and now grants a second campaign.
                None => {}
            }
            // 3. Ask the target to campaign.
            asked += 1;
            let answer = transport
                .send(target, wire::encode_elect(group), ELECT_RPC_TIMEOUT)
                .await;
            match answer.map(|a| wire::decode_response::<ElectResult>(&a)) {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(reason))) => return Err(TransferError::Refused { target, reason }),
                Ok(Err(e)) => {
                    return Err(TransferError::Refused {
                        target,
                        reason: format!("bad answer: {e}"),
                    });
                }
                // Maybe delivered: wait and see, then ask again.
                Err(TransportError::Failed(..)) => {}
                Err(e @ TransportError::Unreachable(..)) => {
                    return Err(TransferError::Refused {
                        target,
                        reason: e.to_string(),
                    });
                }
            }
            // 4. Wait for this node to step down, then briefly for the new leader; ask again
            // if none came. The paused writes are answered only after that, so that they
            // redirect instead of failing.
            let _ = g
                .raft
                .wait(Some(retry_after.min(left())))
                .metrics(|m| m.current_leader != Some(self.node_id), "stepped down")
                .await;
            let settle = Duration::from_millis(2 * self.timing.heartbeat_ms);
            let _ = g
                .raft
                .wait(Some(settle.min(left())))
                .metrics(
                    |m| m.current_leader.is_some_and(|l| l != self.node_id),
                    "new leader known",
                )
                .await;
        };
        tracing::info!(
            group,
            target,
            new_leader = leader,
            attempts = asked,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "leadership transferred"
        );
        Ok(leader)
    }

    /// The voter best placed to take `group` over: the one whose replicated log is longest,
    /// skipping `avoid`. `None` if this node does not lead or has no other voter.
    pub fn transfer_target(&self, group: u32, avoid: &[u64]) -> Option<u64> {
        let g = self.groups.get(group as usize)?;
        let m = g.raft.metrics().borrow().clone();
        let rep = m.replication.as_ref()?;
        m.membership_config
            .membership()
            .voter_ids()
            .filter(|&v| v != self.node_id && !avoid.contains(&v))
            .max_by_key(|v| rep.get(v).copied().flatten().map(|l| l.index))
    }

    /// Hands every leadership of this node to other voters, each to the best caught-up one
    /// that accepts; waits at most `timeout` in total. Returns the groups still led.
    ///
    /// A group this node wins while shedding (an election it started before it stopped
    /// campaigning) is handed away too: the groups led are looked at again after every round,
    /// and each group is tried once per call.
    pub async fn shed_leaderships(&self, timeout: Duration) -> Vec<u32> {
        let deadline = Instant::now() + timeout;
        let mut tried: Vec<u32> = Vec::new();
        loop {
            self.settle_campaigns(deadline).await;
            let led: Vec<u32> = self
                .led_groups()
                .into_iter()
                .filter(|g| !tried.contains(g))
                .collect();
            if led.is_empty() || Instant::now() >= deadline {
                break;
            }
            futures::future::join_all(led.iter().map(|&g| self.shed_one(g, deadline))).await;
            tried.extend(led);
        }
        self.led_groups()
    }

    /// Waits (at most one election timeout, and not past `deadline`) for the elections this
    /// node is running as a candidate to end, won or lost: it stopped campaigning, but a vote
    /// already under way can still make it a leader.
    async fn settle_campaigns(&self, deadline: Instant) {
        let until =
            deadline.min(Instant::now() + Duration::from_millis(self.timing.election_max_ms));
        let settles = self.groups.iter().map(|g| async move {
            let left = until.saturating_duration_since(Instant::now());
            let _ = g
                .raft
                .wait(Some(left))
                .metrics(|m| m.state != ServerState::Candidate, "campaign settled")
                .await;
        });
        futures::future::join_all(settles).await;
    }

    /// Hands `group` to the best caught-up voter that accepts, until `deadline`.
    async fn shed_one(&self, group: u32, deadline: Instant) {
        // A group that cannot reach a quorum cannot elect anyone else (the peers are down
        // or cut off): waiting for a hand-over would only delay a shutdown.
        if !self.hears_quorum(group).await {
            tracing::info!(group, "no quorum reachable: not handing over");
            return;
        }
        // Targets that refused are not asked again; targets that were too slow (one
        // attempt pauses the group's writes for at most MAX_PAUSE, which a loaded machine
        // can exceed) are asked again once every other target was tried, while time is
        // left.
        let (mut refused, mut slow) = (Vec::new(), Vec::<u64>::new());
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let avoid: Vec<u64> = refused.iter().chain(&slow).copied().collect();
            let target = match self.transfer_target(group, &avoid) {
                Some(t) => t,
                None if !slow.is_empty() => {
                    slow.clear();
                    let pause = Duration::from_millis(self.timing.heartbeat_ms);
                    tokio::time::sleep(pause.min(left)).await;
                    continue;
                }
                None => break,
            };
            match self.transfer_leader(group, target, left).await {
                Ok(_) | Err(TransferError::NotLeader { .. }) => return,
                Err(TransferError::Refused { target, reason }) => {
                    tracing::info!(group, target, %reason, "transfer target refused");
                    refused.push(target);
                }
                Err(e @ TransferError::Timeout { .. }) => {
                    tracing::info!(group, target, error = %e, "trying another target");
                    slow.push(target);
                }
                Err(e) => {
                    tracing::warn!(group, target, error = %e, "leadership transfer failed");
                    return;
                }
            }
        }
    }

    /// Whether this leader of `group` is in touch with a quorum: it heard from one within a
    /// lease, or a read-index round ([`Node::ensure_linearizable`], bounded by a lease)
    /// confirms it now. The metrics alone are not enough: on a loaded machine an idle group's
    /// last acknowledgement can be a little older than a lease while its peers are reachable.
    async fn hears_quorum(&self, group: u32) -> bool {
        let lease = self.timing.election_max_ms;
        let recent = self
            .group_metrics(group)
            .since_quorum_ack_ms
            .is_some_and(|ms| ms <= lease);
        recent
            || matches!(
                tokio::time::timeout(
                    Duration::from_millis(lease),
                    self.ensure_linearizable(group)
                )
                .await,
                Ok(Ok(()))
            )
    }

    /// The receiving side of a transfer: campaign for `group` now, unless this node sheds.
    pub(super) async fn campaign(&self, group: u32) -> Result<(), String> {
        let state = self.shed_state();
        if !state.should_accept_transfer() {
            return Err(format!("node {} is {}", self.node_id, state.state()));
        }
        let g = self
            .groups
            .get(group as usize)
            .ok_or_else(|| format!("no raft group {group}"))?;
        g.raft.trigger().elect().await.map_err(|e| e.to_string())
    }
}
