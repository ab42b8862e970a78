//! The line `resume-cmd` prints: which launcher resumes a session, and the
//! quoting that makes the line safe to paste into a POSIX shell.
//!
//! Pure text in, text out. Every word taken from the index (cwd, launcher,
//! session id) is either made of characters no shell treats specially or is
//! single-quoted; text with control or format characters (a newline, an
//! escape that would drive the terminal, a bidi override that makes the line
//! read differently from what runs) is refused rather than printed. The
//! index never chooses a program by path: a repo that could (a `/`) or that
//! hides what it is falls back to the `repoGolem` launcher.

use super::json::{Object, Str, Value, is_invisible};

/// What `resume-cmd` resolved for one entry.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ResumeLine {
    pub launcher: String,
    #[serde(rename = "sessionId")]
    pub session: String,
    pub cwd: Option<String>,
    /// The whole shell line: `[cd <cwd> && ]<launcher> --resume <session>`
    /// (`shell_command` in `--json`: `command` there is the envelope's).
    #[serde(rename = "shell_command")]
    pub command: String,
    /// Why the repo could not name the launcher, when it fell back to
    /// `repoGolem` for that reason (printed on stderr, not in `--json`).
    #[serde(skip)]
    pub warning: Option<String>,
}

/// The launcher used when the repository is unknown or unusable.
pub const FALLBACK: &str = "repoGolem";

/// The launcher for a repository: `<repo lowercased>Claude`, `orcClaude` for
/// the orchestrator, `repoGolem` when the repository is unknown. A repo that
/// would make the launcher a path (`/`), or that holds control or format
/// characters or a lone surrogate, also gives `repoGolem`, with the reason.
pub fn launcher(repo: Option<&Str>) -> (String, Option<String>) {
    let Some(repo) = repo else {
        return (FALLBACK.into(), None);
    };
    let Some(text) = repo.to_str() else {
        let why = format!(
            "the repo {repo:?} holds a lone surrogate, so it cannot name a launcher; using {FALLBACK}"
        );
        return (FALLBACK.into(), Some(why));
    };
    let name = text.trim().to_lowercase();
    let unusable = if name.contains('/') {
        Some("a '/', which would make the launcher a path")
    } else if name.chars().any(is_invisible) {
        Some("control or format characters, which hide what would run")
    } else {
        None
    };
    if let Some(what) = unusable {
        let why = format!("the repo {repo:?} holds {what}; using {FALLBACK}");
        return (FALLBACK.into(), Some(why));
    }
    match name.as_str() {
        "" | "unknown" | "null" => (FALLBACK.into(), None),
        "orchestrator" => ("orcClaude".into(), None),
        other => (format!("{other}Claude"), None),
    }
}

/// One shell word for `text`: bare when every character is harmless,
/// otherwise single-quoted (a quote inside becomes `'\''`). `None` when the
/// text holds a control or format character, which no quoting makes safe to
/// display.
pub fn shell_word(text: &str) -> Option<String> {
    if text.chars().any(is_invisible) {
        return None;
    }
    let harmless = |c: char| c.is_ascii_alphanumeric() || "_./:@+,-".contains(c);
    if !text.is_empty() && text.chars().all(harmless) {
        return Some(text.to_string());
    }
    Some(format!("'{}'", text.replace('\'', r"'\''")))
}

