//! The two Rust peer servers `compare` measures against, installed by
//! `scripts/install-bench-peers.sh` into `bench/peers/` (git-ignored), each at
//! an exact version:
//!
//! - `ds-rust`: crate `durable-streams` 0.1.5, binary `durable-streams-server`,
//!   started with `--port P --data-dir D` on its default `--durability wal`
//!   (group-commit `fdatasync` before the acknowledgement).
//! - `ursula-tonbo`: crate `ursula` 0.11.5, binary `ursula`, started as
//!   `ursula server --config D/ursula.toml`: a single node on a disk WAL with
//!   `fsync = "always"` and no cold tier (the config below).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use crate::target::Layout;

pub const DS_RUST_VERSION: &str = "0.1.5";
pub const URSULA_TONBO_VERSION: &str = "0.11.5";

pub fn ds_rust_bin(peers: &Path) -> PathBuf {
    peers.join("ds-rust/bin/durable-streams-server")
}

pub fn ursula_tonbo_bin(peers: &Path) -> PathBuf {
    peers.join("ursula-tonbo/bin/ursula")
}

/// Why a peer binary cannot be used, naming the command that installs it.
pub fn check_installed(bin: &Path, version: &str, which: &str) -> std::result::Result<(), String> {
    if bin.is_file() {
        // cargo records what it installed next to the bin dir.
        let crates = bin
            .parent()
            .and_then(Path::parent)
            .map(|root| root.join(".crates.toml"));
        if let Some(c) = crates
            && let Ok(text) = std::fs::read_to_string(c)
            && !text.contains(&format!(" {version} "))
        {
            return Err(format!(
                "{} is not version {version} (reinstall: scripts/install-bench-peers.sh {which})",
                bin.display()
            ));
        }
        return Ok(());
    }
    Err(format!(
        "{} not installed (run scripts/install-bench-peers.sh {which})",
        bin.display()
    ))
}

/// ds-rust's arguments. Its paths are plain: a stream is whatever path it is
/// PUT at, so the native `{bucket}/{stream}` layout works as it is.
pub fn ds_rust_args(port: u16, data: &Path) -> Vec<String> {
    vec![
        "--port".into(),
        port.to_string(),
        "--data-dir".into(),
        data.display().to_string(),
    ]
}

/// The single-node disk-WAL config of tonbo's Ursula. Its admin plane needs
/// a port of its own; its WAL directory lives in the fresh data dir.
pub fn ursula_tonbo_config(port: u16, admin_port: u16, data: &Path) -> String {
    format!(
        "[server]\n\
         listen = \"127.0.0.1:{port}\"\n\
         admin_listen = \"127.0.0.1:{admin_port}\"\n\
         cluster_id = \"ursula-bench\"\n\
         \n\
         [raft]\n\
         node_id = 1\n\
         \n\
         [[raft.peers]]\n\
         node_id = 1\n\
         url = \"http://127.0.0.1:{port}\"\n\
         \n\
         [raft.wal]\n\
         path = \"{}\"\n\
         fsync = \"always\"\n",
        data.join("wal").display()
    )
}

/// tonbo's Ursula addresses streams as `/{bucket}/{stream}` and needs the
/// bucket created first.
pub const URSULA_TONBO_LAYOUT: Layout = Layout::Native;

/// Wait until `GET /__ursula/ready` answers 200 (the node answers HTTP, and
/// even creates streams in some groups, before all its Raft groups have
/// leaders), then PUT the bucket until it answers 2xx or 409 (it exists);
/// bounded by `limit` in all.
pub fn create_bucket(port: u16, bucket: &str, limit: Duration) -> Result<()> {
    let deadline = Instant::now() + limit;
    let mut last = String::from("no answer");
    loop {
        match super::servers::http_status(port, "GET", "/__ursula/ready") {
            Some(200) => break,
            Some(s) => last = format!("ready: status {s}"),
            None => last = "ready: no answer".to_owned(),
        }
        if Instant::now() >= deadline {
            bail!("GET /__ursula/ready never answered 200 within {limit:?} ({last})");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    while Instant::now() < deadline {
        match super::servers::http_status(port, "PUT", &format!("/{bucket}")) {
            Some(s) if (200..300).contains(&s) || s == 409 => return Ok(()),
            Some(s) => last = format!("status {s}"),
            None => last = "no answer".to_owned(),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("PUT /{bucket} never succeeded within {limit:?} ({last})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tonbo_config_is_single_node_durable() {
        let c = ursula_tonbo_config(4000, 4001, Path::new("/tmp/d"));
        assert!(c.contains("listen = \"127.0.0.1:4000\""));
        assert!(c.contains("admin_listen = \"127.0.0.1:4001\""));
        assert!(c.contains("path = \"/tmp/d/wal\""));
        assert!(c.contains("fsync = \"always\""));
    }

    #[test]
    fn missing_peer_says_how_to_install() {
        let e = check_installed(Path::new("/nonexistent/bin/x"), "1.0.0", "ds-rust");
        assert!(
            matches!(e, Err(ref m) if m.contains("install-bench-peers.sh ds-rust")),
            "{e:?}"
        );
        assert_eq!(
            ds_rust_bin(Path::new("/p")),
            PathBuf::from("/p/ds-rust/bin/durable-streams-server")
        );
    }
}
