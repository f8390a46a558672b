//! Command line: global target options plus one subcommand per scenario.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, bail};
use clap::{Args, Parser, Subcommand};

pub use crate::compare::presets::{Preset, ServerKind};
use crate::target::{Layout, Target};

#[derive(Debug, Parser)]
#[command(
    name = "ursula-bench",
    version,
    about = "Load generator for Durable Streams servers (Ursula, the Node reference, the floor).",
    after_help = "Each scenario prints one JSON line on stdout and a human table on stderr."
)]
pub struct Cli {
    #[command(flatten)]
    pub target: TargetArgs,

    /// Tokio worker threads for the load generator (default: CPUs this
    /// process may run on; 1 means a single-threaded runtime).
    #[arg(long, global = true)]
    pub threads: Option<usize>,

    /// Print only the JSON line(s), no human table.
    #[arg(long, global = true)]
    pub quiet: bool,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Args)]
pub struct TargetArgs {
    /// Base URL of the server under test.
    #[arg(
        long,
        global = true,
        default_value = "http://127.0.0.1:4437",
        env = "URSULA_BENCH_URL"
    )]
    pub url: String,

    /// URL layout: native `{base}/{bucket}/{stream}` or compat `{base}/v1/stream/{name}`.
    #[arg(long, global = true, value_enum, default_value_t = Layout::Native)]
    pub layout: Layout,

    /// Bucket for the native layout.
    #[arg(long, global = true, default_value = "bench")]
    pub bucket: String,
}

