//! Cache manifests parsed from text: each setting resolves, and each bad
//! one (including what `[build]` demands of the rest) is refused naming it.

use super::*;

fn repo(dir: &Path) -> Repo {
    Repo {
        root: dir.to_path_buf(),
        git_dir: dir.join(".git"),
    }
}

fn parse_str(dir: &Path, text: &str) -> Result<CacheManifest> {
    parse(&repo(dir), "tc", &dir.join("tc.toml"), text)
}

#[test]
fn a_build_pack_root_is_compared_lexically_and_through_links() {
    use crate::fsio::{lexical, through_links};
    assert_eq!(lexical(Path::new("/r/./a/../b/")), Path::new("/r/b"));
    assert_eq!(lexical(Path::new("/../r/..")), Path::new("/"));
    let tmp = tempfile::tempdir().unwrap();
    let dir = std::fs::canonicalize(tmp.path()).unwrap();
    std::fs::create_dir_all(dir.join("work/src")).unwrap();
    std::os::unix::fs::symlink(dir.join("work"), dir.join("link")).unwrap();
    assert_eq!(through_links(&dir.join("link")), dir.join("work"));
    assert_eq!(
        through_links(&dir.join("link/src/../missing/x")),
        dir.join("work/missing/x")
    );
    let work = dir.join("work");
    let build = |root: &str, extra: &str| {
        format!(
            "[[key]]\nname = \"s\"\ngit_tree = [\"src\"]\n[pack]\nroot = {root:?}\n{extra}[restore]\npath = \"dest\"\n[build]\ncommand = [\"make\"]\ninputs = [\"src\"]\ntimeout = \"1m\"\n"
        )
    };
    assert!(parse_str(&work, &build("out", "")).is_ok());
    for root in [".", "..", "src", ".git", "../link", "/"] {
        let e = parse_str(&work, &build(root, "")).unwrap_err();
        assert!(e.to_string().contains("pack.root"), "{root}: {e}");
    }
    let e = parse_str(&work, &build("out", "include = [\"a/**\"]\n")).unwrap_err();
    assert!(e.to_string().contains("include and exclude"), "{e}");
}

#[test]
fn minimal_manifest_gets_defaults() {
    let m = parse_str(
        Path::new("/r"),
        "[pack]\nroot = \"out\"\n[restore]\npath = \"dest\"\n",
    )
    .unwrap();
    assert_eq!(m.branch, "tc-cache");
    assert_eq!(m.remote, "origin");
    assert_eq!(m.pack_root, Path::new("/r/out"));
    assert_eq!(m.restore_path, Path::new("/r/dest"));
    assert_eq!(m.mode, Mode::Replace);
    assert_eq!(m.chunk_bytes, DEFAULT_CHUNK_BYTES);
    assert!(m.selects("a/b/c"));
}

#[test]
fn unknown_fields_and_bad_pins_are_refused() {
    let base = "[pack]\nroot = \"out\"\n[restore]\npath = \"dest\"\n";
    assert!(parse_str(Path::new("/r"), &format!("{base}[cache]\nbrnach = \"x\"\n")).is_err());
    let two = format!("{base}[[key]]\nname = \"a\"\nliteral = \"1\"\nplatform = true\n");
    assert!(parse_str(Path::new("/r"), &two).is_err());
    let sized = format!("{base}[publish]\nchunk_bytes = \"50MiB\"\n");
    assert_eq!(
        parse_str(Path::new("/r"), &sized).unwrap().chunk_bytes,
        50 << 20
    );
    let typo = format!("{base}[publish]\nchunk_bytes = \"50MB\"\n");
    assert!(parse_str(Path::new("/r"), &typo).is_err());
    let big = format!("{base}[publish]\nchunk_bytes = 104857600\n");
    assert!(parse_str(Path::new("/r"), &big).is_err());
}

/// `level` takes the two names or a number; `chunk_avg` a size whose
/// chunks fit `chunk_bytes`. Anything else is refused with a line that
/// names the setting and what it allows.
#[test]
fn levels_and_chunk_sizes_are_named_or_refused() {
    let base = "[pack]\nroot = \"out\"\n[restore]\npath = \"dest\"\n[publish]\n";
    let m = |extra: &str| parse_str(Path::new("/r"), &format!("{base}{extra}"));
    assert_eq!(m("").unwrap().level, 3);
    assert_eq!(m("level = \"fast\"\n").unwrap().level, 3);
    assert_eq!(m("level = \"small\"\n").unwrap().level, 19);
    assert_eq!(m("level = 7\n").unwrap().level, 7);
    for bad in ["\"tiny\"", "\"3\"", "0", "20", "-1", "3.5", "true"] {
        let err = format!("{:#}", m(&format!("level = {bad}\n")).unwrap_err());
        assert!(err.contains("level"), "{bad}: {err}");
        assert!(err.contains("\"fast\""), "{bad}: {err}");
        assert!(!err.trim_end().contains('\n'), "{bad}: {err}");
    }
    let d = m("").unwrap().chunk_sizes;
    assert_eq!((d.min, d.avg, d.max), (1 << 20, 4 << 20, 16 << 20));
    let s = m("chunk_avg = \"2MiB\"\n").unwrap().chunk_sizes;
    assert_eq!((s.min, s.avg, s.max), (512 << 10, 2 << 20, 8 << 20));
    assert_eq!(m("chunk_avg = 65536\n").unwrap().chunk_sizes.avg, 65536);
    for (bad, says) in [
        ("chunk_avg = \"4MB\"", "chunk_avg"),
        ("chunk_avg = \"100\"", "chunk_avg must be from 256"),
        ("chunk_avg = \"32MiB\"", "chunk_avg must be from 256"),
        (
            "chunk_avg = \"4MiB\"\nchunk_bytes = \"10MiB\"",
            "lower chunk_avg or raise chunk_bytes",
        ),
    ] {
        let err = format!("{:#}", m(&format!("{bad}\n")).unwrap_err());
        assert!(err.contains(says), "{bad}: {err}");
    }
}

