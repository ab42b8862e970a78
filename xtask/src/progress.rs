//! Progress bars and spinners for people, in one style, drawn on stderr
//! only when it is a terminal.
//!
//! Every bar and spinner of the binary comes from here, so that they look
//! alike and print sizes and durations with the formatters messages use
//! (`crate::size::human`, which is indicatif's `HumanBytes`, and
//! `crate::clock::human` for the elapsed time and the ETA). A bar never
//! draws when stderr is not a terminal: indicatif's stderr target checks
//! that itself, and no ticker thread is started then, so logs and pipes get
//! no `\r` and no escape sequences. Under the global `--quiet` every
//! constructor here draws nothing; callers that print `--json` pass
//! `hidden()`.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};
use std::io::IsTerminal;
use std::time::Duration;

/// How often a spinner turns (and redraws its elapsed time).
const TICK: Duration = Duration::from_millis(120);

/// Width of the label column, so that stacked bars line up.
const LABEL: usize = 7;

/// stderr, or nowhere under `--quiet`.
fn stderr() -> ProgressDrawTarget {
    if crate::out::quiet() {
        ProgressDrawTarget::hidden()
    } else {
        ProgressDrawTarget::stderr()
    }
}

/// A bar that draws nothing, for `--quiet`, `--json` and tests.
pub fn hidden() -> ProgressBar {
    ProgressBar::hidden()
}

/// A spinner with `msg` and the time it has been turning.
pub fn spinner(msg: impl Into<String>) -> ProgressBar {
    let pb = spinner_to(stderr(), msg);
    if std::io::stderr().is_terminal() && !crate::out::quiet() {
        pb.enable_steady_tick(TICK);
    }
    pb
}

/// A bar over `len` bytes labelled `label`: done/total, rate and ETA.
pub fn bytes_bar(len: u64, label: &str) -> ProgressBar {
    bytes_bar_to(stderr(), len, label)
}

/// A count of bytes labelled `label`, for a total nobody declared (a
/// legacy cache's tar): bytes so far and rate.
pub fn bytes_count(label: &str) -> ProgressBar {
    bytes_count_to(stderr(), label)
}

/// Bars drawn one above the other (e.g. a restore's download and unpack),
/// on stderr when it is a terminal. Add bars with `MultiProgress::add`.
pub fn stack() -> indicatif::MultiProgress {
    indicatif::MultiProgress::with_draw_target(stderr())
}

fn spinner_to(target: ProgressDrawTarget, msg: impl Into<String>) -> ProgressBar {
    let style = with_durations(
        ProgressStyle::with_template("{spinner} {msg} ({elapsed})").expect("a valid template"),
    )
    .tick_chars("|/-\\ ");
    let pb = ProgressBar::with_draw_target(None, target).with_style(style);
    pb.set_message(msg.into());
    pb
}

fn bytes_bar_to(target: ProgressDrawTarget, len: u64, label: &str) -> ProgressBar {
    let template = format!(
        "{{prefix:>{LABEL}}} [{{bar:30}}] {{bytes}}/{{total_bytes}} {{bytes_per_sec}}{{eta}}"
    );
    let style = with_durations(ProgressStyle::with_template(&template).expect("a valid template"))
        .progress_chars("=> ");
    ProgressBar::with_draw_target(Some(len), target)
        .with_style(style)
        .with_prefix(label.to_string())
}

fn bytes_count_to(target: ProgressDrawTarget, label: &str) -> ProgressBar {
    let template = format!("{{prefix:>{LABEL}}} {{bytes}} {{bytes_per_sec}} ({{elapsed}})");
    let style = with_durations(ProgressStyle::with_template(&template).expect("a valid template"));
    ProgressBar::with_draw_target(None, target)
        .with_style(style)
        .with_prefix(label.to_string())
}

