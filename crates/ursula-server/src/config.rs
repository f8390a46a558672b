//! Configuration: a TOML file, overridden by environment variables, overridden by flags.

use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;

/// `send_buffer_bytes` by default: small enough that a large answer's bytes pass through the
/// socket while they are still in the CPU's cache (on loopback, 12-15 % less CPU per MiB read
/// than the kernel's autotuning, which grows the buffer to megabytes; docs/benchmarks.md),
/// large enough for 50 MB/s per connection at 10 ms of round trip.
pub const DEFAULT_SEND_BUFFER_BYTES: u64 = 256 << 10;
/// The smallest `send_buffer_bytes` accepted (other than 0).
const MIN_SEND_BUFFER_BYTES: u64 = 128 << 10;
/// Groups of a new cluster's data directory when `group_count` is unset: enough to spread a
/// 3-node cluster's leaderships over its nodes. A node without peers gets one group: every
/// group shares the node's one WAL, so more groups only split each sync's batch into more
/// Raft entries (docs/configuration.md).
const CLUSTER_GROUP_COUNT: u32 = 4;

/// Every setting of a node, with its default.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Client listener. Default: 127.0.0.1:4437.
    pub listen: SocketAddr,
    /// Admin-plane listener (purge, metrics); off unless set. Suggested: 127.0.0.1:4438.
    pub admin_listen: Option<SocketAddr>,
    /// Data directory (WAL, snapshots). Default: ./ursula-data.
    pub data_dir: PathBuf,
    /// Number of Raft groups streams are spread over, fixed for a data directory. Unset: the
    /// count the data directory was created with, else 1 on a node without peers and 4 in a
    /// cluster ([`Self::resolve_defaults`]; docs/configuration.md says why).
    pub group_count: Option<u32>,
    /// Long-poll wait when the request has no `timeout_ms`. Default: 1000 ms.
    pub long_poll_timeout_ms: u64,
    /// Largest request body. Default: 33554432 (32 MiB).
    pub max_request_bytes: u64,
    /// Request body bytes the HTTP layer holds at once (all requests together); a body that
    /// does not fit answers `503 INGRESS_BODY_BYTES_LIMIT_REACHED` (a single body larger
    /// than the budget is let through alone). `0` = unlimited. Default: 268435456 (256 MiB).
    pub http_inflight_body_size: u64,
    /// Largest catch-up response body. Default: 33554432 (32 MiB).
    pub max_read_bytes: u64,
    /// Live readers (long-polls + SSE responses) a node holds before answering
    /// `503 LIVE_READ_BACKPRESSURE`; 0 = unlimited. Default: 65536.
    pub live_read_max_waiters: u64,
    /// SSE data batch size when the request has no `max_bytes`. Default: 1048576.
    pub sse_batch_bytes: u64,
    /// Each connection's kernel send buffer (`SO_SNDBUF`; the kernel doubles it and caps it at
    /// `net.core.wmem_max`), or 0 for the kernel's autotuning. Default: 262144 (256 KiB);
    /// 131072..=1073741824 when set: at 32 KiB (a 64 KiB buffer, one loopback segment) a large
    /// answer crawled one delayed ACK at a time, and the floor keeps a margin above that.
    pub send_buffer_bytes: u64,
    /// The TCP congestion control of client connections (`TCP_CONGESTION`), or "" for the
    /// system's (`net.ipv4.tcp_congestion_control`). Default: "cubic" (why:
    /// `ursula_http::congestion`).
    pub tcp_congestion: String,
    /// Answer plain writes on the server's own HTTP/1 loop (`h1`), hyper the rest; `false`
    /// gives every request to hyper. Default: true.
    pub http1_own_path: bool,
    /// Time allowed for a request head to arrive. Default: 10000 ms.
    pub header_timeout_ms: u64,
    /// Time allowed for a request body to arrive. Default: 30000 ms.
    pub body_timeout_ms: u64,
    /// A write not committed within this time (its batch is held by a full or stalled disk)
    /// answers `503 WRITE_OUTCOME_UNKNOWN` instead of waiting on: it may still land.
    /// Default: 30000 ms.
    pub write_stall_timeout_ms: u64,
    /// Raft log entries between state-machine snapshots. Default: 20000.
    pub snapshot_logs: u64,
    /// Microseconds a one-voter group's next batch may wait for the writers its previous
    /// batch answered, so that one WAL sync carries them all (0: never; at most 10000).
    /// Default: 250.
    pub commit_linger_us: u64,
    /// Origins allowed by CORS (`*` for any; empty disables CORS). Default: ["*"].
    pub cors_allowed_origins: Vec<String>,
    /// Public base URL used in `Location` headers. Default: from the Host header.
    pub public_url: Option<String>,
    /// Without `public_url`, take the public base URL from `Forwarded` (else
    /// `X-Forwarded-Proto` / `X-Forwarded-Host`), for a node behind a trusted proxy
    /// (protocol.md §2.7). Default: false.
    pub trust_forwarded_headers: bool,
    /// Host names this node answers for (the `Host` header without its port, compared
    /// case-insensitively); other hosts get `400 MALFORMED_REQUEST`. Empty: any valid host.
    /// Default: [].
    pub allowed_hosts: Vec<String>,
    /// fsync the log (never disable outside tests). Default: true.
    pub fsync: bool,
    /// `[storage]`: the cold tier (`[storage.cold]`, docs/configuration.md).
    pub storage: StorageConfig,
    /// `[runtime]`.
    pub runtime: RuntimeConfig,
    /// `[server]` (spec cluster.md §7.2): `listen` and `admin_listen` override the top-level
    /// keys of the same name; `cluster_id` names the cluster.
    pub server: ServerSection,
    /// `[raft]` (spec cluster.md §5.1, §7.4): node identity and static membership.
    pub raft: RaftSection,
    /// `[governance]` (spec cluster.md §5.4, §7.7): the leadership balancer.
    pub governance: crate::governance::GovernanceConfig,
}

