//! Snapshot blobs and staged parts in the cold tier (snapshot-parts.md §12): the object
//! layout, writing and reading snapshot objects, the publish of a cold snapshot, and the
//! clean-up of objects nothing references.
//!
//! ```text
//! snapshot-parts/{bucket}/{stream}/{part id}                            UPRT frame: the part
//! snapshots/{bucket}/{stream}/{incarnation}/{offset20}-{digest}-{r}.snap  USNP frame: the blob
//! snapshots/{bucket}/{stream}/{incarnation}/{offset20}-{digest}-{r}.man   UMAN frame: pieces
//! snapshots/{bucket}/{stream}/{incarnation}/{offset20}-{digest}-{r}.p{n}  USNP frame: piece n
//! ```
//!
//! `{bucket}` and `{stream}` (the stream key, affinity included) are escaped into one key
//! segment each ([`segment`]); `{r}` is random, so a retried copy never meets an earlier
//! attempt's object. A single-request publish writes one `.snap` object; a multi-part commit
//! copies each part into one `.p{n}` piece and then writes the `.man` manifest that lists the
//! pieces, so no step holds more than one part in memory. The state references the `.snap` or
//! `.man` key; every object of one snapshot shares the *stem* (the key without its extension).

use crate::app::App;
use crate::http::error::ApiError;
use bytes::Bytes;
use std::collections::HashSet;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use ursula_core::command::{Op, PublishColdSnapshotReq, Reply, SnapshotReply};
use ursula_core::snapshot::{ColdSnapshotRef, Digest};
use ursula_core::{ErrorCode, Incarnation, StreamKey};
use ursula_storage::cold::object::{self, magic};
use ursula_storage::cold::{ColdError, ColdStore, ObjectKey};

/// Object format versions.
pub const PART_VERSION: u16 = 1;
pub const SNAPSHOT_VERSION: u16 = 1;
pub const MANIFEST_VERSION: u16 = 1;

/// Escaped names longer than this are replaced by their hash (keys stay under S3's limit).
const SEGMENT_MAX: usize = 200;

/// One key segment for `name`: ASCII letters, digits, `-` and `_` as they are, every other
/// byte as `=XX`; a long result becomes `h=` and a BLAKE3 hash.
pub fn segment(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            out.push(b as char);
        } else {
            out.push_str(&format!("={b:02X}"));
        }
    }
    if out.len() > SEGMENT_MAX {
        let h = Digest::of("", name.as_bytes()).to_string();
        out = format!("h={}", &h[..40]);
    }
    out
}

fn stream_segments(key: &StreamKey) -> String {
    format!("{}/{}", segment(key.bucket()), segment(key.stream()))
}

/// `snapshot-parts/{bucket}/{stream}`: every staged part of the stream.
pub fn parts_prefix(key: &StreamKey) -> Result<ObjectKey, ColdError> {
    ObjectKey::new(format!("snapshot-parts/{}", stream_segments(key)))
}

/// `snapshots/{bucket}/{stream}`: every snapshot object of the stream.
pub fn snapshots_prefix(key: &StreamKey) -> Result<ObjectKey, ColdError> {
    ObjectKey::new(format!("snapshots/{}", stream_segments(key)))
}

/// The stem of a new snapshot's objects.
pub fn new_stem(
    key: &StreamKey,
    incarnation: Incarnation,
    offset: u64,
    digest: &Digest,
) -> Result<String, ColdError> {
    let stem = format!(
        "{}/{incarnation}/{offset:020}-{digest}-{:016x}",
        snapshots_prefix(key)?,
        random_u64()
    );
    ObjectKey::new(stem.clone())?;
    Ok(stem)
}

/// The stem of a snapshot object's key (its key without `.snap`, `.man` or `.p{n}`).
pub fn stem_of(key: &str) -> &str {
    match key.rsplit_once('.') {
        Some((stem, ext))
            if ext == "snap" || ext == "man" || ext.strip_prefix('p').is_some_and(is_digits) =>
        {
            stem
        }
        _ => key,
    }
}

