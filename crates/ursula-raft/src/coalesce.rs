//! Raft RPCs of many groups to one peer, carried together.
//!
//! Every group runs its own openraft replication, so a node that leads 256 groups sends each
//! peer 256 heartbeats per heartbeat interval: measured idle, about 50 µs of CPU per RPC on
//! each side, 17 % of a core per node. The [`Coalescer`] sits between the groups and the
//! [`Transport`]: per peer, one worker takes every small frame queued for that peer and sends
//! them as one batch (`batch_wire.rs`), whose answers stream back as each completes.
//!
//! - **No frame waits for another's answer.** The peer handles a batch's frames concurrently
//!   and answers each as soon as it is done, so a heartbeat of one group never waits for
//!   another group's append (which waits for an fsync) — openraft times an append-entries
//!   out after one heartbeat interval.
//! - **Only heartbeats linger.** A frame with entries, a vote, a proposal or an empty append
//!   that carries a new commit index leaves at once, with whatever was already queued. A
//!   heartbeat may wait up to `linger` (a fiftieth of the heartbeat interval, at most 2 ms)
//!   for others to share its request; the node heartbeats all its groups at one instant
//!   (`node/heartbeat.rs`), so they arrive within that. A group's replication to a peer is
//!   sequential, so a write to a group whose heartbeat lingers waits that long at most.
//! - **Large frames travel alone** (over [`MAX_BATCHED_FRAME`]: snapshot chunks, big
//!   appends), so a batch's small frames are not stuck behind their bytes.
//! - At most [`MAX_IN_FLIGHT`] batches per peer are on the wire at once; while all are, new
//!   frames queue and go out together in the next one.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use crate::batch_wire::MAX_BATCH_FRAMES;
use crate::network::{RpcFuture, Transport, TransportError};
use crate::types::NodeId;

/// Frames larger than this are sent on their own.
pub const MAX_BATCHED_FRAME: usize = 64 << 10;
/// Bytes of frames one batch carries at most.
const MAX_BATCH_BYTES: usize = 1 << 20;
/// Batches on the wire to one peer at once.
pub const MAX_IN_FLIGHT: usize = 32;
/// The longest a heartbeat waits for company.
const MAX_LINGER: Duration = Duration::from_millis(2);

type Reply = oneshot::Sender<Result<Vec<u8>, TransportError>>;

struct Item {
    frame: Vec<u8>,
    timeout: Duration,
    linger: bool,
    reply: Reply,
}

/// How many requests carried how many frames (the server's metrics).
#[derive(Debug, Default)]
pub struct CoalesceStats {
    /// Requests that carried two frames or more.
    pub batches: AtomicU64,
    /// Frames those requests carried.
    pub batched_frames: AtomicU64,
    /// Frames that went in a request of their own.
    pub single_frames: AtomicU64,
}

/// Queues each peer's small frames and sends them in batches (see the module docs).
pub struct Coalescer {
    inner: Arc<dyn Transport>,
    queues: HashMap<NodeId, mpsc::UnboundedSender<Item>>,
    stats: Arc<CoalesceStats>,
}

impl Coalescer {
    /// One worker per peer of `peers`; must be called inside a tokio runtime. The workers
    /// stop when the coalescer is dropped.
    pub fn new(
        inner: Arc<dyn Transport>,
        peers: impl IntoIterator<Item = NodeId>,
        heartbeat: Duration,
    ) -> Self {
        let linger = (heartbeat / 50).min(MAX_LINGER);
        let stats = Arc::new(CoalesceStats::default());
        let queues = peers
            .into_iter()
            .map(|peer| {
                let (tx, rx) = mpsc::unbounded_channel();
                let worker = Worker {
                    inner: Arc::clone(&inner),
                    target: peer,
                    linger,
                    slots: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
                    stats: Arc::clone(&stats),
                };
                tokio::spawn(worker.run(rx));
                (peer, tx)
            })
            .collect();
        Coalescer {
            inner,
            queues,
            stats,
        }
    }

