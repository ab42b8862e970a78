//! Containment: two archives that each pass every check must not
//! together write outside the target, whatever the target already holds.
//!
//! One regression test per escape found, each named after the bug, each
//! run through the real binary twice: with `openat2` and with the fallback
//! walk (`WARMSTART_TEST_FORCE_WALK=1`). The scene is `s2/s1/prefix`, with
//! bait in the two sentinel directories above the prefix; an escape lands
//! there. Archives are written by independent tools: Python's tarfile for
//! packages and `cache_restore/make_branch.py` for cache branches.

use crate::util::http::{HttpServer, reply};
use crate::util::tree::{Detail, snapshot};
use crate::util::{Run, TestEnv, run, show};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const MAKE_BRANCH: &str = include_str!("cache_restore/make_branch.py");

/// The resolver switch values: `openat2` (unset), then the walk.
const RESOLVERS: [Option<&str>; 2] = [None, Some("1")];

/// Writes a `.tar.bz2` conda package with Python's tarfile: `python3 - OUT
/// SPEC`, SPEC a JSON list of `{"name", "type": file|dir|symlink, "data",
/// "link"}`, after an `info/index.json`.
const PACKAGE: &str = r#"
import io, json, sys, tarfile
out, spec = sys.argv[1], json.loads(sys.argv[2])
def add(t, e):
    i = tarfile.TarInfo(e["name"]); i.mtime = 946684800
    kind = e.get("type", "file")
    data = None
    if kind == "file":
        data = e.get("data", "x").encode(); i.size = len(data); i.mode = 0o644
    elif kind == "dir":
        i.type = tarfile.DIRTYPE; i.mode = 0o755
    else:
        i.type = tarfile.SYMTYPE; i.linkname = e["link"]
    t.addfile(i, io.BytesIO(data) if data is not None else None)
with tarfile.open(out, "w:bz2", format=tarfile.PAX_FORMAT) as t:
    add(t, {"name": "info/index.json", "data": json.dumps({"name": "p", "version": "1", "build": "0"})})
    for e in spec:
        add(t, e)
"#;

/// `s2/s1/prefix` with bait one and two levels above the prefix.
struct Scene {
    s2: PathBuf,
    s1: PathBuf,
    prefix: PathBuf,
}

fn scene(env: &TestEnv) -> Scene {
    let s2 = env.join("s2");
    let s1 = s2.join("s1");
    let prefix = s1.join("prefix");
    fs::create_dir_all(&prefix).unwrap();
    fs::create_dir_all(s1.join("outside")).unwrap();
    fs::write(s2.join("bait"), "two levels up\n").unwrap();
    fs::write(s1.join("bait"), "one level up\n").unwrap();
    Scene { s2, s1, prefix }
}

impl Scene {
    /// Everything under `s2` but the prefix: kind, mode, mtime, content.
    fn outside(&self) -> BTreeMap<String, String> {
        let mut all = snapshot(&self.s2, Detail::UNTOUCHED);
        all.retain(|k, _| k != "s1/prefix" && !k.starts_with("s1/prefix/"));
        all
    }

    fn inside(&self) -> BTreeMap<String, String> {
        snapshot(&self.prefix, Detail::UNTOUCHED)
    }
}

fn package(env: &TestEnv, name: &str, spec: Value) -> PathBuf {
    let out = env.join(format!("{name}-1-0.tar.bz2"));
    let o = Command::new("python3")
        .arg("-c")
        .arg(PACKAGE)
        .arg(&out)
        .arg(spec.to_string())
        .output()
        .expect("python3 is needed (tools/test.sh installs it)");
    assert!(o.status.success(), "building {name}: {}", show(&o));
    out
}

/// The first archive of every two-archive escape: `x/l -> ..`, a link to
/// the prefix root (lexically and really inside).
fn link_to_root() -> Value {
    json!([{"name": "x", "type": "dir"}, {"name": "x/l", "type": "symlink", "link": ".."}])
}

/// The second: through `x/l/` (really the root), `x/l/zz -> ../..` lands
/// as `zz` in the root, two levels above which `zz/file` would be written.
fn through_the_link() -> Value {
    json!([
        {"name": "x", "type": "dir"},
        {"name": "x/l", "type": "dir"},
        {"name": "x/l/zz", "type": "symlink", "link": "../.."},
        {"name": "zz", "type": "dir"},
        {"name": "zz/file", "data": "escaped\n"}
    ])
}

