//! `cargo xtask conda`: packages made by independent tools (conda-package-
//! handling's committed fixtures; `tar`, `zstd` and `zip -0` inside the
//! tests; the zip crate's writer as rattler uses it) unpack to what `cph
//! extract` produces; hostile packages are refused naming the entry, with
//! nothing written outside and the prefix intact; killed runs are completed.

use crate::unpack::hostile;
use crate::util::tree::{Detail, snapshot};
use crate::util::{Run, TestEnv, run, show, source_root};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The placeholder compiled into the committed fixture (make_fixtures.py).
fn fixture_placeholder() -> String {
    format!("/opt/wsbuild/_h_env_{}pl", "placehold_".repeat(23))
}
const LEGACY_PLACEHOLDER: &str = "/opt/anaconda1anaconda2anaconda3";

fn fixture(name: &str) -> PathBuf {
    source_root().join("tests/fixtures/conda").join(name)
}

fn sh(script: &str) {
    let o = Command::new("sh").arg("-ec").arg(script).output().unwrap();
    assert!(o.status.success(), "{script}\n{}", show(&o));
}

/// `cph extract` (conda-package-handling, installed by tools/test.sh).
fn cph_extract(pkg: &Path, dest: &Path) {
    let o = Command::new("cph")
        .arg("extract")
        .arg(pkg)
        .arg("--dest")
        .arg(dest)
        .output()
        .expect("cph is needed: tools/test.sh pip-installs tools/test-requirements.txt");
    assert!(o.status.success(), "cph extract: {}", show(&o));
}

/// conda's own placeholder rewrite, in Python (conda/core/portability.py's
/// `binary_replace` and text replace), applied to a file.
fn conda_rewrite(mode: &str, placeholder: &str, prefix: &str, file: &Path) {
    let script = r#"
import re, sys
mode, a, b, path = sys.argv[1], sys.argv[2].encode(), sys.argv[3].encode(), sys.argv[4]
data = open(path, "rb").read()
if mode == "text":
    res = data.replace(a, b)
else:
    def replace(match):
        occurrences = match.group().count(a)
        padding = (len(a) - len(b)) * occurrences
        assert padding >= 0
        return match.group().replace(a, b) + b"\0" * padding
    res = re.compile(re.escape(a) + b"([^\0]*?)\0").sub(replace, data)
    assert len(res) == len(data)
open(path, "wb").write(res)
"#;
    let o = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args([mode, placeholder, prefix])
        .arg(file)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", show(&o));
}

/// Unpacks `pkg` into `prefix` with our tool and checks the tree equals
/// `cph extract` of the same package, after applying conda's own rewrite to
/// cph's copies of the placeholder files. Where ours differs on purpose:
/// - `info/` is not installed into the prefix (conda keeps it outside the
///   prefix too), and placeholders are rewritten (cph extract does not);
/// - safer: setuid, setgid and sticky bits are dropped, and a symlink
///   target with `..` after a name (`a/../b`) is refused; these packages
///   have neither, so the trees must match exactly. Everything else that is
///   safer shows on hostile input, in the refusal tests below.
fn assert_matches_cph(env: &TestEnv, pkg: &Path, placeholders: &[(&str, &str, &str)]) {
    let prefix = env.join("prefix");
    let theirs = env.join("cph-out");
    let _ = fs::remove_dir_all(&prefix);
    let _ = fs::remove_dir_all(&theirs);
    cph_extract(pkg, &theirs);
    let out = run(env
        .xtask()
        .args(["conda", "unpack"])
        .arg(pkg)
        .arg("--into")
        .arg(&prefix))
    .ok();
    assert!(out.stdout().contains("unpacked"), "{}", show(&out.out));
    fs::remove_dir_all(theirs.join("info")).unwrap();
    let prefix_str = prefix.to_str().unwrap();
    for (path, mode, placeholder) in placeholders {
        conda_rewrite(mode, placeholder, prefix_str, &theirs.join(path));
    }
    let ours = snapshot(
        &prefix,
        Detail {
            dir_mtimes: false,
            ..Detail::EXTRACTED
        },
    );
    let expected = snapshot(
        &theirs,
        Detail {
            dir_mtimes: false,
            ..Detail::EXTRACTED
        },
    );
    // Python's rewrite gives cph's copies a new mtime; ours keep the
    // package's. Compare those files without their mtime.
    let strip = |m: BTreeMap<String, String>| -> BTreeMap<String, String> {
        m.into_iter()
            .map(|(k, v)| {
                if !placeholders.iter().any(|(p, _, _)| *p == k) {
                    return (k, v);
                }
                let words: Vec<&str> = v.split(' ').collect();
                let keep: Vec<&str> = match words.iter().position(|w| *w == "mtime") {
                    Some(i) => words[..i].iter().chain(&words[i + 2..]).copied().collect(),
                    None => words,
                };
                (k, keep.join(" "))
            })
            .collect()
    };
    assert_eq!(
        strip(ours),
        strip(expected),
        "our prefix differs from cph extract"
    );
    assert_no_strays(&prefix);
}

