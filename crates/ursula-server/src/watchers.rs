//! Per-stream wake-ups for live readers (long-poll and SSE).
//!
//! A reader registers a [`StreamWatch`] for its stream *before* it looks at the state, then
//! waits on it; the state machine reports, after each applied batch, which streams the batch
//! may have changed ([`ursula_raft::ApplyListener`]), and only their readers wake. Commits to
//! other streams of the same group wake nobody, so thousands of readers spread over many
//! streams cost nothing per unrelated append. A change to the whole group (a bucket purge, a
//! snapshot install) wakes every watched stream of it, through the same one channel per
//! stream: a waiting reader is registered with one sender only.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;
use ursula_core::StreamKey;

/// The readers of one group's streams.
struct Shard {
    /// Registered [`StreamWatch`]es of this group (so the state machine can skip the work).
    watching: AtomicUsize,
    /// One sender per watched stream; the value is a change counter.
    streams: Mutex<HashMap<StreamKey, watch::Sender<u64>>>,
}

/// Registry of live readers by stream, one shard per Raft group.
pub struct Watchers {
    shards: Vec<Shard>,
}

impl Watchers {
    pub fn new(groups: u32) -> Arc<Self> {
        Arc::new(Watchers {
            shards: (0..groups)
                .map(|_| Shard {
                    watching: AtomicUsize::new(0),
                    streams: Mutex::new(HashMap::new()),
                })
                .collect(),
        })
    }

    fn shard(&self, group: u32) -> Option<&Shard> {
        self.shards.get(group as usize)
    }

    fn lock(shard: &Shard) -> MutexGuard<'_, HashMap<StreamKey, watch::Sender<u64>>> {
        shard.streams.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts watching `key` (in `group`): every change applied after this call wakes
    /// [`StreamWatch::changed`]. Register before reading the state, then wait.
    pub fn watch(self: &Arc<Self>, group: u32, key: &StreamKey) -> StreamWatch {
        let Some(shard) = self.shard(group) else {
            // No such group: a watch that never fires (the caller's own deadline ends it).
            return StreamWatch {
                watchers: Arc::clone(self),
                group,
                key: key.clone(),
                rx: Some(watch::channel(0).1),
                registered: false,
            };
        };
        let rx = {
            let mut streams = Self::lock(shard);
            shard.watching.fetch_add(1, Ordering::SeqCst);
            match streams.get(key) {
                Some(tx) => tx.subscribe(),
                None => {
                    let (tx, rx) = watch::channel(0);
                    streams.insert(key.clone(), tx);
                    rx
                }
            }
        };
        StreamWatch {
            watchers: Arc::clone(self),
            group,
            key: key.clone(),
            rx: Some(rx),
            registered: true,
        }
    }

    /// Streams with at least one live reader, over all groups (a metric).
    pub fn watched_streams(&self) -> usize {
        self.shards.iter().map(|s| Self::lock(s).len()).sum()
    }
}

impl ursula_raft::ApplyListener for Watchers {
    fn wanted(&self, group: u32) -> bool {
        self.shard(group)
            .is_some_and(|s| s.watching.load(Ordering::SeqCst) > 0)
    }

    fn applied(&self, group: u32, changed: &[&StreamKey], everything: bool) {
        let Some(shard) = self.shard(group) else {
            return;
        };
        let bump = |tx: &watch::Sender<u64>| tx.send_modify(|n| *n = n.wrapping_add(1));
        if !everything && changed.is_empty() {
            return;
        }
        let streams = Self::lock(shard);
        if everything {
            streams.values().for_each(bump);
            return;
        }
        for key in changed {
            if let Some(tx) = streams.get(*key) {
                bump(tx);
            }
        }
    }
}

/// One reader's registration; dropping it unregisters (and forgets the stream once nobody
/// else watches it).
pub struct StreamWatch {
    watchers: Arc<Watchers>,
    group: u32,
    key: StreamKey,
    /// `None` only while being dropped (it is released under the shard lock).
    rx: Option<watch::Receiver<u64>>,
    registered: bool,
}

impl StreamWatch {
    /// Waits until the stream may have changed since registration or the previous call.
    /// Cancel-safe.
    pub async fn changed(&mut self) {
        let Some(rx) = self.rx.as_mut() else {
            return std::future::pending().await;
        };
        // The sender lives in the registry as long as a receiver does; an error would mean
        // it was dropped anyway, and then nothing more can change.
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for StreamWatch {
    fn drop(&mut self) {
        if !self.registered {
            return;
        }
        let Some(shard) = self.watchers.shard(self.group) else {
            return;
        };
        let mut streams = Watchers::lock(shard);
        shard.watching.fetch_sub(1, Ordering::SeqCst);
        // Release our receiver under the lock, so that of two readers leaving at once the
        // second always sees the first gone, and the last one removes the entry.
        drop(self.rx.take());
        if streams
            .get(&self.key)
            .is_some_and(|tx| tx.receiver_count() == 0)
        {
            streams.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use ursula_raft::ApplyListener;

    fn key(s: &str) -> StreamKey {
        StreamKey::new("b", s)
    }

    async fn fires(w: &mut StreamWatch) -> bool {
        tokio::time::timeout(Duration::from_millis(50), w.changed())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn wakes_only_the_changed_stream() {
        let ws = Watchers::new(2);
        let (a, b) = (key("a"), key("b"));
        let mut wa = ws.watch(1, &a);
        let mut wb = ws.watch(1, &b);
        assert!(ws.wanted(1));
        assert!(!ws.wanted(0));
        ws.applied(1, &[&a], false);
        assert!(fires(&mut wa).await);
        assert!(!fires(&mut wb).await);
        // A change before the wait is not lost.
        ws.applied(1, &[&b, &b], false);
        assert!(fires(&mut wb).await);
        assert!(!fires(&mut wb).await, "consumed");
        ws.applied(1, &[], true);
        assert!(fires(&mut wa).await);
        assert!(fires(&mut wb).await);
    }

    #[tokio::test]
    async fn last_reader_leaving_forgets_the_stream() {
        let ws = Watchers::new(1);
        let a = key("a");
        let w1 = ws.watch(0, &a);
        let w2 = ws.watch(0, &a);
        assert_eq!(ws.watched_streams(), 1);
        drop(w1);
        assert_eq!(ws.watched_streams(), 1);
        drop(w2);
        assert_eq!(ws.watched_streams(), 0);
        assert!(!ws.wanted(0));
        // Readers of one stream leaving at the same moment on different threads.
        for _ in 0..200 {
            let a1 = ws.watch(0, &a);
            let a2 = ws.watch(0, &a);
            let t = std::thread::spawn(move || drop(a1));
            drop(a2);
            t.join().unwrap();
        }
        assert_eq!(ws.watched_streams(), 0, "an entry outlived its readers");
        // Unknown group: never fires, never panics.
        let mut w = ws.watch(7, &a);
        assert!(!fires(&mut w).await);
    }
}