/// `[server]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSection {
    pub listen: Option<SocketAddr>,
    pub admin_listen: Option<SocketAddr>,
    /// A listener of its own for the Raft RPCs (which then leave `listen`). It serves the
    /// client routes too: peer URLs point at it, and clients are redirected to peer URLs.
    /// Default: unset (the RPCs share `listen`).
    pub cluster_listen: Option<SocketAddr>,
    /// Recorded in the data directory on first start; a node whose data directory belongs to
    /// another cluster refuses to start. Default: unset (nothing checked).
    pub cluster_id: Option<String>,
}

/// `[raft]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RaftSection {
    /// This node's id (non-zero, one of `peers`); `--node-id` overrides. Default: 1 without
    /// peers, required with peers.
    pub node_id: Option<u64>,
    /// Overrides the top-level `group_count`.
    pub group_count: Option<u32>,
    /// Bootstrap every group's voter set: first start of a fresh cluster only.
    pub init_membership_per_group: bool,
    /// Alias of `init_membership_per_group`.
    pub init_membership: bool,
    /// `[[raft.peers]]`: every voter, this node included. Empty: a one-node cluster.
    pub peers: Vec<PeerConfig>,
    /// How often a leader heartbeats each peer; openraft also gives up on an append-entries
    /// RPC after this long, so it bounds a follower's WAL write + fsync. Default: 100 ms.
    #[serde(deserialize_with = "opt_duration")]
    pub heartbeat_interval: Option<std::time::Duration>,
    /// A follower campaigns after its leader lease (`election_timeout_max`) plus a random
    /// timeout in `election_timeout_min..election_timeout_max` without hearing from its
    /// leader. Defaults: 200 ms and 350 ms.
    #[serde(deserialize_with = "opt_duration")]
    pub election_timeout_min: Option<std::time::Duration>,
    #[serde(deserialize_with = "opt_duration")]
    pub election_timeout_max: Option<std::time::Duration>,
    /// Carry the small RPCs of many groups to a peer in one request (`ursula_raft::coalesce`).
    /// Default: on; off sends every RPC on its own (for comparison and debugging).
    pub rpc_batching: Option<bool>,
    /// Payload bytes a group may hold proposed and not yet answered before writes answer
    /// `503 RAFT_UNCOMMITTED_BACKPRESSURE` (cluster.md §6.6, `uncommitted.rs`). Default:
    /// unset (no bound).
    #[serde(deserialize_with = "opt_size")]
    pub max_uncommitted_size_per_group: Option<u64>,
    /// `[raft.wal]`.
    pub wal: WalSection,
}

