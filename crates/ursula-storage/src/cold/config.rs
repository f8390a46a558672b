//! `[storage.cold]` configuration (cluster.md §7.5) and the construction of the store it names.

use super::{ColdError, ColdStore, ObjectColdStore};
use crate::pace::Pace;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

/// Which object store holds the cold tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Objects in a local directory (`storage.cold.local.path`).
    Local,
    /// An S3-compatible object store.
    S3,
    /// Process memory; lost on exit (tests).
    Memory,
    /// No cold tier.
    None,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Local => "local",
            Backend::S3 => "s3",
            Backend::Memory => "memory",
            Backend::None => "none",
        }
    }
}

impl FromStr for Backend {
    type Err = String;

    /// The names of cluster.md §7.5 with their aliases, in any case.
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "local" => Ok(Backend::Local),
            "s3" => Ok(Backend::S3),
            "memory" | "mem" | "inmem" => Ok(Backend::Memory),
            "none" | "disabled" | "off" => Ok(Backend::None),
            other => Err(format!(
                "unknown cold backend {other:?} (expected local, s3, memory or none)"
            )),
        }
    }
}

impl<'de> Deserialize<'de> for Backend {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Server-side encryption of the `s3` backend's objects.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Encryption {
    /// SSE-S3 (`AES256`).
    #[default]
    Aes256,
    /// SSE-KMS (`aws:kms`), with `kms_key_id` when set.
    AwsKms,
    /// No encryption header (S3-compatible stores without KMS).
    None,
}

impl Encryption {
    /// The name the configuration uses.
    pub fn name(self) -> &'static str {
        match self {
            Encryption::Aes256 => "aes256",
            Encryption::AwsKms => "aws-kms",
            Encryption::None => "none",
        }
    }
}

impl<'de> Deserialize<'de> for Encryption {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match String::deserialize(d)?.trim().to_ascii_lowercase().as_str() {
            "aes256" => Ok(Encryption::Aes256),
            "aws-kms" => Ok(Encryption::AwsKms),
            "none" => Ok(Encryption::None),
            other => Err(serde::de::Error::custom(format!(
                "unknown server_side_encryption {other:?} (expected aes256, aws-kms or none)"
            ))),
        }
    }
}

/// Hot bytes a group holds before it flushes, with an unshared `local` backend and no
/// `flush_min_hot_size` set ([`ColdConfig::resolve_defaults`]).
pub const LOCAL_FLUSH_MIN_HOT_SIZE: u64 = 1 << 20;
/// Hot bytes a node may hold when `max_hot_size_per_group` is unset, shared by its groups.
pub const NODE_HOT_SIZE: u64 = 256 << 20;
/// The smallest default `max_hot_size_per_group`.
pub const MIN_HOT_SIZE_PER_GROUP: u64 = 64 << 20;

