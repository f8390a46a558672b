//! Usage metering (cluster.md §12.8, `--usage-log`): counters per bucket, principal and class,
//! drained every `--usage-flush-secs` into one JSON line of a file. Edge telemetry: a node's
//! `/__ursula/usage` is the truth of committed writes.
//!
//! A batch is `{sequence, window_start_unix_ms, window_end_unix_ms, records}`; sequences rise
//! by one per batch written. A window with no request writes nothing. When the file cannot be
//! written, batches wait (at most 64; past that the two oldest merge, keeping the earlier
//! sequence and the wider window) and go out, in order, with the next flush that succeeds.
//! Counting takes one short lock per request, and one per 64 KiB of its answer and when the
//! answer ends; it never waits on the file.

use crate::answer::Body;
use crate::classify::Class;
use crate::policy::Principal;
use serde_json::{Value, json};
use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

const MAX_QUEUED: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    pub bucket: String,
    pub principal: Option<Principal>,
    pub class: Class,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Counts {
    requests: u64,
    request_bytes: u64,
    response_bytes: u64,
    chunks: u64,
}

impl Counts {
    fn add(&mut self, o: Counts) {
        self.requests += o.requests;
        self.request_bytes += o.request_bytes;
        self.response_bytes += o.response_bytes;
        self.chunks += o.chunks;
    }
}

struct Batch {
    sequence: u64,
    start_ms: u64,
    end_ms: u64,
    records: HashMap<Key, Counts>,
}

impl Batch {
    fn line(&self) -> String {
        let mut records: Vec<Value> = self
            .records
            .iter()
            .map(|(k, c)| {
                let mut r = json!({
                    "bucket": k.bucket,
                    "issuer": k.principal.as_ref().map(|p| &p.issuer),
                    "subject": k.principal.as_ref().map(|p| &p.subject),
                    "class": k.class.name(),
                    "requests": c.requests,
                    "response_bytes": c.response_bytes,
                });
                if k.class == Class::Append {
                    r["request_bytes"] = c.request_bytes.into();
                    r["chunks"] = c.chunks.into();
                }
                r
            })
            .collect();
        records.sort_by_key(|r| r.to_string());
        json!({
            "sequence": self.sequence,
            "window_start_unix_ms": self.start_ms,
            "window_end_unix_ms": self.end_ms,
            "records": records,
        })
        .to_string()
    }
}

struct State {
    window_start_ms: u64,
    counts: HashMap<Key, Counts>,
    queued: VecDeque<Batch>,
    next_sequence: u64,
}

pub struct Usage {
    path: PathBuf,
    chunk_bytes: Option<u64>,
    state: Mutex<State>,
}

/// Bytes an answer sent, added to the counters every [`METER_EVERY`] bytes and when the
/// answer ends: a long SSE answer shows in the windows it spans, without a lock per frame.
struct Meter {
    usage: Arc<Usage>,
    key: Key,
    pending: u64,
}

const METER_EVERY: u64 = 64 << 10;

impl Meter {
    fn sent(&mut self, n: u64) {
        self.pending += n;
        if self.pending >= METER_EVERY {
            self.settle();
        }
    }

