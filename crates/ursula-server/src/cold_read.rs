//! Reads of cold pieces (cluster.md §6.3): ranged reads of chunk objects, checked block by
//! block, through an optional bounded cache of verified blocks with read-ahead
//! (`[storage.cold.cache]`, §7.5).
//!
//! The cache holds payload blocks of `block_size` bytes aligned in the object's payload, keyed
//! by group, object and block; objects are immutable, so an entry never goes stale (a deleted
//! object's blocks just age out). A miss reads the missing block and the next
//! `readahead_blocks - 1` of the same object in one ranged request, which is what a catch-up
//! reader asks for next.

use crate::metrics::inc;
use bytes::Bytes;
use quick_cache::Weighter;
use quick_cache::sync::Cache;
use std::sync::atomic::AtomicU64;
use ursula_core::cold::ObjectId;
use ursula_storage::chunk_object::{BLOCK_SIZE, ChunkError, ChunkLayout, ChunkVersion};
use ursula_storage::cold::{CacheConfig, ColdError, ColdStore, ObjectKey};

/// Why a cold read failed.
#[derive(Debug)]
pub enum ReadError {
    /// The store failed (or lost the object).
    Store(ColdError),
    /// The bytes came back but fail their checksums.
    Corrupt(ChunkError),
}

#[derive(Clone)]
struct ByLen;

impl Weighter<(u32, u64, u64), Bytes> for ByLen {
    fn weight(&self, _key: &(u32, u64, u64), val: &Bytes) -> u64 {
        val.len().max(1) as u64
    }
}

/// Counters of the cache.
#[derive(Debug, Default)]
pub struct CacheMetrics {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
}

/// The bounded cache of verified cold blocks.
pub struct BlockCache {
    cache: Cache<(u32, u64, u64), Bytes, ByLen>,
    /// Payload bytes per cache block: a multiple of the chunk layout's block.
    block: u64,
    readahead: u64,
    pub metrics: CacheMetrics,
}

impl BlockCache {
    pub fn new(cfg: &CacheConfig) -> Option<BlockCache> {
        if cfg.max_size == 0 {
            return None;
        }
        let block = cfg.block_size.max(1).div_ceil(BLOCK_SIZE) * BLOCK_SIZE;
        let items = (cfg.max_size / block).max(1) as usize;
        Some(BlockCache {
            cache: Cache::with_weighter(items, cfg.max_size, ByLen),
            block,
            readahead: cfg.readahead_blocks.max(1),
            metrics: CacheMetrics::default(),
        })
    }

    /// Bytes held.
    pub fn weight(&self) -> u64 {
        self.cache.weight()
    }
}

/// Reads payload `[start, end)` of an object from the store, checked: slices of the fetched
/// bytes, one per chunk block, appended to `out` (no copy; nothing appended on an error).
async fn read_checked(
    store: &dyn ColdStore,
    key: &ObjectKey,
    layout: ChunkLayout,
    span: (u64, u64),
    out: &mut Vec<Bytes>,
) -> Result<(), ReadError> {
    let fetch = |range| async move { store.get_range(key, range).await.map_err(ReadError::Store) };
    fetch_checked(layout, span, out, fetch).await
}

/// Fetches the object bytes of the blocks payload `[start, end)` touches (and their checksums)
/// with `fetch`, checks them and appends the payload to `out` as slices of the fetched bytes
/// (nothing on an error).
pub(crate) async fn fetch_checked<F, Fut>(
    layout: ChunkLayout,
    (start, end): (u64, u64),
    out: &mut Vec<Bytes>,
    fetch: F,
) -> Result<(), ReadError>
where
    F: Fn(std::ops::Range<u64>) -> Fut,
    Fut: std::future::Future<Output = Result<Bytes, ReadError>>,
{
    let want = layout
        .fetch(start, end - start)
        .map_err(ReadError::Corrupt)?;
    let crcs = match want.crcs {
        Some(r) => Some(fetch(r).await?),
        None => None,
    };
    let blocks = fetch(want.blocks).await?;
    layout
        .extract((&blocks, crcs.as_ref()), start, end - start, out)
        .map_err(ReadError::Corrupt)
}

