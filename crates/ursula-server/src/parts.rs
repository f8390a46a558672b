//! Staged snapshot parts (snapshot-parts.md §6-§9): the leader's in-memory count per stream,
//! listing and the clean-ups it applies, discards, the deletion of a stream's parts, the
//! node's commit slots, and the orphan sweep. The rules live in [`ursula_core::parts`].

use crate::app::App;
use crate::http::budget::{BodyBudget, Charge};
use crate::http::error::ApiError;
use crate::snapshot_store::{self as store, InFlight, cold_failed};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use ursula_core::parts::{self as rules, BoundHit, PartId};
use ursula_core::{ErrorCode, Incarnation, StreamKey};
use ursula_storage::cold::object::{FOOTER_LEN, HEADER_LEN};
use ursula_storage::cold::{ColdStore, ObjectInfo};

/// Bytes of frame around a part's body.
pub const FRAME_LEN: u64 = (HEADER_LEN + FOOTER_LEN) as u64;

/// One stream's staged parts as the leader counts them.
#[derive(Debug, Default, Clone)]
struct Tally {
    /// Stored parts of every incarnation, and their bytes.
    parts: u64,
    bytes: u64,
    /// Uploads under way and their charges.
    uploading: u64,
    charged: u64,
    /// When the stream's parts were last listed, and in which of this node's leadership
    /// terms (`None`: list before the next part).
    listed: Option<Listed>,
}

#[derive(Debug, Clone, Copy)]
struct Listed {
    term: u64,
    at_ms: u64,
}

/// The node's multi-part bookkeeping (never replicated).
#[derive(Debug, Default)]
pub struct Registry {
    tallies: Mutex<HashMap<StreamKey, Tally>>,
    commits: Mutex<HashSet<StreamKey>>,
    pub flights: InFlight,
}

/// A part upload's charge; released when dropped.
pub struct Upload<'a> {
    reg: &'a Registry,
    key: StreamKey,
    charge: u64,
}

impl Upload<'_> {
    /// The part is stored: it counts its actual size from now on.
    pub fn stored(self, size: u64) {
        let mut t = self.reg.tallies.lock().unwrap_or_else(|e| e.into_inner());
        let tally = t.entry(self.key.clone()).or_default();
        tally.parts += 1;
        tally.bytes += size;
    }
}

impl Drop for Upload<'_> {
    fn drop(&mut self) {
        let mut t = self.reg.tallies.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tally) = t.get_mut(&self.key) {
            tally.uploading = tally.uploading.saturating_sub(1);
            tally.charged = tally.charged.saturating_sub(self.charge);
        }
    }
}

/// A running commit of a stream (A13 until its answer); its copy slot, once admitted (A14).
pub struct Commit<'a> {
    reg: &'a Registry,
    key: StreamKey,
    copy: Option<Charge<'a>>,
}

impl<'a> Commit<'a> {
    /// A14: takes a copy slot (its charge against the node's body budget), or `503
    /// SNAPSHOT_COMMITS_BUSY`.
    pub fn admit_copy(&mut self, budget: &'a BodyBudget) -> Result<(), ApiError> {
        match budget.reserve_copy() {
            Some(c) => {
                self.copy = Some(c);
                Ok(())
            }
            None => Err(ApiError::new(
                ErrorCode::SNAPSHOT_COMMITS_BUSY,
                "this node copies as many commits as it can; repeat the commit",
            )),
        }
    }
}

impl Drop for Commit<'_> {
    fn drop(&mut self) {
        self.reg
            .commits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.key);
        self.reg.mark_for_listing(&self.key);
    }
}

fn in_progress() -> ApiError {
    ApiError::new(
        ErrorCode::SNAPSHOT_COMMIT_IN_PROGRESS,
        "a commit of this stream is running; retry when it has answered",
    )
}

