//! `ursula`: the durable stream server.

mod allocator;
mod app;
mod cluster;
mod coarse_timer;
mod cold;
mod cold_health;
mod cold_read;
mod config;
mod external;
mod governance;
mod h1;
mod http;
mod latency;
mod local_chunks;
mod memory;
mod metrics;
mod parts;
mod probe;
mod raft_metrics;
mod send_file;
mod server;
mod server_args;
mod snapshot_store;
mod tiering;
mod uncommitted;
mod watchers;

use clap::{Parser, Subcommand};
use config::Config;
use server_args::ServerArgs;
use std::path::PathBuf;

/// mimalloc: measurably cheaper than glibc malloc on the request path (see docs/benchmarks.md)
/// and it returns freed memory to the OS more readily; see allocator.rs for how it is called.
#[global_allocator]
static GLOBAL: allocator::Mimalloc = allocator::Mimalloc;

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
    /// Run the gateway (`ursulagw`): one front door for a cluster's nodes, following leader
    /// redirects itself so that node addresses never reach clients (cluster.md §12).
    Gateway(Box<ursula_gateway::GatewayArgs>),
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

fn init_tracing(format: &str) {
    // `URSULA_LOG`, else `RUST_LOG` (cluster.md §13), else `info` (openraft's at `warn`).
    let filter = tracing_subscriber::EnvFilter::try_from_env("URSULA_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
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
        Cmd::Gateway(args) => {
            ursula_gateway::init_tracing();
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            return rt.block_on(ursula_gateway::main(*args));
        }
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
    memory::spawn_abort_cap(cfg.runtime.node_memory_abort_cap_size)?;
    std::fs::create_dir_all(&cfg.data_dir)?;
    let started = std::time::Instant::now();
    let cold_store = cold::open(&cfg).await?;
    let watchers = watchers::Watchers::new(cfg.group_count());
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
        group_count: cfg.group_count(),
        wal: ursula_storage::WalOptions {
            fsync: cfg.fsync,
            segment_bytes: cfg.raft.wal.segment_size(),
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
        commit_linger: std::time::Duration::from_micros(cfg.commit_linger_us),
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
        groups = cfg.group_count(),
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
        .map(|store| tiering::Tiering::new(store, cfg.tiering(), cfg.group_count()));
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
    // Listening from here on: a second signal sent while the first is handled is kept.
    let mut signals = Signals::listen();
    let shutdown = async move {
        signals.next().await;
        // A second signal exits at once (§15): what was acknowledged is in the WAL (and on
        // the peers); only the in-flight requests go unanswered.
        tokio::spawn(async move {
            signals.next().await;
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

/// SIGTERM and SIGINT (Ctrl-C), listened to from when this is made: a signal that arrives
/// while nothing awaits [`Signals::next`] is kept for the next call (a second signal sent
/// right after the first, before the task that waits for it ran, was lost when each wait
/// made its own listener).
struct Signals {
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    int: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn listen() -> Signals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Signals {
                term: signal(SignalKind::terminate()).ok(),
                int: signal(SignalKind::interrupt()).ok(),
            }
        }
        #[cfg(not(unix))]
        Signals {}
    }

    /// The next SIGTERM or SIGINT (never, if neither could be listened to).
    async fn next(&mut self) {
        #[cfg(unix)]
        {
            async fn one(s: &mut Option<tokio::signal::unix::Signal>) {
                match s {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending().await,
                }
            }
            tokio::select! {
                _ = one(&mut self.term) => {}
                _ = one(&mut self.int) => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
