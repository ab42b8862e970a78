//! Tests of the pack: plans, deterministic tars, chunks and their errors.

use super::*;
use crate::cache::format::manifest::Glob;
use crate::exit::Code;
use std::collections::BTreeSet;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{PermissionsExt, symlink};

fn all(root: &Path) -> Plan {
    plan_tree(root, false, &Rules::all()).unwrap()
}

fn tree(dir: &Path) {
    fs::create_dir_all(dir.join("b/c")).unwrap();
    fs::create_dir_all(dir.join("empty")).unwrap();
    fs::write(dir.join("a-b"), "x").unwrap();
    fs::write(dir.join("b/c/file"), "hello").unwrap();
    fs::write(dir.join("tool"), "#!/bin/sh\n").unwrap();
    fs::set_permissions(dir.join("tool"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::hard_link(dir.join("b/c/file"), dir.join("z-hard")).unwrap();
    symlink("./b//c/file", dir.join("link")).unwrap();
    let long = "n".repeat(150);
    fs::write(dir.join(&long), "long").unwrap();
    // Longer than a tar header holds, and one a restore accepts.
    symlink(format!("./{long}"), dir.join("long-link")).unwrap();
}

fn tar_of(plan: &Plan) -> Vec<u8> {
    let mut out = Vec::new();
    write_tar(plan, &mut out, &mut |_| {}).unwrap();
    out
}

#[test]
fn plan_is_sorted_and_links_are_kept() {
    let tmp = tempfile::tempdir().unwrap();
    tree(tmp.path());
    let p = all(tmp.path());
    let names: Vec<String> = p
        .items
        .iter()
        .map(|i| String::from_utf8_lossy(&i.rel).into_owned())
        .collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
    assert_eq!(&names[..4], ["a-b", "b", "b/c", "b/c/file"]);
    let link = p.items.iter().find(|i| i.rel == b"link").unwrap();
    assert_eq!(link.kind, Kind::Symlink(b"./b//c/file".to_vec()));
    let hard = p.items.iter().find(|i| i.rel == b"z-hard").unwrap();
    assert_eq!(hard.kind, Kind::Hardlink(b"b/c/file".to_vec()));
    assert_eq!(p.file_bytes, 1 + 5 + 10 + 4);
}

/// Same tree, same bytes: a second tree made later (other mtimes, other
/// inode numbers, other creation order) packs byte for byte the same.
#[test]
fn tar_digest_equals_the_digest_of_the_written_tar() {
    let dir = tempfile::tempdir().unwrap();
    tree(dir.path());
    // Bigger than one 1 MiB block, not a multiple of it.
    std::fs::write(dir.path().join("big.bin"), vec![7u8; (3 << 20) + 12345]).unwrap();
    let plan = all(dir.path());
    let mut bytes = Vec::new();
    let written = write_tar(&plan, &mut bytes, &mut |_| {}).unwrap();
    let mut seen = 0;
    let digest = tar_digest(&plan, &mut |d| seen = d).unwrap();
    assert_eq!(digest, written);
    assert_eq!(digest.sha256, hex::encode(&Sha256::digest(&bytes)));
    assert_eq!(digest.size, bytes.len() as u64);
    assert_eq!(seen, plan.file_bytes);
    // A file that vanished after planning is an error, not a digest.
    std::fs::remove_file(dir.path().join("big.bin")).unwrap();
    assert!(tar_digest(&plan, &mut |_| {}).is_err());
}

#[test]
fn tar_is_deterministic() {
    let tmp = tempfile::tempdir().unwrap();
    tree(&tmp.path().join("one"));
    std::thread::sleep(std::time::Duration::from_millis(1100));
    tree(&tmp.path().join("two"));
    let a = tar_of(&all(&tmp.path().join("one")));
    let b = tar_of(&all(&tmp.path().join("two")));
    assert_eq!(a, b);
    assert_eq!(a.len() % 512, 0);
}

/// GNU tar reads what we write: long names, verbatim link targets,
/// hardlinks, modes, owner 0 and the fixed mtime.
#[test]
fn gnu_tar_lists_what_we_write() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    tree(&src);
    let archive = tmp.path().join("a.tar");
    fs::write(&archive, tar_of(&all(&src))).unwrap();
    let out = std::process::Command::new("tar")
        .args(["--numeric-owner", "--full-time", "-tvf"])
        .arg(&archive)
        .env("TZ", "UTC")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listing = String::from_utf8_lossy(&out.stdout);
    let long = "n".repeat(150);
    let line = listing
        .lines()
        .find(|l| l.ends_with(&format!(" {long}")))
        .unwrap_or_else(|| panic!("no line for the long name in {listing}"));
    assert!(line.starts_with("-rw-r--r-- 0/0 "), "{line}");
    assert!(line.contains(" 4 2000-01-01 00:00:00 "), "{line}");
    assert!(
        listing.contains(&format!("long-link -> ./{long}")),
        "{listing}"
    );
    assert!(listing.contains("link -> ./b//c/file"), "{listing}");
    assert!(listing.contains("z-hard link to b/c/file"), "{listing}");
    assert!(listing.contains("-rwxr-xr-x 0/0"), "{listing}");
    assert!(listing.contains(" empty/\n"), "{listing}");
}

fn opts(level: i32, avg: u64, threads: usize) -> PackOptions {
    PackOptions {
        params: Params {
            level,
            window_log: None,
        },
        sizes: Sizes::from_avg(avg),
        limit: u64::MAX,
        threads,
    }
}

#[test]
fn chunks_concatenate_to_the_zstd_stream() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    tree(&src);
    // Incompressible content so that small chunks stay small.
    let mut x = 1u64;
    let noise: Vec<u8> = (0..300_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    fs::write(src.join("noise"), &noise).unwrap();
    let out = tmp.path().join("out");
    fs::create_dir_all(&out).unwrap();
    let plan = all(&src);
    let opts = opts(3, 16 << 10, 2);
    let mut seen = Vec::new();
    let packed = pack(
        &plan,
        opts,
        &chunks::no_reuse,
        None,
        &out,
        &|i| format!("k.part{i:03}"),
        &mut |c| {
            seen.push(c.name.clone());
            c.write()
        },
        &mut |_| {},
    )
    .unwrap();
    assert!(packed.chunks.len() >= 3, "{:?}", packed.chunks);
    assert_eq!(seen.len(), packed.chunks.len());
    let mut stream = Vec::new();
    let mut raw_total = 0;
    for (i, c) in packed.chunks.iter().enumerate() {
        assert_eq!(c.index, i);
        let bytes = fs::read(&c.path).unwrap();
        assert_eq!(bytes.len() as u64, c.size);
        assert!(c.raw_size <= opts.sizes.max);
        assert_eq!(hex::encode(&Sha256::digest(&bytes)), c.sha256);
        // Each chunk is a frame of its own.
        let raw = zstd::decode_all(&bytes[..]).unwrap();
        assert_eq!(raw.len() as u64, c.raw_size);
        assert_eq!(hex::encode(&Sha256::digest(&raw)), c.raw_sha256);
        raw_total += c.raw_size;
        stream.extend(bytes);
    }
    assert_eq!(stream.len() as u64, packed.compressed);
    let tar = zstd::decode_all(&stream[..]).unwrap();
    assert_eq!(tar, tar_of(&plan));
    assert_eq!(hex::encode(&Sha256::digest(&tar)), packed.tar.sha256);
    assert_eq!(tar.len() as u64, packed.tar.size);
    assert_eq!(raw_total, packed.tar.size);
    assert_eq!(packed.index.entries.len(), plan.items.len());

    // One worker or four: the same chunks.
    let out1 = tmp.path().join("out1");
    fs::create_dir_all(&out1).unwrap();
    let one = pack(
        &plan,
        PackOptions { threads: 1, ..opts },
        &chunks::no_reuse,
        None,
        &out1,
        &|i| format!("k.part{i:03}"),
        &mut |_| Ok(()),
        &mut |_| {},
    )
    .unwrap();
    let digests = |p: &Packed| {
        p.chunks
            .iter()
            .map(|c| c.sha256.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(digests(&one), digests(&packed));
}

#[test]
fn a_failing_consumer_stops_the_pack_with_its_error() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    tree(&src);
    fs::write(src.join("zeros"), vec![0u8; 100_000]).unwrap();
    let err = pack(
        &all(&src),
        opts(1, 1024, 1),
        &chunks::no_reuse,
        None,
        tmp.path(),
        &|i| format!("p{i}"),
        &mut |c| {
            if c.index == 1 {
                bail!("git refused chunk {}", c.name)
            } else {
                Ok(())
            }
        },
        &mut |_| {},
    )
    .unwrap_err();
    assert_eq!(format!("{err:#}"), "git refused chunk p1");
}

#[test]
fn special_files_are_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    fs::write(tmp.path().join("ok"), "x").unwrap();
    let fifo = tmp.path().join("pipe");
    let c = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let err = plan_tree(tmp.path(), false, &Rules::all()).unwrap_err();
    assert_eq!(crate::exit::code_of(&err), Code::Unsafe);
    assert!(err.to_string().contains("pipe"), "{err}");
    // Excluded, it is no longer a problem.
    let rules = Rules {
        exclude: &|r| r == "pipe",
        ..Rules::all()
    };
    let p = plan_tree(tmp.path(), false, &rules).unwrap();
    assert_eq!(p.items.len(), 1);
}

#[test]
fn selected_files_bring_their_directories() {
    let tmp = tempfile::tempdir().unwrap();
    tree(tmp.path());
    let rules = Rules {
        include: &|r| r == "b/c/file",
        ..Rules::all()
    };
    let p = plan_tree(tmp.path(), false, &rules).unwrap();
    let names: Vec<&[u8]> = p.items.iter().map(|i| i.rel.as_slice()).collect();
    assert_eq!(names, [&b"b"[..], b"b/c", b"b/c/file"]);
}

/// The walk selects exactly what `CacheManifest::selects` says, except
/// under an excluded directory (not read), plus the directories above a
/// selected entry, whatever the globs prune.
#[test]
fn plan_selects_what_the_manifest_selects() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    tree(&src);
    for rel in [
        "lib/a/x/f",
        "lib/a/y/f",
        "lib/b/x/f",
        "lib/b/x/g.tmp",
        "bin/t.tmp",
        "bin/t",
    ] {
        fs::create_dir_all(src.join(rel).parent().unwrap()).unwrap();
        fs::write(src.join(rel), rel).unwrap();
    }
    let every: Vec<String> = all(&src)
        .items
        .iter()
        .map(|i| String::from_utf8_lossy(&i.rel).into_owned())
        .collect();
    let repo = crate::repo::Repo {
        root: tmp.path().to_path_buf(),
        git_dir: tmp.path().join(".git"),
    };
    fs::create_dir_all(repo.manifests_dir()).unwrap();
    for globs in [
        "",
        "include = [\"lib/*/x\", \"bin\", \"b/c\"]\nexclude = [\"**/*.tmp\", \"lib/b\"]\n",
        "include = [\"**/f\"]\n",
        "exclude = [\"b\", \"link\"]\n",
    ] {
        let text = format!(
            "[pack]\nroot = \"{}\"\n{globs}[restore]\npath = \"d\"\n",
            src.display()
        );
        fs::write(repo.manifests_dir().join("t.toml"), text).unwrap();
        let m = crate::cache::manifests::load(&repo, "t").unwrap();
        let mut want: BTreeSet<String> = BTreeSet::new();
        let under_excluded = |rel: &str| {
            rel.match_indices('/')
                .any(|(i, _)| m.exclude.iter().any(|g| g.matches(&rel[..i])))
        };
        for rel in every.iter().filter(|r| m.selects(r) && !under_excluded(r)) {
            want.insert(rel.clone());
            for (i, _) in rel.match_indices('/') {
                want.insert(rel[..i].to_string());
            }
        }
        let got: Vec<String> = plan(&m)
            .unwrap()
            .items
            .iter()
            .map(|i| String::from_utf8_lossy(&i.rel).into_owned())
            .collect();
        assert!(!want.is_empty(), "{globs}");
        assert_eq!(got, want.into_iter().collect::<Vec<_>>(), "{globs}");
    }
}