fn with_resolver<'a>(cmd: &'a mut Command, walk: Option<&str>) -> &'a mut Command {
    match walk {
        Some(v) => cmd.env("WARMSTART_TEST_FORCE_WALK", v),
        None => cmd.env_remove("WARMSTART_TEST_FORCE_WALK"),
    }
}

fn conda_unpack(
    env: &TestEnv,
    pkg: &Path,
    prefix: &Path,
    extra: &[&str],
    walk: Option<&str>,
) -> Run {
    let mut cmd = env.xtask();
    cmd.args(["conda", "unpack"])
        .arg(pkg)
        .arg("--into")
        .arg(prefix)
        .args(extra);
    run(with_resolver(&mut cmd, walk))
}

/// The refusal: exit 7, one line naming `needle`; nothing outside changed,
/// the prefix as it was, nothing left beside it.
fn assert_contained(
    r: Run,
    s: &Scene,
    before: &BTreeMap<String, String>,
    outside: &BTreeMap<String, String>,
    needle: &str,
) {
    let r = r.expect_code(7);
    assert!(
        r.stderr().contains(needle),
        "expected `{needle}` in: {}",
        r.stderr()
    );
    assert_eq!(
        r.stderr().lines().count(),
        1,
        "one-line error: {}",
        r.stderr()
    );
    assert_eq!(
        &s.outside(),
        outside,
        "something was written outside the prefix"
    );
    assert_eq!(&s.inside(), before, "a refused install changed the prefix");
    assert!(!s.s2.join("file").exists() && !s.s1.join("file").exists());
}

#[test]
fn conda_unpack_two_tar_bz2_packages_escape_the_prefix_through_the_first_ones_symlink() {
    for walk in RESOLVERS {
        let env = TestEnv::new();
        let s = scene(&env);
        let first = package(&env, "first", link_to_root());
        let second = package(&env, "second", through_the_link());
        conda_unpack(&env, &first, &s.prefix, &[], walk).ok();
        assert_eq!(
            fs::read_link(s.prefix.join("x/l")).unwrap(),
            Path::new("..")
        );
        let (before, outside) = (s.inside(), s.outside());
        let r = conda_unpack(&env, &second, &s.prefix, &[], walk);
        assert_contained(
            r,
            &s,
            &before,
            &outside,
            "refusing symlink `x/l/zz` -> `../..`",
        );
    }
}

#[test]
fn allow_external_symlinks_link_is_written_through_by_the_next_package() {
    for walk in RESOLVERS {
        let env = TestEnv::new();
        let s = scene(&env);
        let outside_dir = s.s1.join("outside");
        let first = package(
            &env,
            "first",
            json!([{"name": "lib", "type": "symlink", "link": outside_dir.to_str().unwrap()}]),
        );
        let second = package(
            &env,
            "second",
            json!([{"name": "lib/x", "data": "through\n"}]),
        );
        conda_unpack(
            &env,
            &first,
            &s.prefix,
            &["--allow-external-symlinks"],
            walk,
        )
        .ok();
        let (before, outside) = (s.inside(), s.outside());
        // Refused with or without the flag: the flag allows making such a
        // link, never writing through one.
        for extra in [&[][..], &["--allow-external-symlinks"][..]] {
            let r = conda_unpack(&env, &second, &s.prefix, extra, walk);
            assert_contained(r, &s, &before, &outside, "which leads outside");
            assert!(!outside_dir.join("x").exists());
        }
        // A package's directory meeting a link the user made to outside is
        // refused the same way, naming both paths.
        fs::remove_file(s.prefix.join("lib")).unwrap();
        std::os::unix::fs::symlink(&outside_dir, s.prefix.join("lib")).unwrap();
        let before = s.inside();
        let r = conda_unpack(&env, &second, &s.prefix, &[], walk);
        assert_contained(
            r,
            &s,
            &before,
            &outside,
            &format!(
                "the package has a directory `lib/` but {} is a symlink to `{}`",
                s.prefix.join("lib").display(),
                outside_dir.display()
            ),
        );
    }
}

