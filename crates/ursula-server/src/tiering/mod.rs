//! The cold tier at work (cluster.md §6.2-§6.6): the flush that moves a group's hot bytes
//! into an object, the GC that deletes objects nothing references any more, the fetch of a
//! read plan's cold pieces, and hot-bytes admission.
//!
//! What may move and what a read may see is decided in `ursula-core` ([`ursula_core::cold`]);
//! this module only does the IO: it takes what the group state planned (under one short read
//! lock, sharing the hot bytes rather than copying them), talks to the [`ColdStore`] outside
//! the lock, and proposes the result as a replicated command.
//!
//! - [`pass`]: one flush tick over the led groups (concurrency, hot pressure, orphan probe).
//! - [`flush`]: one group's flush, and handing unpublished uploads to GC.
//! - [`gc`]: deleting what a group queued.
//! - [`metrics`]: the tier's gauges and counters.
//! - here: settings, health, admission (hot-byte reservations) and fetching cold pieces.

mod flush;
mod gc;
mod metrics;
mod pass;

use crate::app::App;
use crate::cold_read;
use crate::http::error::ApiError;
use crate::metrics::inc;
use bytes::Bytes;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use ursula_core::ErrorCode;
use ursula_core::cold::ObjectId;
use ursula_storage::chunk_object::ChunkVersion;
use ursula_storage::cold::{Body, ColdError, ColdStore, ObjectKey};

/// The most cold bytes one [`Tiering::fetch`] brings into memory for one reader.
pub const FETCH_PIECE: u64 = 1 << 20;

/// Flush and GC settings (`[storage.cold]`, cluster.md §7.5).
#[derive(Debug, Clone)]
pub struct TierConfig {
    /// Flush tick. Default: 1 s.
    pub flush_interval: Duration,
    /// A group flushes once its streams holding at least `flush_min_run` hot bytes hold
    /// this many together. Default: 8 MiB.
    pub flush_min_hot_size: u64,
    /// Smallest hot run of a stream that an unforced flush takes. Default: 64 KiB.
    pub flush_min_run: u64,
    /// A group flushes any stream, however small its run, once it holds this many hot
    /// bytes. Default: 16 MiB.
    pub flush_any_hot_size: u64,
    /// Largest flush object. Default: 8 MiB.
    pub flush_max_size: u64,
    /// Led groups' hot bytes above which undersized groups flush too (`0` off). 128 MiB.
    pub flush_pressure_hot_size: u64,
    /// Flush uploads at once. Default: 4.
    pub flush_max_concurrency: usize,
    /// Writes that would take a group's hot bytes past this answer `503 COLD_BACKPRESSURE`
    /// (`0` disables). Default: 64 MiB.
    pub max_hot_size_per_group: u64,
    /// GC tick. Default: 5 s.
    pub gc_interval: Duration,
    /// Objects deleted per group per GC pass. Default: 256.
    pub gc_max_entries: usize,
    /// The cold read cache. Default: none.
    pub cache: Option<ursula_storage::cold::CacheConfig>,
}

impl Default for TierConfig {
    fn default() -> Self {
        TierConfig {
            flush_interval: Duration::from_secs(1),
            flush_min_hot_size: 8 << 20,
            flush_min_run: 64 << 10,
            flush_any_hot_size: 16 << 20,
            flush_max_size: 8 << 20,
            flush_pressure_hot_size: 128 << 20,
            flush_max_concurrency: 4,
            max_hot_size_per_group: 64 << 20,
            gc_interval: Duration::from_secs(5),
            gc_max_entries: 256,
            cache: None,
        }
    }
}

/// Counters of the cold tier (exported on `/__ursula/metrics`).
#[derive(Debug, Default)]
pub struct TierMetrics {
    pub flushes: AtomicU64,
    /// Flush ticks that found the led groups' hot bytes above `flush_pressure_hot_size`.
    pub pressure_flushes: AtomicU64,
    pub flushed_bytes: AtomicU64,
    pub flush_errors: AtomicU64,
    pub gc_deleted: AtomicU64,
    pub gc_errors: AtomicU64,
    pub cold_reads: AtomicU64,
    pub cold_read_bytes: AtomicU64,
    pub cold_read_errors: AtomicU64,
    /// Writes refused with `503 COLD_BACKPRESSURE`.
    pub backpressured: AtomicU64,
    /// Total microseconds spent in object-store calls, and how many there were.
    pub store_micros: AtomicU64,
    pub store_calls: AtomicU64,
}