/// `[storage.cold]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ColdConfig {
    /// Backend. Default: `local` on a node without peers (OQ-107); required with peers.
    pub backend: Option<Backend>,
    /// Key prefix of every object (date-stamp it for test runs). Default: none.
    pub root: Option<String>,
    pub local: LocalConfig,
    pub s3: S3Config,
    /// Flush tick (non-zero). Default: `1s`.
    #[serde(deserialize_with = "duration")]
    pub flush_interval: Duration,
    /// Target bytes per group per flush. Default: `8MiB`.
    #[serde(deserialize_with = "size")]
    pub flush_size: u64,
    /// A group flushes once it holds this many hot bytes. Default: [`LOCAL_FLUSH_MIN_HOT_SIZE`]
    /// (at most `flush_size`) with an unshared `local` backend, else = `flush_size`
    /// ([`ColdConfig::resolve_defaults`]).
    #[serde(deserialize_with = "opt_size")]
    pub flush_min_hot_size: Option<u64>,
    /// Largest flush object. Default: = `flush_size`.
    #[serde(deserialize_with = "opt_size")]
    pub flush_max_size: Option<u64>,
    /// Smallest hot run of a stream that a flush takes while the group holds
    /// `flush_min_hot_size` in such runs (smaller tails wait, so that objects are not made
    /// of tiny slices). Default: `flush_min_hot_size / 16`, at most `64KiB`.
    #[serde(deserialize_with = "opt_size")]
    pub flush_min_run: Option<u64>,
    /// Hot bytes at which a group flushes any stream, however small its run. Default: a
    /// quarter of `max_hot_size_per_group` (of `64MiB` when that is `0`), within
    /// `flush_min_hot_size` ..= 16 × `flush_min_hot_size`.
    #[serde(deserialize_with = "opt_size")]
    pub flush_any_hot_size: Option<u64>,
    /// When the hot bytes of every group this node leads add up to more than this, groups
    /// below `flush_min_hot_size` flush too, largest first (`0` disables). Default: `128MiB`.
    #[serde(deserialize_with = "size")]
    pub flush_pressure_hot_size: u64,
    /// Flush uploads running at once (non-zero). Default: 4.
    pub flush_max_concurrency: usize,
    /// A write that would take its group's hot bytes past this answers
    /// `503 COLD_BACKPRESSURE` (`0` disables). Default: 256 MiB shared by the node's groups,
    /// at least `64MiB` each (so `64MiB` with four groups, `256MiB` with one); see
    /// [`Self::resolve_defaults`].
    #[serde(deserialize_with = "opt_size")]
    pub max_hot_size_per_group: Option<u64>,
    /// GC tick (non-zero). Default: `5s`.
    #[serde(deserialize_with = "duration")]
    pub gc_interval: Duration,
    /// Objects deleted per group per GC pass. Default: 256.
    pub gc_max_entries: usize,
    /// Age after which the orphan sweep reclaims a staged snapshot part no commit used, and
    /// a snapshot object nothing references (snapshot-parts.md §9). Default: `1d`.
    #[serde(deserialize_with = "duration")]
    pub snapshot_part_grace: Duration,
    /// Orphan-sweep tick (non-zero). Default: `1h`.
    #[serde(deserialize_with = "duration")]
    pub snapshot_part_sweep_interval: Duration,
    /// `[storage.cold.cache]`: a bounded cache of cold blocks with read-ahead. Default: no
    /// cache (present without keys: the defaults of [`CacheConfig`]).
    pub cache: Option<CacheConfig>,
    /// Background compaction of small cold chunks (cluster.md §6.2). Off by default; this
    /// release does not compact, so `true` is refused at start-up.
    pub compaction_enabled: bool,
    /// Compaction tick (non-zero). Default: `30s`.
    #[serde(deserialize_with = "duration")]
    pub compaction_interval: Duration,
    /// Preferred compacted object size (at most `compaction_max_size`). Default: `8MiB`.
    #[serde(deserialize_with = "size")]
    pub compaction_target_size: u64,
    /// Largest compacted object. Default: `16MiB`.
    #[serde(deserialize_with = "size")]
    pub compaction_max_size: u64,
    /// Streams compacted per pass. Default: 16.
    pub compaction_max_streams_per_pass: usize,
    /// Delay before compacted inputs are deleted (non-zero). Default: `300s`.
    #[serde(deserialize_with = "duration")]
    pub compaction_gc_grace: Duration,
}

/// `[storage.cold.cache]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CacheConfig {
    /// Bytes of verified cold blocks kept in memory. Default: `256MiB`.
    #[serde(deserialize_with = "size")]
    pub max_size: u64,
    /// Cache block (rounded up to a multiple of 64 KiB). Default: `1MiB`.
    #[serde(deserialize_with = "size")]
    pub block_size: u64,
    /// Blocks read on a miss, the missing one included. Default: 4.
    pub readahead_blocks: u64,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            max_size: 256 << 20,
            block_size: 1 << 20,
            readahead_blocks: 4,
        }
    }
}

impl Default for ColdConfig {
    fn default() -> Self {
        ColdConfig {
            backend: None,
            root: None,
            local: LocalConfig::default(),
            s3: S3Config::default(),
            flush_interval: Duration::from_secs(1),
            flush_size: 8 << 20,
            flush_min_hot_size: None,
            flush_max_size: None,
            flush_min_run: None,
            flush_any_hot_size: None,
            flush_pressure_hot_size: 128 << 20,
            flush_max_concurrency: 4,
            max_hot_size_per_group: None,
            gc_interval: Duration::from_secs(5),
            gc_max_entries: 256,
            cache: None,
            compaction_enabled: false,
            compaction_interval: Duration::from_secs(30),
            compaction_target_size: 8 << 20,
            compaction_max_size: 16 << 20,
            compaction_max_streams_per_pass: 16,
            compaction_gc_grace: Duration::from_secs(300),
            snapshot_part_grace: Duration::from_secs(86_400),
            snapshot_part_sweep_interval: Duration::from_secs(3_600),
        }
    }
}

