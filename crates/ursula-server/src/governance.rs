//! Leadership governance of a clustered node (cluster.md §5.4): the leadership balancer
//! (which also hands leaderships away on every tick while a shed bit is set), the
//! commit-stall watchdog, and handing leaderships over before a graceful shutdown. The
//! health gates that set shed bits live in `cold_health.rs` and `probe.rs`.
//!
//! Every node moves only its own leaderships, toward the node that leads fewest groups by
//! this node's view of the metrics, one hand-over at a time (`ursula_raft::Node::transfer_leader`).
//! A node that is draining, shutting down or unhealthy refuses to take a leadership, so
//! the balancer needs no extra poll of its peers' shed state.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Deserialize;
use ursula_raft::{Node, StallWatch, shed};

use crate::app::App;

/// How long a graceful shutdown waits for its leaderships to move.
pub const SHUTDOWN_HANDOVER: Duration = Duration::from_secs(5);
/// How long one balancing hand-over may take.
const BALANCE_TRANSFER_TIMEOUT: Duration = Duration::from_secs(3);

/// `[governance]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GovernanceConfig {
    pub leadership_balance: BalanceConfig,
    pub commit_stall: CommitStallConfig,
    pub cluster_probe: crate::probe::ClusterProbeConfig,
    pub cold_health: crate::cold_health::ColdHealthConfig,
}

/// `[governance.commit_stall]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CommitStallConfig {
    /// How often the watchdog samples the groups this node leads. Default: 2 s. `"0s"` turns
    /// it off.
    #[serde(deserialize_with = "duration")]
    pub interval: Duration,
    /// A led group whose log stays ahead of its commit point, with the commit point not
    /// moving, for longer than this is handed to another voter. Default: 15 s.
    #[serde(deserialize_with = "duration")]
    pub threshold: Duration,
}

impl Default for CommitStallConfig {
    fn default() -> Self {
        CommitStallConfig {
            interval: Duration::from_secs(2),
            threshold: Duration::from_secs(15),
        }
    }
}

/// What the health gates measured, for metrics and readiness.
#[derive(Debug, Default)]
pub struct State {
    commit_stall_transfers: AtomicU64,
    pub probes: crate::probe::ProbeState,
    pub cold: crate::cold_health::ColdGate,
}

impl State {
    /// Leaderships the commit-stall watchdog handed away.
    pub fn commit_stall_transfers(&self) -> u64 {
        self.commit_stall_transfers.load(Ordering::Relaxed)
    }
}

/// `[governance.leadership_balance]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BalanceConfig {
    /// How often a node checks the spread. Default: 5 s. `"0s"` turns the balancer off.
    #[serde(deserialize_with = "duration")]
    pub interval: Duration,
    /// Leaderships a node hands away per check. Default: 4.
    pub max_per_tick: u32,
    /// Accepted for compatibility with the spec's key set: peers answer a hand-over request
    /// with their shed state, so the balancer never polls them (default 500 ms).
    #[serde(deserialize_with = "duration")]
    pub peer_timeout: Duration,
}

impl Default for BalanceConfig {
    fn default() -> Self {
        BalanceConfig {
            interval: Duration::from_secs(5),
            max_per_tick: 4,
            peer_timeout: Duration::from_millis(500),
        }
    }
}

pub(crate) fn duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    ursula_storage::cold::config::parse_duration(&s).map_err(serde::de::Error::custom)
}

/// Which groups this node should hand away now, and to whom, so that the leaderships spread
/// evenly: while this node leads at least two more groups than the voter that leads fewest,
/// one of its groups goes to that voter. `leaders` holds each group's known leader.
pub fn balance_moves(
    me: u64,
    voters: &[u64],
    leaders: &[Option<u64>],
    max_moves: usize,
) -> Vec<(u32, u64)> {
    let mut count: BTreeMap<u64, usize> = voters.iter().map(|&v| (v, 0)).collect();
    for l in leaders.iter().flatten() {
        if let Some(c) = count.get_mut(l) {
            *c += 1;
        }
    }
    let mut mine: Vec<u32> = leaders
        .iter()
        .enumerate()
        .filter(|(_, l)| **l == Some(me))
        .map(|(g, _)| g as u32)
        .collect();
    let mut moves = Vec::new();
    while moves.len() < max_moves {
        let Some((&target, &least)) = count
            .iter()
            .filter(|(v, _)| **v != me)
            .min_by_key(|(v, c)| (**c, **v))
        else {
            break;
        };
        let my = count.get(&me).copied().unwrap_or(0);
        if my < least + 2 {
            break;
        }
        // The highest-numbered group first: deterministic, and spreads neighbouring groups.
        let Some(g) = mine.pop() else { break };
        moves.push((g, target));
        *count.entry(me).or_default() -= 1;
        *count.entry(target).or_default() += 1;
    }
    moves
}

