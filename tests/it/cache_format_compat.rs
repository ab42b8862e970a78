//! Compatibility of the framed cache format with today's branches and with
//! older binaries, through the real binary, real git (`git daemon` on
//! 127.0.0.1), the zstd CLI and coreutils:
//! - branches in today's shape (one zstd stream cut at fixed sizes, no
//!   `frames`, raw digests or index) still restore, unsigned and signed
//!   with a version 1 statement written here by hand from README "Trust";
//! - branches whose chunks are independent zstd frames restore through the
//!   coreutils path of docs/format.md, also with more than 1000 chunks, where the
//!   width of the chunk number matters, and the result equals the tree;
//! - what an older binary relies on holds for them: SHA256SUMS lists
//!   exactly the chunks, their concatenation is one zstd stream, and the
//!   new fields only add to today's;
//! - a format this binary does not know is refused in one line, with its
//!   exit code, and nothing is installed or changed.
//!
//! Branches are crafted from the tar of a real publish: decompressed, then
//! cut and compressed again by the zstd CLI in the shape a test needs.

use crate::util::git_daemon::GitDaemon;
use crate::util::tree::assert_same_tree;
use crate::util::{Run, TestEnv, run, show};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The files of a branch's tree, by name.
pub type Files = BTreeMap<String, Vec<u8>>;

/// A repository `work` with cache `art` (key `art-<literal>`), origin
/// served by git daemon, and an ssh signing key `ci`.
pub struct Cx {
    pub env: TestEnv,
    pub daemon: GitDaemon,
    pub work: PathBuf,
    pub target: PathBuf,
}

impl Cx {
    pub fn new() -> Cx {
        let env = TestEnv::new();
        std::fs::create_dir_all(env.join("srv")).unwrap();
        env.bare_remote("srv/origin.git");
        let daemon = GitDaemon::start(&env.join("srv"));
        let work = env.work_repo("work");
        env.git(
            "work",
            ["remote", "add", "origin", &daemon.url("origin.git")],
        );
        for name in ["ci", "evil"] {
            env.ssh_key(name);
        }
        let cx = Cx {
            target: work.join("restored/art"),
            work,
            env,
            daemon,
        };
        cx.pin("1", "");
        cx.content("v1");
        cx.commit("cache manifest");
        cx
    }

    pub fn key_file(&self, name: &str) -> PathBuf {
        self.env.join(format!("keys/{name}"))
    }

    pub fn src(&self) -> PathBuf {
        self.env.join("src")
    }