fn is_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// A random 64-bit value (part IDs, object stems), from the standard library's per-process
/// random keys and a counter.
pub fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static STATE: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    STATE
        .get_or_init(std::collections::hash_map::RandomState::new)
        .hash_one((n, nanos))
}

pub fn cold_failed(what: &str, e: &ColdError) -> ApiError {
    ApiError::new(
        ErrorCode::COLD_STORE_FAILED,
        format!("the cold store failed to {what}: {e}"),
    )
}

/// The node's cold store, or `501 COLD_STORE_NOT_CONFIGURED`.
pub fn store_of(app: &App) -> Result<Arc<dyn ColdStore>, ApiError> {
    app.tiering
        .as_ref()
        .map(|t| t.store.clone())
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::COLD_STORE_NOT_CONFIGURED,
                "multi-part snapshots need a cold backend, which this node does not have; \
             publish snapshots of up to 128 MiB in one PUT",
            )
        })
}

/// The body of a `magic` object, its frame checked.
pub fn decode_object(expected: [u8; 4], version: u16, bytes: &[u8]) -> Result<Bytes, ApiError> {
    object::decode(expected, &[version], bytes)
        .map(|f| Bytes::copy_from_slice(f.body))
        .map_err(|e| {
            ApiError::new(
                ErrorCode::COLD_STORE_FAILED,
                format!("a cold object is damaged: {e}"),
            )
        })
}

/// The pieces of a `.man` manifest: `(key, length)` per piece, in order.
pub fn manifest_pieces(body: &[u8]) -> Option<Vec<(ObjectKey, u64)>> {
    let text = std::str::from_utf8(body).ok()?;
    text.lines()
        .map(|l| {
            let (len, key) = l.split_once(' ')?;
            Some((ObjectKey::new(key).ok()?, len.parse().ok()?))
        })
        .collect()
}

pub fn manifest_body(pieces: &[(ObjectKey, u64)]) -> Vec<u8> {
    pieces
        .iter()
        .map(|(k, n)| format!("{n} {k}\n"))
        .collect::<String>()
        .into_bytes()
}

/// The keys of every object of the snapshot `r` (the manifest's pieces, then the manifest).
async fn objects_of(store: &dyn ColdStore, r: &str) -> Result<Vec<ObjectKey>, ApiError> {
    let key = ObjectKey::new(r).map_err(|e| cold_failed("name a snapshot", &e))?;
    if !r.ends_with(".man") {
        return Ok(vec![key]);
    }
    let bytes = match store.get(&key).await {
        Ok(b) => b,
        Err(ColdError::NotFound { .. }) => return Ok(vec![]),
        Err(e) => return Err(cold_failed("read a snapshot manifest", &e)),
    };
    let body = decode_object(magic::MANIFEST, MANIFEST_VERSION, &bytes)?;
    let mut keys: Vec<ObjectKey> = manifest_pieces(&body)
        .unwrap_or_default()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    keys.push(key);
    Ok(keys)
}

/// The blob of a cold snapshot as a stream of pieces (each read, checked and sent in turn).
pub async fn blob_stream(
    store: Arc<dyn ColdStore>,
    r: &ColdSnapshotRef,
) -> Result<impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static, ApiError> {
    let mut keys = objects_of(&*store, &r.key).await?;
    if r.key.ends_with(".man") {
        keys.pop();
    }
    // The first piece is fetched before the answer starts, so a failing store is a `502`.
    let mut keys = keys.into_iter();
    let first = match keys.next() {
        Some(k) => Some(fetch_piece(&*store, &k).await?),
        None => None,
    };
    let rest = futures::stream::unfold((store, keys), |(store, mut keys)| async move {
        let k = keys.next()?;
        let got = fetch_piece(&*store, &k)
            .await
            .map_err(|e| std::io::Error::other(e.rejection.message));
        Some((got, (store, keys)))
    });
    Ok(futures::StreamExt::chain(
        futures::stream::iter(first.map(Ok)),
        rest,
    ))
}