/// Starts the balancer, cold-health shedding, the commit-stall watchdog and the egress
/// probes of a clustered node.
pub fn spawn(app: &Arc<App>, cfg: &GovernanceConfig) -> anyhow::Result<()> {
    let node = Arc::clone(&app.node);
    if !node.has_peers() {
        return Ok(());
    }
    crate::probe::spawn(app, &cfg.cluster_probe)?;
    crate::cold_health::spawn(app, &cfg.cold_health);
    spawn_commit_stall(app, &cfg.commit_stall);
    spawn_storage_gate(app);
    let interval = cfg.leadership_balance.interval;
    if interval.is_zero() {
        return Ok(());
    }
    let max = cfg.leadership_balance.max_per_tick as usize;
    app.spawn_every(interval, move |_app| {
        let node = Arc::clone(&node);
        async move { tick(&node, max).await }
    });
    Ok(())
}

/// How often the storage gate looks at the WAL's health (a few atomic loads).
const STORAGE_GATE_EVERY: Duration = Duration::from_millis(250);

/// A node whose WAL failed or whose disk is full stops campaigning at once and hands its
/// leaderships away, instead of waiting for the next balancer tick (a leader that cannot
/// write refuses every write of its groups). Healing clears the bit; the balancer brings
/// leaderships back.
fn spawn_storage_gate(app: &Arc<App>) {
    app.spawn_every(STORAGE_GATE_EVERY, |app| async move {
        match app.node.follow_storage_health() {
            Some(true) => {
                tracing::warn!("storage unhealthy: not campaigning, handing leaderships away");
                let left = app.node.shed_leaderships(BALANCE_TRANSFER_TIMEOUT).await;
                if !left.is_empty() {
                    tracing::warn!(still_led = left.len(), "storage unhealthy: still leading");
                }
            }
            Some(false) => tracing::info!("storage healthy again: campaigning"),
            None => {}
        }
    });
}

/// How long the watchdog's hand-over of one stalled group may take.
const STALL_HANDOVER_TIMEOUT: Duration = Duration::from_secs(5);

fn spawn_commit_stall(app: &Arc<App>, cfg: &CommitStallConfig) {
    if cfg.interval.is_zero() {
        return;
    }
    let threshold = cfg.threshold;
    let watch = Arc::new(tokio::sync::Mutex::new(StallWatch::default()));
    app.spawn_every(cfg.interval, move |app| {
        let watch = Arc::clone(&watch);
        async move {
            let mut watch = watch.lock().await;
            let stalls = app.node.commit_stalls(&mut watch, threshold).await;
            for (group, stalled) in stalls {
                tracing::warn!(
                    group,
                    stalled_ms = stalled.as_millis() as u64,
                    threshold_ms = threshold.as_millis() as u64,
                    "commit stall: handing the group's leadership away"
                );
                match app
                    .node
                    .hand_over_stalled(group, STALL_HANDOVER_TIMEOUT)
                    .await
                {
                    Ok(to) => {
                        app.governance
                            .commit_stall_transfers
                            .fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(group, to, "commit stall: leadership handed over");
                    }
                    Err(e) => tracing::warn!(group, error = %e, "commit stall: hand-over failed"),
                }
            }
        }
    });
}

async fn tick(node: &Arc<Node>, max: usize) {
    // The health gates set their shed bits themselves (cold_health.rs, probe.rs); while any
    // bit is set, every tick hands away what this node still leads.
    let st = node.shed_state();
    if st.should_shed_current_leaders() {
        let left = node.shed_leaderships(BALANCE_TRANSFER_TIMEOUT).await;
        if !left.is_empty() {
            tracing::info!(
                still_led = left.len(),
                state = st.state(),
                "shedding leaderships"
            );
        }
        return;
    }
    let voters: Vec<u64> = node.peers().keys().copied().collect();
    let leaders: Vec<Option<u64>> = (0..node.group_count()).map(|g| node.leader_of(g)).collect();
    for (group, target) in balance_moves(node.node_id(), &voters, &leaders, max) {
        match node
            .transfer_leader(group, target, BALANCE_TRANSFER_TIMEOUT)
            .await
        {
            Ok(l) => tracing::info!(group, to = l, "leadership balanced"),
            Err(e) => {
                tracing::info!(group, target, error = %e, "balancing hand-over skipped");
                break;
            }
        }
    }
}

