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
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use tokio::sync::watch;
use ursula_core::{Incarnation, StreamKey};

/// What a rendered window of a stream was rendered from: readers that ask for the same
/// window of the same incarnation, seen at the same tail, get the same bytes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct FrameTag {
    pub incarnation: Incarnation,
    pub from: u64,
    pub tail: u64,
    /// The reader's window bound and encoding (opaque to the registry).
    pub batch: u64,
    pub encoding: u8,
    /// Whether the stream was closed at that tail (its last control event says so).
    pub closed: bool,
}

/// The last window rendered for a stream's live readers: the end offset it reached and its
/// bytes. Many SSE readers of one stream sit at the same position, so after a commit the
/// first of them renders the new bytes and the others send the same frame.
struct Frame {
    tag: FrameTag,
    end: u64,
    bytes: Bytes,
    /// The same window followed by the control event that every reader whose cursor is
    /// behind `end` sends with it (see [`StreamWatch::keep_chunk`]), once one reader made it.
    chunk: Option<Bytes>,
}

/// One watched stream: its change counter and its last rendered frame.
struct Entry {
    tx: watch::Sender<u64>,
    frame: Mutex<Option<Frame>>,
}

/// The readers of one group's streams.
struct Shard {
    /// Registered [`StreamWatch`]es of this group (so the state machine can skip the work).
    watching: AtomicUsize,
    /// One entry per watched stream.
    streams: Mutex<HashMap<StreamKey, Arc<Entry>>>,
}