/// `[raft.wal]` (spec cluster.md §2.4).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WalSection {
    /// `disk` (the only log engine: every node's log is durable). `memory` is refused.
    pub backend: Option<String>,
    /// The node's state directory: when set, it is the data directory (the WAL, the group
    /// snapshots and the node identity live together under it); flags still win.
    pub path: Option<PathBuf>,
    /// Bytes per WAL segment, 1 MiB to 1 GiB. Default 64 MiB.
    #[serde(deserialize_with = "opt_size")]
    pub segment_size: Option<u64>,
}

/// The WAL's segment size when `[raft.wal] segment_size` is unset.
pub const WAL_SEGMENT_SIZE: u64 = 64 << 20;

impl WalSection {
    /// Bytes per WAL segment, the default filled in.
    pub fn segment_size(&self) -> u64 {
        self.segment_size.unwrap_or(WAL_SEGMENT_SIZE)
    }
}

fn opt_size<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    size(d).map(Some)
}

impl RaftSection {
    /// The election and heartbeat timing, defaults filled in.
    pub fn timing(&self) -> ursula_raft::RaftTiming {
        let d = ursula_raft::RaftTiming::default();
        let ms = |v: Option<std::time::Duration>, default: u64| {
            v.map_or(default, |d| d.as_millis() as u64)
        };
        ursula_raft::RaftTiming {
            heartbeat_ms: ms(self.heartbeat_interval, d.heartbeat_ms),
            election_min_ms: ms(self.election_timeout_min, d.election_min_ms),
            election_max_ms: ms(self.election_timeout_max, d.election_max_ms),
        }
    }
}

fn opt_duration<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<std::time::Duration>, D::Error> {
    let s = String::deserialize(d)?;
    ursula_storage::cold::config::parse_duration(&s)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

/// `[[raft.peers]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerConfig {
    pub node_id: u64,
    /// `http://host:port` of the peer's `listen` address: both the Raft transport's target
    /// and the client-facing redirect target.
    pub url: String,
}

/// `[runtime]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RuntimeConfig {
    /// With a cold backend, append and create bodies of at least this many bytes (after JSON
    /// normalization) are written to the cold store before they are proposed (cluster.md
    /// §6.4). Default: 1 MiB.
    #[serde(deserialize_with = "size")]
    pub external_payload_min_size: u64,
    /// Worker threads of the node's async runtime. Default: unset, one per available core.
    pub core_count: Option<usize>,
    /// The process aborts once its resident memory is above this (sampled every 500 ms;
    /// cluster.md §6.6), a last resort before the kernel's out-of-memory killer. Default:
    /// unset (no cap).
    #[serde(deserialize_with = "opt_size")]
    pub node_memory_abort_cap_size: Option<u64>,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            external_payload_min_size: 1 << 20,
            core_count: None,
            node_memory_abort_cap_size: None,
        }
    }
}

/// A size: a number of bytes, or text with a unit (`512KiB`, `1MiB`).
fn size<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Size {
        Bytes(u64),
        Text(String),
    }
    match Size::deserialize(d)? {
        Size::Bytes(n) => Ok(n),
        Size::Text(s) => {
            ursula_storage::cold::config::parse_size(&s).map_err(serde::de::Error::custom)
        }
    }
}

/// `[storage]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorageConfig {
    /// `[storage.cold]`. Default: the `local` backend in `{data_dir}/cold` (a node without peers).
    pub cold: ursula_storage::cold::ColdConfig,
}

impl Config {
    /// Whether this node runs with other voters.
    pub fn has_peers(&self) -> bool {
        self.raft.peers.len() > 1
    }

    /// This node's id (validated: non-zero).
    pub fn node_id(&self) -> u64 {
        self.raft.node_id.unwrap_or(1)
    }

    /// Bootstrap fresh groups on this start.
    pub fn init_membership(&self) -> bool {
        self.raft.init_membership_per_group || self.raft.init_membership
    }

