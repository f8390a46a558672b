//! Background upkeep: segment GC, snapshot triggers, and the free-space check.

use super::*;

/// Background upkeep: deletes WAL segments no group needs, and gets groups that hold old
/// segments (or a large log) to snapshot and purge.
pub(super) struct Upkeep {
    pub(super) wal: Wal,
    pub(super) snapshot_logs: u64,
    pub(super) snapshot_min_log_bytes: u64,
    pub(super) head: Arc<AtomicU64>,
    pub(super) groups: Vec<(Raft, Arc<GroupLog>, Arc<SnapshotStore>)>,
    pub(super) purged: Arc<Notify>,
}

/// First LSNs of the WAL segment files in `dir`, ascending (named `wal-{first_lsn:020}.log`).
fn segment_starts(dir: &Path) -> Vec<Lsn> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<Lsn> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name();
            let digits = name.to_str()?.strip_prefix("wal-")?.strip_suffix(".log")?;
            if digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()) {
                digits.parse().ok()
            } else {
                None
            }
        })
        .collect();
    out.sort_unstable();
    out
}

/// Whether a snapshot that `snapshot_logs` entries made due is worth writing: only once the
/// log since the last snapshot holds at least half of that snapshot's bytes.
///
/// A snapshot is the whole group state, and a state can grow with a stream's history (its
/// message ends, about 2 bytes per message; every byte, with no cold tier to flush to), so at a
/// fixed count of entries it would be rewritten ever more often per byte logged: at 1 stream
/// × 16 connections, a snapshot of many megabytes every few seconds. With this rule a byte of
/// log costs at most two bytes of snapshot, and a small state still snapshots by count.
pub(super) fn count_snapshot_pays(log_bytes: u64, snapshot_bytes: u64) -> bool {
    log_bytes.saturating_mul(2) >= snapshot_bytes
}

impl Upkeep {
    pub(super) async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut last_trigger: Vec<Option<Instant>> = vec![None; self.groups.len()];
        let mut round = 0usize;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(UPKEEP_INTERVAL) => {}
                _ = self.purged.notified() => {}
                _ = stop.changed() => break,
            }
            self.pass(&mut last_trigger, round).await;
            round = round.wrapping_add(1);
        }
    }

    /// Groups in the order pass `round` considers them: a different first group each pass, so
    /// the one snapshot a pass may trigger is not always offered to the same groups first.
    fn rotated(&self, round: usize) -> impl Iterator<Item = usize> + use<> {
        let n = self.groups.len().max(1);
        (0..self.groups.len()).map(move |k| (k + round) % n)
    }

    async fn pass(&self, last_trigger: &mut [Option<Instant>], round: usize) {
        // Every record at or below `durable` has had its bookkeeping done, so records above it
        // are never below a pin we fail to see.
        let durable = self.head.load(Ordering::SeqCst);
        let cutoff = self
            .groups
            .iter()
            .filter_map(|(_, log, _)| log.pin())
            .fold(durable + 1, Lsn::min);
        let wal = self.wal.clone();
        let gc = tokio::task::spawn_blocking(move || {
            // A full disk lifts by itself: this is where the node notices free space again.
            wal.check_space();
            let freed = wal.remove_segments_before(cutoff);
            let starts = if wal.segment_count() > 1 {
                segment_starts(wal.dir())
            } else {
                Vec::new()
            };
            (freed, starts)
        })
        .await;
        let starts = match gc {
            Ok((Ok(freed), starts)) => {
                if freed > 0 {
                    tracing::debug!(freed, cutoff, "deleted wal segments");
                }
                starts
            }
            Ok((Err(e), _)) => {
                tracing::warn!(error = %e, "deleting wal segments failed");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "wal gc task failed");
                return;
            }
        };

        // The oldest segment ends where the second one starts; move whatever pins it. A group
        // whose entries pin it is snapshotted only once the WAL outweighs its snapshot, which
        // bounds the bytes re-written per byte of WAL freed.
        //
        // At most one snapshot is triggered per pass: groups written at the same rate would
        // otherwise all snapshot at once, and writing all their state together stalls the WAL's
        // syncs (and so every acknowledgement) behind the disk.
        let mut triggered = false;
        if let Some(&target) = starts.get(1) {
            let wal_bytes = self.wal.disk_bytes();
            for i in self.rotated(round) {
                let (_, log, snapshots) = &self.groups[i];
                if log.pin().is_some_and(|p| p < target) {
                    log.rewrite_markers_below(target);
                    if !triggered
                        && log.first_entry_lsn().is_some_and(|l| l < target)
                        && wal_bytes >= snapshots.bytes()
                    {
                        triggered = self
                            .maybe_snapshot(i, last_trigger, "its log holds the oldest wal segment")
                            .await;
                    }
                }
            }
        }
        for i in self.rotated(round) {
            let (raft, log, snapshots) = &self.groups[i];
            if triggered {
                break;
            }
            if log.retained_bytes() > self.snapshot_min_log_bytes.max(snapshots.bytes()) {
                triggered = self
                    .maybe_snapshot(i, last_trigger, "its log is large")
                    .await;
                continue;
            }
            let due = {
                let m = raft.metrics();
                let m = m.borrow();
                let applied = m.last_applied.map_or(0, |l| l.index + 1);
                let snapshot = m.snapshot.map_or(0, |l| l.index + 1);
                applied.saturating_sub(snapshot) >= self.snapshot_logs
            } && count_snapshot_pays(log.retained_bytes(), snapshots.bytes());
            if due {
                triggered = self
                    .maybe_snapshot(i, last_trigger, "its snapshot policy is due")
                    .await;
            }
        }
    }

    /// Asks group `i` to snapshot unless it did recently or has nothing new; true if asked.
    async fn maybe_snapshot(
        &self,
        i: usize,
        last_trigger: &mut [Option<Instant>],
        why: &str,
    ) -> bool {
        let Some((raft, _, _)) = self.groups.get(i) else {
            return false;
        };
        if last_trigger[i].is_some_and(|t| t.elapsed() < SNAPSHOT_TRIGGER_BACKOFF) {
            return false;
        }
        let behind = {
            let m = raft.metrics();
            let m = m.borrow();
            m.last_applied > m.snapshot
        };
        if !behind {
            return false;
        }
        last_trigger[i] = Some(Instant::now());
        tracing::debug!(group = i, why, "triggering a snapshot");
        if let Err(e) = raft.trigger().snapshot().await {
            tracing::warn!(group = i, error = %e, "triggering a snapshot failed");
            return false;
        }
        true
    }
}

