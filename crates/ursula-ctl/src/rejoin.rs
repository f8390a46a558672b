//! `allow-next-revert` and `allow-rejoin` (cluster.md §5.3, §9.6): let a node whose data dir
//! was wiped take part in a group again, one group at a time, on the group's leader.

use crate::leadership::call_leader;
use crate::view::Sample;
use crate::{CtlError, Ctx, Out};

fn path(group: u32, node: u64) -> String {
    format!("/__ursula/raft/{group}/nodes/{node}/allow-next-revert")
}

/// One group: asks its leader; `Ok(false)` if `node` itself leads it (nothing to allow).
pub(crate) async fn allow_one(
    ctx: &Ctx,
    group: u32,
    node: u64,
    out: &mut Out,
) -> Result<bool, CtlError> {
    let r = call_leader(ctx, group, |_| path(group, node), |l| l == node).await?;
    let Some((leader, a)) = r else {
        out.line(format!(
            "group {group}: node {node} leads it; nothing to allow"
        ));
        return Ok(false);
    };
    if a.status != 200 {
        return Err(CtlError::config(format!(
            "allow-next-revert of node {node} in group {group} refused by node {leader}: HTTP {}: {}",
            a.status,
            a.error_message()
        )));
    }
    out.line(format!(
        "group {group}: node {leader} allows node {node} to rejoin{}",
        a.json["commit_index"]
            .as_u64()
            .map(|c| format!(" (it must apply up to index {c} before voting)"))
            .unwrap_or_default()
    ));
    Ok(true)
}

/// `allow-next-revert --group G --node N`.
pub async fn allow_next_revert(
    ctx: &Ctx,
    group: u32,
    node: u64,
    out: &mut Out,
) -> Result<(), CtlError> {
    ctx.manifest.node(node)?;
    allow_one(ctx, group, node, out).await.map(|_| ())
}

/// `allow-rejoin --node N`: every group node N reports awaiting permission in. On a disk-WAL
/// cluster only a node that says its log was wiped gets permissions (a node that kept its
/// log needs none); the nodes must agree on the WAL backend.
pub async fn allow_rejoin(ctx: &Ctx, node: u64, out: &mut Out) -> Result<(), CtlError> {
    ctx.manifest.node(node)?;
    let s = Sample::take(&ctx.client, &ctx.manifest).await;
    let mut backends: Vec<&str> = s
        .reachable()
        .filter_map(|(_, m)| m.wal_backend.as_deref())
        .collect();
    backends.sort_unstable();
    backends.dedup();
    if backends.len() > 1 {
        return Err(CtlError::safety(format!(
            "the nodes disagree on wal_backend ({}); refusing",
            backends.join(", ")
        )));
    }
    let Some(m) = s.of(node) else {
        return Err(CtlError::config(format!(
            "node {node} did not answer; it must run (and report which groups await permission)"
        )));
    };
    let groups: Vec<u32> = if backends.first() == Some(&"memory") {
        s.group_ids()
    } else {
        m.awaiting_permission.clone()
    };
    if groups.is_empty() {
        out.line(format!(
            "node {node} awaits no permission (its log is intact{}); nothing to do",
            if m.rehydrating.is_empty() {
                String::new()
            } else {
                format!(", still rehydrating groups {:?}", m.rehydrating)
            }
        ));
        return Ok(());
    }
    let mut allowed = 0;
    for g in &groups {
        if allow_one(ctx, *g, node, out).await? {
            allowed += 1;
        }
    }
    out.line(format!(
        "node {node}: allowed in {allowed} of {} groups",
        groups.len()
    ));
    Ok(())
}
