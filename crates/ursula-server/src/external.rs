//! External payloads (cluster.md §6.4): an append or create body of at least
//! `runtime.external_payload_min_size` goes to the cold store first, and the replicated
//! command carries a reference to it ([`ursula_core::external`]), so the WAL, the Raft
//! replication and the group's memory never hold its bytes.
//!
//! Lifecycle of one object (`external/{namespace:016x}/g{group:05}/{id:016x}.payload`, a chunk
//! object frame):
//! 1. written with a conditional create under a fresh random id (a taken id: another one);
//!    a failed write answers `502 COLD_STORE_FAILED` and nothing is proposed;
//! 2. the command commits: the object is referenced (appended) or, if the command was refused
//!    or appended nothing (a producer duplicate, a re-create), queued for GC by the same apply;
//! 3. the command is known not to have reached the log (the node's storage refused it): the
//!    object is deleted at once;
//! 4. anything else (a timeout, an unknown outcome, a crash between upload and commit) leaves
//!    the object to the orphan sweep: every `storage.cold.snapshot_part_sweep_interval` the
//!    leader of each group deletes its external objects older than
//!    `storage.cold.snapshot_part_grace` that the group state neither references nor queues.
//!    The grace (default 1 day) must exceed the longest a proposal may wait to commit.

use crate::app::App;
use crate::http::error::ApiError;
use bytes::Bytes;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use ursula_core::ErrorCode;
use ursula_core::cold::ObjectId;
use ursula_core::command::{AppendReq, CreateReq, Op, Reply};
use ursula_core::external::{ExternalAppend, ExternalCreate, ExternalPayload};
use ursula_storage::chunk_object::ChunkWriter;
use ursula_storage::cold::{ColdError, ObjectKey};

/// Counters of external payloads (exported with the cold tier's metrics).
#[derive(Debug, Default)]
pub struct ExternalMetrics {
    /// Payloads written to the store, and their bytes.
    pub writes: AtomicU64,
    pub bytes: AtomicU64,
    /// Payload writes the store failed (answered `502 COLD_STORE_FAILED`).
    pub errors: AtomicU64,
    /// Orphans the sweep deleted.
    pub swept: AtomicU64,
}

impl ExternalMetrics {
    pub fn rows(&self) -> Vec<(&'static str, &'static str, u64)> {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        vec![
            (
                "ursula_external_payloads_total",
                "counter",
                get(&self.writes),
            ),
            (
                "ursula_external_payload_bytes_total",
                "counter",
                get(&self.bytes),
            ),
            (
                "ursula_external_payload_errors_total",
                "counter",
                get(&self.errors),
            ),
            (
                "ursula_external_payloads_swept_total",
                "counter",
                get(&self.swept),
            ),
        ]
    }
}

/// The key of an external payload object.
pub fn external_key(namespace: u64, group: u32, id: ObjectId) -> Result<ObjectKey, ColdError> {
    ObjectKey::new(format!(
        "{}/{:016x}.payload",
        prefix_str(namespace, group),
        id.0
    ))
}

fn prefix_str(namespace: u64, group: u32) -> String {
    format!("external/{namespace:016x}/g{group:05}")
}

/// The id of an external payload object from its key, if it is one.
fn id_of(key: &str) -> Option<ObjectId> {
    let name = key.rsplit('/').next()?.strip_suffix(".payload")?;
    let id = u64::from_str_radix(name, 16).ok()?;
    Some(ObjectId(id)).filter(|i| i.is_external() && name.len() == 16)
}

/// A random 64-bit value (not cryptographic: ids and namespaces only need to differ).
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

/// Whether a canonical body of `len` bytes is written to the cold store before it is proposed.
pub fn wanted(app: &App, len: usize) -> bool {
    app.tiering.is_some() && len > 0 && len as u64 >= app.cfg.runtime.external_payload_min_size
}

fn store_failed(e: &ColdError) -> ApiError {
    ApiError::new(
        ErrorCode::COLD_STORE_FAILED,
        format!("the cold store failed to take the payload; nothing was appended: {e}"),
    )
}

