//! The [`ColdStore`] trait, and its implementation over any `object_store` backend.

use super::local_put::DurableDirs;
use super::{Body, ColdError, ObjectKey};
use crate::fs::{FileSystem, RealFs};
use crate::pace::Pace;
use bytes::Bytes;
use futures::TryStreamExt;
use futures::future::BoxFuture;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload,
};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

/// What the store knows of one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    pub key: ObjectKey,
    pub size: u64,
    /// Milliseconds since the Unix epoch (for grace periods such as the orphan sweep's).
    pub last_modified_ms: i64,
}

/// The operations the cold tier needs from an object store, and nothing else.
///
/// Contract (checked by [`super::testing::suite`] on every backend):
/// - Objects are immutable: [`ColdStore::put_if_absent`] never replaces an object; a second
///   create of a key answers [`ColdError::AlreadyExists`], and the first object stays whole.
///   A successful create is durable and visible to every later call.
/// - Reads of a missing key answer [`ColdError::NotFound`]; [`ColdError::Unavailable`] means
///   the outcome is unknown and the call may be retried.
/// - [`ColdStore::delete`] is idempotent: deleting a missing object succeeds.
/// - [`ColdStore::list`] returns every object below a prefix, sorted by key.
pub trait ColdStore: Send + Sync + std::fmt::Debug + 'static {
    /// Creates `key` holding `body` (its pieces in order, sent without concatenating them),
    /// unless an object is already there.
    fn put_if_absent<'a>(
        &'a self,
        key: &'a ObjectKey,
        body: Body,
    ) -> BoxFuture<'a, Result<(), ColdError>>;

    /// [`ColdStore::put_if_absent`] for a create nobody waits on (a routine flush): a store on
    /// the node's own disk may write it at a pace that keeps out of the WAL's way (the `local`
    /// backend does, [`Pace::BACKGROUND`]). The same contract otherwise.
    fn put_if_absent_paced<'a>(
        &'a self,
        key: &'a ObjectKey,
        body: Body,
    ) -> BoxFuture<'a, Result<(), ColdError>> {
        self.put_if_absent(key, body)
    }

    /// The whole object.
    fn get<'a>(&'a self, key: &'a ObjectKey) -> BoxFuture<'a, Result<Bytes, ColdError>>;

    /// Exactly the bytes `range` of the object; [`ColdError::InvalidRange`] when the range is
    /// empty or reaches past the end.
    fn get_range<'a>(
        &'a self,
        key: &'a ObjectKey,
        range: Range<u64>,
    ) -> BoxFuture<'a, Result<Bytes, ColdError>>;

    fn head<'a>(&'a self, key: &'a ObjectKey) -> BoxFuture<'a, Result<ObjectInfo, ColdError>>;

    fn delete<'a>(&'a self, key: &'a ObjectKey) -> BoxFuture<'a, Result<(), ColdError>>;

    /// Every object below `prefix` (`prefix/...`), sorted by key.
    fn list<'a>(
        &'a self,
        prefix: &'a ObjectKey,
    ) -> BoxFuture<'a, Result<Vec<ObjectInfo>, ColdError>>;

    /// Checks that the store answers (a `head` of a key that need not exist).
    fn probe(&self) -> BoxFuture<'_, Result<(), ColdError>>;

    /// The local file that holds `key`, when the store keeps its objects as plain files in a
    /// local directory (the `local` backend), so a reader may open it directly; `None` for
    /// every other store. The file's bytes are exactly what [`ColdStore::get`] answers, and
    /// like every object it is never changed once created (it may be deleted).
    fn local_file(&self, _key: &ObjectKey) -> Option<PathBuf> {
        None
    }
}

/// [`ColdStore`] over an `object_store` backend (`LocalFileSystem`, `AmazonS3`, `InMemory`),
/// every key below an optional root prefix.
#[derive(Debug, Clone)]
pub struct ObjectColdStore {
    store: Arc<dyn ObjectStore>,
    root: Option<Path>,
    name: &'static str,
    /// The same store as `store` when it is an unshared `LocalFileSystem`, whose files a
    /// reader may open directly ([`ColdStore::local_file`]).
    local: Option<Arc<LocalFileSystem>>,
    /// Set when `store` is any `LocalFileSystem`: creates are written by `super::local_put`.
    paced: Option<LocalPut>,
}

/// How a `local` store writes its creates: into `fs`'s directory through `io`, at `pace` when
/// paced.
#[derive(Debug, Clone)]
struct LocalPut {
    fs: Arc<LocalFileSystem>,
    io: Arc<dyn FileSystem>,
    pace: Pace,
    dirs: Arc<DurableDirs>,
}