/// Nothing but the prefix beside it: no staging directory, journal or lock.
fn assert_no_strays(prefix: &Path) {
    let parent = prefix.parent().unwrap();
    let name = prefix.file_name().unwrap().to_string_lossy().into_owned();
    let strays: Vec<_> = fs::read_dir(parent)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&format!(".{name}.")))
        .collect();
    assert!(strays.is_empty(), "left beside the prefix: {strays:?}");
    let mut stack = vec![prefix.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let n = p.file_name().unwrap().to_string_lossy().into_owned();
            assert!(
                !n.contains(".warmstart-"),
                "stray temporary file {}",
                p.display()
            );
            if p.is_dir() && !p.is_symlink() {
                stack.push(p);
            }
        }
    }
}

#[test]
fn conda_unpack_matches_cph_extract_for_the_cph_made_fixture() {
    let env = TestEnv::new();
    let ph = fixture_placeholder();
    // cph writes its two tarball members with zip64 extra fields
    // (force_zip64=True); metadata.json without.
    assert_eq!(zip64_members(&fixture("wsfixture-1.2.3-h0_0.conda")), 2);
    assert_matches_cph(
        &env,
        &fixture("wsfixture-1.2.3-h0_0.conda"),
        &[
            ("bin/wsfixture-tool", "text", &ph),
            ("etc/wsfixture.conf", "text", &ph),
            ("lib/libwsfixture.so.1.0", "binary", &ph),
        ],
    );
    let prefix = env.join("prefix");
    let tool = fs::read_to_string(prefix.join("bin/wsfixture-tool")).unwrap();
    assert!(
        tool.contains(&format!("installed in {}\n", prefix.display())),
        "{tool}"
    );
    // The binary keeps its length and its NUL-terminated strings.
    let lib = fs::read(prefix.join("lib/libwsfixture.so.1.0")).unwrap();
    let want = format!("{}/lib/plugins\0", prefix.display());
    assert!(lib.windows(want.len()).any(|w| w == want.as_bytes()));
}

#[test]
fn conda_unpack_matches_cph_extract_for_legacy_tar_bz2() {
    let env = TestEnv::new();
    assert_matches_cph(
        &env,
        &fixture("wslegacy-0.1-0.tar.bz2"),
        &[("bin/wslegacy", "text", LEGACY_PLACEHOLDER)],
    );
}

#[test]
fn conda_info_reports_name_members_and_placeholders() {
    let env = TestEnv::new();
    let pkg = fixture("wsfixture-1.2.3-h0_0.conda");
    let text = run(env.xtask().args(["conda", "info"]).arg(&pkg))
        .ok()
        .stdout();
    for want in [
        "name      wsfixture",
        "version   1.2.3",
        "build     h0_0 (number 0), linux-64",
        "pkg-wsfixture-1.2.3-h0_0.tar.zst",
        "info-wsfixture-1.2.3-h0_0.tar.zst",
        "prefix placeholders (3 files, from info/paths.json)",
        "placeholder /opt/wsbuild/_h_env_placehold_",
        "(252 bytes)",
        "binary  lib/libwsfixture.so.1.0",
        "text    bin/wsfixture-tool",
    ] {
        assert!(text.contains(want), "missing `{want}` in:\n{text}");
    }
    let json = run(env.xtask().args(["conda", "info", "--json"]).arg(&pkg))
        .ok()
        .stdout();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["name"], "wsfixture");
    assert_eq!(v["format"], "conda");
    assert_eq!(v["paths"], 8);
    // Member sizes and offsets as Python's zipfile (independent) reads them.
    let o = Command::new("python3")
        .arg("-c")
        .arg("import sys, zipfile\nfor i in zipfile.ZipFile(sys.argv[1]).infolist(): print(i.filename, i.file_size, i.compress_type)")
        .arg(&pkg)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", show(&o));
    let members = v["members"].as_array().unwrap();
    let listed: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(members.len(), listed.len());
    for (m, line) in members.iter().zip(&listed) {
        assert_eq!(
            format!("{} {} 0", m["name"].as_str().unwrap(), m["size"]),
            *line
        );
    }
    let modes: Vec<_> = v["placeholders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            format!(
                "{} {}",
                p["mode"].as_str().unwrap(),
                p["path"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        modes,
        [
            "text bin/wsfixture-tool",
            "text etc/wsfixture.conf",
            "binary lib/libwsfixture.so.1.0"
        ]
    );

    let legacy = run(env
        .xtask()
        .args(["conda", "info", "--json"])
        .arg(fixture("wslegacy-0.1-0.tar.bz2")))
    .ok()
    .stdout();
    let v: serde_json::Value = serde_json::from_str(&legacy).unwrap();
    assert_eq!(v["format"], "tar.bz2");
    assert_eq!(v["placeholder_source"], "info/has_prefix");
    assert_eq!(v["placeholders"][0]["placeholder"], LEGACY_PLACEHOLDER);
}

