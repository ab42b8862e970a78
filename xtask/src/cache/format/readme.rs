//! The generated `README.md` at the root of every cache branch.
//!
//! Someone who finds the branch on a hosting site learns what it is, what
//! each key holds, and how to restore it with warmstart or with git and
//! coreutils alone (the recipe of docs/format.md, "Restoring with coreutils
//! alone"). Pure text: this module renders and never touches anything.

use crate::cache::format::BranchManifest;
use crate::size::human as human_bytes;

/// Inputs of the README besides the branch manifest.
pub struct ReadmeContext<'a> {
    /// The cache's name (`cache-manifests/<name>.toml`).
    pub name: &'a str,
    pub branch: &'a str,
    /// How a clone usually calls the remote (`origin`), or its URL.
    pub remote: &'a str,
    pub description: &'a str,
    /// The command that runs warmstart here (`crate::invocation::command`).
    pub command: &'a str,
}

/// Renders the branch README.
pub fn render(cx: &ReadmeContext, m: &BranchManifest) -> String {
    let mut s = intro(cx);
    s.push_str(&holdings(m));
    s.push_str(&restores(cx, m));
    s.push_str(&signatures(cx));
    s
}

/// The title, where the cache lives, and what a cache branch is.
fn intro(cx: &ReadmeContext) -> String {
    let ReadmeContext {
        name,
        branch,
        remote,
        description,
        command,
    } = *cx;
    let command = &crate::invocation::portable(command);
    let mut s = String::new();
    s.push_str(&format!("# `{branch}`: a warmstart cache branch\n\n"));
    let (place, clones) = if branch.starts_with("refs/") {
        (
            format!("the ref `{branch}`"),
            format!(
                "It lives outside `refs/heads/`, so a plain `git clone` or `git fetch` of the \
repository never downloads it: only `git fetch {remote} {branch}` does."
            ),
        )
    } else {
        (
            format!("the branch `{branch}`"),
            format!(
                "It is a branch, so a plain `git clone` (and `git fetch`) of the repository \
downloads it too; clone with `--single-branch`, or move it to a ref outside `refs/heads/` \
(`ref = \"refs/warmstart/cache/{name}\"` under `[cache]`, then `{command} cache migrate {name}`)."
            ),
        )
    };
    if !description.is_empty() {
        s.push_str(&format!("> {description}\n\n"));
    }
    s.push_str(&format!(
        "This is a cache, not source code: {place}. `{command} cache publish {name}` \
(warmstart) wrote it from `cache-manifests/{name}.toml`. It always holds exactly one \
commit with no parent: every publish replaces that commit, so a fetch of it downloads \
only the current artifacts (a clone that fetched an older one keeps those objects \
until `git gc` prunes them). {clones}\n\n"
    ));
    s
}

/// The table of keys, and what each file of the branch is.
fn holdings(m: &BranchManifest) -> String {
    let mut s = String::new();
    s.push_str("## What it holds\n\n");
    s.push_str("| key | entries | unpacked | compressed | chunks | published |\n");
    s.push_str("|---|---:|---:|---:|---:|---|\n");
    for (key, e) in &m.keys {
        let compressed: u64 = e.chunks.iter().map(|c| c.size).sum();
        s.push_str(&format!(
            "| `{key}` | {} | {} | {} | {} | {} |\n",
            e.files,
            human_bytes(e.tar_size),
            human_bytes(compressed),
            e.chunks.len(),
            e.created_at
        ));
    }
    s.push_str(
        "\nFiles: `warmstart.json` describes every key (its chunks, the sha256 and size of \
its tar, how its key was built, the commit it was published from, its gate record); \
`SHA256SUMS` lists the sha256 of every chunk file; `<key>.tar.zst.partNNN` are the \
chunks. The chunks of a key, concatenated in name order, are one zstd stream whose \
content is a tar of the artifact.\n\n",
    );
    s
}

/// How to restore: with warmstart, and with git and coreutils alone.
fn restores(cx: &ReadmeContext, m: &BranchManifest) -> String {
    let ReadmeContext {
        name,
        branch,
        remote,
        command,
        ..
    } = *cx;
    let command = &crate::invocation::portable(command);
    let mut s = String::new();
    s.push_str("## Restore with warmstart\n\n");
    s.push_str(&format!(
        "```sh\n{command} cache restore {name}\n```\n\n\
It fetches only this commit, checks every chunk before decompressing it, unpacks into a \
staging directory and swaps it in atomically.\n\n"
    ));
    s.push_str("## Restore with git and coreutils alone\n\n");
    s.push_str(
        "Needs git, `sha256sum` (coreutils), `tar` and `zstd`. Pick a key from the table, \
then run, in a clone of the repository:\n\n",
    );
    let key = m.keys.keys().next().map(String::as_str).unwrap_or("KEY");
    s.push_str(&format!(
        "```sh\nKEY={key}\nDEST=restored\nmkdir -p tmp \"$DEST\"\n\
git fetch {remote} {branch} && git archive FETCH_HEAD | tar -x -C tmp && (cd tmp && sha256sum -c SHA256SUMS) && cat tmp/$KEY.tar.zst.part* | zstd -d | tar -x -C \"$DEST\"\n```\n\n"
    ));
    s.push_str(
        "`sha256sum -c` must print `OK` for every chunk before anything is unpacked. To \
check the unpacked tar too, compare `cat tmp/$KEY.tar.zst.part* | zstd -d | sha256sum` \
with the key's `tar_sha256` in `warmstart.json`.\n\n",
    );
    s
}