/// `{elapsed}` and `{eta}` through `crate::clock::human`, as in messages.
fn with_durations(style: ProgressStyle) -> ProgressStyle {
    style
        .with_key(
            "elapsed",
            |s: &ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = w.write_str(&crate::clock::human(s.elapsed()));
            },
        )
        .with_key("eta", |s: &ProgressState, w: &mut dyn std::fmt::Write| {
            // Nothing once every byte is in: `eta 1.0s` at 100% promised a
            // wait that was over.
            if s.len().is_some_and(|len| s.pos() >= len) {
                return;
            }
            // Whole seconds, at least one: an ETA is an estimate, and
            // `0.0ms` would read as "done" while bytes are still to come.
            let eta = Duration::from_secs(s.eta().as_secs_f64().ceil().max(1.0) as u64);
            let _ = w.write_str(&format!(", eta {}", crate::clock::human(eta)));
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A terminal that records what is drawn on it.
    #[derive(Clone, Debug, Default)]
    struct Screen(Arc<Mutex<String>>);

    impl Screen {
        fn text(&self) -> String {
            self.0.lock().unwrap().clone()
        }
    }

    impl indicatif::TermLike for Screen {
        fn width(&self) -> u16 {
            120
        }
        fn move_cursor_up(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_down(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn write_line(&self, s: &str) -> std::io::Result<()> {
            let mut t = self.0.lock().unwrap();
            t.push_str(s);
            t.push('\n');
            Ok(())
        }
        fn write_str(&self, s: &str) -> std::io::Result<()> {
            self.0.lock().unwrap().push_str(s);
            Ok(())
        }
        fn clear_line(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn flush(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Regression: the fetch spinner had indicatif's default bar style, an
    /// empty full-width bar without the message.
    #[test]
    fn a_spinner_shows_its_message_and_no_bar() {
        let screen = Screen::default();
        let pb = spinner_to(
            ProgressDrawTarget::term_like(Box::new(screen.clone())),
            "fetching art-cache from origin",
        );
        pb.tick();
        let text = screen.text();
        assert!(
            text.contains("fetching art-cache from origin ("),
            "{text:?}"
        );
        assert!(!text.contains('['), "no bar: {text:?}");
        assert!(!text.contains("0/0"), "no counter: {text:?}");
    }

    #[test]
    fn a_bytes_bar_shows_its_label_sizes_rate_and_eta_in_the_shared_units() {
        let screen = Screen::default();
        let pb = bytes_bar_to(
            ProgressDrawTarget::term_like(Box::new(screen.clone())),
            47 << 20,
            "fetch",
        );
        pb.set_position(3 << 20);
        pb.tick();
        let text = screen.text();
        assert!(text.starts_with("  fetch ["), "{text:?}");
        let sizes = format!(
            "{}/{}",
            crate::size::human(3 << 20),
            crate::size::human(47 << 20)
        );
        assert!(text.contains(&sizes), "{text:?} lacks {sizes}");
        assert!(text.contains("/s, eta "), "{text:?}");
        // Full: no estimate of a wait that is over.
        let screen = Screen::default();
        let pb = bytes_bar_to(
            ProgressDrawTarget::term_like(Box::new(screen.clone())),
            47 << 20,
            "fetch",
        );
        pb.set_position(47 << 20);
        pb.tick();
        let text = screen.text();
        assert!(text.contains(&crate::size::human(47 << 20)), "{text:?}");
        assert!(!text.contains("eta"), "{text:?}");
        let screen = Screen::default();
        let pb = bytes_count_to(
            ProgressDrawTarget::term_like(Box::new(screen.clone())),
            "unpack",
        );
        pb.inc(1536);
        pb.tick();
        let text = screen.text();
        assert!(text.starts_with(" unpack 1.50 KiB "), "{text:?}");
    }

    #[test]
    fn bars_are_hidden_when_stderr_is_not_a_terminal() {
        // The test harness captures stderr, so this is the hidden case
        // there, and the drawn one under `--no-capture` on a terminal.
        let hide = !std::io::stderr().is_terminal();
        assert_eq!(spinner("x").is_hidden(), hide);
        assert_eq!(bytes_bar(10, "x").is_hidden(), hide);
        assert_eq!(bytes_count("x").is_hidden(), hide);
        assert!(hidden().is_hidden());
    }
}
