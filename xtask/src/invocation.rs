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
//! 3. otherwise the binary as it was invoked (argv\[0\]): its file name when
//!    that name on PATH is this same binary, else argv\[0\] as typed
//!    (`target/warmstart-bin/warmstart`, where a standalone adopter's
//!    bootstrap leaves it), since a hint naming a bare `warmstart` that is
//!    not on PATH is exit 127.
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
            path: std::env::var_os("PATH"),
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
    /// `PATH`, to tell whether the bare file name finds this binary.
    pub path: Option<OsString>,
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
    let Some(argv0) = f.argv0.as_deref().map(Path::new) else {
        return "warmstart".to_string();
    };
    let Some(name) = argv0
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| !n.is_empty())
    else {
        return "warmstart".to_string();
    };
    if argv0.parent().is_none_or(|p| p.as_os_str().is_empty()) || on_path(f, &name, argv0) {
        return name;
    }
    shell_word(&argv0.to_string_lossy())
}

/// Whether `name` looked up in PATH is the binary `argv0` names.
fn on_path(f: &Facts, name: &str, argv0: &Path) -> bool {
    let ran = f.exe.clone().unwrap_or_else(|| f.cwd.join(argv0));
    let ran = std::fs::canonicalize(&ran).unwrap_or(ran);
    let Some(path) = &f.path else {
        return false;
    };
    std::env::split_paths(path)
        .filter(|d| !d.as_os_str().is_empty())
        .map(|d| f.cwd.join(d).join(name))
        .find(|p| p.is_file())
        .and_then(|p| std::fs::canonicalize(p).ok())
        .is_some_and(|found| found == ran)
}

/// The command as a file others read names it (a branch README): the
/// binary's file name where `command` is a path, since a path of the
/// publisher's machine means nothing on another.
pub fn portable(command: &str) -> String {
    if !command.contains('/') {
        return command.to_string();
    }
    let bare = command.trim_matches('\'');
    match bare.rsplit_once('/') {
        Some((_, name)) if !name.is_empty() => name.replace(r"'\''", "'"),
        _ => "warmstart".to_string(),
    }
}

/// A path as one shell word: as it is when it holds only characters no
/// shell treats specially, else in single quotes.
fn shell_word(s: &str) -> String {
    if s.chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+,@%=:".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
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
        let bin = w.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("warmstart"), "").unwrap();
        let f = Facts {
            cargo: Some("cargo".into()),
            exe: Some(bin.join("warmstart")),
            argv0: Some(bin.join("warmstart").into()),
            path: Some(bin.clone().into()),
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

    /// A standalone adopter runs `target/warmstart-bin/warmstart`, which is
    /// not on PATH: a hint naming a bare `warmstart` would be exit 127.
    #[test]
    fn a_binary_run_by_a_path_not_on_path_is_named_by_that_path() {
        let w = workspace();
        let dir = w.path().join("target/warmstart-bin");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("warmstart"), "").unwrap();
        let other = w.path().join("elsewhere");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(other.join("warmstart"), "").unwrap();
        let mut f = Facts {
            exe: Some(dir.join("warmstart")),
            argv0: Some("target/warmstart-bin/warmstart".into()),
            path: Some(other.clone().into()),
            cwd: w.path().to_path_buf(),
            ..Facts::default()
        };
        // Another `warmstart` on PATH is not this one.
        assert_eq!(decide(&f), "target/warmstart-bin/warmstart");
        f.path = Some(std::env::join_paths([&other, &dir]).unwrap());
        assert_eq!(decide(&f), "target/warmstart-bin/warmstart");
        f.path = Some(std::env::join_paths([&dir, &other]).unwrap());
        assert_eq!(decide(&f), "warmstart");
        f.path = None;
        f.argv0 = Some("./my tools/warmstart".into());
        assert_eq!(decide(&f), "'./my tools/warmstart'");
        // Run by its bare name, PATH found it: the name is right.
        f.argv0 = Some("warmstart".into());
        assert_eq!(decide(&f), "warmstart");
        // What others read never names a path of this machine.
        assert_eq!(portable("target/warmstart-bin/warmstart"), "warmstart");
        assert_eq!(portable("'./my tools/warmstart'"), "warmstart");
        assert_eq!(portable("cargo xtask"), "cargo xtask");
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