impl Registry {
    /// A13: this commit runs, or `503 SNAPSHOT_COMMIT_IN_PROGRESS`.
    pub fn start_commit(&self, key: &StreamKey) -> Result<Commit<'_>, ApiError> {
        let mut c = self.commits.lock().unwrap_or_else(|e| e.into_inner());
        if !c.insert(key.clone()) {
            return Err(in_progress());
        }
        Ok(Commit {
            reg: self,
            key: key.clone(),
            copy: None,
        })
    }

    pub fn commit_running(&self, key: &StreamKey) -> bool {
        self.commits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(key)
    }

    /// The next part staging lists the stream's parts first (§8 rules 1 and 2).
    pub fn mark_for_listing(&self, key: &StreamKey) {
        if let Some(t) = self
            .tallies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(key)
        {
            t.listed = None;
        }
    }

    /// Whether the count must be listed again: never listed, listed in another leadership term
    /// (a node that leads again has missed the parts staged through the leaders in between,
    /// §8: "at the stream's first part after it starts to lead"), or, with `older_than_ms`,
    /// listed longer ago than that.
    fn needs_listing(
        &self,
        key: &StreamKey,
        term: u64,
        now_ms: u64,
        older_than_ms: Option<u64>,
    ) -> bool {
        let t = self.tallies.lock().unwrap_or_else(|e| e.into_inner());
        match t.get(key).and_then(|t| t.listed) {
            None => true,
            Some(l) if l.term != term => true,
            Some(l) => older_than_ms.is_some_and(|age| now_ms.saturating_sub(l.at_ms) > age),
        }
    }

    fn set_listed(&self, key: &StreamKey, term: u64, parts: u64, bytes: u64, now_ms: u64) {
        let mut t = self.tallies.lock().unwrap_or_else(|e| e.into_inner());
        let tally = t.entry(key.clone()).or_default();
        tally.parts = parts;
        tally.bytes = bytes;
        tally.listed = Some(Listed {
            term,
            at_ms: now_ms,
        });
    }

    fn reserve(&self, key: &StreamKey, charge: u64) -> Result<Upload<'_>, BoundHit> {
        let mut t = self.tallies.lock().unwrap_or_else(|e| e.into_inner());
        let tally = t.entry(key.clone()).or_default();
        rules::staged_bounds(
            tally.parts + tally.uploading,
            tally.bytes + tally.charged,
            charge,
        )?;
        tally.uploading += 1;
        tally.charged += charge;
        Ok(Upload {
            reg: self,
            key: key.clone(),
            charge,
        })
    }
}

/// The Raft term of the stream's group as this node sees it: a new leadership is a new term.
fn leadership_term(app: &App, key: &StreamKey) -> u64 {
    app.node.group_metrics(app.group_of(key)).term
}

/// Lists a stream's parts, deletes the earlier incarnations' parts staged more than a minute
/// before `since_ms` (and, with `all_of`, every part of that incarnation), and records the
/// count of what is left.
pub async fn list_and_clean(
    app: &App,
    store: &dyn ColdStore,
    key: &StreamKey,
    current: Incarnation,
    since_ms: i64,
    all_of: Option<Incarnation>,
) -> Result<Vec<(PartId, ObjectInfo)>, ApiError> {
    let term = leadership_term(app, key);
    let prefix = store::parts_prefix(key).map_err(|e| cold_failed("name the parts", &e))?;
    let listed = store
        .list(&prefix)
        .await
        .map_err(|e| cold_failed("list the staged parts", &e))?;
    let mut kept = Vec::new();
    let (mut parts, mut bytes) = (0, 0);
    for info in listed {
        let name = info.key.as_str().rsplit('/').next().unwrap_or("");
        let Some(id) = PartId::parse(name) else {
            continue;
        };
        let doomed = all_of == Some(id.incarnation)
            || rules::stale_other_incarnation(
                id.incarnation,
                current,
                info.last_modified_ms,
                since_ms,
            );
        if doomed {
            store
                .delete(&info.key)
                .await
                .map_err(|e| cold_failed("delete a staged part", &e))?;
            continue;
        }
        parts += 1;
        bytes += info.size.saturating_sub(FRAME_LEN);
        kept.push((id, info));
    }
    app.parts.set_listed(key, term, parts, bytes, app.now_ms());
    Ok(kept)
}

