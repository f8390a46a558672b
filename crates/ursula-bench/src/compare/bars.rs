//! The performance bar the project must meet, as explicit ratios of
//! medians from one compare run.

use serde::Serialize;

use super::Medians;
use crate::cli::{Preset, ServerKind};

#[derive(Debug, Clone, Copy)]
pub struct Bar {
    pub text: &'static str,
    pub preset: Preset,
    pub metric: &'static str,
    pub num: ServerKind,
    /// None: the bar is on the absolute value of `num`.
    pub den: Option<ServerKind>,
    /// The denominator's preset when it is not `preset` (a run judged against
    /// another preset of the same server).
    pub den_preset: Option<Preset>,
    /// true: value >= threshold passes; false: value <= threshold passes.
    pub at_least: bool,
    pub threshold: f64,
}

const fn ratio(
    text: &'static str,
    preset: Preset,
    metric: &'static str,
    num: ServerKind,
    den: ServerKind,
    at_least: bool,
    threshold: f64,
) -> Bar {
    Bar {
        text,
        preset,
        metric,
        num,
        den: Some(den),
        den_preset: None,
        at_least,
        threshold,
    }
}

use Preset as P;
use ServerKind as S;

const APPS: &str = "appends_per_s";
const P99: &str = "p99_us";
const MBS: &str = "mb_per_s";
const CPU: &str = super::presets::CPU_KEY;

