//! An in-process network for cluster tests: every node of one process, with faults.
//!
//! Frames go through the same encoding as on the real cluster plane and are handed to the
//! target's [`Node::handle_rpc`]. A test can cut links (partitions, an isolated node), delay
//! every message, and drop a share of requests or answers (a dropped answer means the request
//! *was* handled, as when a connection breaks after sending). Batches (`coalesce.rs`) travel
//! encoded too, and a cut or lost batch loses every frame in it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::StreamExt;

use crate::batch_wire::{self, AnswerReader};
use crate::network::{BatchFuture, OnAnswer, RpcFuture, Transport, TransportError};
use crate::node::Node;
use crate::types::NodeId;
use crate::wire;

#[derive(Default)]
struct Faults {
    /// Directed links that carry nothing.
    cut: HashSet<(NodeId, NodeId)>,
    delay: Duration,
    /// Per mille of requests (and, separately, of answers) lost.
    drop_per_mille: u32,
    rng: u64,
}

impl Faults {
    fn roll(&mut self) -> bool {
        if self.drop_per_mille == 0 {
            return false;
        }
        // xorshift64*: deterministic per seed, no dependency.
        let mut x = self.rng.max(1);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) % 1000 < u64::from(self.drop_per_mille)
    }
}

#[derive(Default)]
struct Inner {
    nodes: Mutex<HashMap<NodeId, Weak<Node>>>,
    faults: Mutex<Faults>,
    /// Install-snapshot chunks handed to each node.
    snapshot_chunks: Mutex<HashMap<NodeId, u64>>,
}

/// The network shared by the nodes of one test.
#[derive(Clone, Default)]
pub struct TestNetwork {
    inner: Arc<Inner>,
}

struct TestTransport {
    from: NodeId,
    inner: Arc<Inner>,
}

impl TestNetwork {
    pub fn new() -> Self {
        Self::default()
    }

    /// The transport node `from` sends with.
    pub fn transport(&self, from: NodeId) -> Arc<dyn Transport> {
        Arc::new(TestTransport {
            from,
            inner: Arc::clone(&self.inner),
        })
    }

    /// Makes `node` reachable (after [`Node::open`]).
    pub fn register(&self, node: &Arc<Node>) {
        self.lock_nodes()
            .insert(node.node_id(), Arc::downgrade(node));
    }

    /// Makes node `id` unreachable, as if its process died.
    pub fn unregister(&self, id: NodeId) {
        self.lock_nodes().remove(&id);
    }

    /// Splits the nodes into sides that cannot reach each other (nodes not named keep every
    /// link). Replaces any earlier cuts.
    pub fn partition(&self, sides: &[&[NodeId]]) {
        let mut f = self.lock_faults();
        f.cut.clear();
        for (i, a) in sides.iter().enumerate() {
            for (j, b) in sides.iter().enumerate() {
                if i != j {
                    for &x in *a {
                        for &y in *b {
                            f.cut.insert((x, y));
                        }
                    }
                }
            }
        }
    }

    /// Cuts node `id` off from `others`.
    pub fn isolate(&self, id: NodeId, others: &[NodeId]) {
        let mut f = self.lock_faults();
        for &o in others {
            f.cut.insert((id, o));
            f.cut.insert((o, id));
        }
    }

    /// Restores every link (delay and loss stay as set).
    pub fn heal(&self) {
        self.lock_faults().cut.clear();
    }

    /// Delays every request by `delay` (and so every answer by as much again).
    pub fn set_delay(&self, delay: Duration) {
        self.lock_faults().delay = delay;
    }

    /// Loses `per_mille` of requests and of answers, drawn from `seed`.
    pub fn set_loss(&self, per_mille: u32, seed: u64) {
        let mut f = self.lock_faults();
        f.drop_per_mille = per_mille.min(1000);
        f.rng = seed;
    }

    /// How many install-snapshot chunks reached node `id` (a cut or lost request does not
    /// count), so a test can tell a catch-up by snapshot from one by log.
    pub fn snapshot_chunks_to(&self, id: NodeId) -> u64 {
        let counts = self.inner.snapshot_chunks.lock();
        *counts
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .unwrap_or(&0)
    }

