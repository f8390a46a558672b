//! Shared application state: the Raft node, configuration, clock and background work.

use crate::config::Config;
use crate::http::error::ApiError;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use ursula_core::command::{Command, Op, Reply};
use ursula_core::stream::StreamState;
use ursula_core::{ErrorCode, GroupState, StreamKey};
use ursula_raft::{Node, ProposeError};

pub struct App {
    pub node: Arc<Node>,
    pub cfg: Config,
    clock: AtomicU64,
    pin_counter: AtomicU64,
    outbox_busy: Vec<AtomicBool>,
    pub shutdown: tokio::sync::watch::Sender<bool>,
    pub metrics: crate::metrics::Metrics,
    /// Request latency by operation and group, answers by status.
    pub latency: crate::latency::Latency,
    /// Client bytes each group has proposed and not yet answered.
    pub uncommitted: crate::uncommitted::Uncommitted,
    /// Live readers by stream; the node's state machines report changes to it.
    pub watchers: Arc<crate::watchers::Watchers>,
    /// The cold tier, on a node with a cold backend.
    pub tiering: Option<Arc<crate::tiering::Tiering>>,
    /// Staged snapshot parts and running commits (snapshot-parts.md §8, §10).
    pub parts: crate::parts::Registry,
    /// Request body bytes held by requests in flight (`http_inflight_body_size`).
    pub body_budget: crate::http::budget::BodyBudget,
    /// What the health gates measured (cluster.md §5.4).
    pub governance: crate::governance::State,
    /// The clock of the deadlines every request carries (request heads, write stalls).
    pub timer: crate::coarse_timer::CoarseTimer,
}

impl App {
    pub fn new(
        node: Arc<Node>,
        cfg: Config,
        watchers: Arc<crate::watchers::Watchers>,
        tiering: Option<Arc<crate::tiering::Tiering>>,
    ) -> Arc<Self> {
        let groups = node.group_count();
        let body_budget = crate::http::budget::BodyBudget::new(cfg.http_inflight_body_size);
        let uncommitted =
            crate::uncommitted::Uncommitted::new(groups, cfg.raft.max_uncommitted_size_per_group);
        Arc::new(App {
            node,
            cfg,
            clock: AtomicU64::new(0),
            pin_counter: AtomicU64::new(0),
            outbox_busy: (0..groups).map(|_| AtomicBool::new(false)).collect(),
            shutdown: tokio::sync::watch::channel(false).0,
            metrics: crate::metrics::Metrics::default(),
            latency: crate::latency::Latency::new(groups),
            uncommitted,
            watchers,
            tiering,
            parts: Default::default(),
            body_budget,
            governance: Default::default(),
            timer: Default::default(),
        })
    }

    /// Wall-clock milliseconds, never going backwards within this process.
    pub fn now_ms(&self) -> u64 {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let prev = self.clock.fetch_max(wall, Ordering::AcqRel);
        prev.max(wall)
    }

    pub fn group_of(&self, key: &StreamKey) -> u32 {
        key.group(self.node.group_count())
    }

    /// A fresh pin id, unique on this node.
    pub fn next_pin_id(&self) -> u64 {
        let n = self.pin_counter.fetch_add(1, Ordering::Relaxed);
        (self.now_ms() << 20) ^ n
    }

