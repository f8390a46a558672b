//! `transfer-leader`, `drain` and `undrain` (cluster.md §9.6, §10).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use http::Method;

use crate::client::Answer;
use crate::view::Sample;
use crate::{CtlError, Ctx, Out};

/// Attempts at finding a group's leader and calling it (leadership may move in between).
const LEADER_ATTEMPTS: usize = 6;
/// Pause between them, and between drain rounds.
const RETRY_PAUSE: Duration = Duration::from_millis(500);

/// Calls `POST {leader's admin}{path(leader)}` on the leader of `group`, re-reading the
/// metrics and retrying when the receiver answers `409` (it no longer leads) or no leader is
/// known. Returns the leader called and its answer (anything but `409 NOT_LEADER`). `skip_if` ends early, with
/// `None`, when the leader found satisfies it (e.g. already the target).
pub(crate) async fn call_leader(
    ctx: &Ctx,
    group: u32,
    path: impl Fn(u64) -> String,
    skip_if: impl Fn(u64) -> bool,
) -> Result<Option<(u64, Answer)>, CtlError> {
    let mut last = String::new();
    for attempt in 0..LEADER_ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(RETRY_PAUSE).await;
        }
        let s = Sample::take(&ctx.client, &ctx.manifest).await;
        let Some(leader) = s.leader_of(group) else {
            if s.group_ids().is_empty() {
                last = "no node answered with metrics".into();
            } else {
                last = format!("group {group} has no known leader");
            }
            continue;
        };
        if skip_if(leader) {
            return Ok(None);
        }
        let node = ctx.manifest.node(leader).map_err(|_| {
            CtlError::config(format!(
                "group {group} is led by node {leader}, which is not in the manifest"
            ))
        })?;
        let url = format!("{}{}", node.admin_url, path(leader));
        let a = ctx
            .client
            .call(Method::POST, &url)
            .await
            .map_err(|e| CtlError::config(format!("POST {url}: {e}")))?;
        // 409 NOT_LEADER: leadership moved since the sample (another 409, e.g. a refused
        // transfer, is the caller's to report).
        if a.status == 409 && a.error_code().is_none_or(|c| c == "NOT_LEADER") {
            last = format!(
                "node {leader} no longer leads group {group}: {}",
                a.error_message()
            );
            continue;
        }
        if a.status == 404 {
            return Err(CtlError::config(format!(
                "POST {url}: 404 {} (is that the node's admin plane, server.admin_listen?)",
                a.error_message()
            )));
        }
        return Ok(Some((leader, a)));
    }
    Err(CtlError::config(format!(
        "gave up after {LEADER_ATTEMPTS} attempts: {last}"
    )))
}

fn transfer_path(group: u32, to: u64) -> String {
    format!("/__ursula/raft/{group}/leader/transfer/{to}")
}

/// `transfer-leader --group G --to N`.
pub async fn transfer(ctx: &Ctx, group: u32, to: u64, out: &mut Out) -> Result<(), CtlError> {
    let r = call_leader(ctx, group, |_| transfer_path(group, to), |l| l == to).await?;
    let Some((from, a)) = r else {
        out.line(format!("group {group}: node {to} already leads it"));
        return Ok(());
    };
    match a.status {
        200 => {
            let now = a.json["leader"].as_u64().unwrap_or(to);
            out.line(format!(
                "group {group}: leadership moved from node {from} to node {now}"
            ));
            Ok(())
        }
        400 | 409 => Err(CtlError::config(format!(
            "transfer of group {group} to node {to} refused ({}): {}",
            a.error_code().unwrap_or("no code"),
            a.error_message()
        ))),
        s => Err(CtlError::config(format!(
            "transfer of group {group} to node {to} failed on node {from}: HTTP {s}: {}",
            a.error_message()
        ))),
    }
}

fn maintenance_url(ctx: &Ctx, node: u64) -> Result<String, CtlError> {
    Ok(format!(
        "{}/__ursula/leadership-shed/maintenance",
        ctx.manifest.node(node)?.admin_url
    ))
}

/// Sets (`POST`) or clears (`DELETE`) node's maintenance mark; prints the node's answer.
async fn mark(ctx: &Ctx, node: u64, method: Method, out: &mut Out) -> Result<(), CtlError> {
    let url = maintenance_url(ctx, node)?;
    let a = ctx
        .client
        .call(method.clone(), &url)
        .await
        .map_err(|e| CtlError::config(format!("{method} {url}: {e}")))?;
    if a.status != 200 {
        return Err(CtlError::config(format!(
            "{method} {url}: HTTP {}: {}",
            a.status,
            a.error_message()
        )));
    }
    out.line(format!(
        "node {node}: shed state {} (bits {}, campaigns: {}, accepts transfers: {})",
        a.json["state"].as_str().unwrap_or("?"),
        a.json["bits"],
        a.json["should_campaign"],
        a.json["should_accept_transfer"],
    ));
    Ok(())
}

/// `undrain --node N`.
pub async fn undrain(ctx: &Ctx, node: u64, out: &mut Out) -> Result<(), CtlError> {
    mark(ctx, node, Method::DELETE, out).await
}

