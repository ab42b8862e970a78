//! The crash-resume index (`cargo xtask resume`): which agent session ran on
//! which terminal surface, so a crashed or recycled machine can resume it.
//!
//! It shares one file and one lock protocol with the existing JavaScript
//! tool. `json` is JSON as JavaScript holds it (lone surrogates included),
//! `index` the file format (pure), `lock` the lock directory
//! protocol, `store` reading and durable writing under the lock, `command`
//! the shell line that resumes a session. This module turns arguments into
//! calls on those and prints the results. It never writes a corrupt index
//! and never prints a shell line with unquoted text from the index.

pub mod command;
pub mod index;
pub mod json;
pub mod lock;
pub mod store;

use crate::cli::resume::{ResumeArgs, ResumeCommand};
use crate::exit::{Code, fail};
use anyhow::{Context, Result};
use index::{Record, is_older, last_seen_ms, to_js_string};
use json::{Object, Str, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use store::{Store, now_ms};

/// The index path: `--path`, else `$CRASH_RESUME_INDEX_PATH` (when not
/// empty), else `$HOME/.golems/crash-resume-index.json`.
pub fn index_path(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(path) = explicit {
        return Ok(path.to_path_buf());
    }
    if let Some(path) = std::env::var_os("CRASH_RESUME_INDEX_PATH").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(home) => Ok(Path::new(&home).join(".golems/crash-resume-index.json")),
        None => Err(fail(
            Code::Usage,
            "HOME is not set, so there is no default crash-resume index: pass --path FILE or set CRASH_RESUME_INDEX_PATH",
        )),
    }
}

/// Records a session; the library form of `resume record`.
pub fn record(store: &Store, rec: &Record, reinit: bool) -> Result<()> {
    for (what, text) in [("surface", rec.surface), ("session id", rec.session)] {
        if text.is_empty() || text.chars().any(char::is_control) {
            return Err(fail(
                Code::Usage,
                format!(
                    "the {what} {text:?} is empty or holds control characters; pass the id as printed by the terminal or agent"
                ),
            ));
        }
    }
    // The JavaScript tool refuses an empty repo too; a blank one would only
    // ever resume with the fallback launcher.
    if rec.repo.trim().is_empty() {
        return Err(fail(
            Code::Usage,
            format!(
                "the repo {:?} is empty or blank; pass the repository's name (e.g. warmstart), or unknown if there is none",
                rec.repo
            ),
        ));
    }
    let now = now_ms();
    store.update(true, reinit, |index| {
        index.record(rec, now);
        Ok(((), true))
    })
}

/// Bumps `last_active` of a known surface; false when it is unknown.
pub fn touch(store: &Store, surface: &str) -> Result<bool> {
    let now = now_ms();
    store.update(false, false, |index| {
        let known = index.touch(surface, now);
        Ok((known, known))
    })
}

/// The entry of a surface, if any.
pub fn lookup(store: &Store, surface: &str) -> Result<Option<Object>> {
    Ok(store.read()?.get(surface).cloned())
}

/// Every entry, most recently active first.
pub fn entries(store: &Store) -> Result<Vec<Object>> {
    let index = store.read()?;
    let mut all: Vec<_> = index
        .entries()
        .values()
        .filter_map(|v| v.as_object().cloned())
        .collect();
    all.sort_by(|a, b| {
        let t = |e: &Object| last_seen_ms(e).unwrap_or(f64::NEG_INFINITY);
        t(b).total_cmp(&t(a))
    });
    Ok(all)
}

