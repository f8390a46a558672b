//! `ursula`: the durable stream server.

mod app;
mod cluster;
mod cold;
mod cold_health;
mod cold_read;
mod config;
mod external;
mod governance;
mod http;
mod metrics;
mod parse_errors;
mod parts;
mod probe;
mod raft_metrics;
mod server;
mod snapshot_store;
mod tiering;
mod watchers;

use clap::{Parser, Subcommand};
use config::Config;
use std::path::PathBuf;

/// mimalloc: measurably cheaper than glibc malloc on the request path (see docs/benchmarks.md)
/// and it returns freed memory to the OS more readily.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "ursula",
    version,
    about = "Durable, append-only, replayable streams over HTTP"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a node. With no flags: 127.0.0.1:4437, data in ./ursula-data, durable (fsync).
    Server(Box<ServerArgs>),
    /// Repair a data directory whose WAL start-up refuses as corrupt: cut the WAL at its
    /// first damage, keeping every whole batch before it, and report what was dropped. Run
    /// only with the node stopped; data after the damage (acknowledged or not) is lost.
    Repair(RepairArgs),
}

#[derive(clap::Args)]
struct RepairArgs {
    /// Data directory [default: ./ursula-data].
    #[arg(long, env = "URSULA_DATA_DIR", default_value = "./ursula-data")]
    data_dir: PathBuf,
    /// Report what would be dropped without changing anything.
    #[arg(long)]
    dry_run: bool,
}

/// Exit status of a node that failed stop after a storage fault (`EX_TEMPFAIL`: a supervisor
/// should restart it; recovery re-reads the disk).
const EXIT_STORAGE_FAILED: i32 = 75;
/// Exit status after a second SIGTERM/Ctrl-C cut the drain short (128 + SIGINT, as shells do).
const EXIT_SECOND_SIGNAL: i32 = 130;
/// How long a failed node keeps answering (503s, readiness) before it exits, so that the
/// answers to the writes in flight go out.
const FAIL_STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

#[derive(clap::Args)]
struct ServerArgs {
    /// TOML configuration file; flags and environment variables override it.
    #[arg(long, env = "URSULA_CONFIG")]
    config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:4437].
    #[arg(long, env = "URSULA_LISTEN")]
    listen: Option<std::net::SocketAddr>,
    /// Admin-plane listener for operator endpoints (purge) [default: off; e.g. 127.0.0.1:4438].
    #[arg(long, env = "URSULA_ADMIN_LISTEN")]
    admin_listen: Option<std::net::SocketAddr>,
    /// A listener of its own for the Raft RPCs of a cluster (it serves client routes too; peer
    /// URLs point at it) [default: unset: the RPCs share --listen].
    #[arg(long, env = "URSULA_CLUSTER_LISTEN")]
    cluster_listen: Option<std::net::SocketAddr>,
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
    /// Raft log entries between state-machine snapshots [default: 20000].
    #[arg(long, env = "URSULA_SNAPSHOT_LOGS")]
    snapshot_logs: Option<u64>,
    /// Public base URL for Location headers [default: from the Host header].
    #[arg(long, env = "URSULA_PUBLIC_URL")]
    public_url: Option<String>,
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
    /// This node's Raft id; overrides `raft.node_id`, so one config file serves every node.
    #[arg(long, env = "URSULA_NODE_ID")]
    node_id: Option<u64>,
    /// Log format: text or json [default: text].
    #[arg(long, env = "URSULA_LOG_FORMAT", default_value = "text")]
    log_format: String,
}

