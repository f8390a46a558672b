//! `ursula server`'s flags and environment variables, and how they override the TOML file
//! (docs/configuration.md: file, then `URSULA_*`, then flags).

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::config::{Config, PeerConfig};

/// `ID=URL`, as `--peer 2=http://10.0.0.2:4437`.
fn parse_peer(s: &str) -> Result<PeerConfig, String> {
    let (id, url) = s
        .trim()
        .split_once('=')
        .ok_or_else(|| format!("a peer is ID=URL, got {s:?}"))?;
    let node_id = id
        .trim()
        .parse()
        .map_err(|_| format!("a peer's id is a number, got {id:?}"))?;
    Ok(PeerConfig {
        node_id,
        url: url.trim().to_owned(),
    })
}

#[derive(clap::Args)]
pub struct ServerArgs {
    /// TOML configuration file; flags and environment variables override it.
    #[arg(long, env = "URSULA_CONFIG")]
    config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:4437].
    #[arg(long, env = "URSULA_LISTEN")]
    listen: Option<SocketAddr>,
    /// Admin-plane listener for operator endpoints (purge) [default: off; e.g. 127.0.0.1:4438].
    #[arg(long, env = "URSULA_ADMIN_LISTEN")]
    admin_listen: Option<SocketAddr>,
    /// A listener of its own for the Raft RPCs of a cluster (it serves client routes too; peer
    /// URLs point at it) [default: unset: the RPCs share --listen].
    #[arg(long, env = "URSULA_CLUSTER_LISTEN")]
    cluster_listen: Option<SocketAddr>,
    /// Data directory [default: ./ursula-data].
    #[arg(long, env = "URSULA_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Number of Raft groups streams are spread over [default: 4].
    #[arg(long, env = "URSULA_GROUP_COUNT")]
    group_count: Option<u32>,
    /// Default long-poll wait in milliseconds [default: 1000].
    #[arg(long, env = "URSULA_LONG_POLL_TIMEOUT_MS")]
    long_poll_timeout_ms: Option<u64>,
    /// Largest request body in bytes [default: 33554432].
    #[arg(long, env = "URSULA_MAX_REQUEST_BYTES")]
    max_request_bytes: Option<u64>,
    /// Request body bytes held at once by all requests (0 = unlimited) [default: 268435456].
    #[arg(long, env = "URSULA_HTTP_INFLIGHT_BODY_SIZE")]
    http_inflight_body_size: Option<u64>,
    /// Answer plain writes (POST, PUT, DELETE with a small body) on the server's own HTTP/1
    /// loop rather than hyper's (`http1_own_path`) [default: true].
    #[arg(long, env = "URSULA_HTTP1_OWN_PATH")]
    http1_own_path: Option<bool>,
    /// Raft log entries between state-machine snapshots [default: 20000].
    #[arg(long, env = "URSULA_SNAPSHOT_LOGS")]
    snapshot_logs: Option<u64>,
    /// Microseconds a single node's next write batch may wait for the writers the previous
    /// batch answered, so that one sync carries them all; 0 never waits [default: 250].
    #[arg(long, env = "URSULA_COMMIT_LINGER_US")]
    commit_linger_us: Option<u64>,
    /// Public base URL for Location headers [default: from the Host header].
    #[arg(long, env = "URSULA_PUBLIC_URL")]
    public_url: Option<String>,
    /// Without --public-url, take the public base URL from Forwarded / X-Forwarded-* headers
    /// (`trust_forwarded_headers`; only behind a proxy that sets them) [default: false].
    #[arg(long, env = "URSULA_TRUST_FORWARDED_HEADERS")]
    trust_forwarded_headers: Option<bool>,
    /// Host names to answer for, comma-separated; other hosts get 400 [default: any].
    #[arg(long, env = "URSULA_ALLOWED_HOSTS", value_delimiter = ',')]
    allowed_hosts: Option<Vec<String>>,
    /// Cold-tier backend: local, s3, memory or none (aliases: mem, inmem; disabled, off)
    /// [default: local, in {data-dir}/cold].
    #[arg(long, env = "URSULA_COLD_BACKEND")]
    cold_backend: Option<ursula_storage::cold::Backend>,
    /// Directory of the local cold backend [default: {data-dir}/cold].
    #[arg(long, env = "URSULA_COLD_LOCAL_PATH")]
    cold_local_path: Option<PathBuf>,
    /// Key prefix of every cold object [default: none].
    #[arg(long, env = "URSULA_COLD_ROOT")]
    cold_root: Option<String>,
    /// Bucket of the s3 cold backend (required for s3).
    #[arg(long, env = "URSULA_COLD_S3_BUCKET")]
    cold_s3_bucket: Option<String>,
    /// Region of the s3 cold backend [default: AWS_REGION, else us-east-1].
    #[arg(long, env = "URSULA_COLD_S3_REGION")]
    cold_s3_region: Option<String>,
    /// Endpoint of an S3-compatible store, e.g. http://127.0.0.1:9000 [default: AWS].
    #[arg(long, env = "URSULA_COLD_S3_ENDPOINT")]
    cold_s3_endpoint: Option<String>,
    /// With a cold backend, bodies of at least this size go to the cold store before they are
    /// proposed (`runtime.external_payload_min_size`) [default: 1MiB].
    #[arg(long, env = "URSULA_EXTERNAL_PAYLOAD_MIN_SIZE", value_parser = ursula_storage::cold::config::parse_size)]
    external_payload_min_size: Option<u64>,
    /// The cluster's id (`server.cluster_id`), recorded in the data dir on first start.
    #[arg(long, env = "URSULA_CLUSTER_ID")]
    cluster_id: Option<String>,
    /// Every voter as `ID=URL`, this node included (`[[raft.peers]]`); repeat the flag, or
    /// separate with commas in the env var. Replaces the file's peers.
    #[arg(long = "peer", env = "URSULA_PEERS", value_delimiter = ',', value_parser = parse_peer)]
    peers: Option<Vec<PeerConfig>>,
    /// Bootstrap every group's voter set (`raft.init_membership_per_group`): the first start
    /// of a fresh cluster only.
    #[arg(long, env = "URSULA_INIT_MEMBERSHIP_PER_GROUP")]
    init_membership_per_group: Option<bool>,
    /// Payload bytes a Raft group may hold proposed and not yet committed before writes answer
    /// 503 RAFT_UNCOMMITTED_BACKPRESSURE (`raft.max_uncommitted_size_per_group`) [default: no
    /// bound].
    #[arg(long, env = "URSULA_MAX_UNCOMMITTED_SIZE_PER_GROUP", value_parser = ursula_storage::cold::config::parse_size)]
    max_uncommitted_size_per_group: Option<u64>,
    /// Abort the process once its resident memory is above this size, sampled every 500 ms
    /// (`runtime.node_memory_abort_cap_size`) [default: no cap].
    #[arg(long, env = "URSULA_NODE_MEMORY_ABORT_CAP_SIZE", value_parser = ursula_storage::cold::config::parse_size)]
    node_memory_abort_cap_size: Option<u64>,
    /// Runtime worker threads (`runtime.core_count`) [default: the CPUs available].
    #[arg(long, env = "URSULA_CORE_COUNT")]
    core_count: Option<usize>,
    /// The node's state directory (`raft.wal.path`; when set it is the data directory).
    #[arg(long, env = "URSULA_WAL_PATH")]
    wal_path: Option<PathBuf>,
    /// Bytes per WAL segment, 1 MiB to 1 GiB (`raft.wal.segment_size`) [default: 64MiB].
    #[arg(long, env = "URSULA_WAL_SEGMENT_SIZE", value_parser = ursula_storage::cold::config::parse_size)]
    wal_segment_size: Option<u64>,
    /// Every node of a cluster sees the `local` cold path (`storage.cold.local.shared`).
    #[arg(long, env = "URSULA_COLD_LOCAL_SHARED")]
    cold_local_shared: Option<bool>,
    /// Hot bytes per group before writes answer 503 COLD_BACKPRESSURE
    /// (`storage.cold.max_hot_size_per_group`, `0` off) [default: 256MiB shared by the groups,
    /// at least 64MiB each].
    #[arg(long, env = "URSULA_MAX_HOT_SIZE_PER_GROUP", value_parser = ursula_storage::cold::config::parse_size)]
    max_hot_size_per_group: Option<u64>,
    /// This node's Raft id; overrides `raft.node_id`, so one config file serves every node.
    #[arg(long, env = "URSULA_NODE_ID")]
    node_id: Option<u64>,
    /// Log format: text or json [default: text].
    #[arg(long, env = "URSULA_LOG_FORMAT", default_value = "text")]
    log_format: String,
}