/// A package built by the real tools: GNU `tar` (format given), `zstd`
/// (flags given, fed by a pipe so it cannot shrink the window to the input
/// size) and `zip` (flags given). The pkg tarball is `pkg_tar` when given,
/// else a small tree with an exec bit, a symlink, a hardlink and a long name.
struct Built {
    conda: PathBuf,
}

fn build(
    env: &TestEnv,
    tag: &str,
    pkg_tar: Option<&Path>,
    tar_format: &str,
    zstd: &str,
    zip: &str,
) -> Built {
    let work = env.join(format!("build-{tag}"));
    fs::create_dir_all(work.join("info-root/info")).unwrap();
    fs::write(
        work.join("info-root/info/index.json"),
        format!(r#"{{"name": "built-{tag}", "version": "1.0", "build": "0"}}"#),
    )
    .unwrap();
    let pkg_tar = match pkg_tar {
        Some(p) => p.to_path_buf(),
        None => {
            let root = work.join("pkg-root");
            fs::create_dir_all(root.join("bin")).unwrap();
            fs::create_dir_all(root.join("lib")).unwrap();
            fs::create_dir_all(root.join(format!("share/{}", "n".repeat(120)))).unwrap();
            fs::write(root.join("bin/tool"), "#!/bin/sh\necho tool\n").unwrap();
            sh(&format!("chmod 755 '{}'", root.join("bin/tool").display()));
            fs::write(root.join("lib/libx.so.2"), vec![9u8; 70_000]).unwrap();
            std::os::unix::fs::symlink("libx.so.2", root.join("lib/libx.so")).unwrap();
            fs::hard_link(root.join("bin/tool"), root.join("bin/tool-again")).unwrap();
            fs::write(root.join(format!("share/{}/f", "n".repeat(120))), "deep\n").unwrap();
            let tar = work.join("pkg.tar");
            sh(&format!(
                "tar --format={tar_format} -C '{}' -cf '{}' .",
                root.display(),
                tar.display()
            ));
            tar
        }
    };
    let conda = env.join(format!("built-{tag}-1.0-0.conda"));
    sh(&format!(
        "cd '{w}'
         tar --format={tar_format} -C info-root -cf info.tar info
         zstd -q info.tar -o info-built-{tag}-1.0-0.tar.zst
         cat '{pkg}' | zstd -q {zstd} -o pkg-built-{tag}-1.0-0.tar.zst
         printf '{{\"conda_pkg_format_version\": 2}}' > metadata.json
         zip -q -X {zip} '{out}' metadata.json info-built-{tag}-1.0-0.tar.zst pkg-built-{tag}-1.0-0.tar.zst",
        w = work.display(),
        pkg = pkg_tar.display(),
        out = conda.display(),
    ));
    Built { conda }
}

#[test]
fn conda_unpack_reads_packages_made_by_tar_zstd_and_zip() {
    let env = TestEnv::new();
    // PAX and GNU tars; zip -0 plain and zip64 (Info-ZIP -fz); the largest
    // window allowed, 2^27 (zstd --long=27).
    for (tag, fmt, zstd, zip) in [
        ("pax", "pax", "-19", "-0"),
        ("gnu", "gnu", "-3", "-0 -fz"),
        ("long27", "pax", "--long=27", "-0"),
    ] {
        let b = build(&env, tag, None, fmt, zstd, zip);
        assert_matches_cph(&env, &b.conda, &[]);
        let prefix = env.join("prefix");
        assert_eq!(
            fs::read_link(prefix.join("lib/libx.so")).unwrap(),
            Path::new("libx.so.2"),
            "{tag}"
        );
    }
    let b = build(&env, "w27", None, "pax", "--long=27", "-0");
    let info = run(env.xtask().args(["conda", "info"]).arg(&b.conda))
        .ok()
        .stdout();
    assert!(info.contains("(2^27)"), "{info}");
}

#[test]
fn conda_unpack_reads_zip64_as_rattler_writes_it() {
    // rattler writes .conda with the zip crate, STORED, large_file(true):
    // zip64 extra fields on every member.
    let env = TestEnv::new();
    let b = build(&env, "src", None, "pax", "-19", "-0");
    let members = env.join("members");
    sh(&format!(
        "mkdir -p '{m}' && cd '{m}' && unzip -q '{}'",
        b.conda.display(),
        m = members.display()
    ));
    // cph insists that member names match the file name.
    fs::create_dir_all(env.join("rattler")).unwrap();
    let out = env.join("rattler/built-src-1.0-0.conda");
    {
        let mut w = zip::ZipWriter::new(fs::File::create(&out).unwrap());
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored)
            .large_file(true);
        for name in [
            "metadata.json",
            "pkg-built-src-1.0-0.tar.zst",
            "info-built-src-1.0-0.tar.zst",
        ] {
            w.start_file(name, opts).unwrap();
            std::io::Write::write_all(&mut w, &fs::read(members.join(name)).unwrap()).unwrap();
        }
        w.finish().unwrap();
    }
    // Independent check that it really is zip64: Python's zipfile finds a
    // zip64 extra field (id 0x0001) on every member, local or central.
    assert_eq!(zip64_members(&out), 3);
    assert_matches_cph(&env, &out, &[]);
}

