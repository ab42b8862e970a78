//! `warmstart::unpack`, the safe extractor shared by cache restore and conda:
//! hostile tars built by Python's tarfile (an independent writer) are refused
//! naming the entry with nothing written outside; good tars written by GNU tar
//! unpack to the same tree GNU tar itself produces.

use crate::util::tree::{Detail, snapshot};
use crate::util::{TestEnv, show};
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use warmstart::exit::{Code, code_of};
use warmstart::unpack::{self, Limits, Options};

/// Builds hostile tars with Python's tarfile: `python3 - OUT CASE [ARG]`.
const HOSTILE: &str = r#"
import io, sys, tarfile
out, case = sys.argv[1], sys.argv[2]
arg = sys.argv[3] if len(sys.argv) > 3 else ""
def reg(t, name, data=b"x"):
    i = tarfile.TarInfo(name); i.size = len(data); t.addfile(i, io.BytesIO(data))
def link(t, name, target, kind=tarfile.SYMTYPE):
    i = tarfile.TarInfo(name); i.type = kind; i.linkname = target; t.addfile(i)
with tarfile.open(out, "w", format=tarfile.GNU_FORMAT) as t:
    if case == "dotdot":
        reg(t, "ok.txt"); reg(t, "../outside/evil")
    elif case == "dotdot-deep":
        reg(t, "a/b/../../../outside/evil")
    elif case == "absolute":
        reg(t, arg + "/evil")
    elif case == "symlink-escape":
        link(t, "esc", "../outside")
    elif case == "symlink-escape-deep":
        link(t, "a/b/esc", "../../../outside")
    elif case == "symlink-absolute":
        link(t, "abs", arg)
    elif case == "write-through-symlink":
        link(t, "link", arg); reg(t, "link/evil")
    elif case == "write-through-internal-symlink":
        i = tarfile.TarInfo("sub"); i.type = tarfile.DIRTYPE; t.addfile(i)
        link(t, "l", "sub"); reg(t, "l/evil")
    elif case == "symlink-then-file":
        link(t, "name", arg); reg(t, "name", b"overwrite what it points to")
    elif case == "hardlink-etc":
        link(t, "h", "/etc/hostname", tarfile.LNKTYPE)
    elif case == "hardlink-dotdot":
        link(t, "h", "../outside/sentinel", tarfile.LNKTYPE)
    elif case == "hardlink-missing":
        link(t, "h", "not-yet", tarfile.LNKTYPE); reg(t, "not-yet")
    elif case == "hardlink-through-symlink":
        link(t, "l", arg); link(t, "h", "l/sentinel", tarfile.LNKTYPE)
    elif case == "chardev":
        i = tarfile.TarInfo("null"); i.type = tarfile.CHRTYPE; i.devmajor = 1; i.devminor = 3; t.addfile(i)
    elif case == "blockdev":
        i = tarfile.TarInfo("sda"); i.type = tarfile.BLKTYPE; i.devmajor = 8; t.addfile(i)
    elif case == "fifo":
        i = tarfile.TarInfo("pipe"); i.type = tarfile.FIFOTYPE; t.addfile(i)
    elif case == "many":
        for n in range(int(arg)): reg(t, "f%04d" % n)
    elif case in ("writer-fails", "duplicate-among-many"):
        # Small files go to the writer threads; the bad one sits among them,
        # and a hardlink after it makes the main thread wait for them.
        for n in range(300): reg(t, "a/f%04d" % n, b"%d" % n)
        if case == "writer-fails":
            reg(t, "a/" + "n" * 300)  # longer than NAME_MAX: open fails
        else:
            reg(t, "a/f0100", b"again")
        for n in range(300): reg(t, "b/f%04d" % n)
        link(t, "h", "a/f0000", tarfile.LNKTYPE); reg(t, "zz-after")
    elif case == "hardlinks-many":
        for n in range(400):
            reg(t, "f%04d" % n, b"%d." % n * (n % 50 + 1))
            if n % 7 == 0:  # right behind its target, likely still queued
                link(t, "next%04d" % n, "f%04d" % n, tarfile.LNKTYPE)
        for n in range(0, 400, 13):
            link(t, "late%04d" % n, "f%04d" % n, tarfile.LNKTYPE)
    elif case == "big":
        reg(t, "a", b"a" * 4000); reg(t, "big", b"b" * 4000)
    else:
        raise SystemExit("unknown case " + case)
