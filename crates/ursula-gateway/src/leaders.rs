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

/// The cache key of a request path: the stream key a node derives from it (`bucket/stream`,
/// percent-decoded, of a native path and its subresources; `__compat_v1/{escaped name}` of a
/// compatibility one), or with `groups` its Raft group, `group:{id}`. `None` for a bucket's own
/// routes and operational ones, which any node answers, and for a path no node would accept.
pub fn key_of(path: &str, groups: Option<u32>) -> Option<String> {
    use ursula_core::ids::{escape_compat_name, group_of, pct_decode};
    let key = if let Some(name) = path.strip_prefix("/v1/stream/") {
        let parts: Option<Vec<_>> = name.split('/').map(pct_decode).collect();
        let name = parts?.join("/");
        if name.is_empty() {
            return None;
        }
        format!("__compat_v1/{}", escape_compat_name(&name))
    } else {
        let mut segs = path.trim_start_matches('/').split('/');
        let bucket = segs
            .next()
            .filter(|b| !b.is_empty() && !b.starts_with("__"))?;
        let stream = segs.next().filter(|s| !s.is_empty())?;
        format!("{}/{}", pct_decode(bucket)?, pct_decode(stream)?)
    };
    Some(match groups {
        Some(n) => format!("group:{}", group_of(key.as_bytes(), n)),
        None => key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_and_its_subresources_share_a_key() {
        let k = |p: &str| key_of(p, None);
        assert_eq!(k("/b/s").as_deref(), Some("b/s"));
        assert_eq!(k("/b/s/snapshot/12").as_deref(), Some("b/s"));
        assert_eq!(k("/b/s%20x").as_deref(), Some("b/s x"));
        assert_eq!(k("/v1/stream/a/b").as_deref(), Some("__compat_v1/a%2Fb"));
        assert_eq!(k("/b"), None);
        assert_eq!(k("/__ursula/metrics"), None);
        assert_eq!(k("/v1/stream/"), None);
        assert_eq!(k("/b/%ff"), None);
    }

    #[test]
    fn with_a_group_count_streams_of_a_group_share_its_key() {
        // The node's own hash of the node's own key (ursula_core::ids::StreamKey::group).
        let node = ursula_core::ids::StreamKey::new("b", "s").group(4);
        assert_eq!(key_of("/b/s", Some(4)), Some(format!("group:{node}")));
        let compat = ursula_core::ids::StreamKey::new("__compat_v1", "a%2Fb").group(4);
        assert_eq!(
            key_of("/v1/stream/a/b", Some(4)),
            Some(format!("group:{compat}"))
        );
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