    fn lock_nodes(&self) -> std::sync::MutexGuard<'_, HashMap<NodeId, Weak<Node>>> {
        self.inner.nodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_faults(&self) -> std::sync::MutexGuard<'_, Faults> {
        self.inner.faults.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Inner {
    /// Whether the link is cut, a random loss, and the delay.
    fn fate(&self, from: NodeId, to: NodeId) -> (bool, Duration) {
        let mut f = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        let lost = f.cut.contains(&(from, to)) || f.roll();
        (lost, f.delay)
    }

    fn node(&self, id: NodeId) -> Option<Arc<Node>> {
        self.nodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .and_then(Weak::upgrade)
    }
}

impl Inner {
    /// Counts the install-snapshot chunks among `frames`, on their way into node `to`.
    fn count_snapshots<'f>(&self, to: NodeId, frames: impl IntoIterator<Item = &'f [u8]>) {
        let n = frames
            .into_iter()
            .filter(|f| wire::request_kind(f) == Some(wire::KIND_SNAPSHOT))
            .count() as u64;
        if n > 0 {
            let mut counts = self
                .snapshot_chunks
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            *counts.entry(to).or_default() += n;
        }
    }
}

impl TestTransport {
    /// The way out: the link's delay, then the target node, unless the link is cut, the
    /// request is lost or the node is not running.
    async fn reach(&self, target: NodeId) -> Result<Arc<Node>, TransportError> {
        let (lost, delay) = self.inner.fate(self.from, target);
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if lost {
            return Err(TransportError::Unreachable(target, "link down".into()));
        }
        self.inner
            .node(target)
            .ok_or_else(|| TransportError::Unreachable(target, "not running".into()))
    }
}

impl Transport for TestTransport {
    fn send(&self, target: NodeId, frame: Vec<u8>, timeout: Duration) -> RpcFuture<'_> {
        Box::pin(async move {
            let work = async {
                let node = self.reach(target).await?;
                self.inner.count_snapshots(target, [frame.as_slice()]);
                let answer = node
                    .handle_rpc(&frame)
                    .await
                    .map_err(|e| TransportError::Failed(target, e))?;
                drop(node);
                let (lost, delay) = self.inner.fate(target, self.from);
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                if lost {
                    return Err(TransportError::Failed(target, "answer lost".into()));
                }
                Ok(answer)
            };
            tokio::time::timeout(timeout, work)
                .await
                .unwrap_or_else(|_| Err(TransportError::Failed(target, "timed out".into())))
        })
    }

    fn send_batch<'a>(
        &'a self,
        target: NodeId,
        frames: Vec<Vec<u8>>,
        timeout: Duration,
        on_answer: &'a mut OnAnswer<'a>,
    ) -> BatchFuture<'a> {
        Box::pin(async move {
            let work = async {
                let node = self.reach(target).await?;
                self.inner
                    .count_snapshots(target, frames.iter().map(Vec::as_slice));
                let batch = bytes::Bytes::from(batch_wire::encode_batch(&frames));
                let answers = node
                    .handle_batch(batch)
                    .map_err(|e| TransportError::Failed(target, e))?;
                let mut answers = std::pin::pin!(answers);
                let mut reader = AnswerReader::default();
                let mut first = true;
                while let Some(chunk) = answers.next().await {
                    if std::mem::take(&mut first) {
                        // The way back: one delay for the whole answer stream.
                        let (_, delay) = self.inner.fate(target, self.from);
                        if !delay.is_zero() {
                            tokio::time::sleep(delay).await;
                        }
                    }
                    reader.push(&chunk);
                    while let Some((i, answer)) = reader
                        .next_answer()
                        .map_err(|e| TransportError::Failed(target, e))?
                    {
                        let (lost, _) = self.inner.fate(target, self.from);
                        let answer = if lost {
                            Err("answer lost".to_string())
                        } else {
                            answer
                        };
                        on_answer(i, answer.map_err(|e| TransportError::Failed(target, e)));
                    }
                }
                Ok(())
            };
            tokio::time::timeout(timeout, work)
                .await
                .unwrap_or_else(|_| Err(TransportError::Failed(target, "timed out".into())))
        })
    }
}