"#;

/// A hostile tar of the named case, written by Python's tarfile (shared with
/// the conda tests, which wrap these in packages).
pub fn hostile(env: &TestEnv, case: &str, arg: &str) -> PathBuf {
    let out = env.join(format!("{case}.tar"));
    let o = Command::new("python3")
        .arg("-c")
        .arg(HOSTILE)
        .arg(&out)
        .arg(case)
        .arg(arg)
        .output()
        .expect("python3 is needed (tools/test.sh installs it)");
    assert!(o.status.success(), "building {case}: {}", show(&o));
    out
}

/// A box holding `dest` (empty) and `outside/sentinel`, the thing an escape
/// would hit.
fn sandbox(env: &TestEnv) -> (PathBuf, PathBuf) {
    let dest = env.join("box/dest");
    let outside = env.join("box/outside");
    fs::create_dir_all(&dest).unwrap();
    fs::create_dir_all(&outside).unwrap();
    fs::write(outside.join("sentinel"), "untouched\n").unwrap();
    (dest, outside)
}

fn extract(
    tar: &Path,
    dest: &Path,
    limits: Limits,
    opts: Options,
) -> anyhow::Result<unpack::Stats> {
    unpack::extract_tar(fs::File::open(tar).unwrap(), dest, &limits, &opts)
}