/// Whether the cold store works, as the node last saw it: from the background probe and from
/// the outcome of real operations (a failed flush or read counts until one succeeds).
#[derive(Debug, Default)]
pub struct ColdHealth {
    probe: Mutex<Option<String>>,
    ops: Mutex<Option<String>>,
}

impl ColdHealth {
    /// The probe's outcome. A store that answers the probe again also clears the failure
    /// of an earlier operation (nothing else may retry soon enough to clear it).
    pub fn set_probe(&self, failing: Option<String>) {
        if failing.is_none() {
            self.set_ops(None);
        }
        *self.probe.lock().unwrap_or_else(|e| e.into_inner()) = failing;
    }

    fn set_ops(&self, failing: Option<String>) {
        let mut ops = self.ops.lock().unwrap_or_else(|e| e.into_inner());
        if ops.is_some() != failing.is_some() {
            match &failing {
                Some(e) => tracing::warn!(error = %e, "cold store failing"),
                None => tracing::info!("cold store working again"),
            }
        }
        *ops = failing;
    }

    /// A referenced object was missing on a fresh plan: the store lost data.
    pub fn note_missing_object(&self) {
        self.set_ops(Some("a referenced cold object is missing".to_owned()));
    }

    /// Why the cold store is unhealthy, if it is (a readiness reason, cluster.md §9.2).
    pub fn reason(&self) -> Option<String> {
        let probe = self.probe.lock().unwrap_or_else(|e| e.into_inner()).clone();
        probe.or_else(|| self.ops.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

/// The cold tier of a node with a cold backend.
pub struct Tiering {
    pub store: Arc<dyn ColdStore>,
    pub cfg: TierConfig,
    pub metrics: TierMetrics,
    pub health: ColdHealth,
    /// Verified cold blocks, when `[storage.cold.cache]` is configured (not used for a
    /// `local` store, whose objects are read from their files: [`Self::local`]).
    pub cache: Option<cold_read::BlockCache>,
    /// The open objects of a `local` store.
    local: crate::local_chunks::LocalChunks,
    /// Per group: a flush or GC pass is running (one at a time per group, so a flush always
    /// starts where the previous one ended).
    busy: Vec<AtomicBool>,
    /// Per group: hot bytes as of the last flush tick plus what was written since. Counting
    /// exactly would mean a pass over the group's streams on every write; this estimate is
    /// recounted every tick and only ever errs by what one tick wrote.
    hot: Vec<AtomicU64>,
    /// Per group: bytes reserved by writes not yet answered. A flush's recount of `hot` from
    /// the state adds them back (the state does not hold them yet), so the recount neither
    /// forgets a reservation nor lets its give-back take away bytes that are held.
    reserved: Vec<AtomicU64>,
    /// Groups whose orphan probe ran ([`Tiering::probe_orphan`]).
    pub(crate) probed: Vec<AtomicBool>,
    pub external: crate::external::ExternalMetrics,
}

/// The key of a group's chunk object (cluster.md §6): one prefix per group namespace. An
/// external payload's id names its own key ([`crate::external::external_key`]).
pub fn chunk_key(namespace: u64, group: u32, id: ObjectId) -> Result<ObjectKey, ColdError> {
    if id.is_external() {
        return crate::external::external_key(namespace, group, id);
    }
    ObjectKey::new(format!(
        "chunks/{namespace:016x}/g{group:05}/{:020}.chunk",
        id.0
    ))
}

/// A fresh, non-zero namespace for a group's first flush.
fn fresh_namespace() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish().max(1)
}

fn cold_failed(e: &ColdError) -> ApiError {
    ApiError::new(
        ErrorCode::COLD_STORE_FAILED,
        format!("the cold store failed to serve the read: {e}"),
    )
}

/// Why a cold piece could not be fetched.
pub enum FetchError {
    /// The object is not in the store.
    Missing,
    /// The store failed, or the bytes fail their checksums.
    Failed(ApiError),
}

/// Hot bytes a write reserved in its group's count ([`Tiering::admit`]).
#[must_use = "a reservation is given back when dropped"]
pub struct HotReservation<'a> {
    counter: Option<&'a AtomicU64>,
    /// The group's outstanding reservations, which a flush's recount adds back.
    reserved: Option<&'a AtomicU64>,
    bytes: u64,
}

impl HotReservation<'_> {
    /// Nothing reserved (no cold tier, or a producer's retry that adds nothing).
    pub fn none() -> Self {
        HotReservation {
            counter: None,
            reserved: None,
            bytes: 0,
        }
    }

