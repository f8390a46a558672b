//! `compare`: start each server fresh, run a preset against it with the load
//! generator pinned to other cores, stop it; alternate servers (A B A B ...)
//! for every preset in every round; print medians, ratios and the bar.

pub mod bars;
pub mod peers;
pub mod presets;
pub mod servers;

use std::collections::BTreeMap;
use std::process::ExitCode;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::cli::{CompareArgs, Preset, ServerKind, TargetArgs};
use crate::report::{Table, fmt_num, json_line, note};
use crate::stats::median;
use presets::{metric_defs, preset_args, run_limit};
use servers::Env;

/// Median of each (preset, server, metric) over the rounds.
pub type Medians = BTreeMap<(Preset, ServerKind, String), f64>;

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
    let server = servers::start(kind, env, presets::ursula_config(preset))?;
    let mut gen_args = vec![
        "--url".to_owned(),
        server.url(),
        "--layout".to_owned(),
        server.layout.unwrap_or(target.layout).as_str().to_owned(),
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
    let by_status: Vec<(String, f64)> = v
        .get("errors")
        .and_then(|e| e.as_object())
        .map(|o| {
            o.iter()
                .filter_map(|(status, n)| Some((format!("errors_{status}"), n.as_f64()?)))
                .collect()
        })
        .unwrap_or_default();
    // fold from +0.0: an empty f64 sum is -0.0
    let errors = by_status.iter().map(|(_, n)| n).fold(0.0, |a, b| a + b);
    values.push(("errors".to_owned(), errors));
    // Each status (or transport error) too, kept in the final JSON's samples.
    values.extend(by_status);
    Ok(values)
}

fn render(
    args: &CompareArgs,
    active: &[ServerKind],
    med: &Medians,
    verdicts: &[bars::Verdict],
) -> String {
    // Ratios are against the strongest peer that took part.
    let base_kind = [ServerKind::DsRust, ServerKind::RefMemory]
        .into_iter()
        .find(|k| active.contains(k))
        .unwrap_or(ServerKind::RefMemory);
    let mut out = format!(
        "\nmedians of {} rounds, {} s per run (ratio: vs {})\n",
        args.rounds,
        args.duration.as_secs_f64(),
        base_kind.name()
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
        if let Some(base) = med.get(&(p, base_kind, head.clone())).filter(|b| **b > 0.0) {
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
        for &p in Preset::ALL {
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