async fn fetch_piece(store: &dyn ColdStore, key: &ObjectKey) -> Result<Bytes, ApiError> {
    let bytes = store
        .get(key)
        .await
        .map_err(|e| cold_failed("read a snapshot", &e))?;
    decode_object(magic::SNAPSHOT, SNAPSHOT_VERSION, &bytes)
}

/// One pass over a cold snapshot's pieces (one in memory at a time): the up to `n` bytes
/// that follow each occurrence of `needle`, also across piece boundaries (bootstrap picks a
/// boundary that none of them starts).
pub async fn suffixes_after(
    store: Arc<dyn ColdStore>,
    r: &ColdSnapshotRef,
    needle: &[u8],
    n: usize,
) -> Result<Vec<Vec<u8>>, ApiError> {
    use futures::StreamExt;
    let mut pieces = std::pin::pin!(blob_stream(store, r).await?);
    let mut scan = crate::http::boundary::SuffixScan::new(needle, n);
    while let Some(piece) = pieces.next().await {
        let piece =
            piece.map_err(|e| ApiError::new(ErrorCode::COLD_STORE_FAILED, e.to_string()))?;
        scan.feed(&piece);
    }
    Ok(scan.into_found())
}

/// Deletes the objects of snapshot `key` best effort.
pub async fn delete_snapshot_objects(store: &dyn ColdStore, key: &str) {
    let Ok(keys) = objects_of(store, key).await else {
        return;
    };
    for k in keys {
        if let Err(e) = store.delete(&k).await {
            tracing::warn!(key = %k, error = %e, "deleting a snapshot object failed; the sweep retries");
        }
    }
}

/// Proposes the publish of a written snapshot object (Phase C). Afterwards the object is
/// deleted when the state does not reference it (a refused publish, a repeat), and the
/// snapshot it superseded is deleted when it was this stream's own and nothing pins it.
pub async fn publish(
    app: &Arc<App>,
    store: &Arc<dyn ColdStore>,
    p: PublishColdSnapshotReq,
) -> Result<SnapshotReply, ApiError> {
    let own_prefix = snapshots_prefix(&p.key).ok();
    let before = app
        .with_stream(&p.key, |s| {
            s.snapshot_object.as_ref().map(|r| r.key.clone())
        })
        .flatten();
    let object_key = p.object.key.clone();
    let key = p.key.clone();
    let res = app
        .propose(app.group_of(&key), Op::PublishColdSnapshot(Box::new(p)))
        .await;
    let (now, pinned) = app
        .with_stream(&key, |s| {
            (
                s.snapshot_object.as_ref().map(|r| r.key.clone()),
                !s.pins.is_empty(),
            )
        })
        .unwrap_or((None, false));
    // An outcome that is unknown may still publish the object after a restart: leave it to
    // the sweep, which deletes it only if nothing references it then.
    let unknown = res
        .as_ref()
        .err()
        .is_some_and(|e| e.code() == ErrorCode::WRITE_OUTCOME_UNKNOWN);
    if now.as_deref() != Some(&object_key) && !unknown {
        let store = store.clone();
        let k = object_key.clone();
        tokio::spawn(async move { delete_snapshot_objects(&*store, &k).await });
    }
    let own = |k: &str| {
        own_prefix
            .as_ref()
            .is_some_and(|pre| ObjectKey::new(k).is_ok_and(|k| k.is_below(pre)))
    };
    if let Some(old) = before
        && res.is_ok()
        && now.as_deref() != Some(&old)
        && !pinned
        && own(&old)
    {
        let store = store.clone();
        tokio::spawn(async move { delete_snapshot_objects(&*store, &old).await });
    }
    match res? {
        Reply::Snapshot(r) => Ok(*r),
        _ => Err(ApiError::new(
            ErrorCode::INTERNAL_ERROR,
            "unexpected reply to a snapshot publish",
        )),
    }
}