/// Refused with exit code 7 and a message naming `entry`; nothing outside
/// `dest` changed and /etc/hostname is as it was.
fn assert_refused(case: &str, arg: &str, entry: &str, reason: &str, opts: Options) {
    let env = TestEnv::new();
    let (dest, outside) = sandbox(&env);
    let tar = hostile(&env, case, arg);
    let hostname_before = fs::metadata("/etc/hostname")
        .map(|m| (m.nlink(), m.len()))
        .ok();
    let before = snapshot(&outside, Detail::EXTRACTED);
    let err = extract(&tar, &dest, Limits::GENEROUS, opts).expect_err(case);
    let msg = format!("{err:#}");
    assert_eq!(code_of(&err), Code::Unsafe, "{case}: {msg}");
    assert!(
        msg.contains(&format!("`{entry}`")),
        "{case}: entry not named: {msg}"
    );
    assert!(
        msg.contains(reason),
        "{case}: reason `{reason}` missing: {msg}"
    );
    assert_eq!(
        snapshot(&outside, Detail::EXTRACTED),
        before,
        "{case}: something was written outside"
    );
    let box_names: Vec<_> = fs::read_dir(env.join("box"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        box_names.len(),
        2,
        "{case}: new files beside dest: {box_names:?}"
    );
    assert_eq!(
        fs::metadata("/etc/hostname")
            .map(|m| (m.nlink(), m.len()))
            .ok(),
        hostname_before,
        "{case}: /etc/hostname changed"
    );
}

#[test]
fn unpack_refuses_dotdot_entries() {
    assert_refused("dotdot", "", "../outside/evil", "`..`", Options::default());
    assert_refused(
        "dotdot-deep",
        "",
        "a/b/../../../outside/evil",
        "`..`",
        Options::default(),
    );
}

#[test]
fn unpack_refuses_absolute_paths() {
    let env = TestEnv::new();
    let target = env.join("abs-target");
    fs::create_dir_all(&target).unwrap();
    let (dest, _) = sandbox(&env);
    let tar = hostile(&env, "absolute", target.to_str().unwrap());
    let err = extract(&tar, &dest, Limits::GENEROUS, Options::default()).unwrap_err();
    assert_eq!(code_of(&err), Code::Unsafe);
    assert!(format!("{err:#}").contains("absolute path"), "{err:#}");
    assert!(
        !target.join("evil").exists(),
        "an absolute entry was written"
    );
}

#[test]
fn unpack_refuses_symlinks_that_escape() {
    let o = Options::default();
    assert_refused(
        "symlink-escape",
        "",
        "esc",
        "leaves the destination",
        o.clone(),
    );
    assert_refused(
        "symlink-escape-deep",
        "",
        "a/b/esc",
        "leaves the destination",
        o.clone(),
    );
    assert_refused(
        "symlink-absolute",
        "/etc",
        "abs",
        "absolute path `/etc`",
        o.clone(),
    );
}

#[test]
fn unpack_allows_absolute_symlinks_only_when_asked() {
    let env = TestEnv::new();
    let (dest, _) = sandbox(&env);
    let tar = hostile(&env, "symlink-absolute", "/usr/bin/env");
    let opts = Options {
        allow_external_symlinks: true,
        ..Options::default()
    };
    let stats = extract(&tar, &dest, Limits::GENEROUS, opts).unwrap();
    assert_eq!(stats.symlinks, 1);
    assert_eq!(
        fs::read_link(dest.join("abs")).unwrap(),
        Path::new("/usr/bin/env")
    );
}

#[test]
fn unpack_refuses_writes_through_symlinks() {
    // With external links allowed, the link itself is fine; writing through it is not.
    let env = TestEnv::new();
    let outside = env.join("box/outside");
    let allow = Options {
        allow_external_symlinks: true,
        ..Options::default()
    };
    assert_refused(
        "write-through-symlink",
        outside.to_str().unwrap(),
        "link/evil",
        "writing through a symlink",
        allow,
    );
    // Even a link that stays inside is never written through.
    assert_refused(
        "write-through-internal-symlink",
        "",
        "l/evil",
        "writing through a symlink",
        Options::default(),
    );
}

#[test]
fn unpack_refuses_a_file_over_an_earlier_symlink() {
    // The classic: a symlink to a victim, then a file of the same name. Never
    // follows the link (O_EXCL | O_NOFOLLOW), and says it is a duplicate.
    let env = TestEnv::new();
    let victim = env.join("box/outside/sentinel");
    let allow = Options {
        allow_external_symlinks: true,
        ..Options::default()
    };
    assert_refused(
        "symlink-then-file",
        victim.to_str().unwrap(),
        "name",
        "duplicate entry",
        allow,
    );
}

#[test]
fn unpack_refuses_hardlinks_outside_or_to_missing_entries() {
    let o = Options::default();
    assert_refused(
        "hardlink-etc",
        "",
        "h",
        "hardlink target `/etc/hostname`: absolute path",
        o.clone(),
    );
    assert_refused("hardlink-dotdot", "", "h", "`..`", o.clone());
    assert_refused(
        "hardlink-missing",
        "",
        "h",
        "not an earlier entry",
        o.clone(),
    );
    let env = TestEnv::new();
    let outside = env.join("box/outside");
    let allow = Options {
        allow_external_symlinks: true,
        ..Options::default()
    };
    assert_refused(
        "hardlink-through-symlink",
        outside.to_str().unwrap(),
        "h",
        "not an earlier entry",
        allow,
    );
}

#[test]
fn unpack_refuses_device_nodes_and_fifos() {
    let o = Options::default();
    assert_refused("chardev", "", "null", "device nodes are refused", o.clone());
    assert_refused("blockdev", "", "sda", "device nodes are refused", o.clone());
    assert_refused("fifo", "", "pipe", "fifos are refused", o.clone());
}

#[test]
fn unpack_caps_bytes_and_entries() {
    let env = TestEnv::new();
    let (dest, _) = sandbox(&env);
    let tar = hostile(&env, "big", "");
    let limits = Limits {
        max_bytes: 6000,
        max_entries: 100,
    };
    let err = extract(&tar, &dest, limits, Options::default()).unwrap_err();
    assert_eq!(code_of(&err), Code::Unsafe);
    let msg = format!("{err:#}");
    assert!(
        msg.contains("`big`") && msg.contains("exceed 6000 bytes"),
        "{msg}"
    );
    // Refused before its data was written.
    assert!(!dest.join("big").exists());

    let dest2 = env.join("dest2");
    fs::create_dir(&dest2).unwrap();
    let tar = hostile(&env, "many", "50");
    let limits = Limits {
        max_bytes: 1 << 20,
        max_entries: 20,
    };
    let err = extract(&tar, &dest2, limits, Options::default()).unwrap_err();
    assert_eq!(code_of(&err), Code::Unsafe);
    assert!(
        format!("{err:#}").contains("`f0020`: the archive has more than 20 entries"),
        "{err:#}"
    );
}

/// Rewrites the size field of the first header (octal, 12 bytes at 124) and
/// its checksum, so the header lies about its data.
fn patch_first_size(tar: &mut [u8], size: u64) {
    let field = format!("{size:011o}\0");
    tar[124..136].copy_from_slice(field.as_bytes());
    tar[148..156].copy_from_slice(b"        ");
    let sum: u32 = tar[..512].iter().map(|&b| b as u32).sum();
    tar[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
}

#[test]
fn unpack_refuses_entries_longer_or_shorter_than_declared() {
    let env = TestEnv::new();
    let (dest, _) = sandbox(&env);
    let tar = hostile(&env, "big", "");
    let good = fs::read(&tar).unwrap();

    // Data longer than declared: the excess is read as a header and refused,
    // naming the entry whose size lied.
    let mut longer = good.clone();
    patch_first_size(&mut longer, 10);
    let err = unpack::extract_tar(&longer[..], &dest, &Limits::GENEROUS, &Options::default())
        .unwrap_err();
    assert_eq!(code_of(&err), Code::Unsafe);
    let msg = format!("{err:#}");
    assert!(
        msg.contains("after entry `a`") && msg.contains("longer than its declared size"),
        "{msg}"
    );

    // Declared longer than the stream holds.
    let dest2 = env.join("dest2");
    fs::create_dir(&dest2).unwrap();
    let mut cut = good[..512 + 1024].to_vec();
    patch_first_size(&mut cut, 3000);
    let err =
        unpack::extract_tar(&cut[..], &dest2, &Limits::GENEROUS, &Options::default()).unwrap_err();
    assert_eq!(code_of(&err), Code::Unsafe);
    let msg = format!("{err:#}");
    assert!(
        msg.contains("`a`: declares 3000 bytes but the stream ends after 1024"),
        "{msg}"
    );
}

#[test]
fn unpack_refuses_oversized_long_name_records() {
    // A GNU long-name record of 4 MiB would be read into memory whole by a
    // naive reader; the header budget refuses it.
    let env = TestEnv::new();
    let (dest, _) = sandbox(&env);
    let script = r#"
import io, sys, tarfile
with tarfile.open(sys.argv[1], "w", format=tarfile.GNU_FORMAT) as t:
    i = tarfile.TarInfo("d/" * (2 << 20) + "f"); i.size = 1
    t.addfile(i, io.BytesIO(b"x"))
"#;
    let tar = env.join("longname.tar");
    let o = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(&tar)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", show(&o));
    let err = extract(&tar, &dest, Limits::GENEROUS, Options::default()).unwrap_err();
    assert_eq!(code_of(&err), Code::Unsafe);
    assert!(format!("{err:#}").contains("extension records"), "{err:#}");
}

/// A tree with what real artifacts hold: exec bits, empty and read-only
/// dirs, relative symlinks, hardlinks, long and unicode names.
fn rich_tree(root: &Path) {
    let long_dir = format!("deep/{}", "d".repeat(120));
    fs::create_dir_all(root.join(&long_dir)).unwrap();
    fs::write(
        root.join(long_dir.clone() + "/" + &"f".repeat(150)),
        "long\n",
    )
    .unwrap();
    fs::create_dir_all(root.join("bin")).unwrap();
    fs::write(root.join("bin/tool"), "#!/bin/sh\necho hi\n").unwrap();
    fs::set_permissions(root.join("bin/tool"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::create_dir_all(root.join("empty/also-empty")).unwrap();
    fs::create_dir_all(root.join("ro")).unwrap();
    fs::write(root.join("ro/data"), "read only\n").unwrap();
    fs::set_permissions(root.join("ro/data"), fs::Permissions::from_mode(0o444)).unwrap();
    fs::set_permissions(root.join("ro"), fs::Permissions::from_mode(0o555)).unwrap();
    fs::create_dir_all(root.join("lib")).unwrap();
    fs::write(root.join("lib/libz.so.1.3"), vec![7u8; 300_000]).unwrap();
    std::os::unix::fs::symlink("libz.so.1.3", root.join("lib/libz.so")).unwrap();
    std::os::unix::fs::symlink("../lib/libz.so", root.join("bin/link-up")).unwrap();
    fs::hard_link(root.join("bin/tool"), root.join("bin/tool-hardlink")).unwrap();
    fs::write(root.join("ünïcødé-名前.txt"), "unicode\n").unwrap();
}

#[test]
fn unpack_matches_gnu_tar_for_pax_and_gnu_archives() {
    let env = TestEnv::new();
    let src = env.join("src");
    rich_tree(&src);
    for format in ["pax", "gnu"] {
        let tar = env.join(format!("rich-{format}.tar"));
        let o = Command::new("tar")
            .arg(format!("--format={format}"))
            .arg("-cf")
            .arg(&tar)
            .arg("-C")
            .arg(&src)
            .arg(".")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", show(&o));
        let ours = env.join(format!("ours-{format}"));
        let theirs = env.join(format!("theirs-{format}"));
        fs::create_dir(&ours).unwrap();
        fs::create_dir(&theirs).unwrap();
        let stats = extract(&tar, &ours, Limits::GENEROUS, Options::default()).unwrap();
        let o = Command::new("tar")
            .arg("-xpf")
            .arg(&tar)
            .arg("-C")
            .arg(&theirs)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", show(&o));
        assert_eq!(
            snapshot(&ours, Detail::EXTRACTED),
            snapshot(&theirs, Detail::EXTRACTED),
            "{format}: trees differ"
        );
        assert_eq!(
            (stats.files, stats.symlinks, stats.hardlinks),
            (5, 2, 1),
            "{format}"
        );
        let a = fs::metadata(ours.join("bin/tool")).unwrap();
        let b = fs::metadata(ours.join("bin/tool-hardlink")).unwrap();
        assert_eq!(a.ino(), b.ino(), "{format}: hardlink not kept");
    }
}

#[test]
fn unpack_streams_a_zstd_tar_from_the_zstd_cli() {
    // The cache-restore shape: `tar | zstd` made by the real tools, decoded
    // as a stream.
    let env = TestEnv::new();
    let src = env.join("src");
    rich_tree(&src);
    let zst = env.join("a.tar.zst");
    let o = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "tar -C '{}' -cf - . | zstd -q -19 -o '{}'",
            src.display(),
            zst.display()
        ))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", show(&o));
    let dest = env.join("dest");
    fs::create_dir(&dest).unwrap();
    let dec = zstd::stream::read::Decoder::new(fs::File::open(&zst).unwrap()).unwrap();
    let stats = unpack::extract_tar(dec, &dest, &Limits::GENEROUS, &Options::default()).unwrap();
    assert_eq!(
        stats.bytes,
        fs::metadata(src.join("lib/libz.so.1.3")).unwrap().len() + 41
    );
    assert_eq!(
        fs::read_to_string(dest.join("ünïcødé-名前.txt")).unwrap(),
        "unicode\n"
    );
}

/// Files per tree in the swap test; a complete tree has all of them, each
/// holding the same generation number.
const SWAP_FILES: usize = 20;

fn swap_generation(target: &Path) -> String {
    let first = fs::read_to_string(target.join("f00")).unwrap();
    for i in 0..SWAP_FILES {
        let got = fs::read_to_string(target.join(format!("f{i:02}")))
            .unwrap_or_else(|e| panic!("f{i:02} missing from the swapped tree: {e}"));
        assert_eq!(got, first, "a mixed tree: f{i:02} differs from f00");
    }
    first
}

#[test]
fn swap_dir_survives_sigkill_at_any_moment() {
    // Child mode: swap new generations into the target until killed. The
    // parent below re-runs this test binary with WS_SWAP_LOOP set.
    if let Some(dir) = std::env::var_os("WS_SWAP_LOOP") {
        let target = Path::new(&dir).join("target");
        for generation in 1.. {
            let staging = unpack::staging_dir_for(&target).unwrap();
            for i in 0..SWAP_FILES {
                fs::write(staging.join(format!("f{i:02}")), generation.to_string()).unwrap();
            }
            unpack::swap_dir(&staging, &target).unwrap();
        }
        return;
    }
    let env = TestEnv::new();
    let target = env.join("target");
    fs::create_dir(&target).unwrap();
    for i in 0..SWAP_FILES {
        fs::write(target.join(format!("f{i:02}")), "0").unwrap();
    }
    let mut seen = Vec::new();
    for delay_ms in [40u64, 90, 150, 230, 330] {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "unpack::swap_dir_survives_sigkill_at_any_moment",
                "--nocapture",
            ])
            .env("WS_SWAP_LOOP", env.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        child.kill().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            child.wait().unwrap().signal(),
            Some(9),
            "the swap loop ended by itself"
        );
        // The next run's recovery leaves exactly one complete tree.
        unpack::recover_swap(&target).unwrap();
        seen.push(swap_generation(&target));
        let mut names: Vec<_> = fs::read_dir(env.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["home", "target"], "leftovers after recovery");
    }
    assert!(
        seen.iter().any(|g| g != "0"),
        "no swap completed before the kills: {seen:?}"
    );
}