    /// Replicates `op` in `group` and returns what the state machine answered.
    pub async fn propose(self: &Arc<Self>, group: u32, op: Op) -> Result<Reply, ApiError> {
        // A client's data counts against raft.max_uncommitted_size_per_group until answered.
        let client_data = matches!(
            op,
            Op::Append(_) | Op::Create(_) | Op::AppendExternal(_) | Op::CreateExternal(_)
        );
        let _held = if client_data {
            Some(self.uncommitted.admit(group, op.payload_len() as u64)?)
        } else {
            None
        };
        let cmd = Command {
            now_ms: self.now_ms(),
            op,
        };
        // A write whose batch a full or stalled disk holds must not hang its client: after the
        // bound it answers that its outcome is unknown (it may still commit when the disk heals).
        let stall = Duration::from_millis(self.cfg.write_stall_timeout_ms.max(1));
        // With peers, a request that reaches several groups (a bucket, a fork's pin) is proposed
        // by each group's leader; a client's own write reached its leader already (http/leader.rs
        // redirects it otherwise).
        let res = tokio::select! {
            biased;
            res = self.node.propose_via_leader(group, cmd) => res,
            () = self.timer.sleep(stall) => {
                tracing::warn!(
                    group,
                    timeout_ms = stall.as_millis() as u64,
                    "a write stalled"
                );
                return Err(ApiError::new(
                    ErrorCode::WRITE_OUTCOME_UNKNOWN,
                    "the write was not committed in time (the disk is full or stalled); it may \
                     still be applied when the disk recovers: retry it with an idempotent \
                     producer (Producer-Id, Producer-Epoch, Producer-Seq), or read the \
                     stream's tail before retrying",
                ));
            }
        };
        match res {
            Ok(Ok(reply)) => {
                self.kick_outbox(group);
                Ok(reply)
            }
            Ok(Err(rejection)) => Err(rejection.into()),
            Err(ProposeError::Unavailable(m)) => {
                Err(ApiError::new(ErrorCode::LEADER_UNAVAILABLE, m))
            }
            // Leadership moved between the leader gate (http/leader.rs) and the proposal:
            // nothing was logged; the client retries and is redirected.
            Err(ProposeError::ForwardToLeader { leader }) => Err(ApiError::new(
                ErrorCode::LEADER_UNAVAILABLE,
                match leader {
                    Some(l) => format!("this node no longer leads group {group}; node {l} does"),
                    None => format!("raft group {group} is electing a leader; retry shortly"),
                },
            )),
            Err(ProposeError::OutcomeUnknown(m)) => {
                tracing::error!(group, error = %m, "a write's outcome is unknown");
                Err(ApiError::new(
                    ErrorCode::WRITE_OUTCOME_UNKNOWN,
                    "the write reached the log but its sync failed, so it may or may not be \
                     present after the node restarts; retry it with an idempotent producer \
                     (Producer-Id, Producer-Epoch, Producer-Seq), or read the stream's tail \
                     before retrying",
                ))
            }
            Err(ProposeError::StorageUnavailable(m)) => Err(ApiError::new(
                ErrorCode::STORAGE_UNAVAILABLE,
                format!(
                    "this node's storage failed ({m}); it takes no writes and restarts to \
                     recover; nothing was written"
                ),
            )),
            Err(ProposeError::InsufficientStorage(m)) => Err(ApiError::new(
                ErrorCode::INSUFFICIENT_STORAGE,
                format!("{m}; nothing was written"),
            )),
            Err(e) => {
                tracing::error!(group, error = %e, "proposal failed");
                Err(ApiError::new(
                    ErrorCode::INTERNAL_ERROR,
                    "the write could not be made durable",
                ))
            }
        }
    }

    /// Reads a stream's state under its group's read lock.
    pub fn with_stream<R>(&self, key: &StreamKey, f: impl FnOnce(&StreamState) -> R) -> Option<R> {
        self.node
            .read(self.group_of(key), |g| g.streams.get(key).map(f))
    }

    pub fn with_group<R>(&self, group: u32, f: impl FnOnce(&GroupState) -> R) -> R {
        self.node.read(group, f)
    }

    /// Delivers pin releases a group owes to fork sources (forks.md §10.1).
    pub fn kick_outbox(self: &Arc<Self>, group: u32) {
        let pending = self.with_group(group, |g| !g.outbox.is_empty());
        if !pending || self.outbox_busy[group as usize].swap(true, Ordering::AcqRel) {
            return;
        }
        let app = self.clone();
        tokio::spawn(async move {
            loop {
                let items: Vec<_> = app.with_group(group, |g| g.outbox.values().cloned().collect());
                if items.is_empty() {
                    break;
                }
                let mut failed = false;
                for item in items {
                    let src_group = app.group_of(&item.source);
                    let unpin = Op::Unpin {
                        key: item.source.clone(),
                        pin_id: item.pin_id,
                    };
                    let ok = app.propose_upkeep(src_group, unpin).await
                        && app
                            .propose_upkeep(group, Op::OutboxDone { id: item.id })
                            .await;
                    failed |= !ok;
                }
                if failed {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    if *app.shutdown.borrow() {
                        break;
                    }
                }
            }
            app.outbox_busy[group as usize].store(false, Ordering::Release);
        });
    }

