//! Staging files of the `local` backend. `LocalFileSystem` writes an object to
//! `{path}#{n}` and renames it into place; a process killed between the two leaves the
//! staging file behind, invisible to listings (a name with `#` and digits is never an
//! object: [`super::key::ObjectKey`] allows no `#`). [`sweep`] deletes such files, so a crash
//! during an upload leaks no disk space forever.

use std::path::Path;
use std::time::{Duration, SystemTime};

/// Directory levels searched below the cold directory (object keys are a few levels deep).
const MAX_DEPTH: usize = 16;

/// Whether `name` is a `LocalFileSystem` staging file name (`{name}#{digits}`).
fn is_staging(name: &str) -> bool {
    name.rsplit_once('#')
        .is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Deletes the staging files under `dir` last modified more than `grace` ago; returns how
/// many. Errors on single entries are skipped (the next start tries again).
pub fn sweep(dir: &Path, grace: Duration) -> usize {
    let now = SystemTime::now();
    let mut removed = 0;
    let mut stack = vec![(dir.to_path_buf(), 0usize)];
    while let Some((d, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                if depth < MAX_DEPTH {
                    stack.push((e.path(), depth + 1));
                }
                continue;
            }
            let stale = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| now.duration_since(t).ok())
                .is_some_and(|age| age >= grace);
            if ft.is_file() && stale && e.file_name().to_str().is_some_and(is_staging) {
                match std::fs::remove_file(e.path()) {
                    Ok(()) => removed += 1,
                    Err(err) => {
                        tracing::warn!(path = %e.path().display(), error = %err,
                            "cannot delete a stale cold staging file");
                    }
                }
            }
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_stale_staging_files_go() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("chunks/00ab/g00001");
        std::fs::create_dir_all(&sub).unwrap();
        for name in ["1.chunk", "1.chunk#12", "2.chunk#x", "3.chunk#"] {
            std::fs::write(sub.join(name), b"x").unwrap();
        }
        assert_eq!(sweep(dir.path(), Duration::from_secs(3600)), 0, "too young");
        assert_eq!(sweep(dir.path(), Duration::ZERO), 1);
        let mut left: Vec<String> = std::fs::read_dir(&sub)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["1.chunk", "2.chunk#x", "3.chunk#"]);
    }

    #[test]
    fn object_keys_are_never_staging_names() {
        assert!(super::super::key::ObjectKey::new("a/b#12").is_err());
        assert!(is_staging("x.chunk#0") && !is_staging("x.chunk"));
    }
}
