//! What `compare` runs: the servers it knows, its named presets, the
//! generator arguments of each preset and the metrics taken from its JSON.

use std::time::Duration;

use clap::ValueEnum;

use crate::cli::CompareArgs;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, ValueEnum)]
pub enum ServerKind {
    /// target/release/ursula on its durable default.
    Ursula,
    /// ursula with --memory (skipped when the binary has no such flag).
    UrsulaMemory,
    /// A second ursula binary (--ursula-old-bin), for A/B runs of two builds.
    UrsulaOld,
    /// Electric's Rust server (crate durable-streams 0.1.5), durable WAL default.
    DsRust,
    /// tonbo's Ursula (crate ursula 0.11.5), single node on a disk WAL.
    UrsulaTonbo,
    /// @durable-streams/server with the file-backed store.
    RefFile,
    /// @durable-streams/server with the in-memory store.
    RefMemory,
    /// The built-in floor server.
    Floor,
}

impl ServerKind {
    pub fn name(self) -> &'static str {
        match self {
            ServerKind::Ursula => "ursula",
            ServerKind::UrsulaMemory => "ursula-memory",
            ServerKind::UrsulaOld => "ursula-old",
            ServerKind::DsRust => "ds-rust",
            ServerKind::UrsulaTonbo => "ursula-tonbo",
            ServerKind::RefFile => "ref-file",
            ServerKind::RefMemory => "ref-memory",
            ServerKind::Floor => "floor",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, ValueEnum)]
pub enum Preset {
    /// append, 100 streams, 32 connections, 128 B
    #[value(name = "append-100x32")]
    Append100x32,
    /// append, 1 stream, 16 connections, 128 B
    #[value(name = "append-1x16")]
    Append1x16,
    /// append, 100 streams, 256 connections, 128 B (the 100-stream figure the 100,000-stream
    /// run is judged against)
    #[value(name = "append-100x256")]
    Append100x256,
    /// append, 1,000 streams, 256 connections, 128 B
    #[value(name = "append-1000x256")]
    Append1000x256,
    /// append, 10,000 streams, 256 connections, 128 B
    #[value(name = "append-10000x256")]
    Append10000x256,
    /// append, 100,000 streams, 256 connections, 128 B (looks for a cliff at high stream counts)
    #[value(name = "append-100000x256")]
    Append100000x256,
    /// append --producer, 100 streams, 32 connections, 128 B
    #[value(name = "append-producer")]
    AppendProducer,
    /// read, 10 streams x 1 MiB, 8 connections
    #[value(name = "read-10x1MiB")]
    Read10x1MiB,
    /// read, 8 streams x 16 MiB, 8 connections, after the data went to the cold tier (ursula
    /// starts with 1 MiB flushes and the read waits until the cold tier holds it)
    #[value(name = "read-cold")]
    ReadCold,
    /// fanout, 100 subscribers, 50 appends/s
    #[value(name = "fanout-100@50")]
    Fanout100At50,
    /// longpoll, 100 readers on 10 streams, 50 appends/s
    #[value(name = "longpoll-100@50")]
    Longpoll100At50,
    /// create, 20,000 empty streams over 32 connections
    #[value(name = "create-20000")]
    Create20000,
    /// mixed: 32 appending connections + 4 catch-up readers + 50 SSE tails at once
    #[value(name = "mixed")]
    Mixed,
    /// idle streams (count from --idle-streams)
    #[value(name = "idle")]
    Idle,
}

impl Preset {
    pub fn name(self) -> &'static str {
        PRESET_NAMES[self as usize]
    }

    /// The floor only answers 204, so only append presets mean anything there.
    pub fn runs_on_floor(self) -> bool {
        self.is_append()
    }

    pub fn is_append(self) -> bool {
        matches!(
            self,
            Preset::Append100x32
                | Preset::Append1x16
                | Preset::Append100x256
                | Preset::Append1000x256
                | Preset::Append10000x256
                | Preset::Append100000x256
                | Preset::AppendProducer
        )
    }

    #[cfg(test)]
    pub const ALL: &[Preset] = &[
        Preset::Append100x32,
        Preset::Append1x16,
        Preset::Append100x256,
        Preset::Append1000x256,
        Preset::Append10000x256,
        Preset::Append100000x256,
        Preset::AppendProducer,
        Preset::Read10x1MiB,
        Preset::ReadCold,
        Preset::Fanout100At50,
        Preset::Longpoll100At50,
        Preset::Create20000,
        Preset::Mixed,
        Preset::Idle,
    ];
}