/// How to check a key's signed statement with ssh-keygen and coreutils.
fn signatures(cx: &ReadmeContext) -> String {
    let remote = cx.remote;
    let mut s = String::new();
    s.push_str("## Check who published it\n\n");
    s.push_str(&format!(
        "A signed key has `<key>.statement` (what was signed: its chunks' sha256 lines, its tar \
digest and size, source commit, gate record digest, `ungated`, `created_at`) and \
`<key>.statement.sig`. Check it against the signers the repository allows (from its main \
branch, never from this one) before unpacking, with ssh-keygen and coreutils alone:\n\n\
```sh\ngit show {remote}/HEAD:cache-manifests/allowed_signers > allowed_signers\n\
WHO=$(ssh-keygen -Y find-principals -f allowed_signers -s tmp/$KEY.statement.sig)\n\
ssh-keygen -Y verify -f allowed_signers -I \"$WHO\" -n warmstart-cache -s tmp/$KEY.statement.sig < tmp/$KEY.statement \
&& (cd tmp && grep -E '^[0-9a-f]{{64}}  ' $KEY.statement | sha256sum -c)\n```\n\n\
Unpack only when both succeed: the chunk lines of the signed statement, not `SHA256SUMS`, \
are then what `sha256sum -c` checked.\n"
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::format::{Chunk, KeyEntry, KeyPart, archive_name, chunk_name};

    fn manifest() -> BranchManifest {
        let mut m = BranchManifest::new();
        for (key, parts) in [
            ("rust-1.95.0-x86_64_linux", 2u64),
            ("rust-1.95.0-aarch64_linux", 1),
        ] {
            m.keys.insert(
                key.into(),
                KeyEntry {
                    archive: archive_name(key),
                    compression: "zstd".into(),
                    chunks: (0..parts)
                        .map(|i| Chunk {
                            file: chunk_name(key, i as usize, parts as usize),
                            size: 103_809_024 - i * 100_000_000,
                            sha256: "0".repeat(64),
                            raw_size: None,
                            raw_sha256: None,
                        })
                        .collect(),
                    tar_sha256: "1".repeat(64),
                    tar_size: 1_503_238_553,
                    files: 58_211,
                    key_parts: vec![KeyPart {
                        name: "platform".into(),
                        value: "x86_64-linux".into(),
                    }],
                    source_commit: Some("2".repeat(40)),
                    source_tree: Some("3".repeat(40)),
                    gates: serde_json::Value::Null,
                    ungated: false,
                    created_at: "2026-11-30T02:26:20Z".into(),
                    tool_version: "warmstart 0.1.0".into(),
                    frames: None,
                    index: None,
                    index_parts: Vec::new(),
                },
            );
        }
        m
    }

    /// The README users read, pinned, for a branch and for a ref outside
    /// `refs/heads/`. Regenerate with `UPDATE_SNAPSHOTS=1 cargo test --lib
    /// readme` after a deliberate change.
    #[test]
    fn branch_readme_snapshot() {
        for (branch, file) in [
            ("rust-cache", "branch-readme.md"),
            ("refs/warmstart/cache/rust", "branch-readme-ref.md"),
        ] {
            let text = render(
                &ReadmeContext {
                    name: "rust",
                    branch,
                    remote: "origin",
                    description: "the Rust toolchain",
                    command: "cargo xtask",
                },
                &manifest(),
            );
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("src/cache/format/snapshots")
                .join(file);
            if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, &text).unwrap();
            }
            let want = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                text == want,
                "{} is stale: rerun with UPDATE_SNAPSHOTS=1 cargo test --lib readme and review the diff\n--- rendered:\n{text}",
                path.display()
            );
            // The coreutils path the branch README prints, verbatim apart from the variables.
            assert!(text.contains(&format!("git fetch origin {branch} && git archive FETCH_HEAD | tar -x -C tmp && (cd tmp && sha256sum -c SHA256SUMS) && cat tmp/$KEY.tar.zst.part* | zstd -d | tar -x -C \"$DEST\"")));
            // And the signature check of README "Trust".
            assert!(text.contains("ssh-keygen -Y verify -f allowed_signers -I \"$WHO\" -n warmstart-cache -s tmp/$KEY.statement.sig < tmp/$KEY.statement"));
        }
    }
}