/// `[storage.cold.local]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LocalConfig {
    /// Directory of the objects. Default: `{data_dir}/cold`.
    pub path: Option<PathBuf>,
    /// Whether every node shares the path (required for `local` with peers). Default: false.
    pub shared: bool,
}

/// `[storage.cold.s3]`. Its `Debug` output hides the secret key and the session token.
#[derive(Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct S3Config {
    /// Bucket. Required for `s3`.
    pub bucket: Option<String>,
    /// Region. Default: `AWS_REGION` / `AWS_DEFAULT_REGION`, else `us-east-1`.
    pub region: Option<String>,
    /// Endpoint of an S3-compatible store, e.g. `http://127.0.0.1:9000`. Default: AWS.
    pub endpoint: Option<String>,
    /// Path-style requests (`{endpoint}/{bucket}/{key}`) rather than virtual-hosted ones
    /// (`{bucket}.{endpoint}/{key}`). Default: true.
    pub path_style: bool,
    /// Static credentials; absent = the standard chain (`AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, web identity, container and instance
    /// credentials). Default: unset.
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub session_token: Option<String>,
    /// Server-side encryption: `aes256`, `aws-kms` or `none`. Default: `aes256`.
    pub server_side_encryption: Encryption,
    /// Customer managed KMS key (only with `aws-kms`). Default: unset.
    pub kms_key_id: Option<String>,
    /// Per-operation timeout. Default: `10s`.
    #[serde(deserialize_with = "duration")]
    pub timeout: Duration,
    /// Retries per operation. Default: 3.
    pub max_retries: usize,
    /// Health-probe timeout. Default: `2s`.
    #[serde(deserialize_with = "duration")]
    pub probe_timeout: Duration,
}

impl S3Config {
    /// The region requests go to: `region`, else `AWS_REGION`, else `AWS_DEFAULT_REGION`,
    /// else `us-east-1`.
    pub fn effective_region(&self) -> String {
        self.region
            .clone()
            .or_else(|| std::env::var("AWS_REGION").ok())
            .or_else(|| std::env::var("AWS_DEFAULT_REGION").ok())
            .unwrap_or_else(|| "us-east-1".to_owned())
    }
}

impl std::fmt::Debug for S3Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hidden = |v: &Option<String>| v.as_ref().map(|_| "<hidden>");
        f.debug_struct("S3Config")
            .field("bucket", &self.bucket)
            .field("region", &self.region)
            .field("endpoint", &self.endpoint)
            .field("path_style", &self.path_style)
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &hidden(&self.secret_access_key))
            .field("session_token", &hidden(&self.session_token))
            .field("server_side_encryption", &self.server_side_encryption)
            .field("kms_key_id", &self.kms_key_id)
            .field("timeout", &self.timeout)
            .field("max_retries", &self.max_retries)
            .field("probe_timeout", &self.probe_timeout)
            .finish()
    }
}

impl Default for S3Config {
    fn default() -> Self {
        S3Config {
            bucket: None,
            region: None,
            endpoint: None,
            path_style: true,
            access_key_id: None,
            secret_access_key: None,
            session_token: None,
            server_side_encryption: Encryption::Aes256,
            kms_key_id: None,
            timeout: Duration::from_secs(10),
            max_retries: 3,
            probe_timeout: Duration::from_secs(2),
        }
    }
}

/// Parses `250ms`, `10s`, `5m`, `1h`, `1d` (or a bare number of seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| format!("invalid duration {s:?}"))?;
    let ms = match unit.trim() {
        "ms" => Some(n),
        "" | "s" => n.checked_mul(1_000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        "d" => n.checked_mul(86_400_000),
        _ => return Err(format!("invalid duration unit in {s:?} (ms, s, m, h, d)")),
    };
    ms.map(Duration::from_millis)
        .ok_or_else(|| format!("duration {s:?} is too large"))
}

/// Parses `512`, `64KiB`, `8MiB`, `1GiB` (also `KB`/`MB`/`GB` as powers of 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| format!("invalid size {s:?}"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "kib" | "kb" | "k" => 10,
        "mib" | "mb" | "m" => 20,
        "gib" | "gb" | "g" => 30,
        _ => return Err(format!("invalid size unit in {s:?} (B, KiB, MiB, GiB)")),
    };
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

