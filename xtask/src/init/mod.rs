//! `init`: set up warmstart in a repository, and `init --check` that it still is.
//!
//! Writes only what is missing or what it generated itself and nobody edited
//! since (`generated`): a file whose body no longer matches its header's
//! digest is the user's, reported and never rewritten. The session-start hook
//! is merged into `.claude/settings.json` only when every entry there is one
//! `claude` understands; otherwise the entry is printed for the user to add,
//! and with `--no-agent-hook` (recorded in restore.toml) not at all.
//! `--check` and `--print` write nothing.

pub mod claude;
pub mod generated;
pub mod templates;

use anyhow::{Context, Result};
use std::path::Path;
use xshell::Shell;

use crate::cli::init::{Binary, InitArgs};
use crate::exit::{Code, fail};
use crate::repo::Repo;
use generated::State;

/// The script's path, also named by the hook and the dev container snippet.
pub const BOOTSTRAP_PATH: &str = "tools/warmstart-bootstrap.sh";

/// What `init` did with one file: its line of text, or its `--json` object.
#[derive(Debug, serde::Serialize)]
pub struct Row {
    pub path: String,
    /// created, updated, current, missing, stale, yours; for the hook also
    /// merged, unwired and off (`--no-agent-hook`).
    pub state: &'static str,
    /// Why, for yours and the hook (empty otherwise).
    pub detail: String,
}

/// One file `init` owns (until the user edits it).
struct File {
    rel: String,
    body: String,
    executable: bool,
}

pub fn run(_sh: &Shell, args: InitArgs) -> Result<()> {
    let repo = Repo::discover(Path::new("."))?;
    let binary = args.binary.unwrap_or_else(|| {
        if repo.root.join("xtask/Cargo.toml").is_file() {
            Binary::Xtask
        } else {
            Binary::Standalone
        }
    });
    // Refused before anything is written, so a typo leaves no broken manifest.
    check_pip_hashes(&args.pip_hash)?;
    // Without --pip-hash, the pin already committed stays: a rerun of init
    // must not drop the registry step.
    let pip_hashes = if args.pip_hash.is_empty() {
        committed_pip_hashes(&repo, binary)
    } else {
        args.pip_hash.clone()
    };
    // Refused before anything is written too: each signer's key is read now.
    let signers = trust_signers(&args.signer)?;
    let hook = Hook::choose(&repo, &args)?;
    let files = plan(&repo, binary, &pip_hashes, hook.off)?;
    if let Some(rel) = &args.print {
        return print_file(&files, rel);
    }
    let cmd = crate::invocation::command();
    let (mut rows, stale) = sync_files(&repo, &files, args.check)?;
    // A missing binary cache is already the failure --check reports.
    if !args.check || stale.is_empty() {
        check_bin_caches(&repo)?;
    }
    rows.extend(trust_files(&repo, &signers, args.check)?);
    rows.push(hook.wire(&repo, &rows, args.check)?);
    let test = detect_test_command(&repo.root);
    print_rows(
        &rows,
        &stale,
        !pip_hashes.is_empty(),
        test.as_ref(),
        args.json,
    );
    if !args.json {
        print_notes(&repo, &rows, pip_hashes.is_empty(), args.check, cmd);
    }
    if !stale.is_empty() {
        return Err(fail(
            Code::Verify,
            format!(
                "generated file(s) missing or stale: {}; regenerate with `{cmd} init`",
                stale.join(", ")
            ),
        ));
    }
    Ok(())
}

/// The lines after the rows: the registry step, the test gate init wrote,
/// and (unless `check`) what to do next.
fn print_notes(repo: &Repo, rows: &[Row], no_registry: bool, check: bool, cmd: &str) {
    if no_registry {
        println!(
            "note: the bootstrap's registry step (pip install --require-hashes) is omitted: no published warmstart version is pinned; after a release, `{cmd} init --pip-hash sha256:...` adds it"
        );
    }
    let gates_written = rows.iter().any(|r| {
        r.path == GATES_PATH && matches!(r.state, "created" | "updated" | "missing" | "stale")
    });
    if gates_written {
        match detect_test_command(&repo.root) {
            Some(t) => println!(
                "gates: the test gate runs `{}` (init detected {})",
                t.argv.join(" "),
                t.because
            ),
            None => println!(
                "gates: no test command detected: the test gate is a placeholder that fails, so nothing is published untested, until you edit {GATES_PATH}"
            ),
        }
    }
    if !check {
        print_trust_steps(repo, cmd);
        println!(
            "dev container: add to .devcontainer/devcontainer.json\n  \"postCreateCommand\": \"{BOOTSTRAP_PATH}\""
        );
        println!(
            "next: commit these files; CI (.github/workflows/gates.yml) publishes the binary cache"
        );
    }
}

