//! What `[build]` demands of the rest of a cache manifest, checked when the
//! manifest loads (`manifest::parse`) so that a refused one touches nothing.
//!
//! A build's staging directory replaces the whole pack root, so the pack
//! root must be a directory the build owns outright. Never: accept a pack
//! root that is, or holds, the repository, its git directory, warmstart's
//! state, HOME or a build input, as written or through a symlink.

use anyhow::{Result, bail};
use std::path::{Path, PathBuf};

use crate::cache::format::build::Build;
use crate::fsio::{lexical, through_links};
use crate::repo::Repo;

/// The limits `[build]` puts on the rest of the manifest (`picks`: it has
/// `[pack] include`/`exclude`): a build's staging
/// directory replaces the whole pack root, so the pack root must be a
/// directory the build owns outright, never one that is, or holds, the
/// repository, its git directory, warmstart's state, HOME or an input
/// (compared lexically and through symlinks); `[pack] include`/`exclude`
/// would say only part of it is the artifact; and a write-back (`on_miss`)
/// replaces its target whole, which only `restore.mode = "replace"` says.
pub fn check(
    repo: &Repo,
    b: &Build,
    picks: bool,
    replace_mode: bool,
    pack_root: &Path,
) -> Result<()> {
    if picks {
        bail!(
            "[build] replaces the whole pack.root ({}), so [pack] include and exclude cannot pick part of it: drop include/exclude and have the build write only the artifact, or drop [build]",
            pack_root.display()
        );
    }
    if b.on_miss && !replace_mode {
        bail!(
            "build.on_miss installs what it built by replacing restore.path whole, which only `restore.mode = \"replace\"` says: set it, or drop build.on_miss and publish with `cache build` then `cache publish`"
        );
    }
    let mut guarded: Vec<(String, PathBuf)> = vec![
        ("the repository root".into(), repo.root.clone()),
        ("the git directory".into(), repo.git_dir.clone()),
        ("the git directory".into(), repo.common_git_dir()),
        ("warmstart's state directory".into(), repo.state_dir()),
    ];
    if let Some(h) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        guarded.push(("HOME".into(), PathBuf::from(h)));
    }
    for input in &b.inputs {
        guarded.push((format!("build.inputs {input:?}"), repo.root.join(input)));
    }
    let root_forms = [lexical(pack_root), through_links(pack_root)];
    for (what, p) in &guarded {
        let hit = [lexical(p), through_links(p)]
            .iter()
            .any(|g| root_forms.iter().any(|r| g.starts_with(r)));
        if hit {
            bail!(
                "pack.root {} is or holds {what} ({}), and a [build] replaces the whole pack root: point pack.root at a directory only the build writes, such as \"build/out\"",
                pack_root.display(),
                p.display()
            );
        }
    }
    Ok(())
}
