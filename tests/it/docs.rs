//! The documentation, checked: README.md and `docs/` mention every command,
//! the generated reference pages under `docs/reference/` are current, every
//! relative link and anchor resolves, every TOML example parses with the
//! parser that reads it for real, every command example parses with the
//! real command line, and the coreutils recipe of `docs/format.md` restores
//! a branch the real binary published.
//!
//! `UPDATE_DOCS=1 cargo test --test it docs::` rewrites the generated pages;
//! review the diff, then run the tests again without it.

mod fields;
mod json_fields;

use crate::util::tree::{assert_same_tree, make_tricky_tree};
use crate::util::{TestEnv, run, show, source_root};
use clap::CommandFactory;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every Markdown file of the book: README.md, CHANGELOG.md, SECURITY.md
/// and everything under `docs/`.
fn markdown_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let root = source_root();
    let mut files: Vec<PathBuf> = ["README.md", "CHANGELOG.md", "SECURITY.md"]
        .iter()
        .map(|f| root.join(f))
        .collect();
    walk(&root.join("docs"), &mut files);
    files.sort();
    files
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The guides: every page of `docs/` but the generated reference.
fn guides_text() -> String {
    markdown_files()
        .iter()
        .filter(|p| !p.starts_with(source_root().join("docs/reference")))
        .map(|p| read(p))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Lines outside fenced code blocks, with their 1-based numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// The fenced blocks of `lang`, each with the prose line just before its
/// opening fence (blank lines skipped), for markers such as
/// `<!-- recipe: coreutils -->`.
fn code_blocks<'a>(text: &'a str, lang: &str) -> Vec<(String, &'a str)> {
    let mut out = Vec::new();
    let mut before = "";
    let mut open: Option<(String, usize)> = None;
    let lines: Vec<&str> = text.lines().collect();
    let mut body = String::new();
    for line in &lines {
        let t = line.trim_start();
        match &open {
            None if t.starts_with("```") => {
                open = Some((t.trim_start_matches('`').trim().to_string(), 0));
                body.clear();
            }
            None => {
                if !t.is_empty() {
                    before = line;
                }
            }
            Some((l, _)) if t.starts_with("```") => {
                if l == lang {
                    out.push((body.clone(), before));
                }
                open = None;
            }
            Some(_) => {
                // Blocks inside list items are indented; drop the indent.
                body.push_str(line.strip_prefix("  ").unwrap_or(line));
                body.push('\n');
            }
        }
    }
    out
}

/// GitHub's anchor of a heading: lowercase, punctuation dropped, spaces to
/// hyphens; a repeated heading gets `-1`, `-2`, ...
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let Some(title) = line.strip_prefix('#').map(|l| l.trim_start_matches('#')) else {
            continue;
        };
        if !title.starts_with(' ') {
            continue;
        }
        let slug: String = title
            .trim()
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let n = seen.entry(slug.clone()).or_insert(0);
        out.insert(if *n == 0 {
            slug.clone()
        } else {
            format!("{slug}-{n}")
        });
        *n += 1;
    }
    out
}

/// The targets of `[text](target)` links in prose, inline code left out.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in prose_lines(text) {
        // Inline code spans hold examples, not links.
        let mut plain = String::new();
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                plain.push_str(part);
            }
        }
        let mut rest = plain.as_str();
        while let Some(i) = rest.find("](") {
            let tail = &rest[i + 2..];
            let end = tail.find(')').unwrap_or(tail.len());
            out.push((n, tail[..end].to_string()));
            rest = &tail[end..];
        }
    }
    out
}

#[test]
fn docs_every_relative_link_and_anchor_resolves() {
    let files = markdown_files();
    assert!(files.len() > 15, "found too few pages: {files:?}");
    let mut bad = Vec::new();
    for file in &files {
        let text = read(file);
        for (line, target) in links(&text) {
            if target.starts_with("http://") || target.starts_with("https://") {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let dest = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            let at = format!("{}:{line}: {target}", file.display());
            if !dest.exists() {
                bad.push(format!("{at}: no such file"));
                continue;
            }
            if let Some(a) = anchor
                && (dest.is_dir() || !anchors(&read(&dest)).contains(a))
            {
                bad.push(format!("{at}: no heading with that anchor"));
            }
        }
    }
    assert!(bad.is_empty(), "broken links:\n{}", bad.join("\n"));
}

/// `docs/SUMMARY.md` is a book mdBook can build: every chapter a page
/// inside `docs/`, and every page of `docs/` a chapter.
#[test]
fn docs_summary_lists_every_page_and_only_pages_of_the_book() {
    let docs = source_root().join("docs");
    let summary = read(&docs.join("SUMMARY.md"));
    let chapters: BTreeSet<String> = links(&summary).into_iter().map(|(_, t)| t).collect();
    let pages: BTreeSet<String> = markdown_files()
        .iter()
        .filter_map(|p| p.strip_prefix(&docs).ok())
        .map(|p| p.display().to_string())
        .filter(|p| p != "SUMMARY.md")
        .collect();
    let outside: Vec<_> = chapters
        .iter()
        .filter(|c| c.starts_with("..") || c.contains('#'))
        .collect();
    assert!(
        outside.is_empty(),
        "SUMMARY.md links outside the book: {outside:?}"
    );
    let missing: Vec<_> = pages.difference(&chapters).collect();
    let gone: Vec<_> = chapters.difference(&pages).collect();
    assert!(
        missing.is_empty() && gone.is_empty(),
        "docs/SUMMARY.md lacks {missing:?}, or lists pages that do not exist: {gone:?}"
    );
}

#[test]
fn docs_readme_stays_short() {
    let text = read(&source_root().join("README.md"));
    let lines = text.lines().count();
    let words = text.split_whitespace().count();
    assert!(
        lines <= 200 && words <= 1500,
        "README.md has {lines} lines and {words} words: keep it within 200 and 1500, and move detail to docs/"
    );
    // The test command the README names is the one CI runs.
    assert!(text.contains("tools/test.sh"));
    assert!(read(&source_root().join(".ci/run")).contains("exec tools/test.sh"));
}

/// Every subcommand path, as `<group> <sub>`, hidden ones left out.
fn subcommand_paths(cmd: &clap::Command, prefix: &str, out: &mut Vec<String>) {
    for sub in cmd.get_subcommands() {
        if sub.get_name() == "help" || sub.is_hide_set() {
            continue;
        }
        let path = if prefix.is_empty() {
            sub.get_name().to_string()
        } else {
            format!("{prefix} {}", sub.get_name())
        };
        out.push(path.clone());
        subcommand_paths(sub, &path, out);
    }
}

fn all_subcommands() -> Vec<String> {
    let mut paths = Vec::new();
    subcommand_paths(&warmstart::cli::Cli::command(), "", &mut paths);
    paths
}

#[test]
fn docs_every_subcommand_is_in_a_guide() {
    let guides = guides_text();
    let missing: Vec<_> = all_subcommands()
        .into_iter()
        .filter(|p| !guides.contains(&format!("cargo xtask {p}")))
        .collect();
    assert!(
        missing.is_empty(),
        "no guide under docs/ mentions `cargo xtask <command>` for: {missing:#?}"
    );
}

/// Writes `contents` to `rel` under UPDATE_DOCS, else fails when it differs.
fn ensure_file(rel: &str, contents: &str) -> Option<String> {
    let path = source_root().join(rel);
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::write(&path, contents).unwrap();
        return None;
    }
    let now = std::fs::read_to_string(&path).unwrap_or_default();
    (now != contents).then(|| {
        format!(
            "{rel} is stale: regenerate it with `UPDATE_DOCS=1 cargo test --test it docs::` and review the diff"
        )
    })
}