#[test]
fn push_limit_is_a_size() {
    let base = "[pack]\nroot = \"out\"\n[restore]\npath = \"dest\"\n[publish]\n";
    let m = parse_str(Path::new("/r"), base).unwrap();
    assert_eq!(m.push_limit, None);
    let m = parse_str(Path::new("/r"), &format!("{base}push_limit = \"1.5GiB\"\n")).unwrap();
    assert_eq!(m.push_limit, Some(3 << 29));
    for bad in ["\"1.5GB\"", "-1", "\"lots\"", "1.5"] {
        let err = parse_str(Path::new("/r"), &format!("{base}push_limit = {bad}\n")).unwrap_err();
        assert!(format!("{err:#}").contains("push_limit"), "{bad}: {err:#}");
    }
}

#[test]
fn lease_deadline_is_a_positive_duration() {
    let base = "[pack]\nroot = \"out\"\n[restore]\npath = \"dest\"\n[publish]\n";
    let m = parse_str(
        Path::new("/r"),
        &format!("{base}lease_deadline = \"90s\"\n"),
    )
    .unwrap();
    assert_eq!(m.lease_deadline, Some(std::time::Duration::from_secs(90)));
    let m = parse_str(Path::new("/r"), &format!("{base}lease_deadline = 5\n")).unwrap();
    assert_eq!(m.lease_deadline, Some(std::time::Duration::from_secs(5)));
    for bad in ["\"soon\"", "\"0s\"", "\"-1s\"", "0"] {
        let err =
            parse_str(Path::new("/r"), &format!("{base}lease_deadline = {bad}\n")).unwrap_err();
        assert!(
            format!("{err:#}").contains("lease_deadline"),
            "{bad}: {err:#}"
        );
    }
}

#[test]
fn globs_match_paths() {
    let g = Glob::new("lib/**/*.so").unwrap();
    assert!(g.matches("lib/a.so"));
    assert!(g.matches("lib/x/y/a.so"));
    assert!(!g.matches("lib/a.so.1"));
    assert!(!g.matches("bin/a.so"));
    assert!(Glob::new("../x").is_err());
    let star = Glob::new("bin/*").unwrap();
    assert!(star.matches("bin/cargo"));
    assert!(!star.matches("bin/sub/cargo"));
    // A newline in a name is a byte like any other.
    assert!(Glob::new("**").unwrap().matches("new\nline.txt"));
    assert!(
        Glob::new("lib/**/*.so")
            .unwrap()
            .matches("lib/a\nb/c\nd.so")
    );
    assert!(star.matches("bin/new\nline"));
    assert!(!star.matches("bin/a\n/b"));
}

#[test]
fn include_selects_directories_and_their_contents() {
    let m = parse_str(
        Path::new("/r"),
        "[pack]\nroot = \"o\"\ninclude = [\"bin\"]\nexclude = [\"**/*.tmp\"]\n[restore]\npath = \"d\"\n",
    )
    .unwrap();
    assert!(m.selects("bin"));
    assert!(m.selects("bin/tool"));
    assert!(!m.selects("bin/x.tmp"));
    assert!(!m.selects("lib/x"));
}

#[test]
fn variables_expand_and_unset_ones_fail() {
    let r = repo(Path::new("/r"));
    // SAFETY: tests in this module do not read these variables concurrently.
    unsafe { std::env::set_var("XTASK_UNIT_TEST_DIR", "/opt/x") };
    assert_eq!(
        expand_path(&r, "${XTASK_UNIT_TEST_DIR}/bin").unwrap(),
        Path::new("/opt/x/bin")
    );
    assert_eq!(
        expand_path(&r, "$XTASK_UNIT_TEST_DIR").unwrap(),
        Path::new("/opt/x")
    );
    assert!(expand_path(&r, "$XTASK_SURELY_UNSET_VAR/x").is_err());
}

#[test]
fn cargo_target_dir_is_cargos_default_when_unset() {
    let r = repo(Path::new("/r"));
    // SAFETY: tests in this module do not read this variable concurrently.
    unsafe { std::env::remove_var("CARGO_TARGET_DIR") };
    assert_eq!(
        expand_path(&r, "$CARGO_TARGET_DIR/release").unwrap(),
        Path::new("/r/target/release")
    );
    unsafe { std::env::set_var("CARGO_TARGET_DIR", "/t/shared") };
    assert_eq!(
        expand_path(&r, "${CARGO_TARGET_DIR}/warmstart-bin").unwrap(),
        Path::new("/t/shared/warmstart-bin")
    );
}