/// `init --print PATH`: the file init would generate there, header
/// included, on stdout; nothing written.
fn print_file(files: &[File], rel: &str) -> Result<()> {
    let rel = rel.trim_start_matches("./");
    let Some(f) = files.iter().find(|f| f.rel == rel) else {
        let known: Vec<&str> = files.iter().map(|f| f.rel.as_str()).collect();
        return Err(fail(
            Code::Usage,
            format!(
                "--print {rel:?}: init generates no such file; it generates {}",
                known.join(", ")
            ),
        ));
    };
    print!("{}", generated::render(&f.body));
    Ok(())
}

/// The generated restore.toml, whose header records `--no-agent-hook`.
const RESTORE_PATH: &str = "cache-manifests/restore.toml";
/// The generated gates.toml.
const GATES_PATH: &str = "cache-manifests/gates.toml";

/// Whether the session-start hook is wanted: `--no-agent-hook` and
/// `--agent-hook` decide, else the choice restore.toml recorded.
struct Hook {
    off: bool,
    /// restore.toml as it is, when it records the choice itself.
    recorded: bool,
}

impl Hook {
    fn choose(repo: &Repo, args: &InitArgs) -> Result<Hook> {
        let text = read_optional(&repo.root.join(RESTORE_PATH))?.unwrap_or_default();
        let recorded = text
            .lines()
            .any(|l| l.starts_with(templates::AGENT_HOOK_OFF));
        let off = if args.no_agent_hook {
            true
        } else if args.agent_hook {
            false
        } else {
            recorded
        };
        Ok(Hook { off, recorded })
    }

    /// The hook's row: wired (or reported) as `claude::wire` does, or `off`.
    fn wire(&self, repo: &Repo, rows: &[Row], check: bool) -> Result<Row> {
        if !self.off {
            return claude::wire(&repo.root, check);
        }
        let mut detail =
            "--no-agent-hook: no SessionStart hook wired (`init --agent-hook` wires it)"
                .to_string();
        // The choice lives in restore.toml: one the user edited keeps its
        // text, so the line must go in by hand.
        let restore_yours = rows
            .iter()
            .any(|r| r.path == RESTORE_PATH && r.state == "yours");
        if restore_yours && !self.recorded {
            detail = format!(
                "{detail}; {RESTORE_PATH} is yours, so add the line `{}` to it, or a later init wires the hook",
                templates::AGENT_HOOK_OFF
            );
        }
        if claude::has_hook_in(&repo.root)? {
            detail.push_str("; the hook already in it is left: remove it by hand");
        }
        Ok(Row {
            path: claude::SETTINGS.to_string(),
            state: "off",
            detail,
        })
    }
}

/// Each `--pip-hash` is pip's hash form, refused before anything is written.
fn check_pip_hashes(hashes: &[String]) -> Result<()> {
    for h in hashes {
        let hex = h.strip_prefix("sha256:").unwrap_or("");
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(fail(
                Code::Usage,
                format!("--pip-hash {h:?} is not `sha256:` and 64 hex digits (pip hash form)"),
            ));
        }
    }
    Ok(())
}

/// Writes every generated file that is missing or stale (with `check`, only
/// lists them); returns a row per file and the paths left stale.
fn sync_files(repo: &Repo, files: &[File], check: bool) -> Result<(Vec<Row>, Vec<String>)> {
    let mut stale = Vec::new();
    let mut rows = Vec::new();
    for f in files {
        let path = repo.root.join(&f.rel);
        let existing = read_optional(&path)?;
        let state = generated::classify(existing.as_deref(), &f.body);
        let mut detail = String::new();
        let word = match (&state, check) {
            (State::Current, _) => "current",
            (State::Yours(why), _) => match unsafe_bootstrap(f, existing.as_deref()) {
                None if newer_than_base(f, existing.as_deref()) => {
                    let cmd = crate::invocation::command();
                    detail = format!(
                        "{why}, and this init generates a newer version: left alone; see it with `{cmd} init --print {rel} | diff -u {rel} -`",
                        rel = f.rel
                    );
                    "yours"
                }
                Some(danger) if check => {
                    stale.push(f.rel.clone());
                    detail = format!("{why}, and {danger}");
                    "stale"
                }
                Some(danger) => {
                    detail = format!("{why}: left alone, but {danger}");
                    "yours"
                }
                None => {
                    detail = format!("{why}: left alone");
                    "yours"
                }
            },
            (State::Missing | State::Stale, true) => {
                stale.push(f.rel.clone());
                if state == State::Missing {
                    "missing"
                } else {
                    "stale"
                }
            }
            (State::Missing | State::Stale, false) => {
                write(&repo.root, &path, &generated::render(&f.body), f.executable)?;
                if state == State::Missing {
                    "created"
                } else {
                    "updated"
                }
            }
        };
        rows.push(Row {
            path: f.rel.clone(),
            state: word,
            detail,
        });
    }
    Ok((rows, stale))
}