/// How many members carry a zip64 extra field (id 0x0001) in their local
/// or central header, as Python's zipfile reads them.
fn zip64_members(zip: &Path) -> usize {
    let script = r#"
import struct, sys, zipfile
def ids(extra):
    out, i = set(), 0
    while i + 4 <= len(extra):
        hid, n = struct.unpack("<HH", extra[i:i+4]); out.add(hid); i += 4 + n
    return out
f = open(sys.argv[1], "rb"); count = 0
for info in zipfile.ZipFile(sys.argv[1]).infolist():
    f.seek(info.header_offset); h = f.read(30)
    name_len, extra_len = struct.unpack("<HH", h[26:30]); f.seek(name_len, 1)
    local = f.read(extra_len)
    count += 1 in ids(info.extra) | ids(local)
print(count)
"#;
    let o = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(zip)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", show(&o));
    String::from_utf8_lossy(&o.stdout).trim().parse().unwrap()
}

/// A prefix holding a file of its own, and a sentinel outside, to prove a
/// refused package changes neither.
struct Scene {
    prefix: PathBuf,
    outside: PathBuf,
}

fn scene(env: &TestEnv) -> Scene {
    let prefix = env.join("root/prefix");
    let outside = env.join("root/outside");
    fs::create_dir_all(prefix.join("bin")).unwrap();
    fs::write(prefix.join("bin/existing"), "mine\n").unwrap();
    fs::create_dir_all(&outside).unwrap();
    fs::write(outside.join("sentinel"), "untouched\n").unwrap();
    Scene { prefix, outside }
}