    /// Proposes an upkeep command (these never reject); true when it was applied. Like
    /// every proposal it kicks the group's outbox, so pin releases cascade.
    pub async fn propose_upkeep(self: &Arc<Self>, group: u32, op: Op) -> bool {
        self.propose(group, op).await.is_ok()
    }

    /// The body limit of a single-request snapshot publish: 128 MiB, or the body budget when
    /// that is smaller, since a larger body could never be admitted (extensions.md §6.2).
    pub fn snapshot_request_limit(&self) -> u64 {
        let max = ursula_core::snapshot::MAX_SNAPSHOT_REQUEST_BYTES;
        match self.body_budget.limit() {
            0 => max,
            b => max.min(b),
        }
    }

    /// Reserves `bytes` in the stream's group's hot count, or answers `503 COLD_BACKPRESSURE`
    /// when they would take the group past its bound (cluster.md §6.6). A retry of a
    /// producer's accepted append is never refused for it (it adds nothing). Always admits on
    /// a node without a cold tier. Keep the reservation (`keep`) once the bytes are written.
    pub fn admit_hot(
        &self,
        key: &StreamKey,
        producer: Option<&ursula_core::command::ProducerHdr>,
        bytes: u64,
    ) -> Result<crate::tiering::HotReservation<'_>, ApiError> {
        let Some(t) = &self.tiering else {
            return Ok(crate::tiering::HotReservation::none());
        };
        let refused = t.admit(self.group_of(key), bytes);
        if refused.is_err()
            && let Some(p) = producer
        {
            let retry = self.with_stream(key, |s| {
                s.producers
                    .get(&p.id)
                    .is_some_and(|st| st.epoch == p.epoch && p.seq <= st.last_seq)
            });
            if retry == Some(true) {
                return Ok(crate::tiering::HotReservation::none());
            }
        }
        refused
    }

    /// Runs `pass` every `every` (the first right away) until shutdown.
    pub fn spawn_every<F, Fut>(self: &Arc<Self>, every: Duration, mut pass: F)
    where
        F: FnMut(Arc<App>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send,
    {
        let app = self.clone();
        tokio::spawn(async move {
            let mut stop = app.shutdown.subscribe();
            let mut tick = tokio::time::interval(every);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stop.changed() => return,
                }
                pass(app.clone()).await;
            }
        });
    }

    /// Background upkeep: lapse expired streams, deliver outboxes, release stale pins.
    pub fn spawn_upkeep(self: &Arc<Self>) {
        let app = self.clone();
        let mut stop = self.shutdown.subscribe();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                    _ = stop.changed() => break,
                }
                app.upkeep_pass().await;
            }
        });
    }

    async fn upkeep_pass(self: &Arc<Self>) {
        let now = self.now_ms();
        for group in 0..self.node.group_count() {
            self.kick_outbox(group);
            let (expired, stale_pins) = self.with_group(group, |g| {
                let expired: Vec<_> = g
                    .streams
                    .iter()
                    .filter(|(_, s)| s.lapse_due(now))
                    .map(|(k, s)| (k.clone(), s.incarnation))
                    .collect();
                let pins: Vec<_> = g
                    .streams
                    .iter()
                    .flat_map(|(k, s)| {
                        s.pins
                            .iter()
                            .filter(|(_, p)| p.deadline_ms < now)
                            .map(move |(id, p)| (k.clone(), *id, p.fork_key.clone()))
                    })
                    .collect();
                (expired, pins)
            });
            for (key, incarnation) in expired {
                self.propose_upkeep(group, Op::Expire { key, incarnation })
                    .await;
            }
            for (source, pin_id, fork_key) in stale_pins {
                let held = self
                    .with_stream(&fork_key, |f| {
                        f.fork.as_ref().is_some_and(|l| l.pin_id == pin_id)
                    })
                    .unwrap_or(false);
                if !held {
                    self.propose_upkeep(
                        group,
                        Op::Unpin {
                            key: source,
                            pin_id,
                        },
                    )
                    .await;
                }
            }
        }
    }
}