/// Charges a part upload against the staged bounds before its body is read (§8), listing the
/// stream's parts first when the count is unknown, and again before refusing when the last
/// listing is over a minute old.
pub async fn admit_part<'a>(
    app: &'a App,
    store: &dyn ColdStore,
    key: &StreamKey,
    incarnation: Incarnation,
    created_ms: u64,
    content_length: Option<u64>,
) -> Result<Upload<'a>, Result<BoundHit, ApiError>> {
    let charge = rules::upload_charge(content_length);
    let now = app.now_ms();
    let term = leadership_term(app, key);
    if app.parts.needs_listing(key, term, now, None) {
        list_and_clean(app, store, key, incarnation, created_ms as i64, None)
            .await
            .map_err(Err)?;
    }
    match app.parts.reserve(key, charge) {
        Ok(u) => Ok(u),
        Err(hit) => {
            if !app
                .parts
                .needs_listing(key, term, now, Some(rules::SKEW_MARGIN_MS as u64))
            {
                return Err(Ok(hit));
            }
            list_and_clean(app, store, key, incarnation, created_ms as i64, None)
                .await
                .map_err(Err)?;
            app.parts.reserve(key, charge).map_err(Ok)
        }
    }
}

/// A discard (§6 step 8): every part of `current`, and the earlier incarnations' parts staged
/// more than a minute ago.
pub async fn discard(app: &App, key: &StreamKey, current: Incarnation) -> Result<(), ApiError> {
    if app.parts.commit_running(key) {
        return Err(in_progress());
    }
    let store = store::store_of(app)?;
    list_and_clean(
        app,
        &*store,
        key,
        current,
        app.now_ms() as i64,
        Some(current),
    )
    .await?;
    Ok(())
}

/// After a stream delete has answered: its parts of the incarnation the leader knew, at any
/// age, and its other parts staged more than a minute before the delete (§7). The stream's
/// own snapshot object goes too, unless a fork still holds the stream (soft delete).
pub fn after_stream_delete(
    app: &Arc<App>,
    key: &StreamKey,
    before: Option<(Incarnation, Option<String>)>,
) {
    let Some(t) = app.tiering.clone() else {
        return;
    };
    let (app, key) = (app.clone(), key.clone());
    tokio::spawn(async move {
        let Some((inc, snapshot)) = before else {
            return;
        };
        let now = app.now_ms() as i64;
        if let Err(e) = list_and_clean(&app, &*t.store, &key, inc, now, Some(inc)).await {
            tracing::warn!(stream = %key, error = %e.rejection.message, "deleting a deleted stream's parts failed; the sweep reclaims them");
        }
        let gone = app.with_stream(&key, |s| s.incarnation != inc || s.soft_deleted);
        if let Some(k) = snapshot
            && gone.unwrap_or(true)
            && !referenced_anywhere(&app, store::stem_of(&k))
        {
            store::delete_snapshot_objects(&*t.store, &k).await;
        }
    });
}

/// Whether any stream on this node references a snapshot object of `stem`.
fn referenced_anywhere(app: &App, stem: &str) -> bool {
    referenced_stems(app).contains(stem)
}

/// The stems of every snapshot object a stream of this node references (its own visible
/// snapshot, or one a fork inherited).
fn referenced_stems(app: &App) -> HashSet<String> {
    let mut out = HashSet::new();
    for g in 0..app.node.group_count() {
        app.with_group(g, |g| {
            for s in g.streams.values() {
                if let Some(r) = &s.snapshot_object {
                    out.insert(store::stem_of(&r.key).to_owned());
                }
            }
        });
    }
    out
}

/// One orphan-sweep pass (§9): staged parts older than the grace, and snapshot objects older
/// than the grace that no stream references. Returns how many objects it deleted.
pub async fn sweep_once(
    app: &App,
    store: &dyn ColdStore,
    grace: Duration,
) -> Result<u64, ApiError> {
    let cutoff = app.now_ms() as i64 - grace.as_millis() as i64;
    let mut deleted = 0;
    let parts = ursula_storage::cold::ObjectKey::new("snapshot-parts")
        .map_err(|e| cold_failed("name", &e))?;
    let mut touched = HashSet::new();
    for info in store
        .list(&parts)
        .await
        .map_err(|e| cold_failed("list parts", &e))?
    {
        if info.last_modified_ms < cutoff {
            store
                .delete(&info.key)
                .await
                .map_err(|e| cold_failed("delete a part", &e))?;
            deleted += 1;
            if let Some((prefix, _)) = info.key.as_str().rsplit_once('/') {
                touched.insert(prefix.to_owned());
            }
        }
    }
    if !touched.is_empty() {
        let keys: Vec<StreamKey> = app
            .parts
            .tallies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect();
        for k in keys {
            if store::parts_prefix(&k).is_ok_and(|p| touched.contains(p.as_str())) {
                app.parts.mark_for_listing(&k);
            }
        }
    }
    let snaps =
        ursula_storage::cold::ObjectKey::new("snapshots").map_err(|e| cold_failed("name", &e))?;
    let listed = store
        .list(&snaps)
        .await
        .map_err(|e| cold_failed("list snapshots", &e))?;
    let referenced = referenced_stems(app);
    for info in listed {
        let stem = store::stem_of(info.key.as_str());
        if info.last_modified_ms < cutoff
            && !referenced.contains(stem)
            && !app.parts.flights.contains(stem)
        {
            store
                .delete(&info.key)
                .await
                .map_err(|e| cold_failed("delete a snapshot", &e))?;
            deleted += 1;
        }
    }
    Ok(deleted)
}

