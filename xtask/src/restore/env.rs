//! `restore env`: the plan's exports (`exports.rs`) of the steps whose
//! recorded state lets them through, written for a shell's `eval`, for
//! GitHub Actions, or into a file an agent hook names.
//!
//! A hook cannot set PATH for the shells that come after it; the caller must
//! `eval` what this prints. It reads the plan and the recorded state only:
//! it never runs a probe or a step, so it costs milliseconds and a step that
//! is still running or that failed adds nothing (it is named on stderr).
//! Quoting is the whole job here: whatever bytes a value holds (quotes,
//! newlines, `$`, backticks), `eval` must set exactly that value.

use anyhow::{Context, Result};
use serde_json::json;
use std::io::Write;
use std::path::Path;

use super::exports::Exports;
use super::plan::Plan;
use super::state::{self, Paths, State, StateFile};
use crate::cli::restore::{EnvArgs, ShellKind};
use crate::exit::{Code, fail};
use crate::repo::Repo;

/// Whether anything in the plan exports (the orientation table then ends
/// with the line to eval).
pub fn declared(plan: &Plan) -> bool {
    !plan.exports.is_empty() || plan.steps.iter().any(|s| !s.exports.is_empty())
}

/// A step whose exports are left out, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeftOut {
    pub step: String,
    pub state: Option<State>,
    pub why: String,
}

/// What the recorded state lets through.
#[derive(Debug, Default)]
pub struct Gathered {
    pub exports: Exports,
    /// `[env]` and the steps that contributed, in file order.
    pub from: Vec<String>,
    pub left_out: Vec<LeftOut>,
}

/// Only steps whose last recorded state is done, warm or warned contribute;
/// `[env]` always does. PATH keeps file order; a directory listed twice
/// stays where it first appears.
pub fn gather(plan: &Plan, file: &StateFile, alive: impl Fn(u32) -> bool) -> Gathered {
    let cmd = crate::invocation::command();
    let mut g = Gathered::default();
    let add = |g: &mut Gathered, who: &str, e: &Exports| {
        for p in &e.path {
            if !g.exports.path.contains(p) {
                g.exports.path.push(p.clone());
            }
        }
        for (k, v) in &e.env {
            g.exports.env.insert(k.clone(), v.clone());
        }
        g.from.push(who.to_string());
    };
    if !plan.exports.is_empty() {
        add(&mut g, "[env]", &plan.exports);
    }
    for step in plan.steps.iter().filter(|s| !s.exports.is_empty()) {
        let record = file.steps.get(&step.name);
        let why = match record.map(|r| (r.state, r.pid)) {
            Some((State::Done | State::Warm | State::Warned | State::Partial, _)) => {
                add(&mut g, &step.name, &step.exports);
                continue;
            }
            None => format!("no run recorded in this clone: run `{cmd} restore` first"),
            Some((State::Background | State::Running, pid)) => match pid {
                Some(pid) if !alive(pid) => {
                    format!("its background worker (pid {pid}) is gone: run `{cmd} restore`")
                }
                Some(pid) => format!(
                    "still running in the background (pid {pid}): eval again once `{cmd} restore status` shows it done"
                ),
                None => format!(
                    "queued for the background worker: eval again once `{cmd} restore status` shows it done"
                ),
            },
            Some((State::FailedOpen | State::Failed, _)) => {
                let log = record
                    .and_then(|r| r.log.as_ref())
                    .map(|l| format!(" (log: {})", l.display()))
                    .unwrap_or_default();
                format!("it failed, so it exports nothing{log}")
            }
            Some((State::Skipped, _)) => {
                format!("it did not run (an earlier step failed): run `{cmd} restore`")
            }
        };
        g.left_out.push(LeftOut {
            step: step.name.clone(),
            state: record.map(|r| r.state),
            why,
        });
    }
    g
}

/// A word for sh, bash and zsh: single quotes, each `'` written as `'\''`.
/// Inside single quotes nothing is special, newlines included.
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// A word for fish: single quotes, where only `\'` and `\\` are escapes.
pub fn fish_quote(s: &str) -> String {
    format!("'{}'", s.replace('\\', r"\\").replace('\'', r"\'"))
}