    /// The manifest of cache `art`, its key pin `literal`.
    pub fn pin(&self, literal: &str, publish: &str) {
        let dir = self.work.join("cache-manifests");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("art.toml"),
            format!(
                "[[key]]\nname = \"v\"\nliteral = \"{literal}\"\n\n[pack]\nroot = \"{}\"\n\n[publish]\nchunk_bytes = 20000\n{publish}\n[restore]\npath = \"restored/art\"\n",
                self.src().display()
            ),
        )
        .unwrap();
    }

    /// What `art` packs: a script, a link, an empty directory and ~90 kB
    /// of noise.
    pub fn content(&self, tag: &str) {
        let src = self.src();
        let _ = std::fs::remove_dir_all(&src);
        std::fs::create_dir_all(src.join("bin")).unwrap();
        std::fs::create_dir_all(src.join("share/empty")).unwrap();
        let tool = src.join("bin/tool");
        std::fs::write(&tool, format!("#!/bin/sh\necho {tag}\n")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink("bin/tool", src.join("tool")).unwrap();
        crate::util::tree::write_pseudo_random(&src.join("noise.bin"), 90_000, tag.len() as u64);
        std::fs::write(src.join("share/notes.txt"), format!("{tag}\n").repeat(500)).unwrap();
    }

    pub fn commit(&self, what: &str) {
        self.env.git("work", ["add", "-A"]);
        self.env
            .git("work", ["commit", "-q", "--allow-empty", "-m", what]);
    }

    /// Commits trust.toml with `policy` (none: removed) and allowed_signers
    /// listing `ci`.
    pub fn policy(&self, policy: Option<&str>) {
        let dir = self.work.join("cache-manifests");
        match policy {
            Some(p) => {
                std::fs::write(dir.join("trust.toml"), format!("policy = \"{p}\"\n")).unwrap()
            }
            None => drop(std::fs::remove_file(dir.join("trust.toml"))),
        }
        let public = std::fs::read_to_string(self.key_file("ci").with_extension("pub")).unwrap();
        std::fs::write(dir.join("allowed_signers"), format!("ci {public}")).unwrap();
        self.commit("trust root");
    }

    pub fn xtask(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        let mut cmd = self.env.xtask_in("work");
        cmd.args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        run(&mut cmd)
    }

    pub fn publish(&self, signer: Option<&str>) -> Run {
        let key = signer.map(|s| self.key_file(s));
        let mut args = vec!["cache", "publish", "art", "--json", "--allow-ungated"];
        if let Some(k) = &key {
            args.extend(["--signing-key", k.to_str().unwrap()]);
        }
        self.xtask(&args, &[])
    }

    pub fn restore(&self, env: &[(&str, &str)]) -> Run {
        self.xtask(&["cache", "restore", "art", "--json"], env)
    }

    /// Every file of the branch `art-cache` on origin.
    pub fn branch(&self) -> Files {
        let bare = self.env.join("srv/origin.git");
        let names = self.env.git(&bare, ["ls-tree", "--name-only", "art-cache"]);
        names
            .lines()
            .map(|n| {
                let out = Command::new("git")
                    .arg("-C")
                    .arg(&bare)
                    .args(["cat-file", "blob", &format!("art-cache:{n}")])
                    .output()
                    .unwrap();
                assert!(out.status.success(), "{}", show(&out));
                (n.to_string(), out.stdout)
            })
            .collect()
    }

    /// Pushes `files` as the branch's fresh root commit, with plain git.
    pub fn push(&self, files: &Files) {
        let dir = self.env.join("craft");
        let _ = std::fs::remove_dir_all(&dir);
        self.env.git(".", ["init", "-q", "-b", "x", "craft"]);
        for (name, bytes) in files {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
        self.env.git("craft", ["add", "-A"]);
        self.env.git("craft", ["commit", "-q", "-m", "crafted"]);
        let url = self.daemon.url("origin.git");
        self.env.git(
            "craft",
            ["push", "-q", "-f", &url, "HEAD:refs/heads/art-cache"],
        );
    }

    /// The installed files and stamp, to show that a refusal changed nothing.
    pub fn installed(&self) -> (BTreeMap<String, String>, Option<Vec<u8>>) {
        let stamp = std::fs::read(self.work.join(".git/warmstart/cache/stamps/art.json")).ok();
        let files = if self.target.exists() {
            crate::util::tree::snapshot(&self.target, crate::util::tree::Detail::EXTRACTED)
        } else {
            BTreeMap::new()
        };
        (files, stamp)
    }
}

/// Runs `program args` with `input` on stdin; its stdout (panics on failure).
pub fn pipe(program: &str, args: &[&str], input: &[u8]) -> Vec<u8> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{program} (tools/test.sh installs it): {e}"));
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success(), "{program} {args:?}: {}", show(&out));
    out.stdout
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    crate::trust::sha256_hex(bytes)
}

/// The uncompressed tar of `key` on a branch: its chunks in entry order,
/// decompressed by the zstd CLI, and checked against the entry's digest.
pub fn tar_of(files: &Files, key: &str) -> (Vec<u8>, Value) {
    let m: Value = serde_json::from_slice(&files["warmstart.json"]).unwrap();
    let entry = m["keys"][key].clone();
    let mut stream = Vec::new();
    for c in entry["chunks"].as_array().unwrap() {
        stream.extend_from_slice(&files[c["file"].as_str().unwrap()]);
    }
    let tar = pipe("zstd", &["-d", "-q", "-c"], &stream);
    assert_eq!(sha256_hex(&tar), entry["tar_sha256"].as_str().unwrap());
    (tar, entry)
}

