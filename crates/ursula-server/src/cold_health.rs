//! The cold-store health gate (cluster.md §5.4, §7.7 `[governance.cold_health]`): every
//! `interval` a clustered node with a cold tier judges one tick bad when the store is
//! failing (its probe, or the last flush, read or delete), when at least
//! `errors_per_tick_high` cold operations failed since the previous tick, or while the hot
//! bytes of a group it leads stand above `hot_size_high` (flushes are not keeping up; the
//! backlog clears only below `hot_size_low`). After `unhealthy_ticks` bad ticks in a row it
//! sets the `COLD_STORE` shed bit (it hands its leaderships away and refuses new ones, but
//! keeps campaigning); `heal_ticks` good ticks in a row clear it.

use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::Deserialize;
use ursula_raft::shed;

use crate::app::App;
use crate::probe::Hysteresis;

/// `[governance.cold_health]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ColdHealthConfig {
    /// How often the gate judges the cold store. Default: 2 s. `"0s"` turns the gate off
    /// (a failing cold store then never sheds leaderships; readiness still says so).
    #[serde(deserialize_with = "crate::governance::duration")]
    pub interval: Duration,
    pub unhealthy_ticks: u32,
    pub heal_ticks: u32,
    /// Unset: three quarters of `storage.cold.max_hot_size_per_group` (48 MiB of a cluster's
    /// default 64 MiB with four groups; 48 MiB when that cap is off). See [`ColdHealthConfig::marks`].
    #[serde(deserialize_with = "opt_size")]
    pub hot_size_high: Option<u64>,
    /// Unset: two thirds of the high mark.
    #[serde(deserialize_with = "opt_size")]
    pub hot_size_low: Option<u64>,
    /// Failed cold operations per tick that make the tick bad (`0`: errors alone never do).
    pub errors_per_tick_high: u64,
}

impl Default for ColdHealthConfig {
    fn default() -> Self {
        ColdHealthConfig {
            interval: Duration::from_secs(2),
            unhealthy_ticks: 3,
            heal_ticks: 5,
            hot_size_high: None,
            hot_size_low: None,
            errors_per_tick_high: 1,
        }
    }
}

fn opt_size<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let s = String::deserialize(d)?;
    ursula_storage::cold::config::parse_size(&s)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

impl ColdHealthConfig {
    /// The backlog's `(high, low)` marks, unset ones derived from the per-group cap of hot
    /// bytes, so that lowering the cap moves the marks with it.
    pub fn marks(&self, max_hot_size_per_group: u64) -> (u64, u64) {
        let high = self.hot_size_high.unwrap_or(match max_hot_size_per_group {
            0 => 48 << 20,
            cap => cap / 4 * 3,
        });
        (high, self.hot_size_low.unwrap_or(high / 3 * 2))
    }
}

/// Whether the hot backlog stands, given whether it stood at the previous tick: it starts at
/// `high` and ends below `low`.
pub fn backlog(was: bool, max_hot: u64, high: u64, low: u64) -> bool {
    if was { max_hot > low } else { max_hot >= high }
}

/// One tick's verdict (see the module docs).
pub fn tick_is_bad(failing: bool, errors: u64, errors_high: u64, backlog: bool) -> bool {
    failing || (errors_high > 0 && errors >= errors_high) || backlog
}

/// The gate's memory between ticks.
#[derive(Debug, Default)]
pub struct ColdGate {
    inner: Mutex<GateInner>,
}

#[derive(Debug, Default)]
struct GateInner {
    health: Hysteresis,
    backlog: bool,
    errors_seen: u64,
}

impl ColdGate {
    /// Whether the gate is tripped now.
    pub fn unhealthy(&self) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .health
            .unhealthy
    }

    /// The readiness reason while the gate is tripped by errors or a backlog alone (a failing
    /// store is a reason of its own already).
    pub fn reason(&self) -> Option<String> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if !g.health.unhealthy {
            return None;
        }
        Some(if g.backlog {
            "cold store behind: a led group's hot bytes exceed governance.cold_health.hot_size_high"
                .to_owned()
        } else {
            "cold-store health gate tripped (recent cold operation errors)".to_owned()
        })
    }

    /// Whether a hot backlog stands now.
    pub fn backlog(&self) -> bool {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).backlog
    }
}