/// Whether each node accepts leadership transfers (`GET /__ursula/leadership-shed`); a node
/// without that endpoint (older) counts as accepting, an unreachable one as not, and so does
/// a replaced node that still awaits permission or rehydrates in some group (it refuses to
/// campaign until it caught up).
async fn accepting(ctx: &Ctx, s: &Sample) -> BTreeMap<u64, bool> {
    let asks = s.nodes.iter().map(|(n, m)| async move {
        match m {
            Err(_) => return (n.id, false),
            Ok(m) if !m.awaiting_permission.is_empty() || !m.rehydrating.is_empty() => {
                return (n.id, false);
            }
            Ok(_) => {}
        }
        let url = format!("{}/__ursula/leadership-shed", n.http_url);
        let ok = match ctx.client.call(Method::GET, &url).await {
            Ok(a) if a.status == 200 => a.json["should_accept_transfer"].as_bool().unwrap_or(true),
            Ok(a) => a.status == 404,
            Err(_) => false,
        };
        (n.id, ok)
    });
    futures::future::join_all(asks).await.into_iter().collect()
}

/// For every group `node` leads, the voter to hand it to: accepting transfers, reachable,
/// with the fewest leaderships (counting the ones planned). `None`: no eligible voter.
fn plan(s: &Sample, node: u64, ok: &BTreeMap<u64, bool>) -> Vec<(u32, Option<u64>)> {
    let Some(m) = s.of(node) else {
        return Vec::new();
    };
    let mut load: BTreeMap<u64, usize> = BTreeMap::new();
    for (_, nm) in s.reachable() {
        load.insert(nm.node_id, nm.led().len());
    }
    m.led()
        .into_iter()
        .map(|g| {
            let voters = m
                .groups
                .iter()
                .find(|v| v.id == g)
                .map(|v| v.voters.clone())
                .unwrap_or_default();
            let target = voters
                .into_iter()
                .filter(|v| *v != node && ok.get(v).copied().unwrap_or(false))
                .min_by_key(|v| (load.get(v).copied().unwrap_or(0), *v));
            if let Some(t) = target {
                *load.entry(t).or_default() += 1;
            }
            (g, target)
        })
        .collect()
}

/// `drain --node N`: set the maintenance mark, then move every leadership away, until the node
/// leads no group or `timeout_secs` pass (exit 2).
pub async fn drain(
    ctx: &Ctx,
    node: u64,
    timeout_secs: u64,
    dry_run: bool,
    out: &mut Out,
) -> Result<(), CtlError> {
    let entry = ctx.manifest.node(node)?.clone();
    if dry_run {
        let s = Sample::take(&ctx.client, &ctx.manifest).await;
        if s.of(node).is_none() {
            return Err(CtlError::config(format!("node {node} did not answer")));
        }
        let ok = accepting(ctx, &s).await;
        let p = plan(&s, node, &ok);
        out.line(format!(
            "dry run: would mark node {node} for maintenance and move {} leaderships",
            p.len()
        ));
        for (g, t) in p {
            match t {
                Some(t) => out.line(format!("group {g}: node {node} -> node {t}")),
                None => out.line(format!("group {g}: no eligible target")),
            }
        }
        return Ok(());
    }
    mark(ctx, node, Method::POST, out).await?;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(timeout_secs);
    loop {
        let s = Sample::take(&ctx.client, &ctx.manifest).await;
        let mut last;
        match s.of(node) {
            None => last = format!("node {node} did not answer"),
            Some(m) if m.led().is_empty() => {
                out.line(format!(
                    "node {node} leads no group ({} ms)",
                    started.elapsed().as_millis()
                ));
                return Ok(());
            }
            Some(m) => {
                let led = m.led();
                last = format!("node {node} still leads groups {led:?}");
                let ok = accepting(ctx, &s).await;
                for (g, target) in plan(&s, node, &ok) {
                    let Some(t) = target else {
                        last = format!(
                            "no safe target for group {g}: no other voter is reachable and accepts transfers"
                        );
                        continue;
                    };
                    let url = format!("{}{}", entry.admin_url, transfer_path(g, t));
                    match ctx.client.call(Method::POST, &url).await {
                        Ok(a) if a.status == 200 => {
                            out.line(format!("group {g}: node {node} -> node {t}"))
                        }
                        // Moved already (409), or the transfer did not finish in time (503):
                        // the next round looks again.
                        Ok(a) if a.status == 409 || a.status == 503 => {}
                        Ok(a) => {
                            last = format!(
                                "transfer of group {g} to node {t}: HTTP {}: {}",
                                a.status,
                                a.error_message()
                            )
                        }
                        Err(e) => last = format!("POST {url}: {e}"),
                    }
                }
            }
        }
        if Instant::now() + RETRY_PAUSE > deadline {
            return Err(CtlError::safety(format!(
                "drain of node {node} timed out after {timeout_secs} s: {last} (the maintenance mark stays set; undrain clears it)"
            )));
        }
        tokio::time::sleep(RETRY_PAUSE).await;
    }
}
