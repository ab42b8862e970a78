//! Tidy: the rules of the source tree that no compiler checks.
//!
//! Every `.rs` file opens with a `//!` line; every subcommand has its section
//! in `docs/reference/commands.md`; `docs/reference/exit-codes.md` lists
//! exactly `exit::Code::ALL`; every file in `cache-manifests/` parses with the
//! parser that reads it for real. (`docs.rs` regenerates and checks those
//! pages, and ties the guides and the README to the code.)

use crate::util::source_root;
use clap::CommandFactory;
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name == "target" || name.starts_with('.') {
            continue;
        }
        if path.is_dir() {
            rust_files(&path, out);
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_rust_file_opens_with_a_module_doc() {
    let mut files = Vec::new();
    rust_files(&source_root(), &mut files);
    assert!(files.len() > 5, "found too few .rs files: {files:?}");
    let bad: Vec<_> = files
        .iter()
        .filter(|p| {
            let text = std::fs::read_to_string(p).unwrap();
            !text.starts_with("//!")
        })
        .collect();
    assert!(
        bad.is_empty(),
        "these files do not open with a `//!` line: {bad:#?}"
    );
}

fn subcommand_paths(cmd: &clap::Command, prefix: &str, out: &mut Vec<String>) {
    for sub in cmd.get_subcommands() {
        if sub.get_name() == "help" || sub.is_hide_set() {
            continue;
        }
        let path = format!("{prefix} {}", sub.get_name());
        out.push(path.trim().to_string());
        subcommand_paths(sub, &path, out);
    }
}

#[test]
fn every_subcommand_is_in_the_command_reference() {
    let page = std::fs::read_to_string(source_root().join("docs/reference/commands.md")).unwrap();
    let mut paths = Vec::new();
    subcommand_paths(&warmstart::cli::Cli::command(), "", &mut paths);
    let missing: Vec<_> = paths
        .iter()
        .filter(|p| !page.contains(&format!("\n## {p}\n")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/reference/commands.md has no section for: {missing:#?} (regenerate it: UPDATE_DOCS=1 cargo test --test it docs::)"
    );
}

#[test]
fn exit_code_table_matches_the_code() {
    let page = std::fs::read_to_string(source_root().join("docs/reference/exit-codes.md")).unwrap();
    let rows: Vec<&str> = page
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| code"))
        .collect();
    let want: Vec<String> = warmstart::exit::Code::ALL
        .iter()
        .map(|(code, meaning)| format!("| {} | {} |", code.as_i32(), meaning))
        .collect();
    assert_eq!(
        rows, want,
        "docs/reference/exit-codes.md's table is not exit::Code::ALL (regenerate it: UPDATE_DOCS=1 cargo test --test it docs::)"
    );
}

#[test]
fn every_cache_manifest_parses() {
    // Each file goes through the parser that will read it for real, so a
    // manifest that is valid TOML but not a valid plan fails here.
    let root = source_root();
    let repo = warmstart::repo::Repo {
        root: root.clone(),
        git_dir: root.join(".git"),
    };
    let dir = repo.manifests_dir();
    let mut count = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        count += 1;
        let stem = path.file_stem().unwrap().to_str().unwrap().to_string();
        let text = std::fs::read_to_string(&path).unwrap();
        let result = match stem.as_str() {
            "gates" => warmstart::gates::manifest::parse(&text).map(|_| ()),
            "restore" => warmstart::restore::plan::parse(&repo, &path, &text).map(|_| ()),
            name => warmstart::cache::manifests::load(&repo, name).map(|_| ()),
        };
        if let Err(e) = result {
            panic!("{} does not parse: {e:#}", path.display());
        }
    }
    assert!(
        count >= 3,
        "expected gates, restore and cache manifests in {}",
        dir.display()
    );
}