/// How a crafted key's chunks are made.
pub enum Shape {
    /// Today's: one zstd stream (`zstd -3`), cut every `n` bytes.
    Stream(usize),
    /// The framed format's: the tar cut into `n` slices of about equal size, each
    /// compressed on its own (`zstd -3`, content checksum on), with raw
    /// sizes and digests and a `frames` record.
    Frames(usize),
}

/// `key`'s entry and chunk files for `tar` in `shape`, the entry's other
/// fields copied from `base` (a published entry) as today's format has
/// them: hand-written, so that no field of the new format slips in.
pub fn craft(env: &TestEnv, key: &str, tar: &[u8], base: &Value, shape: Shape) -> (Value, Files) {
    let (pieces, raws): (Vec<Vec<u8>>, Vec<Option<Vec<u8>>>) = match shape {
        Shape::Stream(n) => {
            let z = pipe("zstd", &["-3", "-q", "-c"], tar);
            (
                z.chunks(n).map(<[u8]>::to_vec).collect(),
                vec![None; z.len().div_ceil(n)],
            )
        }
        Shape::Frames(n) => {
            let cut = |i: usize| i * tar.len() / n;
            let slices: Vec<Vec<u8>> = (0..n).map(|i| tar[cut(i)..cut(i + 1)].to_vec()).collect();
            let z = compress_each(env, &slices);
            (z, slices.into_iter().map(Some).collect())
        }
    };
    let count = pieces.len();
    let mut files = Files::new();
    let mut chunks = Vec::new();
    for (i, (bytes, raw)) in pieces.into_iter().zip(raws).enumerate() {
        let file = warmstart::cache::format::chunk_name(key, i, count);
        let mut c = json!({"file": file, "size": bytes.len(), "sha256": sha256_hex(&bytes)});
        if let Some(raw) = raw {
            c["raw_size"] = raw.len().into();
            c["raw_sha256"] = sha256_hex(&raw).into();
        }
        chunks.push(c);
        files.insert(file, bytes);
    }
    let mut entry = json!({
        "archive": format!("{key}.tar.zst"),
        "compression": "zstd",
        "chunks": chunks,
        "tar_sha256": sha256_hex(tar),
        "tar_size": tar.len(),
        "files": base["files"],
        "key_parts": base["key_parts"],
        "source_commit": base["source_commit"],
        "source_tree": base["source_tree"],
        "gates": base["gates"],
        "ungated": base["ungated"],
        "created_at": base["created_at"],
        "tool_version": base["tool_version"],
    });
    if entry["chunks"][0].get("raw_size").is_some() {
        let avg = tar.len().div_ceil(count);
        entry["frames"] = json!({
            "chunker": "fastcdc-2020",
            "min_size": avg / 4,
            "avg_size": avg,
            "max_size": avg * 4,
            "zstd": zstd_version(),
            "level": 3,
            "checksum": true,
        });
    }
    (entry, files)
}

/// Each of `slices` compressed by one `zstd` process, as its own frame.
fn compress_each(env: &TestEnv, slices: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let dir = env.join("slices");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let names: Vec<String> = (0..slices.len()).map(|i| format!("s{i:06}")).collect();
    for (n, s) in names.iter().zip(slices) {
        std::fs::write(dir.join(n), s).unwrap();
    }
    let out = Command::new("zstd")
        .current_dir(&dir)
        .args(["-3", "-q", "-f", "--check", "--"])
        .args(&names)
        .output()
        .expect("zstd (tools/test.sh installs it)");
    assert!(out.status.success(), "{}", show(&out));
    names
        .iter()
        .map(|n| std::fs::read(dir.join(format!("{n}.zst"))).unwrap())
        .collect()
}

fn zstd_version() -> String {
    let out = Command::new("zstd").arg("-V").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let v = text
        .split_whitespace()
        .find(|w| w.starts_with('v'))
        .unwrap_or("v0");
    v.trim_start_matches('v').trim_end_matches(',').to_string()
}

