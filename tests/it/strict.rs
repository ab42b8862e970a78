//! Strict configuration: every value that does not parse, in a variable, a
//! manifest or a flag, is refused with a message that names it and the
//! accepted forms, never taken as a silent default; so is an unknown
//! `WARMSTART_*` variable. Each refusal runs the real binary.

use crate::util::{Run, TestEnv, run, source_root};
use std::path::Path;

fn write(path: impl AsRef<Path>, text: &str) {
    let path = path.as_ref();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// `cargo xtask <args>` in work repository `r`, with `vars` set.
fn xt(env: &TestEnv, vars: &[(&str, &str)], args: &[&str]) -> Run {
    let mut cmd = env.xtask_in("r");
    for (k, v) in vars {
        cmd.env(k, v);
    }
    run(cmd.args(args))
}

/// Expects exit `code` and a one-line error containing every `needles`.
fn refused(r: Run, code: i32, needles: &[&str]) {
    let r = r.expect_code(code);
    let err = r.stderr();
    for n in needles {
        assert!(err.contains(n), "stderr lacks {n:?}:\n{err}");
    }
    assert_eq!(err.trim_end().lines().count(), 1, "one line:\n{err}");
}

fn world() -> TestEnv {
    let env = TestEnv::new();
    env.work_repo("r");
    env
}

/// A restore.toml with one `command` step whose `timeout` is `timeout`
/// (a TOML string; `raw_timeout` writes any TOML value).
fn restore_with_timeout(env: &TestEnv, timeout: &str) {
    raw_timeout(env, &format!("{timeout:?}"));
}

fn raw_timeout(env: &TestEnv, value: &str) {
    write(
        env.join("r/cache-manifests/restore.toml"),
        &format!(
            "[[step]]\nname = \"t\"\nkind = \"command\"\nrun = \"true\"\ncreates = \"x\"\ntimeout = {value}\n"
        ),
    );
}

#[test]
fn lock_timeout_garbage_is_refused_not_thirty_minutes() {
    let env = world();
    refused(
        xt(
            &env,
            &[("WARMSTART_LOCK_TIMEOUT", "garbage")],
            &["cache", "list"],
        ),
        10,
        &[
            "WARMSTART_LOCK_TIMEOUT=\"garbage\"",
            "1h30m",
            "2min",
            "500ms",
        ],
    );
}

#[test]
fn compound_durations_are_accepted_in_variables_manifests_and_flags() {
    let env = world();
    xt(
        &env,
        &[("WARMSTART_LOCK_TIMEOUT", "1h30m")],
        &["cache", "list"],
    )
    .ok();
    for good in ["1h30m", "2min", "1m30s", "500ms", "90"] {
        restore_with_timeout(&env, good);
        xt(&env, &[], &["restore", "--dry-run"]).ok();
    }
    // A flag: clap takes the same parser (`gates push --timeout`); it fails
    // later for want of a remote, not on the duration.
    let r = xt(
        &env,
        &[],
        &["gates", "push", "--timeout", "1m30s", "nowhere"],
    );
    assert!(!r.stderr().contains("not a duration"), "{}", r.stderr());
}

#[test]
fn duration_garbage_in_a_manifest_is_refused_with_the_forms() {
    let env = world();
    for bad in ["garbage", "1h30", "30s1m", "5M", "-1s"] {
        restore_with_timeout(&env, bad);
        refused(
            xt(&env, &[], &["restore", "--dry-run"]),
            10,
            &["timeout", &format!("`{bad}` is not a duration"), "1h30m"],
        );
    }
    // Not a string at all: a float, a negative number, a boolean.
    for bad in ["1.5", "-5", "true"] {
        raw_timeout(&env, bad);
        refused(
            xt(&env, &[], &["restore", "--dry-run"]),
            10,
            &[
                bad,
                "expected a duration",
                "1h30m",
                "whole number of seconds",
            ],
        );
    }
    // A zero timeout would end the step before it starts.
    for zero in ["0", "\"0s\""] {
        raw_timeout(&env, zero);
        refused(
            xt(&env, &[], &["restore", "--dry-run"]),
            10,
            &["timeout: must be more than zero"],
        );
    }
}

#[test]
fn duration_garbage_in_a_flag_is_a_usage_error() {
    let env = world();
    let r = xt(&env, &[], &["gates", "push", "--timeout", "soon", "origin"]).expect_code(2);
    assert!(
        r.stderr().contains("`soon` is not a duration"),
        "{}",
        r.stderr()
    );
    assert!(r.stderr().contains("1h30m"), "{}", r.stderr());
}

#[test]
fn an_unknown_warmstart_variable_is_refused_with_the_nearest_name() {
    let env = world();
    // Built at run time, so the tidy check below does not see a typo here.
    let typo = format!("WARMSTART_{}", "LOCK_TIMOUT");
    refused(
        xt(&env, &[(&typo, "5m")], &["cache", "list"]),
        10,
        &[
            &typo,
            "did you mean WARMSTART_LOCK_TIMEOUT?",
            "docs/reference/environment.md",
        ],
    );
    let far = format!("WARMSTART_{}", "ZZZ_NOTHING_LIKE_IT");
    refused(
        xt(&env, &[(&far, "1")], &["resume", "list"]),
        10,
        &[&far, "no known variable is close"],
    );
}

#[test]
fn sizes_use_one_parser_everywhere() {
    let env = world();
    let pkg = source_root().join("tests/fixtures/conda");
    let conda = std::fs::read_dir(&pkg)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "conda"))
        .expect("a .conda fixture");
    let unpack = |max: &str| {
        let prefix = env.join(format!("prefix-{max}"));
        let mut cmd = env.xtask_in("r");
        cmd.args(["conda", "unpack"])
            .arg(&conda)
            .arg("--into")
            .arg(prefix)
            .args(["--max-bytes", max]);
        run(&mut cmd)
    };
    // `16G` was refused while `512k` was accepted elsewhere.
    unpack("16G").ok();
    unpack("16GiB").ok();
    let r = unpack("16GB").expect_code(2);
    assert!(r.stderr().contains("ambiguous"), "{}", r.stderr());
    let r = unpack("lots").expect_code(2);
    assert!(
        r.stderr().contains("`lots` is not a size"),
        "{}",
        r.stderr()
    );
    // The cap still works in the new units: 1k is too small for any package.
    let r = unpack("1k").expect_code(7);
    assert!(r.stderr().contains("the cap"), "{}", r.stderr());

    refused(
        xt(
            &env,
            &[("WARMSTART_FETCH_BLOB_LIMIT", "16GB")],
            &["cache", "list"],
        ),
        10,
        &["WARMSTART_FETCH_BLOB_LIMIT=\"16GB\" is not a size", "512k"],
    );
    refused(
        xt(
            &env,
            &[("WARMSTART_FETCH_BLOB_LIMIT", "0")],
            &["cache", "list"],
        ),
        10,
        &["WARMSTART_FETCH_BLOB_LIMIT=\"0\"", "more than zero"],
    );
}