/// Whether the user's edited file was made from an older template than
/// today's: the new version is then one they have not seen.
fn newer_than_base(f: &File, existing: Option<&str>) -> bool {
    existing.is_some_and(|text| {
        generated::split(text).0.is_some() && !generated::made_from(text, &f.body)
    })
}

/// The line by which a bootstrap says it reads only regular blobs of their
/// named sizes, under deadlines, with trust from HEAD (see bootstrap.sh).
const BOOTSTRAP_READS: &str = "# warmstart-bootstrap-reads: regular-blobs deadline head-trust";

/// Why an edited bootstrap (which init never rewrites) is unsafe to keep:
/// one an older init wrote lacks the checks against a pusher's parts.
fn unsafe_bootstrap(f: &File, existing: Option<&str>) -> Option<String> {
    let text = existing?;
    (f.rel == BOOTSTRAP_PATH && !text.lines().any(|l| l == BOOTSTRAP_READS)).then(|| {
        format!(
            "it predates the checks of the parts it reads (a pusher's symlinked part hangs it; a work-tree trust policy is honoured): move your edits into a fresh `{} init` copy (delete {BOOTSTRAP_PATH}, rerun init)",
            crate::invocation::command()
        )
    })
}

/// The rows as text, or as `init --json`'s document.
fn print_rows(
    rows: &[Row],
    stale: &[String],
    registry_step: bool,
    test: Option<&templates::TestCommand>,
    json: bool,
) {
    if json {
        let out = serde_json::json!({
            "files": rows,
            "registry_step": registry_step,
            "post_create_command": BOOTSTRAP_PATH,
            "stale": stale,
            "test_command": test.map(|t| &t.argv),
            "test_command_detected_from": test.map(|t| &t.because),
        });
        // `--check` with stale files fails (below): the report goes into
        // the failure envelope then.
        if stale.is_empty() {
            crate::contract::document(&out);
        } else {
            crate::contract::fail_with(&out);
        }
    } else {
        for r in rows {
            match r.detail.as_str() {
                "" => println!("{:<9} {}", r.state, r.path),
                d => println!("{:<9} {} ({d})", r.state, r.path),
            }
        }
    }
}

/// `--signer PRINCIPAL=FILE`, each read into an allowed_signers line
/// (`principal keytype base64 comment`). Exit 2 naming the bad one.
fn trust_signers(specs: &[String]) -> Result<Vec<String>> {
    let mut lines = Vec::new();
    for spec in specs {
        let bad = |why: String| fail(Code::Usage, format!("--signer {spec:?}: {why}"));
        let Some((principal, file)) = spec.split_once('=') else {
            return Err(bad(
                "give PRINCIPAL=PUBLIC_KEY_FILE, e.g. ci=ci_signing_key.pub".into(),
            ));
        };
        if principal.is_empty() || principal.contains([' ', '\t', '"', '#']) {
            return Err(bad(
                "the principal must be one word (e.g. ci or alice@example.com)".into(),
            ));
        }
        let text =
            std::fs::read_to_string(file).map_err(|e| bad(format!("cannot read {file}: {e}")))?;
        let key = text.trim();
        let fields: Vec<&str> = key.split_whitespace().collect();
        let understood =
            crate::trust::armor::allowed_keys(format!("{principal} {key}\n").as_bytes())
                .is_some_and(|k| k.len() == 1);
        if key.contains('\n') || fields.len() < 2 || !understood {
            return Err(bad(format!(
                "{file} is not one ssh public key line (the .pub file of `ssh-keygen -t ed25519`; never the private key)"
            )));
        }
        lines.push(format!("{principal} {key}\n"));
    }
    Ok(lines)
}