#[test]
fn globs_prune_directories() {
    let g = Glob::new("lib/rustlib/*/lib").unwrap();
    assert!(could_contain(&g, "lib"));
    assert!(could_contain(&g, "lib/rustlib"));
    assert!(could_contain(&g, "lib/rustlib/x86_64/lib"));
    assert!(could_contain(&g, "lib/rustlib/x86_64/lib/deep"));
    assert!(!could_contain(&g, "share"));
    assert!(!could_contain(&g, "lib/other"));
    assert!(could_contain(&Glob::new("**/*.so").unwrap(), "any/where"));
}

/// The digests come from the one read that feeds the tar: every file's
/// index digest is its content's sha256 and every entry's range is its
/// place in the tar, for empty files, files across the digest thread's
/// blocks, and files that end exactly on a block, in generated trees.
#[test]
fn one_read_feeds_the_tar_digest_and_every_file_digest() {
    let mut rng = crate::test_rng::Rng(27);
    for case in 0..8 {
        let tmp = tempfile::tempdir().unwrap();
        let n = 1 + rng.below(12) as usize;
        for i in 0..n {
            let len = match rng.below(5) {
                0 => 0,
                1 => rng.below(600) as usize,
                2 => FEED_BLOCK - 512 * (1 + rng.below(3) as usize),
                3 => FEED_BLOCK + rng.below(5000) as usize,
                _ => rng.below(2 * FEED_BLOCK as u64) as usize,
            };
            let mut bytes = vec![i as u8; len];
            if let Some(last) = bytes.last_mut() {
                *last = rng.next() as u8;
            }
            fs::write(tmp.path().join(format!("f{i:02}")), bytes).unwrap();
        }
        let plan = all(tmp.path());
        let mut tar = Vec::new();
        let (digest, index) = write_tar_indexed(&plan, &mut tar, &mut |_| {}).unwrap();
        assert_eq!(
            digest.sha256,
            hex::encode(&Sha256::digest(&tar)),
            "case {case}"
        );
        assert_eq!(digest.size, tar.len() as u64);
        assert_eq!(tar_digest(&plan, &mut |_| {}).unwrap(), digest);
        for e in index.entries.iter().filter(|e| e.kind == files::Kind::File) {
            let content = fs::read(tmp.path().join(std::ffi::OsStr::from_bytes(&e.path))).unwrap();
            assert_eq!(
                e.sha256,
                Some(Sha256::digest(&content).into()),
                "case {case}"
            );
            let tail = &tar[(e.end - e.size.div_ceil(512) * 512) as usize..];
            assert_eq!(&tail[..content.len()], &content[..], "case {case}");
        }
    }
}