#[test]
fn symlinked_directories_inside_the_prefix_are_written_through() {
    // lib64 -> lib, as real prefixes have: a package's lib64/ lands in lib/.
    for walk in RESOLVERS {
        let env = TestEnv::new();
        let s = scene(&env);
        fs::create_dir(s.prefix.join("lib")).unwrap();
        std::os::unix::fs::symlink("lib", s.prefix.join("lib64")).unwrap();
        let pkg = package(
            &env,
            "p",
            json!([{"name": "lib64/libz.so.1", "data": "z"}, {"name": "lib64/libz.so", "type": "symlink", "link": "libz.so.1"}]),
        );
        conda_unpack(&env, &pkg, &s.prefix, &[], walk).ok();
        assert_eq!(
            fs::read_to_string(s.prefix.join("lib/libz.so.1")).unwrap(),
            "z"
        );
        assert_eq!(
            fs::read_to_string(s.prefix.join("lib64/libz.so")).unwrap(),
            "z"
        );
        assert!(
            fs::symlink_metadata(s.prefix.join("lib64"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        // Two paths of one package landing on one file is refused.
        let twice = package(
            &env,
            "twice",
            json!([{"name": "lib/libq.so", "data": "a"}, {"name": "lib64/libq.so", "data": "b"}]),
        );
        let (before, outside) = (s.inside(), s.outside());
        let r = conda_unpack(&env, &twice, &s.prefix, &[], walk);
        assert_contained(
            r,
            &s,
            &before,
            &outside,
            "`lib/libq.so` and `lib64/libq.so` land on the same path",
        );
        // Also below a directory the package creates there by both names.
        let twice_new = package(
            &env,
            "twice-new",
            json!([{"name": "lib/new/q", "data": "a"}, {"name": "lib64/new/q", "data": "b"}]),
        );
        let r = conda_unpack(&env, &twice_new, &s.prefix, &[], walk);
        assert_contained(
            r,
            &s,
            &before,
            &outside,
            "`lib/new/q` and `lib64/new/q` land on the same path",
        );
    }
}

/// A work repository whose `tc` cache (mode merge) restores into `prefix`,
/// and a bare origin holding `keys` (make_branch.py entries per key).
fn merge_cache(env: &TestEnv, prefix: &Path, keys: Value) -> PathBuf {
    let remote = env.bare_remote("origin.git");
    let work = env.work_repo("work");
    env.git(
        "work",
        ["remote", "add", "origin", remote.to_str().unwrap()],
    );
    fs::create_dir_all(work.join("cache-manifests")).unwrap();
    fs::write(
        work.join("cache-manifests/tc.toml"),
        format!(
            "[cache]\nbranch = \"tc-cache\"\ndescription = \"test cache\"\n\n[[key]]\nname = \"v\"\nregex = {{ file = \"pin.txt\", pattern = 'v=(\\S+)' }}\n\n[pack]\nroot = \"src\"\n\n[restore]\npath = \"{}\"\nmode = \"merge\"\n",
            prefix.display()
        ),
    )
    .unwrap();
    fs::write(env.join("make_branch.py"), MAKE_BRANCH).unwrap();
    fs::write(env.join("spec.json"), json!({ "keys": keys }).to_string()).unwrap();
    let files = env.join("branch");
    let r = run(Command::new("python3")
        .arg(env.join("make_branch.py"))
        .arg(&files)
        .arg(env.join("spec.json")));
    assert_eq!(r.code(), 0, "make_branch.py: {}", show(&r.out));
    let git_dir = env.join("pusher.git");
    env.git(".", ["init", "-q", "--bare", git_dir.to_str().unwrap()]);
    let g = |args: &[&str]| {
        let mut all = vec![
            format!("--git-dir={}", git_dir.display()),
            format!("--work-tree={}", files.display()),
        ];
        all.extend(args.iter().map(|s| s.to_string()));
        env.git(".", all).trim().to_string()
    };
    g(&["add", "-A", "."]);
    let tree = g(&["write-tree"]);
    let commit = g(&["commit-tree", &tree, "-m", "hostile cache"]);
    g(&[
        "push",
        "-q",
        "-f",
        remote.to_str().unwrap(),
        &format!("{commit}:refs/heads/tc-cache"),
    ]);
    work
}

fn cache_restore(env: &TestEnv, work: &Path, pin: &str, walk: Option<&str>) -> Run {
    fs::write(work.join("pin.txt"), format!("v={pin}\n")).unwrap();
    let mut cmd = env.xtask_in("work");
    cmd.args(["cache", "restore", "tc"]);
    run(with_resolver(&mut cmd, walk))
}

#[test]
fn cache_restore_merge_mode_two_keys_escape_the_prefix_through_the_first_keys_symlink() {
    for walk in RESOLVERS {
        let env = TestEnv::new();
        let s = scene(&env);
        let key = |entries: Value, v: &str| json!({ "entries": entries, "parts": [{ "name": "v", "value": v }] });
        let work = merge_cache(
            &env,
            &s.prefix,
            json!({ "tc-1": key(link_to_root(), "1"), "tc-2": key(through_the_link(), "2") }),
        );
        cache_restore(&env, &work, "1", walk).ok();
        assert_eq!(
            fs::read_link(s.prefix.join("x/l")).unwrap(),
            Path::new("..")
        );
        let (before, outside) = (s.inside(), s.outside());
        let r = cache_restore(&env, &work, "2", walk);
        assert_contained(
            r,
            &s,
            &before,
            &outside,
            "refusing symlink `x/l/zz` -> `../..`",
        );
        // Each key alone installs fine: the refusal is about the pair.
        fs::remove_dir_all(&s.prefix).unwrap();
        fs::create_dir(&s.prefix).unwrap();
        cache_restore(&env, &work, "2", walk).ok();
        assert_eq!(
            fs::read_to_string(s.prefix.join("zz/file")).unwrap(),
            "escaped\n"
        );
        assert_eq!(&s.outside(), &outside);
    }
}

/// The loopback HTTP server serving `files` by path (404 for any other).
fn serve(files: BTreeMap<String, Vec<u8>>) -> HttpServer {
    HttpServer::start(move |req, conn| match files.get(req.path()) {
        Some(body) => reply(conn, 200, body),
        None => reply(conn, 404, b""),
    })
}

#[test]
fn download_steps_with_unpack_into_escape_the_prefix_through_an_earlier_package() {
    for walk in RESOLVERS {
        let env = TestEnv::new();
        let s = scene(&env);
        env.work_repo("r");
        let first = fs::read(package(&env, "first", link_to_root())).unwrap();
        let second = fs::read(package(&env, "second", through_the_link())).unwrap();
        let sha = |b: &[u8]| {
            use sha2::{Digest, Sha256};
            Sha256::digest(b)
                .iter()
                .map(|x| format!("{x:02x}"))
                .collect::<String>()
        };
        let server = serve(BTreeMap::from([
            ("first.tar.bz2".to_string(), first.clone()),
            ("second.tar.bz2".to_string(), second.clone()),
        ]));
        let port = server.port;
        let step = |name: &str, bytes: &[u8]| {
            format!(
                "[[step]]\nname = \"{name}\"\nkind = \"download\"\nurl = \"http://127.0.0.1:{port}/{name}.tar.bz2\"\nsha256 = \"{}\"\ndest = \"dl/{name}.tar.bz2\"\nunpack_into = \"{}\"\n",
                sha(bytes),
                s.prefix.display()
            )
        };
        fs::create_dir_all(env.join("r/cache-manifests")).unwrap();
        fs::write(
            env.join("r/cache-manifests/restore.toml"),
            format!("{}\n{}", step("first", &first), step("second", &second)),
        )
        .unwrap();
        let outside = s.outside();
        let mut cmd = env.xtask_in("r");
        cmd.args(["restore", "--json"]);
        for v in [
            "https_proxy",
            "HTTPS_PROXY",
            "http_proxy",
            "HTTP_PROXY",
            "ALL_PROXY",
            "all_proxy",
        ] {
            cmd.env_remove(v);
        }
        let r = run(with_resolver(&mut cmd, walk)).ok();
        let v: Value =
            serde_json::from_str(&r.stdout()).unwrap_or_else(|e| panic!("{e}: {}", show(&r.out)));
        let row = |name: &str| {
            v["steps"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["step"] == name)
                .cloned()
                .unwrap()
        };
        assert_eq!(row("first")["state"], "done", "{v:#}");
        assert_eq!(row("second")["state"], "failed-open", "{v:#}");
        let what = row("second")["what"].as_str().unwrap().to_string();
        assert!(
            what.contains("refusing symlink `x/l/zz` -> `../..`"),
            "{what}"
        );
        assert_eq!(
            s.outside(),
            outside,
            "something was written outside the prefix"
        );
        assert!(!s.s2.join("file").exists());
        assert!(
            !env.join("r/dl/second.tar.bz2").exists(),
            "a refused package is not installed"
        );
    }
}

#[test]
fn a_force_walk_setting_that_is_not_understood_is_an_error_not_a_default() {
    let env = TestEnv::new();
    let s = scene(&env);
    let pkg = package(&env, "p", json!([{"name": "bin/tool", "data": "t"}]));
    let outside = s.outside();
    let r = conda_unpack(&env, &pkg, &s.prefix, &[], Some("yes")).expect_code(10);
    assert!(
        r.stderr()
            .contains("WARMSTART_TEST_FORCE_WALK=\"yes\" is not understood"),
        "{}",
        r.stderr()
    );
    assert!(s.inside().is_empty(), "nothing installed");
    assert_eq!(s.outside(), outside, "no staging left beside the prefix");
}