pub const BARS: &[Bar] = &[
    // Issue 12: ahead of the fastest peer.
    ratio(
        "append 100x32: ursula / ds-rust appends/s",
        P::Append100x32,
        APPS,
        S::Ursula,
        S::DsRust,
        true,
        1.2,
    ),
    ratio(
        "append 100x32: ursula p99 / ds-rust p99",
        P::Append100x32,
        P99,
        S::Ursula,
        S::DsRust,
        false,
        1.0,
    ),
    ratio(
        "append 100x32: ursula / ursula-tonbo appends/s",
        P::Append100x32,
        APPS,
        S::Ursula,
        S::UrsulaTonbo,
        true,
        3.0,
    ),
    ratio(
        "append 1x16: ursula / ds-rust appends/s",
        P::Append1x16,
        APPS,
        S::Ursula,
        S::DsRust,
        true,
        1.2,
    ),
    ratio(
        "append 1x16: ursula p99 / ds-rust p99",
        P::Append1x16,
        P99,
        S::Ursula,
        S::DsRust,
        false,
        1.0,
    ),
    ratio(
        "append 1x16: ursula / ursula-tonbo appends/s",
        P::Append1x16,
        APPS,
        S::Ursula,
        S::UrsulaTonbo,
        true,
        3.0,
    ),
    ratio(
        "append 1000x256: ursula / ds-rust appends/s",
        P::Append1000x256,
        APPS,
        S::Ursula,
        S::DsRust,
        true,
        1.2,
    ),
    ratio(
        "append 1000x256: ursula p99 / ds-rust p99",
        P::Append1000x256,
        P99,
        S::Ursula,
        S::DsRust,
        false,
        1.0,
    ),
    ratio(
        "append 1000x256: ursula / ursula-tonbo appends/s",
        P::Append1000x256,
        APPS,
        S::Ursula,
        S::UrsulaTonbo,
        true,
        3.0,
    ),
    ratio(
        "append 10000x256: ursula / ds-rust appends/s",
        P::Append10000x256,
        APPS,
        S::Ursula,
        S::DsRust,
        true,
        1.2,
    ),
    ratio(
        "append 10000x256: ursula p99 / ds-rust p99",
        P::Append10000x256,
        P99,
        S::Ursula,
        S::DsRust,
        false,
        1.0,
    ),
    ratio(
        "append 10000x256: ursula / ursula-tonbo appends/s",
        P::Append10000x256,
        APPS,
        S::Ursula,
        S::UrsulaTonbo,
        true,
        3.0,
    ),
    ratio(
        "read 10x1MiB: ursula / ds-rust MB/s",
        P::Read10x1MiB,
        MBS,
        S::Ursula,
        S::DsRust,
        true,
        1.2,
    ),
    ratio(
        "read cold 8x16MiB: ursula / ds-rust MB/s",
        P::ReadCold,
        MBS,
        S::Ursula,
        S::DsRust,
        true,
        1.2,
    ),
    ratio(
        "fanout 100@50: ursula p99 / ds-rust p99",
        P::Fanout100At50,
        P99,
        S::Ursula,
        S::DsRust,
        false,
        0.8,
    ),
    ratio(
        "append 1000x256: ursula / floor req/s",
        P::Append1000x256,
        APPS,
        S::Ursula,
        S::Floor,
        true,
        0.5,
    ),
    ratio(
        "append 1000x256: ursula / floor server CPU per request",
        P::Append1000x256,
        CPU,
        S::Ursula,
        S::Floor,
        false,
        2.0,
    ),
    Bar {
        text: "append 100000x256 / 100x256: ursula appends/s",
        preset: P::Append100000x256,
        metric: APPS,
        num: S::Ursula,
        den: Some(S::Ursula),
        den_preset: Some(P::Append100x256),
        at_least: true,
        threshold: 0.8,
    },
    // The first benchmark issue's bars, against the Node reference.
    ratio(
        "append 100x32: ursula / ref-file appends/s",
        P::Append100x32,
        APPS,
        S::Ursula,
        S::RefFile,
        true,
        10.0,
    ),
    ratio(
        "append 100x32: ursula / ref-memory appends/s",
        P::Append100x32,
        APPS,
        S::Ursula,
        S::RefMemory,
        true,
        0.6,
    ),
    ratio(
        "append 100x32: ursula p99 / ref-memory p99",
        P::Append100x32,
        P99,
        S::Ursula,
        S::RefMemory,
        false,
        2.0,
    ),
    ratio(
        "append 1x16: ursula / ref-memory appends/s",
        P::Append1x16,
        APPS,
        S::Ursula,
        S::RefMemory,
        true,
        0.5,
    ),
    ratio(
        "read 10x1MiB/8 conns: ursula / ref-file MB/s",
        P::Read10x1MiB,
        MBS,
        S::Ursula,
        S::RefFile,
        true,
        3.0,
    ),
    ratio(
        "fanout 100 subs @50/s: ursula p99 / ref-memory p99",
        P::Fanout100At50,
        P99,
        S::Ursula,
        S::RefMemory,
        false,
        0.5,
    ),
    Bar {
        text: "idle: ursula RSS per stream (bytes)",
        preset: P::Idle,
        metric: "rss_per_stream_bytes",
        num: S::Ursula,
        den: None,
        den_preset: None,
        at_least: false,
        threshold: 2048.0,
    },
];

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Verdict {
    pub bar: String,
    pub value: Option<f64>,
    pub rule: String,
    pub verdict: &'static str,
}

