//! The line `resume-cmd` prints: which launcher resumes a session, and the
//! quoting that makes the line safe to paste into a POSIX shell.
//!
//! Pure text in, text out. Every word taken from the index (cwd, launcher,
//! session id) is either made of characters no shell treats specially or is
//! single-quoted; text with control characters (a newline, an escape that
//! would drive the terminal) is refused rather than printed.

use serde_json::{Map, Value};

/// What `resume-cmd` resolved for one entry.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ResumeLine {
    pub launcher: String,
    #[serde(rename = "sessionId")]
    pub session: String,
    pub cwd: Option<String>,
    /// The whole shell line: `[cd <cwd> && ]<launcher> --resume <session>`.
    pub command: String,
}

/// The launcher for a repository: `<repo lowercased>Claude`, `orcClaude` for
/// the orchestrator, `repoGolem` when the repository is unknown.
pub fn launcher(repo: Option<&str>) -> String {
    let repo = repo.map(str::trim).unwrap_or("").to_lowercase();
    match repo.as_str() {
        "" | "unknown" | "null" => "repoGolem".into(),
        "orchestrator" => "orcClaude".into(),
        other => format!("{other}Claude"),
    }
}

/// One shell word for `text`: bare when every character is harmless,
/// otherwise single-quoted (a quote inside becomes `'\''`). `None` when the
/// text holds a control character, which no quoting makes safe to display.
pub fn shell_word(text: &str) -> Option<String> {
    if text.chars().any(char::is_control) {
        return None;
    }
    let harmless = |c: char| c.is_ascii_alphanumeric() || "_./:@+,-".contains(c);
    if !text.is_empty() && text.chars().all(harmless) {
        return Some(text.to_string());
    }
    Some(format!("'{}'", text.replace('\'', r"'\''")))
}

/// Builds the resume line for an index entry, or says what makes it unusable.
pub fn resume_line(entry: &Map<String, Value>) -> Result<ResumeLine, String> {
    let session = match entry.get("sessionId") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        _ => return Err("has no sessionId".into()),
    };
    let cwd = match entry.get("cwd") {
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        _ => None,
    };
    let launcher = launcher(entry.get("repo").and_then(Value::as_str));
    let word = |what: &str, text: &str| {
        shell_word(text).ok_or_else(|| format!("has a {what} with control characters ({text:?})"))
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
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn line(v: Value) -> Result<String, String> {
        resume_line(v.as_object().unwrap()).map(|l| l.command)
    }

    #[test]
    fn launchers() {
        assert_eq!(launcher(Some("Warmstart")), "warmstartClaude");
        assert_eq!(launcher(Some("orchestrator")), "orcClaude");
        assert_eq!(launcher(Some("Orchestrator")), "orcClaude");
        assert_eq!(launcher(None), "repoGolem");
        assert_eq!(launcher(Some("")), "repoGolem");
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
    }
}