    /// Peer id -> URL (without a trailing `/`).
    pub fn peer_urls(&self) -> std::collections::BTreeMap<u64, String> {
        self.raft
            .peers
            .iter()
            .map(|p| (p.node_id, p.url.trim_end_matches('/').to_owned()))
            .collect()
    }

    /// Defaults that depend on other settings, filled in once every source (file, flags,
    /// environment) has been read: the group count (the data directory's, else by whether
    /// the node has peers), then the cold tier's flush threshold and hot cap, which depend on
    /// the backend in force and the group count
    /// ([`ursula_storage::cold::ColdConfig::resolve_defaults`]).
    pub fn resolve_defaults(&mut self) {
        let has_peers = self.has_peers();
        if self.group_count.is_none() {
            let recorded = ursula_raft::recorded_group_count(&self.data_dir);
            self.group_count =
                Some(recorded.unwrap_or(if has_peers { CLUSTER_GROUP_COUNT } else { 1 }));
        }
        let groups = self.group_count();
        self.storage.cold.resolve_defaults(has_peers, groups);
    }

    /// The group count in force (call after [`Self::resolve_defaults`]; before, an unset
    /// count reads as a cluster's default).
    pub fn group_count(&self) -> u32 {
        self.group_count.unwrap_or(CLUSTER_GROUP_COUNT)
    }

    /// Folds the `[server]` and `[raft]` keys that override top-level ones into them.
    pub fn resolve_sections(&mut self) {
        if let Some(l) = self.server.listen {
            self.listen = l;
        }
        if self.server.admin_listen.is_some() {
            self.admin_listen = self.server.admin_listen;
        }
        if self.raft.group_count.is_some() {
            self.group_count = self.raft.group_count;
        }
        if let Some(p) = &self.raft.wal.path {
            self.data_dir = p.clone();
        }
    }

    /// The membership checks of spec cluster.md §7.11.
    fn validate_raft(&self) -> anyhow::Result<()> {
        let r = &self.raft;
        anyhow::ensure!(r.node_id != Some(0), "raft.node_id must be non-zero");
        match r.wal.backend.as_deref() {
            None | Some("disk") => {}
            Some("memory") => anyhow::bail!(
                "raft.wal.backend = \"memory\" is not supported: the log is always on disk \
                 (for a throwaway test node, set fsync = false)"
            ),
            Some(other) => anyhow::bail!("raft.wal.backend must be \"disk\", got {other:?}"),
        }
        let seg = r.wal.segment_size();
        anyhow::ensure!(
            (1 << 20..=1 << 30).contains(&seg),
            "raft.wal.segment_size must be between 1 MiB and 1 GiB, got {seg} bytes"
        );
        anyhow::ensure!(
            self.runtime.core_count != Some(0),
            "runtime.core_count must be at least 1"
        );
        let t = r.timing();
        anyhow::ensure!(
            0 < t.heartbeat_ms
                && t.heartbeat_ms < t.election_min_ms
                && t.election_min_ms < t.election_max_ms,
            "raft timing needs 0 < heartbeat_interval < election_timeout_min < \
             election_timeout_max (got {} ms, {} ms, {} ms)",
            t.heartbeat_ms,
            t.election_min_ms,
            t.election_max_ms
        );
        if r.peers.is_empty() {
            return Ok(());
        }
        let id = r.node_id.ok_or_else(|| {
            anyhow::anyhow!("raft.node_id (or --node-id) is required with raft.peers")
        })?;
        let mut seen = std::collections::BTreeSet::new();
        for p in &r.peers {
            anyhow::ensure!(p.node_id != 0, "raft.peers: a node_id must be non-zero");
            anyhow::ensure!(
                seen.insert(p.node_id),
                "raft.peers: node_id {} appears twice",
                p.node_id
            );
            let authority = p
                .url
                .strip_prefix("http://")
                .map(|rest| rest.trim_end_matches('/'));
            anyhow::ensure!(
                authority
                    .is_some_and(|a| !a.contains('/') && crate::http::host::is_valid_authority(a)),
                "raft.peers: url of node {} must be http://host:port, got {:?}",
                p.node_id,
                p.url
            );
        }
        anyhow::ensure!(
            seen.contains(&id),
            "raft.node_id {id} is not one of raft.peers ({seen:?})"
        );
        Ok(())
    }