/// The shell line that resumes a surface's session. Fails with exit code 4
/// when there is no entry, it is older than `max_age_ms`, or it cannot be
/// printed safely.
pub fn resume_line(
    store: &Store,
    surface: &str,
    max_age_ms: Option<u64>,
) -> Result<command::ResumeLine> {
    let nothing = |why: String| fail(Code::NotFound, format!("{why}: nothing to resume"));
    let Some(entry) = lookup(store, surface)? else {
        return Err(nothing(format!(
            "no entry for surface {surface:?} in {}",
            store.path.display()
        )));
    };
    if let Some(max) = max_age_ms {
        let now = now_ms();
        if is_older(&entry, max, now) {
            let age = last_seen_ms(&entry).map_or("at an unknown time".into(), |t| {
                format!("{} ago", human_age(now as f64 - t))
            });
            return Err(nothing(format!(
                "the session of surface {surface:?} was last active {age}, longer than the {max} ms allowed"
            )));
        }
    }
    command::resume_line(&entry).map_err(|why| {
        nothing(format!(
            "the entry of surface {surface:?} {why}, so no safe shell line can be printed for it"
        ))
    })
}

/// Removes entries older than `max_age_ms`; returns the removed surfaces and
/// how many entries remain.
pub fn prune(store: &Store, max_age_ms: u64) -> Result<(Vec<Str>, usize)> {
    let now = now_ms();
    store.update(false, false, |index| {
        let gone = index.prune(max_age_ms, now);
        let changed = !gone.is_empty();
        Ok(((gone, index.entries().len()), changed))
    })
}

/// An age in milliseconds, as a person reads it: whole seconds and up,
/// through `clock::human` (`0s`, `61s`, `2h`, `3d`).
fn human_age(ms: f64) -> String {
    let s = (ms / 1000.0).max(0.0) as u64;
    if s < 10 {
        format!("{s}s")
    } else {
        crate::clock::human(std::time::Duration::from_secs(s))
    }
}

/// The `--json` document (`crate::contract`) of `body`: the envelope's
/// fields, then `body`'s, written as `JSON.stringify` would, so that entries
/// holding lone surrogates print exactly as the index holds them.
fn json_document_of(body: Object) -> Result<()> {
    let mut doc = Object::new();
    doc.insert(
        "schema".into(),
        Value::Number(crate::contract::SCHEMA as f64),
    );
    doc.insert("command".into(), crate::contract::command().as_str().into());
    doc.insert("ok".into(), Value::Bool(true));
    for (k, v) in body {
        doc.entry(k).or_insert(v);
    }
    crate::contract::printed_elsewhere();
    out(&format!("{}\n", to_js_string(&Value::Object(doc))))
}

/// Prints to stdout; a closed pipe (`| head`) is not an error.
fn out(text: &str) -> Result<()> {
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("writing to stdout"),
    }
}

fn table(entries: &[Object]) -> String {
    let now = now_ms() as f64;
    let cell = |e: &Object, k: &str| match e.get(&Str::from(k)) {
        // Control and format characters would drive the terminal or reorder
        // the line: show them escaped.
        Some(Value::String(s)) => s.for_display(),
        None | Some(Value::Null) => "-".into(),
        Some(other) => Str::from(json::to_compact(other).as_str()).for_display(),
    };
    let mut rows = vec![["SURFACE", "SESSION", "REPO", "ROLE", "ACTIVE", "CWD"].map(String::from)];
    for e in entries {
        let active = last_seen_ms(e).map_or("-".into(), |t| format!("{} ago", human_age(now - t)));
        rows.push([
            cell(e, "surfaceId"),
            cell(e, "sessionId"),
            cell(e, "repo"),
            cell(e, "role"),
            active,
            cell(e, "cwd"),
        ]);
    }
    let widths: Vec<usize> = (0..6)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut text = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, value) in row.iter().enumerate() {
            line.push_str(&format!("{value:<w$}  ", w = widths[c]));
        }
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}