/// `Options` with `writers` threads (`None`: the default pool).
fn with_writers(writers: Option<usize>) -> Options {
    Options {
        writers,
        ..Options::default()
    }
}

#[test]
fn unpack_writer_failure_stops_the_run_naming_the_entry() {
    // The failing file is created by a writer thread (or by the main thread
    // with `Some(0)`): the run stops at the next hardlink, which waits for
    // the writers, and names the entry; nothing later is created.
    let long = "n".repeat(300);
    for writers in [None, Some(0), Some(1), Some(3)] {
        let env = TestEnv::new();
        let (dest, outside) = sandbox(&env);
        let before = snapshot(&outside, Detail::EXTRACTED);
        let tar = hostile(&env, "writer-fails", "");
        let err = extract(&tar, &dest, Limits::GENEROUS, with_writers(writers)).unwrap_err();
        let msg = format!("{err:#}");
        assert_eq!(code_of(&err), Code::Failed, "{writers:?}: {msg}");
        assert!(
            msg.contains(&format!(
                "creating {}",
                dest.join("a").join(&long).display()
            )),
            "{writers:?}: entry not named: {msg}"
        );
        assert!(msg.contains("File name too long"), "{writers:?}: {msg}");
        assert!(!msg.contains('\n'), "one line: {msg}");
        assert!(
            !dest.join("h").exists(),
            "{writers:?}: ran past the failure"
        );
        assert!(!dest.join("zz-after").exists(), "{writers:?}");
        assert_eq!(fs::read_to_string(dest.join("a/f0299")).unwrap(), "299");
        assert_eq!(
            snapshot(&outside, Detail::EXTRACTED),
            before,
            "{writers:?}: wrote outside"
        );

        // A duplicate among the writers' files is an archive problem.
        let env = TestEnv::new();
        let (dest, outside) = sandbox(&env);
        let before = snapshot(&outside, Detail::EXTRACTED);
        let tar = hostile(&env, "duplicate-among-many", "");
        let err = extract(&tar, &dest, Limits::GENEROUS, with_writers(writers)).unwrap_err();
        let msg = format!("{err:#}");
        assert_eq!(code_of(&err), Code::Unsafe, "{writers:?}: {msg}");
        assert!(
            msg.contains("refusing tar entry `a/f0100`: duplicate entry"),
            "{writers:?}: {msg}"
        );
        assert!(!dest.join("h").exists() && !dest.join("zz-after").exists());
        assert_eq!(snapshot(&outside, Detail::EXTRACTED), before);
    }
}

