//! [`GroupMetrics`]: what an operator needs to see of one group's Raft state, without
//! openraft's types.

use std::time::Duration;

use openraft::{LogId, ServerState};

/// One group's Raft state on this node ([`crate::Node::group_metrics`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupMetrics {
    pub group: u32,
    /// This node's id.
    pub node_id: u64,
    /// 0 follower, 1 candidate, 2 leader, 3 learner, 4 shut down.
    pub role: u64,
    pub term: u64,
    /// The leader's node id (0: none known).
    pub leader: u64,
    /// Entries in the log (last index + 1).
    pub last_log: u64,
    /// Entries applied (last applied index + 1).
    pub last_applied: u64,
    /// Terms this group began since this process opened it: every election (won or not)
    /// starts a new term, so this counts elections seen by this node.
    pub elections: u64,
    /// On a leader: milliseconds since a quorum last acknowledged it.
    pub since_quorum_ack_ms: Option<u64>,
    /// On a leader: `(peer, entries it is behind the leader's log)`.
    pub replication: Vec<(u64, u64)>,
    /// The last log index (`None`: empty log).
    pub last_log_index: Option<u64>,
    /// `(term, index)` of the last applied entry.
    pub applied_id: Option<(u64, u64)>,
    /// `(term, index)` of the last entry known committed. Only [`crate::Node::group_committed`]
    /// fills it (it asks the group's Raft core); `None` from [`crate::Node::group_metrics`].
    pub committed_id: Option<(u64, u64)>,
    /// `(term, index)` of the last entry the latest snapshot covers.
    pub snapshot_id: Option<(u64, u64)>,
    /// `(term, index)` of the last entry purged from the log.
    pub purged_id: Option<(u64, u64)>,
    /// Voters of the group's effective membership (every config of a joint one).
    pub voter_ids: Vec<u64>,
    /// Members of the effective membership that are not voters.
    pub learner_ids: Vec<u64>,
    /// Bytes of the group's latest snapshot file (0: none).
    pub snapshot_bytes: u64,
    /// Encoded bytes of the log entries the group still holds (those after its snapshot).
    pub log_bytes: u64,
}

fn pair(l: &Option<LogId<u64>>) -> Option<(u64, u64)> {
    l.as_ref().map(|l| (l.leader_id.term, l.index))
}

pub(crate) fn of(group: u32, m: &openraft::RaftMetrics<u64, openraft::BasicNode>) -> GroupMetrics {
    let last_log = m.last_log_index.map_or(0, |i| i + 1);
    let replication = m
        .replication
        .as_ref()
        .map(|r| {
            r.iter()
                .filter(|(peer, _)| **peer != m.id)
                .map(|(peer, matched)| {
                    let have = matched.map_or(0, |l| l.index + 1);
                    (*peer, last_log.saturating_sub(have))
                })
                .collect()
        })
        .unwrap_or_default();
    let membership = m.membership_config.membership();
    let voter_ids: Vec<u64> = membership.voter_ids().collect();
    let learner_ids = membership.learner_ids().collect();
    GroupMetrics {
        group,
        node_id: m.id,
        role: match m.state {
            ServerState::Follower => 0,
            ServerState::Candidate => 1,
            ServerState::Leader => 2,
            ServerState::Learner => 3,
            ServerState::Shutdown => 4,
        },
        term: m.current_term,
        leader: m.current_leader.unwrap_or(0),
        last_log,
        last_applied: m.last_applied.map_or(0, |l| l.index + 1),
        elections: 0,
        since_quorum_ack_ms: m.millis_since_quorum_ack,
        replication,
        last_log_index: m.last_log_index,
        applied_id: pair(&m.last_applied),
        committed_id: None,
        snapshot_id: pair(&m.snapshot),
        purged_id: pair(&m.purged),
        voter_ids,
        learner_ids,
        snapshot_bytes: 0,
        log_bytes: 0,
    }
}

impl crate::Node {
    /// `(term, index)` of the last entry `group`'s Raft core knows committed, asked of the core
    /// itself; `None` if nothing is committed, or the core did not answer within `wait` (a
    /// busy or stopped core). Never blocks longer than `wait`.
    ///
    /// # Panics
    /// If `group >= self.group_count()`.
    pub async fn group_committed(&self, group: u32, wait: Duration) -> Option<(u64, u64)> {
        let ask = self.raft(group).with_raft_state(|st| pair(&st.committed));
        tokio::time::timeout(wait, ask).await.ok()?.ok()?
    }
}