/// A branch's files holding `entries` (key, entry, chunk files):
/// warmstart.json and SHA256SUMS as today's publisher writes them.
pub fn branch_of(entries: Vec<(&str, Value, Files)>) -> Files {
    let mut files = Files::new();
    let mut keys = serde_json::Map::new();
    let mut sums = Vec::new();
    for (key, entry, chunks) in entries {
        for c in entry["chunks"].as_array().unwrap() {
            sums.push((
                c["file"].as_str().unwrap().to_string(),
                c["sha256"].as_str().unwrap().to_string(),
            ));
        }
        keys.insert(key.to_string(), entry);
        files.extend(chunks);
    }
    sums.sort();
    let m = json!({"format": 1, "keys": keys});
    files.insert(
        "warmstart.json".into(),
        (serde_json::to_string_pretty(&m).unwrap() + "\n").into_bytes(),
    );
    let sums: String = sums.iter().map(|(f, s)| format!("{s}  {f}\n")).collect();
    files.insert("SHA256SUMS".into(), sums.into_bytes());
    files
}

/// The version 1 statement of `entry`, written from README "Trust" alone
/// (not by warmstart's code): the bytes every branch signed before issue
/// 18 holds.
pub fn v1_statement_by_hand(cache: &str, key: &str, e: &Value) -> String {
    let opt = |v: &Value| v.as_str().unwrap_or("-").to_string();
    let gates = if e["gates"].is_null() {
        "-".to_string()
    } else {
        sha256_hex(serde_json::to_string(&e["gates"]).unwrap().as_bytes())
    };
    let mut s = format!(
        "warmstart-statement 1\ncache {cache}\nkey {key}\ncreated_at {}\nsource_commit {}\nsource_tree {}\ngates_sha256 {gates}\nungated {}\ncompression {}\ntar_sha256 {}\ntar_size {}\nfiles {}\n",
        e["created_at"].as_str().unwrap(),
        opt(&e["source_commit"]),
        opt(&e["source_tree"]),
        e["ungated"],
        e["compression"].as_str().unwrap(),
        e["tar_sha256"].as_str().unwrap(),
        e["tar_size"],
        e["files"],
    );
    for c in e["chunks"].as_array().unwrap() {
        s.push_str(&format!(
            "{}  {}\n",
            c["sha256"].as_str().unwrap(),
            c["file"].as_str().unwrap()
        ));
    }
    s
}

/// The statement warmstart renders for `entry` (version 2 when it has a
/// new field).
pub fn statement_of(cache: &str, key: &str, e: &Value) -> String {
    let entry: warmstart::cache::format::KeyEntry = serde_json::from_value(e.clone()).unwrap();
    warmstart::trust::statement::Statement::from_entry(cache, key, &entry).render()
}

/// Signs `text` as `signer` with `ssh-keygen -Y sign -n warmstart-cache`
/// and adds it to `files` as `<key>.statement` and its `.sig`.
pub fn sign_into(cx: &Cx, files: &mut Files, key: &str, text: &str, signer: &str) {
    let f = cx.env.join(format!("sign-{key}.statement"));
    std::fs::write(&f, text).unwrap();
    let _ = std::fs::remove_file(f.with_extension("statement.sig"));
    let out = Command::new("ssh-keygen")
        .args(["-Y", "sign", "-n", "warmstart-cache", "-f"])
        .arg(cx.key_file(signer))
        .arg(&f)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", show(&out));
    let sig = std::fs::read(f.with_extension("statement.sig")).unwrap();
    files.insert(format!("{key}.statement"), text.as_bytes().to_vec());
    files.insert(format!("{key}.statement.sig"), sig);
}

fn json_of(r: &Run) -> Value {
    serde_json::from_str(&r.stdout()).unwrap_or_else(|e| panic!("{e}\n{}", show(&r.out)))
}

/// The published entry of `art-1` and its tar.
fn published(cx: &Cx) -> (Vec<u8>, Value) {
    cx.publish(None).ok();
    tar_of(&cx.branch(), "art-1")
}

