//! `compare`: start each server fresh, run a preset against it with the load
//! generator pinned to other cores, stop it; alternate servers (A B A B ...)
//! for every preset in every round; print medians, ratios and the bar.

pub mod bars;
pub mod servers;

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::cli::{CompareArgs, Preset, ServerKind, TargetArgs};
use crate::report::{Table, fmt_num, json_line, note};
use crate::stats::median;
use servers::Env;

/// Median of each (preset, server, metric) over the rounds.
pub type Medians = BTreeMap<(Preset, ServerKind, String), f64>;

struct MetricDef {
    key: &'static str,
    pointer: &'static str,
}

const fn m(key: &'static str, pointer: &'static str) -> MetricDef {
    MetricDef { key, pointer }
}

/// Metrics taken from each preset's JSON line; the first is the headline.
fn metric_defs(p: Preset) -> &'static [MetricDef] {
    const APPEND: &[MetricDef] = &[
        m("appends_per_s", "/appends_per_s"),
        m("mb_per_s", "/mb_per_s"),
        m("p50_us", "/latency/p50_us"),
        m("p99_us", "/latency/p99_us"),
        m("max_us", "/latency/max_us"),
    ];
    const READ: &[MetricDef] = &[
        m("mb_per_s", "/mb_per_s"),
        m("reads_per_s", "/reads_per_s"),
        m("p50_us", "/latency/p50_us"),
        m("p99_us", "/latency/p99_us"),
    ];
    const FANOUT: &[MetricDef] = &[
        m("p99_us", "/delivery/p99_us"),
        m("p50_us", "/delivery/p50_us"),
        m("max_us", "/delivery/max_us"),
        m("missed", "/missed"),
    ];
    const LONGPOLL: &[MetricDef] = &[
        m("p99_us", "/wake/p99_us"),
        m("p50_us", "/wake/p50_us"),
        m("max_us", "/wake/max_us"),
        m("missed", "/missed"),
    ];
    const IDLE: &[MetricDef] = &[
        m("rss_per_stream_bytes", "/rss_per_stream_bytes"),
        m("creates_per_s", "/creates_per_s"),
    ];
    match p {
        Preset::Append100x32
        | Preset::Append1x16
        | Preset::Append100x256
        | Preset::AppendProducer => APPEND,
        Preset::Read10x1MiB => READ,
        Preset::Fanout100At50 => FANOUT,
        Preset::Longpoll100At50 => LONGPOLL,
        Preset::Idle => IDLE,
    }
}