    /// The cold-health gate's hot-backlog marks against the flush settings (spec §7.11), when
    /// the gate runs (a node with peers): a high mark at or below the flush threshold would
    /// call every healthy group behind, one at or above the per-group cap could never be
    /// reached (writes are refused first), and a group must flush its tiny streams
    /// (`flush_any_hot_size`) below the high mark.
    fn validate_cold_watermarks(&self) -> anyhow::Result<()> {
        let h = &self.governance.cold_health;
        if !self.has_peers() || h.interval.is_zero() {
            return Ok(());
        }
        let c = &self.storage.cold;
        let (high, low) = h.marks(c.max_hot_size_per_group());
        anyhow::ensure!(
            low < high,
            "governance.cold_health.hot_size_low ({low}) must be below hot_size_high ({high})"
        );
        anyhow::ensure!(
            high > c.flush_min_hot_size(),
            "governance.cold_health.hot_size_high ({high}) must be above \
             storage.cold.flush_min_hot_size ({})",
            c.flush_min_hot_size()
        );
        // Unset, the size is derived at most at the low mark; set, it must stay below the high
        // one, or a group of tiny streams would hold a backlog without ever flushing.
        anyhow::ensure!(
            high > self.flush_any_hot_size(),
            "governance.cold_health.hot_size_high ({high}) must be above \
             storage.cold.flush_any_hot_size ({})",
            self.flush_any_hot_size()
        );
        anyhow::ensure!(
            c.max_hot_size_per_group() == 0 || high < c.max_hot_size_per_group(),
            "governance.cold_health.hot_size_high ({high}) must be below \
             storage.cold.max_hot_size_per_group ({})",
            c.max_hot_size_per_group()
        );
        Ok(())
    }

    /// `storage.cold.flush_any_hot_size`; when the cold-health gate runs and the size was not
    /// set, also at most its low mark (above `flush_min_hot_size`), so that a group of tiny
    /// streams flushes before the gate would call it behind.
    fn flush_any_hot_size(&self) -> u64 {
        let c = &self.storage.cold;
        let h = &self.governance.cold_health;
        if c.flush_any_hot_size.is_some() || !self.has_peers() || h.interval.is_zero() {
            return c.flush_any_hot_size();
        }
        let (_, low) = h.marks(c.max_hot_size_per_group());
        c.flush_any_hot_size().min(low.max(c.flush_min_hot_size()))
    }

    /// The cold tier's flush, GC and admission settings (`[storage.cold]`).
    pub fn tiering(&self) -> crate::tiering::TierConfig {
        let c = &self.storage.cold;
        crate::tiering::TierConfig {
            flush_interval: c.flush_interval,
            flush_min_hot_size: c.flush_min_hot_size(),
            flush_min_run: c.flush_min_run(),
            flush_any_hot_size: self.flush_any_hot_size(),
            flush_max_size: c.flush_max_size(),
            flush_pressure_hot_size: c.flush_pressure_hot_size,
            flush_max_concurrency: c.flush_max_concurrency,
            max_hot_size_per_group: c.max_hot_size_per_group(),
            gc_interval: c.gc_interval,
            gc_max_entries: c.gc_max_entries,
            cache: c.cache.clone(),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 4437)),
            admin_listen: None,
            data_dir: PathBuf::from("./ursula-data"),
            group_count: None,
            long_poll_timeout_ms: 1000,
            max_request_bytes: 32 * 1024 * 1024,
            max_read_bytes: 32 * 1024 * 1024,
            http_inflight_body_size: 256 * 1024 * 1024,
            live_read_max_waiters: 65_536,
            write_stall_timeout_ms: 30_000,
            sse_batch_bytes: 1024 * 1024,
            send_buffer_bytes: DEFAULT_SEND_BUFFER_BYTES,
            tcp_congestion: ursula_http::congestion::DEFAULT.to_owned(),
            http1_own_path: true,
            header_timeout_ms: 10_000,
            body_timeout_ms: 30_000,
            snapshot_logs: 20_000,
            commit_linger_us: ursula_raft::COMMIT_LINGER.as_micros() as u64,
            cors_allowed_origins: vec!["*".to_owned()],
            public_url: None,
            trust_forwarded_headers: false,
            allowed_hosts: Vec::new(),
            fsync: true,
            storage: StorageConfig::default(),
            runtime: RuntimeConfig::default(),
            server: ServerSection::default(),
            raft: RaftSection::default(),
            governance: Default::default(),
        }
    }
}

