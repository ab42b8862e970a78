//! The documentation, checked: README.md and `docs/` mention every command,
//! the generated reference pages under `docs/reference/` are current, every
//! relative link and anchor resolves, every TOML example parses with the
//! parser that reads it for real, and the coreutils recipe of
//! `docs/format.md` restores a branch the real binary published.
//!
//! `UPDATE_DOCS=1 cargo test --test it docs::` rewrites the generated pages;
//! review the diff, then run the tests again without it.

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

/// `docs/reference/json-shapes.md`: every `--json` shape, from the snapshot
/// files `tests/it/json_contract.rs` checks against the real binary.
fn json_shapes_page() -> String {
    let dir = source_root().join("tests/it/snapshots/json");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    let mut s = format!(
        "# JSON shapes, per command\n\n{GENERATED}The shape of every `--json` document, success and failure, \
as `tests/it/json_contract.rs` checks it against the real binary (`tests/it/snapshots/json/`): each value \
is its type. What the fields mean, and the versioning of `schema`: [json.md](json.md).\n\n"
    );
    for f in files {
        let name = f.file_stem().unwrap().to_string_lossy().into_owned();
        s.push_str(&format!("## {name}\n\n```json\n{}", read(&f)));
        if !s.ends_with('\n') {
            s.push('\n');
        }
        s.push_str("```\n\n");
    }
    s.truncate(s.trim_end().len());
    s.push('\n');
    s
}

#[test]
fn docs_reference_pages_are_generated_from_the_code() {
    let stale: Vec<String> = [
        ("docs/reference/commands.md", commands_page()),
        ("docs/reference/exit-codes.md", exit_codes_page()),
        ("docs/reference/environment.md", environment_page()),
        ("docs/reference/json-shapes.md", json_shapes_page()),
    ]
    .iter()
    .filter_map(|(rel, text)| ensure_file(rel, text))
    .collect();
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
