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
    /// true: value >= threshold passes; false: value <= threshold passes.
    pub at_least: bool,
    pub threshold: f64,
}

pub const BARS: &[Bar] = &[
    Bar {
        text: "append 100x32x128B: ursula / ref-file appends/s",
        preset: Preset::Append100x32,
        metric: "appends_per_s",
        num: ServerKind::Ursula,
        den: Some(ServerKind::RefFile),
        at_least: true,
        threshold: 10.0,
    },
    Bar {
        text: "append 100x32x128B: ursula / ref-memory appends/s",
        preset: Preset::Append100x32,
        metric: "appends_per_s",
        num: ServerKind::Ursula,
        den: Some(ServerKind::RefMemory),
        at_least: true,
        threshold: 0.6,
    },
    Bar {
        text: "append 100x32x128B: ursula p99 / ref-memory p99",
        preset: Preset::Append100x32,
        metric: "p99_us",
        num: ServerKind::Ursula,
        den: Some(ServerKind::RefMemory),
        at_least: false,
        threshold: 2.0,
    },
    Bar {
        text: "append 1x16: ursula / ref-memory appends/s",
        preset: Preset::Append1x16,
        metric: "appends_per_s",
        num: ServerKind::Ursula,
        den: Some(ServerKind::RefMemory),
        at_least: true,
        threshold: 0.5,
    },
    Bar {
        text: "read 10x1MiB/8 conns: ursula / ref-file MB/s",
        preset: Preset::Read10x1MiB,
        metric: "mb_per_s",
        num: ServerKind::Ursula,
        den: Some(ServerKind::RefFile),
        at_least: true,
        threshold: 3.0,
    },
    Bar {
        text: "fanout 100 subs @50/s: ursula p99 / ref-memory p99",
        preset: Preset::Fanout100At50,
        metric: "p99_us",
        num: ServerKind::Ursula,
        den: Some(ServerKind::RefMemory),
        at_least: false,
        threshold: 0.5,
    },
    Bar {
        text: "append 100x32x128B: ursula / floor req/s",
        preset: Preset::Append100x32,
        metric: "appends_per_s",
        num: ServerKind::Ursula,
        den: Some(ServerKind::Floor),
        at_least: true,
        threshold: 0.5,
    },
    Bar {
        text: "idle: ursula RSS per stream (bytes)",
        preset: Preset::Idle,
        metric: "rss_per_stream_bytes",
        num: ServerKind::Ursula,
        den: None,
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
            let get = |s: ServerKind| medians.get(&(b.preset, s, b.metric.to_owned())).copied();
            let value = match b.den {
                None => get(b.num),
                Some(d) => match (get(b.num), get(d)) {
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
        assert_eq!(v[0].value, Some(50.0));
        assert_eq!(v[0].verdict, "PASS");
        assert_eq!(v[0].rule, ">= 10x");
        assert_eq!(v[1].value, Some(0.5));
        assert_eq!(v[1].verdict, "FAIL");
        assert_eq!(v[2].value, Some(1.8));
        assert_eq!(v[2].verdict, "PASS");
        assert_eq!(v[5].verdict, "n/a", "zero denominator");
        assert_eq!(v[7].value, Some(4096.0));
        assert_eq!(v[7].verdict, "FAIL");
        assert_eq!(v[7].rule, "<= 2048");
    }
}