    pub fn stats(&self) -> &CoalesceStats {
        &self.stats
    }

    /// Sends `frame` to `target`, in a batch where it is small; `linger` lets it wait briefly
    /// for company (heartbeats).
    pub async fn call(
        &self,
        target: NodeId,
        frame: Vec<u8>,
        timeout: Duration,
        linger: bool,
    ) -> Result<Vec<u8>, TransportError> {
        let queue = match self.queues.get(&target) {
            Some(q) if frame.len() <= MAX_BATCHED_FRAME => q,
            _ => {
                self.stats.single_frames.fetch_add(1, Ordering::Relaxed);
                return self.inner.send(target, frame, timeout).await;
            }
        };
        let (reply, answer) = oneshot::channel();
        let item = Item {
            frame,
            timeout,
            linger,
            reply,
        };
        if queue.send(item).is_err() {
            return Err(TransportError::Unreachable(
                target,
                "transport stopped".into(),
            ));
        }
        match tokio::time::timeout(timeout, answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(TransportError::Failed(target, "answer lost".into())),
            Err(_) => Err(TransportError::Failed(target, "timed out".into())),
        }
    }
}

impl Transport for Coalescer {
    fn send(&self, target: NodeId, frame: Vec<u8>, timeout: Duration) -> RpcFuture<'_> {
        Box::pin(self.call(target, frame, timeout, false))
    }
}

/// The frames a worker is gathering into one request.
#[derive(Default)]
struct Pending {
    items: Vec<Item>,
    bytes: usize,
    /// When to send, if every frame so far may linger; `None`: send now.
    until: Option<Instant>,
}

impl Pending {
    fn push(&mut self, item: Item, linger: Duration) {
        if self.items.is_empty() && item.linger {
            self.until = Some(Instant::now() + linger);
        } else if !item.linger {
            self.until = None;
        }
        self.bytes += item.frame.len();
        self.items.push(item);
    }

    fn full(&self) -> bool {
        self.items.len() >= MAX_BATCH_FRAMES || self.bytes >= MAX_BATCH_BYTES
    }
}

struct Worker {
    inner: Arc<dyn Transport>,
    target: NodeId,
    linger: Duration,
    slots: Arc<Semaphore>,
    stats: Arc<CoalesceStats>,
}

impl Worker {
    async fn run(self, mut queue: mpsc::UnboundedReceiver<Item>) {
        while let Some(first) = queue.recv().await {
            let mut batch = Pending::default();
            batch.push(first, self.linger);
            loop {
                while !batch.full() {
                    let Ok(item) = queue.try_recv() else { break };
                    batch.push(item, self.linger);
                }
                let Some(deadline) = batch.until.filter(|_| !batch.full()) else {
                    break;
                };
                tokio::select! {
                    item = queue.recv() => match item {
                        Some(item) => batch.push(item, self.linger),
                        None => break,
                    },
                    _ = tokio::time::sleep_until(deadline) => break,
                }
            }
            let items = batch.items;
            let Ok(slot) = Arc::clone(&self.slots).acquire_owned().await else {
                return;
            };
            let inner = Arc::clone(&self.inner);
            let stats = Arc::clone(&self.stats);
            let target = self.target;
            tokio::spawn(async move {
                send(&*inner, target, items, &stats).await;
                drop(slot);
            });
        }
    }
}

