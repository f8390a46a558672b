//! Output: one JSON line on stdout per result, a human table on stderr.
//!
//! Keeping the JSON alone on stdout lets `ursula-bench ... | jq` and the
//! compare mode read results without parsing the table.

use std::io::Write;

use serde::Serialize;

use crate::stats::Latency;

/// Fields every scenario report starts with.
#[derive(Clone, Debug, Serialize)]
pub struct Header {
    pub scenario: String,
    pub target: String,
    pub layout: String,
    pub unix_time: u64,
    /// Cluster redirects (`307`) the generator followed over the whole run, setup included.
    pub redirects: u64,
}

impl Header {
    pub fn new(scenario: &str, target: &crate::target::Target) -> Self {
        let unix_time = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Self {
            scenario: scenario.to_owned(),
            target: target.base.clone(),
            layout: target.layout.as_str().to_owned(),
            unix_time,
            redirects: crate::client::redirects_followed(),
        }
    }
}

/// Print a JSON line to stdout.
pub fn json_line<T: Serialize>(value: &T) -> anyhow::Result<()> {
    let line = serde_json::to_string(value)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

/// Print text to stderr (human tables, progress notes).
pub fn note(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{text}");
}

/// A plain-text table with right-aligned columns after the first.
#[derive(Debug, Default)]
pub struct Table {
    rows: Vec<Vec<String>>,
    left_aligned: bool,
}

impl Table {
    pub fn new(header: &[&str]) -> Self {
        Self {
            rows: vec![header.iter().map(|s| (*s).to_owned()).collect()],
            left_aligned: false,
        }
    }

    /// Align every column to the left (for key/value tables).
    pub fn left(mut self) -> Self {
        self.left_aligned = true;
        self
    }

    pub fn row<S: AsRef<str>>(&mut self, cells: &[S]) -> &mut Self {
        self.rows
            .push(cells.iter().map(|s| s.as_ref().to_owned()).collect());
        self
    }

    pub fn render(&self) -> String {
        let cols = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let mut width = vec![0usize; cols];
        for r in &self.rows {
            for (i, c) in r.iter().enumerate() {
                width[i] = width[i].max(c.chars().count());
            }
        }
        let mut out = String::new();
        for (ri, r) in self.rows.iter().enumerate() {
            let mut line = String::new();
            for (i, w) in width.iter().enumerate() {
                let c = r.get(i).map(String::as_str).unwrap_or("");
                let pad = w.saturating_sub(c.chars().count());
                if i == 0 || self.left_aligned {
                    if i > 0 {
                        line.push_str("  ");
                    }
                    line.push_str(c);
                    line.push_str(&" ".repeat(pad));
                } else {
                    line.push_str("  ");
                    line.push_str(&" ".repeat(pad));
                    line.push_str(c);
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
            if ri == 0 {
                let total: usize = width.iter().sum::<usize>() + 2 * cols.saturating_sub(1);
                out.push_str(&"-".repeat(total));
                out.push('\n');
            }
        }
        out
    }
}

/// Key/value table for a single scenario result.
pub fn kv_table(title: &str, rows: &[(&str, String)]) -> String {
    let mut t = Table::new(&[title, ""]).left();
    for (k, v) in rows {
        t.row(&[*k, v.as_str()]);
    }
    t.render()
}

pub fn fmt_latency(l: &Latency) -> String {
    format!(
        "p50 {} p90 {} p99 {} max {}",
        fmt_us(l.p50_us),
        fmt_us(l.p90_us),
        fmt_us(l.p99_us),
        fmt_us(l.max_us)
    )
}

pub fn fmt_us(us: f64) -> String {
    if us >= 1_000_000.0 {
        format!("{:.2}s", us / 1_000_000.0)
    } else if us >= 1000.0 {
        format!("{:.2}ms", us / 1000.0)
    } else {
        format!("{us:.0}us")
    }
}

pub fn fmt_num(x: f64) -> String {
    if x == 0.0 {
        "0".to_owned()
    } else if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else if x.abs() >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns() {
        let mut t = Table::new(&["name", "value"]);
        t.row(&["a", "1"]).row(&["longer", "12345"]);
        let s = t.render();
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines[0], "name    value");
        assert_eq!(lines[1], "-------------");
        assert_eq!(lines[2], "a           1");
        assert_eq!(lines[3], "longer  12345");
        let s = kv_table("t", &[("k", "v".to_owned()), ("key2", "value".to_owned())]);
        assert_eq!(s.lines().nth(2), Some("k     v"));
        assert_eq!(s.lines().nth(3), Some("key2  value"));
    }

    #[test]
    fn units() {
        assert_eq!(fmt_us(12.4), "12us");
        assert_eq!(fmt_us(1500.0), "1.50ms");
        assert_eq!(fmt_us(2_500_000.0), "2.50s");
        assert_eq!(fmt_num(1234.5), "1234");
        assert_eq!(fmt_num(2.345), "2.35");
        assert_eq!(fmt_num(-0.0), "0");
    }
}