fn secs(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// Scenario arguments for the generator child.
fn preset_args(p: Preset, a: &CompareArgs, server_pid: u32) -> Vec<String> {
    let timed = |mut v: Vec<String>| {
        v.extend([
            "--duration".into(),
            secs(a.duration),
            "--warmup".into(),
            secs(a.warmup),
        ]);
        v
    };
    let s = |x: &[&str]| x.iter().map(|s| (*s).to_owned()).collect::<Vec<String>>();
    match p {
        Preset::Append100x32 => timed(s(&[
            "append",
            "--streams",
            "100",
            "-c",
            "32",
            "--body-size",
            "128",
        ])),
        Preset::Append1x16 => timed(s(&[
            "append",
            "--streams",
            "1",
            "-c",
            "16",
            "--body-size",
            "128",
        ])),
        Preset::Append100x256 => timed(s(&[
            "append",
            "--streams",
            "100",
            "-c",
            "256",
            "--body-size",
            "128",
        ])),
        Preset::AppendProducer => timed(s(&[
            "append",
            "--producer",
            "--streams",
            "100",
            "-c",
            "32",
            "--body-size",
            "128",
        ])),
        Preset::Read10x1MiB => timed(s(&[
            "read",
            "--streams",
            "10",
            "--stream-bytes",
            "1MiB",
            "-c",
            "8",
        ])),
        Preset::Fanout100At50 => {
            let mut v = s(&["fanout", "--subscribers", "100", "--rate", "50"]);
            v.extend(["--duration".into(), secs(a.duration)]);
            v
        }
        Preset::Longpoll100At50 => {
            let mut v = s(&[
                "longpoll",
                "--readers",
                "100",
                "--streams",
                "10",
                "--rate",
                "50",
            ]);
            v.extend(["--duration".into(), secs(a.duration)]);
            v
        }
        Preset::Idle => {
            let mut v = s(&["idle", "--streams"]);
            v.push(a.idle_streams.to_string());
            v.extend(["--server-pid".into(), server_pid.to_string()]);
            v
        }
    }
}

/// Hard limit for one generator run.
fn run_limit(p: Preset, a: &CompareArgs) -> Duration {
    match p {
        Preset::Idle => Duration::from_secs(30 * 60),
        _ => a.warmup + a.duration + Duration::from_secs(180),
    }
}

#[derive(Debug, Serialize)]
struct CompareReport {
    scenario: &'static str,
    rounds: usize,
    duration_s: f64,
    pinned: Option<String>,
    servers: Vec<&'static str>,
    skipped: BTreeMap<&'static str, String>,
    medians: BTreeMap<String, BTreeMap<&'static str, BTreeMap<String, f64>>>,
    samples: BTreeMap<String, BTreeMap<&'static str, BTreeMap<String, Vec<f64>>>>,
    bars: Vec<bars::Verdict>,
    failures: Vec<String>,
}

pub fn run(target: &TargetArgs, args: &CompareArgs, quiet: bool) -> Result<ExitCode> {
    if args.rounds < 3 {
        note("warning: fewer than 3 rounds; the project's numbers are medians of >= 3 rounds");
    }
    let pin = if args.no_pin {
        None
    } else {
        servers::pin_plan()
    };
    let env = Env::new(&args.paths, pin)?;
    match &env.pin {
        Some((s, g)) => note(&format!(
            "pinning: servers on CPU {s}, load generator on CPU {g}"
        )),
        None => note("pinning: off (no taskset, fewer than 2 CPUs, or --no-pin)"),
    }
    let mut active = Vec::new();
    let mut skipped = BTreeMap::new();
    for &kind in &args.servers {
        if active.contains(&kind) {
            continue;
        }
        match servers::availability(kind, &env) {
            Ok(()) => active.push(kind),
            Err(why) => {
                note(&format!("skipping {}: {why}", kind.name()));
                skipped.insert(kind.name(), why);
            }
        }
    }

    let mut samples: BTreeMap<(Preset, ServerKind, String), Vec<f64>> = BTreeMap::new();
    let mut failures = Vec::new();
    for round in 1..=args.rounds {
        for &preset in &args.scenarios {
            for &kind in &active {
                if kind == ServerKind::Floor && !preset.runs_on_floor() {
                    continue;
                }
                let tag = format!(
                    "round {round}/{} {} on {}",
                    args.rounds,
                    preset.name(),
                    kind.name()
                );
                match run_one(&env, target, args, preset, kind) {
                    Ok(values) => {
                        let head = metric_defs(preset)[0].key;
                        let shown = values
                            .iter()
                            .find(|(k, _)| k == head)
                            .map_or("n/a".to_owned(), |(_, v)| fmt_num(*v));
                        note(&format!("{tag}: {head} {shown}"));
                        for (k, v) in values {
                            samples.entry((preset, kind, k)).or_default().push(v);
                        }
                    }
                    Err(e) => {
                        note(&format!("{tag}: FAILED: {e:#}"));
                        failures.push(format!("{tag}: {e:#}"));
                    }
                }
            }
        }
    }

    let medians: Medians = samples
        .iter()
        .filter_map(|(k, v)| median(v).map(|m| (k.clone(), m)))
        .collect();
    let verdicts = bars::evaluate(&medians);
    if !quiet {
        note(&render(args, &active, &medians, &verdicts));
    }
    let mut med_json: BTreeMap<String, BTreeMap<&'static str, BTreeMap<String, f64>>> =
        BTreeMap::new();
    for ((p, s, k), v) in &medians {
        med_json
            .entry(p.name().to_owned())
            .or_default()
            .entry(s.name())
            .or_default()
            .insert(k.clone(), *v);
    }
    let mut sample_json: BTreeMap<String, BTreeMap<&'static str, BTreeMap<String, Vec<f64>>>> =
        BTreeMap::new();
    for ((p, s, k), v) in &samples {
        sample_json
            .entry(p.name().to_owned())
            .or_default()
            .entry(s.name())
            .or_default()
            .insert(k.clone(), v.clone());
    }
    let ran_anything = !samples.is_empty();
    json_line(&CompareReport {
        scenario: "compare",
        rounds: args.rounds,
        duration_s: args.duration.as_secs_f64(),
        pinned: env
            .pin
            .as_ref()
            .map(|(s, g)| format!("server {s}, generator {g}")),
        servers: active.iter().map(|k| k.name()).collect(),
        skipped,
        medians: med_json,
        samples: sample_json,
        bars: verdicts,
        failures,
    })?;
    Ok(if ran_anything {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Start `kind`, run `preset` once, stop it; the metrics of that run.
fn run_one(
    env: &Env,
    target: &TargetArgs,
    args: &CompareArgs,
    preset: Preset,
    kind: ServerKind,
) -> Result<Vec<(String, f64)>> {
    let server = servers::start(kind, env)?;
    let mut gen_args = vec![
        "--url".to_owned(),
        server.url(),
        "--layout".to_owned(),
        target.layout.as_str().to_owned(),
        "--bucket".to_owned(),
        target.bucket.clone(),
        "--quiet".to_owned(),
    ];
    gen_args.extend(preset_args(preset, args, server.pid));
    let out = servers::run_generator(env, &gen_args, run_limit(preset, args));
    let log = server.log_tail();
    server.stop()?;
    let out = out.with_context(|| format!("server log tail:\n{log}"))?;
    let line = out
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .context("the generator printed no JSON line")?;
    let v: serde_json::Value = serde_json::from_str(line)?;
    let mut values: Vec<(String, f64)> = metric_defs(preset)
        .iter()
        .filter_map(|d| {
            v.pointer(d.pointer)
                .and_then(|x| x.as_f64())
                .map(|x| (d.key.to_owned(), x))
        })
        .collect();
    let errors: f64 = v
        .get("errors")
        .and_then(|e| e.as_object())
        .map_or(0.0, |o| {
            // fold from +0.0: an empty f64 sum is -0.0
            o.values()
                .filter_map(|x| x.as_f64())
                .fold(0.0, |a, b| a + b)
        });
    values.push(("errors".to_owned(), errors));
    Ok(values)
}

fn render(
    args: &CompareArgs,
    active: &[ServerKind],
    med: &Medians,
    verdicts: &[bars::Verdict],
) -> String {
    let mut out = format!(
        "\nmedians of {} rounds, {} s per run (ratio: vs ref-memory)\n",
        args.rounds,
        args.duration.as_secs_f64()
    );
    for &p in &args.scenarios {
        let mut header = vec![p.name()];
        header.extend(active.iter().map(|k| k.name()));
        let mut t = Table::new(&header);
        let mut keys: Vec<&str> = metric_defs(p).iter().map(|d| d.key).collect();
        keys.push("errors");
        for key in keys {
            let mut row = vec![key.to_owned()];
            for &s in active {
                row.push(
                    med.get(&(p, s, key.to_owned()))
                        .map_or("-".to_owned(), |v| fmt_num(*v)),
                );
            }
            t.row(&row);
        }
        let head = metric_defs(p)[0].key.to_owned();
        if let Some(base) = med
            .get(&(p, ServerKind::RefMemory, head.clone()))
            .filter(|b| **b > 0.0)
        {
            let mut row = vec![format!("{head} ratio")];
            for &s in active {
                row.push(
                    med.get(&(p, s, head.clone()))
                        .map_or("-".to_owned(), |v| format!("{:.2}x", v / base)),
                );
            }
            t.row(&row);
        }
        out.push_str(&t.render());
        out.push('\n');
    }
    let mut t = Table::new(&["performance bar", "value", "rule", "verdict"]);
    for v in verdicts {
        t.row(&[
            v.bar.clone(),
            v.value.map_or("-".to_owned(), |x| format!("{x:.2}")),
            v.rule.clone(),
            v.verdict.to_owned(),
        ]);
    }
    out.push_str(&t.render());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn compare_args(extra: &[&str]) -> CompareArgs {
        let mut v = vec!["ursula-bench", "compare"];
        v.extend_from_slice(extra);
        match crate::cli::Cli::try_parse_from(v).map(|c| c.command) {
            Ok(crate::cli::Command::Compare(a)) => a,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn preset_args_parse_as_generator_commands() {
        let a = compare_args(&["--duration", "2s", "--idle-streams", "500"]);
        for &p in &a.scenarios {
            let mut argv = vec!["ursula-bench".to_owned(), "--quiet".to_owned()];
            argv.extend(preset_args(p, &a, 1234));
            let parsed = crate::cli::Cli::try_parse_from(&argv);
            assert!(parsed.is_ok(), "{p:?}: {argv:?}: {:?}", parsed.err());
        }
        let idle = preset_args(Preset::Idle, &a, 1234);
        assert!(
            idle.windows(2)
                .any(|w| w[0] == "--streams" && w[1] == "500")
        );
        assert!(
            idle.windows(2)
                .any(|w| w[0] == "--server-pid" && w[1] == "1234")
        );
    }

    #[test]
    fn every_preset_has_a_headline_metric() {
        for p in [
            Preset::Append100x32,
            Preset::Append1x16,
            Preset::Append100x256,
            Preset::AppendProducer,
            Preset::Read10x1MiB,
            Preset::Fanout100At50,
            Preset::Longpoll100At50,
            Preset::Idle,
        ] {
            assert!(!metric_defs(p).is_empty());
        }
        for b in bars::BARS {
            assert!(
                metric_defs(b.preset).iter().any(|d| d.key == b.metric),
                "{}",
                b.text
            );
        }
    }
}
