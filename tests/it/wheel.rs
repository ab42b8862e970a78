//! The `warmstart` wheel (tools/build-wheel.sh, handed over by tools/test.sh in
//! `WARMSTART_TEST_WHEEL`): `pip install` into a fresh venv, from the file and
//! from a package index on 127.0.0.1 pinned by `--require-hashes`, gives a
//! working `warmstart` with no compiler on PATH, one that restores a real cache
//! served by `git daemon`. Its binary needs nothing newer than glibc 2.17. The
//! generated bootstrap script's registry step installs it by the hash `init
//! --pip-hash` committed, and refuses it under any other hash.

use crate::util::git_daemon::GitDaemon;
use crate::util::tree::{assert_same_tree, make_tricky_tree, write_pseudo_random};
use crate::util::wheel::{EXE, Index, Pip, isolate_pip, venv, version, wheel};
use crate::util::{TestEnv, run, show, source_root};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A directory of `cargo`, `rustc`, `cc`, `gcc` and `zig` that all fail
/// loudly: first on PATH, it proves that nothing on the install or restore
/// path compiles.
fn no_compilers(env: &TestEnv) -> PathBuf {
    let dir = env.join("no-compilers");
    std::fs::create_dir_all(&dir).unwrap();
    for tool in ["cargo", "rustc", "cc", "gcc", "zig"] {
        let p = dir.join(tool);
        std::fs::write(
            &p,
            format!("#!/bin/sh\necho \"{tool} was called: the wheel path must not compile\" >&2\nexit 97\n"),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    dir
}

/// PATH with `first` directories in front of the runner's.
fn path_with(first: &[&Path]) -> OsString {
    let mut parts: Vec<PathBuf> = first.iter().map(|p| p.to_path_buf()).collect();
    parts.extend(std::env::split_paths(&std::env::var_os("PATH").unwrap()));
    std::env::join_paths(parts).unwrap()
}

/// Runs `pip install --no-cache-dir ARGS` into the venv, with its own pip or
/// the host's (as it was made), no compilers first on PATH.
fn pip(env: &TestEnv, venv: &Path, how: Pip, args: &[&str]) -> crate::util::Run {
    let mut cmd = match how {
        Pip::Own => Command::new(venv.join("bin/pip")),
        Pip::Host => {
            let mut c = Command::new("python3");
            c.args(["-m", "pip", "--python"])
                .arg(venv.join("bin/python"));
            c
        }
    };
    isolate_pip(env, &mut cmd);
    // The host's python3 for Pip::Host: the venv's bin/ stays off PATH.
    let bin = venv.join("bin");
    let first: &[&Path] = match how {
        Pip::Own => &[&no_compilers(env), &bin],
        Pip::Host => &[&no_compilers(env)],
    };
    cmd.env("PATH", path_with(first))
        .args(["install", "--no-cache-dir"])
        .args(args);
    run(&mut cmd)
}

/// Checks the installed executable: a real ELF binary (no Python shim) whose
/// `--version` names the crate's version.
fn assert_working_install(env: &TestEnv, venv: &Path) -> PathBuf {
    let exe = venv.join("bin").join(EXE);
    let head = std::fs::read(&exe).unwrap_or_else(|e| panic!("{}: {e}", exe.display()));
    assert_eq!(
        &head[..4],
        b"\x7fELF",
        "{} is not an ELF binary",
        exe.display()
    );
    let mut cmd = Command::new(&exe);
    env.isolate(&mut cmd);
    cmd.env("PATH", path_with(&[&no_compilers(env)]))
        .arg("--version");
    let r = run(&mut cmd).ok();
    let want = format!(" {}", env!("CARGO_PKG_VERSION"));
    assert!(
        r.stdout().trim_end().ends_with(&want),
        "--version does not end in{want}\n{}",
        show(&r.out)
    );
    exe
}

/// The newest `GLIBC_x.y` symbol version `bin` imports, read by objdump.
fn newest_glibc(bin: &Path) -> (u32, u32) {
    let out = Command::new("objdump")
        .arg("-T")
        .arg(bin)
        .output()
        .expect("running objdump (binutils; tools/test.sh installs it)");
    assert!(out.status.success(), "{}", show(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let mut newest = None;
    for word in text.split(|c: char| c.is_whitespace() || c == '(' || c == ')') {
        let Some(v) = word.strip_prefix("GLIBC_") else {
            continue;
        };
        let mut it = v.split('.').map(|n| n.parse::<u32>().unwrap_or(0));
        let ver = (it.next().unwrap_or(0), it.next().unwrap_or(0));
        newest = newest.max(Some(ver));
    }
    newest.unwrap_or_else(|| panic!("{} imports no GLIBC_ symbol\n{text}", bin.display()))
}

#[test]
fn wheel_from_a_file_installs_a_warmstart_that_restores_a_cache() {
    let wheel = wheel();
    let name = wheel.file_name().unwrap().to_str().unwrap().to_string();
    assert_eq!(version(&wheel), env!("CARGO_PKG_VERSION"), "{name}");
    // maturin names both spellings of the tag: manylinux2014_x86_64.manylinux_2_17_x86_64.
    assert!(
        name.contains("-py3-none-") && name.ends_with("manylinux_2_17_x86_64.whl"),
        "{name}"
    );
    let env = TestEnv::new();
    let v = venv(&env, "venv", Pip::Own);
    let r = pip(&env, &v, Pip::Own, &["--no-index", wheel.to_str().unwrap()]);
    assert_eq!(r.code(), 0, "pip install {name}\n{}", show(&r.out));
    let exe = assert_working_install(&env, &v);
    let (major, minor) = newest_glibc(&exe);
    assert!(
        (major, minor) <= (2, 17),
        "{} needs GLIBC_{major}.{minor}: not manylinux_2_17",
        exe.display()
    );

    // A cache published by the binary under test, to a remote that git
    // daemon serves; a fresh clone restores it with the wheel's binary.
    let remote = env.bare_remote("srv/origin.git");
    let work = env.work_repo("work");
    env.git(
        "work",
        ["remote", "add", "origin", remote.to_str().unwrap()],
    );
    let src = env.join("src");
    make_tricky_tree(&src, false);
    write_pseudo_random(&src.join("noise.bin"), 300_000, 7);
    std::fs::create_dir_all(work.join("cache-manifests")).unwrap();
    std::fs::write(
        work.join("cache-manifests/art.toml"),
        format!(
            "[[key]]\nname = \"v\"\nliteral = \"1\"\n\n[pack]\nroot = \"{}\"\n\n[restore]\npath = \"restored/art\"\n",
            src.display()
        ),
    )
    .unwrap();
    env.git("work", ["add", "-A"]);
    env.git("work", ["commit", "-q", "-m", "the art cache"]);
    env.git("work", ["push", "-q", "origin", "main"]);
    run(env
        .xtask_in("work")
        .args(["cache", "publish", "art", "--quiet"]))
    .ok();

    let daemon = GitDaemon::start(&env.join("srv"));
    env.git(".", ["clone", "-q", &daemon.url("origin.git"), "fresh"]);
    let mut cmd = Command::new(&exe);
    env.isolate(&mut cmd);
    cmd.current_dir(env.join("fresh"))
        .env("PATH", path_with(&[&no_compilers(&env)]))
        .args(["cache", "restore", "art", "--json"]);
    let r = run(&mut cmd).ok();
    let j: serde_json::Value =
        serde_json::from_str(&r.stdout()).unwrap_or_else(|e| panic!("{e}\n{}", show(&r.out)));
    assert_eq!(j["state"], "restored", "{j}");
    assert_same_tree(&src, &env.join("fresh/restored/art"));
}

#[test]
fn wheel_from_a_loopback_index_installs_only_with_its_pinned_hash() {
    let wheel = wheel();
    let env = TestEnv::new();
    let index = Index::serve(&env.join("index"), &wheel);

    // The shell and the Rust computation of the pin agree.
    let out = Command::new(source_root().join("tools/wheel-requirement.sh"))
        .arg(&wheel)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", show(&out));
    let line = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        line.trim_end(),
        warmstart::wheel::requirement_line(&wheel).unwrap()
    );
    assert!(
        line.starts_with(&format!(
            "warmstart=={} --hash=sha256:",
            env!("CARGO_PKG_VERSION")
        )),
        "{line}"
    );

    // One venv: the bad pins first, each of which must leave it empty.
    let v = venv(&env, "venv", Pip::Host);
    let install = |requirement: &str| {
        let req = env.join("requirement.txt");
        std::fs::write(&req, requirement).unwrap();
        let args = ["--index-url", &index.url(), "--require-hashes", "-r"];
        let mut all = args.to_vec();
        all.push(req.to_str().unwrap());
        pip(&env, &v, Pip::Host, &all)
    };

    // A pin whose digest is one hex digit off installs nothing.
    let (digest_at, _) = line.match_indices("sha256:").next().unwrap();
    let at = digest_at + "sha256:".len();
    let flipped = if &line[at..at + 1] == "0" { "1" } else { "0" };
    let wrong = format!("{}{flipped}{}", &line[..at], &line[at + 1..]);
    let r = install(&wrong);
    assert_ne!(r.code(), 0, "{}", show(&r.out));
    assert!(
        r.stderr().contains("DO NOT MATCH THE HASHES"),
        "{}",
        show(&r.out)
    );
    assert!(!v.join("bin").join(EXE).exists());

    // A version the index does not have installs nothing either.
    let other = line.replacen(env!("CARGO_PKG_VERSION"), "999.0.0", 1);
    let r = install(&other);
    assert_ne!(r.code(), 0, "{}", show(&r.out));
    assert!(
        r.stderr().contains("No matching distribution"),
        "{}",
        show(&r.out)
    );
    assert!(!v.join("bin").join(EXE).exists());

    // The exact pin installs a working warmstart.
    let r = install(&line);
    assert_eq!(r.code(), 0, "pip install -r {line}\n{}", show(&r.out));
    assert_working_install(&env, &v);
}

#[test]
fn wheel_requirement_script_names_a_bad_wheel_path() {
    let env = TestEnv::new();
    let script = source_root().join("tools/wheel-requirement.sh");
    let missing = env.join("warmstart-0.1.0-py3-none-any.whl");
    let odd = env.join("ruff-0.1.0-py3-none-any.whl");
    std::fs::write(&odd, b"not a warmstart wheel").unwrap();
    for (arg, says) in [
        (&missing, "is not a file"),
        (&odd, "is not named warmstart-VERSION-PY-ABI-PLATFORM.whl"),
    ] {
        let out = Command::new(&script).arg(arg).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{}", show(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{}", show(&out));
        assert_eq!(err.lines().count(), 1, "{}", show(&out));
        assert!(out.stdout.is_empty(), "{}", show(&out));
    }
}

/// Runs the fresh clone's generated bootstrap script with pip pointed at
/// `index` and failing compilers first on PATH.
fn bootstrap_from_index(env: &TestEnv, clone: &Path, index: &Index) -> crate::util::Run {
    let mut cmd = Command::new("bash");
    cmd.arg(clone.join("tools/warmstart-bootstrap.sh"))
        .current_dir(clone);
    isolate_pip(env, &mut cmd);
    cmd.env("PATH", path_with(&[&no_compilers(env)]))
        .env("PIP_INDEX_URL", index.url())
        .env("PIP_NO_CACHE_DIR", "1");
    run(&mut cmd)
}

/// A repository set up by `init --binary standalone --pip-hash HASH`, pushed
/// to a bare origin with no binary cache, and a fresh clone of it.
fn adopter_pinned_to(env: &TestEnv, hash: &str) -> PathBuf {
    let repo = env.work_repo("adopter");
    run(env
        .xtask_in("adopter")
        .args(["init", "--binary", "standalone", "--pip-hash", hash]))
    .ok();
    let origin = env.bare_remote("origin.git");
    env.git(&repo, ["add", "-A"]);
    env.git(&repo, ["commit", "-q", "-m", "adopt warmstart"]);
    env.git(&repo, ["remote", "add", "origin", origin.to_str().unwrap()]);
    env.git(&repo, ["push", "-q", "origin", "main"]);
    env.git(".", ["clone", "-q", origin.to_str().unwrap(), "fresh"]);
    env.join("fresh")
}

#[test]
fn wheel_the_generated_bootstrap_installs_the_pinned_wheel_from_a_loopback_index() {
    let wheel = wheel();
    let env = TestEnv::new();
    let index = Index::serve(&env.join("index"), &wheel);
    let pin = warmstart::wheel::pin(&wheel).unwrap();
    let clone = adopter_pinned_to(&env, &pin.hash);

    let r = bootstrap_from_index(&env, &clone, &index);
    let err = r.stderr();
    assert_eq!(r.code(), 0, "{}", show(&r.out));
    assert!(
        err.contains("binary cache: no refs/warmstart/cache/"),
        "{err}"
    );
    assert!(
        err.contains(&format!("registry: installed {}", pin.requirement)),
        "{err}"
    );
    // The fast way: the host's pip into a plain directory, no venv.
    assert!(
        err.contains("registry: the host's pip ")
            && err.contains(" installs it (pip install --target, no venv)"),
        "{err}"
    );
    assert!(!err.contains("was called"), "{err}");
    let installed = clone.join("target/warmstart-registry/pkg/bin").join(EXE);
    assert!(
        err.contains(&format!("running {} restore", installed.display())),
        "{err}"
    );
    let from_wheel = crate::util::wheel::release_bin(&env, "from-wheel");
    assert_eq!(
        crate::util::sha256sum(&installed),
        crate::util::sha256sum(&from_wheel)
    );
}

#[test]
fn wheel_the_generated_bootstrap_refuses_a_wheel_whose_hash_is_not_pinned() {
    let wheel = wheel();
    let env = TestEnv::new();
    let index = Index::serve(&env.join("index"), &wheel);
    let pin = warmstart::wheel::pin(&wheel).unwrap();
    // The pin one hex digit off: the index serves a wheel the pin does not name.
    let last = pin.hash.len() - 1;
    let flipped = if pin.hash.ends_with('0') { "1" } else { "0" };
    let wrong = format!("{}{flipped}", &pin.hash[..last]);
    let clone = adopter_pinned_to(&env, &wrong);

    let r = bootstrap_from_index(&env, &clone, &index);
    let err = r.stderr();
    assert_ne!(r.code(), 0, "{}", show(&r.out));
    assert!(
        err.contains(&format!(
            "registry: pip install --require-hashes {} failed",
            pin.requirement
        )),
        "{err}"
    );
    // Then the compile step, which says no release exists to install (it
    // names no version a registry lacks): nothing compiles.
    assert!(err.contains("no warmstart release exists"), "{err}");
    assert!(!err.contains("cargo was called"), "{err}");
    assert!(
        !clone.join("target/warmstart-registry/pkg").exists(),
        "{err}"
    );
}

/// A `python3` first on PATH that cannot import pip, as on a host without
/// it: the real interpreter with `-S` (no site-packages, where pip lives;
/// the standard library, venv and ensurepip included, is all there).
fn python_without_pip(env: &TestEnv) -> PathBuf {
    let real = String::from_utf8(
        Command::new("sh")
            .args(["-c", "command -v python3"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let dir = env.join("no-host-pip");
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("python3");
    std::fs::write(&p, format!("#!/bin/sh\nexec {} -S \"$@\"\n", real.trim())).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

#[test]
fn wheel_the_bootstrap_falls_back_to_a_venv_with_its_own_pip_when_the_host_has_none() {
    let wheel = wheel();
    let env = TestEnv::new();
    let index = Index::serve(&env.join("index"), &wheel);
    let pin = warmstart::wheel::pin(&wheel).unwrap();
    let clone = adopter_pinned_to(&env, &pin.hash);
    let mut cmd = Command::new("bash");
    cmd.arg(clone.join("tools/warmstart-bootstrap.sh"))
        .current_dir(&clone);
    isolate_pip(&env, &mut cmd);
    cmd.env(
        "PATH",
        path_with(&[&python_without_pip(&env), &no_compilers(&env)]),
    )
    .env("PIP_INDEX_URL", index.url())
    .env("PIP_NO_CACHE_DIR", "1");
    let r = run(&mut cmd);
    let err = r.stderr();
    assert_eq!(r.code(), 0, "{}", show(&r.out));
    assert!(
        err.contains(
            "registry: the host's python3 has no pip: a venv with its own pip (ensurepip, slower)"
        ),
        "{err}"
    );
    assert!(
        err.contains(&format!("registry: installed {}", pin.requirement)),
        "{err}"
    );
    assert!(!err.contains("was called"), "{err}");
    let venv = clone.join("target/warmstart-registry/pkg/bin");
    assert!(venv.join("pip").exists(), "the venv has its own pip: {err}");
    assert_eq!(
        crate::util::sha256sum(&venv.join(EXE)),
        crate::util::sha256sum(&crate::util::wheel::release_bin(&env, "from-wheel"))
    );
}