impl TargetArgs {
    pub fn target(&self) -> Result<Target> {
        Target::parse(&self.url, self.layout, &self.bucket)
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Appends to N streams over C keep-alive connections.
    Append(AppendArgs),
    /// Catch-up reads of pre-filled streams.
    Read(ReadArgs),
    /// M SSE subscribers on one text/plain stream, one writer at R appends/s.
    Fanout(FanoutArgs),
    /// Long-poll readers woken by a writer at R appends/s.
    Longpoll(LongpollArgs),
    /// Create K streams with one small append each; report server RSS per stream.
    Idle(IdleArgs),
    /// Create K empty streams (PUT only) over C connections: creation throughput.
    Create(CreateArgs),
    /// Appends, catch-up reads and SSE tails at once.
    Mixed(MixedArgs),
    /// Append more than the hot tier holds (default 4 GiB over 100 streams), sample server
    /// RSS, measure the data dir, read every byte back and verify it.
    ColdSoak(ColdSoakArgs),
    /// Every scenario for about a second with tiny sizes; non-zero exit if the
    /// generator failed (not on speed).
    Smoke(SmokeArgs),
    /// Trivial HTTP server: reads each request body and answers 204.
    Floor(FloorArgs),
    /// Start servers, alternate them for several rounds, print medians and ratios.
    Compare(CompareArgs),
}

#[derive(Debug, Clone, Args)]
pub struct AppendArgs {
    #[arg(long, default_value_t = 100)]
    pub streams: usize,
    #[arg(long, short = 'c', default_value_t = 32)]
    pub connections: usize,
    /// Bytes per append (accepts 128, 4KiB, 1MiB, ...).
    #[arg(long, default_value = "128", value_parser = parse_size)]
    pub body_size: usize,
    /// Measured time (accepts 10s, 500ms, 2m, or seconds).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Unmeasured time before the measurement starts.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Append through idempotent producers (Producer-Id/-Epoch/-Seq).
    #[arg(long)]
    pub producer: bool,
    /// Server process whose CPU time is read from /proc over the measured window
    /// (omit: no CPU figures).
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// List the requests slower than this (e.g. 2ms), grouped into bursts of overlapping
    /// ones: when the tail comes from (omit: no list).
    #[arg(long, value_parser = parse_duration)]
    pub slow_over: Option<Duration>,
}

#[derive(Debug, Clone, Args)]
pub struct ReadArgs {
    #[arg(long, default_value_t = 10)]
    pub streams: usize,
    /// Bytes pre-filled into each stream.
    #[arg(long, default_value = "1MiB", value_parser = parse_size)]
    pub stream_bytes: usize,
    /// Bytes per append while pre-filling.
    #[arg(long, default_value = "16KiB", value_parser = parse_size)]
    pub chunk_size: usize,
    #[arg(long, short = 'c', default_value_t = 8)]
    pub connections: usize,
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// After the pre-fill, wait up to this long for the server's `cold_bytes` metric
    /// (`/__ursula/metrics`) to cover --cold-target of the bytes written, so the reads are of
    /// cold data (0: do not wait; a server without the metric is read at once).
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub wait_cold: Duration,
    /// The share of the pre-filled bytes --wait-cold waits for.
    #[arg(long, default_value_t = 0.9)]
    pub cold_target: f64,
    /// Receive bodies through hyper, copying every byte into the generator. By default (on
    /// Linux) bodies are spliced into /dev/null inside the kernel, so that the generator's
    /// receive copy does not cap the MB/s measured.
    #[arg(long)]
    pub copy_bodies: bool,
    /// Server process whose CPU time is read from /proc over the measured window
    /// (omit: no CPU figures).
    #[arg(long)]
    pub server_pid: Option<u32>,
}

#[derive(Debug, Clone, Args)]
pub struct FanoutArgs {
    #[arg(long, default_value_t = 100)]
    pub subscribers: usize,
    /// Appends per second by the single writer.
    #[arg(long, default_value_t = 50.0)]
    pub rate: f64,
    #[arg(long, default_value = "64", value_parser = parse_size)]
    pub body_size: usize,
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// How long to wait for late deliveries after the writer stops.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub grace: Duration,
    /// Server process whose CPU time is read from /proc over the measured window
    /// (omit: no CPU figures).
    #[arg(long)]
    pub server_pid: Option<u32>,
}

#[derive(Debug, Clone, Args)]
pub struct LongpollArgs {
    #[arg(long, default_value_t = 100)]
    pub readers: usize,
    /// Streams the readers are spread over (reader i waits on stream i % streams).
    #[arg(long, default_value_t = 10)]
    pub streams: usize,
    /// Appends per second in total, round-robin over the streams.
    #[arg(long, default_value_t = 50.0)]
    pub rate: f64,
    /// `timeout_ms` query parameter of each long-poll.
    #[arg(long, default_value_t = 5000)]
    pub timeout_ms: u64,
    #[arg(long, default_value = "64", value_parser = parse_size)]
    pub body_size: usize,
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub grace: Duration,
    /// Server process whose CPU time is read from /proc over the measured window
    /// (omit: no CPU figures).
    #[arg(long)]
    pub server_pid: Option<u32>,
}

#[derive(Debug, Clone, Args)]
pub struct IdleArgs {
    #[arg(long, default_value_t = 100_000)]
    pub streams: usize,
    #[arg(long, short = 'c', default_value_t = 32)]
    pub connections: usize,
    #[arg(long, default_value = "16", value_parser = parse_size)]
    pub body_size: usize,
    /// Server process whose VmRSS is read from /proc (omit: no memory figures).
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Pause after creating before reading RSS the second time.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub settle: Duration,
}

#[derive(Debug, Clone, Args)]
pub struct CreateArgs {
    #[arg(long, default_value_t = 20_000)]
    pub streams: usize,
    #[arg(long, short = 'c', default_value_t = 32)]
    pub connections: usize,
    /// Server process whose CPU time is read from /proc over the measured window
    /// (omit: no CPU figures).
    #[arg(long)]
    pub server_pid: Option<u32>,
}

#[derive(Debug, Clone, Args)]
pub struct MixedArgs {
    /// Streams the appenders write to.
    #[arg(long, default_value_t = 100)]
    pub append_streams: usize,
    /// Appending connections (closed loop, 128 B bodies).
    #[arg(long, default_value_t = 32)]
    pub append_connections: usize,
    /// Catch-up reader connections, over 10 pre-filled streams of 1 MiB.
    #[arg(long, default_value_t = 4)]
    pub readers: usize,
    /// SSE subscribers on one stream a writer appends to at --sse-rate.
    #[arg(long, default_value_t = 50)]
    pub subscribers: usize,
    #[arg(long, default_value_t = 50.0)]
    pub sse_rate: f64,
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Server process whose CPU time is read from /proc over the measured window
    /// (omit: no CPU figures).
    #[arg(long)]
    pub server_pid: Option<u32>,
}

#[derive(Debug, Clone, Args)]
pub struct ColdSoakArgs {
    #[arg(long, default_value_t = 100)]
    pub streams: usize,
    /// Bytes appended in all (spread evenly over the streams).
    #[arg(long, default_value = "4GiB", value_parser = parse_size)]
    pub total_bytes: usize,
    /// Bytes per append.
    #[arg(long, default_value = "256KiB", value_parser = parse_size)]
    pub append_size: usize,
    #[arg(long, short = 'c', default_value_t = 8)]
    pub connections: usize,
    /// Server process whose VmRSS is sampled (omit: no memory figures).
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// The server's data dir, measured after the appends (omit: no disk figures).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// How often the server's RSS is sampled.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    pub rss_interval: Duration,
    /// The WAL counts as purged once it has not shrunk for this long.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub purge_settle: Duration,
    /// Longest wait for the WAL to be purged.
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    pub purge_timeout: Duration,
    /// Without --data-dir: before reading, wait up to this long for the server's
    /// `cold_bytes` metric to become non-zero, so the read spans both tiers.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub wait_cold: Duration,
    /// Attempts per append (503s and transport errors are retried) before giving up.
    #[arg(long, default_value_t = 600)]
    pub max_attempts: u32,
    /// Do not append: read back and verify the streams of this earlier run id (same
    /// --streams and --total-bytes).
    #[arg(long)]
    pub run: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct SmokeArgs {
    /// Also fail on non-2xx answers, lost deliveries or scenarios without
    /// progress (for a real Durable Streams server, not the floor).
    #[arg(long)]
    pub strict: bool,
    /// Server pid for the idle scenario's memory figures.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Time per scenario.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Start this server on a free loopback port (fresh temp dir), run the
    /// smoke against it, stop it; --url is then ignored.
    #[arg(long, value_enum)]
    pub spawn: Option<ServerKind>,
    #[command(flatten)]
    pub paths: ServerPaths,
}

/// Where the servers that compare (and smoke --spawn) start come from.
#[derive(Debug, Clone, Args)]
pub struct ServerPaths {
    /// The ursula binary.
    #[arg(long, default_value = "target/release/ursula")]
    pub ursula_bin: PathBuf,
    /// Directory holding package.json, node_modules and reference-server.mjs
    /// (default: the workspace's bench/).
    #[arg(long)]
    pub bench_dir: Option<PathBuf>,
    /// A second ursula binary, started as `ursula-old` (e.g. a build of an older commit).
    #[arg(long)]
    pub ursula_old_bin: Option<PathBuf>,
    /// Where scripts/install-bench-peers.sh installed the peer servers (default:
    /// `peers/` in the bench dir).
    #[arg(long)]
    pub peers_dir: Option<PathBuf>,
    /// Node.js executable for the reference server.
    #[arg(long, default_value = "node")]
    pub node: String,
    /// How long a server may take to answer HTTP after start.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub ready_timeout: Duration,
}

#[derive(Debug, Clone, Args)]
pub struct FloorArgs {
    #[arg(long, default_value = "127.0.0.1:4440")]
    pub listen: SocketAddr,
}

#[derive(Debug, Clone, Args)]
pub struct CompareArgs {
    /// Rounds; each round runs every server once per scenario (A B A B ...).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "ursula,ds-rust,ursula-tonbo,ref-memory,floor"
    )]
    pub servers: Vec<ServerKind>,
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "append-100x32,append-1x16,append-100x256,append-1000x256,append-10000x256,append-100000x256,append-producer,read-10x1MiB,read-cold,fanout-100@50,longpoll-100@50,create-20000,mixed"
    )]
    pub scenarios: Vec<Preset>,
    /// Measured time of each throughput/latency run.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Streams created by the idle scenario.
    #[arg(long, default_value_t = 100_000)]
    pub idle_streams: usize,
    /// Do not pin server and load generator to different cores.
    #[arg(long)]
    pub no_pin: bool,
    #[command(flatten)]
    pub paths: ServerPaths,
}

