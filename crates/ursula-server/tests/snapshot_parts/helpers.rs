//! Helpers shared by the multi-part snapshot tests.

#![allow(dead_code, reason = "each test file uses some")]

use super::common::*;
use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const OCTETS: &str = "application/octet-stream";
pub const WAIT: Duration = Duration::from_secs(20);

/// The snapshot digest of extensions.md §6.3.
pub fn digest(ct: &str, blob: &[u8]) -> String {
    let mut h = blake3::Hasher::new();
    h.update(&(ct.len() as u64).to_le_bytes());
    h.update(ct.as_bytes());
    h.update(blob);
    h.finalize().to_hex().to_string()
}

pub fn stage(s: &Server, p: &str, body: &[u8]) -> Response {
    s.req("POST", &format!("{p}/snapshot/0/parts"), &[], body)
}

pub fn part_id(s: &Server, p: &str, body: &[u8]) -> String {
    let r = stage(s, p, body);
    assert_eq!(r.status, 201, "{}", r.describe());
    assert!(r.header("stream-incarnation").is_some());
    r.header("stream-snapshot-part").unwrap().to_owned()
}

pub fn manifest(ids: &[&str]) -> Vec<u8> {
    ids.iter()
        .flat_map(|i| format!("{i}\n").into_bytes())
        .collect()
}

pub fn commit(
    s: &Server,
    p: &str,
    off: u64,
    ids: &[&str],
    digest: &str,
    extra: &[(&str, &str)],
) -> Response {
    let n = ids.len().to_string();
    let mut hs = vec![
        ("Content-Type", OCTETS),
        ("Stream-Snapshot-Parts", n.as_str()),
        ("Stream-Snapshot-Digest", digest),
    ];
    hs.extend_from_slice(extra);
    s.req("PUT", &format!("{p}/snapshot/{off}"), &hs, &manifest(ids))
}

/// Every file below `dir` (recursively) whose path contains `needle`.
pub fn files(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let path = e.path();
            if path.is_dir() {
                todo.push(path);
            } else if path.to_string_lossy().contains(needle) {
                out.push(path);
            }
        }
    }
    out
}

/// The error code of an answer, or its status for one without an error body.
pub fn code_of(r: &Response) -> String {
    check_error_body(r).unwrap_or_else(|_| r.status.to_string())
}

pub fn parts_on_disk(s: &Server) -> usize {
    files(&s.dir().join("cold"), "snapshot-parts").len()
}

pub fn config(dir: &Path, body: &str) -> String {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("ursula.toml");
    std::fs::write(&path, body).unwrap();
    path.to_str().unwrap().to_owned()
}

/// Sends a request's head (and `body`) but not the rest of its declared body.
pub fn stalled(
    s: &Server,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> TcpStream {
    let mut c = TcpStream::connect(s.addr()).unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    c.write_all(head.as_bytes()).unwrap();
    c.write_all(body).unwrap();
    c.flush().unwrap();
    c
}
