//! The orientation table that ends every restore, and its `--json` twin.
//!
//! Pure formatting: rows in, text or JSON out. One row per step: name, kind,
//! source, state, time this run, last cold time, and what it did.

use serde::Serialize;
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

use super::state::State;

#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub step: String,
    pub kind: String,
    pub source: String,
    pub state: State,
    /// What the step restored or found (or why it failed).
    pub what: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Time spent on this step in this run (probe included), in ms.
    #[serde(rename = "duration_ms")]
    pub ms: u64,
    /// How long its last cold run took, in ms (from the state file).
    pub last_cold_ms: Option<u64>,
    pub log: Option<PathBuf>,
    /// The worker running it, for `background` and `running` rows.
    pub pid: Option<u32>,
    /// With state `partial`: the key used in place of the exact one, and
    /// the key parts that differ (`cache restore --json`'s `partial`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partial: Option<serde_json::Value>,
    /// The 10-minute rule (`restore::slow`): how long its cold run took, that
    /// no cache holds its result, and the command that would cache it; null
    /// when the rule does not flag it.
    pub cache_hint: Option<String>,
}

/// A duration for people: `clock::human` (`0.4ms`, `12ms`, `1.3s`, `2m`).
pub fn fmt_duration(d: Duration) -> String {
    crate::clock::human(d)
}

pub fn fmt_ms(ms: Option<u64>) -> String {
    ms.map(|m| fmt_duration(Duration::from_millis(m)))
        .unwrap_or_else(|| "-".into())
}

/// A plain table, columns padded to their widest cell; long sources are cut.
pub fn table(rows: &[Row], this_run_label: &str) -> String {
    let cut = |s: &str, n: usize| {
        if s.chars().count() > n {
            let mut t: String = s.chars().take(n - 1).collect();
            t.push('…');
            t
        } else {
            s.to_string()
        }
    };
    let mut cells: Vec<[String; 7]> = vec![[
        "STEP".into(),
        "KIND".into(),
        "SOURCE".into(),
        "STATE".into(),
        this_run_label.into(),
        "LAST COLD".into(),
        "WHAT".into(),
    ]];
    for r in rows {
        let state = match r.pid {
            Some(pid) if matches!(r.state, State::Background | State::Running) => {
                format!("{} (pid {pid})", r.state.as_str())
            }
            _ => r.state.as_str().to_string(),
        };
        cells.push([
            r.step.clone(),
            r.kind.clone(),
            cut(&r.source, 40),
            state,
            fmt_ms_precise(r.ms),
            match r.cache_hint {
                // The flag of the 10-minute rule; the line under the table says why.
                Some(_) => format!("{} !", fmt_ms(r.last_cold_ms)),
                None => fmt_ms(r.last_cold_ms),
            },
            r.what.clone(),
        ]);
    }
    let mut widths = [0usize; 7];
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for row in &cells {
        let mut line = String::new();
        for (i, (c, w)) in row.iter().zip(widths).enumerate() {
            if i == 6 {
                line.push_str(c);
            } else {
                line.push_str(&format!("{c:<w$}  "));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    for r in rows {
        if let Some(hint) = &r.cache_hint {
            out.push_str(&format!("! slow, uncached: step {} {hint}\n", r.step));
        }
    }
    out
}

/// A row's time: rows keep whole milliseconds (their JSON `ms`), so 0 means
/// "under one", which `0.0ms` would misstate.
fn fmt_ms_precise(ms: u64) -> String {
    if ms == 0 {
        "<1ms".into()
    } else {
        fmt_duration(Duration::from_millis(ms))
    }
}

/// Nothing to show: null, or an empty list, table or text.
pub fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.values().all(is_empty),
        Value::String(s) => s.is_empty(),
        _ => false,
    }
}

/// A detail value as a person reads it: text as it is, a list joined with
/// `, `, a table as `key=value` (`key: ...` around a nested one) joined with
/// `; `. The dry run printed `{"path":[...]}` in its text output before.
pub fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(a) => a.iter().map(plain).collect::<Vec<_>>().join(", "),
        Value::Object(o) => o
            .iter()
            .filter(|(_, v)| !is_empty(v))
            .map(|(k, v)| match v {
                Value::Array(_) | Value::Object(_) => format!("{k}: {}", plain(v)),
                _ => format!("{k}={}", plain(v)),
            })
            .collect::<Vec<_>>()
            .join("; "),
        Value::Null => "none".into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(step: &str, state: State) -> Row {
        Row {
            step: step.into(),
            kind: "command".into(),
            source: "make deps".into(),
            state,
            what: "node_modules exists".into(),
            warnings: vec![],
            ms: 0,
            last_cold_ms: Some(65_000),
            log: None,
            pid: None,
            partial: None,
            cache_hint: None,
        }
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(fmt_duration(Duration::from_micros(400)), "0.4ms");
        assert_eq!(fmt_duration(Duration::from_millis(12)), "12ms");
        assert_eq!(fmt_duration(Duration::from_millis(1340)), "1.3s");
        assert_eq!(fmt_duration(Duration::from_secs(125)), "2m");
        assert_eq!(fmt_ms(None), "-");
    }

    #[test]
    fn table_has_one_aligned_row_per_step() {
        let mut bg = row("fresh-and-long-name", State::Background);
        bg.pid = Some(42);
        let t = table(&[row("deps", State::Warm), bg], "THIS RUN");
        let lines: Vec<_> = t.lines().collect();
        assert_eq!(lines.len(), 3, "{t}");
        assert!(lines[0].starts_with("STEP                 KIND"), "{t}");
        assert!(lines[1].contains("warm") && lines[1].contains("65s"), "{t}");
        assert!(lines[2].contains("background (pid 42)"), "{t}");
        assert!(!t.contains('!'), "nothing flagged: {t}");
        let mut slow = row("build", State::Done);
        slow.cache_hint = Some("took 11m cold ...: `x cache publish build`".into());
        let t = table(&[row("deps", State::Warm), slow], "THIS RUN");
        let lines: Vec<_> = t.lines().collect();
        assert_eq!(lines.len(), 4, "{t}");
        assert!(lines[2].contains("65s !"), "{t}");
        assert!(!lines[1].contains('!'), "{t}");
        assert_eq!(
            lines[3],
            "! slow, uncached: step build took 11m cold ...: `x cache publish build`"
        );
        let col = lines[0].find("STATE").unwrap();
        assert_eq!(&lines[1][col..col + 4], "warm");
        let json = serde_json::to_value(row("d", State::FailedOpen)).unwrap();
        assert_eq!(json["state"], "failed-open");
        assert_eq!(json["last_cold_ms"], 65_000);
    }
}