/// Indexed by `Preset as usize` (declaration order).
const PRESET_NAMES: &[&str] = &[
    "append-100x32",
    "append-1x16",
    "append-100x256",
    "append-1000x256",
    "append-10000x256",
    "append-100000x256",
    "append-producer",
    "read-10x1MiB",
    "read-cold",
    "fanout-100@50",
    "longpoll-100@50",
    "create-20000",
    "mixed",
    "idle",
];

pub struct MetricDef {
    pub key: &'static str,
    pub pointer: &'static str,
}

const fn m(key: &'static str, pointer: &'static str) -> MetricDef {
    MetricDef { key, pointer }
}

/// Server CPU per operation, reported by every scenario given `--server-pid`.
pub const CPU_KEY: &str = "cpu_us_per_op";

/// Metrics taken from each preset's JSON line; the first is the headline.
pub fn metric_defs(p: Preset) -> &'static [MetricDef] {
    const APPEND: &[MetricDef] = &[
        m("appends_per_s", "/appends_per_s"),
        m("mb_per_s", "/mb_per_s"),
        m("p50_us", "/latency/p50_us"),
        m("p99_us", "/latency/p99_us"),
        m("max_us", "/latency/max_us"),
        m(CPU_KEY, "/server_cpu/us_per_op"),
        m("cpu_cores", "/server_cpu/cores"),
    ];
    const READ: &[MetricDef] = &[
        m("mb_per_s", "/mb_per_s"),
        m("reads_per_s", "/reads_per_s"),
        m("p50_us", "/latency/p50_us"),
        m("p99_us", "/latency/p99_us"),
        m(CPU_KEY, "/server_cpu/us_per_op"),
        m("cpu_cores", "/server_cpu/cores"),
        m("cold_bytes", "/cold/cold_bytes"),
    ];
    const FANOUT: &[MetricDef] = &[
        m("p99_us", "/delivery/p99_us"),
        m("p50_us", "/delivery/p50_us"),
        m("max_us", "/delivery/max_us"),
        m("missed", "/missed"),
        m(CPU_KEY, "/server_cpu/us_per_op"),
        m("cpu_cores", "/server_cpu/cores"),
    ];
    const LONGPOLL: &[MetricDef] = &[
        m("p99_us", "/wake/p99_us"),
        m("p50_us", "/wake/p50_us"),
        m("max_us", "/wake/max_us"),
        m("missed", "/missed"),
        m(CPU_KEY, "/server_cpu/us_per_op"),
        m("cpu_cores", "/server_cpu/cores"),
    ];
    const CREATE: &[MetricDef] = &[
        m("creates_per_s", "/creates_per_s"),
        m("p50_us", "/latency/p50_us"),
        m("p99_us", "/latency/p99_us"),
        m(CPU_KEY, "/server_cpu/us_per_op"),
        m("cpu_cores", "/server_cpu/cores"),
    ];
    const MIXED: &[MetricDef] = &[
        m("appends_per_s", "/append/appends_per_s"),
        m("append_p99_us", "/append/latency/p99_us"),
        m("read_mb_per_s", "/read/mb_per_s"),
        m("read_p99_us", "/read/latency/p99_us"),
        m("sse_p99_us", "/fanout/delivery/p99_us"),
        m("sse_missed", "/fanout/missed"),
        m(CPU_KEY, "/server_cpu/us_per_op"),
        m("cpu_cores", "/server_cpu/cores"),
    ];
    const IDLE: &[MetricDef] = &[
        m("rss_per_stream_bytes", "/rss_per_stream_bytes"),
        m("creates_per_s", "/creates_per_s"),
    ];
    match p {
        _ if p.is_append() => APPEND,
        Preset::Read10x1MiB | Preset::ReadCold => READ,
        Preset::Fanout100At50 => FANOUT,
        Preset::Longpoll100At50 => LONGPOLL,
        Preset::Create20000 => CREATE,
        Preset::Mixed => MIXED,
        _ => IDLE,
    }
}