/// (a) A branch in today's shape restores with this binary, unsigned with
/// no policy, and signed by a version 1 statement under `require`.
#[test]
fn todays_branch_shape_still_restores_unsigned_and_signed() {
    let cx = Cx::new();
    let (tar, base) = published(&cx);
    let (entry, chunks) = craft(&cx.env, "art-1", &tar, &base, Shape::Stream(16_384));
    assert!(chunks.len() >= 3, "several fixed-size cuts of one stream");
    let mut files = branch_of(vec![("art-1", entry.clone(), chunks)]);
    let m = String::from_utf8(files["warmstart.json"].clone()).unwrap();
    for new in ["frames", "raw_size", "raw_sha256", "index", ".files.zst"] {
        assert!(!m.contains(new), "today's shape has no {new}: {m}");
    }
    cx.push(&files);
    let r = json_of(&cx.restore(&[]).ok());
    assert_eq!(r["state"], "restored", "{r}");
    assert_same_tree(&cx.src(), &cx.target);

    sign_into(
        &cx,
        &mut files,
        "art-1",
        &v1_statement_by_hand("art", "art-1", &entry),
        "ci",
    );
    cx.push(&files);
    cx.policy(Some("require"));
    std::fs::remove_dir_all(&cx.target).unwrap();
    let r = json_of(&cx.restore(&[]).ok());
    assert_eq!(r["trust"]["key"]["verdict"], "trusted", "{r}");
    assert_same_tree(&cx.src(), &cx.target);
    // The statement this binary renders for today's entry is, byte for
    // byte, the one written by hand from the README.
    assert_eq!(
        statement_of("art", "art-1", &entry),
        v1_statement_by_hand("art", "art-1", &entry)
    );
}

/// The branch README's coreutils path, run by `sh` into `dest`.
pub fn coreutils_restore(cx: &Cx, key: &str, dest: &Path) -> std::process::Output {
    let dir = cx.env.join("plain");
    let _ = std::fs::remove_dir_all(&dir);
    cx.env.git(".", ["init", "-q", "plain"]);
    cx.env.git(
        "plain",
        ["remote", "add", "origin", &cx.daemon.url("origin.git")],
    );
    std::fs::create_dir_all(dest).unwrap();
    Command::new("sh")
        .current_dir(&dir)
        .arg("-c")
        .arg(format!(
            "git fetch -q origin art-cache && mkdir tmp && git archive FETCH_HEAD | tar -x -C tmp && (cd tmp && sha256sum --quiet -c SHA256SUMS) && cat tmp/{key}.tar.zst.part* | zstd -d -q | tar -x -C {}",
            dest.display()
        ))
        .output()
        .unwrap()
}