/// With signers: cache-manifests/allowed_signers (created, or the new
/// lines appended) and trust.toml `policy = "require"` with `signed_gates =
/// true` (when missing), so that a gate record counts only when an allowed
/// signer signed it. `require` is never written without a signer to satisfy it.
fn trust_files(repo: &Repo, signers: &[String], check: bool) -> Result<Vec<Row>> {
    use crate::trust::policy::{SIGNERS_FILE, TRUST_FILE};
    if signers.is_empty() {
        return Ok(Vec::new());
    }
    let mut rows = Vec::new();
    let allowed = repo.root.join(SIGNERS_FILE);
    let old = read_optional(&allowed)?.unwrap_or_default();
    let new: String = signers
        .iter()
        .filter(|l| !old.lines().any(|o| o.trim() == l.trim()))
        .cloned()
        .collect();
    let state = match (old.is_empty(), new.is_empty(), check) {
        (_, true, _) => "current",
        (_, false, true) => "missing",
        (true, false, false) => "created",
        (false, false, false) => "updated",
    };
    if !check && !new.is_empty() {
        let mut text = old.clone();
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&new);
        write(&repo.root, &allowed, &text, false)?;
    }
    rows.push(Row {
        path: SIGNERS_FILE.into(),
        state,
        detail: String::new(),
    });
    let trust = repo.root.join(TRUST_FILE);
    let row = if let Some(text) = read_optional(&trust)? {
        let signed = crate::trust::policy::parse_trust_toml(&text).is_ok_and(|f| f.signed_gates);
        Row {
            path: TRUST_FILE.into(),
            state: "yours",
            detail: if signed {
                "exists: left alone".into()
            } else {
                "exists: left alone; add `signed_gates = true` so that only signed gate records count".into()
            },
        }
    } else {
        if !check {
            write(&repo.root, &trust, TRUST_TOML, false)?;
        }
        Row {
            path: TRUST_FILE.into(),
            state: if check { "missing" } else { "created" },
            detail: String::new(),
        }
    };
    rows.push(row);
    Ok(rows)
}

/// The trust.toml `init --signer` writes.
const TRUST_TOML: &str =
    "# Who may publish caches: cache-manifests/allowed_signers (`warmstart init --help`).
# signed_gates: a gate record counts (skips a gate, lets a cache publish) only
# when an allowed signer signed it; tools/ci-gates.sh signs with WARMSTART_SIGNING_KEY.
policy = \"require\"
signed_gates = true
";

/// How to get the first signing key in, and how CI signs.
fn print_trust_steps(repo: &Repo, cmd: &str) {
    use crate::trust::policy::{SIGNERS_FILE, TRUST_FILE};
    if repo.root.join(TRUST_FILE).is_file() {
        println!(
            "trust: {TRUST_FILE} sets the policy; add a signer with `echo \"NAME $(cat KEY.pub)\" >> {SIGNERS_FILE}` and commit it"
        );
        return;
    }
    println!(
        "trust: no policy, so restores check no signature (off). To require signed caches:\n  \
ssh-keygen -t ed25519 -N '' -C warmstart-ci -f ci_signing_key   # or a maintainer's ed25519 key\n  \
{cmd} init --signer ci=ci_signing_key.pub                     # writes {SIGNERS_FILE} and {TRUST_FILE} (require, signed_gates)\n  \
CI signs its gate records and caches with the private key kept as a secret:\n  \
.github/workflows/gates.yml reads the CI_SIGNING_KEY secret; another CI writes the key\n  \
to a file and runs WARMSTART_SIGNING_KEY=FILE tools/ci-gates.sh"
    );
}