impl ServerArgs {
    pub fn into_config(self) -> anyhow::Result<(Config, String)> {
        let mut c = match &self.config {
            Some(p) => Config::from_file(p)?,
            None => Config::default(),
        };
        c.resolve_sections();
        if self.node_id.is_some() {
            c.raft.node_id = self.node_id;
        }
        if self.cluster_id.is_some() {
            c.server.cluster_id = self.cluster_id;
        }
        if let Some(v) = self.peers {
            c.raft.peers = v;
        }
        if let Some(v) = self.init_membership_per_group {
            c.raft.init_membership_per_group = v;
            c.raft.init_membership = v;
        }
        if self.core_count.is_some() {
            c.runtime.core_count = self.core_count;
        }
        if self.max_uncommitted_size_per_group.is_some() {
            c.raft.max_uncommitted_size_per_group = self.max_uncommitted_size_per_group;
        }
        if self.node_memory_abort_cap_size.is_some() {
            c.runtime.node_memory_abort_cap_size = self.node_memory_abort_cap_size;
        }
        if self.wal_path.is_some() {
            c.raft.wal.path = self.wal_path;
        }
        if self.wal_segment_size.is_some() {
            c.raft.wal.segment_size = self.wal_segment_size;
        }
        if let Some(v) = self.listen {
            c.listen = v;
        }
        if self.admin_listen.is_some() {
            c.admin_listen = self.admin_listen;
        }
        if self.cluster_listen.is_some() {
            c.server.cluster_listen = self.cluster_listen;
        }
        if let Some(v) = self.data_dir {
            c.data_dir = v;
        }
        if let Some(v) = self.group_count {
            c.group_count = Some(v);
        }
        if let Some(v) = self.long_poll_timeout_ms {
            c.long_poll_timeout_ms = v;
        }
        if let Some(v) = self.max_request_bytes {
            c.max_request_bytes = v;
        }
        if let Some(v) = self.http_inflight_body_size {
            c.http_inflight_body_size = v;
        }
        if let Some(v) = self.snapshot_logs {
            c.snapshot_logs = v;
        }
        if let Some(v) = self.commit_linger_us {
            c.commit_linger_us = v;
        }
        if let Some(v) = self.http1_own_path {
            c.http1_own_path = v;
        }
        if let Some(v) = self.trust_forwarded_headers {
            c.trust_forwarded_headers = v;
        }
        if self.public_url.is_some() {
            c.public_url = self.public_url;
        }
        if let Some(v) = self.allowed_hosts {
            c.allowed_hosts = v.into_iter().map(|h| h.trim().to_owned()).collect();
        }
        if let Some(v) = self.external_payload_min_size {
            c.runtime.external_payload_min_size = v;
        }
        let cold = &mut c.storage.cold;
        cold.backend = self.cold_backend.or(cold.backend);
        cold.local.path = self.cold_local_path.or(cold.local.path.take());
        cold.root = self.cold_root.or(cold.root.take());
        cold.s3.bucket = self.cold_s3_bucket.or(cold.s3.bucket.take());
        cold.s3.region = self.cold_s3_region.or(cold.s3.region.take());
        cold.s3.endpoint = self.cold_s3_endpoint.or(cold.s3.endpoint.take());
        if let Some(v) = self.cold_local_shared {
            cold.local.shared = v;
        }
        if let Some(v) = self.max_hot_size_per_group {
            cold.max_hot_size_per_group = Some(v);
        }
        c.resolve_defaults();
        c.validate()?;
        Ok((c, self.log_format))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        args: ServerArgs,
    }