/// "10s", "250ms", "2m", "1.5" (seconds).
pub fn parse_duration(s: &str) -> Result<Duration> {
    let s = s.trim();
    let (num, scale) = if let Some(n) = s.strip_suffix("us").or_else(|| s.strip_suffix("µs")) {
        (n, 0.000_001)
    } else if let Some(n) = s.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else {
        (s, 1.0)
    };
    let v: f64 = match num.trim().parse() {
        Ok(v) => v,
        Err(_) => bail!("invalid duration {s:?} (try 10s, 500ms, 700us, 2m)"),
    };
    if !v.is_finite() || v < 0.0 {
        bail!("invalid duration {s:?}");
    }
    Ok(Duration::from_secs_f64(v * scale))
}

/// "128", "4KiB", "4k", "1MiB", "1M" (binary multiples).
pub fn parse_size(s: &str) -> Result<usize> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let (num, mult) = [
        ("kib", 1usize << 10),
        ("mib", 1 << 20),
        ("gib", 1 << 30),
        ("kb", 1 << 10),
        ("mb", 1 << 20),
        ("k", 1 << 10),
        ("m", 1 << 20),
        ("b", 1),
    ]
    .iter()
    .find_map(|(suf, m)| lower.strip_suffix(suf).map(|n| (n.trim().to_owned(), *m)))
    .unwrap_or((lower.clone(), 1));
    let v: usize = match num.parse() {
        Ok(v) => v,
        Err(_) => bail!("invalid size {s:?} (try 128, 4KiB, 1MiB)"),
    };
    match v.checked_mul(mult) {
        Some(x) => Ok(x),
        None => bail!("size {s:?} too large"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    fn parse(args: &[&str]) -> Cli {
        let mut v = vec!["ursula-bench"];
        v.extend_from_slice(args);
        match Cli::try_parse_from(v) {
            Ok(c) => c,
            Err(e) => panic!("{args:?}: {e}"),
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s").ok(), Some(Duration::from_secs(10)));
        assert_eq!(
            parse_duration("250ms").ok(),
            Some(Duration::from_millis(250))
        );
        assert_eq!(parse_duration("2m").ok(), Some(Duration::from_secs(120)));
        assert_eq!(
            parse_duration("700us").ok(),
            Some(Duration::from_micros(700))
        );
        assert_eq!(
            parse_duration("1.5").ok(),
            Some(Duration::from_millis(1500))
        );
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("128").ok(), Some(128));
        assert_eq!(parse_size("4KiB").ok(), Some(4096));
        assert_eq!(parse_size("4k").ok(), Some(4096));
        assert_eq!(parse_size("1MiB").ok(), Some(1 << 20));
        assert_eq!(parse_size("2 MB").ok(), Some(2 << 20));
        assert_eq!(parse_size("10b").ok(), Some(10));
        assert!(parse_size("x").is_err());
        assert!(parse_size("1.5k").is_err());
    }

    #[test]
    fn append_defaults_and_flags() {
        let c = parse(&["append"]);
        let Command::Append(a) = c.command else {
            panic!("not append")
        };
        assert_eq!((a.streams, a.connections, a.body_size), (100, 32, 128));
        assert_eq!(a.duration, Duration::from_secs(10));
        assert!(!a.producer);
        assert_eq!(c.target.url, "http://127.0.0.1:4437");
        assert_eq!(c.target.layout, Layout::Native);

        let c = parse(&[
            "append",
            "--producer",
            "--streams",
            "1",
            "-c",
            "16",
            "--body-size",
            "1KiB",
            "--duration",
            "500ms",
            "--url",
            "http://127.0.0.1:9000",
            "--layout",
            "compat",
        ]);
        let Command::Append(a) = c.command else {
            panic!("not append")
        };
        assert!(a.producer);
        assert_eq!((a.streams, a.connections, a.body_size), (1, 16, 1024));
        assert_eq!(a.duration, Duration::from_millis(500));
        assert_eq!(c.target.layout, Layout::Compat);
        assert_eq!(c.target.url, "http://127.0.0.1:9000");
    }

    #[test]
    fn global_options_before_subcommand() {
        let c = parse(&[
            "--url",
            "http://127.0.0.1:1/x",
            "--bucket",
            "b2",
            "--quiet",
            "read",
        ]);
        assert!(c.quiet);
        assert_eq!(c.target.bucket, "b2");
        let t = c.target.target();
        assert_eq!(
            t.map(|t| t.stream_path("s")).ok().as_deref(),
            Some("/x/b2/s")
        );
        assert!(matches!(c.command, Command::Read(ref r) if r.stream_bytes == 1 << 20));
    }

    #[test]
    fn idle_fanout_longpoll_floor() {
        let c = parse(&["idle", "--streams", "1000", "--server-pid", "42"]);
        assert!(
            matches!(c.command, Command::Idle(ref i) if i.streams == 1000 && i.server_pid == Some(42))
        );
        let c = parse(&["fanout", "--subscribers", "3", "--rate", "20"]);
        assert!(
            matches!(c.command, Command::Fanout(ref f) if f.subscribers == 3 && f.rate == 20.0)
        );
        let c = parse(&["longpoll", "--timeout-ms", "500"]);
        assert!(
            matches!(c.command, Command::Longpoll(ref l) if l.timeout_ms == 500 && l.readers == 100)
        );
        let c = parse(&[
            "smoke",
            "--strict",
            "--spawn",
            "ref-memory",
            "--node",
            "/usr/bin/node",
        ]);
        assert!(matches!(c.command, Command::Smoke(ref s)
            if s.strict && s.spawn == Some(ServerKind::RefMemory) && s.paths.node == "/usr/bin/node"));
        let c = parse(&["floor", "--listen", "127.0.0.1:5555"]);
        assert!(matches!(c.command, Command::Floor(ref f) if f.listen.port() == 5555));
        assert!(Cli::try_parse_from(["ursula-bench", "floor", "--listen", "nope"]).is_err());
        assert!(Cli::try_parse_from(["ursula-bench", "append", "--layout", "weird"]).is_err());
    }

    #[test]
    fn cold_soak_defaults() {
        let c = parse(&["cold-soak"]);
        let Command::ColdSoak(a) = c.command else {
            panic!("not cold-soak")
        };
        assert_eq!(
            (a.streams, a.total_bytes, a.append_size),
            (100, 4 << 30, 256 << 10)
        );
        assert!(a.run.is_none() && a.server_pid.is_none() && a.data_dir.is_none());
        let c = parse(&[
            "cold-soak",
            "--total-bytes",
            "64MiB",
            "--streams",
            "10",
            "--server-pid",
            "7",
            "--data-dir",
            "/tmp/x",
            "--run",
            "abc",
        ]);
        assert!(matches!(c.command, Command::ColdSoak(ref a)
            if a.total_bytes == 64 << 20 && a.server_pid == Some(7) && a.run.as_deref() == Some("abc")));
    }

    #[test]
    fn compare_lists() {
        let c = parse(&["compare"]);
        let Command::Compare(a) = c.command else {
            panic!("not compare")
        };
        assert_eq!(a.rounds, 3);
        assert_eq!(a.servers.len(), 5);
        assert_eq!(a.scenarios.len(), 13);
        let c = parse(&[
            "compare",
            "--servers",
            "floor,ref-memory",
            "--scenarios",
            "append-1x16,fanout-100@50",
        ]);
        let Command::Compare(a) = c.command else {
            panic!("not compare")
        };
        assert_eq!(a.servers, vec![ServerKind::Floor, ServerKind::RefMemory]);
        assert_eq!(a.scenarios, vec![Preset::Append1x16, Preset::Fanout100At50]);
        for p in a.scenarios {
            assert_eq!(Preset::from_str(p.name(), false).ok(), Some(p));
        }
    }
}
