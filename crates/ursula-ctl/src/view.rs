//! What the nodes' metrics say (cluster.md §9.1): one sample of every node, and the questions
//! the verbs ask of it (who leads a group, what a node leads).

use std::collections::BTreeMap;

use crate::client::Client;
use crate::manifest::{Manifest, NodeEntry};

/// One group as one node sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupView {
    pub id: u32,
    pub leader: Option<u64>,
    pub term: u64,
    pub voters: Vec<u64>,
    /// The last log index (`None`: empty log or not reported).
    pub last_log_index: Option<u64>,
    pub committed_index: Option<u64>,
}

/// One node's metrics, the fields the CLI uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeMetrics {
    /// The node id the node reports (the manifest may be wrong).
    pub node_id: u64,
    pub group_count: u64,
    pub wal_backend: Option<String>,
    pub groups: Vec<GroupView>,
    /// Groups this node refuses to take part in until a leader allows it (a wiped data dir).
    pub awaiting_permission: Vec<u32>,
    /// Groups this node is rehydrating (permission given, not caught up yet).
    pub rehydrating: Vec<u32>,
}

impl NodeMetrics {
    /// Reads the fields from `GET /__ursula/metrics` JSON.
    pub fn parse(j: &serde_json::Value) -> Result<NodeMetrics, String> {
        let groups_json = j["raft_groups"]
            .as_array()
            .ok_or("metrics have no raft_groups array (is the node older than ursulactl?)")?;
        let mut groups = Vec::with_capacity(groups_json.len());
        let mut node_id = 0;
        for g in groups_json {
            let id = g["raft_group_id"]
                .as_u64()
                .and_then(|v| u32::try_from(v).ok())
                .ok_or("a raft_groups entry has no raft_group_id")?;
            node_id = g["node_id"].as_u64().unwrap_or(node_id);
            groups.push(GroupView {
                id,
                leader: g["current_leader"].as_u64().filter(|&l| l != 0),
                term: g["current_term"].as_u64().unwrap_or(0),
                voters: ids(&g["voter_ids"]),
                last_log_index: g["last_log_index"].as_u64(),
                committed_index: g["committed_index"].as_u64(),
            });
        }
        if let Some(n) = j["raft_node_id"].as_u64() {
            node_id = n;
        }
        let ints = |v: &serde_json::Value| -> Vec<u32> {
            ids(v)
                .into_iter()
                .filter_map(|i| u32::try_from(i).ok())
                .collect()
        };
        Ok(NodeMetrics {
            node_id,
            group_count: j["raft_group_count"]
                .as_u64()
                .unwrap_or(groups.len() as u64),
            wal_backend: j["wal_backend"].as_str().map(str::to_owned),
            groups,
            awaiting_permission: ints(&j["rejoin"]["awaiting_permission"]),
            rehydrating: ints(&j["rejoin"]["rehydrating"]),
        })
    }

    /// Groups this node reports itself leader of.
    pub fn led(&self) -> Vec<u32> {
        self.groups
            .iter()
            .filter(|g| g.leader == Some(self.node_id))
            .map(|g| g.id)
            .collect()
    }

    /// Groups without a known leader here.
    pub fn leaderless(&self) -> Vec<u32> {
        self.groups
            .iter()
            .filter(|g| g.leader.is_none())
            .map(|g| g.id)
            .collect()
    }
}

fn ids(v: &serde_json::Value) -> Vec<u64> {
    v.as_array()
        .map(|a| a.iter().filter_map(serde_json::Value::as_u64).collect())
        .unwrap_or_default()
}

/// Every node's metrics at (about) one moment: `Err` for a node that did not answer.
#[derive(Debug, Clone)]
pub struct Sample {
    pub nodes: Vec<(NodeEntry, Result<NodeMetrics, String>)>,
}