const GENERATED: &str = "<!-- generated by tests/it/docs.rs from the code: do not edit; `UPDATE_DOCS=1 cargo test --test it docs::` regenerates it -->\n\n";

/// `docs/reference/commands.md`: every command's `--help`, from the binary.
fn commands_page() -> String {
    let env = TestEnv::new();
    let mut s = format!(
        "# Commands and flags\n\n{GENERATED}Every command and subcommand of `warmstart` (`cargo xtask` in a repository \
whose xtask crate is warmstart), with its `--help` as the binary prints it. Every command takes \
`-q`/`--quiet`; where a command reports something, `--json` prints one document \
([json.md](json.md)). Exit codes: [exit-codes.md](exit-codes.md).\n\n"
    );
    let mut paths = vec![String::new()];
    paths.extend(all_subcommands());
    for path in paths {
        let args: Vec<&str> = path.split_whitespace().collect();
        let r = run(env
            .xtask()
            .args(&args)
            .arg("--help")
            .env("COLUMNS", "100")
            .env_remove("WARMSTART_COMMAND"))
        .ok();
        let title = if path.is_empty() { "warmstart" } else { &path };
        s.push_str(&format!("## {title}\n\n```text\n{}```\n\n", r.stdout()));
    }
    s.truncate(s.trim_end().len());
    s.push('\n');
    s
}

fn exit_codes_page() -> String {
    let mut s = format!(
        "# Exit codes\n\n{GENERATED}One table for every command; codes are stable (`xtask/src/exit.rs`). With \
`--json`, a failure's code is also the envelope's `code`.\n\n| code | meaning |\n|---|---|\n"
    );
    for (code, meaning) in warmstart::exit::Code::ALL {
        s.push_str(&format!("| {} | {} |\n", code.as_i32(), meaning));
    }
    s
}

fn environment_page() -> String {
    let mut s = format!(
        "# Environment variables\n\n{GENERATED}The `WARMSTART_` prefix is reserved: an unknown `WARMSTART_*` variable \
(a typo) is refused with exit 10, and the error names the nearest known one. A value that does not parse \
is exit 10 too. The forms of durations and sizes: [settings.md](settings.md). The list is \
`warmstart::settings::KNOWN` (`xtask/src/settings.rs`); test-only knobs are marked so there.\n\n\
| variable | value | for |\n|---|---|---|\n"
    );
    for (name, kind, purpose) in warmstart::settings::KNOWN {
        let kind = format!("{kind:?}").to_lowercase();
        s.push_str(&format!("| `{name}` | {kind} | {purpose} |\n"));
    }
    s
}

