//! Retries with doubling backoff: one policy for every step kind that has them (`download`, `command`).
//!
//! `retries` further attempts after the first one; `backoff` is the wait
//! before the first retry, doubled before each further one. An attempt says
//! whether another try could help (`Transient`: a timeout, a refused
//! connection, a command that exited non-zero) or not (`Permanent`: a 404, a
//! wrong pin), and a permanent failure ends the loop at once. Every retry is
//! written to the step's log and returned as a warning line, so the table
//! shows that a step only worked on its second try: a flaky network should
//! be seen, not hidden. This module never decides what a failure means.

use anyhow::Result;
use std::time::Duration;

use super::proc::Log;
use super::report::fmt_duration;

/// How often and how patiently to try again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Further attempts after the first one.
    pub retries: u32,
    /// The wait before the first retry; doubles before each further one.
    pub backoff: Duration,
}

impl Policy {
    /// The wait before retry `n` (1-based): `backoff * 2^(n-1)`, saturating.
    pub fn wait(&self, n: u32) -> Duration {
        let factor = 2u32.saturating_pow(n.saturating_sub(1));
        self.backoff.saturating_mul(factor)
    }
}

/// The answer of one attempt.
pub enum Attempt<T> {
    Ok(T),
    /// Worth another try, with the reason.
    Transient(String),
    /// Trying again would not help, with the reason.
    Permanent(String),
}

/// Why the attempts ended without a success.
#[derive(Debug, PartialEq, Eq)]
pub enum Failure {
    /// Every attempt failed transiently; the last one said `last`.
    Exhausted {
        attempts: u32,
        last: String,
    },
    Permanent(String),
}

/// The result, and one warning line per retry that was needed.
pub struct Tried<T> {
    pub result: std::result::Result<T, Failure>,
    pub warnings: Vec<String>,
}

/// Runs `attempt` until it succeeds, fails permanently, or the policy's
/// retries are used up. `what` names the thing tried in warnings (e.g.
/// "`npm ci`", "download of https://..."). An `Err` from `attempt` (the
/// tool could not be started at all) ends the loop and is returned.
pub fn run<T>(
    policy: Policy,
    what: &str,
    log: &mut Log,
    mut attempt: impl FnMut(&mut Log) -> Result<Attempt<T>>,
) -> Result<Tried<T>> {
    let attempts = policy.retries.saturating_add(1);
    let mut warnings = Vec::new();
    let mut last = String::new();
    for i in 0..attempts {
        if i > 0 {
            let wait = policy.wait(i);
            log.line(&format!(
                "retry {i} of {} in {}: {last}",
                policy.retries,
                fmt_duration(wait)
            ));
            warnings.push(format!(
                "WARNING: {what} failed on attempt {i} of {attempts} ({last}); trying again in {}",
                fmt_duration(wait)
            ));
            std::thread::sleep(wait);
        }
        match attempt(log)? {
            Attempt::Ok(v) => {
                return Ok(Tried {
                    result: Ok(v),
                    warnings,
                });
            }
            Attempt::Transient(why) => last = why,
            Attempt::Permanent(why) => {
                return Ok(Tried {
                    result: Err(Failure::Permanent(why)),
                    warnings,
                });
            }
        }
    }
    Ok(Tried {
        result: Err(Failure::Exhausted { attempts, last }),
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log() -> (tempfile::TempDir, Log) {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::create(&dir.path().join("s.log"), "test").unwrap();
        (dir, log)
    }

    #[test]
    fn backoff_doubles_and_saturates() {
        let p = Policy {
            retries: 3,
            backoff: Duration::from_millis(100),
        };
        assert_eq!(p.wait(1), Duration::from_millis(100));
        assert_eq!(p.wait(2), Duration::from_millis(200));
        assert_eq!(p.wait(3), Duration::from_millis(400));
        let huge = Policy {
            retries: 10,
            backoff: Duration::MAX / 2,
        };
        assert_eq!(huge.wait(10), Duration::MAX);
    }

    #[test]
    fn transient_failures_are_retried_and_each_retry_warns() {
        let (_d, mut log) = log();
        let p = Policy {
            retries: 2,
            backoff: Duration::ZERO,
        };
        let mut n = 0;
        let t = run(p, "`x`", &mut log, |_| {
            n += 1;
            Ok(if n < 3 {
                Attempt::Transient(format!("exit {n}"))
            } else {
                Attempt::Ok(n)
            })
        })
        .unwrap();
        assert_eq!(t.result, Ok(3));
        assert_eq!(t.warnings.len(), 2, "{:?}", t.warnings);
        assert!(
            t.warnings[0].contains("attempt 1 of 3 (exit 1)"),
            "{:?}",
            t.warnings
        );
        let text = std::fs::read_to_string(&log.path).unwrap();
        assert_eq!(text.matches("retry ").count(), 2, "{text}");

        let t = run(p, "`x`", &mut log, |_| {
            Ok(Attempt::<()>::Transient("exit 1".into()))
        })
        .unwrap();
        assert_eq!(
            t.result,
            Err(Failure::Exhausted {
                attempts: 3,
                last: "exit 1".into()
            })
        );
        let mut calls = 0;
        let t = run(p, "`x`", &mut log, |_| {
            calls += 1;
            Ok(Attempt::<()>::Permanent("HTTP 404".into()))
        })
        .unwrap();
        assert_eq!(t.result, Err(Failure::Permanent("HTTP 404".into())));
        assert_eq!(calls, 1, "a permanent failure is not retried");
        assert!(t.warnings.is_empty());
    }
}