    fn settle(&mut self) {
        let c = Counts {
            response_bytes: std::mem::take(&mut self.pending),
            ..Counts::default()
        };
        self.usage.add(self.key.clone(), c);
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        if self.pending > 0 {
            self.settle();
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Usage {
    pub fn new(path: PathBuf, chunk_bytes: Option<u64>) -> Usage {
        Usage {
            path,
            chunk_bytes: chunk_bytes.filter(|n| *n > 0),
            state: Mutex::new(State {
                window_start_ms: now_ms(),
                counts: HashMap::new(),
                queued: VecDeque::new(),
                next_sequence: 1,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn add(&self, key: Key, c: Counts) {
        self.lock().counts.entry(key).or_default().add(c);
    }

    /// Counts a request of `request_bytes` body bytes; its answer's bytes are counted as they
    /// are sent ([`Usage::metered`]).
    pub fn request(&self, key: &Key, request_bytes: u64) {
        let append = key.class == Class::Append;
        let chunks = match self.chunk_bytes {
            Some(unit) if append => request_bytes.div_ceil(unit).max(1),
            _ => 0,
        };
        let c = Counts {
            requests: 1,
            request_bytes: if append { request_bytes } else { 0 },
            chunks,
            ..Counts::default()
        };
        self.add(key.clone(), c);
    }

    /// `body`, whose bytes are added to `key`'s `response_bytes` as they go out.
    pub fn metered(self: &Arc<Self>, key: Key, body: Body) -> Body {
        use futures::StreamExt;
        use http_body_util::{BodyExt, StreamBody};
        let meter = Meter {
            usage: Arc::clone(self),
            key,
            pending: 0,
        };
        // The meter lives in the stream's state: dropped when the answer ends or the client
        // goes away, it counts what was left.
        let frames = futures::stream::unfold(Some((body, meter)), |state| async move {
            let (mut body, mut meter) = state?;
            let frame = body.frame().await?;
            if let Some(d) = frame.as_ref().ok().and_then(|f| f.data_ref()) {
                meter.sent(d.len() as u64);
            }
            Some((frame, Some((body, meter))))
        });
        BodyExt::boxed_unsync(StreamBody::new(frames.boxed()))
    }

    /// Closes the window and appends every batch waiting, in order; a batch that cannot be
    /// written waits for the next flush.
    pub fn flush(&self) {
        let lines = {
            let mut s = self.lock();
            let end = now_ms();
            if !s.counts.is_empty() {
                let batch = Batch {
                    sequence: s.next_sequence,
                    start_ms: s.window_start_ms,
                    end_ms: end,
                    records: std::mem::take(&mut s.counts),
                };
                s.next_sequence += 1;
                s.queued.push_back(batch);
                while s.queued.len() > MAX_QUEUED {
                    merge_oldest(&mut s.queued);
                }
            }
            s.window_start_ms = end;
            s.queued.iter().map(Batch::line).collect::<Vec<String>>()
        };
        if lines.is_empty() {
            return;
        }
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .and_then(|mut f| {
                let mut text = lines.join("\n");
                text.push('\n');
                f.write_all(text.as_bytes())
            });
        match written {
            // One task flushes, so the queue's front is what was just written.
            Ok(()) => {
                let mut s = self.lock();
                let n = lines.len().min(s.queued.len());
                s.queued.drain(..n);
            }
            Err(e) => tracing::warn!(
                path = %self.path.display(),
                error = %e,
                queued = lines.len(),
                "usage log not written; the batches wait for the next flush"
            ),
        }
    }
}

/// Merges the two oldest batches: the earlier sequence, the wider window, summed counts.
fn merge_oldest(q: &mut VecDeque<Batch>) {
    let (Some(a), Some(b)) = (q.pop_front(), q.pop_front()) else {
        return;
    };
    let mut records = a.records;
    for (k, c) in b.records {
        records.entry(k).or_default().add(c);
    }
    q.push_front(Batch {
        sequence: a.sequence.min(b.sequence),
        start_ms: a.start_ms.min(b.start_ms),
        end_ms: a.end_ms.max(b.end_ms),
        records,
    });
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    fn key(class: Class) -> Key {
        Key {
            bucket: "tenant-a".to_owned(),
            principal: Some(Principal {
                issuer: "https://issuer.example".to_owned(),
                subject: "user-1".to_owned(),
            }),
            class,
        }
    }

    fn lines(path: &std::path::Path) -> Vec<Value> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn windows_become_numbered_lines_and_a_failed_write_waits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usage.jsonl");
        let u = Usage::new(path.clone(), Some(1000));
        u.request(&key(Class::Append), 2500);
        u.request(&key(Class::Append), 0);
        u.request(&key(Class::Read), 0);
        u.flush();
        u.flush(); // an empty window writes nothing
        let got = lines(&path);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0]["sequence"], 1);
        let append = got[0]["records"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["class"] == "append")
            .unwrap()
            .clone();
        assert_eq!(append["requests"], 2);
        assert_eq!(append["request_bytes"], 2500);
        assert_eq!(append["chunks"], 3 + 1);
        assert_eq!(append["subject"], "user-1");

        // The file cannot be written: batches wait, then go out in order.
        let blocked = Usage::new(dir.path().join("missing-dir/usage.jsonl"), None);
        blocked.request(&key(Class::Read), 0);
        blocked.flush();
        blocked.request(&key(Class::Admin), 0);
        blocked.flush();
        assert_eq!(blocked.lock().queued.len(), 2);
        std::fs::create_dir(dir.path().join("missing-dir")).unwrap();
        blocked.flush();
        let got = lines(&dir.path().join("missing-dir/usage.jsonl"));
        let seqs: Vec<u64> = got
            .iter()
            .map(|b| b["sequence"].as_u64().unwrap())
            .collect();
        assert_eq!(seqs, vec![1, 2]);
        assert!(blocked.lock().queued.is_empty());
    }

    #[tokio::test]
    async fn answer_bytes_are_counted_every_64_kib_and_at_the_end() {
        use http_body_util::{BodyExt, StreamBody};
        let dir = tempfile::tempdir().unwrap();
        let u = Arc::new(Usage::new(dir.path().join("u.jsonl"), None));
        let frames = (0..70).map(|_| {
            Ok(hyper::body::Frame::data(bytes::Bytes::from(vec![
                0u8;
                1024
            ])))
        });
        let body: Body = BodyExt::boxed_unsync(StreamBody::new(futures::stream::iter(frames)));
        let mut metered = u.metered(key(Class::LiveRead), body);
        let sent = |u: &Usage| {
            u.lock()
                .counts
                .get(&key(Class::LiveRead))
                .map_or(0, |c| c.response_bytes)
        };
        for _ in 0..65 {
            metered.frame().await.unwrap().unwrap();
        }
        assert_eq!(sent(&u), 64 << 10, "settled at 64 KiB, not per frame");
        drop(metered);
        assert_eq!(sent(&u), 65 << 10, "the rest when the answer goes away");
    }

    #[test]
    fn a_full_queue_merges_its_two_oldest_batches() {
        let mut q = VecDeque::new();
        for i in 0..3u64 {
            let mut records = HashMap::new();
            records.insert(
                key(Class::Read),
                Counts {
                    requests: 1,
                    ..Counts::default()
                },
            );
            q.push_back(Batch {
                sequence: i + 1,
                start_ms: i * 10,
                end_ms: i * 10 + 10,
                records,
            });
        }
        merge_oldest(&mut q);
        assert_eq!(q.len(), 2);
        let first = q.front().unwrap();
        assert_eq!((first.sequence, first.start_ms, first.end_ms), (1, 0, 20));
        assert_eq!(first.records[&key(Class::Read)].requests, 2);
    }
}
