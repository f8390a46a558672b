//! Facts about the server process from /proc: resident memory
//! (`/proc/<pid>/status`) and CPU time (`/proc/<pid>/stat`).

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;

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

/// Clock ticks per second of the utime/stime fields (USER_HZ, 100 on every
/// Linux the bench runs on; the kernel exports a fixed value there).
const TICKS_PER_S: u64 = 100;

/// User + system CPU time of `pid` (all its threads, dead ones included).
pub fn cpu_time(pid: u32) -> Result<Duration> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let ticks = parse_cpu_ticks(&text).with_context(|| format!("no utime/stime in {path}"))?;
    Ok(Duration::from_millis(ticks * 1000 / TICKS_PER_S))
}

/// utime + stime (fields 14 and 15) of a /proc/<pid>/stat line. The command
/// name (field 2) is in parentheses and may hold spaces, so fields are
/// counted from the last ')'.
pub fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    // After the name: state is field 3, so utime (14) is the 12th here.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// Server CPU over a scenario's measured window.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ServerCpu {
    /// CPU seconds (user + system) the server used in the window.
    pub cpu_s: f64,
    /// Cores kept busy on average (cpu_s / window seconds).
    pub cores: f64,
    /// What one operation is in `us_per_op` (e.g. "append", "GET").
    pub op: &'static str,
    /// Operations counted in the window.
    pub ops: u64,
    /// CPU microseconds per operation.
    pub us_per_op: Option<f64>,
}

/// CPU time of the server at the two ends of a window; sampled by a task so
/// the scenario's own tasks do not have to.
pub struct CpuProbe {
    handle: Option<tokio::task::JoinHandle<Option<(Duration, Duration)>>>,
}

impl CpuProbe {
    /// Sample `pid` at `start` and at `end` (no-op without a pid).
    pub fn over(pid: Option<u32>, start: Instant, end: Instant) -> Self {
        let handle = pid.map(|pid| {
            tokio::spawn(async move {
                tokio::time::sleep_until(start.into()).await;
                let t0 = cpu_time(pid).ok()?;
                let s0 = Instant::now();
                tokio::time::sleep_until(end.into()).await;
                let t1 = cpu_time(pid).ok()?;
                Some((t1.saturating_sub(t0), s0.elapsed()))
            })
        });
        Self { handle }
    }

    /// Starts now, ends when `finish` is called.
    pub fn start(pid: Option<u32>) -> OpenProbe {
        OpenProbe {
            pid,
            at: pid
                .and_then(|p| cpu_time(p).ok())
                .map(|t| (t, Instant::now())),
        }
    }

    /// The CPU used in the window, divided by `ops`; None without a pid or if
    /// the process could not be read.
    pub async fn finish(self, op: &'static str, ops: u64) -> Option<ServerCpu> {
        let (cpu, wall) = self.handle?.await.ok()??;
        Some(server_cpu(cpu, wall, op, ops))
    }
}

/// A probe whose window is "from start() until finish()".
pub struct OpenProbe {
    pid: Option<u32>,
    at: Option<(Duration, Instant)>,
}

impl OpenProbe {
    /// End the window now; the operations can be counted afterwards.
    pub fn finish_later(self) -> CpuSpan {
        let span = match (self.at, self.pid) {
            (Some((t0, s0)), Some(pid)) => cpu_time(pid)
                .ok()
                .map(|t1| (t1.saturating_sub(t0), s0.elapsed())),
            _ => None,
        };
        CpuSpan { span }
    }

    pub fn finish(self, op: &'static str, ops: u64) -> Option<ServerCpu> {
        self.finish_later().finish(op, ops)
    }
}

/// CPU used and wall time of a closed window.
pub struct CpuSpan {
    span: Option<(Duration, Duration)>,
}

impl CpuSpan {
    pub fn finish(self, op: &'static str, ops: u64) -> Option<ServerCpu> {
        let (cpu, wall) = self.span?;
        Some(server_cpu(cpu, wall, op, ops))
    }
}

fn server_cpu(cpu: Duration, wall: Duration, op: &'static str, ops: u64) -> ServerCpu {
    let cpu_s = cpu.as_secs_f64();
    ServerCpu {
        cpu_s,
        cores: cpu_s / wall.as_secs_f64().max(1e-9),
        op,
        ops,
        us_per_op: (ops > 0).then(|| cpu_s * 1e6 / ops as f64),
    }
}

/// "12.3 µs/append (0.85 cores)" or "n/a (no --server-pid)".
pub fn fmt_cpu(c: &Option<ServerCpu>) -> String {
    match c {
        None => "n/a (no --server-pid)".to_owned(),
        Some(c) => match c.us_per_op {
            Some(us) => format!("{us:.1} µs/{} ({:.2} cores)", c.op, c.cores),
            None => format!("{:.2} cores, no {}", c.cores, c.op),
        },
    }
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

    #[test]
    fn parses_stat_with_odd_command_names() {
        let line =
            "4242 (my (odd) prog) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 9 0 1 2 3";
        assert_eq!(parse_cpu_ticks(line), Some(325));
        assert_eq!(parse_cpu_ticks("4242 (x) S 1 2"), None);
        assert_eq!(parse_cpu_ticks("no parens"), None);
    }

    #[test]
    fn own_cpu_time_grows() {
        let before = cpu_time(std::process::id()).unwrap_or_default();
        let mut x = 0u64;
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(60) {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        std::hint::black_box(x);
        let after = cpu_time(std::process::id()).unwrap_or_default();
        assert!(after > before, "{before:?} -> {after:?}");
        assert!(cpu_time(u32::MAX).is_err());
    }

    #[test]
    fn per_op_figures() {
        let c = server_cpu(
            Duration::from_millis(500),
            Duration::from_secs(1),
            "append",
            1000,
        );
        assert_eq!(c.us_per_op, Some(500.0));
        assert!((c.cores - 0.5).abs() < 1e-9);
        assert_eq!(
            server_cpu(Duration::ZERO, Duration::from_secs(1), "GET", 0).us_per_op,
            None
        );
        assert!(fmt_cpu(&Some(c)).starts_with("500.0 µs/append"));
        assert!(fmt_cpu(&None).starts_with("n/a"));
    }
}