impl Config {
    /// Reads a TOML file.
    pub fn from_file(path: &std::path::Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read config {}: {e}", path.display()))?;
        toml::from_str(&text).map_err(|e| anyhow::anyhow!("invalid config {}: {e}", path.display()))
    }

    /// Rejects values the server cannot run with.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.group_count.is_none_or(|g| (1..=1024).contains(&g)),
            "group_count must be 1..=1024"
        );
        anyhow::ensure!(
            (1..=60_000).contains(&self.long_poll_timeout_ms),
            "long_poll_timeout_ms must be 1..=60000"
        );
        anyhow::ensure!(
            self.max_request_bytes >= 1,
            "max_request_bytes must be at least 1"
        );
        anyhow::ensure!(
            self.sse_batch_bytes >= 1,
            "sse_batch_bytes must be at least 1"
        );
        anyhow::ensure!(
            self.snapshot_logs >= 100,
            "snapshot_logs must be at least 100"
        );
        anyhow::ensure!(
            self.commit_linger_us <= 10_000,
            "commit_linger_us must be at most 10000 (10 ms), got {}",
            self.commit_linger_us
        );
        anyhow::ensure!(
            self.send_buffer_bytes == 0
                || (MIN_SEND_BUFFER_BYTES..=1 << 30).contains(&self.send_buffer_bytes),
            "send_buffer_bytes must be 0 (the kernel's autotuning) or 131072..=1073741824, \
             got {}",
            self.send_buffer_bytes
        );
        ursula_http::congestion::check_name(&self.tcp_congestion)
            .map_err(|e| anyhow::anyhow!("tcp_congestion: {e}"))?;
        if let Some(u) = &self.public_url {
            // Echoed into every create's Location: an http(s) URL with a checked authority.
            let authority = u
                .strip_prefix("https://")
                .or_else(|| u.strip_prefix("http://"))
                .map(|rest| rest.split('/').next().unwrap_or(""));
            anyhow::ensure!(
                authority.is_some_and(crate::http::host::is_valid_authority)
                    && u.bytes().all(|b| b.is_ascii_graphic()),
                "public_url must be http://host[:port][/path] or https://..., got {u:?}"
            );
        }
        self.validate_raft()?;
        // A multi-node cluster needs one cold store every node shares (spec cluster.md §1):
        // `s3`, or `local` with `shared = true`; without peers `local` is the default (OQ-107).
        self.storage.cold.validate(self.has_peers())?;
        anyhow::ensure!(
            !(self.has_peers()
                && self.storage.cold.backend == Some(ursula_storage::cold::Backend::None)),
            "storage.cold.backend = \"none\" is not allowed with raft.peers: a multi-node \
             cluster needs one cold store every node shares (s3, or local with \
             storage.cold.local.shared = true)"
        );
        self.validate_cold_watermarks()?;
        let budget = self.http_inflight_body_size;
        if budget > 0 {
            anyhow::ensure!(
                budget >= self.max_request_bytes,
                "http_inflight_body_size ({budget}) must be 0 (unlimited) or at least \
                 max_request_bytes ({}): a body at the limit could never be admitted",
                self.max_request_bytes
            );
            let cold = !matches!(
                self.storage.cold.backend(self.has_peers()),
                Ok(ursula_storage::cold::Backend::None)
            );
            anyhow::ensure!(
                !cold || budget >= 64 << 20,
                "http_inflight_body_size ({budget}) must be at least 64 MiB with a cold backend: \
                 a snapshot commit's copy needs its 32 MiB charge beside a full 32 MiB request"
            );
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "config_cluster_tests.rs"]
mod cluster_tests;