/// The `[bootstrap] pip_hashes` of the binary-cache manifest as committed
/// (none when it is missing or unreadable: the manifest's own load says why).
fn committed_pip_hashes(repo: &Repo, binary: Binary) -> Vec<String> {
    let name = templates::bin_cache_name(binary);
    let path = crate::cache::format::manifest::path_of(repo, name);
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let v: toml::Value = toml::from_str(&text).unwrap_or(toml::Value::Boolean(false));
    v.get("bootstrap")
        .and_then(|b| b.get("pip_hashes"))
        .and_then(|h| h.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|h| h.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Loads (so validates, exit 10) the manifests the bootstrap script may read:
/// those with a `[bootstrap]` table. The script needs exactly one.
fn check_bin_caches(repo: &Repo) -> Result<()> {
    let mut found = Vec::new();
    for name in crate::cache::manifests::names(repo)? {
        let path = crate::cache::format::manifest::path_of(repo, &name);
        let text = read_optional(&path)?.unwrap_or_default();
        if text.lines().any(|l| l.trim_end() == "[bootstrap]") {
            crate::cache::manifests::load(repo, &name)?;
            found.push(name);
        }
    }
    if found.len() != 1 {
        return Err(fail(
            Code::Config,
            format!(
                "{} cache manifests have a [bootstrap] table ({}): {BOOTSTRAP_PATH} reads exactly one",
                found.len(),
                found.join(", ")
            ),
        ));
    }
    Ok(())
}

/// Every file `init` generates for this repository, with its current body.
fn plan(repo: &Repo, binary: Binary, pip_hashes: &[String], hook_off: bool) -> Result<Vec<File>> {
    let name = templates::bin_cache_name(binary);
    let package = match binary {
        Binary::Xtask => xtask_package(&repo.root)?,
        Binary::Standalone => String::new(),
    };
    let mut tree_paths = vec!["xtask".to_string()];
    if repo.root.join("Cargo.toml").is_file() {
        tree_paths.push("Cargo.toml".into());
    }
    tree_paths.push("Cargo.lock".into());
    let bin = templates::bin_cache(&templates::BinCache {
        binary,
        package: &package,
        tree_paths: &tree_paths,
        pip_hashes,
    });
    let file = |rel: &str, body: String, executable| File {
        rel: rel.to_string(),
        body,
        executable,
    };
    Ok(vec![
        file(&format!("cache-manifests/{name}.toml"), bin, false),
        file(RESTORE_PATH, templates::restore_toml(name, hook_off), false),
        file(
            "cache-manifests/example.toml.sample",
            templates::EXAMPLE.to_string(),
            false,
        ),
        file(BOOTSTRAP_PATH, templates::BOOTSTRAP.to_string(), true),
        file(
            ".github/workflows/gates.yml",
            templates::WORKFLOW.to_string(),
            false,
        ),
        file("tools/ci-gates.sh", templates::CI_GATES.to_string(), true),
        file(
            GATES_PATH,
            templates::gates_toml(detect_test_command(&repo.root).as_ref()),
            false,
        ),
    ])
}

/// The command a repository's tests run with, where one is unambiguous: a
/// `Cargo.toml` at the root means `cargo test --workspace` (`--locked` when
/// `Cargo.lock` is there too). Anything else is the team's to write.
fn detect_test_command(root: &Path) -> Option<templates::TestCommand> {
    if !root.join("Cargo.toml").is_file() {
        return None;
    }
    let mut argv: Vec<String> = ["cargo", "test", "--workspace"].map(String::from).into();
    let because = if root.join("Cargo.lock").is_file() {
        argv.push("--locked".into());
        "Cargo.toml and Cargo.lock at the root"
    } else {
        "Cargo.toml at the root (no Cargo.lock, so not --locked)"
    };
    Some(templates::TestCommand {
        argv,
        because: because.to_string(),
    })
}

/// The package name in `xtask/Cargo.toml`, checked to be usable with `-p`.
fn xtask_package(root: &Path) -> Result<String> {
    let path = root.join("xtask/Cargo.toml");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading {} (or pass --binary standalone)", path.display()))?;
    let v: toml::Value = toml::from_str(&text).map_err(|e| {
        fail(
            Code::Config,
            format!(
                "{}: {}",
                path.display(),
                crate::settings::toml_error_line(&text, &e)
            ),
        )
    })?;
    let name = v
        .get("package")
        .and_then(|p| p.get("name"))
        .and_then(|n| n.as_str())
        .ok_or_else(|| {
            fail(
                Code::Config,
                format!("{} has no package.name", path.display()),
            )
        })?;
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(fail(
            Code::Config,
            format!(
                "{}: package name {name:?} is not a plain crate name",
                path.display()
            ),
        ));
    }
    Ok(name.to_string())
}

pub(crate) fn read_optional(path: &Path) -> Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(anyhow::anyhow!(e).context(format!("reading {}", path.display()))),
    }
}

/// Writes `text` to `path` (inside `root`) atomically, so a reader never
/// sees half a script. Never through a symlink at or below `root`: a
/// checked-out `tools` or `.claude` that links out of the repository (a
/// pushed branch can hold one) would have init write scripts, or merge its
/// hook into settings, wherever the link points.
pub(crate) fn write(root: &Path, path: &Path, text: &str, executable: bool) -> Result<()> {
    let rel = path.strip_prefix(root).unwrap_or(path);
    let mut at = root.to_path_buf();
    for part in rel.components() {
        at.push(part);
        if let Ok(target) = std::fs::read_link(&at) {
            return Err(fail(
                Code::Unsafe,
                format!(
                    "{}: {} is a symlink (to {}): init writes only real files and directories of the repository; replace the link with one and rerun init",
                    rel.display(),
                    at.strip_prefix(root).unwrap_or(&at).display(),
                    target.display()
                ),
            ));
        }
    }
    let mode = if executable { 0o755 } else { 0o644 };
    crate::fsio::write_atomic_mode(path, text.as_bytes(), mode)
}