/// Starts the gate on a clustered node with a cold tier.
pub fn spawn(app: &std::sync::Arc<App>, cfg: &ColdHealthConfig) {
    if !app.node.has_peers() || app.tiering.is_none() || cfg.interval.is_zero() {
        return;
    }
    let cfg = cfg.clone();
    app.spawn_every(cfg.interval, move |app| {
        let cfg = cfg.clone();
        async move { tick(&app, &cfg) }
    });
}

fn tick(app: &App, cfg: &ColdHealthConfig) {
    let Some(t) = &app.tiering else { return };
    let reason = t.health.reason();
    let m = &t.metrics;
    let errors_now = [&m.flush_errors, &m.cold_read_errors, &m.gc_errors]
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .sum::<u64>();
    let max_hot = app
        .node
        .led_groups()
        .into_iter()
        .map(|g| t.hot_seen(g))
        .max()
        .unwrap_or(0);
    let (flipped, unhealthy, backlog_now) = {
        let mut g = app
            .governance
            .cold
            .inner
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let errors = errors_now.saturating_sub(g.errors_seen);
        g.errors_seen = errors_now;
        let (high, low) = cfg.marks(app.cfg.storage.cold.max_hot_size_per_group());
        g.backlog = backlog(g.backlog, max_hot, high, low);
        let bad = tick_is_bad(
            reason.is_some(),
            errors,
            cfg.errors_per_tick_high,
            g.backlog,
        );
        let flipped = g.health.step(bad, cfg.unhealthy_ticks, cfg.heal_ticks);
        (flipped, g.health.unhealthy, g.backlog)
    };
    if !flipped {
        return;
    }
    let st = app.node.set_shed(shed::COLD_STORE, unhealthy);
    tracing::warn!(
        unhealthy,
        reason = ?reason,
        backlog = backlog_now,
        max_hot,
        state = st.state(),
        "cold-store health gate changed"
    );
    if st.should_shed_current_leaders() {
        let node = std::sync::Arc::clone(&app.node);
        tokio::spawn(async move {
            let left = node
                .shed_leaderships(crate::governance::SHUTDOWN_HANDOVER)
                .await;
            tracing::info!(still_led = left.len(), "cold-store shedding pass done");
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn the_backlog_starts_high_and_ends_low() {
        let (hi, lo) = (48, 32);
        assert!(!backlog(false, 47, hi, lo));
        assert!(backlog(false, 48, hi, lo));
        assert!(backlog(true, 40, hi, lo));
        assert!(backlog(true, 33, hi, lo));
        assert!(!backlog(true, 32, hi, lo));
    }

    #[test]
    fn a_tick_is_bad_for_any_of_three_reasons() {
        assert!(!tick_is_bad(false, 0, 1, false));
        assert!(tick_is_bad(true, 0, 1, false));
        assert!(tick_is_bad(false, 1, 1, false));
        assert!(!tick_is_bad(false, 1, 2, false));
        assert!(
            !tick_is_bad(false, 9, 0, false),
            "0 turns the error count off"
        );
        assert!(tick_is_bad(false, 0, 1, true));
    }

    #[test]
    fn keys_parse_with_the_spec_defaults() {
        let d: ColdHealthConfig = toml::from_str("").unwrap();
        assert_eq!(d.interval, Duration::from_secs(2));
        assert_eq!((d.unhealthy_ticks, d.heal_ticks), (3, 5));
        assert_eq!(d.marks(64 << 20), (48 << 20, 32 << 20));
        assert_eq!(d.marks(0), (48 << 20, 32 << 20));
        assert_eq!(d.marks(512 << 10), (384 << 10, 256 << 10));
        assert_eq!(d.errors_per_tick_high, 1);
        let c: Result<ColdHealthConfig, _> =
            toml::from_str("interval = \"500ms\"\nhot_size_high = \"1MiB\"\nheal_ticks = 2\n");
        let c = c.unwrap();
        assert_eq!(c.interval, Duration::from_millis(500));
        assert_eq!(c.marks(64 << 20), (1 << 20, 699_050));
        assert_eq!(c.heal_ticks, 2);
        assert!(toml::from_str::<ColdHealthConfig>("bogus = 1\n").is_err());
    }
}
