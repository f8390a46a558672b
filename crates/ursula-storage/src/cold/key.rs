//! Object keys: validated, `/`-separated names below the store's root.

use super::ColdError;
use std::fmt;

/// Longest key accepted, in bytes (S3 allows 1024 including the root prefix).
pub const MAX_KEY_LEN: usize = 768;

/// The name of one object, relative to the store's root (`storage.cold.root`).
///
/// Segments are separated by `/`, are non-empty, are not `.` or `..`, and hold only ASCII
/// letters, digits and `-_.=`, so a key means the same object on every backend (a local
/// directory, S3, memory) without escaping.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey(String);

impl ObjectKey {
    pub fn new(key: impl Into<String>) -> Result<Self, ColdError> {
        let key = key.into();
        let bad = |reason| ColdError::InvalidKey {
            key: key.clone(),
            reason,
        };
        if key.is_empty() {
            return Err(bad("empty"));
        }
        if key.len() > MAX_KEY_LEN {
            return Err(bad("longer than 768 bytes"));
        }
        for seg in key.split('/') {
            if seg.is_empty() {
                return Err(bad("empty segment"));
            }
            if seg == "." || seg == ".." {
                return Err(bad("relative segment"));
            }
            if !seg
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'='))
            {
                return Err(bad("only ASCII letters, digits and -_.= are allowed"));
            }
        }
        Ok(ObjectKey(key))
    }

    /// `self/segment`.
    pub fn child(&self, segment: &str) -> Result<Self, ColdError> {
        ObjectKey::new(format!("{}/{segment}", self.0))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `self` lies below `prefix` (`prefix/...`).
    pub fn is_below(&self, prefix: &ObjectKey) -> bool {
        self.0
            .strip_prefix(prefix.as_str())
            .is_some_and(|rest| rest.starts_with('/'))
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ObjectKey({})", self.0)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn valid_and_invalid_keys() {
        for ok in ["a", "g-1/chunks/000017.uc", "parts/s=1/x_y.z"] {
            assert!(ObjectKey::new(ok).is_ok(), "{ok}");
        }
        for bad in [
            "", "/a", "a/", "a//b", "a/../b", ".", "a b", "é", "a\\b", "a?b",
        ] {
            assert!(
                matches!(ObjectKey::new(bad), Err(ColdError::InvalidKey { .. })),
                "{bad}"
            );
        }
        assert!(ObjectKey::new("x".repeat(MAX_KEY_LEN + 1)).is_err());
        let p = ObjectKey::new("a/b").unwrap();
        assert!(p.child("c").unwrap().is_below(&p));
        assert!(!ObjectKey::new("a/bc").unwrap().is_below(&p));
        assert!(!p.is_below(&p));
    }

    proptest! {
        #[test]
        fn accepted_keys_round_trip_through_object_store_paths(
            segs in proptest::collection::vec("[A-Za-z0-9=_-][A-Za-z0-9=_.-]{0,15}", 1..6)
        ) {
            let key = ObjectKey::new(segs.join("/")).unwrap();
            let path = object_store::path::Path::parse(key.as_str()).unwrap();
            prop_assert_eq!(path.as_ref(), key.as_str());
        }
    }
}