    fn config(argv: &[&str]) -> anyhow::Result<Config> {
        let w = Wrap::try_parse_from(std::iter::once("ursula").chain(argv.iter().copied()))?;
        Ok(w.args.into_config()?.0)
    }

    #[test]
    fn a_local_cold_tier_flushes_from_one_mib_unless_told_otherwise() {
        // The default node keeps its cold tier in a local directory.
        let c = config(&[]).unwrap();
        assert_eq!(c.tiering().flush_min_hot_size, 1 << 20);
        // Any other backend flushes at flush_size.
        let c = config(&["--cold-backend", "memory"]).unwrap();
        assert_eq!(c.tiering().flush_min_hot_size, 8 << 20);
        // A setting in the file wins, and a smaller flush_size bounds the default.
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p.display().to_string()
        };
        let set = file(
            "set.toml",
            "[storage.cold]\nflush_min_hot_size = \"4MiB\"\n",
        );
        let c = config(&["--config", &set]).unwrap();
        assert_eq!(c.tiering().flush_min_hot_size, 4 << 20);
        let small = file("small.toml", "[storage.cold]\nflush_size = \"256KiB\"\n");
        let c = config(&["--config", &small]).unwrap();
        assert_eq!(c.tiering().flush_min_hot_size, 256 << 10);
    }

    #[test]
    fn the_group_count_defaults_to_the_data_directory_s_then_one_alone_and_four_in_a_cluster() {
        let fresh = tempfile::tempdir().unwrap();
        let dir = fresh.path().display().to_string();
        let alone = config(&["--data-dir", &dir]).unwrap();
        assert_eq!(alone.group_count(), 1);
        // Its one group may hold what four held together.
        assert_eq!(alone.tiering().max_hot_size_per_group, 256 << 20);
        let peers = [
            "--node-id",
            "1",
            "--peer",
            "1=http://127.0.0.1:4437,2=http://127.0.0.1:4447",
            "--cold-backend",
            "local",
            "--cold-local-shared",
            "true",
        ];
        let cluster = config(&[&["--data-dir", &dir][..], &peers].concat()).unwrap();
        assert_eq!(cluster.group_count(), 4);
        assert_eq!(cluster.tiering().max_hot_size_per_group, 64 << 20);
        // A directory created with four groups keeps them when the count is not set.
        std::fs::write(
            fresh.path().join("node.toml"),
            "magic = \"ursula-node\"\nformat_version = 1\nnode_id = 1\ngroup_count = 4\n",
        )
        .unwrap();
        let reopened = config(&["--data-dir", &dir]).unwrap();
        assert_eq!(reopened.group_count(), 4);
        // A count that is set wins (the node refuses it at open if the directory differs).
        let set = config(&["--data-dir", &dir, "--group-count", "2"]).unwrap();
        assert_eq!(set.group_count(), 2);
    }

    #[test]
    fn a_cluster_starts_from_flags_alone() {
        let c = config(&[
            "--node-id",
            "2",
            "--cluster-id",
            "prod",
            "--peer",
            "1=http://127.0.0.1:4437",
            "--peer",
            "2=http://127.0.0.1:4447,3=http://127.0.0.1:4457",
            "--init-membership-per-group",
            "true",
            "--cold-backend",
            "local",
            "--cold-local-path",
            "/tmp/shared-cold",
            "--cold-local-shared",
            "true",
            "--max-hot-size-per-group",
            "32MiB",
            "--core-count",
            "2",
        ])
        .unwrap();
        assert_eq!(c.raft.node_id, Some(2));
        assert_eq!(c.server.cluster_id.as_deref(), Some("prod"));
        let peers: Vec<(u64, &str)> = c
            .raft
            .peers
            .iter()
            .map(|p| (p.node_id, p.url.as_str()))
            .collect();
        assert_eq!(
            peers,
            [
                (1, "http://127.0.0.1:4437"),
                (2, "http://127.0.0.1:4447"),
                (3, "http://127.0.0.1:4457")
            ]
        );
        assert!(c.raft.init_membership_per_group);
        assert!(c.storage.cold.local.shared);
        assert_eq!(c.storage.cold.max_hot_size_per_group(), 32 << 20);
        assert_eq!(c.runtime.core_count, Some(2));
        // A shared directory is read through the store: it flushes at flush_size.
        assert_eq!(c.tiering().flush_min_hot_size, 8 << 20);
    }

    #[test]
    fn the_wal_segment_size_has_a_flag_bounded_like_the_key() {
        assert_eq!(config(&[]).unwrap().raft.wal.segment_size(), 64 << 20);
        let c = config(&["--wal-segment-size", "16MiB"]).unwrap();
        assert_eq!(c.raft.wal.segment_size(), 16 << 20);
        let err = config(&["--wal-segment-size", "512KiB"]).unwrap_err();
        assert!(err.to_string().contains("segment_size"), "{err}");
    }

    #[test]
    fn bad_peers_and_unshared_local_cold_are_refused() {
        assert!(config(&["--peer", "two=http://x"]).is_err());
        assert!(config(&["--peer", "http://x"]).is_err());
        let err = config(&[
            "--node-id",
            "1",
            "--peer",
            "1=http://127.0.0.1:4437,2=http://127.0.0.1:4447,3=http://127.0.0.1:4457",
            "--cold-backend",
            "local",
            "--cold-local-path",
            "/tmp/c",
        ])
        .unwrap_err();
        assert!(err.to_string().contains("shared"), "{err}");
    }
}
