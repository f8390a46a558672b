//! `status` and `wait-ready`: read-only views of every node's metrics.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::view::Sample;
use crate::{CtlError, Ctx, Out};

/// How often `wait-ready` samples the nodes.
const POLL: Duration = Duration::from_millis(250);

fn list(ids: &[u32]) -> String {
    if ids.is_empty() {
        return "none".into();
    }
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// `status`: one line per node and a cluster summary (or one JSON document). Unreachable nodes
/// are reported, not fatal; the command fails only if no node answers.
pub async fn status(ctx: &Ctx, json: bool, out: &mut Out) -> Result<(), CtlError> {
    let s = Sample::take(&ctx.client, &ctx.manifest).await;
    let groups = s.group_ids();
    let cluster_leaderless: Vec<u32> = groups
        .iter()
        .copied()
        .filter(|g| s.leader_of(*g).is_none())
        .collect();
    let mut leaders: BTreeMap<u64, usize> = BTreeMap::new();
    for g in &groups {
        if let Some(l) = s.leader_of(*g) {
            *leaders.entry(l).or_default() += 1;
        }
    }
    if json {
        let nodes: Vec<serde_json::Value> = s
            .nodes
            .iter()
            .map(|(n, m)| match m {
                Ok(m) => serde_json::json!({
                    "id": n.id, "url": n.http_url, "reachable": true,
                    "reported_node_id": m.node_id,
                    "group_count": m.group_count, "led": m.led(),
                    "leaderless": m.leaderless(), "wal_backend": m.wal_backend,
                    "awaiting_permission": m.awaiting_permission,
                    "rehydrating": m.rehydrating,
                }),
                Err(e) => serde_json::json!({
                    "id": n.id, "url": n.http_url, "reachable": false, "error": e,
                }),
            })
            .collect();
        let doc = serde_json::json!({
            "nodes": nodes,
            "groups": groups.len(),
            "leaders_per_node": leaders.iter().map(|(k, v)| (k.to_string(), *v)).collect::<BTreeMap<_, _>>(),
            "leaderless_groups": cluster_leaderless,
        });
        out.line(doc.to_string());
    } else {
        for (n, m) in &s.nodes {
            match m {
                Ok(m) => {
                    let mut line = format!(
                        "node {} {}: groups={} led={} [{}] leaderless={} [{}]",
                        n.id,
                        n.http_url,
                        m.group_count,
                        m.led().len(),
                        list(&m.led()),
                        m.leaderless().len(),
                        list(&m.leaderless()),
                    );
                    if m.node_id != n.id {
                        line.push_str(&format!(" REPORTS-NODE-ID={}", m.node_id));
                    }
                    if !m.awaiting_permission.is_empty() {
                        line.push_str(&format!(
                            " awaiting-permission=[{}]",
                            list(&m.awaiting_permission)
                        ));
                    }
                    if !m.rehydrating.is_empty() {
                        line.push_str(&format!(" rehydrating=[{}]", list(&m.rehydrating)));
                    }
                    out.line(line);
                }
                Err(e) => out.line(format!("node {} {}: unreachable: {e}", n.id, n.http_url)),
            }
        }
        let spread: Vec<String> = leaders
            .iter()
            .map(|(n, c)| format!("node {n}={c}"))
            .collect();
        out.line(format!(
            "cluster: groups={} leaders: {} leaderless groups: {}",
            groups.len(),
            if spread.is_empty() {
                "none".into()
            } else {
                spread.join(" ")
            },
            list(&cluster_leaderless)
        ));
    }
    if s.reachable().next().is_none() {
        return Err(CtlError::config("no node of the manifest answered"));
    }
    Ok(())
}

/// What keeps the cluster from being ready in one sample (empty: ready). A node reporting a
/// different id than the manifest gives is a configuration error.
fn not_ready(s: &Sample, expected: u64) -> Result<Vec<String>, CtlError> {
    let mut why = Vec::new();
    for (n, m) in &s.nodes {
        match m {
            Err(e) => why.push(format!("node {} unreachable ({e})", n.id)),
            Ok(m) => {
                if m.node_id != n.id {
                    return Err(CtlError::config(format!(
                        "the manifest says node {} is at {}, but it reports node_id {}",
                        n.id, n.http_url, m.node_id
                    )));
                }
                if m.group_count != expected || m.groups.len() as u64 != expected {
                    why.push(format!(
                        "node {} reports {} groups, expected {expected}",
                        n.id, m.group_count
                    ));
                }
                let leaderless = m.leaderless();
                if !leaderless.is_empty() {
                    why.push(format!(
                        "node {} sees no leader for groups {}",
                        n.id,
                        list(&leaderless)
                    ));
                }
            }
        }
    }
    Ok(why)
}

/// `wait-ready`: until every node reports `expected` groups and every group has a leader;
/// exit 2 (a gate that did not open) when `timeout_secs` pass first.
pub async fn wait_ready(
    ctx: &Ctx,
    expected: u64,
    timeout_secs: u64,
    out: &mut Out,
) -> Result<(), CtlError> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(timeout_secs);
    loop {
        let s = Sample::take(&ctx.client, &ctx.manifest).await;
        let why = not_ready(&s, expected)?;
        if why.is_empty() {
            out.line(format!(
                "ready: {} nodes, {expected} groups each, every group has a leader ({} ms)",
                s.nodes.len(),
                started.elapsed().as_millis()
            ));
            return Ok(());
        }
        if Instant::now() + POLL > deadline {
            return Err(CtlError::safety(format!(
                "wait-ready timed out after {timeout_secs} s: {}",
                why.join("; ")
            )));
        }
        tokio::time::sleep(POLL).await;
    }
}