#[test]
fn unpack_hardlinks_to_files_the_writers_create() {
    for writers in [None, Some(0), Some(3)] {
        let env = TestEnv::new();
        let dest = env.join("dest");
        fs::create_dir(&dest).unwrap();
        let tar = hostile(&env, "hardlinks-many", "");
        let stats = extract(&tar, &dest, Limits::GENEROUS, with_writers(writers)).unwrap();
        let links: Vec<(String, usize)> = (0..400)
            .step_by(7)
            .map(|n| (format!("next{n:04}"), n))
            .chain((0..400).step_by(13).map(|n| (format!("late{n:04}"), n)))
            .collect();
        assert_eq!(stats.files, 400, "{writers:?}");
        assert_eq!(stats.hardlinks, links.len() as u64, "{writers:?}");
        for (link, n) in &links {
            let target = dest.join(format!("f{n:04}"));
            let want = format!("{n}.").repeat(n % 50 + 1);
            assert_eq!(fs::read_to_string(dest.join(link)).unwrap(), want, "{link}");
            let (a, b) = (
                fs::metadata(dest.join(link)).unwrap(),
                fs::metadata(&target).unwrap(),
            );
            assert_eq!(a.ino(), b.ino(), "{writers:?}: {link} is not a hardlink");
            let expect_nlink = 1 + u64::from(n % 7 == 0) + u64::from(n % 13 == 0);
            assert_eq!(b.nlink(), expect_nlink, "{writers:?}: {link}");
        }
    }
}

