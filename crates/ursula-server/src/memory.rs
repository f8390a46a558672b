//! The process's resident memory, and the last-resort cap on it (cluster.md §6.6: with
//! `runtime.node_memory_abort_cap_size` set, the RSS is sampled every 500 ms and the process
//! aborts once it is above the cap).
//!
//! Aborting loses nothing acknowledged (every acknowledged write is in the WAL, and on a
//! quorum in a cluster); it stops a node that would otherwise be killed by the kernel's
//! out-of-memory killer at a moment of the kernel's choosing, possibly with its neighbours.

use std::time::Duration;

/// How often the cap is checked.
const SAMPLE_EVERY: Duration = Duration::from_millis(500);

/// The resident set size of this process (`VmRSS` of `/proc/self/status`), if the platform
/// reports it.
pub fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_vm_rss(&status)
}

fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let mut words = line.split_whitespace().skip(1);
    let n: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => n.checked_mul(1024),
        _ => None,
    }
}

/// Starts the thread that aborts the process once its RSS exceeds `cap` (no thread without
/// a cap). A thread of its own, not a task: it must run when the async runtime is starved.
pub fn spawn_abort_cap(cap: Option<u64>) -> std::io::Result<()> {
    let Some(cap) = cap else {
        return Ok(());
    };
    if rss_bytes().is_none() {
        tracing::warn!(
            "runtime.node_memory_abort_cap_size is set, but this platform does not report the process's RSS; the cap is not enforced"
        );
        return Ok(());
    }
    std::thread::Builder::new()
        .name("ursula-memcap".into())
        .spawn(move || {
            loop {
                if let Some(rss) = rss_bytes()
                    && rss > cap
                {
                    tracing::error!(
                        rss_bytes = rss,
                        cap_bytes = cap,
                        "resident memory above runtime.node_memory_abort_cap_size: aborting"
                    );
                    eprintln!(
                        "ursula: resident memory {rss} bytes is above runtime.node_memory_abort_cap_size ({cap} bytes): aborting"
                    );
                    std::process::abort();
                }
                std::thread::sleep(SAMPLE_EVERY);
            }
        })
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_resident_size_is_read_from_the_status_file() {
        let status = "Name:\tursula\nVmPeak:\t  99 kB\nVmRSS:\t   12345 kB\nThreads:\t4\n";
        assert_eq!(parse_vm_rss(status), Some(12345 * 1024));
        assert_eq!(parse_vm_rss("VmRSS:\t12 MB\n"), None);
        assert_eq!(parse_vm_rss("Name:\tx\n"), None);
        assert!(rss_bytes().is_some_and(|n| n > 0), "Linux reports it");
    }
}