/// Runs `cargo xtask resume ...`.
pub fn run(_sh: &xshell::Shell, args: ResumeArgs) -> Result<()> {
    let store = Store::new(index_path(args.path.as_deref())?);
    match args.command {
        ResumeCommand::Record {
            surface,
            session,
            repo,
            role,
            cwd,
            reinit,
        } => {
            let cwd = cwd.as_deref().map(absolute_utf8).transpose()?;
            let rec = Record {
                surface: &surface,
                session: &session,
                repo: &repo,
                role: role.as_deref(),
                cwd: cwd.as_deref(),
            };
            record(&store, &rec, reinit)
        }
        ResumeCommand::Touch { surface } => {
            if touch(&store, &surface)? {
                Ok(())
            } else {
                Err(fail(
                    Code::NotFound,
                    format!(
                        "no entry for surface {surface:?} in {}: record it first with `{cmd} resume record`",
                        store.path.display(),
                        cmd = crate::invocation::command(),
                    ),
                ))
            }
        }
        ResumeCommand::Lookup { surface } => {
            let found = lookup(&store, &surface)?.map_or(Value::Null, Value::Object);
            out(&format!("{}\n", to_js_string(&found)))
        }
        ResumeCommand::ResumeCmd {
            surface,
            max_age_ms,
            json,
        } => {
            let line = resume_line(&store, &surface, max_age_ms)?;
            if let Some(why) = &line.warning {
                eprintln!("warning: surface {surface:?}: {why}");
            }
            if json {
                let text = serde_json::to_string(&line)?;
                match json::parse(text.as_bytes()) {
                    Ok(Value::Object(o)) => json_document_of(o),
                    other => Err(anyhow::anyhow!(
                        "resume-cmd --json: not an object: {other:?}"
                    )),
                }
            } else {
                out(&format!("{}\n", line.command))
            }
        }
        ResumeCommand::List { json } => {
            let all = entries(&store)?;
            if json {
                let mut doc = Object::new();
                let array = Value::Array(all.into_iter().map(Value::Object).collect());
                doc.insert("entries".into(), array);
                json_document_of(doc)
            } else if all.is_empty() {
                out(&format!("no entries in {}\n", store.path.display()))
            } else {
                out(&table(&all))
            }
        }
        ResumeCommand::Prune { max_age_ms, json } => {
            let (gone, left) = prune(&store, max_age_ms)?;
            if json {
                prune_document(&store, gone, left)
            } else {
                out(&format!(
                    "pruned {} entries not active within {max_age_ms} ms from {} ({left} left)\n",
                    gone.len(),
                    store.path.display()
                ))
            }
        }
    }
}

/// `--cwd`, absolute, as the UTF-8 text the index holds.
fn absolute_utf8(dir: &std::path::Path) -> Result<String> {
    std::path::absolute(dir)
        .with_context(|| format!("making --cwd {} absolute", dir.display()))?
        .into_os_string()
        .into_string()
        .map_err(|p| fail(Code::Usage, format!("--cwd {p:?} is not valid UTF-8")))
}

/// `resume prune --json`: the index, the surfaces pruned and how many are left.
fn prune_document(store: &Store, gone: Vec<Str>, left: usize) -> Result<()> {
    // The pruned surfaces may hold lone surrogates: written as
    // JSON.stringify would, like every other index text.
    let path = store.path.to_str().ok_or_else(|| {
        fail(
            Code::Usage,
            format!(
                "the index path {:?} is not valid UTF-8, so --json cannot print it",
                store.path
            ),
        )
    })?;
    let mut report = Object::new();
    report.insert("path".into(), Value::from(path));
    report.insert(
        "pruned".into(),
        Value::Array(gone.into_iter().map(Value::String).collect()),
    );
    report.insert("remaining".into(), Value::Number(left as f64));
    json_document_of(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_naturally() {
        assert_eq!(human_age(999.0), "0s");
        assert_eq!(human_age(61_000.0), "61s");
        assert_eq!(human_age(7_200_000.0), "2h");
        assert_eq!(human_age(3.0 * 86_400_000.0), "3d");
    }

    #[test]
    fn explicit_path_wins() {
        assert_eq!(
            index_path(Some(Path::new("/x/i.json"))).unwrap(),
            Path::new("/x/i.json")
        );
    }
}