#[test]
fn unpack_round_trips_many_small_files_and_large_ones() {
    // Small files go through the writer threads, files over 1 MiB through
    // the main thread, in one archive; GNU tar's extraction is the reference.
    let env = TestEnv::new();
    let src = env.join("src");
    let mut bytes = 0u64;
    let mut files = 0u64;
    for d in 0..12 {
        let dir = src.join(format!("d{d:02}"));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..100 {
            let n = d * 100 + f;
            let p = dir.join(format!("f{f:03}"));
            let data: Vec<u8> = (0..(n * 37) % 9000).map(|i| (i * n % 251) as u8).collect();
            fs::write(&p, &data).unwrap();
            let mode = [0o644, 0o600, 0o755, 0o444][n % 4];
            fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
            let mtime =
                std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000 + n as u64);
            fs::File::options()
                .write(true)
                .open(&p)
                .and_then(|f| f.set_modified(mtime))
                .or_else(|_| {
                    // 0o444 files: set the mtime through a writable moment.
                    fs::set_permissions(&p, fs::Permissions::from_mode(0o644))?;
                    fs::File::options()
                        .write(true)
                        .open(&p)?
                        .set_modified(mtime)?;
                    fs::set_permissions(&p, fs::Permissions::from_mode(mode))
                })
                .unwrap();
            bytes += data.len() as u64;
            files += 1;
        }
    }
    // At the pool's limit, just over it, and well over it.
    for (name, size) in [
        ("limit", 1 << 20),
        ("over", (1 << 20) + 1),
        ("large", 5 << 20),
    ] {
        let data: Vec<u8> = (0..size).map(|i: usize| (i % 253) as u8).collect();
        fs::write(src.join(format!("d07/{name}")), &data).unwrap();
        bytes += size as u64;
        files += 1;
    }
    fs::set_permissions(src.join("d03"), fs::Permissions::from_mode(0o555)).unwrap();
    let tar = env.join("many.tar");
    let o = Command::new("tar")
        .arg("-cf")
        .arg(&tar)
        .arg("-C")
        .arg(&src)
        .arg(".")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", show(&o));
    let theirs = env.join("theirs");
    fs::create_dir(&theirs).unwrap();
    let o = Command::new("tar")
        .arg("-xpf")
        .arg(&tar)
        .arg("-C")
        .arg(&theirs)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", show(&o));
    let want = snapshot(&theirs, Detail::EXTRACTED);
    for writers in [None, Some(0), Some(3)] {
        let ours = env.join(format!("ours-{writers:?}"));
        fs::create_dir(&ours).unwrap();
        let stats = extract(&tar, &ours, Limits::GENEROUS, with_writers(writers)).unwrap();
        assert_eq!((stats.files, stats.bytes, stats.dirs), (files, bytes, 12));
        let got = snapshot(&ours, Detail::EXTRACTED);
        assert_eq!(got.len(), want.len(), "{writers:?}");
        for (path, w) in &want {
            assert!(got.get(path) == Some(w), "{writers:?}: {path} differs");
        }
    }
}
