//! One flush tick of the cold tier (cluster.md §6.2): every group this node leads flushes
//! as `GroupState::pick_flush` rules (its streams with runs of at least `flush_min_run` hot
//! bytes once they hold `flush_min_hot_size` together; any stream once the group holds
//! `flush_any_hot_size`), at most `flush_max_concurrency` uploads at once; then, while the led
//! groups' hot bytes add up to more than `flush_pressure_hot_size`, the groups holding the
//! most flush whatever they hold. A group is probed once per leadership for an orphan at its
//! next object id.

use super::Tiering;
use crate::app::App;
use futures::StreamExt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Flushes of one group in one tick while it stays above the threshold.
const MAX_FLUSHES_PER_GROUP: usize = 64;

impl Tiering {
    pub async fn flush_pass(&self, app: &Arc<App>) {
        let mut led = Vec::new();
        for g in 0..app.node.group_count() {
            if app.node.leads(g) {
                led.push(g);
            } else if let Some(p) = self.probed.get(g as usize) {
                // Probed again when this node leads the group again: another leader may
                // have left an orphan meanwhile.
                p.store(false, Ordering::Relaxed);
            }
        }
        futures::stream::iter(led.iter().copied())
            .for_each_concurrent(self.cfg.flush_max_concurrency.max(1), |group| async move {
                let Some(probed) = self.probed.get(group as usize) else {
                    return;
                };
                if !probed.load(Ordering::Relaxed) && self.probe_orphan(app, group).await {
                    probed.store(true, Ordering::Relaxed);
                }
                for _ in 0..MAX_FLUSHES_PER_GROUP {
                    if self.flush_group(app, group, false).await == 0 {
                        break;
                    }
                }
            })
            .await;
        let limit = self.cfg.flush_pressure_hot_size;
        if limit == 0 {
            return;
        }
        // `flush_group` noted every led group's hot bytes just now.
        let mut hot: Vec<(u64, u32)> = led.iter().map(|&g| (self.hot_seen(g), g)).collect();
        let mut total: u64 = hot.iter().map(|(h, _)| h).sum();
        if total <= limit {
            return;
        }
        hot.sort_unstable_by(|a, b| b.cmp(a));
        tracing::debug!(total, limit, "hot bytes above the pressure threshold");
        crate::metrics::inc(&self.metrics.pressure_flushes, 1);
        for (held, group) in hot {
            if total <= limit || held == 0 {
                break;
            }
            let moved = self.flush_group(app, group, true).await;
            total = total.saturating_sub(moved);
        }
    }
}