/// A size given as a number of bytes or as a string with a unit.
#[derive(Deserialize)]
#[serde(untagged)]
enum SizeValue {
    Bytes(u64),
    Text(String),
}

fn size<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    match SizeValue::deserialize(d)? {
        SizeValue::Bytes(n) => Ok(n),
        SizeValue::Text(s) => parse_size(&s).map_err(serde::de::Error::custom),
    }
}

fn opt_size<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    size(d).map(Some)
}

fn duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    parse_duration(&s).map_err(serde::de::Error::custom)
}

/// Why the cold store could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ColdConfigError {
    #[error(
        "storage.cold.backend is required on a node with peers (s3, or local with a shared path)"
    )]
    BackendRequired,
    #[error("storage.cold.backend = \"s3\" needs storage.cold.s3.bucket (or --cold-s3-bucket)")]
    MissingBucket,
    #[error(
        "storage.cold.backend = \"local\" with peers needs a path every node shares (storage.cold.local.shared = true)"
    )]
    LocalNotShared,
    #[error(
        "storage.cold.backend = \"memory\" cannot be used with peers: other nodes cannot read it"
    )]
    MemoryWithPeers,
    #[error("storage.cold.s3.access_key_id and secret_access_key must be given together")]
    PartialCredentials,
    #[error("storage.cold.s3.kms_key_id needs server_side_encryption = \"aws-kms\"")]
    KmsKeyWithoutKms,
    #[error(
        "storage.cold.flush_interval, gc_interval and snapshot_part_sweep_interval must be non-zero"
    )]
    ZeroInterval,
    #[error("storage.cold.flush_size (or flush_max_size) and gc_max_entries must be non-zero")]
    ZeroFlushSize,
    #[error(
        "storage.cold.flush_min_hot_size (or flush_size) and flush_any_hot_size must not exceed \
         max_hot_size_per_group"
    )]
    FlushAboveHotBound,
    #[error("storage.cold.flush_max_concurrency must be non-zero")]
    ZeroFlushConcurrency,
    #[error(
        "storage.cold.compaction_interval, compaction_gc_grace, compaction_max_size and \
         compaction_max_streams_per_pass must be non-zero, and compaction_target_size must not \
         exceed compaction_max_size"
    )]
    Compaction,
    #[error(
        "storage.cold.compaction_enabled = true is not supported by this release (cold chunks \
         are not compacted); remove it or set it to false"
    )]
    CompactionUnsupported,
    #[error("invalid storage.cold.root: {0}")]
    InvalidRoot(ColdError),
    #[error("cannot create the cold directory {path}: {source}")]
    LocalDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot set up the {backend} cold store: {source}")]
    Build {
        backend: &'static str,
        #[source]
        source: object_store::Error,
    },
}

impl ColdConfig {
    /// Fills in the defaults that depend on the backend in force; call once every source of
    /// settings has been read.
    ///
    /// With an unshared `local` backend a group flushes once it holds
    /// [`LOCAL_FLUSH_MIN_HOT_SIZE`] rather than `flush_size`: a local flush is a file write and
    /// a sync on the node's own disk, and flushed bytes are read back from the page cache by
    /// `sendfile`, at about 40 % of the CPU of sending them from the hot ring
    /// (docs/benchmarks.md, session 19). Object stores keep `flush_size` (every flush is a
    /// paid request), and so does a shared directory (read through the store, not mapped).
    pub fn resolve_defaults(&mut self, has_peers: bool, group_count: u32) {
        let mapped = !self.local.shared && matches!(self.backend(has_peers), Ok(Backend::Local));
        if self.flush_min_hot_size.is_none() && mapped {
            self.flush_min_hot_size = Some(LOCAL_FLUSH_MIN_HOT_SIZE.min(self.flush_size));
        }
        // The hot bytes a node may hold are what is bounded: a node with one group gets what
        // four groups had together (a single node's default is one group).
        if self.max_hot_size_per_group.is_none() {
            let share = NODE_HOT_SIZE / u64::from(group_count.max(1));
            self.max_hot_size_per_group = Some(share.max(MIN_HOT_SIZE_PER_GROUP));
        }
    }

    /// `max_hot_size_per_group` in force (`0`: no cap); `64MiB` before
    /// [`Self::resolve_defaults`] when unset.
    pub fn max_hot_size_per_group(&self) -> u64 {
        self.max_hot_size_per_group
            .unwrap_or(MIN_HOT_SIZE_PER_GROUP)
    }