/// Key the health probe heads; it need not exist.
const PROBE_KEY: &str = "_ursula/probe";

impl ObjectColdStore {
    /// `name` names the backend in logs (`local`, `s3`, `memory`); `root` is a key prefix.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        root: Option<&str>,
        name: &'static str,
    ) -> Result<Self, ColdError> {
        let root = match root.map(str::trim).filter(|r| !r.is_empty()) {
            Some(r) => Some(Path::from(ObjectKey::new(r.trim_matches('/'))?.as_str())),
            None => None,
        };
        Ok(ObjectColdStore {
            store,
            root,
            name,
            local: None,
            paced: None,
        })
    }

    /// A store over a local directory: `local` is also the backend, its files are the objects
    /// ([`ColdStore::local_file`]), and objects are written at `pace`.
    pub fn local(
        local: Arc<LocalFileSystem>,
        root: Option<&str>,
        pace: Pace,
    ) -> Result<Self, ColdError> {
        let mut store = Self::local_shared(local.clone(), root, pace)?;
        store.local = Some(local);
        Ok(store)
    }

    /// A store over a local directory that other nodes also write and delete (its files are
    /// read through the store, never opened directly); objects are written at `pace`.
    pub fn local_shared(
        local: Arc<LocalFileSystem>,
        root: Option<&str>,
        pace: Pace,
    ) -> Result<Self, ColdError> {
        let mut store = Self::new(local.clone(), root, "local")?;
        store.paced = Some(LocalPut {
            fs: local,
            io: Arc::new(RealFs),
            pace,
            dirs: Arc::default(),
        });
        Ok(store)
    }

    /// Writes a `local` store's creates through `io` instead of the real filesystem (tests
    /// inject faults with [`crate::fs::FaultyFs`]); other stores are unchanged.
    #[cfg(test)]
    pub(crate) fn with_filesystem(mut self, io: Arc<dyn FileSystem>) -> Self {
        if let Some(p) = &mut self.paced {
            p.io = io;
        }
        self
    }

    /// An in-memory store (tests).
    pub fn memory() -> Self {
        ObjectColdStore {
            store: Arc::new(object_store::memory::InMemory::new()),
            root: None,
            name: "memory",
            local: None,
            paced: None,
        }
    }

    pub fn backend_name(&self) -> &'static str {
        self.name
    }

    fn path(&self, key: &ObjectKey) -> Path {
        match &self.root {
            Some(root) => Path::from(format!("{root}/{key}")),
            None => Path::from(key.as_str()),
        }
    }

    /// The key of a listed path (with the root removed).
    fn key_of(&self, path: &Path) -> Result<ObjectKey, ColdError> {
        let s = path.as_ref();
        let rel = match &self.root {
            Some(root) => s
                .strip_prefix(root.as_ref())
                .and_then(|r| r.strip_prefix('/'))
                .unwrap_or(s),
            None => s,
        };
        ObjectKey::new(rel)
    }

    /// A create on a local directory (`super::local_put`), at `pace`.
    async fn put_local(
        &self,
        local: &LocalPut,
        key: &ObjectKey,
        body: Body,
        pace: Pace,
    ) -> Result<(), ColdError> {
        let path = self.path(key);
        let dest = local
            .fs
            .path_to_filesystem(&path)
            .map_err(|e| ColdError::from_store("put", key.as_str(), e))?;
        // The directories from the object's up to the store's.
        let levels = path.as_ref().matches('/').count() + 1;
        let (key, dirs, io) = (
            key.to_string(),
            Arc::clone(&local.dirs),
            Arc::clone(&local.io),
        );
        tokio::task::spawn_blocking(move || {
            super::local_put::put_if_absent(io.as_ref(), &dest, &key, &body, pace, &dirs, levels)
        })
        .await
        .map_err(|e| ColdError::Unavailable {
            operation: "put",
            source: Box::new(e),
        })?
    }

    async fn range_error(&self, key: &ObjectKey, range: &Range<u64>) -> Option<ColdError> {
        let size = self.store.head(&self.path(key)).await.ok()?.size;
        (range.end > size).then(|| ColdError::InvalidRange {
            key: key.to_string(),
            start: range.start,
            end: range.end,
            size,
        })
    }
}

fn info(key: ObjectKey, meta: &object_store::ObjectMeta) -> ObjectInfo {
    ObjectInfo {
        key,
        size: meta.size,
        last_modified_ms: meta.last_modified.timestamp_millis(),
    }
}