/// Before a graceful shutdown: stop campaigning and hand every leadership to a peer, so that
/// writes move on without waiting for an election timeout. Bounded by [`SHUTDOWN_HANDOVER`].
pub async fn hand_over_for_shutdown(node: &Node) {
    if !node.has_peers() {
        return;
    }
    let started = std::time::Instant::now();
    node.set_shed(shed::SHUTDOWN, true);
    let led = node.led_groups().len();
    let left = node.shed_leaderships(SHUTDOWN_HANDOVER).await;
    tracing::info!(
        handed_over = led - left.len().min(led),
        still_led = left.len(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "leaderships handed over for shutdown"
    );
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn moves_toward_an_even_spread() {
        // Node 1 leads everything of 6 groups: two go to 2, two to 3.
        let leaders = vec![Some(1); 6];
        let mv = balance_moves(1, &[1, 2, 3], &leaders, 10);
        assert_eq!(mv.len(), 4);
        assert_eq!(mv.iter().filter(|(_, t)| *t == 2).count(), 2);
        assert_eq!(mv.iter().filter(|(_, t)| *t == 3).count(), 2);
        // Capped per tick.
        assert_eq!(balance_moves(1, &[1, 2, 3], &leaders, 1).len(), 1);
        // Even enough (a difference of one) or another node's surplus: nothing to do here.
        let leaders = [Some(1), Some(1), Some(2), Some(3), Some(2)];
        assert!(balance_moves(1, &[1, 2, 3], &leaders, 4).is_empty());
        assert!(balance_moves(3, &[1, 2, 3], &[Some(1); 4], 4).is_empty());
        // Unknown leaders count for no one.
        let leaders = [Some(1), Some(1), None, None];
        assert_eq!(balance_moves(1, &[1, 2, 3], &leaders, 4), vec![(1, 2)]);
    }

    #[test]
    fn health_gate_keys_parse_with_the_spec_defaults() {
        let d: GovernanceConfig = toml::from_str("").unwrap();
        assert_eq!(d.commit_stall.interval, Duration::from_secs(2));
        assert_eq!(d.commit_stall.threshold, Duration::from_secs(15));
        let p = &d.cluster_probe;
        assert_eq!(p.interval, Duration::from_millis(500));
        assert_eq!(p.probe_size, 64 << 10);
        assert_eq!(p.timeout, Duration::from_millis(200));
        assert_eq!((p.unhealthy_ticks, p.heal_ticks), (2, 6));
        let c: GovernanceConfig = toml::from_str(
            "[commit_stall]\ninterval = \"1s\"\nthreshold = \"30s\"\n\
             [cluster_probe]\ninterval = \"0s\"\nprobe_size = \"4KiB\"\nheal_ticks = 9\n",
        )
        .unwrap();
        assert_eq!(c.commit_stall.threshold, Duration::from_secs(30));
        assert!(c.cluster_probe.interval.is_zero());
        assert_eq!(c.cluster_probe.probe_size, 4096);
        assert_eq!(c.cluster_probe.heal_ticks, 9);
        for bad in [
            "[cluster_probe]\nprobe_size = \"2MiB\"\n",
            "[cluster_probe]\nprobe_size = \"0B\"\n",
            "[commit_stall]\nthreshold = \"soon\"\n",
            "[commit_stall]\nbogus = 1\n",
        ] {
            assert!(toml::from_str::<GovernanceConfig>(bad).is_err(), "{bad}");
        }
    }

    proptest::proptest! {
        #[test]
        fn balancing_never_overshoots(
            leaders in proptest::collection::vec(proptest::option::of(1u64..=3), 0..64),
            me in 1u64..=3,
        ) {
            let voters = [1, 2, 3];
            let count = |ls: &[Option<u64>], n: u64| ls.iter().filter(|l| **l == Some(n)).count();
            let mut after = leaders.clone();
            for (g, t) in balance_moves(me, &voters, &leaders, 64) {
                proptest::prop_assert_eq!(after[g as usize], Some(me));
                after[g as usize] = Some(t);
            }
            // After the moves this node leads at most one more than any other voter, and no
            // target ends up leading more than this node.
            let mine = count(&after, me);
            for v in voters.iter().filter(|v| **v != me) {
                proptest::prop_assert!(mine <= count(&after, *v) + 1);
                if count(&after, *v) > count(&leaders, *v) {
                    proptest::prop_assert!(count(&after, *v) <= mine + 1);
                }
            }
        }
    }
}