/// Runs the orphan sweep every `storage.cold.snapshot_part_sweep_interval`.
pub fn spawn_sweep(app: &Arc<App>) {
    let Some(t) = app.tiering.clone() else {
        return;
    };
    let (every, grace) = (
        app.cfg.storage.cold.snapshot_part_sweep_interval,
        app.cfg.storage.cold.snapshot_part_grace,
    );
    app.spawn_every(every, move |app| {
        let t = t.clone();
        async move {
            match sweep_once(&app, &*t.store, grace).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(deleted = n, "orphan sweep reclaimed snapshot objects"),
                Err(e) => {
                    tracing::warn!(error = %e.rejection.message, "orphan sweep failed; it runs again next tick")
                }
            }
        }
    });
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn one_commit_per_stream_and_two_copies_per_node() {
        let reg = Registry::default();
        let budget = BodyBudget::new(256 << 20);
        let (a, b, c) = (
            StreamKey::new("b", "a"),
            StreamKey::new("b", "b"),
            StreamKey::new("b", "c"),
        );
        let mut ca = reg.start_commit(&a).unwrap();
        assert_eq!(
            reg.start_commit(&a).err().map(|e| e.code()),
            Some(ErrorCode::SNAPSHOT_COMMIT_IN_PROGRESS)
        );
        assert!(reg.commit_running(&a));
        let mut cb = reg.start_commit(&b).unwrap();
        let mut cc = reg.start_commit(&c).unwrap();
        ca.admit_copy(&budget).unwrap();
        cb.admit_copy(&budget).unwrap();
        assert_eq!(
            cc.admit_copy(&budget).err().map(|e| e.code()),
            Some(ErrorCode::SNAPSHOT_COMMITS_BUSY)
        );
        drop(ca);
        assert!(!reg.commit_running(&a));
        cc.admit_copy(&budget).unwrap();
        drop((cb, cc));
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn uploads_are_charged_until_stored_or_dropped() {
        let reg = Registry::default();
        let k = StreamKey::new("b", "s");
        reg.set_listed(&k, 1, 0, rules::MAX_STAGED_BYTES - 64, 0);
        let u = reg.reserve(&k, 32).unwrap();
        let v = reg.reserve(&k, 32).unwrap();
        assert!(reg.reserve(&k, 1).is_err(), "charged before the body");
        drop(v);
        u.stored(10);
        assert!(reg.reserve(&k, 54).is_ok());
        assert!(!reg.needs_listing(&k, 1, 1, None));
        reg.mark_for_listing(&k);
        assert!(reg.needs_listing(&k, 1, 1, None));
    }

    #[test]
    fn a_count_from_an_earlier_leadership_is_listed_again() {
        let reg = Registry::default();
        let k = StreamKey::new("b", "s");
        reg.set_listed(&k, 3, 5, 500, 1_000);
        assert!(!reg.needs_listing(&k, 3, 1_000, None));
        assert!(!reg.needs_listing(&k, 3, 1_500, Some(60_000)));
        assert!(reg.needs_listing(&k, 3, 70_000, Some(60_000)), "stale");
        // Another term: this node lost the leadership and took it back since the listing.
        assert!(reg.needs_listing(&k, 5, 1_000, None));
        reg.set_listed(&k, 5, 7, 700, 1_100);
        assert!(!reg.needs_listing(&k, 5, 1_100, None));
    }
}
