//! The session-start wiring for agent sandboxes: a `SessionStart` hook in
//! `.claude/settings.json` that runs the bootstrap script.
//!
//! The file is the user's (JSON has no comments, so it carries no header):
//! the entry is merged in only when every `SessionStart` entry already there
//! has the shape this module understands, and every other key is kept as it
//! was, in order. Anything else is left untouched and the entry is printed.

use anyhow::{Context, Result};
use serde_json::{Value, json};
use std::path::Path;

use super::Row;

/// The hook's command: the script, with the restore in the background so the
/// session starts at once.
pub const HOOK: &str = "\"$CLAUDE_PROJECT_DIR\"/tools/warmstart-bootstrap.sh --background";

/// The settings file, relative to the repository root.
pub const SETTINGS: &str = ".claude/settings.json";

/// Whether the settings file already runs the bootstrap (an unreadable or
/// odd file does not).
pub fn has_hook_in(root: &Path) -> Result<bool> {
    let text = super::read_optional(&root.join(SETTINGS))?;
    Ok(text
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .is_some_and(|v| has_hook(&v)))
}

/// Merges (or, with `check`, only reports) the hook.
pub fn wire(root: &Path, check: bool) -> Result<Row> {
    let rel = SETTINGS;
    let path = root.join(rel);
    let existing = super::read_optional(&path)?;
    let entry = json!({"hooks": [{"type": "command", "command": HOOK}]});
    let mut v = match &existing {
        None => json!({}),
        Some(text) => match serde_json::from_str::<Value>(text) {
            Ok(v) => v,
            Err(e) => return by_hand(rel, &format!("it is not JSON ({e})"), &entry),
        },
    };
    if let Err(why) = understood(&v) {
        return by_hand(rel, &why, &entry);
    }
    if has_hook(&v) {
        return Ok(row(rel, "current", "SessionStart hook".into()));
    }
    if check {
        // Wiring is the user's choice: a missing hook is reported, not a failure.
        return Ok(row(
            rel,
            "unwired",
            "no SessionStart hook running the bootstrap".into(),
        ));
    }
    let hooks = v
        .as_object_mut()
        .context("checked to be an object")?
        .entry("hooks")
        .or_insert_with(|| json!({}));
    hooks
        .as_object_mut()
        .context("checked to be an object")?
        .entry("SessionStart")
        .or_insert_with(|| json!([]))
        .as_array_mut()
        .context("checked to be an array")?
        .push(entry);
    let text = serde_json::to_string_pretty(&v)? + "\n";
    super::write(root, &path, &text, false)?;
    let word = if existing.is_some() {
        "merged"
    } else {
        "created"
    };
    Ok(row(rel, word, "SessionStart hook".into()))
}

fn row(rel: &str, state: &'static str, detail: String) -> Row {
    Row {
        path: rel.to_string(),
        state,
        detail,
    }
}

fn by_hand(rel: &str, why: &str, entry: &Value) -> Result<Row> {
    Ok(row(
        rel,
        "yours",
        format!(
            "{why}; left alone: add this entry to hooks.SessionStart by hand: {}",
            serde_json::to_string(entry)?
        ),
    ))
}

/// Whether the file holds only shapes `wire` can merge into, and if not, why.
fn understood(v: &Value) -> Result<(), String> {
    let obj = v.as_object().ok_or("its top level is not an object")?;
    let Some(hooks) = obj.get("hooks") else {
        return Ok(());
    };
    let hooks = hooks.as_object().ok_or("`hooks` is not an object")?;
    let Some(list) = hooks.get("SessionStart") else {
        return Ok(());
    };
    let list = list
        .as_array()
        .ok_or("`hooks.SessionStart` is not an array")?;
    for e in list {
        let ok = e.as_object().is_some_and(|o| {
            o.iter().all(|(k, v)| match k.as_str() {
                "matcher" => v.is_string(),
                "hooks" => v.as_array().is_some_and(|hs| hs.iter().all(command_hook)),
                _ => false,
            })
        });
        if !ok {
            return Err(format!(
                "a SessionStart entry has a shape init does not know: {e}"
            ));
        }
    }
    Ok(())
}

fn command_hook(h: &Value) -> bool {
    h.as_object().is_some_and(|o| {
        o.get("type").and_then(Value::as_str) == Some("command")
            && o.get("command").is_some_and(Value::is_string)
            && o.iter().all(|(k, v)| match k.as_str() {
                "type" | "command" => true,
                "timeout" => v.is_number(),
                _ => false,
            })
    })
}

fn has_hook(v: &Value) -> bool {
    v.pointer("/hooks/SessionStart")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|e| e.get("hooks").and_then(Value::as_array))
        .flatten()
        .any(|h| {
            h.get("command")
                .and_then(Value::as_str)
                .is_some_and(|c| c.contains("tools/warmstart-bootstrap.sh"))
        })
}