impl ServerArgs {
    fn into_config(self) -> anyhow::Result<(Config, String)> {
        let mut c = match &self.config {
            Some(p) => Config::from_file(p)?,
            None => Config::default(),
        };
        c.resolve_sections();
        if self.node_id.is_some() {
            c.raft.node_id = self.node_id;
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
            c.group_count = v;
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
        c.validate()?;
        Ok((c, self.log_format))
    }
}

fn init_tracing(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("URSULA_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let args = match cli.cmd {
        Cmd::Server(args) => *args,
        Cmd::Repair(args) => return repair(&args),
    };
    let (cfg, log_format) = args.into_config()?;
    init_tracing(&log_format);
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = cfg.runtime.core_count {
        rt.worker_threads(n);
    }
    let rt = rt.enable_all().build()?;
    rt.block_on(serve(cfg))
}

async fn serve(cfg: Config) -> anyhow::Result<()> {
    std::fs::create_dir_all(&cfg.data_dir)?;
    let started = std::time::Instant::now();
    let cold_store = cold::open(&cfg).await?;
    let watchers = watchers::Watchers::new(cfg.group_count);
    let peers = if cfg.raft.peers.is_empty() {
        Default::default()
    } else {
        cfg.peer_urls()
    };
    let transport: Option<std::sync::Arc<dyn ursula_raft::Transport>> = if cfg.has_peers() {
        Some(std::sync::Arc::new(cluster::HttpTransport::new(
            cfg.node_id(),
            &peers,
        )?))
    } else {
        None
    };
    let node = ursula_raft::Node::open(ursula_raft::NodeConfig {
        data_dir: cfg.data_dir.clone(),
        node_id: cfg.node_id(),
        group_count: cfg.group_count,
        wal: ursula_storage::WalOptions {
            fsync: cfg.fsync,
            ..Default::default()
        },
        snapshot_logs: cfg.snapshot_logs,
        // With a cold tier a group's snapshot is its hot tail and metadata: snapshot (and so
        // release the log entries of flushed bytes) once the log holds a few flushes' worth.
        snapshot_min_log_bytes: if cold_store.is_some() {
            (2 * cfg.storage.cold.flush_max_size()).max(16 << 20)
        } else {
            64 << 20
        },
        listener: Some(watchers.clone()),
        peers,
        transport,
        init_membership: cfg.init_membership(),
        cluster_id: cfg.server.cluster_id.clone(),
        timing: cfg.raft.timing(),
        rpc_batching: cfg.raft.rpc_batching.unwrap_or(true),
    })
    .await
    .map_err(|e| anyhow::anyhow!("cannot open data dir {}: {e}", cfg.data_dir.display()))?;
    let admin = match cfg.admin_listen {
        Some(a) => Some(tokio::net::TcpListener::bind(a).await?),
        None => None,
    };
    let admin_addr = match &admin {
        Some(l) => l.local_addr()?.to_string(),
        None => "off".to_owned(),
    };
    let cluster_listener = match cfg.server.cluster_listen {
        Some(a) => Some(tokio::net::TcpListener::bind(a).await?),
        None => None,
    };
    let cluster_addr = match &cluster_listener {
        Some(l) => l.local_addr()?.to_string(),
        None => "shared".to_owned(),
    };
    let listener = tokio::net::TcpListener::bind(cfg.listen).await?;
    let addr = listener.local_addr()?;
    tracing::info!(
        %addr,
        %admin_addr,
        %cluster_addr,
        data_dir = %cfg.data_dir.display(),
        groups = cfg.group_count,
        recovery_ms = started.elapsed().as_millis() as u64,
        "ursula listening"
    );
    // The bound address, not `:0`: it is the public base URL of a request without `Host`.
    let cfg = Config {
        listen: addr,
        ..cfg
    };
    let cfg_probe = cfg.storage.cold.clone();
    let tiering = cold_store
        .clone()
        .map(|store| tiering::Tiering::new(store, cfg.tiering(), cfg.group_count));
    let governance_cfg = cfg.governance.clone();
    let app = app::App::new(node.clone(), cfg, watchers, tiering.clone());
    governance::spawn(&app, &governance_cfg)?;
    if let Some(t) = &tiering {
        t.spawn(&app);
    }
    app.spawn_upkeep();
    parts::spawn_sweep(&app);
    external::spawn_sweep(&app);
    tokio::spawn(fail_stop_on_storage_failure(node.clone()));
    if node.has_peers() {
        tokio::spawn(report_leaders(node.clone()));
    }
    if let Some(l) = cluster_listener {
        let mut stop = app.shutdown.subscribe();
        let stopped = async move {
            let _ = stop.changed().await;
        };
        tokio::spawn(server::run(l, app.clone(), stopped, http::handle_cluster));
    }
    if let Some(admin) = admin {
        let mut stop = app.shutdown.subscribe();
        let stopped = async move {
            let _ = stop.changed().await;
        };
        tokio::spawn(server::run(
            admin,
            app.clone(),
            stopped,
            http::admin::handle,
        ));
    }
    let _cold_probe = match (cold_store, &tiering) {
        (Some(c), Some(t)) => {
            let t = t.clone();
            Some(cold::spawn_probe(c, &cfg_probe, move |r| {
                t.health.set_probe(r)
            }))
        }
        _ => None,
    };
    // On SIGTERM a clustered node first hands its leaderships over (still serving, so that
    // the writes it pauses meanwhile are redirected), then stops accepting and drains.
    let node2 = node.clone();
    let shutdown = async move {
        shutdown_signal().await;
        // A second signal exits at once (§15): what was acknowledged is in the WAL (and on
        // the peers); only the in-flight requests go unanswered.
        tokio::spawn(async {
            shutdown_signal().await;
            tracing::warn!("second signal: exiting without finishing in-flight requests");
            eprintln!("ursula: second signal: exiting now");
            std::process::exit(EXIT_SECOND_SIGNAL);
        });
        governance::hand_over_for_shutdown(&node2).await;
    };
    server::run(listener, app, shutdown, http::handle).await;
    node.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

/// With peers the node serves before its groups have leaders (their elections need the peers'
/// RPCs); this logs once when every group has one, or which have none after a while
/// (readiness reports them meanwhile).
async fn report_leaders(node: std::sync::Arc<ursula_raft::Node>) {
    let started = std::time::Instant::now();
    let leaderless = node
        .wait_for_leaders(std::time::Duration::from_secs(30))
        .await;
    if leaderless.is_empty() {
        tracing::info!(
            node_id = node.node_id(),
            leading = node.led_groups().len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "every raft group has a leader"
        );
    } else {
        tracing::warn!(
            node_id = node.node_id(),
            ?leaderless,
            "raft groups without a leader after 30 s (are the peers up?)"
        );
    }
}

/// Fail-stop (docs/storage.md): once the WAL failed (a sync or write error), the node takes no
/// writes (`503 STORAGE_UNAVAILABLE`, readiness false) and, after a short grace, exits non-zero
/// so that a supervisor restarts it and recovery re-reads what the disk really holds. A failed
/// `fsync` cannot be retried in-process: the kernel may already have dropped the pages.
async fn fail_stop_on_storage_failure(node: std::sync::Arc<ursula_raft::Node>) {
    let reason = loop {
        if let Some(r) = node.storage_health().failed() {
            break r;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    tracing::error!(
        reason = %reason,
        grace_ms = FAIL_STOP_GRACE.as_millis() as u64,
        "storage failed: this node takes no more writes and exits so that a supervisor \
         restarts it; recovery re-reads the disk (nothing acknowledged is lost)"
    );
    tokio::time::sleep(FAIL_STOP_GRACE).await;
    eprintln!(
        "ursula: fatal: storage failed ({reason}); exiting with status {EXIT_STORAGE_FAILED} \
         for a restart"
    );
    std::process::exit(EXIT_STORAGE_FAILED);
}

/// `ursula repair`: cuts the WAL of `--data-dir` at its first damage and reports.
#[allow(clippy::print_stdout, reason = "the report is the command's output")]
fn repair(args: &RepairArgs) -> anyhow::Result<()> {
    let wal_dir = args.data_dir.join("wal");
    anyhow::ensure!(
        wal_dir.is_dir(),
        "{} has no wal directory",
        args.data_dir.display()
    );
    let report = ursula_storage::repair(&wal_dir, args.dry_run)
        .map_err(|e| anyhow::anyhow!("repair of {} failed: {e}", wal_dir.display()))?;
    let verb = if report.dry_run {
        "would drop"
    } else {
        "dropped"
    };
    if report.actions.is_empty() {
        println!("wal is whole: nothing to repair");
    }
    for a in &report.actions {
        println!("{verb}: {a}");
    }
    if !report.dry_run {
        println!(
            "kept {} records; the next record gets LSN {}",
            report.records, report.next_lsn
        );
    }
    if report.dropped_acknowledged() {
        println!(
            "warning: the dropped bytes followed damage start-up refuses: they may have held \
             acknowledged writes"
        );
    }
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
