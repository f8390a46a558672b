//! Membership and leadership: the peer set, election timing, who leads a group, leader reads.

use super::*;

use openraft::error::CheckIsLeaderError;

/// Election and heartbeat timing of every group (milliseconds).
///
/// The defaults aim at writes resuming well within a second of a leader's death. A leader
/// heartbeats every 100 ms. openraft 0.9 lets a follower campaign only once its leader lease
/// (fixed to `election_max_ms`) plus its election timeout (drawn once per group and node from
/// `election_min_ms..election_max_ms`) have passed since it last heard from the leader, so a
/// dead leader's groups have a new one after 550-700 ms plus a vote round trip. A node that
/// was once turned down for a shorter log waits another `2 x election_max_ms` (700 ms) on its
/// next try (openraft clears that mark only when it campaigns), so the worst single election
/// is about 1.4 s; measured over real processes: see docs/cluster.md.
///
/// openraft also gives up on an append-entries RPC after `heartbeat_ms`, entries included, so
/// a follower's WAL write and fsync must fit in it; 50 ms made a loaded disk miss it (the
/// leader retries, commits take seconds, leaderships move), so the heartbeat is 100 ms.
///
/// The cost: each leader sends each peer 10 heartbeats per group per second (4 groups, 2
/// peers: 80 small RPCs per second; 64 groups: 1280), and a node that stalls for about
/// 550 ms (a saturated disk or CPU, a frozen VM) loses its leaderships, which is safe but
/// costs an election. Slower networks and disks want larger values (`[raft]
/// heartbeat_interval`, `election_timeout_min`, `election_timeout_max`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RaftTiming {
    pub heartbeat_ms: u64,
    pub election_min_ms: u64,
    pub election_max_ms: u64,
}

impl Default for RaftTiming {
    fn default() -> Self {
        RaftTiming {
            heartbeat_ms: 100,
            election_min_ms: 200,
            election_max_ms: 350,
        }
    }
}

/// How long a leader read waits to confirm leadership with a quorum.
const LINEARIZABLE_TIMEOUT: Duration = Duration::from_secs(3);

fn valid_cluster_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Checks the membership part of a [`NodeConfig`].
pub(super) fn validate(cfg: &NodeConfig) -> Result<(), RaftError> {
    if cfg.node_id == 0 {
        return Err(RaftError::Config("raft.node_id must be non-zero".into()));
    }
    if !cfg.peers.is_empty() && !cfg.peers.contains_key(&cfg.node_id) {
        return Err(RaftError::Config(format!(
            "raft.node_id {} is not one of raft.peers ({:?})",
            cfg.node_id,
            cfg.peers.keys().collect::<Vec<_>>()
        )));
    }
    if cfg.peers.contains_key(&0) {
        return Err(RaftError::Config(
            "a peer's node_id must be non-zero".into(),
        ));
    }
    if cfg.peers.len() > 1 && cfg.transport.is_none() {
        return Err(RaftError::Config(
            "a node with peers needs a transport".into(),
        ));
    }
    if let Some(id) = &cfg.cluster_id
        && !valid_cluster_id(id)
    {
        return Err(RaftError::Config(format!(
            "cluster_id {id:?} must be 1-128 characters of A-Z a-z 0-9 . _ -"
        )));
    }
    let t = cfg.timing;
    if t.heartbeat_ms == 0
        || t.election_min_ms <= t.heartbeat_ms
        || t.election_max_ms <= t.election_min_ms
    {
        return Err(RaftError::Config(format!(
            "raft timing needs 0 < heartbeat < election_min < election_max (got {t:?})"
        )));
    }
    Ok(())
}

impl Node {
    /// Whether this node runs with other voters.
    pub fn has_peers(&self) -> bool {
        self.peers.keys().any(|&id| id != self.node_id)
    }

    /// How the RPCs to peers travelled: batches and single frames (`coalesce.rs`). `None`
    /// without peers.
    pub fn rpc_batching(&self) -> Option<&crate::CoalesceStats> {
        self.transport.as_deref().map(|t| t.stats())
    }

    /// The voters (this node included): id -> peer URL. Empty without peers.
    pub fn peers(&self) -> &BTreeMap<u64, String> {
        &self.peers
    }