/// Registry of live readers by stream, one shard per Raft group.
pub struct Watchers {
    shards: Vec<Shard>,
    /// Set once by [`Watchers::stop_all`]: the node is shutting down.
    stopping: AtomicBool,
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
            stopping: AtomicBool::new(false),
        })
    }

    /// Ends every wait: marks the registry as stopping and wakes every watched stream, so
    /// that each live reader sees [`StreamWatch::stopping`] and answers now. A reader that
    /// registers afterwards sees the mark before it waits (it is set before any shard is
    /// locked here, and registration takes the shard lock). Readers need no second wake-up
    /// source for shutdown, so a delivery registers one waker, not two.
    pub fn stop_all(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        for shard in &self.shards {
            Self::lock(shard)
                .values()
                .for_each(|e| e.tx.send_modify(|n| *n = n.wrapping_add(1)));
        }
    }

    fn shard(&self, group: u32) -> Option<&Shard> {
        self.shards.get(group as usize)
    }

    fn lock(shard: &Shard) -> MutexGuard<'_, HashMap<StreamKey, Arc<Entry>>> {
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
                entry: None,
                registered: false,
            };
        };
        let (rx, entry) = {
            let mut streams = Self::lock(shard);
            shard.watching.fetch_add(1, Ordering::SeqCst);
            match streams.get(key) {
                Some(e) => (e.tx.subscribe(), Arc::clone(e)),
                None => {
                    let (tx, rx) = watch::channel(0);
                    let e = Arc::new(Entry {
                        tx,
                        frame: Mutex::new(None),
                    });
                    streams.insert(key.clone(), Arc::clone(&e));
                    (rx, e)
                }
            }
        };
        StreamWatch {
            watchers: Arc::clone(self),
            group,
            key: key.clone(),
            rx: Some(rx),
            entry: Some(entry),
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
        let bump = |e: &Arc<Entry>| e.tx.send_modify(|n| *n = n.wrapping_add(1));
        if !everything && changed.is_empty() {
            return;
        }
        let streams = Self::lock(shard);
        if everything {
            streams.values().for_each(bump);
            return;
        }
        for key in changed {
            if let Some(e) = streams.get(*key) {
                bump(e);
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
    /// The stream's entry (`None` for a group that does not exist).
    entry: Option<Arc<Entry>>,
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

    /// Whether the node is shutting down ([`Watchers::stop_all`]): the reader should answer
    /// now instead of waiting. Check it before each wait and after each wake-up.
    pub fn stopping(&self) -> bool {
        self.watchers.stopping.load(Ordering::SeqCst)
    }

    /// The frame another reader of this stream rendered for `tag`, with the offset it ends
    /// at, if it is the last one rendered.
    pub fn rendered(&self, tag: &FrameTag) -> Option<(u64, Bytes)> {
        let slot = Self::slot(self.entry.as_ref()?);
        slot.as_ref()
            .filter(|f| f.tag == *tag)
            .map(|f| (f.end, f.bytes.clone()))
    }

    /// Keeps `bytes` (ending at offset `end`) as the frame for `tag`, for the other readers.
    pub fn keep_rendered(&self, tag: FrameTag, end: u64, bytes: Bytes) {
        if let Some(e) = &self.entry {
            *Self::slot(e) = Some(Frame {
                tag,
                end,
                bytes,
                chunk: None,
            });
        }
    }

    /// The whole chunk kept for `tag` by [`Self::keep_chunk`], with the offset it ends at.
    pub fn rendered_chunk(&self, tag: &FrameTag) -> Option<(u64, Bytes)> {
        let slot = Self::slot(self.entry.as_ref()?);
        let f = slot.as_ref().filter(|f| f.tag == *tag)?;
        Some((f.end, f.chunk.clone()?))
    }

    /// Keeps `chunk`, the frame kept for `tag` followed by the control event that any reader
    /// whose cursor is behind the frame's end sends with it, so that such readers send it as
    /// it is. Ignored unless the frame kept now is the one for `tag`.
    pub fn keep_chunk(&self, tag: &FrameTag, chunk: Bytes) {
        if let Some(e) = &self.entry
            && let Some(f) = Self::slot(e).as_mut().filter(|f| f.tag == *tag)
        {
            f.chunk = Some(chunk);
        }
    }

    /// The frame slot (a slot written by a reader that panicked holds a whole frame or none).
    fn slot(e: &Entry) -> MutexGuard<'_, Option<Frame>> {
        e.frame.lock().unwrap_or_else(|p| p.into_inner())
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
        drop(self.entry.take());
        if streams
            .get(&self.key)
            .is_some_and(|e| e.tx.receiver_count() == 0)
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
    async fn stop_all_wakes_every_reader_and_marks_later_ones() {
        let ws = Watchers::new(2);
        let mut wa = ws.watch(0, &key("a"));
        let mut wb = ws.watch(1, &key("b"));
        assert!(!wa.stopping());
        ws.stop_all();
        assert!(fires(&mut wa).await);
        assert!(fires(&mut wb).await);
        assert!(wa.stopping() && wb.stopping());
        // A reader registered afterwards is not woken, but sees the mark before it waits.
        let late = ws.watch(0, &key("c"));
        assert!(late.stopping());
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
    async fn readers_of_a_stream_share_its_last_rendered_frame() {
        let ws = Watchers::new(1);
        let (a, b) = (key("a"), key("b"));
        let (r1, r2, other) = (ws.watch(0, &a), ws.watch(0, &a), ws.watch(0, &b));
        let tag = FrameTag {
            incarnation: Incarnation(7),
            from: 0,
            tail: 5,
            batch: 64,
            encoding: 0,
            closed: false,
        };
        assert!(r2.rendered(&tag).is_none());
        r1.keep_rendered(tag, 5, Bytes::from_static(b"hello"));
        assert_eq!(r2.rendered(&tag), Some((5, Bytes::from_static(b"hello"))));
        // The chunk with its control event comes once one reader kept it, for that tag only.
        assert!(r2.rendered_chunk(&tag).is_none());
        r2.keep_chunk(
            &FrameTag {
                closed: true,
                ..tag
            },
            Bytes::from_static(b"x"),
        );
        assert!(r1.rendered_chunk(&tag).is_none());
        r2.keep_chunk(&tag, Bytes::from_static(b"hello+control"));
        assert_eq!(
            r1.rendered_chunk(&tag),
            Some((5, Bytes::from_static(b"hello+control")))
        );
        assert!(
            r1.rendered_chunk(&FrameTag {
                closed: true,
                ..tag
            })
            .is_none()
        );
        // Another stream, another window, another tail: nothing to share.
        assert!(other.rendered(&tag).is_none());
        assert!(r2.rendered(&FrameTag { tail: 6, ..tag }).is_none());
        assert!(r2.rendered(&FrameTag { batch: 32, ..tag }).is_none());
        // The next frame replaces it; a reader that comes later sees it.
        r2.keep_rendered(
            FrameTag {
                from: 5,
                tail: 9,
                ..tag
            },
            9,
            Bytes::from_static(b"more"),
        );
        assert!(r1.rendered(&tag).is_none());
        assert!(
            r1.rendered_chunk(&tag).is_none(),
            "a new frame drops the old chunk"
        );
        let late = ws.watch(0, &a);
        assert_eq!(
            late.rendered(&FrameTag {
                from: 5,
                tail: 9,
                ..tag
            })
            .map(|f| f.0),
            Some(9)
        );
        // Once every reader left, the stream and its frame are forgotten.
        drop((r1, r2, late));
        let again = ws.watch(0, &a);
        assert!(
            again
                .rendered(&FrameTag {
                    from: 5,
                    tail: 9,
                    ..tag
                })
                .is_none()
        );
        drop(other);
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