fn ms(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

fn strings(x: &[&str]) -> Vec<String> {
    x.iter().map(|s| (*s).to_owned()).collect()
}

/// Scenario arguments for the generator child.
pub fn preset_args(p: Preset, a: &CompareArgs, server_pid: u32) -> Vec<String> {
    let timed = |v: &[&str]| {
        let mut v = strings(v);
        v.extend([
            "--duration".into(),
            ms(a.duration),
            "--warmup".into(),
            ms(a.warmup),
        ]);
        v
    };
    let append = |streams: &str, conns: &str| {
        timed(&[
            "append",
            "--streams",
            streams,
            "-c",
            conns,
            "--body-size",
            "128",
        ])
    };
    let mut v = match p {
        Preset::Append100x32 => append("100", "32"),
        Preset::Append1x16 => append("1", "16"),
        Preset::Append100x256 => append("100", "256"),
        Preset::Append1000x256 => append("1000", "256"),
        Preset::Append10000x256 => append("10000", "256"),
        Preset::Append100000x256 => append("100000", "256"),
        Preset::AppendProducer => timed(&[
            "append",
            "--producer",
            "--streams",
            "100",
            "-c",
            "32",
            "--body-size",
            "128",
        ]),
        Preset::Read10x1MiB => timed(&[
            "read",
            "--streams",
            "10",
            "--stream-bytes",
            "1MiB",
            "-c",
            "8",
        ]),
        Preset::ReadCold => timed(&[
            "read",
            "--streams",
            "8",
            "--stream-bytes",
            "16MiB",
            "--chunk-size",
            "256KiB",
            "-c",
            "8",
            "--wait-cold",
            "30s",
        ]),
        Preset::Fanout100At50 => {
            let mut v = strings(&["fanout", "--subscribers", "100", "--rate", "50"]);
            v.extend(["--duration".into(), ms(a.duration)]);
            v
        }
        Preset::Longpoll100At50 => {
            let mut v = strings(&[
                "longpoll",
                "--readers",
                "100",
                "--streams",
                "10",
                "--rate",
                "50",
            ]);
            v.extend(["--duration".into(), ms(a.duration)]);
            v
        }
        Preset::Create20000 => strings(&["create", "--streams", "20000", "-c", "32"]),
        Preset::Mixed => timed(&["mixed"]),
        Preset::Idle => {
            let mut v = strings(&["idle", "--streams"]);
            v.push(a.idle_streams.to_string());
            v
        }
    };
    v.extend(["--server-pid".into(), server_pid.to_string()]);
    v
}

/// Hard limit for one generator run.
pub fn run_limit(p: Preset, a: &CompareArgs) -> Duration {
    match p {
        Preset::Idle | Preset::Append100000x256 | Preset::Create20000 => {
            Duration::from_secs(30 * 60)
        }
        _ => a.warmup + a.duration + Duration::from_secs(180),
    }
}

/// Presets for which `ursula` is started with a config file of its own
/// (TOML text); the others run the default node.
pub fn ursula_config(p: Preset) -> Option<&'static str> {
    match p {
        // Small flushes so almost all of the 128 MiB is cold before it is read.
        Preset::ReadCold => {
            Some("[storage.cold]\nflush_size = \"1MiB\"\nflush_interval = \"200ms\"\n")
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        assert_eq!(PRESET_NAMES.len(), Preset::ALL.len());
        for (i, p) in Preset::ALL.iter().enumerate() {
            assert_eq!(*p as usize, i);
            assert_eq!(Preset::from_str(p.name(), false).ok(), Some(*p));
            let clap_name = p.to_possible_value().map(|v| v.get_name().to_owned());
            assert_eq!(clap_name.as_deref(), Some(p.name()));
        }
        assert_eq!(Preset::Fanout100At50.name(), "fanout-100@50");
        assert!(Preset::Append100000x256.runs_on_floor());
        assert!(!Preset::Mixed.runs_on_floor());
        for k in [
            ServerKind::DsRust,
            ServerKind::UrsulaTonbo,
            ServerKind::UrsulaOld,
        ] {
            assert_eq!(ServerKind::from_str(k.name(), false).ok(), Some(k));
        }
    }
}
