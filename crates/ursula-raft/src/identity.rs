//! `{data_dir}/node.toml`: the identity and on-disk format version of a data directory.
//!
//! ```toml
//! # Ursula node data directory. Do not edit.
//! magic = "ursula-node"
//! format_version = 1
//! node_id = 1
//! group_count = 16
//! ```
//!
//! A directory written by an unknown format version, for another node id, or with another group
//! count (streams hash to groups by the count) is refused.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

use crate::error::RaftError;

pub const FILE_NAME: &str = "node.toml";
pub const MAGIC: &str = "ursula-node";
/// Version of the whole data directory layout (WAL record kinds, snapshot payload).
pub const FORMAT_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub node_id: u64,
    pub group_count: u32,
    /// The cluster the directory belongs to (optional key `cluster_id`; absent in directories
    /// written before clusters, or by a node configured without one).
    pub cluster_id: Option<String>,
}

fn render(id: &Identity) -> String {
    let mut text = format!(
        "# Ursula node data directory. Do not edit.\nmagic = \"{MAGIC}\"\nformat_version = {FORMAT_VERSION}\nnode_id = {}\ngroup_count = {}\n",
        id.node_id, id.group_count
    );
    // Cluster ids are validated to [A-Za-z0-9._-], so they need no escaping.
    if let Some(c) = &id.cluster_id {
        text.push_str(&format!("cluster_id = \"{c}\"\n"));
    }
    text
}

fn parse(path: &Path, text: &str) -> Result<Identity, RaftError> {
    let bad = |why: String| RaftError::DataDir(format!("{}: {why}", path.display()));
    let mut magic = None;
    let mut version = None;
    let mut node_id = None;
    let mut group_count = None;
    let mut cluster_id = None;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            return Err(bad(format!("malformed line {line:?}")));
        };
        let value = value.trim();
        match key.trim() {
            "magic" => magic = Some(value.trim_matches('"').to_string()),
            "format_version" => version = value.parse::<u32>().ok(),
            "node_id" => node_id = value.parse::<u64>().ok(),
            "group_count" => group_count = value.parse::<u32>().ok(),
            "cluster_id" => cluster_id = Some(value.trim_matches('"').to_string()),
            _ => {}
        }
    }
    if magic.as_deref() != Some(MAGIC) {
        return Err(bad(format!(
            "not an Ursula data directory (magic {magic:?})"
        )));
    }
    match version {
        Some(FORMAT_VERSION) => {}
        Some(v) => {
            return Err(bad(format!(
                "data directory format version {v} is not supported by this build (it supports version {FORMAT_VERSION})"
            )));
        }
        None => return Err(bad("missing or invalid format_version".into())),
    }
    Ok(Identity {
        node_id: node_id.ok_or_else(|| bad("missing or invalid node_id".into()))?,
        group_count: group_count.ok_or_else(|| bad("missing or invalid group_count".into()))?,
        cluster_id,
    })
}

fn write_atomic(dir: &Path, text: &str) -> io::Result<()> {
    let path = dir.join(FILE_NAME);
    let tmp = dir.join(format!("{FILE_NAME}.tmp"));
    let mut f = File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    drop(f);
    fs::rename(&tmp, &path)?;
    File::open(dir)?.sync_all()
}

/// The group count recorded in `dir`'s identity file, if it has a readable one (blocking).
/// A node configured without a count takes it, so that a directory keeps the count it was
/// created with whatever the default of the binary that reopens it.
pub fn recorded_group_count(dir: &Path) -> Option<u32> {
    let path = dir.join(FILE_NAME);
    let text = fs::read_to_string(&path).ok()?;
    parse(&path, &text).ok().map(|id| id.group_count)
}

/// Checks the identity file of `dir` against `want`, creating it in a fresh directory
/// (blocking). `fresh_ok` says whether the directory holds no data yet.
pub fn check_or_create(dir: &Path, want: &Identity, fresh_ok: bool) -> Result<(), RaftError> {
    let path = dir.join(FILE_NAME);
    match fs::read_to_string(&path) {
        Ok(text) => {
            let have = parse(&path, &text)?;
            if have.node_id != want.node_id {
                return Err(RaftError::DataDir(format!(
                    "{} belongs to node {}, but this node is configured as node {}",
                    path.display(),
                    have.node_id,
                    want.node_id
                )));
            }
            if have.group_count != want.group_count {
                return Err(RaftError::DataDir(format!(
                    "{} was created with {} groups, but {} are configured; the group count cannot change",
                    path.display(),
                    have.group_count,
                    want.group_count
                )));
            }
            match (&have.cluster_id, &want.cluster_id) {
                (Some(h), Some(w)) if h != w => Err(RaftError::DataDir(format!(
                    "{} belongs to cluster {h:?}, but this node is configured for cluster {w:?}",
                    path.display()
                ))),
                // A directory from before clusters (or without an id) adopts the configured id.
                (None, Some(_)) => {
                    let text = render(&Identity {
                        cluster_id: want.cluster_id.clone(),
                        ..have
                    });
                    write_atomic(dir, &text).map_err(|e| RaftError::io(&path, e))
                }
                _ => Ok(()),
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if !fresh_ok {
                return Err(RaftError::DataDir(format!(
                    "{} is missing but the directory holds data; refusing to guess its format",
                    path.display()
                )));
            }
            write_atomic(dir, &render(want)).map_err(|e| RaftError::io(&path, e))
        }
        Err(e) => Err(RaftError::io(&path, e)),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn create_check_and_refuse() {
        let dir = tempfile::tempdir().unwrap();
        let id = Identity {
            node_id: 7,
            group_count: 16,
            cluster_id: None,
        };
        assert_eq!(recorded_group_count(dir.path()), None);
        check_or_create(dir.path(), &id, true).unwrap();
        check_or_create(dir.path(), &id, false).unwrap();
        assert_eq!(recorded_group_count(dir.path()), Some(16));
        let other = Identity {
            node_id: 8,
            group_count: 16,
            cluster_id: None,
        };
        assert!(check_or_create(dir.path(), &other, false).is_err());
        let other = Identity {
            node_id: 7,
            group_count: 4,
            cluster_id: None,
        };
        assert!(check_or_create(dir.path(), &other, false).is_err());

        let text = fs::read_to_string(dir.path().join(FILE_NAME)).unwrap();
        fs::write(
            dir.path().join(FILE_NAME),
            text.replace("format_version = 1", "format_version = 2"),
        )
        .unwrap();
        let err = check_or_create(dir.path(), &id, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("format version 2"), "{err}");

        let empty = tempfile::tempdir().unwrap();
        assert!(check_or_create(empty.path(), &id, false).is_err());
    }

    #[test]
    fn cluster_id_adopted_then_enforced() {
        let dir = tempfile::tempdir().unwrap();
        let id = Identity {
            node_id: 7,
            group_count: 16,
            cluster_id: None,
        };
        check_or_create(dir.path(), &id, true).unwrap();
        // A cluster id is adopted once, then enforced.
        let a = Identity {
            cluster_id: Some("prod-a".into()),
            ..id.clone()
        };
        check_or_create(dir.path(), &a, false).unwrap();
        check_or_create(dir.path(), &a, false).unwrap();
        check_or_create(dir.path(), &id, false).unwrap();
        let b = Identity {
            cluster_id: Some("prod-b".into()),
            ..id.clone()
        };
        let err = check_or_create(dir.path(), &b, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("prod-a"), "{err}");
    }
}