/// Sends `items` (alone or as one batch) and hands every answer to its caller.
async fn send(inner: &dyn Transport, target: NodeId, items: Vec<Item>, stats: &CoalesceStats) {
    if items.len() == 1 {
        stats.single_frames.fetch_add(1, Ordering::Relaxed);
        let Some(item) = items.into_iter().next() else {
            return;
        };
        let _ = item
            .reply
            .send(inner.send(target, item.frame, item.timeout).await);
        return;
    }
    stats.batches.fetch_add(1, Ordering::Relaxed);
    stats
        .batched_frames
        .fetch_add(items.len() as u64, Ordering::Relaxed);
    let timeout = items.iter().map(|i| i.timeout).max().unwrap_or_default();
    let mut replies = Vec::with_capacity(items.len());
    let mut frames = Vec::with_capacity(items.len());
    for item in items {
        frames.push(item.frame);
        replies.push(Some(item.reply));
    }
    let ended = {
        let mut on_answer = |i: usize, answer: Result<Vec<u8>, TransportError>| {
            if let Some(reply) = replies.get_mut(i).and_then(Option::take) {
                let _ = reply.send(answer);
            }
        };
        inner
            .send_batch(target, frames, timeout, &mut on_answer)
            .await
    };
    let why = match ended {
        Err(e) => e,
        Ok(()) => TransportError::Failed(target, "the batch ended without this answer".into()),
    };
    for reply in replies.into_iter().flatten() {
        let _ = reply.send(Err(why.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::{BatchFuture, OnAnswer};
    use std::sync::Mutex;

    /// Answers each frame with itself, after the delay its first byte names (in ms), and
    /// records how the frames were grouped into requests.
    #[derive(Default)]
    struct Echo {
        requests: Mutex<Vec<Vec<Vec<u8>>>>,
        fail_batches: bool,
    }

    fn delay_of(frame: &[u8]) -> Duration {
        Duration::from_millis(u64::from(frame.first().copied().unwrap_or(0)))
    }

    impl Transport for Echo {
        fn send(&self, _: NodeId, frame: Vec<u8>, _: Duration) -> RpcFuture<'_> {
            self.requests.lock().unwrap().push(vec![frame.clone()]);
            Box::pin(async move {
                tokio::time::sleep(delay_of(&frame)).await;
                Ok(frame)
            })
        }

        fn send_batch<'a>(
            &'a self,
            target: NodeId,
            frames: Vec<Vec<u8>>,
            _: Duration,
            on_answer: &'a mut OnAnswer<'a>,
        ) -> BatchFuture<'a> {
            self.requests.lock().unwrap().push(frames.clone());
            Box::pin(async move {
                if self.fail_batches {
                    return Err(TransportError::Failed(target, "connection reset".into()));
                }
                use futures::StreamExt;
                let mut answers: futures::stream::FuturesUnordered<_> = frames
                    .into_iter()
                    .enumerate()
                    .map(|(i, f)| async move {
                        tokio::time::sleep(delay_of(&f)).await;
                        (i, f)
                    })
                    .collect();
                while let Some((i, f)) = answers.next().await {
                    on_answer(i, Ok(f));
                }
                Ok(())
            })
        }
    }

    const HEARTBEAT: Duration = Duration::from_millis(100);
    const TIMEOUT: Duration = Duration::from_secs(5);

    fn coalescer(echo: &Arc<Echo>) -> Arc<Coalescer> {
        Arc::new(Coalescer::new(
            Arc::clone(echo) as Arc<dyn Transport>,
            [2],
            HEARTBEAT,
        ))
    }

    /// Sends `frame` (linger as given) and returns its answer and when it came.
    fn call(
        c: &Arc<Coalescer>,
        frame: Vec<u8>,
        linger: bool,
    ) -> tokio::task::JoinHandle<(Result<Vec<u8>, TransportError>, Duration)> {
        let c = Arc::clone(c);
        let start = Instant::now();
        tokio::spawn(async move {
            let r = c.call(2, frame, TIMEOUT, linger).await;
            (r, start.elapsed())
        })
    }

    #[tokio::test(start_paused = true)]
    async fn heartbeats_of_many_groups_share_one_request() {
        let echo = Arc::new(Echo::default());
        let c = coalescer(&echo);
        let calls: Vec<_> = (0..10u8).map(|i| call(&c, vec![0, i], true)).collect();
        for (i, h) in calls.into_iter().enumerate() {
            let (answer, took) = h.await.unwrap();
            assert_eq!(answer.unwrap(), vec![0, i as u8]);
            assert!(took <= MAX_LINGER, "{took:?}");
        }
        let requests = echo.requests.lock().unwrap();
        assert_eq!(requests.len(), 1, "{requests:?}");
        assert_eq!(requests[0].len(), 10);
        assert_eq!(c.stats().batches.load(Ordering::Relaxed), 1);
        assert_eq!(c.stats().batched_frames.load(Ordering::Relaxed), 10);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_heartbeat_waits_one_linger_and_an_append_does_not_wait() {
        let echo = Arc::new(Echo::default());
        let c = coalescer(&echo);
        let (answer, took) = call(&c, vec![0, 1], true).await.unwrap();
        assert_eq!(answer.unwrap(), vec![0, 1]);
        assert_eq!(took, HEARTBEAT / 50);
        let (answer, took) = call(&c, vec![0, 2], false).await.unwrap();
        assert_eq!(answer.unwrap(), vec![0, 2]);
        assert_eq!(took, Duration::ZERO);
        // A heartbeat queued just before an append leaves with it, at once.
        let hb = call(&c, vec![0, 3], true);
        tokio::task::yield_now().await;
        let append = call(&c, vec![0, 4], false);
        assert_eq!(hb.await.unwrap().1, Duration::ZERO);
        assert_eq!(append.await.unwrap().1, Duration::ZERO);
        assert_eq!(echo.requests.lock().unwrap().last().unwrap().len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_frame_does_not_hold_back_the_others_of_its_batch() {
        let echo = Arc::new(Echo::default());
        let c = coalescer(&echo);
        // First byte = how long the peer takes to answer, in ms (an fsync-bound append).
        let slow = call(&c, vec![250, 0], true);
        tokio::task::yield_now().await;
        let fast = call(&c, vec![0, 1], true);
        let (answer, took) = fast.await.unwrap();
        assert_eq!(answer.unwrap(), vec![0, 1]);
        assert_eq!(took, HEARTBEAT / 50);
        let (answer, took) = slow.await.unwrap();
        assert_eq!(answer.unwrap(), vec![250, 0]);
        assert_eq!(took, HEARTBEAT / 50 + Duration::from_millis(250));
        assert_eq!(echo.requests.lock().unwrap().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn large_frames_travel_alone_and_unknown_peers_go_straight_through() {
        let echo = Arc::new(Echo::default());
        let c = coalescer(&echo);
        let big = vec![0u8; MAX_BATCHED_FRAME + 1];
        let hb = call(&c, vec![0, 1], true);
        let (answer, took) = call(&c, big.clone(), true).await.unwrap();
        assert_eq!(answer.unwrap().len(), big.len());
        assert_eq!(took, Duration::ZERO);
        hb.await.unwrap().0.unwrap();
        let r = c.call(9, vec![0, 9], TIMEOUT, true).await.unwrap();
        assert_eq!(r, vec![0, 9]);
        let requests = echo.requests.lock().unwrap();
        assert!(requests.iter().all(|r| r.len() == 1), "{requests:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_batch_fails_every_frame_with_its_error() {
        let echo = Arc::new(Echo {
            fail_batches: true,
            ..Echo::default()
        });
        let c = coalescer(&echo);
        let calls: Vec<_> = (0..3u8).map(|i| call(&c, vec![0, i], true)).collect();
        for h in calls {
            let err = h.await.unwrap().0.unwrap_err();
            assert!(err.to_string().contains("connection reset"), "{err}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_gives_up_at_its_own_timeout() {
        let echo = Arc::new(Echo::default());
        let c = coalescer(&echo);
        let start = Instant::now();
        // The peer would take 200 ms; the caller allows 50.
        let err = c
            .call(2, vec![200, 0], Duration::from_millis(50), false)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("timed out"), "{err}");
        assert_eq!(start.elapsed(), Duration::from_millis(50));
    }
}
