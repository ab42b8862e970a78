//! Finding the repository warmstart serves, and its private state directory.
//!
//! The binary works in any repository: it finds the root from the current
//! directory, reads that repository's `cache-manifests/`, and keeps its state
//! (stamps, logs, journals) under the git directory, never in the work tree.
//! This module only looks at the file system; it never runs git, so the warm
//! paths that use it stay fast.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

use crate::exit::{Code, fail};

/// A repository: its work-tree root and its git directory.
#[derive(Clone, Debug)]
pub struct Repo {
    pub root: PathBuf,
    pub git_dir: PathBuf,
}

impl Repo {
    /// Walks up from `start` to the first directory holding `.git` (a
    /// directory, or a `gitdir:` file as in worktrees and submodules).
    pub fn discover(start: &Path) -> Result<Repo> {
        let joined = if start.is_absolute() {
            start.to_path_buf()
        } else {
            std::env::current_dir()
                .context("reading the current directory")?
                .join(start)
        };
        // Drop `.` components so paths in messages read `/w/.git`, not `/w/./.git`.
        let start: PathBuf = joined
            .components()
            .filter(|c| !matches!(c, std::path::Component::CurDir))
            .collect();
        let mut dir = start.as_path();
        loop {
            let dot_git = dir.join(".git");
            if dot_git.is_dir() {
                return Ok(Repo {
                    root: dir.to_path_buf(),
                    git_dir: dot_git,
                });
            }
            if dot_git.is_file() {
                let text = std::fs::read_to_string(&dot_git)
                    .with_context(|| format!("reading {}", dot_git.display()))?;
                let target = text
                    .strip_prefix("gitdir:")
                    .map(str::trim)
                    .with_context(|| format!("{} has no gitdir: line", dot_git.display()))?;
                return Ok(Repo {
                    root: dir.to_path_buf(),
                    git_dir: dir.join(target),
                });
            }
            match dir.parent() {
                Some(parent) => dir = parent,
                None => {
                    return Err(fail(
                        Code::Config,
                        format!(
                            "{} is not inside a git repository: run warmstart from a clone, or `git init` first",
                            start.display()
                        ),
                    ));
                }
            }
        }
    }

    /// Discovers from the current directory.
    pub fn from_cwd() -> Result<Repo> {
        Repo::discover(Path::new("."))
    }

    /// `cache-manifests/` of this repository.
    pub fn manifests_dir(&self) -> PathBuf {
        self.root.join("cache-manifests")
    }

    /// Where warmstart keeps per-clone state: `<git-dir>/warmstart/`.
    /// Created on demand by the callers that write there.
    pub fn state_dir(&self) -> PathBuf {
        self.git_dir.join("warmstart")
    }

    /// The git directory every worktree of this clone shares (what `git
    /// rev-parse --git-common-dir` prints): a linked worktree's git dir
    /// names it in its `commondir` file; any other git dir is its own.
    pub fn common_git_dir(&self) -> PathBuf {
        match std::fs::read_to_string(self.git_dir.join("commondir")) {
            Ok(text) if !text.trim().is_empty() => {
                let joined = self.git_dir.join(text.trim_end_matches(['\n', '\r']));
                std::fs::canonicalize(&joined).unwrap_or(joined)
            }
            _ => self.git_dir.clone(),
        }
    }

    /// State every worktree of the clone shares: `<common git dir>/warmstart`.
    pub fn shared_state_dir(&self) -> PathBuf {
        self.common_git_dir().join("warmstart")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_root_from_subdirectory() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join(".git")).unwrap();
        std::fs::create_dir_all(tmp.path().join("a/b")).unwrap();
        let repo = Repo::discover(&tmp.path().join("a/b")).unwrap();
        assert_eq!(repo.root, tmp.path());
        assert_eq!(repo.state_dir(), tmp.path().join(".git/warmstart"));
    }

    #[test]
    fn current_dir_components_are_dropped() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join(".git")).unwrap();
        let repo = Repo::discover(&tmp.path().join(".")).unwrap();
        assert_eq!(repo.root, tmp.path());
    }

    #[test]
    fn a_linked_worktree_shares_the_common_git_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let wt = tmp.path().join("main/.git/worktrees/two");
        std::fs::create_dir_all(&wt).unwrap();
        std::fs::write(wt.join("commondir"), "../..\n").unwrap();
        std::fs::create_dir_all(tmp.path().join("two")).unwrap();
        let gitfile = format!("gitdir: {}\n", wt.display());
        std::fs::write(tmp.path().join("two/.git"), gitfile).unwrap();
        let repo = Repo::discover(&tmp.path().join("two")).unwrap();
        let common = std::fs::canonicalize(tmp.path().join("main/.git")).unwrap();
        assert_eq!(repo.common_git_dir(), common);
        assert_eq!(repo.shared_state_dir(), common.join("warmstart"));
        let main = Repo::discover(&tmp.path().join("main")).unwrap();
        assert_eq!(main.common_git_dir(), tmp.path().join("main/.git"));
    }

    #[test]
    fn follows_gitdir_file() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join(".git"), "gitdir: /elsewhere/wt\n").unwrap();
        let repo = Repo::discover(tmp.path()).unwrap();
        assert_eq!(repo.git_dir, Path::new("/elsewhere/wt"));
    }
}