/// What an older binary relies on, for a branch of independent frames:
/// SHA256SUMS names exactly the chunks (no index, no statement), the
/// concatenation in name order is one zstd stream of the tar, and the
/// entry holds every field of today's format with today's types.
pub fn assert_readable_by_old_binaries(files: &Files, key: &str) {
    let m: Value = serde_json::from_slice(&files["warmstart.json"]).unwrap();
    assert_eq!(m["format"], 1);
    let e = &m["keys"][key];
    let mut chunk_files: Vec<String> = e["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["file"].as_str().unwrap().to_string())
        .collect();
    let in_order = chunk_files.clone();
    chunk_files.sort();
    assert_eq!(chunk_files, in_order, "chunk names sort in chunk order");
    let sums = String::from_utf8(files["SHA256SUMS"].clone()).unwrap();
    let listed: Vec<&str> = sums.lines().map(|l| &l[66..]).collect();
    let all: Vec<String> = m["keys"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|e| e["chunks"].as_array().unwrap().iter())
        .map(|c| c["file"].as_str().unwrap().to_string())
        .collect();
    let mut all_sorted = all.clone();
    all_sorted.sort();
    assert_eq!(listed, all_sorted, "SHA256SUMS lists exactly the chunks");
    let stream: Vec<u8> = in_order.iter().flat_map(|f| files[f].clone()).collect();
    let tar = pipe("zstd", &["-d", "-q", "-c"], &stream);
    assert_eq!(sha256_hex(&tar), e["tar_sha256"].as_str().unwrap());
    assert_eq!(tar.len() as u64, e["tar_size"].as_u64().unwrap());
    // Today's fields, with today's types; the new ones only add.
    let today = [
        ("archive", "s"),
        ("compression", "s"),
        ("chunks", "a"),
        ("tar_sha256", "s"),
        ("tar_size", "n"),
        ("files", "n"),
        ("key_parts", "a"),
        ("created_at", "s"),
        ("tool_version", "s"),
        ("ungated", "b"),
    ];
    for (field, kind) in today {
        let v = &e[field];
        let ok = match kind {
            "s" => v.is_string(),
            "a" => v.is_array(),
            "n" => v.is_u64(),
            _ => v.is_boolean(),
        };
        assert!(ok, "{field} is {v} in {e}");
    }
    let known: Vec<&str> = today
        .iter()
        .map(|(f, _)| *f)
        .chain([
            "source_commit",
            "source_tree",
            "gates",
            "frames",
            "index",
            "index_parts",
        ])
        .collect();
    for field in e.as_object().unwrap().keys() {
        assert!(known.contains(&field.as_str()), "unknown field {field}");
    }
    for c in e["chunks"].as_array().unwrap() {
        assert!(
            c["file"].is_string() && c["size"].is_u64() && c["sha256"].is_string(),
            "{c}"
        );
    }
}

/// (b) A key of independent frames, more than 1000 of them, restores
/// through the coreutils path, equal to the tree; an older binary's
/// assumptions hold for it. (This binary reads each chunk with its own `git
/// cat-file`, about 30 ms apiece on a busy machine, so it restores a key of
/// 24 frames here, and the 1013 only through coreutils.)
#[test]
fn a_framed_key_of_over_1000_chunks_restores_through_coreutils() {
    let cx = Cx::new();
    let (tar, base) = published(&cx);
    let (entry, chunks) = craft(&cx.env, "art-1", &tar, &base, Shape::Frames(1013));
    assert_eq!(chunks.len(), 1013);
    assert!(
        chunks.contains_key("art-1.tar.zst.part1012")
            && chunks.contains_key("art-1.tar.zst.part0999")
    );
    let files = branch_of(vec![("art-1", entry, chunks)]);
    assert_readable_by_old_binaries(&files, "art-1");
    cx.push(&files);
    let dest = cx.env.join("dest");
    let out = coreutils_restore(&cx, "art-1", &dest);
    assert!(out.status.success(), "{}", show(&out));
    assert_same_tree(&cx.src(), &dest);

    let (entry, chunks) = craft(&cx.env, "art-1", &tar, &base, Shape::Frames(24));
    cx.push(&branch_of(vec![("art-1", entry, chunks)]));
    let r = json_of(&cx.restore(&[]).ok());
    assert_eq!(r["state"], "restored", "{r}");
    assert_same_tree(&cx.src(), &cx.target);
}

/// A refusal of an unknown format: `code`, one line saying `needs`, and
/// the install exactly as it was.
fn refused_in_one_line(cx: &Cx, what: &str, code: i32, needs: &str) {
    let before = cx.installed();
    let r = cx.restore(&[]);
    assert_eq!(r.code(), code, "{what}\n{}", show(&r.out));
    let err = r.stderr();
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(lines.len(), 1, "{what}: one error line\n{err}");
    assert!(lines[0].contains(needs), "{what}: {lines:?}");
    assert_eq!(cx.installed(), before, "{what}: the install changed");
}

/// (c) Formats this binary does not know: warmstart.json format 2, an
/// unknown chunker, an unknown statement version (validly signed).
#[test]
fn a_format_this_binary_does_not_know_is_refused_in_one_line() {
    let cx = Cx::new();
    let (tar, base) = published(&cx);
    cx.restore(&[]).ok();
    cx.pin("2", "");
    cx.commit("pin 2");
    let (entry, chunks) = craft(&cx.env, "art-2", &tar, &base, Shape::Frames(4));

    let mut files = branch_of(vec![("art-2", entry.clone(), chunks.clone())]);
    let m = String::from_utf8(files["warmstart.json"].clone()).unwrap();
    files.insert(
        "warmstart.json".into(),
        m.replacen("\"format\": 1", "\"format\": 2", 1).into_bytes(),
    );
    cx.push(&files);
    refused_in_one_line(
        &cx,
        "format 2",
        6,
        "upgrade to a warmstart that reads format 2",
    );

    let mut odd = entry.clone();
    odd["frames"]["chunker"] = "rabin-64".into();
    cx.push(&branch_of(vec![("art-2", odd, chunks.clone())]));
    refused_in_one_line(
        &cx,
        "chunker",
        6,
        "upgrade to a warmstart that reads chunker \"rabin-64\"",
    );

    cx.policy(Some("require"));
    let mut files = branch_of(vec![("art-2", entry.clone(), chunks)]);
    let text = statement_of("art", "art-2", &entry).replacen(
        "warmstart-statement 2",
        "warmstart-statement 3",
        1,
    );
    sign_into(&cx, &mut files, "art-2", &text, "ci");
    cx.push(&files);
    refused_in_one_line(
        &cx,
        "statement version",
        12,
        "upgrade to a warmstart that reads statement version 3",
    );
}

/// (b) A branch this binary publishes, signed: its statement is version 2
/// when the entry has a new field, the coreutils path restores it (with
/// the statement's own chunk lines checked, as README "Trust" shows), and
/// what an older binary relies on holds.
#[test]
fn a_published_branch_restores_through_coreutils_and_keeps_what_old_binaries_rely_on() {
    let cx = Cx::new();
    cx.policy(Some("require"));
    cx.publish(Some("ci")).ok();
    let files = cx.branch();
    assert_readable_by_old_binaries(&files, "art-1");
    let m: Value = serde_json::from_slice(&files["warmstart.json"]).unwrap();
    let e = &m["keys"]["art-1"];
    let statement = String::from_utf8(files["art-1.statement"].clone()).unwrap();
    let new_fields = e.get("frames").is_some() || e.get("index").is_some();
    let magic = if new_fields {
        "warmstart-statement 2\n"
    } else {
        "warmstart-statement 1\n"
    };
    assert!(statement.starts_with(magic), "{statement}\n{e}");
    if let Some(index) = e.get("index") {
        // The statement binds the whole index; the branch holds its parts.
        let name = index["file"].as_str().unwrap();
        for p in e["index_parts"].as_array().unwrap() {
            let part = p["file"].as_str().unwrap();
            assert!(files.contains_key(part), "the part {part} is on the branch");
        }
        assert!(statement.contains(&format!(" {name}\n")), "{statement}");
    }
    let dest = cx.env.join("dest");
    let out = coreutils_restore(&cx, "art-1", &dest);
    assert!(out.status.success(), "{}", show(&out));
    assert_same_tree(&cx.src(), &dest);
    // The statement's chunk lines, grepped as the README does, are exactly
    // the chunks, and sha256sum -c accepts them.
    let lines: Vec<&str> = statement
        .lines()
        .filter(|l| {
            l.len() > 66
                && l.as_bytes()[..64].iter().all(|b| b.is_ascii_hexdigit())
                && &l[64..66] == "  "
        })
        .collect();
    assert_eq!(
        lines.len(),
        e["chunks"].as_array().unwrap().len(),
        "{statement}"
    );
    let tmp = cx.env.join("plain/tmp");
    let out = Command::new("sh")
        .current_dir(&tmp)
        .arg("-c")
        .arg("grep -E '^[0-9a-f]{64}  ' art-1.statement | sha256sum --quiet -c")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", show(&out));
    let r = json_of(&cx.restore(&[]).ok());
    assert_eq!(r["trust"]["key"]["verdict"], "trusted", "{r}");
    assert_same_tree(&cx.src(), &cx.target);
}

/// (c) A per-file index of a version this binary does not read never stops
/// a restore: the index only lets a delta install skip work, and the tar it
/// describes is format 1, so the key is installed in full, equal to the
/// tree. Where the delta install reads the index, `delta_fallback` names
/// the version it needs.
#[test]
fn an_unknown_files_index_version_costs_the_delta_never_the_restore() {
    let cx = Cx::new();
    cx.publish(None).ok();
    cx.restore(&[]).ok();
    cx.pin("2", "");
    cx.content("v2");
    cx.commit("pin 2");
    cx.publish(None).ok();
    let mut files = cx.branch();
    let m: Value = serde_json::from_slice(&files["warmstart.json"]).unwrap();
    let parts: Vec<String> = m["keys"]["art-2"]["index_parts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["file"].as_str().unwrap().to_string())
        .collect();
    let whole: Vec<u8> = parts.iter().flat_map(|p| files[p].clone()).collect();
    let text = pipe("zstd", &["-d", "-q", "-c"], &whole);
    let text =
        String::from_utf8(text)
            .unwrap()
            .replacen("warmstart-files 1\n", "warmstart-files 2\n", 1);
    assert!(text.starts_with("warmstart-files 2\n"));
    let index = pipe("zstd", &["-q", "-c"], text.as_bytes());
    let mut m = m;
    m["keys"]["art-2"]["index"]["size"] = index.len().into();
    m["keys"]["art-2"]["index"]["sha256"] = sha256_hex(&index).into();
    m["keys"]["art-2"]["index_parts"] = json!([{
        "file": parts[0], "size": index.len(), "sha256": sha256_hex(&index)
    }]);
    for p in &parts {
        files.remove(p);
    }
    files.insert(parts[0].clone(), index);
    files.insert(
        "warmstart.json".into(),
        (serde_json::to_string_pretty(&m).unwrap() + "\n").into_bytes(),
    );
    cx.push(&files);
    let r = json_of(&cx.restore(&[]).ok());
    assert_eq!(r["state"], "restored", "{r}");
    assert_eq!(r["key"], "art-2", "{r}");
    assert_same_tree(&cx.src(), &cx.target);
    if let Some(why) = r.get("delta_fallback").and_then(Value::as_str) {
        assert!(
            why.contains("upgrade to a warmstart that reads file index version 2"),
            "{r}"
        );
    }
}

/// (b) A key this binary publishes in more than 1000 content-defined
/// chunks (`chunk_avg = "256"`), signed: the chunk numbers widen to four
/// digits, `cat <key>.tar.zst.part*` in shell order is the zstd stream, and
/// the coreutils path gives the tree; the statement's chunk lines, as the
/// README greps them, all check.
#[test]
fn a_published_key_of_over_1000_chunks_restores_through_coreutils() {
    let cx = Cx::new();
    cx.pin("1", "chunk_avg = \"256\"\n");
    crate::util::tree::write_pseudo_random(&cx.src().join("big.bin"), 400_000, 99);
    cx.policy(Some("require"));
    cx.publish(Some("ci")).ok();
    let files = cx.branch();
    let m: Value = serde_json::from_slice(&files["warmstart.json"]).unwrap();
    let e = &m["keys"]["art-1"];
    let n = e["chunks"].as_array().unwrap().len();
    assert!(n > 1000, "{n} chunks");
    assert_eq!(e["frames"]["avg_size"], 256, "{}", e["frames"]);
    assert_eq!(e["chunks"][0]["file"], "art-1.tar.zst.part0000");
    assert_readable_by_old_binaries(&files, "art-1");
    let dest = cx.env.join("dest");
    let out = coreutils_restore(&cx, "art-1", &dest);
    assert!(out.status.success(), "{}", show(&out));
    assert_same_tree(&cx.src(), &dest);
    let out = Command::new("sh")
        .current_dir(cx.env.join("plain/tmp"))
        .arg("-c")
        .arg("grep -E '^[0-9a-f]{64}  ' art-1.statement | sha256sum --quiet -c && grep -cE '^[0-9a-f]{64}  ' art-1.statement && grep -c '^raw ' art-1.statement")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", show(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{n}\n{n}\n"));
}