    /// The peer URL of `node` (`[[raft.peers]].url`).
    pub fn peer_url(&self, node: u64) -> Option<&str> {
        self.peers.get(&node).map(String::as_str)
    }

    /// Who leads `group` as far as this node knows; `None` during an election.
    pub fn leader_of(&self, group: u32) -> Option<u64> {
        self.groups
            .get(group as usize)?
            .raft
            .metrics()
            .borrow()
            .current_leader
    }

    /// `None` if this node leads `group`; else who does (`Some(None)`: no one known).
    pub(super) fn not_leading(&self, group: u32) -> Option<Option<u64>> {
        let g = self.groups.get(group as usize)?;
        let m = g.raft.metrics();
        let m = m.borrow();
        if m.state == ServerState::Leader && m.current_leader == Some(self.node_id) {
            None
        } else {
            Some(m.current_leader.filter(|&l| l != self.node_id))
        }
    }

    /// Milliseconds since this node opened (its own monotonic clock).
    pub(super) fn clock_ms(&self) -> u64 {
        self.clock.elapsed().as_millis() as u64
    }

    /// Where a client of `group` should go: its leader as [`Node::leader_of`] knows it, but
    /// `None` when that is another node whose append-entries have not reached this one for
    /// longer than a lease plus a heartbeat. Such a leader died or is cut off from here, and
    /// this node may not campaign to replace it (a shed state, e.g. unhealthy egress, or no
    /// quorum to win with): a redirect would only send clients to a node that does not answer,
    /// for as long as the outage lasts. `None` lets them hear "no leader, retry" instead.
    pub fn reachable_leader(&self, group: u32) -> Option<u64> {
        let leader = self.leader_of(group)?;
        if leader == self.node_id {
            return Some(leader);
        }
        let g = self.groups.get(group as usize)?;
        let silent_ms = self
            .clock_ms()
            .saturating_sub(g.heard_ms.load(Ordering::Relaxed));
        (silent_ms <= self.timing.election_max_ms + self.timing.heartbeat_ms).then_some(leader)
    }

    /// Confirms with a quorum that this node still leads `group` and waits until it has applied
    /// everything committed before the call (a read index), so that a read of the state right
    /// after is linearizable with every acknowledged write.
    pub async fn ensure_linearizable(&self, group: u32) -> Result<(), ProposeError> {
        let g = self
            .groups
            .get(group as usize)
            .ok_or(ProposeError::NoSuchGroup(group))?;
        if let Some(leader) = self.not_leading(group) {
            return Err(ProposeError::ForwardToLeader { leader });
        }
        match tokio::time::timeout(LINEARIZABLE_TIMEOUT, g.raft.ensure_linearizable()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(openraft::error::RaftError::APIError(CheckIsLeaderError::ForwardToLeader(
                f,
            )))) => Err(ProposeError::ForwardToLeader {
                leader: f.leader_id.filter(|&l| l != self.node_id),
            }),
            Ok(Err(openraft::error::RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(
                _,
            ))))
            | Err(_) => Err(ProposeError::ForwardToLeader { leader: None }),
            Ok(Err(openraft::error::RaftError::Fatal(e))) => {
                Err(ProposeError::Unavailable(e.to_string()))
            }
        }
    }

    /// Waits up to `timeout` until `group` has a known leader; returns it.
    pub async fn wait_for_leader(&self, group: u32, timeout: Duration) -> Option<u64> {
        let g = self.groups.get(group as usize)?;
        g.raft
            .wait(Some(timeout))
            .metrics(|m| m.current_leader.is_some(), "a known leader")
            .await
            .ok()?
            .current_leader
    }

    /// Waits up to `timeout` (in total) until every group has a known leader; returns the groups
    /// that still have none.
    pub async fn wait_for_leaders(&self, timeout: Duration) -> Vec<u32> {
        let deadline = Instant::now() + timeout;
        for group in 0..self.group_count() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            self.wait_for_leader(group, left).await;
        }
        self.leaderless_groups()
    }

    /// Groups this node leads right now.
    pub fn led_groups(&self) -> Vec<u32> {
        (0..self.group_count())
            .filter(|&g| self.not_leading(g).is_none())
            .collect()
    }
}
