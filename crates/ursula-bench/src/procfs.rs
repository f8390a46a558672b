//! Resident memory of a process, from /proc/<pid>/status.

use anyhow::{Context, Result};

/// VmRSS of `pid` in KiB.
pub fn rss_kib(pid: u32) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    parse_vm_rss(&text).with_context(|| format!("no VmRSS line in {path}"))
}

pub fn parse_vm_rss(status: &str) -> Option<u64> {
    status.lines().find_map(|l| {
        let rest = l.strip_prefix("VmRSS:")?;
        let mut it = rest.split_whitespace();
        let n: u64 = it.next()?.parse().ok()?;
        match it.next() {
            Some("kB") | None => Some(n),
            Some("mB") => Some(n * 1024),
            _ => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status() {
        let s = "Name:\tnode\nVmPeak:\t 1000 kB\nVmRSS:\t   53212 kB\nThreads:\t7\n";
        assert_eq!(parse_vm_rss(s), Some(53212));
        assert_eq!(parse_vm_rss("Name: x\n"), None);
        assert_eq!(parse_vm_rss("VmRSS: lots kB\n"), None);
    }

    #[test]
    fn reads_own_rss() {
        let kib = rss_kib(std::process::id());
        assert!(matches!(kib, Ok(k) if k > 0), "{kib:?}");
        assert!(rss_kib(u32::MAX).is_err());
    }
}
