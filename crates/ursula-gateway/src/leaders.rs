//! The leader cache (cluster.md §12.2): for each stream, the node that answered for it after a
//! redirect, at most 16,384 streams (cleared wholesale when full, the spec's simple bound).

use std::collections::HashMap;
use std::sync::Mutex;

const MAX_ENTRIES: usize = 16_384;

#[derive(Default)]
pub struct Leaders(Mutex<HashMap<String, String>>);

impl Leaders {
    /// The cached leader's origin for `key`.
    pub fn get(&self, key: &str) -> Option<String> {
        self.lock().get(key).cloned()
    }

    /// Remembers `origin` as `key`'s leader; returns whether the cache was cleared for room.
    pub fn put(&self, key: &str, origin: &str) -> bool {
        let mut m = self.lock();
        let cleared = m.len() >= MAX_ENTRIES && !m.contains_key(key);
        if cleared {
            m.clear();
        }
        m.insert(key.to_owned(), origin.to_owned());
        cleared
    }

    /// Forgets `key`'s leader if it is `origin`; returns whether it did.
    pub fn evict(&self, key: &str, origin: &str) -> bool {
        let mut m = self.lock();
        if m.get(key).is_some_and(|o| o == origin) {
            m.remove(key);
            return true;
        }
        false
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The cache key of a request path: `bucket/stream` of a native path (its subresources
/// included), `__compat_v1/{name}` of a compatibility one; `None` for a bucket's own routes and
/// operational ones, which any node answers.
pub fn key_of(path: &str) -> Option<String> {
    if let Some(name) = path.strip_prefix("/v1/stream/") {
        return (!name.is_empty()).then(|| format!("__compat_v1/{name}"));
    }
    let mut segs = path.trim_start_matches('/').split('/');
    let bucket = segs
        .next()
        .filter(|b| !b.is_empty() && !b.starts_with("__"))?;
    let stream = segs.next().filter(|s| !s.is_empty())?;
    Some(format!("{bucket}/{stream}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_and_its_subresources_share_a_key() {
        assert_eq!(key_of("/b/s").as_deref(), Some("b/s"));
        assert_eq!(key_of("/b/s/snapshot/12").as_deref(), Some("b/s"));
        assert_eq!(key_of("/v1/stream/a/b").as_deref(), Some("__compat_v1/a/b"));
        assert_eq!(key_of("/b"), None);
        assert_eq!(key_of("/__ursula/metrics"), None);
        assert_eq!(key_of("/v1/stream/"), None);
    }

    #[test]
    fn the_cache_is_bounded_and_evicts_only_the_leader_it_holds() {
        let l = Leaders::default();
        assert!(!l.put("k", "http://a"));
        assert!(!l.evict("k", "http://b"), "another node's 503 leaves it");
        assert!(l.evict("k", "http://a"));
        assert_eq!(l.get("k"), None);
        for i in 0..MAX_ENTRIES {
            l.put(&i.to_string(), "http://a");
        }
        assert!(l.put("one more", "http://a"), "cleared when full");
        assert_eq!(l.len(), 1);
    }
}