/// Runs unpack, expects `code` with `needle` in the error, and checks that
/// the prefix, the outside and the prefix's parent are exactly as before.
fn expect_refusal(env: &TestEnv, pkg: &Path, extra: &[&str], code: i32, needle: &str) -> Run {
    let s = scene(env);
    let before = (
        snapshot(&s.prefix, Detail::EXTRACTED),
        snapshot(&s.outside, Detail::EXTRACTED),
    );
    let hostname = fs::read("/etc/hostname").ok();
    let out = run(env
        .xtask()
        .args(["conda", "unpack"])
        .arg(pkg)
        .arg("--into")
        .arg(&s.prefix)
        .args(extra))
    .expect_code(code);
    assert!(
        out.stderr().contains(needle),
        "expected `{needle}` in: {}",
        out.stderr()
    );
    assert_eq!(
        out.stderr().lines().count(),
        1,
        "one-line error: {}",
        out.stderr()
    );
    assert_eq!(
        (
            snapshot(&s.prefix, Detail::EXTRACTED),
            snapshot(&s.outside, Detail::EXTRACTED)
        ),
        before,
        "a refused package changed the prefix or the outside"
    );
    let beside: Vec<_> = fs::read_dir(env.join("root"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(beside.len(), 2, "left beside the prefix: {beside:?}");
    assert_eq!(fs::read("/etc/hostname").ok(), hostname);
    fs::remove_dir_all(env.join("root")).unwrap();
    out
}

#[test]
fn conda_unpack_refuses_hostile_tar_entries_naming_them() {
    let env = TestEnv::new();
    let outside = env.join("root/outside");
    let outside = outside.to_str().unwrap();
    let cases: &[(&str, &str, &[&str], &str)] = &[
        (
            "dotdot",
            "",
            &[],
            "refusing tar entry `../outside/evil`: path contains a `..` component",
        ),
        ("absolute", outside, &[], "absolute path"),
        (
            "symlink-escape",
            "",
            &[],
            "refusing tar entry `esc`: symlink target `../outside` leaves the destination",
        ),
        (
            "symlink-absolute",
            "/etc",
            &[],
            "refusing tar entry `abs`: symlink to the absolute path `/etc`",
        ),
        (
            "write-through-symlink",
            outside,
            &["--allow-external-symlinks"],
            "refusing tar entry `link/evil`: its parent `link` is a symlink",
        ),
        (
            "write-through-internal-symlink",
            "",
            &[],
            "refusing tar entry `l/evil`",
        ),
        (
            "hardlink-etc",
            "",
            &[],
            "refusing tar entry `h`: hardlink target `/etc/hostname`: absolute path",
        ),
        (
            "hardlink-dotdot",
            "",
            &[],
            "refusing tar entry `h`: hardlink target `../outside/sentinel`",
        ),
        ("hardlink-missing", "", &[], "is not an earlier entry"),
        (
            "chardev",
            "",
            &[],
            "refusing tar entry `null`: device nodes are refused",
        ),
        (
            "blockdev",
            "",
            &[],
            "refusing tar entry `sda`: device nodes are refused",
        ),
        (
            "fifo",
            "",
            &[],
            "refusing tar entry `pipe`: fifos are refused",
        ),
        (
            "symlink-then-file",
            outside,
            &["--allow-external-symlinks"],
            "refusing tar entry `name`: duplicate entry",
        ),
    ];
    for (case, arg, flags, needle) in cases {
        let tar = hostile(&env, case, arg);
        let b = build(&env, case, Some(&tar), "pax", "-3", "-0");
        expect_refusal(&env, &b.conda, flags, 7, needle);
    }
}

#[test]
fn conda_unpack_allows_absolute_symlinks_only_with_the_flag() {
    let env = TestEnv::new();
    let tar = hostile(&env, "symlink-absolute", "/usr/bin/env");
    let b = build(&env, "abs", Some(&tar), "pax", "-3", "-0");
    expect_refusal(
        &env,
        &b.conda,
        &[],
        7,
        "allow with --allow-external-symlinks",
    );
    let s = scene(&env);
    run(env
        .xtask()
        .args(["conda", "unpack"])
        .arg(&b.conda)
        .arg("--into")
        .arg(&s.prefix)
        .arg("--allow-external-symlinks"))
    .ok();
    assert_eq!(
        fs::read_link(s.prefix.join("abs")).unwrap(),
        Path::new("/usr/bin/env")
    );
    assert_eq!(
        fs::read_to_string(s.prefix.join("bin/existing")).unwrap(),
        "mine\n"
    );
}

#[test]
fn conda_unpack_refuses_hostile_zips() {
    let env = TestEnv::new();
    let good = fixture("wsfixture-1.2.3-h0_0.conda");
    let members = env.join("members");
    sh(&format!(
        "mkdir -p '{m}' && cd '{m}' && unzip -q '{}'",
        good.display(),
        m = members.display()
    ));

    // Re-zipped with DEFLATE, as a careless repack does (Python's zipfile
    // deflates every member; Info-ZIP would store the incompressible ones).
    let deflated = env.join("deflated.conda");
    let rezip = "import sys, zipfile, glob\nwith zipfile.ZipFile(sys.argv[1], 'w', zipfile.ZIP_DEFLATED) as z:\n    for n in ['metadata.json'] + sorted(glob.glob('*.tar.zst')): z.write(n)";
    let o = Command::new("python3")
        .arg("-c")
        .arg(rezip)
        .arg(&deflated)
        .current_dir(&members)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", show(&o));
    expect_refusal(
        &env,
        &deflated,
        &[],
        7,
        "zip member `metadata.json` is compressed with DEFLATE; .conda members must be STORED",
    );

    // Member names with `..`, and a member twice (Python's zipfile writes both).
    let script = r#"
import sys, zipfile, glob, os
src, out, case = sys.argv[1], sys.argv[2], sys.argv[3]
pkg = glob.glob(os.path.join(src, "pkg-*"))[0]
info = glob.glob(os.path.join(src, "info-*"))[0]
with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
    z.write(os.path.join(src, "metadata.json"), "metadata.json")
    z.write(info, os.path.basename(info))
    if case == "dotdot":
        z.write(pkg, "../" + os.path.basename(pkg))
    else:
        z.write(pkg, os.path.basename(pkg))
        z.write(pkg, os.path.basename(pkg))
"#;
    for (case, needle) in [
        (
            "dotdot",
            "zip member `../pkg-wsfixture-1.2.3-h0_0.tar.zst` contains `..`",
        ),
        (
            "duplicate",
            "zip member `pkg-wsfixture-1.2.3-h0_0.tar.zst` appears twice",
        ),
    ] {
        let out = env.join(format!("{case}.conda"));
        let o = Command::new("python3")
            .args(["-W", "ignore", "-c", script])
            .arg(&members)
            .arg(&out)
            .arg(case)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", show(&o));
        expect_refusal(&env, &out, &[], 7, needle);
    }

    // Not a package at all.
    let junk = env.join("junk.conda");
    fs::write(&junk, "hello").unwrap();
    expect_refusal(
        &env,
        &junk,
        &[],
        7,
        "neither a .conda (zip) nor a .tar.bz2 package",
    );
    // Missing file: not found.
    expect_refusal(&env, &env.join("nope.conda"), &[], 4, "does not exist");
}

#[test]
fn conda_unpack_refuses_a_window_log_30_frame_naming_the_limit() {
    let env = TestEnv::new();
    let b = build(&env, "w30", None, "pax", "--long=30", "-0");
    // Independent check of what zstd wrote.
    let info = run(env.xtask().args(["conda", "info"]).arg(&b.conda))
        .ok()
        .stdout();
    assert!(info.contains("(2^30)"), "{info}");
    let out = expect_refusal(
        &env,
        &b.conda,
        &[],
        7,
        "zip member `pkg-built-w30-1.0-0.tar.zst` is a zstd stream that needs a window of 1073741824 bytes (2^30), over the limit of 2^27 bytes",
    );
    assert!(out.stderr().contains("zstd --long=27"), "{}", out.stderr());
}

#[test]
fn conda_unpack_caps_bytes_and_entries() {
    let env = TestEnv::new();
    let b = build(&env, "caps", None, "pax", "-3", "-0");
    expect_refusal(
        &env,
        &b.conda,
        &["--max-bytes", "50000"],
        7,
        "exceed 50000 bytes (the cap)",
    );
    expect_refusal(
        &env,
        &b.conda,
        &["--max-entries", "4"],
        7,
        "more than 4 entries (the cap)",
    );
}

#[test]
fn conda_unpack_refuses_hostile_tar_bz2() {
    let env = TestEnv::new();
    let tar = hostile(&env, "dotdot", "");
    let bz = env.join("hostile-0.1-0.tar.bz2");
    // Python's bz2 module: no bzip2 tool needed on the machine.
    sh(&format!(
        "python3 -c 'import bz2, sys; open(sys.argv[2], \"wb\").write(bz2.compress(open(sys.argv[1], \"rb\").read()))' '{}' '{}'",
        tar.display(),
        bz.display()
    ));
    expect_refusal(&env, &bz, &[], 7, "refusing tar entry `../outside/evil`");
}

#[test]
fn conda_unpack_refuses_a_prefix_too_long_for_a_binary_placeholder() {
    let env = TestEnv::new();
    let s = scene(&env);
    let long = s
        .prefix
        .join("x".repeat(100))
        .join("y".repeat(100))
        .join("z".repeat(60));
    let out = run(env
        .xtask()
        .args(["conda", "unpack"])
        .arg(fixture("wsfixture-1.2.3-h0_0.conda"))
        .arg("--into")
        .arg(&long))
    .expect_code(2);
    assert!(
        out.stderr()
            .contains("binary file `lib/libwsfixture.so.1.0` has a 252-byte prefix placeholder"),
        "{}",
        out.stderr()
    );
    assert!(!long.exists(), "nothing may be created");
    // With --only bin/ the binary is not installed, so the long prefix is fine.
    run(env
        .xtask()
        .args(["conda", "unpack"])
        .arg(fixture("wsfixture-1.2.3-h0_0.conda"))
        .arg("--into")
        .arg(&long)
        .args(["--only", "bin/"]))
    .ok();
    let tool = fs::read_to_string(long.join("bin/wsfixture-tool")).unwrap();
    assert!(tool.contains(long.to_str().unwrap()));
    assert!(!long.join("lib").exists() && !long.join("share").exists());
}

#[test]
fn conda_unpack_only_installs_the_chosen_directories_and_keeps_others() {
    let env = TestEnv::new();
    let s = scene(&env);
    let out = run(env
        .xtask()
        .args(["conda", "unpack", "--json"])
        .arg(fixture("wsfixture-1.2.3-h0_0.conda"))
        .arg("--into")
        .arg(&s.prefix)
        .args(["--only", "bin/", "--only", "lib/"]))
    .ok();
    let v: serde_json::Value = serde_json::from_str(&out.stdout()).unwrap();
    assert_eq!(
        v["rewritten"],
        serde_json::json!(["bin/wsfixture-tool", "lib/libwsfixture.so.1.0"])
    );
    assert_eq!(
        (v["files"].as_u64(), v["symlinks"].as_u64()),
        (Some(2), Some(1))
    );
    let mut names: Vec<_> = fs::read_dir(&s.prefix)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["bin", "lib"]);
    assert_eq!(
        fs::read_to_string(s.prefix.join("bin/existing")).unwrap(),
        "mine\n"
    );
    assert_no_strays(&s.prefix);
}

#[test]
fn conda_unpack_refuses_a_conflicting_prefix_and_leaves_no_staging() {
    let env = TestEnv::new();
    let s = scene(&env);
    // The prefix has a file where the package has a directory.
    fs::write(s.prefix.join("lib"), "a file named lib\n").unwrap();
    let before = snapshot(&s.prefix, Detail::EXTRACTED);
    let out = run(env
        .xtask()
        .args(["conda", "unpack"])
        .arg(fixture("wsfixture-1.2.3-h0_0.conda"))
        .arg("--into")
        .arg(&s.prefix))
    .expect_code(7);
    assert!(
        out.stderr()
            .contains("is a file but the package has a directory `lib/` there; move it away"),
        "{}",
        out.stderr()
    );
    assert_eq!(
        snapshot(&s.prefix, Detail::EXTRACTED),
        before,
        "the prefix changed"
    );
    assert_no_strays(&s.prefix);
}

/// A package with many small files, so that a kill lands mid-merge.
fn many_files_package(env: &TestEnv, n: usize) -> PathBuf {
    let root = env.join("many-root");
    for d in 0..10 {
        fs::create_dir_all(root.join(format!("lib/d{d}"))).unwrap();
    }
    for i in 0..n {
        fs::write(
            root.join(format!("lib/d{}/f{i:05}", i % 10)),
            format!("file {i}\n"),
        )
        .unwrap();
    }
    let tar = env.join("many.tar");
    sh(&format!(
        "tar -C '{}' -cf '{}' lib",
        root.display(),
        tar.display()
    ));
    build(env, "many", Some(&tar), "pax", "-3", "-0").conda
}

fn assert_many_complete(prefix: &Path, n: usize) {
    for i in (0..n).step_by(97).chain([n - 1]) {
        let p = prefix.join(format!("lib/d{}/f{i:05}", i % 10));
        assert_eq!(
            fs::read_to_string(&p).unwrap(),
            format!("file {i}\n"),
            "{}",
            p.display()
        );
    }
    let count: usize = (0..10)
        .map(|d| {
            fs::read_dir(prefix.join(format!("lib/d{d}")))
                .unwrap()
                .count()
        })
        .sum();
    assert_eq!(count, n);
    assert_eq!(
        fs::read_to_string(prefix.join("bin/existing")).unwrap(),
        "mine\n"
    );
    assert_no_strays(prefix);
}

#[test]
fn conda_unpack_killed_mid_merge_is_completed_by_the_next_run() {
    let env = TestEnv::new();
    let n = 500;
    let pkg = many_files_package(&env, n);
    let s = scene(&env);
    // Kill points inside the binary: SIGKILL right after the journal is
    // written, and right after the first file moved.
    for point in ["merge:journal-written", "merge:moved-one"] {
        let out = run(env
            .xtask()
            .args(["conda", "unpack"])
            .arg(&pkg)
            .arg("--into")
            .arg(&s.prefix)
            .env("WARMSTART_TEST_KILL_AT", point));
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            out.out.status.signal(),
            Some(9),
            "{point}: {}",
            show(&out.out)
        );
        assert!(
            env.join("root/.prefix.warmstart-merge").exists(),
            "{point}: no journal left"
        );
        let again = run(env
            .xtask()
            .args(["conda", "unpack"])
            .arg(&pkg)
            .arg("--into")
            .arg(&s.prefix))
        .ok();
        assert!(
            again.stderr().contains("completing an interrupted merge"),
            "{}",
            again.stderr()
        );
        assert_many_complete(&s.prefix, n);
        fs::remove_dir_all(s.prefix.join("lib")).unwrap();
    }
}

