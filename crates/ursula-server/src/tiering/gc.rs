//! Cold GC (cluster.md §6.5): the leader deletes the objects a group's state queued, then
//! forgets them with a replicated `ColdGcDone`.

use super::{Tiering, chunk_key};
use crate::app::App;
use crate::metrics::inc;
use std::sync::Arc;
use ursula_core::cold::ObjectId;
use ursula_core::command::Op;
use ursula_storage::cold::ColdError;
impl Tiering {
    /// One GC pass of `group`: deletes up to `gc_max_entries` unreferenced objects, then
    /// forgets them with a replicated command.
    pub async fn gc_group(&self, app: &Arc<App>, group: u32) {
        if !app.node.leads(group) {
            return;
        }
        let Some(_busy) = self.claim(group) else {
            return;
        };
        let (namespace, queued): (u64, Vec<ObjectId>) = app.with_group(group, |g| {
            let ids = g.cold.gc.iter().take(self.cfg.gc_max_entries).copied();
            (g.cold.namespace, ids.collect())
        });
        let mut done = Vec::with_capacity(queued.len());
        for id in queued {
            let Ok(key) = chunk_key(namespace, group, id) else {
                continue;
            };
            match self.timed(self.store.delete(&key)).await {
                Ok(()) | Err(ColdError::NotFound { .. }) => done.push(id),
                Err(e) => {
                    inc(&self.metrics.gc_errors, 1);
                    tracing::debug!(group, error = %e, "cold GC delete failed; will retry");
                    self.health.set_ops(Some(format!("delete failed: {e}")));
                    break;
                }
            }
        }
        if done.is_empty() {
            return;
        }
        let n = done.len() as u64;
        if app
            .propose_upkeep(group, Op::ColdGcDone { objects: done })
            .await
        {
            inc(&self.metrics.gc_deleted, n);
        }
    }
}
