//! [`GroupMetrics`]: what an operator needs to see of one group's Raft state, without
//! openraft's types.

use openraft::ServerState;

/// One group's Raft state on this node ([`crate::Node::group_metrics`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMetrics {
    pub group: u32,
    /// 0 follower, 1 candidate, 2 leader, 3 learner, 4 shut down.
    pub role: u64,
    pub term: u64,
    /// The leader's node id (0: none known).
    pub leader: u64,
    /// Entries in the log (last index + 1).
    pub last_log: u64,
    /// Entries applied (last applied index + 1).
    pub last_applied: u64,
    /// On a leader: milliseconds since a quorum last acknowledged it.
    pub since_quorum_ack_ms: Option<u64>,
    /// On a leader: `(peer, entries it is behind the leader's log)`.
    pub replication: Vec<(u64, u64)>,
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
    GroupMetrics {
        group,
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
        since_quorum_ack_ms: m.millis_since_quorum_ack,
        replication,
    }
}