impl Sample {
    /// Reads every node's metrics concurrently from its client-plane URL.
    pub async fn take(client: &Client, manifest: &Manifest) -> Sample {
        let reads = manifest.nodes.iter().map(|n| async move {
            let url = format!("{}/__ursula/metrics", n.http_url);
            let m = client
                .get_json(&url)
                .await
                .and_then(|j| NodeMetrics::parse(&j));
            (n.clone(), m)
        });
        Sample {
            nodes: futures::future::join_all(reads).await,
        }
    }

    /// The nodes that answered.
    pub fn reachable(&self) -> impl Iterator<Item = (&NodeEntry, &NodeMetrics)> {
        self.nodes
            .iter()
            .filter_map(|(n, m)| m.as_ref().ok().map(|m| (n, m)))
    }

    /// The metrics of node `id`, if it answered.
    pub fn of(&self, id: u64) -> Option<&NodeMetrics> {
        self.reachable().find(|(n, _)| n.id == id).map(|(_, m)| m)
    }

    /// Who leads `group`: a node that reports itself its leader (the highest term wins if two
    /// do, one of them stale), else the leader most answering nodes name.
    pub fn leader_of(&self, group: u32) -> Option<u64> {
        let views: Vec<(u64, &GroupView)> = self
            .reachable()
            .filter_map(|(n, m)| m.groups.iter().find(|g| g.id == group).map(|g| (n.id, g)))
            .collect();
        let selfish = views
            .iter()
            .filter(|(n, g)| g.leader == Some(*n))
            .max_by_key(|(_, g)| g.term);
        if let Some((n, _)) = selfish {
            return Some(*n);
        }
        let mut votes: BTreeMap<u64, usize> = BTreeMap::new();
        for (_, g) in &views {
            if let Some(l) = g.leader {
                *votes.entry(l).or_default() += 1;
            }
        }
        votes.into_iter().max_by_key(|(_, c)| *c).map(|(l, _)| l)
    }

    /// The view of `group` from the node that leads it (see [`Sample::leader_of`]), if that
    /// node answered.
    pub fn leader_view(&self, group: u32) -> Option<(u64, &GroupView)> {
        let l = self.leader_of(group)?;
        let g = self.of(l)?.groups.iter().find(|g| g.id == group)?;
        Some((l, g))
    }

    /// Every group id any node reports, ascending.
    pub fn group_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self
            .reachable()
            .flat_map(|(_, m)| m.groups.iter().map(|g| g.id))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(id: u64, groups: serde_json::Value) -> (NodeEntry, Result<NodeMetrics, String>) {
        let j = json!({"raft_node_id": id, "raft_group_count": 2, "wal_backend": "disk",
                       "raft_groups": groups});
        let e = NodeEntry {
            id,
            admin_url: String::new(),
            http_url: String::new(),
        };
        (e, NodeMetrics::parse(&j))
    }

    #[test]
    fn leader_is_whoever_claims_it_with_the_highest_term() {
        let s = Sample {
            nodes: vec![
                node(
                    1,
                    json!([{"raft_group_id":0,"current_leader":1,"current_term":3},
                               {"raft_group_id":1,"current_leader":null,"current_term":3}]),
                ),
                node(
                    2,
                    json!([{"raft_group_id":0,"current_leader":2,"current_term":4},
                               {"raft_group_id":1,"current_leader":3,"current_term":3}]),
                ),
                (
                    NodeEntry {
                        id: 3,
                        admin_url: String::new(),
                        http_url: String::new(),
                    },
                    Err("down".into()),
                ),
            ],
        };
        assert_eq!(s.leader_of(0), Some(2));
        assert_eq!(s.leader_of(1), Some(3));
        assert_eq!(s.leader_of(9), None);
        assert_eq!(s.group_ids(), vec![0, 1]);
        let m1 = s.of(1).unwrap_or_else(|| panic!("node 1"));
        assert_eq!(m1.led(), vec![0]);
        assert_eq!(m1.leaderless(), vec![1]);
        assert!(s.of(3).is_none());
    }
}