/// The POSIX form (sh, dash, bash, zsh). Evaluating it twice does not add
/// the directories twice: the prepend is skipped when PATH already starts
/// with them. `${PATH:+:$PATH}` keeps an empty PATH from gaining a trailing
/// `:` (the current directory).
pub fn render_sh(e: &Exports) -> String {
    let mut out = String::new();
    if !e.path.is_empty() {
        let joined = sh_quote(&e.path.join(":"));
        let guard = sh_quote(&format!(":{}:", e.path.join(":")));
        out.push_str(&format!(
            "case \":${{PATH-}}:\" in {guard}*) ;; *) export PATH={joined}\"${{PATH:+:$PATH}}\" ;; esac\n"
        ));
    }
    for (k, v) in &e.env {
        out.push_str(&format!("export {k}={}\n", sh_quote(v)));
    }
    out
}

/// The fish form: PATH is a list there, so the directories are words; the
/// same guard against a second evaluation compares the first elements.
pub fn render_fish(e: &Exports) -> String {
    let mut out = String::new();
    if !e.path.is_empty() {
        let n = e.path.len();
        let mut test = format!("test (count $PATH) -ge {n}");
        for (i, p) in e.path.iter().enumerate() {
            test.push_str(&format!(
                "; and test \"$PATH[{}]\" = {}",
                i + 1,
                fish_quote(p)
            ));
        }
        let words: Vec<String> = e.path.iter().map(|p| fish_quote(p)).collect();
        out.push_str(&format!(
            "if not begin; {test}; end\n    set -gx PATH {} $PATH\nend\n",
            words.join(" ")
        ));
    }
    for (k, v) in &e.env {
        out.push_str(&format!("set -gx {k} {}\n", fish_quote(v)));
    }
    out
}

/// `$GITHUB_PATH`: one directory a line. The runner puts the line read last
/// first on PATH, so the lines go in reverse to keep the manifest's order.
pub fn render_github_path(e: &Exports) -> String {
    e.path.iter().rev().map(|p| format!("{p}\n")).collect()
}

/// `$GITHUB_ENV`: `NAME=value`, or for a value with a line break the
/// heredoc form `NAME<<DELIM`, the value, a newline, `DELIM`, with a random
/// delimiter that is no line of the value (the runner takes everything up
/// to the line equal to it, minus that last newline).
pub fn render_github_env(e: &Exports, mut random: impl FnMut() -> String) -> String {
    let mut out = String::new();
    for (k, v) in &e.env {
        if v.contains('\n') || v.contains('\r') {
            let delim = loop {
                let d = format!("ghadelimiter_{}", random());
                if !v
                    .split('\n')
                    .any(|l| l == d || l.trim_end_matches('\r') == d)
                {
                    break d;
                }
            };
            out.push_str(&format!("{k}<<{delim}\n{v}\n{delim}\n"));
        } else {
            out.push_str(&format!("{k}={v}\n"));
        }
    }
    out
}