impl ColdStore for ObjectColdStore {
    fn put_if_absent<'a>(
        &'a self,
        key: &'a ObjectKey,
        body: Body,
    ) -> BoxFuture<'a, Result<(), ColdError>> {
        Box::pin(async move {
            if let Some(local) = &self.paced {
                return self.put_local(local, key, body, Pace::FLAT).await;
            }
            let opts = PutOptions {
                mode: PutMode::Create,
                ..Default::default()
            };
            let payload: PutPayload = body.into_pieces().into_iter().collect();
            self.store
                .put_opts(&self.path(key), payload, opts)
                .await
                .map(|_| ())
                .map_err(|e| ColdError::from_store("put", key.as_str(), e))
        })
    }

    fn put_if_absent_paced<'a>(
        &'a self,
        key: &'a ObjectKey,
        body: Body,
    ) -> BoxFuture<'a, Result<(), ColdError>> {
        match &self.paced {
            Some(local) => Box::pin(self.put_local(local, key, body, local.pace)),
            None => self.put_if_absent(key, body),
        }
    }

    fn get<'a>(&'a self, key: &'a ObjectKey) -> BoxFuture<'a, Result<Bytes, ColdError>> {
        Box::pin(async move {
            let map = |e| ColdError::from_store("get", key.as_str(), e);
            let got = self.store.get(&self.path(key)).await.map_err(map)?;
            got.bytes().await.map_err(map)
        })
    }

    fn get_range<'a>(
        &'a self,
        key: &'a ObjectKey,
        range: Range<u64>,
    ) -> BoxFuture<'a, Result<Bytes, ColdError>> {
        Box::pin(async move {
            if range.start >= range.end {
                return Err(ColdError::InvalidRange {
                    key: key.to_string(),
                    start: range.start,
                    end: range.end,
                    size: 0,
                });
            }
            let opts = GetOptions {
                range: Some(GetRange::Bounded(range.clone())),
                ..Default::default()
            };
            let map = |e| ColdError::from_store("get_range", key.as_str(), e);
            let bytes = match self.store.get_opts(&self.path(key), opts).await {
                Ok(got) => got.bytes().await.map_err(map)?,
                Err(e @ object_store::Error::NotFound { .. }) => return Err(map(e)),
                // Backends word an unsatisfiable range differently; decide by the size.
                Err(e) => return Err(self.range_error(key, &range).await.unwrap_or(map(e))),
            };
            if bytes.len() as u64 != range.end - range.start {
                return Err(self.range_error(key, &range).await.unwrap_or(
                    ColdError::InvalidRange {
                        key: key.to_string(),
                        start: range.start,
                        end: range.end,
                        size: range.start + bytes.len() as u64,
                    },
                ));
            }
            Ok(bytes)
        })
    }

    fn head<'a>(&'a self, key: &'a ObjectKey) -> BoxFuture<'a, Result<ObjectInfo, ColdError>> {
        Box::pin(async move {
            let meta = self
                .store
                .head(&self.path(key))
                .await
                .map_err(|e| ColdError::from_store("head", key.as_str(), e))?;
            Ok(info(key.clone(), &meta))
        })
    }

    fn delete<'a>(&'a self, key: &'a ObjectKey) -> BoxFuture<'a, Result<(), ColdError>> {
        Box::pin(async move {
            match self.store.delete(&self.path(key)).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(ColdError::from_store("delete", key.as_str(), e)),
            }
        })
    }

    fn list<'a>(
        &'a self,
        prefix: &'a ObjectKey,
    ) -> BoxFuture<'a, Result<Vec<ObjectInfo>, ColdError>> {
        Box::pin(async move {
            let map = |e| ColdError::from_store("list", prefix.as_str(), e);
            let metas: Vec<_> = self
                .store
                .list(Some(&self.path(prefix)))
                .try_collect()
                .await
                .map_err(map)?;
            let mut out = Vec::with_capacity(metas.len());
            for meta in &metas {
                let key = self.key_of(&meta.location)?;
                if key.is_below(prefix) {
                    out.push(info(key, meta));
                }
            }
            out.sort_by(|a, b| a.key.cmp(&b.key));
            Ok(out)
        })
    }

    fn probe(&self) -> BoxFuture<'_, Result<(), ColdError>> {
        Box::pin(async move {
            let key = ObjectKey::new(PROBE_KEY)?;
            match self.head(&key).await {
                Ok(_) | Err(ColdError::NotFound { .. }) => Ok(()),
                Err(e) => Err(e),
            }
        })
    }

    fn local_file(&self, key: &ObjectKey) -> Option<PathBuf> {
        self.local
            .as_ref()?
            .path_to_filesystem(&self.path(key))
            .ok()
    }
}