/// Appends the bytes of payload `[pos, pos + len)` of `object` (of `object_len` payload
/// bytes, in `group`) to `out`, through `cache` when there is one. Objects in a store that is
/// not a local directory are written interleaved (version 1, see
/// [`ChunkVersion::for_local_files`]), so that one ranged request fetches blocks and checksums. The pieces share the
/// fetched or cached buffers: nothing is copied here. Nothing is appended on an error.
pub async fn read(
    store: &dyn ColdStore,
    cache: Option<&BlockCache>,
    key: &ObjectKey,
    (group, object): (u32, ObjectId),
    (pos, len, object_len): (u64, u64, u64),
    out: &mut Vec<Bytes>,
) -> Result<(), ReadError> {
    let layout = ChunkLayout::new(ChunkVersion::for_local_files(false), object_len);
    let end = pos + len;
    let Some(c) = cache else {
        return read_checked(store, key, layout, (pos, end), out).await;
    };
    let mark = out.len();
    let last_block = (object_len.max(1) - 1) / c.block;
    let mut b = pos / c.block;
    while b * c.block < end {
        let block = match c.cache.get(&(group, object.0, b)) {
            Some(hit) => {
                inc(&c.metrics.hits, 1);
                hit
            }
            None => {
                inc(&c.metrics.misses, 1);
                // The missing block, what the read still needs, and the read-ahead.
                let needed = (end - 1) / c.block;
                let upto = needed.max(b + c.readahead - 1).min(last_block);
                let start = b * c.block;
                let stop = ((upto + 1) * c.block).min(object_len);
                let mut pieces = Vec::new();
                if let Err(e) = read_checked(store, key, layout, (start, stop), &mut pieces).await {
                    out.truncate(mark);
                    return Err(e);
                }
                // One contiguous buffer per run, so that a cache entry's weight is the memory
                // it holds (a slice of the fetched bytes would keep the whole fetch alive).
                let run = Bytes::from(pieces.concat());
                for (i, at) in (start..stop).step_by(c.block as usize).enumerate() {
                    let lo = (at - start) as usize;
                    let hi = ((at + c.block).min(stop) - start) as usize;
                    c.cache
                        .insert((group, object.0, b + i as u64), run.slice(lo..hi));
                }
                let hi = (c.block.min(stop - start)) as usize;
                run.slice(0..hi)
            }
        };
        let block_start = b * c.block;
        let lo = (pos.max(block_start) - block_start) as usize;
        let hi = (end.min(block_start + block.len() as u64) - block_start) as usize;
        out.push(block.slice(lo..hi));
        b += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;
    use ursula_storage::chunk_object::ChunkWriter;
    use ursula_storage::cold::faulty::Op;
    use ursula_storage::cold::{Body, FaultyColdStore, ObjectColdStore};

    fn payload(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 31 % 251) as u8).collect()
    }

    async fn store_with(n: usize) -> (FaultyColdStore, ObjectKey, Vec<u8>) {
        let store = FaultyColdStore::new(std::sync::Arc::new(ObjectColdStore::memory()));
        let key = ObjectKey::new("chunks/g00000/00000000000000000001.chunk").unwrap();
        let p = payload(n);
        let mut w = ChunkWriter::new(ChunkVersion::Interleaved, n as u64);
        w.write(&p);
        store
            .put_if_absent(&key, Body::from(w.finish().unwrap()))
            .await
            .unwrap();
        (store, key, p)
    }

    #[tokio::test]
    async fn cached_reads_match_the_object_and_read_ahead_saves_requests() {
        let n = 3 * (1 << 20) + 12_345;
        let (store, key, p) = store_with(n).await;
        let cache = BlockCache::new(&CacheConfig {
            max_size: 64 << 20,
            block_size: 256 * 1024,
            readahead_blocks: 4,
        })
        .unwrap();
        let id = (0, ObjectId(1));
        let n = n as u64;
        // Sequential reads of 100 KiB: one store request per four cache blocks.
        let mut at = 0;
        while at < n {
            let len = (100 * 1024).min(n - at);
            let mut out = Vec::new();
            read(&store, Some(&cache), &key, id, (at, len, n), &mut out)
                .await
                .unwrap();
            assert!(
                out.concat() == p[at as usize..(at + len) as usize],
                "at {at}"
            );
            at += len;
        }
        let gets = store.faults().calls(Op::GetRange);
        assert!(gets <= 4, "{gets} ranged reads for 13 cache blocks");
        // A second pass is served from memory.
        let mut out = Vec::new();
        read(&store, Some(&cache), &key, id, (0, n, n), &mut out)
            .await
            .unwrap();
        assert!(out.concat() == p);
        assert_eq!(store.faults().calls(Op::GetRange), gets);
        assert!(cache.weight() <= 64 << 20);
    }

    #[tokio::test]
    async fn a_failed_read_appends_nothing_even_after_cache_hits() {
        let n = 1 << 20;
        let (store, key, p) = store_with(n).await;
        let cache = BlockCache::new(&CacheConfig {
            max_size: 64 << 20,
            block_size: 256 * 1024,
            readahead_blocks: 1,
        })
        .unwrap();
        let (id, n) = ((0, ObjectId(1)), n as u64);
        let mut out = Vec::new();
        read(&store, Some(&cache), &key, id, (0, 1000, n), &mut out)
            .await
            .unwrap();
        assert!(out.concat() == p[..1000]);
        // Block 0 is cached now; block 1 is not, and its fetch fails.
        store.faults().fail_next(Op::GetRange, 1);
        let got = read(&store, Some(&cache), &key, id, (0, 300_000, n), &mut out).await;
        assert!(got.is_err());
        assert!(
            out.concat() == p[..1000],
            "a failed read left pieces behind"
        );
    }

    #[tokio::test]
    async fn uncached_reads_fetch_exactly_the_range() {
        let (store, key, p) = store_with(200_000).await;
        let mut out = Vec::new();
        read(
            &store,
            None,
            &key,
            (0, ObjectId(1)),
            (70_000, 5, 200_000),
            &mut out,
        )
        .await
        .unwrap();
        assert_eq!(out.concat(), p[70_000..70_005]);
    }
}