/// `docs/reference/json-shapes.md`: every `--json` field with its type and
/// meaning, then every shape, from the snapshot files
/// `tests/it/json_contract.rs` checks against the real binary; with the
/// fields that have no meaning, and meanings no field has, as problems.
fn json_shapes_page() -> (String, Vec<String>) {
    let dir = source_root().join("tests/it/snapshots/json");
    let by_command = json_fields::fields_by_command(&dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    let mut s = format!(
        "# JSON output, field by field\n\n{GENERATED}Every field of every `--json` document, with its type and \
what it means, then each document's shape, success and failure, as `tests/it/json_contract.rs` checks it \
against the real binary (`tests/it/snapshots/json/`). A path walks objects with `.` and the items of an \
array with `[]`; a field whose type is `... or null` is null in some outcome. The envelope, the names shared \
by every command, and the versioning of `schema`: [json.md](json.md).\n\n"
    );
    let mut problems = Vec::new();
    for (command, fields) in &by_command {
        let (table, missing) = json_fields::table(command, fields);
        problems.extend(missing.into_iter().map(|m| {
            format!("{m} is in a JSON snapshot but has no meaning in tests/it/docs/json_fields.rs")
        }));
        s.push_str(&format!("## {}\n\n{table}\n", command.replace('-', " ")));
        for f in files.iter().filter(|f| {
            f.file_stem().unwrap().to_string_lossy().split('.').next() == Some(command.as_str())
        }) {
            let name = f.file_stem().unwrap().to_string_lossy().into_owned();
            s.push_str(&format!("### {name}\n\n```json\n{}", read(f)));
            if !s.ends_with('\n') {
                s.push('\n');
            }
            s.push_str("```\n\n");
        }
    }
    problems.extend(json_fields::unused(&by_command).into_iter().map(|u| {
        format!("{u} has a meaning in tests/it/docs/json_fields.rs but no JSON snapshot holds it")
    }));
    s.truncate(s.trim_end().len());
    s.push('\n');
    (s, problems)
}

#[test]
fn docs_reference_pages_are_generated_from_the_code() {
    let stale: Vec<String> = [
        ("docs/reference/commands.md", commands_page()),
        ("docs/reference/exit-codes.md", exit_codes_page()),
        ("docs/reference/environment.md", environment_page()),
    ]
    .iter()
    .filter_map(|(rel, text)| ensure_file(rel, text))
    .collect();
    let (page, mut problems) = manifests_page();
    problems.extend(ensure_file("docs/reference/manifests.md", &page));
    let (page, json_problems) = json_shapes_page();
    problems.extend(json_problems);
    problems.extend(ensure_file("docs/reference/json-shapes.md", &page));
    let stale: Vec<String> = stale.into_iter().chain(problems).collect();
    assert!(stale.is_empty(), "{}", stale.join("\n"));
}

#[test]
fn docs_every_toml_example_parses_with_the_real_parser() {
    let dir = tempfile::tempdir().unwrap();
    let repo = warmstart::repo::Repo {
        root: dir.path().to_path_buf(),
        git_dir: dir.path().join(".git"),
    };
    let mut checked = 0;
    let mut bad = Vec::new();
    for file in markdown_files() {
        for (block, _) in code_blocks(&read(&file), "toml") {
            let at = format!(
                "{}: the example starting {:?}",
                file.display(),
                block.lines().next().unwrap_or("")
            );
            let table: toml::Table = match toml::from_str(&block) {
                Ok(t) => t,
                Err(e) => {
                    bad.push(format!("{at}: not TOML: {e}"));
                    continue;
                }
            };
            let result = if table.contains_key("gate") {
                warmstart::gates::manifest::parse(&block).map(|_| ())
            } else if table.contains_key("step") || table.contains_key("parallel") {
                let path = dir.path().join("restore.toml");
                warmstart::restore::plan::parse(&repo, &path, &block).map(|_| ())
            } else if ["cache", "key", "pack", "restore", "publish"]
                .iter()
                .any(|k| table.contains_key(*k))
            {
                // A fragment (a table or two of a cache manifest) is
                // checked inside the smallest whole manifest.
                let mut text = block.clone();
                if !table.contains_key("pack") {
                    text.push_str("\n[pack]\nroot = \"src\"\n");
                }
                if !table.contains_key("restore") {
                    text.push_str("\n[restore]\npath = \"dest\"\n");
                }
                let path = dir.path().join("example.toml");
                warmstart::cache::format::manifest::parse(&repo, "example", &path, &text)
                    .map(|_| ())
            } else {
                bad.push(format!("{at}: no parser reads this (add a case here)"));
                continue;
            };
            checked += 1;
            if let Err(e) = result {
                bad.push(format!("{at}: {e:#}"));
            }
        }
    }
    assert!(checked >= 6, "found only {checked} TOML examples");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// The block after `<!-- recipe: coreutils -->` in docs/format.md.
fn coreutils_recipe() -> String {
    let text = read(&source_root().join("docs/format.md"));
    let blocks: Vec<String> = code_blocks(&text, "sh")
        .into_iter()
        .filter(|(_, before)| before.trim() == "<!-- recipe: coreutils -->")
        .map(|(b, _)| b)
        .collect();
    assert_eq!(blocks.len(), 1, "docs/format.md needs one coreutils recipe");
    blocks[0].clone()
}

#[test]
fn docs_the_coreutils_recipe_of_the_format_restores_a_published_branch() {
    let env = TestEnv::new();
    let src = env.join("src");
    make_tricky_tree(&src, false);
    env.bare_remote("origin.git");
    let work = env.work_repo("work");
    env.git("work", ["remote", "add", "origin", "../origin.git"]);
    std::fs::create_dir_all(work.join("cache-manifests")).unwrap();
    // Small chunks: several of them, so that their order matters; a ref
    // outside refs/heads/, as new manifests are told to use.
    let manifest = format!(
        "[cache]\nref = \"refs/warmstart/cache/tricky\"\n\n[[key]]\nname = \"v\"\nliteral = \"1\"\n\n\
[pack]\nroot = \"{}\"\n\n[restore]\npath = \"restored\"\n\n[publish]\nchunk_avg = \"256\"\nchunk_bytes = 2000\n",
        src.display()
    );
    std::fs::write(work.join("cache-manifests/tricky.toml"), manifest).unwrap();
    let r = run(env
        .xtask_in("work")
        .args(["cache", "publish", "tricky", "--json"]))
    .ok();
    let doc: serde_json::Value = serde_json::from_str(&r.stdout()).unwrap();
    let key = doc["key"].as_str().unwrap().to_string();
    assert!(doc["chunks"].as_array().unwrap().len() >= 3, "{doc}");

    let clone = env.join("plain");
    std::fs::create_dir_all(&clone).unwrap();
    env.git(&clone, ["init", "-q"]);
    let dest = env.join("dest");
    let mut cmd = std::process::Command::new("bash");
    cmd.current_dir(&clone)
        .args(["-c", &coreutils_recipe()])
        .env("REMOTE", env.join("origin.git"))
        .env("REF", "refs/warmstart/cache/tricky")
        .env("KEY", &key)
        .env("DEST", &dest);
    env.isolate(&mut cmd);
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "the recipe failed\n{}", show(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains(": OK") && !said.contains("FAILED"), "{said}");
    assert_same_tree(&src, &dest);
}

/// Every manifest kind: its file, and its type's `Deserialize`.
fn manifest_kinds() -> Vec<(&'static str, Box<fields::Describe>)> {
    use serde::Deserialize;
    use warmstart::restore::steps as s;
    fn of<T: for<'de> Deserialize<'de>>() -> Box<fields::Describe> {
        Box::new(|r| T::deserialize(r).map(|_| ()))
    }
    vec![
        (
            "cache manifest",
            Box::new(|r| warmstart::cache::format::manifest::describe(r)),
        ),
        (
            "gates.toml",
            Box::new(|r| warmstart::gates::manifest::describe(r)),
        ),
        (
            "trust.toml",
            Box::new(|r| warmstart::trust::policy::describe(r)),
        ),
        ("step cache", of::<s::cache::RawCache>()),
        ("step submodules", of::<s::submodules::RawSubmodules>()),
        ("step links", of::<s::links::RawLinks>()),
        ("step command", of::<s::command::RawCommand>()),
        ("step download", of::<s::download::RawDownload>()),
        ("step pin", of::<s::pin::RawPin>()),
        ("step freshness", of::<s::freshness::RawFreshness>()),
        ("step service", of::<s::service::RawService>()),
        ("step doctor", of::<s::doctor::RawDoctor>()),
    ]
}

/// What the page says of each field the parsers take: `(manifest kind,
/// field, type when the parser's own is not telling, default, meaning)`.
/// The field names and the other types come from the parsers
/// (`fields::walk`); a field here that they lack, or one they take that is
/// missing here, fails `docs_reference_pages_are_generated_from_the_code`.
const FIELDS: &[(&str, &str, &str, &str, &str)] = &[
    ("cache manifest", "cache", "", "", "where the cache lives"),
    (
        "cache manifest",
        "cache.branch",
        "",
        "`<name>-cache`",
        "the branch that holds it (not with `ref`)",
    ),
    (
        "cache manifest",
        "cache.ref",
        "",
        "",
        "a full ref outside `refs/heads/`, e.g. `refs/warmstart/cache/<name>`: plain clones never fetch it",
    ),
    (
        "cache manifest",
        "cache.remote",
        "",
        "`origin`",
        "a remote name or URL",
    ),
    (
        "cache manifest",
        "cache.registry",
        "",
        "",
        "`host[:port]/repository` of an OCI registry that holds the cache instead of a git branch, one tagged artifact per key (not with `branch`, `ref` or `remote`; docs/format.md)",
    ),
    (
        "cache manifest",
        "cache.mirrors",
        "",
        "",
        "registries (`host[:port]` or `host[:port]/path`) asked for the cache's blobs by digest before `registry`, after this machine's `WARMSTART_REGISTRY_MIRRORS`; never for a tag, never published to; only with `registry` (docs/mirrors.md)",
    ),
    (
        "cache manifest",
        "cache.description",
        "",
        "",
        "one line, shown by `cache list` and the branch README",
    ),
    (
        "cache manifest",
        "key",
        "",
        "",
        "the key's pins, in order; each has `name` and exactly one source",
    ),
    (
        "cache manifest",
        "key.name",
        "",
        "(required)",
        "the pin's name, unique in the manifest",
    ),
    ("cache manifest", "key.literal", "", "", "source: this text"),
    (
        "cache manifest",
        "key.platform",
        "",
        "false",
        "source: `<arch>-<os>` of the machine",
    ),
    (
        "cache manifest",
        "key.json",
        "",
        "",
        "source: a value of a JSON file",
    ),
    (
        "cache manifest",
        "key.json.file",
        "",
        "(required)",
        "the JSON file",
    ),
    (
        "cache manifest",
        "key.json.pointer",
        "",
        "(required)",
        "a JSON pointer (`/version`)",
    ),
    (
        "cache manifest",
        "key.regex",
        "",
        "",
        "source: a capture of a regex over a file",
    ),
    (
        "cache manifest",
        "key.regex.file",
        "",
        "(required)",
        "the file",
    ),
    (
        "cache manifest",
        "key.regex.pattern",
        "",
        "(required)",
        "the regex; its first capture group is the value",
    ),
    (
        "cache manifest",
        "key.git_tree",
        "",
        "",
        "source: the first 16 hex digits of sha256 over `git rev-parse HEAD:<path>` of each path",
    ),
    (
        "cache manifest",
        "key.file",
        "",
        "",
        "source: a one-line file of printable ASCII",
    ),
    (
        "cache manifest",
        "pack",
        "",
        "(required)",
        "what `cache publish` packs",
    ),
    (
        "cache manifest",
        "pack.root",
        "",
        "(required)",
        "the directory to pack (`~`, `$VAR` expand)",
    ),
    (
        "cache manifest",
        "pack.include",
        "",
        "everything",
        "globs under the root to pack",
    ),
    (
        "cache manifest",
        "pack.exclude",
        "",
        "nothing",
        "globs under the root to leave out",
    ),
    (
        "cache manifest",
        "pack.keep_mtime",
        "",
        "false",
        "keep file mtimes in the tar (no delta install then)",
    ),
    (
        "cache manifest",
        "pack.absolute_symlinks",
        "",
        "nothing",
        "globs of paths whose symlink may have an absolute target without `..` (a venv's `bin/python*`), at publish and at every restore",
    ),
    (
        "cache manifest",
        "restore",
        "",
        "(required)",
        "where and how `cache restore` installs",
    ),
    (
        "cache manifest",
        "restore.path",
        "",
        "(required)",
        "the target directory or prefix",
    ),
    (
        "cache manifest",
        "restore.mode",
        "",
        "`\"replace\"`",
        "replace a directory the cache owns, merge into a shared prefix, or overlay (never replace a file the user changed)",
    ),
    (
        "cache manifest",
        "restore.fallback",
        "",
        "none",
        "keys that may stand in on an exact miss, in order: each `{ drop = [pins] }` or `{ prefix = \"...\" }`",
    ),
    (
        "cache manifest",
        "restore.fallback.drop",
        "",
        "",
        "a key whose other parts equal today's",
    ),
    (
        "cache manifest",
        "restore.fallback.prefix",
        "",
        "",
        "a key that starts with this",
    ),
    (
        "cache manifest",
        "restore.recheck",
        "",
        "(required with `fallback`)",
        "how long a stand-in install stays warm",
    ),
    (
        "cache manifest",
        "restore.legacy_versions",
        "table of string",
        "`{}`",
        "a pinned value -> the version a legacy archive's name may carry for it (else a versioned archive must match the key's pins, or restore is exit 4)",
    ),
    (
        "cache manifest",
        "ready",
        "",
        "the restore path exists",
        "when an install is usable: `path`, or `command` with optional `matches`",
    ),
    (
        "cache manifest",
        "ready.path",
        "",
        "",
        "a path under the restore path that must exist",
    ),
    (
        "cache manifest",
        "ready.command",
        "",
        "",
        "an argv that must succeed",
    ),
    (
        "cache manifest",
        "ready.matches",
        "",
        "",
        "a regex its stdout must match",
    ),
    (
        "cache manifest",
        "publish",
        "",
        "",
        "how `cache publish` packs and pushes",
    ),
    (
        "cache manifest",
        "publish.gates",
        "",
        "none",
        "gates of gates.toml that must be green for HEAD's tree",
    ),
    (
        "cache manifest",
        "publish.chunk_bytes",
        "",
        "`\"99MiB\"`",
        "the largest chunk file (under 100 MiB)",
    ),
    (
        "cache manifest",
        "publish.chunk_avg",
        "",
        "`\"4MiB\"`",
        "the average content-defined chunk, in tar bytes (256 B to 16 MiB)",
    ),
    (
        "cache manifest",
        "publish.level",
        "",
        "`\"fast\"`",
        "zstd level: `fast` (3), `small` (19) or 1 to 19",
    ),
    (
        "cache manifest",
        "publish.lease_deadline",
        "",
        "`\"120s\"`",
        "how long a publish retries a lost lease (`WARMSTART_PUBLISH_LEASE_DEADLINE` wins)",
    ),
    (
        "cache manifest",
        "publish.keep",
        "",
        "no pruning",
        "prune on every publish: per platform value, keep the N newest keys and today's",
    ),
    (
        "cache manifest",
        "publish.push_limit",
        "",
        "`\"1.5GiB\"`",
        "the most new blob bytes per push; more go in batches (`WARMSTART_PUSH_LIMIT` wins)",
    ),
    (
        "cache manifest",
        "network",
        "",
        "",
        "deadlines of this cache's fetches and pushes",
    ),
    (
        "cache manifest",
        "network.connect_timeout",
        "",
        "`\"10s\"`",
        "until the remote's first byte",
    ),
    (
        "cache manifest",
        "network.stall_timeout",
        "",
        "`\"30s\"`",
        "the longest time without progress",
    ),
    (
        "cache manifest",
        "trust",
        "",
        "",
        "this cache's trust settings",
    ),
    (
        "cache manifest",
        "trust.policy",
        "",
        "trust.toml's, else `off`",
        "overrides trust.toml for this cache",
    ),
    (
        "cache manifest",
        "trust.principals",
        "",
        "every signer",
        "only these principals of allowed_signers may sign it",
    ),
    (
        "cache manifest",
        "trust.allow_ungated",
        "",
        "false",
        "under `require`, accept keys published `--allow-ungated`",
    ),
    (
        "cache manifest",
        "trust.signed_gates",
        "",
        "false",
        "a publish accepts only signed gate entries",
    ),
    (
        "cache manifest",
        "bootstrap",
        "",
        "",
        "marks the binary cache that tools/warmstart-bootstrap.sh reads (one manifest only)",
    ),
    (
        "cache manifest",
        "bootstrap.exec",
        "",
        "(required)",
        "the executable, relative to the restore path",
    ),
    (
        "cache manifest",
        "bootstrap.build",
        "",
        "none",
        "the argv that compiles it when no prebuilt binary matches",
    ),
    (
        "cache manifest",
        "bootstrap.built",
        "",
        "",
        "where that build leaves the binary",
    ),
    (
        "cache manifest",
        "bootstrap.pip",
        "",
        "",
        "the exact pip requirement of the wheel (`warmstart==0.1.0`)",
    ),
    (
        "cache manifest",
        "bootstrap.pip_hashes",
        "",
        "",
        "its `sha256:<hex>` hashes",
    ),
    (
        "cache manifest",
        "build",
        "",
        "",
        "how `cache build` (and a restore, on a miss) makes the artifact from source",
    ),
    (
        "cache manifest",
        "build.command",
        "",
        "(required)",
        "the build's argv, run at the repository root; it writes into `$WARMSTART_BUILD_OUT`",
    ),
    (
        "cache manifest",
        "build.inputs",
        "",
        "(required)",
        "the paths it reads, relative to the repository root, each covered by a key pin",
    ),
    (
        "cache manifest",
        "build.timeout",
        "",
        "(required)",
        "how long it may run before its process group is ended",
    ),
    (
        "cache manifest",
        "build.on_miss",
        "",
        "false",
        "a background `cache` step of restore.toml builds a key the branch lacks",
    ),
    (
        "cache manifest",
        "build.platforms",
        "",
        "any",
        "the `platform` values (`x86_64-linux`) where a build may run",
    ),
    (
        "cache manifest",
        "build.recheck",
        "",
        "`\"1h\"`",
        "how long a built, unpublished install stays warm before the branch is looked at again",
    ),
    (
        "gates.toml",
        "ignore",
        "",
        "none",
        "globs a dirty worktree may have",
    ),
    (
        "gates.toml",
        "kill_grace",
        "",
        "`\"5s\"`",
        "SIGTERM to SIGKILL grace for a gate past its timeout",
    ),
    (
        "gates.toml",
        "network",
        "",
        "",
        "deadlines of `gates push` and `gates fetch`",
    ),
    (
        "gates.toml",
        "network.connect_timeout",
        "",
        "`\"10s\"`",
        "until the remote's first byte",
    ),
    (
        "gates.toml",
        "network.stall_timeout",
        "",
        "`\"30s\"`",
        "the longest time without progress",
    ),
    (
        "gates.toml",
        "records",
        "",
        "`\"refs\"`",
        "where records travel: `refs/warmstart/gates/<tree>`, or branches `warmstart-gates/<tree>` for hosts that refuse other refs",
    ),
    (
        "gates.toml",
        "gate",
        "",
        "",
        "one table per gate, run in file order",
    ),
    (
        "gates.toml",
        "gate.name",
        "",
        "(required)",
        "letters, digits, `.`, `_`, `-`",
    ),
    (
        "gates.toml",
        "gate.command",
        "string or array of string",
        "(required)",
        "an argv, or a string run with `sh -c`",
    ),
    (
        "gates.toml",
        "gate.cwd",
        "",
        "`\".\"`",
        "relative to the repository root",
    ),
    (
        "gates.toml",
        "gate.env",
        "",
        "none",
        "added to the inherited environment",
    ),
    (
        "gates.toml",
        "gate.timeout",
        "",
        "`\"60m\"`",
        "past it the gate's process group is ended",
    ),
    (
        "trust.toml",
        "policy",
        "",
        "(required)",
        "`require` refuses, `warn` warns, `off` checks nothing",
    ),
    (
        "trust.toml",
        "signed_gates",
        "",
        "`false`",
        "gate records count only where an allowed signer signed them (`init --signer` sets it)",
    ),
    (
        "step cache",
        "cache",
        "",
        "(required)",
        "the cache manifest's name",
    ),
    (
        "step cache",
        "remote",
        "",
        "the manifest's",
        "fetch from this remote (name or URL)",
    ),
    (
        "step submodules",
        "paths",
        "",
        "(required)",
        "the submodule paths",
    ),
    (
        "step submodules",
        "sentinel",
        "",
        "none",
        "one file per suite that must exist afterwards",
    ),
    (
        "step submodules",
        "sentinel.suite",
        "",
        "(required)",
        "the suite's name",
    ),
    (
        "step submodules",
        "sentinel.path",
        "",
        "(required)",
        "the file",
    ),
    (
        "step submodules",
        "sentinel.breaks",
        "",
        "(required)",
        "what breaks without it",
    ),
    (
        "step submodules",
        "allow_file_protocol",
        "",
        "false",
        "allow submodules served from local paths",
    ),
    (
        "step submodules",
        "timeout",
        "",
        "`\"10m\"`",
        "bounds the update",
    ),
    (
        "step submodules",
        "jobs",
        "integer, 1 to 64",
        "the number of paths, at most 8",
        "submodules cloned at once",
    ),
    (
        "step submodules",
        "shallow",
        "bool",
        "false",
        "`--depth 1`, in full where the server refuses",
    ),
    (
        "step links",
        "source",
        "",
        "(required)",
        "the directory scanned",
    ),
    (
        "step links",
        "farm",
        "",
        "(required)",
        "the directory of links",
    ),
    (
        "step links",
        "index",
        "",
        "none",
        "a file that should mention every entry (warns otherwise)",
    ),
    (
        "step links",
        "entries",
        "",
        "`\"all\"`",
        "which entries are linked",
    ),
    (
        "step links",
        "include",
        "array of string",
        "every entry",
        "globs under `source` (no `**`)",
    ),
    (
        "step command",
        "run",
        "string or array of string",
        "(required)",
        "a string runs in `sh -c`, a list is argv",
    ),
    (
        "step command",
        "creates",
        "",
        "",
        "the step is done while this exists",
    ),
    (
        "step command",
        "unless",
        "string or array of string",
        "",
        "the step is done while this succeeds",
    ),
    (
        "step command",
        "cwd",
        "",
        "the repository root",
        "where it runs",
    ),
    ("step command", "timeout", "", "none", "bounds each attempt"),
    (
        "step command",
        "retries",
        "integer, 0 to 10",
        "0",
        "more attempts after a failed one",
    ),
    (
        "step command",
        "backoff",
        "duration",
        "`\"1s\"`",
        "the first pause between attempts, doubled each time",
    ),
    (
        "step download",
        "url",
        "",
        "(required)",
        "HTTPS (plain HTTP only for localhost)",
    ),
    (
        "step download",
        "sha256",
        "",
        "(required)",
        "the file's sha256",
    ),
    (
        "step download",
        "dest",
        "",
        "(required)",
        "where the checked file goes",
    ),
    ("step download", "executable", "", "false", "chmod +x"),
    (
        "step download",
        "unpack_into",
        "",
        "",
        "a conda package: unpack it into this prefix",
    ),
    (
        "step download",
        "only",
        "",
        "everything",
        "with `unpack_into`: only these directories",
    ),
    (
        "step download",
        "connect_timeout",
        "",
        "`\"10s\"`",
        "curl's connect deadline",
    ),
    (
        "step download",
        "read_timeout",
        "",
        "`\"30s\"`",
        "no byte for this long: abandon and retry",
    ),
    (
        "step download",
        "max_time",
        "",
        "none",
        "bounds each attempt",
    ),
    (
        "step download",
        "retries",
        "integer, 0 to 10",
        "3",
        "more attempts after a failed one",
    ),
    (
        "step download",
        "backoff",
        "duration",
        "`\"1s\"`",
        "the first pause between attempts, doubled each time",
    ),
    (
        "step download",
        "unless",
        "string or array of string",
        "",
        "the step is done while this succeeds",
    ),
    (
        "step pin",
        "tool",
        "",
        "(required)",
        "looked up as a shell finds it (the plan's `path` exports up to this step, then PATH), or a path",
    ),
    ("step pin", "args", "", "`[\"--version\"]`", "its arguments"),
    (
        "step pin",
        "expect",
        "",
        "(required)",
        "a regex its output must match",
    ),
    (
        "step pin",
        "timeout",
        "",
        "`\"10s\"`",
        "bounds the tool's run",
    ),
    (
        "step pin",
        "fix",
        "",
        "none",
        "the fix when it does not match: `{ symlink, target }` or `{ run }`",
    ),
    (
        "step pin",
        "fix.symlink",
        "string or array of string",
        "",
        "a symlink to make, or a list: one to `target` in each place",
    ),
    ("step pin", "fix.target", "", "", "where it points"),
    (
        "step pin",
        "fix.run",
        "string or array of string",
        "",
        "a command to run",
    ),
    (
        "step freshness",
        "remote",
        "",
        "the branch's upstream",
        "the remote to fetch",
    ),
    (
        "step freshness",
        "branch",
        "",
        "the branch's upstream",
        "the branch to fast-forward to",
    ),
    (
        "step freshness",
        "timeout",
        "",
        "`\"10s\"`",
        "past it: offline or unreachable",
    ),
    (
        "step freshness",
        "interval",
        "",
        "`\"10m\"`",
        "a check younger than this is warm",
    ),
    (
        "step freshness",
        "network",
        "",
        "",
        "deadlines of its fetch",
    ),
    (
        "step freshness",
        "network.connect_timeout",
        "",
        "`\"10s\"`",
        "until the remote's first byte",
    ),
    (
        "step freshness",
        "network.stall_timeout",
        "",
        "`\"30s\"`",
        "the longest time without progress",
    ),
    (
        "step service",
        "run",
        "string or array of string",
        "(required)",
        "the service, in the foreground",
    ),
    (
        "step service",
        "pidfile",
        "",
        "`<git-dir>/warmstart/restore/services/<name>.pid`",
        "its pidfile",
    ),
    (
        "step service",
        "log",
        "",
        "`<git-dir>/warmstart/logs/<name>.service.log`",
        "its output, appended",
    ),
    (
        "step service",
        "ready_port",
        "integer, a TCP port",
        "",
        "ready once 127.0.0.1:PORT accepts a connection",
    ),
    (
        "step service",
        "ready_cmd",
        "string or array of string",
        "",
        "ready once this exits 0",
    ),
    (
        "step service",
        "ready_timeout",
        "",
        "`\"10s\"`",
        "not ready by then: stopped, the step fails",
    ),
    (
        "step service",
        "watch",
        "",
        "none",
        "a change to one of these restarts it",
    ),
    (
        "step service",
        "cwd",
        "",
        "the repository root",
        "where it runs",
    ),
    (
        "step service",
        "kill_grace",
        "",
        "`\"5s\"`",
        "`restore stop`: SIGTERM, then SIGKILL after this",
    ),
    (
        "step doctor",
        "connect_timeout",
        "",
        "the doctor's (`\"10s\"`, or WARMSTART_CONNECT_TIMEOUT)",
        "`doctor --connect-timeout`: give up connecting to a host or a proxy after this long",
    ),
    (
        "step doctor",
        "timeout",
        "",
        "the connect timeout plus 10s",
        "`doctor --timeout`: give up on one host's whole probe after this long",
    ),
    (
        "step doctor",
        "interval",
        "",
        "`\"1h\"`",
        "a check younger than this is warm (no network); `\"0s\"`: every restore",
    ),
];

/// The fields every step takes, read by `restore::plan` itself rather
/// than by a step kind's serde form (so `fields::walk` cannot see them;
/// `docs_step_common_fields_are_accepted` checks them against the parser).
const STEP_COMMON: &[(&str, &str, &str, &str)] = &[
    (
        "name",
        "string",
        "(required)",
        "the step's name, unique in the plan",
    ),
    (
        "kind",
        "string",
        "(required)",
        "`cache`, `submodules`, `links`, `command`, `download`, `pin`, `freshness` or `service`",
    ),
    (
        "background",
        "bool",
        "false",
        "hand the step to the background worker",
    ),
    (
        "fail_open",
        "bool",
        "true",
        "a failure is one line and the restore goes on",
    ),
    (
        "after",
        "array of string",
        "none",
        "with `parallel`: steps that must end well first",
    ),
    (
        "path",
        "array of string",
        "none",
        "directories put in front of PATH by `restore env`",
    ),
    (
        "env",
        "table of string",
        "none",
        "variables exported by `restore env`",
    ),
];

/// A TOML value as the example column shows it, on one line.
fn toml_inline(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => format!("{s:?}"),
        toml::Value::Integer(n) => n.to_string(),
        toml::Value::Float(f) => f.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        toml::Value::Datetime(d) => d.to_string(),
        toml::Value::Array(a) => format!(
            "[{}]",
            a.iter().map(toml_inline).collect::<Vec<_>>().join(", ")
        ),
        toml::Value::Table(t) => format!(
            "{{ {} }}",
            t.iter()
                .map(|(k, v)| format!("{k} = {}", toml_inline(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The value at a dotted `path` of `t`, looking into each table of an array.
fn toml_at<'a>(t: &'a toml::Table, path: &[&str]) -> Option<&'a toml::Value> {
    let v = t.get(path[0])?;
    if path.len() == 1 {
        return Some(v);
    }
    match v {
        toml::Value::Table(inner) => toml_at(inner, &path[1..]),
        toml::Value::Array(items) => items
            .iter()
            .find_map(|i| i.as_table().and_then(|t| toml_at(t, &path[1..]))),
        _ => None,
    }
}

/// The guides' TOML examples of manifest kind `kind`, as tables (a step
/// kind's: each step of that kind).
fn toml_examples(kind: &str) -> Vec<toml::Table> {
    let mut out = Vec::new();
    for file in markdown_files()
        .iter()
        .filter(|p| !p.starts_with(source_root().join("docs/reference")))
    {
        for (block, _) in code_blocks(&read(file), "toml") {
            let Ok(table) = toml::from_str::<toml::Table>(&block) else {
                continue;
            };
            let is_cache = ["cache", "key", "pack", "restore", "publish"]
                .iter()
                .any(|k| table.contains_key(*k));
            match kind.strip_prefix("step ") {
                Some(step_kind) => {
                    if let Some(toml::Value::Array(steps)) = table.get("step") {
                        for s in steps.iter().filter_map(|s| s.as_table()) {
                            if s.get("kind").and_then(|k| k.as_str()) == Some(step_kind) {
                                out.push(s.clone());
                            }
                        }
                    }
                }
                None if kind == "gates.toml" && table.contains_key("gate") => out.push(table),
                None if kind == "cache manifest" && is_cache && !table.contains_key("step") => {
                    out.push(table)
                }
                None => {}
            }
        }
    }
    out
}

/// The first example value of `path` in the guides, for the page.
fn example_of(examples: &[toml::Table], path: &str) -> String {
    let parts: Vec<&str> = path.split('.').collect();
    examples
        .iter()
        .find_map(|t| toml_at(t, &parts))
        .filter(|v| {
            match v {
                // Tables and arrays of tables are shown by their fields.
                toml::Value::Table(_) => false,
                toml::Value::Array(a) => !a.iter().any(|i| i.is_table()),
                _ => true,
            }
        })
        .map(|v| format!("`{}`", toml_inline(v).replace('|', "\\|")))
        .unwrap_or_default()
}

/// `docs/reference/manifests.md`: every field of every manifest kind.
fn manifests_page() -> (String, Vec<String>) {
    let mut problems = Vec::new();
    let mut s = format!(
        "# Manifest fields\n\n{GENERATED}Every field of every file in `cache-manifests/`. The field names, \
and the types but where noted, are read from the parsers' own `Deserialize` implementations \
(a field a parser takes and this page lacks fails a test). The examples are taken from the guides' \
TOML examples, which the real parsers read in a test. Every table refuses fields it does not \
know (exit 10). Durations, sizes and globs: [settings.md](settings.md). Guides: \
[caches.md](../caches.md), [gates.md](../gates.md), [trust.md](../trust.md), \
[restore.md](../restore.md).\n"
    );
    let files = [
        ("cache manifest", "`cache-manifests/<name>.toml`"),
        ("gates.toml", "`cache-manifests/gates.toml`"),
        ("trust.toml", "`cache-manifests/trust.toml`"),
    ];
    let mut documented: BTreeSet<(String, String)> = BTreeSet::new();
    for (kind, describe) in manifest_kinds() {
        let title = match files.iter().find(|(k, _)| *k == kind) {
            Some((_, f)) => format!("{kind}: {f}"),
            None => format!(
                "restore.toml: `kind = \"{}\"`",
                kind.trim_start_matches("step ")
            ),
        };
        if kind == "step cache" {
            s.push_str("\n## restore.toml: every step\n\n`cache-manifests/restore.toml` takes `parallel` (true, false or 1 to 64; default false), \
`slow_uncached` (a duration, or false; default `\"10m\"`: the 10-minute rule, [restore.md](../restore.md#the-10-minute-rule-slow_uncached)), \
a top-level `[env]` table (`path`, `env`, as a step's) and `[[step]]` tables. The fields every step takes \
(read by the plan itself, `restore::plan::STEP_FIELDS`; a test checks this table lists exactly those and a debug build that the plan takes no other by hand):\n\n\
| field | type | default | meaning |\n|---|---|---|---|\n");
            for (f, ty, default, meaning) in STEP_COMMON {
                s.push_str(&format!("| `{f}` | {ty} | {default} | {meaning} |\n"));
            }
        }
        s.push_str(&format!(
            "\n## {title}\n\n| field | type | default | example | meaning |\n|---|---|---|---|---|\n"
        ));
        let examples = toml_examples(kind);
        for (path, shape) in fields::walk(&*describe) {
            documented.insert((kind.to_string(), path.clone()));
            let Some((_, _, ty, default, meaning)) =
                FIELDS.iter().find(|f| f.0 == kind && f.1 == path)
            else {
                problems.push(format!("{kind}: the parser takes `{path}`, which FIELDS in tests/it/docs.rs does not describe"));
                continue;
            };
            let ty = if ty.is_empty() {
                shape.describe()
            } else {
                ty.to_string()
            };
            let example = example_of(&examples, &path);
            s.push_str(&format!(
                "| `{path}` | {ty} | {default} | {example} | {meaning} |\n"
            ));
        }
    }
    for (kind, path, ..) in FIELDS {
        if !documented.contains(&(kind.to_string(), path.to_string())) {
            problems.push(format!("{kind}: FIELDS in tests/it/docs.rs describes `{path}`, which the parser does not take"));
        }
    }
    (s, problems)
}

#[test]
fn docs_step_common_fields_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let repo = warmstart::repo::Repo {
        root: dir.path().to_path_buf(),
        git_dir: dir.path().join(".git"),
    };
    let text = "parallel = true\n[env]\npath = [\"bin\"]\n\n[[step]]\nname = \"a\"\nkind = \"command\"\nrun = \"true\"\ncreates = \"x\"\n\n\
[[step]]\nname = \"b\"\nkind = \"command\"\nrun = \"true\"\ncreates = \"y\"\nbackground = false\nfail_open = true\nafter = [\"a\"]\npath = [\"b/bin\"]\nenv = { B = \"1\" }\n";
    let path = dir.path().join("restore.toml");
    warmstart::restore::plan::parse(&repo, &path, text).unwrap();
    let documented: Vec<&str> = STEP_COMMON.iter().map(|(f, ..)| *f).collect();
    assert_eq!(
        documented,
        warmstart::restore::plan::STEP_FIELDS,
        "STEP_COMMON in tests/it/docs.rs must list the fields restore::plan::STEP_FIELDS takes, in order"
    );
    for field in warmstart::restore::plan::STEP_FIELDS {
        assert!(
            text.contains(&format!("\n{field} = ")),
            "the check leaves out {field}"
        );
    }
}

#[test]
fn docs_completions_and_man_pages_come_from_the_command_tree() {
    let env = TestEnv::new();
    for (shell, mark) in [
        ("bash", "_warmstart()"),
        ("zsh", "#compdef warmstart"),
        ("fish", "complete -c warmstart"),
    ] {
        let out = run(env.xtask().args(["completions", shell])).ok().stdout();
        assert!(out.contains(mark), "{shell}: {out}");
        // Every command is in the script, down to the subcommands.
        assert!(
            out.contains("publish") && out.contains("resume-cmd"),
            "{shell}"
        );
    }
    let page = run(env.xtask().arg("man")).ok().stdout();
    assert!(page.contains(".TH warmstart 1"), "{page}");
    let dir = env.join("man1");
    run(env.xtask().args(["man", "--out"]).arg(&dir)).ok();
    let mut missing = Vec::new();
    for path in all_subcommands() {
        let file = dir.join(format!("warmstart-{}.1", path.replace(' ', "-")));
        if !file.exists() {
            missing.push(file);
        }
    }
    assert!(missing.is_empty(), "no page for: {missing:#?}");
    let publish = read(&dir.join("warmstart-cache-publish.1"));
    assert!(publish.contains("signing\\-key"), "{publish}");
}

/// The words of a shell command line, quotes removed (enough for the
/// examples: no escapes inside quotes), up to the first `|`, `>`, `&&`,
/// `;` or comment.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quote: Option<char> = None;
    let mut started = false;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                started = true;
            }
            (None, '#' | '|' | '>' | ';' | '&') if !started => break,
            (None, c) if c.is_whitespace() => {
                if started {
                    words.push(std::mem::take(&mut word));
                    started = false;
                }
            }
            (None, c) => {
                word.push(c);
                started = true;
            }
        }
    }
    if started {
        words.push(word);
    }
    words
}