    /// The backend in force: the configured one, else `local` without peers.
    pub fn backend(&self, has_peers: bool) -> Result<Backend, ColdConfigError> {
        let backend = match (self.backend, has_peers) {
            (Some(b), _) => b,
            (None, false) => Backend::Local,
            (None, true) => return Err(ColdConfigError::BackendRequired),
        };
        match backend {
            Backend::Local if has_peers && !self.local.shared => {
                Err(ColdConfigError::LocalNotShared)
            }
            Backend::Memory if has_peers => Err(ColdConfigError::MemoryWithPeers),
            Backend::S3
                if self
                    .s3
                    .bucket
                    .as_deref()
                    .is_none_or(|b| b.trim().is_empty()) =>
            {
                Err(ColdConfigError::MissingBucket)
            }
            Backend::S3
                if self.s3.access_key_id.is_some() != self.s3.secret_access_key.is_some() =>
            {
                Err(ColdConfigError::PartialCredentials)
            }
            Backend::S3
                if self.s3.kms_key_id.is_some()
                    && self.s3.server_side_encryption != Encryption::AwsKms =>
            {
                Err(ColdConfigError::KmsKeyWithoutKms)
            }
            b => Ok(b),
        }
    }

    /// Where the `local` backend keeps its objects.
    pub fn local_path(&self, data_dir: &Path) -> PathBuf {
        self.local
            .path
            .clone()
            .unwrap_or_else(|| data_dir.join("cold"))
    }

    /// Checks the combination without touching disk or network.
    pub fn validate(&self, has_peers: bool) -> Result<(), ColdConfigError> {
        self.backend(has_peers)?;
        ObjectColdStore::new(
            Arc::new(object_store::memory::InMemory::new()),
            self.root.as_deref(),
            "check",
        )
        .map_err(ColdConfigError::InvalidRoot)?;
        if self.flush_interval.is_zero()
            || self.gc_interval.is_zero()
            || self.snapshot_part_sweep_interval.is_zero()
        {
            return Err(ColdConfigError::ZeroInterval);
        }
        if self.flush_max_size() == 0 || self.gc_max_entries == 0 {
            return Err(ColdConfigError::ZeroFlushSize);
        }
        if self.flush_max_concurrency == 0 {
            return Err(ColdConfigError::ZeroFlushConcurrency);
        }
        if self.compaction_interval.is_zero()
            || self.compaction_gc_grace.is_zero()
            || self.compaction_max_size == 0
            || self.compaction_target_size > self.compaction_max_size
            || self.compaction_max_streams_per_pass == 0
        {
            return Err(ColdConfigError::Compaction);
        }
        if self.compaction_enabled {
            return Err(ColdConfigError::CompactionUnsupported);
        }
        let cap = self.max_hot_size_per_group();
        if cap > 0 && self.flush_min_hot_size().max(self.flush_any_hot_size()) > cap {
            // The group would refuse writes before it ever reached the flush threshold.
            return Err(ColdConfigError::FlushAboveHotBound);
        }
        Ok(())
    }

    /// `flush_min_hot_size`, defaulting to `flush_size`.
    pub fn flush_min_hot_size(&self) -> u64 {
        self.flush_min_hot_size.unwrap_or(self.flush_size)
    }

    /// `flush_min_run`, defaulting to `flush_min_hot_size / 16`, at most 64 KiB.
    pub fn flush_min_run(&self) -> u64 {
        self.flush_min_run
            .unwrap_or((self.flush_min_hot_size() / 16).clamp(1, 64 << 10))
    }

    /// `flush_any_hot_size`, defaulting to a quarter of the per-group cap, within
    /// `flush_min_hot_size` ..= 16 × `flush_min_hot_size`.
    pub fn flush_any_hot_size(&self) -> u64 {
        let min = self.flush_min_hot_size();
        let cap = match self.max_hot_size_per_group() {
            0 => 64 << 20,
            cap => cap,
        };
        self.flush_any_hot_size
            .unwrap_or((cap / 4).clamp(min, min.saturating_mul(16)))
    }

    /// `flush_max_size`, defaulting to `flush_size`.
    pub fn flush_max_size(&self) -> u64 {
        self.flush_max_size.unwrap_or(self.flush_size)
    }