/// How often [`Node::snapshot_covering`] asks again: openraft drops a trigger while it builds
/// another snapshot (which may predate what the caller needs covered).
const SNAPSHOT_RETRY: Duration = Duration::from_millis(500);

impl Node {
    /// Gets `group` to snapshot until a snapshot covers applied index `upto` (after which
    /// openraft purges the log behind it and WAL upkeep deletes the segments nothing pins);
    /// returns the snapshot's last index, or `None` if none covered it within `timeout` (or
    /// the group stopped).
    ///
    /// # Panics
    /// If `group >= self.group_count()`.
    pub async fn snapshot_covering(&self, group: u32, upto: u64, timeout: Duration) -> Option<u64> {
        let raft = &self.groups[group as usize].raft;
        let deadline = Instant::now() + timeout;
        loop {
            let have = raft.metrics().borrow().snapshot.map(|l| l.index);
            if have.is_some_and(|i| i >= upto) {
                return have;
            }
            if Instant::now() >= deadline {
                return None;
            }
            if let Err(e) = raft.trigger().snapshot().await {
                tracing::warn!(group, error = %e, "could not trigger a snapshot");
                return None;
            }
            let wait = SNAPSHOT_RETRY.min(deadline.saturating_duration_since(Instant::now()));
            let _ = raft
                .wait(Some(wait))
                .metrics(
                    |m| m.snapshot.is_some_and(|l| l.index >= upto),
                    "snapshot covers the index",
                )
                .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::count_snapshot_pays;

    #[test]
    fn a_snapshot_by_count_waits_for_half_its_size_in_log() {
        // No snapshot yet, or a small one: the count decides.
        assert!(count_snapshot_pays(0, 0));
        assert!(count_snapshot_pays(10 << 10, 4 << 10));
        // A 100 MB state is rewritten only after 50 MB of log.
        assert!(!count_snapshot_pays(49_999_999, 100_000_000));
        assert!(count_snapshot_pays(50_000_000, 100_000_000));
        assert!(count_snapshot_pays(u64::MAX, u64::MAX));
    }
}
