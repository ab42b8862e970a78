//! Tidy: the rules of the source tree that no compiler checks.
//!
//! Every `.rs` file opens with a `//!` line; every subcommand appears in
//! README.md; README's exit-code table is exactly `exit::Code::ALL`; every file
//! in `cache-manifests/` parses.

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
        if sub.get_name() == "help" {
            continue;
        }
        let path = format!("{prefix} {}", sub.get_name());
        out.push(path.clone());
        subcommand_paths(sub, &path, out);
    }
}

#[test]
fn every_subcommand_is_in_the_readme() {
    let readme = std::fs::read_to_string(source_root().join("README.md")).unwrap();
    let mut paths = Vec::new();
    subcommand_paths(&warmstart::cli::Cli::command(), "cargo xtask", &mut paths);
    let missing: Vec<_> = paths
        .iter()
        .filter(|p| !readme.contains(p.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "README.md does not mention: {missing:#?}"
    );
}

#[test]
fn readme_exit_code_table_matches_the_code() {
    let readme = std::fs::read_to_string(source_root().join("README.md")).unwrap();
    for (code, meaning) in warmstart::exit::Code::ALL {
        let row = format!("| {} | {} |", code.as_i32(), meaning);
        assert!(
            readme.contains(&row),
            "README.md's exit-code table lacks the row `{row}` (keep it equal to exit::Code::ALL)"
        );
    }
}

#[test]
fn every_cache_manifest_parses() {
    let dir = source_root().join("cache-manifests");
    let mut count = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            count += 1;
            let text = std::fs::read_to_string(&path).unwrap();
            if let Err(e) = toml::from_str::<toml::Table>(&text) {
                panic!("{} does not parse: {e}", path.display());
            }
        }
    }
    assert!(count > 0, "no manifests found in {}", dir.display());
}
