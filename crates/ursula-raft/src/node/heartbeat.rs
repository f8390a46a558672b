//! One heartbeat clock for every group of a node.
//!
//! openraft heartbeats each group on a timer of its own, so the heartbeats one node sends a
//! peer are spread over the whole interval and rarely meet in the coalescer's queue
//! (`coalesce.rs`). Its own heartbeat is therefore off (`enable_heartbeat = false`, open.rs)
//! and this task asks every group this node leads to heartbeat at the same instant, once per
//! interval: the heartbeats to each peer then leave together, in one request.
//!
//! A group whose heartbeats are paused is skipped: a leader handing its group over waits out
//! its followers' lease that way (transfer.rs, stall.rs).

use super::*;

/// Which groups send heartbeats (all, unless a hand-over paused one).
pub(super) struct Heartbeats {
    on: Vec<AtomicBool>,
}

impl Heartbeats {
    pub(super) fn new(groups: usize) -> Self {
        Heartbeats {
            on: (0..groups).map(|_| AtomicBool::new(true)).collect(),
        }
    }

    fn is_on(&self, group: usize) -> bool {
        self.on
            .get(group)
            .is_some_and(|b| b.load(Ordering::Relaxed))
    }
}

/// Every `interval`, a heartbeat of each group this node leads (and has not paused).
pub(super) async fn run(
    rafts: Vec<Raft>,
    heartbeats: Arc<Heartbeats>,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        for (g, raft) in rafts.iter().enumerate() {
            let leads = raft.metrics().borrow().state == ServerState::Leader;
            if leads && heartbeats.is_on(g) {
                // Fails only once the group has shut down.
                let _ = raft.trigger().heartbeat().await;
            }
        }
    }
}

impl Node {
    /// Pauses or resumes the heartbeats of `group` (a hand-over lets followers' lease of this
    /// leader run out).
    pub(super) fn set_heartbeats(&self, group: u32, on: bool) {
        if let Some(b) = self.heartbeats.on.get(group as usize) {
            b.store(on, Ordering::Relaxed);
        }
    }
}