#[test]
fn conda_unpack_survives_real_sigkill_at_any_moment() {
    let env = TestEnv::new();
    let n = 1000;
    let pkg = many_files_package(&env, n);
    let s = scene(&env);
    // Kill the real process after a spread of delays (some land during
    // extraction, some during the merge), then let one run finish.
    let mut killed = 0;
    for delay_ms in [5u64, 30, 80, 160, 300] {
        let mut child = env
            .xtask()
            .args(["conda", "unpack"])
            .arg(&pkg)
            .arg("--into")
            .arg(&s.prefix)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        let _ = child.kill();
        use std::os::unix::process::ExitStatusExt;
        if child.wait().unwrap().signal() == Some(9) {
            killed += 1;
        }
    }
    assert!(killed > 0, "no run was killed: the test proved nothing");
    run(env
        .xtask()
        .args(["conda", "unpack"])
        .arg(&pkg)
        .arg("--into")
        .arg(&s.prefix))
    .ok();
    assert_many_complete(&s.prefix, n);
}

#[test]
fn conda_unpack_two_at_once_into_one_prefix_both_succeed() {
    let env = TestEnv::new();
    let n = 500;
    let pkg = many_files_package(&env, n);
    let s = scene(&env);
    let spawn = || {
        env.xtask()
            .args(["conda", "unpack"])
            .arg(&pkg)
            .arg("--into")
            .arg(&s.prefix)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    for child in [a, b] {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", show(&out));
    }
    assert_many_complete(&s.prefix, n);
}

/// A package cut short at any point (an interrupted download) is refused
/// with one line that says it is truncated and to download it again, and
/// leaves the prefix as it was; a cut that leaves every entry whole (only a
/// compressed stream's last bytes gone) installs exactly what the whole
/// package installs, never something else.
#[test]
fn conda_unpack_a_truncated_package_says_so_and_to_download_it_again() {
    let env = TestEnv::new();
    for name in ["wsfixture-1.2.3-h0_0.conda", "wslegacy-0.1-0.tar.bz2"] {
        let whole = fs::read(fixture(name)).unwrap();
        let unpack = |pkg: &Path, into: &Path| {
            run(env
                .xtask()
                .args(["conda", "unpack"])
                .arg(pkg)
                .arg("--into")
                .arg(into))
            .ok();
        };
        let (mut refused, mut installed) = (0, 0);
        // Every cut from 1 byte up, in 24 steps, and the last 8 bytes one by one.
        let step = (whole.len() / 24).max(1);
        let cuts: BTreeSet<usize> = (1..whole.len())
            .step_by(step)
            .chain(whole.len().saturating_sub(8)..whole.len())
            .collect();
        for cut in cuts {
            let pkg = env.join(name);
            fs::write(&pkg, &whole[..cut]).unwrap();
            let prefix = env.join(format!("p-{name}-{cut}"));
            let r = run(env
                .xtask()
                .args(["conda", "unpack"])
                .arg(&pkg)
                .arg("--into")
                .arg(&prefix));
            if r.code() == 0 {
                // The prefix is written into the files: compare with the
                // whole package unpacked into the same path.
                let cut_tree = env.join(format!("cut-{name}-{cut}"));
                fs::rename(&prefix, &cut_tree).unwrap();
                unpack(&fixture(name), &prefix);
                crate::util::tree::assert_same_tree(&prefix, &cut_tree);
                installed += 1;
                continue;
            }
            let err = r.stderr();
            assert_eq!(r.code(), 7, "{name} cut at {cut}: {err}");
            assert!(
                err.contains("truncated") && err.contains("download it again"),
                "{name} cut at {cut} bytes of {}: {err}",
                whole.len()
            );
            assert_eq!(err.lines().count(), 1, "{name} cut at {cut}: {err}");
            assert!(
                !prefix.exists() || fs::read_dir(&prefix).unwrap().next().is_none(),
                "{name} cut at {cut}: the prefix was written"
            );
            refused += 1;
        }
        assert!(
            refused > 20,
            "{name}: only {refused} cuts refused ({installed} installed)"
        );
    }
}