fn cache_manifest(env: &TestEnv, include: &str, extra: &str) {
    write(
        env.join("r/cache-manifests/c.toml"),
        &format!(
            "[pack]\nroot = \"out\"\ninclude = [{include:?}]\n[restore]\npath = \"dest\"\n{extra}"
        ),
    );
}

#[test]
fn unsupported_glob_syntax_is_refused_in_cache_manifests() {
    let env = world();
    write(env.join("r/out/a.txt"), "a\n");
    for (glob, why) in [
        ("*.{a,b}", "`{a,b}`"),
        ("[0-9]*", "`[...]`"),
        ("!x", "negation"),
        ("out/", "ends with `/`"),
        ("a**", "whole component"),
        ("a//b", "empty component"),
    ] {
        cache_manifest(&env, glob, "");
        refused(
            xt(&env, &[], &["cache", "status", "c", "--offline"]),
            10,
            &[&format!("glob `{glob}`"), why, "lib/**/*.so"],
        );
    }
    cache_manifest(&env, "**/*.txt", "");
    xt(&env, &[], &["cache", "status", "c", "--offline"]).ok();
}

#[test]
fn chunk_sizes_in_a_manifest_take_the_same_units() {
    let env = world();
    cache_manifest(&env, "**", "[publish]\nchunk_bytes = \"50MiB\"\n");
    xt(&env, &[], &["cache", "status", "c", "--offline"]).ok();
    cache_manifest(&env, "**", "[publish]\nchunk_bytes = 1.5\n");
    refused(
        xt(&env, &[], &["cache", "status", "c", "--offline"]),
        10,
        &["line 7", "expected a size", "16GiB"],
    );
    cache_manifest(&env, "**", "[publish]\nchunk_bytes = \"50MB\"\n");
    refused(
        xt(&env, &[], &["cache", "status", "c", "--offline"]),
        10,
        &["publish.chunk_bytes", "`50MB` is not a size", "ambiguous"],
    );
}

#[test]
fn unsupported_glob_syntax_is_refused_in_gates_toml() {
    let env = world();
    for glob in ["*.{a,b}", "[0-9]", "!x", "scratch/"] {
        write(
            env.join("r/cache-manifests/gates.toml"),
            &format!("ignore = [{glob:?}]\n[[gate]]\nname = \"ok\"\ncommand = \"true\"\n"),
        );
        refused(
            xt(&env, &[], &["gates", "status"]),
            10,
            &["gates.toml", &format!("glob `{glob}`"), "**/*.log"],
        );
    }
}

/// Every `WARMSTART_` name used in xtask/src, tools/ and tests/ is in the one
/// list, `settings::KNOWN`: a new variable cannot be forgotten there (and
/// then refused as unknown at startup).
#[test]
fn every_warmstart_variable_used_is_known() {
    let known: Vec<&str> = warmstart::settings::KNOWN.iter().map(|k| k.0).collect();
    let mut files = Vec::new();
    for dir in ["xtask/src", "tools", "tests", ".github"] {
        collect(&source_root().join(dir), &mut files);
    }
    assert!(files.len() > 20, "found too few files: {}", files.len());
    let mut unknown = Vec::new();
    for file in &files {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for (i, _) in text.match_indices("WARMSTART_") {
            let name: String = text[i..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if name.len() > "WARMSTART_".len() && !known.contains(&name.as_str()) {
                unknown.push(format!("{}: {name}", file.display()));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "add these to warmstart::settings::KNOWN (xtask/src/settings.rs); docs/reference/environment.md is generated from it:\n{}",
        unknown.join("\n")
    );
    // And the reference lists every one of them, in a row of its own.
    let page =
        std::fs::read_to_string(source_root().join("docs/reference/environment.md")).unwrap();
    let missing: Vec<_> = known
        .iter()
        .filter(|n| !page.contains(&format!("| `{n}` |")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/reference/environment.md does not list {missing:?} (regenerate it: UPDATE_DOCS=1 cargo test --test it docs::)"
    );
}

fn collect(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name == "target" {
            continue;
        }
        if path.is_dir() {
            collect(&path, out);
        } else {
            out.push(path);
        }
    }
}