    /// The bytes were written: they stay counted until a flush moves them.
    pub fn keep(mut self) {
        self.counter = None;
    }
}

impl Drop for HotReservation<'_> {
    fn drop(&mut self) {
        if let Some(r) = self.reserved {
            r.fetch_sub(self.bytes, Ordering::AcqRel);
        }
        if let Some(c) = self.counter {
            let _ = c.fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                Some(h.saturating_sub(self.bytes))
            });
        }
    }
}

/// Clears a group's busy flag when a pass ends, however it ends.
struct Busy<'a>(&'a AtomicBool);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl Tiering {
    pub fn new(store: Arc<dyn ColdStore>, cfg: TierConfig, groups: u32) -> Arc<Tiering> {
        Arc::new(Tiering {
            cache: cfg.cache.as_ref().and_then(cold_read::BlockCache::new),
            local: Default::default(),
            store,
            cfg,
            metrics: TierMetrics::default(),
            health: ColdHealth::default(),
            busy: (0..groups).map(|_| AtomicBool::new(false)).collect(),
            hot: (0..groups).map(|_| AtomicU64::new(0)).collect(),
            reserved: (0..groups).map(|_| AtomicU64::new(0)).collect(),
            probed: (0..groups).map(|_| AtomicBool::new(false)).collect(),
            external: Default::default(),
        })
    }