/// Writes `payload` as an external object of `group` and returns its reference.
async fn stage(
    app: &Arc<App>,
    group: u32,
    payload: &Bytes,
    json: bool,
) -> Result<ExternalPayload, ApiError> {
    let Some(t) = &app.tiering else {
        return Err(ApiError::new(
            ErrorCode::INTERNAL_ERROR,
            "no cold tier for an external payload",
        ));
    };
    // Like a flush, never write under a namespace the group's state does not know yet.
    let (mut namespace, next) = app.with_group(group, |g| (g.cold.namespace, g.cold.next_object));
    if namespace == 0 {
        namespace = match t.claim_namespace(app, group, next).await {
            Some((ns, _)) if ns != 0 => ns,
            _ => {
                return Err(ApiError::new(
                    ErrorCode::LEADER_UNAVAILABLE,
                    "the group's cold namespace could not be committed; nothing was appended; retry",
                ));
            }
        };
    }
    let len = payload.len() as u64;
    let probe = external_key(namespace, group, ObjectId(ObjectId::EXTERNAL_BIT))
        .map_err(|e| store_failed(&e))?;
    let mut w = ChunkWriter::new(t.chunk_version(&probe), len);
    w.push(payload.clone());
    let object = w.finish_body().ok_or_else(|| {
        ApiError::new(ErrorCode::INTERNAL_ERROR, "external object length mismatch")
    })?;
    let ends = if json {
        let mut ends = Vec::with_capacity(16);
        ends.extend(
            payload
                .iter()
                .enumerate()
                .filter(|(_, b)| **b == b'\n')
                .map(|(i, _)| i as u64 + 1),
        );
        ends
    } else {
        Vec::new()
    };
    for _ in 0..4 {
        let id = ObjectId(random_u64() | ObjectId::EXTERNAL_BIT);
        let key = external_key(namespace, group, id).map_err(|e| store_failed(&e))?;
        match t.timed_put(&key, object.clone()).await {
            Ok(()) => {
                crate::metrics::inc(&t.external.writes, 1);
                crate::metrics::inc(&t.external.bytes, len);
                return Ok(ExternalPayload {
                    namespace,
                    object: id,
                    len,
                    object_size: object.len(),
                    ends,
                });
            }
            Err(ColdError::AlreadyExists { .. }) => continue,
            Err(e) => {
                tracing::debug!(group, error = %e, "external payload upload failed");
                crate::metrics::inc(&t.external.errors, 1);
                return Err(store_failed(&e));
            }
        }
    }
    Err(ApiError::new(
        ErrorCode::COLD_STORE_FAILED,
        "the cold store had every id tried for the payload; nothing was appended",
    ))
}

/// After a proposal failed: deletes the object when the command surely never reached the log
/// (the node's storage refused it). A refusal by the state machine queued the object for GC
/// already; an unknown outcome is left to the sweep (the command may still commit).
fn settle_failed(app: &Arc<App>, group: u32, x: &ExternalPayload, e: &ApiError) {
    let never_logged = matches!(
        e.code(),
        ErrorCode::STORAGE_UNAVAILABLE | ErrorCode::INSUFFICIENT_STORAGE
    );
    let Some(t) = app.tiering.clone().filter(|_| never_logged) else {
        return;
    };
    let Ok(key) = external_key(x.namespace, group, x.object) else {
        return;
    };
    tokio::spawn(async move {
        if let Err(e) = t.store.delete(&key).await {
            tracing::debug!(error = %e, "deleting an unused external payload failed; the sweep reclaims it");
        }
    });
}

/// An append whose canonical body (`payload`, `req.payload` empty) goes to the store first.
pub async fn append(
    app: &Arc<App>,
    req: AppendReq,
    payload: Bytes,
    json: bool,
) -> Result<Reply, ApiError> {
    let group = app.group_of(&req.key);
    if let Some(dup) = duplicate(app, group, &req).await {
        return Ok(dup);
    }
    let x = stage(app, group, &payload, json).await?;
    let op = Op::AppendExternal(Box::new(ExternalAppend {
        req,
        payload: x.clone(),
    }));
    let r = app.propose(group, op).await;
    if let Err(e) = &r {
        settle_failed(app, group, &x, e);
    }
    r
}

