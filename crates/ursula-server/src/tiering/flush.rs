//! The flush (cluster.md §6.2): a group's hot bytes packed into one chunk object, uploaded
//! with a conditional create, then published by a replicated `ColdFlush`; and the ways an
//! object that was uploaded but never published is handed to GC.

use super::{Tiering, chunk_key, fresh_namespace};
use crate::app::App;
use crate::metrics::inc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use ursula_core::cold::{FlushPick, FlushReq, FlushRule, FlushSlice, ObjectId, Piece};
use ursula_core::command::Op;
use ursula_storage::chunk_object;
use ursula_storage::cold::ColdError;
impl Tiering {
    /// One flush of `group`, when it holds enough hot bytes: plan under the read lock, pack
    /// and upload outside it, then publish with a replicated command. Returns the bytes
    /// moved.
    pub async fn flush_group(&self, app: &Arc<App>, group: u32, force: bool) -> u64 {
        // Leader-only work (cluster.md §6.2): a follower applies the leader's flushes.
        if !app.node.leads(group) {
            return 0;
        }
        let Some(_busy) = self.claim(group) else {
            return 0;
        };
        let rule = if force {
            FlushRule::any(self.cfg.flush_max_size)
        } else {
            FlushRule {
                min_run: self.cfg.flush_min_run,
                min_ready: self.cfg.flush_min_hot_size,
                any_at: self.cfg.flush_any_hot_size,
                max_bytes: self.cfg.flush_max_size,
            }
        };
        let planned = app.with_group(group, |g| {
            let FlushPick {
                hot, picked, bytes, ..
            } = g.pick_flush(&rule);
            self.note_hot(group, hot);
            if picked.is_empty() {
                return None;
            }
            Some((g.cold.next_object, g.cold.namespace, picked, bytes, hot))
        });
        let Some((mut next, namespace, picked, bytes, hot)) = planned else {
            return 0;
        };
        let urgent = must_make_room(force, hot, self.cfg.flush_any_hot_size);
        // The namespace is committed before any object is written under it, so every object
        // this group uploads is under a namespace its state knows: an upload whose flush
        // never committed is found again at the group's next id (below), never lost.
        let namespace = if namespace == 0 {
            let Some((ns, n)) = self.claim_namespace(app, group, next).await else {
                return 0;
            };
            next = n;
            ns
        } else {
            namespace
        };
        let total: u64 = picked.iter().map(|c| c.end - c.start).sum();
        let Ok(first_key) = chunk_key(namespace, group, ObjectId(next)) else {
            return 0;
        };
        let mut body = chunk_object::ChunkWriter::new(self.chunk_version(&first_key), total);
        // The hot bytes go into the object as they are (shared, not copied).
        for p in bytes {
            if let Piece::Hot(b) = p {
                body.push(b);
            }
        }
        // The slices lie in the object in the order they were picked.
        let mut pos = 0;
        let slices: Vec<FlushSlice> = picked
            .into_iter()
            .map(|c| {
                let slice = FlushSlice {
                    key: c.key,
                    incarnation: c.incarnation,
                    start: c.start,
                    end: c.end,
                    pos,
                };
                pos += c.end - c.start;
                slice
            })
            .collect();
        let Some(object) = body.finish_body() else {
            tracing::error!(group, "flush object length mismatch");
            return 0;
        };
        // An id another (crashed) attempt already used is skipped: objects are immutable.
        let mut uploaded = None;
        for _ in 0..16 {
            let id = ObjectId(next);
            let Ok(key) = chunk_key(namespace, group, id) else {
                return 0;
            };
            let body = object.clone();
            let put = if urgent {
                self.store.put_if_absent(&key, body)
            } else {
                self.store.put_if_absent_paced(&key, body)
            };
            match self.timed(put).await {
                Ok(()) => {
                    uploaded = Some(id);
                    break;
                }
                Err(ColdError::AlreadyExists { .. }) => {
                    // Left by an attempt that uploaded but never committed: hand it to GC,
                    // then take the next id.
                    if !self.hand_to_gc(app, group, namespace, id).await {
                        return 0;
                    }
                    tracing::info!(
                        group,
                        object = id.0,
                        "cold flush found an orphan object; queued it for deletion"
                    );
                    next += 1;
                }
                Err(e) => {
                    inc(&self.metrics.flush_errors, 1);
                    tracing::debug!(group, error = %e, "cold flush upload failed; will retry");
                    self.health
                        .set_ops(Some(format!("flush upload failed: {e}")));
                    return 0;
                }
            }
        }
        let Some(id) = uploaded else {
            return 0;
        };
        self.health.set_ops(None);
        let req = FlushReq {
            namespace,
            object: id,
            object_len: total,
            slices,
        };
        match app
            .propose_upkeep(group, Op::ColdFlush(Box::new(req)))
            .await
        {
            true => {
                if let Some(c) = self.hot.get(group as usize) {
                    let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| {
                        Some(h.saturating_sub(total))
                    });
                }
                inc(&self.metrics.flushes, 1);
                inc(&self.metrics.flushed_bytes, total);
                tracing::debug!(
                    group,
                    object = id.0,
                    bytes = total,
                    "flushed to the cold tier"
                );
                total
            }
            false => {
                // Not known to be published. Never delete the object here: the command may
                // still commit (an unknown outcome, a shutdown after the log took it) and then
                // reference it. If it did not, the next flush finds the object at the group's
                // next id and hands it to GC through the log, after any such command.
                inc(&self.metrics.flush_errors, 1);
                0
            }
        }
    }

    /// Commits a fresh namespace for `group` (an empty flush of id `next`, which is queued
    /// for deletion and so never used); returns the namespace the group now has (another
    /// leader's may have won) and its next id.
    pub(crate) async fn claim_namespace(
        &self,
        app: &Arc<App>,
        group: u32,
        next: u64,
    ) -> Option<(u64, u64)> {
        if !self
            .hand_to_gc(app, group, fresh_namespace(), ObjectId(next))
            .await
        {
            return None;
        }
        Some(app.with_group(group, |g| (g.cold.namespace, g.cold.next_object)))
    }

    /// Hands object `id` to GC through the log: an empty flush of it (cold.rs
    /// `apply_flush`), which also sets the group's namespace if it has none.
    async fn hand_to_gc(&self, app: &Arc<App>, group: u32, namespace: u64, id: ObjectId) -> bool {
        let orphan = FlushReq {
            namespace,
            object: id,
            object_len: 0,
            slices: Vec::new(),
        };
        app.propose_upkeep(group, Op::ColdFlush(Box::new(orphan)))
            .await
    }

    /// Once per leadership of this process: an object already stored at `group`'s next id
    /// was uploaded by a flush that never committed (a crash between upload and commit); a
    /// group that gets no new writes would never find it by flushing, so look once.
    /// Returns whether the probe ran to the end (else try again later).
    pub async fn probe_orphan(&self, app: &Arc<App>, group: u32) -> bool {
        if !app.node.leads(group) {
            return false;
        }
        let Some(_busy) = self.claim(group) else {
            return false;
        };
        let (namespace, next) = app.with_group(group, |g| (g.cold.namespace, g.cold.next_object));
        if namespace == 0 {
            return true;
        }
        let Ok(key) = chunk_key(namespace, group, ObjectId(next)) else {
            return true;
        };
        match self.timed(self.store.head(&key)).await {
            Ok(_) => {
                let queued = self.hand_to_gc(app, group, namespace, ObjectId(next)).await;
                if queued {
                    tracing::info!(
                        group,
                        object = next,
                        "queued an orphan cold object for deletion"
                    );
                }
                queued
            }
            Err(ColdError::NotFound { .. }) => true,
            Err(e) => {
                tracing::debug!(group, error = %e, "orphan probe failed; will retry");
                false
            }
        }
    }
}

/// Whether a flush must make room, and so is written flat out rather than at the store's
/// background pace (a local directory shares the WAL's disk): a pressure flush (`force`), or a
/// group holding twice `flush_any_hot_size`, where flushes are not keeping up.
fn must_make_room(force: bool, hot: u64, flush_any_hot_size: u64) -> bool {
    force || hot >= flush_any_hot_size.saturating_mul(2)
}

#[cfg(test)]
mod tests {
    use super::must_make_room;

    #[test]
    fn a_flush_goes_flat_out_under_pressure_or_at_twice_the_any_size() {
        const ANY: u64 = 16 << 20;
        assert!(!must_make_room(false, 0, ANY));
        assert!(!must_make_room(false, 2 * ANY - 1, ANY));
        assert!(must_make_room(false, 2 * ANY, ANY));
        assert!(must_make_room(true, 0, ANY));
        assert!(must_make_room(false, u64::MAX, u64::MAX));
    }
}