    fn claim(&self, group: u32) -> Option<Busy<'_>> {
        let flag = self.busy.get(group as usize)?;
        (!flag.swap(true, Ordering::AcqRel)).then_some(Busy(flag))
    }

    /// Reserves `incoming` hot bytes in `group`, or answers `503 COLD_BACKPRESSURE` when they
    /// would take the group past its bound (cluster.md §6.6; a group holding nothing admits
    /// any one write). Concurrent writes each see the others' reservations, so together they
    /// cannot overshoot the bound. The reservation is given back when dropped, unless
    /// [`HotReservation::keep`] says the bytes were written.
    pub fn admit(&self, group: u32, incoming: u64) -> Result<HotReservation<'_>, ApiError> {
        let max = self.cfg.max_hot_size_per_group;
        let (Some(counter), Some(reserved)) = (
            self.hot.get(group as usize),
            self.reserved.get(group as usize),
        ) else {
            return Ok(HotReservation::none());
        };
        let fits = |hot: u64| max == 0 || hot == 0 || hot.saturating_add(incoming) <= max;
        // Noted as outstanding first: a recount in between counts it twice (until the next
        // one), never not at all.
        reserved.fetch_add(incoming, Ordering::AcqRel);
        match counter.fetch_update(Ordering::AcqRel, Ordering::Acquire, |hot| {
            fits(hot).then(|| hot.saturating_add(incoming))
        }) {
            Ok(_) => Ok(HotReservation {
                counter: Some(counter),
                reserved: Some(reserved),
                bytes: incoming,
            }),
            Err(hot) => {
                reserved.fetch_sub(incoming, Ordering::AcqRel);
                inc(&self.metrics.backpressured, 1);
                Err(ApiError::new(
                    ErrorCode::COLD_BACKPRESSURE,
                    format!(
                        "group {group} holds {hot} bytes not yet in the cold tier (bound {max}); retry"
                    ),
                ))
            }
        }
    }

    /// A flush's recount: `group`'s state holds `hot` bytes, plus what outstanding
    /// reservations will add.
    pub(crate) fn note_hot(&self, group: u32, hot: u64) {
        if let (Some(c), Some(r)) = (
            self.hot.get(group as usize),
            self.reserved.get(group as usize),
        ) {
            c.store(
                hot.saturating_add(r.load(Ordering::Acquire)),
                Ordering::Release,
            );
        }
    }

    /// The hot bytes `group` held when its last flush pass looked (0 if it never did).
    pub fn hot_seen(&self, group: u32) -> u64 {
        self.hot
            .get(group as usize)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// Appends the first bytes of one cold piece to `out` (as slices of the fetched or cached
    /// buffers, or of a `local` object's file), checked block by block, and returns how many.
    /// At most [`FETCH_PIECE`] bytes are fetched into memory at once; a `local` object's
    /// checked bytes, which leave from its mapping, are not counted. A missing object is
    /// [`FetchError::Missing`] (GC may have deleted it after the read was planned: the caller
    /// plans again) and does not count against the store's health.
    pub async fn fetch(
        &self,
        (namespace, group): (u64, u32),
        object: ObjectId,
        (pos, len, object_len): (u64, u64, u64),
        out: &mut Vec<Bytes>,
    ) -> Result<u64, FetchError> {
        let key =
            chunk_key(namespace, group, object).map_err(|e| FetchError::Failed(cold_failed(&e)))?;
        // Both reads append nothing when they fail.
        let read = async {
            match self.store.local_file(&key) {
                Some(path) => self.local.read(&path, (pos, len, object_len), out).await,
                None => {
                    let cache = self.cache.as_ref();
                    let at = (group, object);
                    let piece = (pos, len.min(FETCH_PIECE), object_len);
                    cold_read::read(self.store.as_ref(), cache, &key, at, piece, out).await?;
                    Ok(piece.1)
                }
            }
        };
        let len = match self.timed(read).await {
            Ok(got) => {
                self.health.set_ops(None);
                got
            }
            Err(cold_read::ReadError::Store(ColdError::NotFound { .. })) => {
                return Err(FetchError::Missing);
            }
            Err(cold_read::ReadError::Store(e)) => {
                inc(&self.metrics.cold_read_errors, 1);
                tracing::debug!(group, object = object.0, error = %e, "cold read failed");
                self.health.set_ops(Some(format!("read failed: {e}")));
                return Err(FetchError::Failed(cold_failed(&e)));
            }
            Err(cold_read::ReadError::Corrupt(e)) => {
                inc(&self.metrics.cold_read_errors, 1);
                tracing::error!(group, object = object.0, error = %e, "cold object is corrupt");
                return Err(FetchError::Failed(ApiError::new(
                    ErrorCode::COLD_STORE_FAILED,
                    format!("a cold object failed its checksum: {e}"),
                )));
            }
        };
        inc(&self.metrics.cold_reads, 1);
        inc(&self.metrics.cold_read_bytes, len);
        Ok(len)
    }

    /// The layout to write an object at `key` in: contiguous where reads send it from a
    /// local file, interleaved where they fetch ranges of it (`chunk_object`'s docs).
    pub fn chunk_version(&self, key: &ObjectKey) -> ChunkVersion {
        ChunkVersion::for_local_files(self.store.local_file(key).is_some())
    }

    /// A conditional create, timed like every store call.
    pub async fn timed_put(&self, key: &ObjectKey, body: Body) -> Result<(), ColdError> {
        self.timed(self.store.put_if_absent(key, body)).await
    }

    async fn timed<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        let t = std::time::Instant::now();
        let r = f.await;
        inc(&self.metrics.store_micros, t.elapsed().as_micros() as u64);
        inc(&self.metrics.store_calls, 1);
        r
    }

    /// Runs flush and GC passes until shutdown.
    pub fn spawn(self: &Arc<Self>, app: &Arc<App>) {
        let (tier, app) = (self.clone(), app.clone());
        let mut stop = app.shutdown.subscribe();
        tokio::spawn(async move {
            let mut flush = tokio::time::interval(tier.cfg.flush_interval);
            let mut gc = tokio::time::interval(tier.cfg.gc_interval);
            flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            gc.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = flush.tick() => tier.flush_pass(&app).await,
                    _ = gc.tick() => {
                        for group in 0..app.node.group_count() {
                            tier.gc_group(&app, group).await;
                        }
                    }
                    _ = stop.changed() => break,
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]
    use super::*;

    fn tiering(max: u64) -> Arc<Tiering> {
        let cfg = TierConfig {
            max_hot_size_per_group: max,
            ..TierConfig::default()
        };
        let store = Arc::new(ursula_storage::cold::ObjectColdStore::memory());
        Tiering::new(store, cfg, 1)
    }

    #[test]
    fn a_recount_keeps_the_reservations_of_writes_not_yet_landed() {
        let t = tiering(100);
        t.note_hot(0, 10);
        let a = t.admit(0, 60).unwrap();
        // A flush recounts while the write is in flight (the state holds 10 bytes).
        t.note_hot(0, 10);
        assert!(
            t.admit(0, 40).is_err(),
            "the in-flight 60 bytes still count"
        );
        let b = t.admit(0, 30).unwrap();
        // The first write fails: its give-back leaves the second one's bytes counted.
        drop(a);
        assert_eq!(t.hot_seen(0), 40);
        b.keep();
        t.note_hot(0, 40);
        assert_eq!(
            t.hot_seen(0),
            40,
            "a landed write is counted once after a recount"
        );
    }
}