/// A single-request publish on a node with a cold backend: the blob becomes a `.snap`
/// object, then the state references it.
pub async fn publish_blob(
    app: &Arc<App>,
    store: &Arc<dyn ColdStore>,
    mut p: PublishColdSnapshotReq,
    blob: Bytes,
    offset_hint: u64,
) -> Result<SnapshotReply, ApiError> {
    let incarnation = app
        .with_stream(&p.key, |s| s.incarnation)
        .unwrap_or(Incarnation(0));
    let stem = new_stem(&p.key, incarnation, offset_hint, &p.digest)
        .map_err(|e| cold_failed("name a snapshot", &e))?;
    let key = ObjectKey::new(format!("{stem}.snap")).map_err(|e| cold_failed("name", &e))?;
    let len = blob.len() as u64;
    let _flight = app.parts.flights.enter(&stem);
    store
        .put_if_absent(
            &key,
            object::frame(magic::SNAPSHOT, SNAPSHOT_VERSION, [blob]),
        )
        .await
        .map_err(|e| cold_failed("store the snapshot", &e))?;
    p.object = ColdSnapshotRef {
        key: key.to_string(),
        len,
    };
    publish(app, store, p).await
}

/// Stems of snapshot objects being written or published right now: the sweep skips them.
#[derive(Debug, Default)]
pub struct InFlight(std::sync::Mutex<HashSet<String>>);

/// Removes its stem from [`InFlight`] when dropped.
pub struct FlightGuard<'a>(&'a InFlight, String);

impl InFlight {
    pub fn enter(&self, stem: &str) -> FlightGuard<'_> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(stem.to_owned());
        FlightGuard(self, stem.to_owned())
    }

    pub fn contains(&self, stem: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(stem)
    }
}

impl Drop for FlightGuard<'_> {
    fn drop(&mut self) {
        self.0
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.1);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn segments_are_valid_key_segments() {
        for name in [
            "a",
            "a/b",
            ".",
            "..",
            "x y",
            "é",
            "=",
            "a.b",
            &"z".repeat(300),
        ] {
            let s = segment(name);
            assert!(ObjectKey::new(format!("p/{s}")).is_ok(), "{name:?} -> {s}");
            assert!(s.len() <= SEGMENT_MAX);
        }
        assert_ne!(segment("a/b"), segment("a=2Fb"));
        assert_eq!(segment("ab-_9"), "ab-_9");
    }

    #[test]
    fn stems() {
        assert_eq!(stem_of("snapshots/b/s/i/x-1.snap"), "snapshots/b/s/i/x-1");
        assert_eq!(stem_of("snapshots/b/s/i/x-1.man"), "snapshots/b/s/i/x-1");
        assert_eq!(stem_of("snapshots/b/s/i/x-1.p00012"), "snapshots/b/s/i/x-1");
        assert_eq!(
            stem_of("snapshots/b/s/i/x-1.other"),
            "snapshots/b/s/i/x-1.other"
        );
        let k = StreamKey::new("b", "s");
        let stem = new_stem(&k, Incarnation(7), 42, &Digest([1; 32])).unwrap();
        assert!(stem.starts_with(
            "snapshots/b/s/00000000000000000000000000000007/00000000000000000042-0101"
        ));
        assert_eq!(stem_of(&format!("{stem}.p00001")), stem);
    }

    #[test]
    fn manifests_round_trip() {
        let pieces = vec![
            (ObjectKey::new("snapshots/a.p00000").unwrap(), 5),
            (ObjectKey::new("snapshots/a.p00001").unwrap(), 7),
        ];
        assert_eq!(manifest_pieces(&manifest_body(&pieces)), Some(pieces));
        assert_eq!(manifest_pieces(b"x y\n"), None);
    }
}
