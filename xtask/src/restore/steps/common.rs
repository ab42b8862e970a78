//! What every step kind shares: the context a probe and a run get, and the
//! answers they give back (neither prints; the caller reports).

use serde_json::Value;

use crate::repo::Repo;
use crate::restore::state::Paths;

/// What every step may use.
pub struct Ctx<'a> {
    pub sh: &'a xshell::Shell,
    pub repo: &'a Repo,
    pub paths: &'a Paths,
}

/// The answer of a probe.
#[derive(Debug)]
pub enum Probe {
    /// Already done: nothing to run. Warnings still reach the user.
    Warm { what: String, warnings: Vec<String> },
    /// Done with a stand-in (a cache's fallback key): nothing to run now.
    /// `partial` names the key used and what differs (the row's JSON).
    Partial { what: String, partial: Value },
    /// Work to do, and why.
    Needed(String),
}

impl Probe {
    pub fn warm(what: impl Into<String>) -> Probe {
        Probe::Warm {
            what: what.into(),
            warnings: Vec::new(),
        }
    }
}

/// What a run did. `failed` with the reason in `what`; `warnings` are whole
/// lines for the user (e.g. `MISSING <suite> <path> -> breaks: <what>`).
#[derive(Debug)]
pub struct Outcome {
    pub what: String,
    pub warnings: Vec<String>,
    pub failed: bool,
    /// Done with a stand-in (see `Probe::Partial`).
    pub partial: Option<Value>,
}

impl Outcome {
    pub fn done(what: impl Into<String>) -> Outcome {
        Outcome {
            what: what.into(),
            warnings: Vec::new(),
            failed: false,
            partial: None,
        }
    }

    pub fn failed(what: impl Into<String>) -> Outcome {
        Outcome {
            what: what.into(),
            warnings: Vec::new(),
            failed: true,
            partial: None,
        }
    }

    pub fn with_warnings(mut self, warnings: Vec<String>) -> Outcome {
        self.warnings = warnings;
        self
    }

    pub fn with_partial(mut self, partial: Option<Value>) -> Outcome {
        self.partial = partial;
        self
    }
}

/// How long ago a step's stamp says it last checked (at `checked_at`, ms
/// since the epoch), when that is less than `interval` ago: the step is
/// warm. A stamp from the future (a clock set back, a stamp copied from
/// another machine) is never warm: it would otherwise stay so for the skew
/// plus the interval.
pub fn checked_within(
    checked_at: u64,
    interval: std::time::Duration,
) -> Option<std::time::Duration> {
    let age = crate::clock::now_ms().checked_sub(checked_at)?;
    (age < interval.as_millis() as u64).then(|| std::time::Duration::from_millis(age))
}

#[cfg(test)]
mod tests {
    use super::checked_within;
    use std::time::Duration;

    #[test]
    fn a_stamp_from_the_future_or_past_the_interval_is_not_warm() {
        let now = crate::clock::now_ms();
        let hour = Duration::from_secs(3600);
        assert!(checked_within(now - 1000, hour).is_some());
        assert_eq!(checked_within(now + 3_600_000, hour), None);
        assert_eq!(checked_within(now + 1, hour), None);
        assert_eq!(checked_within(now - 3_600_001, hour), None);
        assert_eq!(checked_within(u64::MAX, hour), None);
    }
}