    /// Builds the store (creating the local directory); `None` for `none`.
    pub fn open(
        &self,
        data_dir: &Path,
        has_peers: bool,
    ) -> Result<Option<Arc<dyn ColdStore>>, ColdConfigError> {
        let backend = self.backend(has_peers)?;
        let store: Arc<dyn object_store::ObjectStore> = match backend {
            Backend::None => return Ok(None),
            Backend::Memory => Arc::new(object_store::memory::InMemory::new()),
            Backend::Local => {
                let path = self.local_path(data_dir);
                std::fs::create_dir_all(&path).map_err(|source| ColdConfigError::LocalDir {
                    path: path.clone(),
                    source,
                })?;
                let fs = object_store::local::LocalFileSystem::new_with_prefix(&path).map_err(
                    |source| ColdConfigError::Build {
                        backend: "local",
                        source,
                    },
                )?;
                // Staging files of uploads a crash interrupted, swept now and then hourly,
                // off the start-up path (the directory may be big). An upload in flight is
                // seconds old at most; a shared directory's other nodes get an hour.
                let grace = Duration::from_secs(if self.local.shared { 3_600 } else { 60 });
                let dir = path.clone();
                let _ = std::thread::Builder::new()
                    .name("cold-staging-sweep".into())
                    .spawn(move || {
                        loop {
                            let n = super::staging::sweep(&dir, grace);
                            if n > 0 {
                                tracing::info!(removed = n, dir = %dir.display(),
                                    "deleted staging files of interrupted cold uploads");
                            }
                            std::thread::sleep(Duration::from_secs(3_600));
                        }
                    });
                // An object must be on stable storage before the flush that references it is
                // proposed (its hot bytes are then released): sync the file and its directory.
                let fs = Arc::new(fs.with_fsync(true));
                // A shared directory (NFS, say) is another node's to delete from: its files
                // are read through the store, never mapped (a mapping of a file truncated
                // elsewhere faults).
                let store = if self.local.shared {
                    ObjectColdStore::local_shared(fs, self.root.as_deref(), Pace::BACKGROUND)
                } else {
                    ObjectColdStore::local(fs, self.root.as_deref(), Pace::BACKGROUND)
                };
                let store = store.map_err(ColdConfigError::InvalidRoot)?;
                return Ok(Some(Arc::new(store)));
            }
            Backend::S3 => Arc::new(self.s3.build().map_err(|source| ColdConfigError::Build {
                backend: "s3",
                source,
            })?),
        };
        let store = ObjectColdStore::new(store, self.root.as_deref(), backend.name())
            .map_err(ColdConfigError::InvalidRoot)?;
        Ok(Some(Arc::new(store)))
    }
}

impl S3Config {
    fn build(&self) -> Result<object_store::aws::AmazonS3, object_store::Error> {
        use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
        // The key type of this setting is not exported; its name parses to it.
        let sse: AmazonS3ConfigKey = "aws_server_side_encryption".parse()?;
        // The standard chain: AWS_* variables first, then what this file sets.
        let mut b = AmazonS3Builder::from_env()
            .with_bucket_name(self.bucket.clone().unwrap_or_default())
            .with_virtual_hosted_style_request(!self.path_style)
            .with_retry(object_store::RetryConfig {
                max_retries: self.max_retries,
                retry_timeout: self.timeout.saturating_mul(self.max_retries as u32 + 1),
                ..Default::default()
            })
            .with_client_options(object_store::ClientOptions::new().with_timeout(self.timeout));
        b = b.with_region(self.effective_region());
        if let Some(ep) = &self.endpoint {
            b = b
                .with_endpoint(ep.trim_end_matches('/'))
                .with_allow_http(ep.starts_with("http://"));
        }
        match (self.server_side_encryption, &self.kms_key_id) {
            (Encryption::Aes256, _) => {
                b = b.with_config(sse, "AES256");
            }
            (Encryption::AwsKms, Some(key)) => b = b.with_sse_kms_encryption(key),
            (Encryption::AwsKms, None) => {
                b = b.with_config(sse, "aws:kms");
            }
            (Encryption::None, _) => {}
        }
        if let (Some(id), Some(secret)) = (&self.access_key_id, &self.secret_access_key) {
            b = b.with_access_key_id(id).with_secret_access_key(secret);
            if let Some(token) = &self.session_token {
                b = b.with_token(token);
            }
        }
        b.build()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
#[path = "config_tests.rs"]
mod tests;
