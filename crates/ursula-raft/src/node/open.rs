//! Opening a node: the data directory, recovery of the WAL and the snapshots, and starting
//! every group.

use super::*;

/// What the blocking part of `open` recovered.
pub(super) struct Recovered {
    pub(super) wal: Wal,
    pub(super) head: Lsn,
    pub(super) logs: Vec<(LogInner, Marks)>,
    pub(super) snapshots: Vec<(Loaded, PathBuf)>,
    pub(super) rejoin: Arc<super::rejoin::Rejoin>,
}

fn snapshot_path(dir: &Path, group: u32) -> PathBuf {
    dir.join(format!("group-{group}.snap"))
}

fn dir_is_empty(dir: &Path) -> Result<bool, RaftError> {
    match fs::read_dir(dir) {
        Ok(mut it) => Ok(it.next().is_none()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(RaftError::io(dir, e)),
    }
}

fn sync_dir(dir: &Path) -> Result<(), RaftError> {
    fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(|e| RaftError::io(dir, e))
}

/// Opens the data directory, the WAL and the snapshots, and rebuilds every group's log
/// (blocking).
pub(super) fn recover(cfg: &NodeConfig) -> Result<Recovered, RaftError> {
    let data = &cfg.data_dir;
    fs::create_dir_all(data).map_err(|e| RaftError::io(data, e))?;
    let wal_dir = data.join("wal");
    let snap_dir = data.join("snapshots");
    let fresh = dir_is_empty(&wal_dir)? && dir_is_empty(&snap_dir)?;
    // Before node.toml exists: a wiped node must never look intact after a crash here.
    let wiped = fresh
        && !data.join(identity::FILE_NAME).exists()
        && cfg.peers.keys().any(|&p| p != cfg.node_id)
        && !cfg.init_membership;
    let rejoin = Arc::new(super::rejoin::Rejoin::open(data, wiped, cfg.group_count)?);
    identity::check_or_create(
        data,
        &Identity {
            node_id: cfg.node_id,
            group_count: cfg.group_count,
            cluster_id: cfg.cluster_id.clone(),
        },
        fresh,
    )?;
    if !snap_dir.exists() {
        fs::create_dir_all(&snap_dir).map_err(|e| RaftError::io(&snap_dir, e))?;
        sync_dir(data)?;
    }

    let mut wal_opts = cfg.wal.clone();
    if wal_opts.deliver_on.is_none() {
        // Completions wake Raft tasks: deliver each synced batch with one wake-up of the
        // runtime instead of one per group (see `WalOptions::deliver_on`).
        wal_opts.deliver_on = tokio::runtime::Handle::try_current().ok();
    }
    let (wal, records) = Wal::open(&wal_dir, wal_opts)?;
    let mut logs: Vec<(LogInner, Marks)> =
        (0..cfg.group_count).map(|_| Default::default()).collect();
    let mut head = 0;
    for (lsn, rec) in records {
        head = lsn;
        let Some((inner, marks)) = logs.get_mut(rec.group as usize) else {
            wal.close();
            return Err(RaftError::Corrupt(format!(
                "wal record {lsn} belongs to group {} but there are {} groups",
                rec.group, cfg.group_count
            )));
        };
        if let Err(e) = inner.replay(lsn, rec.kind, &rec.payload, marks) {
            wal.close();
            return Err(RaftError::Corrupt(format!(
                "wal record {lsn} of group {}: {e}",
                rec.group
            )));
        }
    }

    for (group, (inner, _)) in logs.iter().enumerate() {
        if let Err(e) = inner.check() {
            wal.close();
            return Err(RaftError::Corrupt(format!("group {group}: {e}")));
        }
    }

    let mut snapshots = Vec::with_capacity(cfg.group_count as usize);
    for group in 0..cfg.group_count {
        let path = snapshot_path(&snap_dir, group);
        match state_machine::load_snapshot(wal.fs().as_ref(), group, &path) {
            Ok(loaded) => {
                let purged = logs[group as usize].0.last_purged();
                if let Some(p) = purged
                    && loaded.last_applied.is_none_or(|l| l.index < p.index)
                {
                    wal.close();
                    return Err(RaftError::Corrupt(format!(
                        "group {group}: the log was purged up to {p} but {} covers only {:?}",
                        path.display(),
                        loaded.last_applied
                    )));
                }
                snapshots.push((loaded, path));
            }
            Err(e) => {
                wal.close();
                return Err(RaftError::Corrupt(format!(
                    "snapshot of group {group}: {e}"
                )));
            }
        }
    }
    Ok(Recovered {
        wal,
        head,
        logs,
        snapshots,
        rejoin,
    })
}

fn raft_config(
    group: u32,
    snapshot_logs: u64,
    timing: RaftTiming,
) -> Result<openraft::Config, RaftError> {
    openraft::Config {
        cluster_name: format!("ursula-group-{group}"),
        heartbeat_interval: timing.heartbeat_ms,
        // One clock heartbeats every group at once instead (heartbeat.rs).
        enable_heartbeat: false,
        election_timeout_min: timing.election_min_ms,
        election_timeout_max: timing.election_max_ms,
        // One chunk per RPC: the sender reads the snapshot a chunk at a time.
        snapshot_max_chunk_size: SNAPSHOT_CHUNK_BYTES,
        install_snapshot_timeout: 10_000,
        max_payload_entries: 4096,
        replication_lag_threshold: snapshot_logs.saturating_mul(2),
        // Upkeep triggers every snapshot (`upkeep.rs`): openraft's count policy cannot weigh a
        // snapshot's size against the log it replaces.
        snapshot_policy: SnapshotPolicy::Never,
        max_in_snapshot_log_to_keep: 0,
        purge_batch_size: 1,
        ..Default::default()
    }
    .validate()
    .map_err(|e| RaftError::Config(e.to_string()))
}

fn group_err(group: u32, e: impl ToString) -> RaftError {
    RaftError::Group {
        group,
        message: e.to_string(),
    }
}

pub(super) struct GroupParts {
    pub(super) state: Arc<RwLock<GroupState>>,
    pub(super) applied: watch::Receiver<u64>,
    pub(super) log: Arc<GroupLog>,
    pub(super) snapshots: Arc<SnapshotStore>,
}

/// Starts every group, pushing each started one to `out` (so that the caller can stop them on
/// failure), initializes fresh groups and waits for leadership. Returns the purge notifier and
/// the node-wide durable LSN head.
pub(super) async fn start_groups(
    cfg: &NodeConfig,
    rec: Recovered,
    transport: Option<Arc<Coalescer>>,
    out: &mut Vec<(Raft, GroupParts)>,
) -> Result<(Arc<Notify>, Arc<AtomicU64>), RaftError> {
    let head = Arc::new(AtomicU64::new(rec.head));
    let purged = Arc::new(Notify::new());
    for (group, ((inner, marks), (loaded, path))) in
        rec.logs.into_iter().zip(rec.snapshots).enumerate()
    {
        let group = group as u32;
        let log = Arc::new(GroupLog::new(
            group,
            rec.wal.clone(),
            Arc::clone(&head),
            inner,
            marks,
            Arc::clone(&purged),
        ));
        let Loaded {
            state,
            last_applied,
            membership,
            applied_commands,
            file,
        } = loaded;
        let snapshots = Arc::new(SnapshotStore::new(group, path, file, rec.wal.clone()));
        let (applied_tx, applied) = watch::channel(last_applied.map_or(0, |l| l.index));
        let state = Arc::new(RwLock::new(state));
        let sm = StateMachine::new(
            group,
            last_applied,
            membership,
            applied_commands,
            Arc::clone(&state),
            applied_tx,
            Arc::clone(&snapshots),
        )
        .with_listener(cfg.listener.clone());
        let config = Arc::new(raft_config(group, cfg.snapshot_logs, cfg.timing)?);
        let raft = Raft::new(
            cfg.node_id,
            config,
            Network::new(
                group,
                transport.clone(),
                Duration::from_millis(2 * cfg.timing.heartbeat_ms),
            ),
            LogStore::new(Arc::clone(&log)),
            sm,
        )
        .await
        .map_err(|e| group_err(group, e))?;
        out.push((
            raft,
            GroupParts {
                state,
                applied,
                log,
                snapshots,
            },
        ));
    }

    // Without peers this node is the only voter and always bootstraps; with peers only a first
    // start of a fresh cluster does (every node with the same voter set, which openraft allows).
    let voters: BTreeMap<u64, BasicNode> = if cfg.peers.is_empty() {
        BTreeMap::from([(cfg.node_id, BasicNode::new(""))])
    } else {
        cfg.peers
            .iter()
            .map(|(&id, url)| (id, BasicNode::new(url)))
            .collect()
    };
    let single = voters.len() == 1;
    for (group, (raft, _)) in out.iter().enumerate() {
        let group = group as u32;
        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| group_err(group, e))?;
        if !initialized && (single || cfg.init_membership) {
            match raft.initialize(voters.clone()).await {
                Ok(()) => tracing::info!(group, voters = voters.len(), "initialized membership"),
                Err(openraft::error::RaftError::APIError(InitializeError::NotAllowed(_))) => {}
                Err(e) => return Err(group_err(group, e)),
            }
        }
    }
    if !single {
        return Ok((purged, head));
    }

    let me = cfg.node_id;
    for (group, (raft, _)) in out.iter().enumerate() {
        raft.wait(Some(STARTUP_TIMEOUT))
            .metrics(
                |m| {
                    m.state == ServerState::Leader
                        && m.current_leader == Some(me)
                        && m.last_applied.map(|l| l.index) >= m.last_log_index
                },
                "leader with the whole log applied",
            )
            .await
            .map_err(|e| group_err(group as u32, format!("did not become leader: {e}")))?;
    }
    Ok((purged, head))
}