/// Builds the resume line for an index entry, or says what makes it unusable.
pub fn resume_line(entry: &Object) -> Result<ResumeLine, String> {
    let text = |field: &str, what: &str| -> Result<Option<String>, String> {
        match entry.get(&Str::from(field)) {
            Some(Value::String(s)) if !s.is_empty() => s
                .to_str()
                .map(Some)
                .ok_or_else(|| format!("has a {what} with a lone surrogate ({s:?})")),
            _ => Ok(None),
        }
    };
    let session = text("sessionId", "session id")?.ok_or("has no sessionId")?;
    let cwd = text("cwd", "cwd")?;
    let (launcher, warning) = launcher(entry.get(&Str::from("repo")).and_then(Value::as_str));
    let word = |what: &str, text: &str| {
        shell_word(text).ok_or_else(|| {
            format!(
                "has a {what} with control characters or invisible format characters ({:?})",
                Str::from(text)
            )
        })
    };
    let mut command = String::new();
    if let Some(cwd) = &cwd {
        command = format!("cd {} && ", word("cwd", cwd)?);
    }
    command.push_str(&format!(
        "{} --resume {}",
        word("repo", &launcher)?,
        word("session id", &session)?
    ));
    Ok(ResumeLine {
        launcher,
        session,
        cwd,
        command,
        warning,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resume::json;
    use serde_json::json;

    /// The entry written by serde_json, read as the index reads it.
    fn entry(v: serde_json::Value) -> Object {
        let v = json::parse(&serde_json::to_vec(&v).unwrap()).unwrap();
        v.as_object().unwrap().clone()
    }

    fn line(v: serde_json::Value) -> Result<String, String> {
        resume_line(&entry(v)).map(|l| l.command)
    }

    fn name(repo: &str) -> String {
        launcher(Some(&Str::from(repo))).0
    }

    #[test]
    fn launchers() {
        assert_eq!(name("Warmstart"), "warmstartClaude");
        assert_eq!(name("orchestrator"), "orcClaude");
        assert_eq!(name("Orchestrator"), "orcClaude");
        assert_eq!(name(" ws "), "wsClaude");
        assert_eq!(launcher(None), ("repoGolem".into(), None));
        assert_eq!(launcher(Some(&Str::from(""))), ("repoGolem".into(), None));
        assert_eq!(name("unknown"), "repoGolem");
    }

    #[test]
    fn a_repo_that_could_name_a_path_or_hide_text_falls_back_with_a_reason() {
        for repo in [
            "lc/x",
            "/bin/sh",
            "../x",
            "a\u{202e}b",
            "\u{200b}",
            "x\u{feff}",
            "a\nb",
            "\u{2066}x\u{2069}",
        ] {
            let (name, why) = launcher(Some(&Str::from(repo)));
            assert_eq!(name, "repoGolem", "{repo:?}");
            assert!(why.is_some_and(|w| w.contains("repoGolem")), "{repo:?}");
        }
        let lone = json::parse(b"\"x\\ud83d\"").unwrap();
        let (name, why) = launcher(lone.as_str());
        assert_eq!(name, "repoGolem");
        assert!(why.unwrap().contains("lone surrogate"));
    }

    #[test]
    fn plain_and_cwd_lines() {
        assert_eq!(
            line(json!({"sessionId": "0b1c-2d", "repo": "ws"})).unwrap(),
            "wsClaude --resume 0b1c-2d"
        );
        assert_eq!(
            line(json!({"sessionId": "a", "repo": null, "cwd": "/w/my repo"})).unwrap(),
            "cd '/w/my repo' && repoGolem --resume a"
        );
    }

    #[test]
    fn hostile_text_is_quoted_or_refused() {
        assert_eq!(
            line(json!({"sessionId": "x'; rm -rf ~; '", "repo": "a;b"})).unwrap(),
            r"'a;bClaude' --resume 'x'\''; rm -rf ~; '\'''"
        );
        assert_eq!(shell_word("$(id)`id`").unwrap(), "'$(id)`id`'");
        assert_eq!(shell_word("").unwrap(), "''");
        assert_eq!(shell_word("a=b").unwrap(), "'a=b'");
        assert!(line(json!({"sessionId": "a\nid", "repo": "r"})).is_err());
        assert!(line(json!({"sessionId": "a\u{1b}]0;x\u{7}", "repo": "r"})).is_err());
        assert!(line(json!({"repo": "r"})).is_err());
        // Bidi and zero-width characters would make the line read
        // differently from what runs: refused, like control characters.
        assert!(line(json!({"sessionId": "a\u{202e}b", "repo": "r"})).is_err());
        assert!(line(json!({"sessionId": "a", "cwd": "/w/\u{2067}x", "repo": "r"})).is_err());
    }
}
