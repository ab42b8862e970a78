//! The one cache fixture: a bare origin, a clone `work` with `origin` set, cache
//! manifests written from a few parameters, and the real binary run in the clone.
//!
//! It never fakes a step: publishes and restores go through the built binary
//! and real git, and the origin is a bare repository on disk (by path) or
//! served by `git daemon` on 127.0.0.1. What a test needs beyond the common
//! shape it adds itself, to what this built.

use super::git_daemon::GitDaemon;
use super::{Run, TestEnv, run, show};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// How the clone reaches its origin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Serve {
    /// `origin.git` by its absolute path.
    Path,
    /// `origin.git` as `../origin.git`, relative to the clone.
    RelativePath,
    /// `origin.git` as a `file://` URL.
    FileUrl,
    /// `srv/origin.git` served by `git daemon` (a `git://` URL).
    Daemon,
}

/// A test's origin, its clone `work`, and the environment every run of the
/// binary gets.
pub struct Fixture {
    pub env: TestEnv,
    /// The clone (`<test dir>/work`), with one commit on `main`.
    pub work: PathBuf,
    /// The bare origin repository.
    pub origin: PathBuf,
    /// What `origin` is set to in the clone.
    pub url: String,
    pub daemon: Option<GitDaemon>,
    vars: Vec<(String, String)>,
}

impl Fixture {
    /// `origin.git` by absolute path, cloned as `work`.
    pub fn new() -> Fixture {
        Fixture::serve(Serve::Path)
    }

    /// `srv/origin.git` served by `git daemon`, cloned as `work`.
    pub fn served() -> Fixture {
        Fixture::serve(Serve::Daemon)
    }

    pub fn serve(serve: Serve) -> Fixture {
        let env = TestEnv::new();
        let (origin, url, daemon) = match serve {
            Serve::Path => {
                let origin = env.bare_remote("origin.git");
                let url = origin.to_str().unwrap().to_string();
                (origin, url, None)
            }
            Serve::RelativePath => {
                let origin = env.bare_remote("origin.git");
                (origin, "../origin.git".to_string(), None)
            }
            Serve::FileUrl => {
                let origin = env.bare_remote("origin.git");
                let url = format!("file://{}", origin.display());
                (origin, url, None)
            }
            Serve::Daemon => {
                std::fs::create_dir_all(env.join("srv")).unwrap();
                let origin = env.bare_remote("srv/origin.git");
                let daemon = GitDaemon::start(&env.join("srv"));
                (origin, daemon.url("origin.git"), Some(daemon))
            }
        };
        let fx = Fixture {
            work: env.join("work"),
            env,
            origin,
            url,
            daemon,
            vars: Vec::new(),
        };
        fx.clone_repo("work");
        fx
    }

    /// Sets `name` to `value` for every later run of the binary.
    pub fn with_var(mut self, name: &str, value: &str) -> Fixture {
        self.vars.push((name.to_string(), value.to_string()));
        self
    }

    /// Another repository `rel` with one commit and `origin` set like `work`'s
    /// (not a clone: its objects hold nothing of the origin's).
    pub fn clone_repo(&self, rel: &str) -> PathBuf {
        let repo = self.env.work_repo(rel);
        self.env
            .git(rel, ["remote", "add", "origin", self.url.as_str()]);
        repo
    }

    /// The daemon serving the origin (a `Serve::Daemon` fixture only).
    pub fn daemon(&self) -> &GitDaemon {
        self.daemon
            .as_ref()
            .expect("a fixture served by git daemon")
    }

    /// Runs git in the origin; panics on failure.
    pub fn origin_git(&self, args: &[&str]) -> String {
        self.env.git(&self.origin, args)
    }

    /// Writes `cache-manifests/<name>.toml` in `work`.
    pub fn write_manifest(&self, name: &str, manifest: &Manifest) {
        manifest.write(&self.work, name);
    }

    /// Writes `text` to `rel` inside `work` (a pin file, say).
    pub fn write(&self, rel: &str, text: &str) {
        let path = self.work.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    /// The binary in `dir` (relative to the test directory), not started.
    pub fn command_in(&self, dir: impl AsRef<Path>, args: &[&str]) -> Command {
        let mut cmd = self.env.xtask_in(dir);
        for (k, v) in &self.vars {
            cmd.env(k, v);
        }
        cmd.args(args);
        cmd
    }

    /// The binary in `work`, not started.
    pub fn command(&self, args: &[&str]) -> Command {
        self.command_in("work", args)
    }

    pub fn xtask_in(&self, dir: impl AsRef<Path>, args: &[&str]) -> Run {
        run(&mut self.command_in(dir, args))
    }

    pub fn xtask(&self, args: &[&str]) -> Run {
        self.xtask_in("work", args)
    }

    /// Runs `args` in `dir`, which must succeed, and parses its stdout.
    pub fn json_in(&self, dir: impl AsRef<Path>, args: &[&str]) -> Value {
        json_of(&self.xtask_in(dir, args).ok())
    }

    /// Runs `args` in `work`, which must succeed, and parses its stdout.
    pub fn json(&self, args: &[&str]) -> Value {
        self.json_in("work", args)
    }

    /// `cache publish <cache> --json` in `work`, which must succeed.
    pub fn publish(&self, cache: &str) -> Value {
        self.json(&["cache", "publish", cache, "--json"])
    }

    /// `cache restore <cache> --json` in `work`, which must succeed.
    pub fn restore(&self, cache: &str) -> Value {
        self.json(&["cache", "restore", cache, "--json"])
    }

    /// Forgets what `work` fetched and installed (`.git/warmstart`): the
    /// next restore is a fresh clone's.
    pub fn forget(&self) {
        std::fs::remove_dir_all(self.work.join(".git/warmstart")).unwrap();
    }
}

impl Default for Fixture {
    fn default() -> Self {
        Fixture::new()
    }
}

/// The stdout of a run, parsed as JSON; panics with all output if it is not.
pub fn json_of(r: &Run) -> Value {
    serde_json::from_str(&r.stdout()).unwrap_or_else(|e| panic!("{e}\n{}", show(&r.out)))
}

/// A cache manifest from a few parameters:
///
/// ```toml
/// [cache]            # only when given
/// ...
/// [[key]]            # each key
/// ...
/// [pack]
/// root = "<root>"
/// [publish]          # only when given
/// ...
/// [restore]
/// path = "<path>"    # default restored/art
/// ...
/// <extra>            # any further tables
/// ```
#[derive(Clone, Debug)]
pub struct Manifest {
    cache: Option<String>,
    keys: Vec<String>,
    root: String,
    /// Further lines of the `[pack]` table, after `root`.
    pack: String,
    publish: Option<String>,
    restore: String,
    extra: String,
}

impl Manifest {
    /// One key `v` of the literal `literal`, packing `root`.
    pub fn literal(literal: &str, root: impl AsRef<Path>) -> Manifest {
        Manifest::keyless(root).key(&format!("name = \"v\"\nliteral = \"{literal}\""))
    }

