//! `prepare-restart --node N` (cluster.md §10): what a node needs before the platform
//! restarts it. A disk WAL survives the restart, so nothing; a memory WAL comes back empty,
//! so every group's leader arms one empty-log rejoin for it. Fails closed: every node must
//! answer and all must report the same `wal_backend`.

use crate::rejoin::allow_one;
use crate::view::Sample;
use crate::{CtlError, Ctx, Out};

/// The cluster's WAL backend from one sample, or why it cannot be trusted.
pub fn agreed_backend(s: &Sample) -> Result<String, String> {
    let mut seen: Vec<(u64, String)> = Vec::new();
    for (n, m) in &s.nodes {
        match m {
            Err(e) => {
                return Err(format!(
                    "node {} did not answer ({e}); cannot confirm the WAL backend",
                    n.id
                ));
            }
            Ok(m) => match &m.wal_backend {
                Some(b) => seen.push((n.id, b.clone())),
                None => return Err(format!("node {} reports no wal_backend", n.id)),
            },
        }
    }
    let Some((_, first)) = seen.first() else {
        return Err("the manifest names no node".into());
    };
    if seen.iter().any(|(_, b)| b != first) {
        let list: Vec<String> = seen.iter().map(|(n, b)| format!("node {n}={b}")).collect();
        return Err(format!(
            "the nodes disagree on wal_backend ({})",
            list.join(", ")
        ));
    }
    Ok(first.clone())
}

/// `prepare-restart --node N`.
pub(crate) async fn prepare_restart(ctx: &Ctx, node: u64, out: &mut Out) -> Result<(), CtlError> {
    ctx.manifest.node(node)?;
    let s = Sample::take(&ctx.client, &ctx.manifest).await;
    let backend = agreed_backend(&s).map_err(|e| CtlError::safety(format!("{e}; refusing")))?;
    let led = s.of(node).map(|m| m.led()).unwrap_or_default();
    if !led.is_empty() {
        out.line(format!(
            "note: node {node} still leads groups {led:?}; drain it first (ursulactl drain --node {node})"
        ));
    }
    match backend.as_str() {
        "disk" => {
            out.line(format!(
                "every node reports wal_backend = \"disk\": node {node} keeps its log across the restart; nothing to prepare"
            ));
            Ok(())
        }
        "memory" => {
            let groups = s.group_ids();
            let mut armed = 0;
            for g in &groups {
                if allow_one(ctx, *g, node, out).await? {
                    armed += 1;
                }
            }
            out.line(format!(
                "wal_backend = \"memory\": armed one empty-log rejoin of node {node} in {armed} of {} groups",
                groups.len()
            ));
            Ok(())
        }
        other => Err(CtlError::safety(format!(
            "unknown wal_backend {other:?}; refusing"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::NodeEntry;
    use crate::view::NodeMetrics;

    fn node(id: u64, backend: Option<&str>) -> (NodeEntry, Result<NodeMetrics, String>) {
        let j = serde_json::json!({"raft_node_id": id, "raft_groups": [], "wal_backend": backend});
        let e = NodeEntry {
            id,
            admin_url: String::new(),
            http_url: String::new(),
        };
        (e, NodeMetrics::parse(&j))
    }

    #[test]
    fn the_backend_counts_only_when_every_node_agrees() {
        let s = |ns| Sample { nodes: ns };
        assert_eq!(
            agreed_backend(&s(vec![node(1, Some("disk")), node(2, Some("disk"))])),
            Ok("disk".to_owned())
        );
        let e = agreed_backend(&s(vec![node(1, Some("disk")), node(2, Some("memory"))]));
        assert!(e.unwrap_err().contains("node 1=disk, node 2=memory"));
        let e = agreed_backend(&s(vec![node(1, Some("disk")), node(2, None)]));
        assert!(e.unwrap_err().contains("node 2 reports no wal_backend"));
        let mut down = node(2, Some("disk"));
        down.1 = Err("refused".into());
        let e = agreed_backend(&s(vec![node(1, Some("disk")), down]));
        assert!(e.unwrap_err().contains("node 2 did not answer"));
        assert!(agreed_backend(&s(vec![])).is_err());
    }
}