/// The answer to a producer's retry of an append it already made, without uploading the body
/// again. When the state shows the producer's `(epoch, seq)` as taken, an append of the same
/// headers with an empty body is proposed: the duplicate check runs before anything that
/// depends on the body, so if it still is a duplicate that answers it. Anything else (the
/// stream changed meanwhile) falls back to the full path.
async fn duplicate(app: &Arc<App>, group: u32, req: &AppendReq) -> Option<Reply> {
    let p = req.producer.as_ref()?;
    let taken = app.with_stream(&req.key, |s| {
        s.producers
            .get(&p.id)
            .is_some_and(|st| st.epoch == p.epoch && p.seq <= st.last_seq)
    });
    if taken != Some(true) {
        return None;
    }
    let probe = AppendReq {
        payload: Bytes::new(),
        messages: 0,
        // An empty body with close would close the stream if it is no duplicate after all.
        close: false,
        ..req.clone()
    };
    match app.propose(group, Op::Append(Box::new(probe))).await {
        Ok(Reply::Appended(a)) if a.duplicate => Some(Reply::Appended(a)),
        _ => None,
    }
}

/// A create (not a fork) whose canonical initial body goes to the store first.
pub async fn create(
    app: &Arc<App>,
    req: CreateReq,
    payload: Bytes,
    json: bool,
) -> Result<Reply, ApiError> {
    let group = app.group_of(&req.key);
    let x = stage(app, group, &payload, json).await?;
    let op = Op::CreateExternal(Box::new(ExternalCreate {
        req,
        payload: x.clone(),
    }));
    let r = app.propose(group, op).await;
    if let Err(e) = &r {
        settle_failed(app, group, &x, e);
    }
    r
}

/// One sweep of `group`'s external objects (leader only): deletes those older than `grace`
/// that the group state neither references nor has queued for GC. Returns how many it deleted.
pub async fn sweep_group(app: &Arc<App>, group: u32, grace: Duration) -> Result<u64, ColdError> {
    let Some(t) = &app.tiering else {
        return Ok(0);
    };
    if !app.node.leads(group) {
        return Ok(0);
    }
    let namespace = app.with_group(group, |g| g.cold.namespace);
    if namespace == 0 {
        return Ok(0);
    }
    let prefix = ObjectKey::new(prefix_str(namespace, group))?;
    let listed = t.store.list(&prefix).await?;
    let cutoff = app.now_ms() as i64 - grace.as_millis() as i64;
    let old: Vec<(ObjectKey, ObjectId)> = listed
        .into_iter()
        .filter(|i| i.last_modified_ms < cutoff)
        .filter_map(|i| id_of(i.key.as_str()).map(|id| (i.key, id)))
        .collect();
    if old.is_empty() {
        return Ok(0);
    }
    // Known ids, read after the listing: an object committed meanwhile is known here.
    let known: BTreeSet<ObjectId> = app.with_group(group, |g| {
        old.iter()
            .map(|(_, id)| *id)
            .filter(|id| g.cold.objects.contains_key(id) || g.cold.gc.contains(id))
            .collect()
    });
    let mut deleted = 0;
    for (key, id) in old {
        if known.contains(&id) {
            continue;
        }
        t.store.delete(&key).await?;
        deleted += 1;
        crate::metrics::inc(&t.external.swept, 1);
        tracing::info!(
            group,
            object = id.0,
            "orphan sweep deleted an unreferenced external payload"
        );
    }
    Ok(deleted)
}

/// Runs [`sweep_group`] over every group every `storage.cold.snapshot_part_sweep_interval`.
pub fn spawn_sweep(app: &Arc<App>) {
    if app.tiering.is_none() {
        return;
    }
    let (every, grace) = (
        app.cfg.storage.cold.snapshot_part_sweep_interval,
        app.cfg.storage.cold.snapshot_part_grace,
    );
    app.spawn_every(every, move |app| async move {
        for group in 0..app.node.group_count() {
            if let Err(e) = sweep_group(&app, group, grace).await {
                tracing::warn!(group, error = %e, "external payload sweep failed; it runs again next tick");
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_their_id() {
        let id = ObjectId(ObjectId::EXTERNAL_BIT | 0xabc);
        let key = external_key(0x12, 3, id).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            key.as_str(),
            "external/0000000000000012/g00003/8000000000000abc.payload"
        );
        assert_eq!(id_of(key.as_str()), Some(id));
        assert_eq!(
            id_of("external/0000000000000012/g00003/0000000000000abc.payload"),
            None
        );
        assert_eq!(id_of("external/x/g00003/8000000000000abc.chunk"), None);
    }
}