    /// One key `v` read from `file` by the pattern `v=(\S+)`, packing `root`.
    pub fn pinned(file: &str, root: impl AsRef<Path>) -> Manifest {
        Manifest::keyless(root).regex_key("v", file)
    }

    /// No key yet, packing `root` into `restored/art`.
    pub fn keyless(root: impl AsRef<Path>) -> Manifest {
        Manifest {
            cache: None,
            keys: Vec::new(),
            root: root.as_ref().display().to_string(),
            pack: String::new(),
            publish: None,
            restore: "path = \"restored/art\"\n".to_string(),
            extra: String::new(),
        }
    }

    /// Adds a key `name` read from `file` by the pattern `<name>=(\S+)`.
    pub fn regex_key(self, name: &str, file: &str) -> Manifest {
        self.key(&format!(
            "name = \"{name}\"\nregex = {{ file = \"{file}\", pattern = '{name}=(\\S+)' }}"
        ))
    }

    /// Adds a `[[key]]` table of these lines.
    pub fn key(mut self, lines: &str) -> Manifest {
        self.keys.push(format!("[[key]]\n{lines}\n"));
        self
    }

    /// The `[cache]` table's lines (an empty string writes an empty table).
    pub fn cache(mut self, lines: &str) -> Manifest {
        self.cache = Some(lines.to_string());
        self
    }

    /// A further line of the `[pack]` table (`keep_mtime = true`, say).
    pub fn pack_line(mut self, line: &str) -> Manifest {
        self.pack.push_str(line);
        self.pack.push('\n');
        self
    }

    /// The `[publish]` table's lines.
    pub fn publish(mut self, lines: &str) -> Manifest {
        self.publish = Some(lines.to_string());
        self
    }

    /// `[publish] chunk_bytes`.
    pub fn chunk_bytes(self, bytes: u64) -> Manifest {
        self.publish(&format!("chunk_bytes = {bytes}"))
    }

    /// `[restore] path`.
    pub fn restore_path(mut self, path: impl AsRef<Path>) -> Manifest {
        self.restore = format!("path = \"{}\"\n", path.as_ref().display());
        self
    }

    /// A further line of the `[restore]` table (`mode = "replace"`, say).
    pub fn restore_line(mut self, line: &str) -> Manifest {
        self.restore.push_str(line);
        self.restore.push('\n');
        self
    }

    /// Text after the `[restore]` table (further tables).
    pub fn extra(mut self, text: &str) -> Manifest {
        self.extra.push_str(text);
        self
    }

    pub fn text(&self) -> String {
        let mut t = String::new();
        if let Some(c) = &self.cache {
            t.push_str(&format!("[cache]\n{c}\n\n"));
        }
        for k in &self.keys {
            t.push_str(k);
            t.push('\n');
        }
        t.push_str(&format!(
            "[pack]\nroot = \"{}\"\n{}\n",
            self.root, self.pack
        ));
        if let Some(p) = &self.publish {
            t.push_str(&format!("[publish]\n{p}\n\n"));
        }
        t.push_str(&format!("[restore]\n{}{}", self.restore, self.extra));
        t
    }

    /// Writes `cache-manifests/<name>.toml` in `repo`.
    pub fn write(&self, repo: &Path, name: &str) {
        let dir = repo.join("cache-manifests");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{name}.toml")), self.text()).unwrap();
    }
}

#[test]
fn a_manifest_is_the_toml_the_cache_tests_wrote_by_hand() {
    let m = Manifest::literal("1", "/src")
        .chunk_bytes(20000)
        .extra("[ready]\nfile = \"x\"\n");
    assert_eq!(
        m.text(),
        "[[key]]\nname = \"v\"\nliteral = \"1\"\n\n[pack]\nroot = \"/src\"\n\n[publish]\nchunk_bytes = 20000\n\n[restore]\npath = \"restored/art\"\n[ready]\nfile = \"x\"\n"
    );
    let m = Manifest::pinned("pins.txt", "../art")
        .cache("description = \"delta\"")
        .publish("chunk_avg = \"8KiB\"")
        .restore_path("/i/dt");
    assert_eq!(
        m.text(),
        "[cache]\ndescription = \"delta\"\n\n[[key]]\nname = \"v\"\nregex = { file = \"pins.txt\", pattern = 'v=(\\S+)' }\n\n[pack]\nroot = \"../art\"\n\n[publish]\nchunk_avg = \"8KiB\"\n\n[restore]\npath = \"/i/dt\"\n"
    );
}