pub fn evaluate(medians: &Medians) -> Vec<Verdict> {
    BARS.iter()
        .map(|b| {
            let get = |p: Preset, s: ServerKind| medians.get(&(p, s, b.metric.to_owned())).copied();
            let value = match b.den {
                None => get(b.preset, b.num),
                Some(d) => match (
                    get(b.preset, b.num),
                    get(b.den_preset.unwrap_or(b.preset), d),
                ) {
                    (Some(n), Some(d)) if d > 0.0 => Some(n / d),
                    _ => None,
                },
            };
            let rule = format!(
                "{} {}{}",
                if b.at_least { ">=" } else { "<=" },
                b.threshold,
                if b.den.is_some() { "x" } else { "" }
            );
            let verdict = match value {
                None => "n/a",
                Some(v)
                    if (b.at_least && v >= b.threshold) || (!b.at_least && v <= b.threshold) =>
                {
                    "PASS"
                }
                Some(_) => "FAIL",
            };
            Verdict {
                bar: b.text.to_owned(),
                value,
                rule,
                verdict,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(entries: &[(Preset, ServerKind, &str, f64)]) -> Medians {
        entries
            .iter()
            .map(|(p, s, k, v)| ((*p, *s, (*k).to_owned()), *v))
            .collect()
    }

    #[test]
    fn missing_data_is_not_applicable() {
        let v = evaluate(&Medians::new());
        assert_eq!(v.len(), BARS.len());
        assert!(v.iter().all(|x| x.verdict == "n/a" && x.value.is_none()));
    }

    #[test]
    fn ratios_and_directions() {
        let med = m(&[
            (
                Preset::Append100x32,
                ServerKind::Ursula,
                "appends_per_s",
                50_000.0,
            ),
            (
                Preset::Append100x32,
                ServerKind::RefFile,
                "appends_per_s",
                1_000.0,
            ),
            (
                Preset::Append100x32,
                ServerKind::RefMemory,
                "appends_per_s",
                100_000.0,
            ),
            (Preset::Append100x32, ServerKind::Ursula, "p99_us", 900.0),
            (Preset::Append100x32, ServerKind::RefMemory, "p99_us", 500.0),
            (
                Preset::Idle,
                ServerKind::Ursula,
                "rss_per_stream_bytes",
                4096.0,
            ),
            (Preset::Fanout100At50, ServerKind::Ursula, "p99_us", 10.0),
            (Preset::Fanout100At50, ServerKind::RefMemory, "p99_us", 0.0),
        ]);
        let v = evaluate(&med);
        let bar = |text: &str| match v.iter().find(|x| x.bar == text) {
            Some(x) => x.clone(),
            None => panic!("no bar {text}"),
        };
        let b = bar("append 100x32: ursula / ref-file appends/s");
        assert_eq!(
            (b.value, b.verdict, b.rule.as_str()),
            (Some(50.0), "PASS", ">= 10x")
        );
        let b = bar("append 100x32: ursula / ref-memory appends/s");
        assert_eq!((b.value, b.verdict), (Some(0.5), "FAIL"));
        let b = bar("append 100x32: ursula p99 / ref-memory p99");
        assert_eq!((b.value, b.verdict), (Some(1.8), "PASS"));
        let b = bar("fanout 100 subs @50/s: ursula p99 / ref-memory p99");
        assert_eq!(b.verdict, "n/a", "zero denominator");
        let b = bar("idle: ursula RSS per stream (bytes)");
        assert_eq!(
            (b.value, b.verdict, b.rule.as_str()),
            (Some(4096.0), "FAIL", "<= 2048")
        );
    }

    #[test]
    fn a_bar_across_presets() {
        let med = m(&[
            (
                Preset::Append100x256,
                ServerKind::Ursula,
                "appends_per_s",
                50_000.0,
            ),
            (
                Preset::Append100000x256,
                ServerKind::Ursula,
                "appends_per_s",
                45_000.0,
            ),
            (
                Preset::Append1000x256,
                ServerKind::Ursula,
                "cpu_us_per_op",
                12.0,
            ),
            (
                Preset::Append1000x256,
                ServerKind::Floor,
                "cpu_us_per_op",
                7.0,
            ),
        ]);
        let v = evaluate(&med);
        let find = |t: &str| v.iter().find(|x| x.bar == t).map(|x| (x.value, x.verdict));
        assert_eq!(
            find("append 100000x256 / 100x256: ursula appends/s"),
            Some((Some(0.9), "PASS"))
        );
        let cpu = find("append 1000x256: ursula / floor server CPU per request");
        assert!(matches!(cpu, Some((Some(r), "PASS")) if (r - 12.0 / 7.0).abs() < 1e-9));
    }
}
