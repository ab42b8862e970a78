//! The command the user ran, as every message, hint and generated README names it.
//!
//! warmstart runs two ways: `cargo xtask ...` (an xtask crate that depends on
//! this library, started by `cargo run`) and `warmstart ...` (a standalone
//! binary on PATH). A hint that says `cargo xtask` where no alias exists is
//! `error: no such command: xtask`, so the name is worked out once, here:
//! 1. `WARMSTART_COMMAND`, when set, wins (an alias of the user's own, say);
//! 2. `cargo xtask` when `CARGO` is set *and* the running executable lives in
//!    the workspace's target directory: every child of any cargo process
//!    inherits `CARGO`, so that variable alone proves nothing;
//! 3. otherwise the file name the binary was invoked by (argv\[0\]).
//!
//! It never fails: a name it cannot work out is `warmstart`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The setting that overrides the name (listed in `settings::KNOWN`).
pub const OVERRIDE: &str = "WARMSTART_COMMAND";

/// The command to name in messages: `cargo xtask`, `warmstart`, or the override.
pub fn command() -> &'static str {
    static NAME: OnceLock<String> = OnceLock::new();
    NAME.get_or_init(|| {
        let cwd = std::env::current_dir().unwrap_or_default();
        decide(&Facts {
            setting: std::env::var(OVERRIDE).ok(),
            cargo: std::env::var_os("CARGO"),
            target_dir: std::env::var_os("CARGO_TARGET_DIR"),
            exe: std::env::current_exe().ok(),
            argv0: std::env::args_os().next(),
            cwd,
        })
    })
}

/// What the decision reads, gathered so that tests can feed any combination.
#[derive(Debug, Default)]
pub struct Facts {
    pub setting: Option<String>,
    pub cargo: Option<OsString>,
    pub target_dir: Option<OsString>,
    pub exe: Option<PathBuf>,
    pub argv0: Option<OsString>,
    pub cwd: PathBuf,
}

/// The rule of the module doc, on explicit facts.
pub fn decide(f: &Facts) -> String {
    if let Some(s) = f
        .setting
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        return s.to_string();
    }
    if f.cargo.is_some()
        && let Some(exe) = &f.exe
        && target_dirs(f).iter().any(|t| within(exe, t))
    {
        return "cargo xtask".to_string();
    }
    f.argv0
        .as_deref()
        .map(Path::new)
        .and_then(Path::file_name)
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "warmstart".to_string())
}

/// The workspace's target directory as cargo resolves it: `CARGO_TARGET_DIR`
/// (relative to the current directory), else `target/` next to any
/// `Cargo.toml` above the current directory (the workspace root is one).
fn target_dirs(f: &Facts) -> Vec<PathBuf> {
    if let Some(t) = &f.target_dir {
        return vec![f.cwd.join(t)];
    }
    f.cwd
        .ancestors()
        .filter(|d| d.join("Cargo.toml").is_file())
        .map(|d| d.join("target"))
        .collect()
}

/// Whether `exe` is inside `dir`, both with symlinks resolved where they exist.
fn within(exe: &Path, dir: &Path) -> bool {
    let exe = std::fs::canonicalize(exe).unwrap_or_else(|_| exe.to_path_buf());
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    exe.starts_with(&dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workspace() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("Cargo.toml"), "[workspace]\n").unwrap();
        std::fs::create_dir_all(d.path().join("target/debug")).unwrap();
        std::fs::write(d.path().join("target/debug/xtask"), "").unwrap();
        d
    }

    #[test]
    fn cargo_run_of_an_xtask_in_the_workspace_is_cargo_xtask() {
        let w = workspace();
        let f = Facts {
            cargo: Some("cargo".into()),
            exe: Some(w.path().join("target/debug/xtask")),
            argv0: Some("target/debug/xtask".into()),
            cwd: w.path().join("sub"),
            ..Facts::default()
        };
        assert_eq!(decide(&f), "cargo xtask");
    }

    #[test]
    fn cargo_set_by_a_parent_proves_nothing() {
        let w = workspace();
        let f = Facts {
            cargo: Some("cargo".into()),
            exe: Some("/usr/local/bin/warmstart".into()),
            argv0: Some("/usr/local/bin/warmstart".into()),
            cwd: w.path().to_path_buf(),
            ..Facts::default()
        };
        assert_eq!(decide(&f), "warmstart");
        // Without CARGO, even a binary in target/ is named as invoked.
        let f = Facts {
            exe: Some(w.path().join("target/debug/xtask")),
            argv0: Some("xtask".into()),
            cwd: w.path().to_path_buf(),
            ..Facts::default()
        };
        assert_eq!(decide(&f), "xtask");
    }

    #[test]
    fn cargo_target_dir_is_the_target_directory_when_set() {
        let w = workspace();
        let f = Facts {
            cargo: Some("cargo".into()),
            target_dir: Some(w.path().join("elsewhere").into()),
            exe: Some(w.path().join("target/debug/xtask")),
            argv0: Some("xtask".into()),
            cwd: w.path().to_path_buf(),
            ..Facts::default()
        };
        assert_eq!(decide(&f), "xtask");
    }

    #[test]
    fn the_setting_wins_and_an_empty_name_falls_back() {
        let f = Facts {
            setting: Some("just ws".into()),
            cargo: Some("cargo".into()),
            ..Facts::default()
        };
        assert_eq!(decide(&f), "just ws");
        assert_eq!(decide(&Facts::default()), "warmstart");
    }
}