/// Every `cargo xtask ...` and `warmstart ...` line of the docs' shell
/// examples parses with the real command line: no example names a command
/// or a flag that does not exist, or leaves out a required argument.
#[test]
fn docs_every_command_example_parses_with_the_real_cli() {
    let mut checked = 0;
    let mut bad = Vec::new();
    for file in markdown_files() {
        for (block, _) in code_blocks(&read(&file), "sh") {
            for line in block.lines() {
                let line = line.trim_start();
                let line = match line.strip_prefix("eval \"$(") {
                    // The command substitution only.
                    Some(inner) => inner.split(")\"").next().unwrap_or(inner),
                    None => line.strip_prefix("time ").unwrap_or(line),
                };
                let words = shell_words(line);
                let args = match words.as_slice() {
                    [cargo, xtask, rest @ ..] if cargo == "cargo" && xtask == "xtask" => rest,
                    [bin, rest @ ..] if bin == "warmstart" || bin.ends_with("/warmstart") => rest,
                    _ => continue,
                };
                checked += 1;
                let argv = std::iter::once("warmstart".to_string()).chain(args.iter().cloned());
                if let Err(e) = warmstart::cli::Cli::command().try_get_matches_from(argv)
                    && !matches!(
                        e.kind(),
                        clap::error::ErrorKind::DisplayHelp
                            | clap::error::ErrorKind::DisplayVersion
                    )
                {
                    let first = e.to_string().lines().next().unwrap_or_default().to_string();
                    bad.push(format!("{}: `{line}`: {first}", file.display()));
                }
            }
        }
    }
    assert!(checked >= 30, "found only {checked} command examples");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// The per-command table of `docs/reference/json.md` has a row for every
/// command whose `--json` the contract snapshots (`cache gc` once lacked one).
#[test]
fn docs_the_json_table_covers_every_command_with_json() {
    let page = read(&source_root().join("docs/reference/json.md"));
    let table = page
        .split("**Per command**")
        .nth(1)
        .and_then(|t| t.split("**Versioning.**").next())
        .expect("json.md has its per-command table");
    let mut rows = BTreeSet::new();
    for line in table.lines().filter(|l| l.starts_with("| `")) {
        let first = line.split('|').nth(1).unwrap_or_default();
        for (i, part) in first.split('`').enumerate() {
            if i % 2 == 1 {
                rows.insert(part.replace(' ', "-"));
            }
        }
    }
    let dir = source_root().join("tests/it/snapshots/json");
    let commands: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter_map(|f| f.split('.').next().map(str::to_string))
        // The envelope of any command failing before it runs (a bad
        // setting, a usage error), and the one exception, which prints no
        // envelope: the page's prose covers them.
        .filter(|c| !["settings", "usage", "resume-lookup"].contains(&c.as_str()))
        .collect();
    let missing: Vec<_> = commands.difference(&rows).collect();
    assert!(
        missing.is_empty(),
        "docs/reference/json.md's per-command table has no row for {missing:?}"
    );
}