/// 128 random bits as hex, from the kernel.
fn random_hex() -> String {
    let mut buf = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut buf);
    }
    // Without /dev/urandom the time and pid still make a collision with a
    // line of the value unlikely, and the loop above rules it out anyway.
    if buf == [0; 16] {
        buf[..8].copy_from_slice(&crate::clock::now_ms().to_le_bytes());
        buf[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    }
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// The shell `$SHELL` names (its file name), for the default of `--shell`
/// and the line the table ends with. Unset is sh; a shell this module does
/// not write for is an error rather than text the caller cannot eval.
pub fn default_shell() -> Result<ShellKind> {
    let Some(shell) = std::env::var_os("SHELL").filter(|s| !s.is_empty()) else {
        return Ok(ShellKind::Sh);
    };
    let name = Path::new(&shell)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(match name.as_str() {
        "sh" | "dash" | "ash" | "ksh" | "mksh" | "busybox" => ShellKind::Sh,
        "bash" => ShellKind::Bash,
        "zsh" => ShellKind::Zsh,
        "fish" => ShellKind::Fish,
        _ => {
            return Err(fail(
                Code::Usage,
                format!(
                    "SHELL={} is not a shell `restore env` writes for: pass --shell sh, bash, zsh or fish",
                    shell.to_string_lossy()
                ),
            ));
        }
    })
}

/// The one line the orientation table ends with, when the plan exports anything.
pub fn eval_hint(plan: &Plan) -> Option<String> {
    if !declared(plan) {
        return None;
    }
    let cmd = crate::invocation::command();
    let line = match default_shell() {
        Ok(ShellKind::Fish) => format!("{cmd} restore env | source"),
        _ => format!("eval \"$({cmd} restore env)\""),
    };
    Some(format!("to put the exports in this shell: {line}"))
}

/// `restore env`.
pub fn run(args: &EnvArgs) -> Result<()> {
    let repo = Repo::from_cwd()?;
    let plan = super::plan::load(&repo)?;
    let file = state::read(&Paths::new(&repo))?;
    let g = gather(&plan, &file, state::pid_alive);
    for l in &g.left_out {
        eprintln!("restore env: step {} left out: {}", l.step, l.why);
    }
    let writes_files = args.github || args.append.is_some();
    if args.github {
        let (env_file, path_file) = github_files()?;
        append(&path_file, &render_github_path(&g.exports))?;
        append(&env_file, &render_github_env(&g.exports, random_hex))?;
    }
    if let Some(file) = &args.append {
        append(file, &render_sh(&g.exports))?;
    }
    if args.json {
        let left: Vec<_> = g
            .left_out
            .iter()
            .map(|l| json!({ "step": l.step, "state": l.state, "why": l.why }))
            .collect();
        let out = json!({
            "path": g.exports.path,
            "env": g.exports.env,
            "from": g.from,
            "left_out": left,
        });
        crate::contract::document(out);
    } else if !writes_files {
        let shell = match args.shell {
            Some(s) => s,
            None => default_shell()?,
        };
        let text = match shell {
            ShellKind::Fish => render_fish(&g.exports),
            ShellKind::Sh | ShellKind::Bash | ShellKind::Zsh => render_sh(&g.exports),
        };
        print!("{text}");
    }
    Ok(())
}

fn github_files() -> Result<(std::path::PathBuf, std::path::PathBuf)> {
    let get = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(std::path::PathBuf::from)
            .ok_or_else(|| {
                fail(
                    Code::Usage,
                    format!(
                        "--github needs {name}, which GitHub Actions sets in a workflow step: outside one, use --append FILE or eval the output"
                    ),
                )
            })
    };
    Ok((get("GITHUB_ENV")?, get("GITHUB_PATH")?))
}

/// Appends `text` with one write on an `O_APPEND` handle, so that lines of
/// another writer of the same file are never cut into.
fn append(file: &Path, text: &str) -> Result<()> {
    if text.is_empty() {
        return Ok(());
    }
    let mut f = state::open_append_own(file)
        .with_context(|| format!("opening {} to append the exports", file.display()))?;
    f.write_all(text.as_bytes())
        .with_context(|| format!("appending the exports to {}", file.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exports(path: &[&str], env: &[(&str, &str)]) -> Exports {
        Exports::of(path, env)
    }

    #[test]
    fn quoting_leaves_nothing_special_outside_the_quotes() {
        assert_eq!(sh_quote("a'b"), r"'a'\''b'");
        assert_eq!(sh_quote(""), "''");
        assert_eq!(fish_quote(r"a\'b"), r"'a\\\'b'");
        let sh = render_sh(&exports(&["/a b", "/c"], &[("X", "$HOME `id`")]));
        assert_eq!(
            sh,
            "case \":${PATH-}:\" in ':/a b:/c:'*) ;; *) export PATH='/a b:/c'\"${PATH:+:$PATH}\" ;; esac\nexport X='$HOME `id`'\n"
        );
        let fish = render_fish(&exports(&["/a"], &[("X", "y")]));
        assert!(fish.contains("set -gx PATH '/a' $PATH"), "{fish}");
        assert!(fish.ends_with("set -gx X 'y'\n"), "{fish}");
    }

    #[test]
    fn github_files_keep_order_and_carry_multi_line_values() {
        let e = exports(&["/first", "/second"], &[("A", "one"), ("B", "x\ny\n")]);
        assert_eq!(render_github_path(&e), "/second\n/first\n");
        let mut n = 0;
        // The first delimiter collides with a line of the value: a new one is drawn.
        let e2 = exports(&[], &[("B", "ghadelimiter_0\nz")]);
        let text = render_github_env(&e2, || {
            n += 1;
            format!("{}", n - 1)
        });
        assert_eq!(
            text,
            "B<<ghadelimiter_1\nghadelimiter_0\nz\nghadelimiter_1\n"
        );
        let text = render_github_env(&e, || "r".into());
        assert_eq!(text, "A=one\nB<<ghadelimiter_r\nx\ny\n\nghadelimiter_r\n");
        assert_eq!(random_hex().len(), 32);
        assert_ne!(random_hex(), random_hex());
    }
}
