//! What `cache publish` puts on a branch besides the chunks: the per-file index, checked against the tar with real git, zstd and an independent tar reader.
//!
//! The index (`<key>.files.zst`) tells an incremental restore which bytes of
//! the tar hold which file, and whether a file changed. A wrong offset or
//! digest would make a restore link or skip the wrong bytes, so every line
//! is checked here against the tar itself, parsed by the `tar` crate (not by
//! our writer), on a tree of names that break naive archivers.

use crate::util::tree::{make_tricky_tree, write_pseudo_random};
use crate::util::{TestEnv, run, show};
use sha2::{Digest, Sha256};
use std::ffi::OsStr;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use warmstart::cache::format::files::{Index, Kind};

/// A work repository publishing `src` as cache `name` (key `<literal>`) to `origin.git`.
pub(crate) fn setup(env: &TestEnv, src: &Path, name: &str, literal: &str) -> PathBuf {
    setup_in(env, "work", src, name, literal, "")
}

/// `setup` in the work repository `rel`, with `extra` manifest lines.
pub(crate) fn setup_in(
    env: &TestEnv,
    rel: &str,
    src: &Path,
    name: &str,
    literal: &str,
    extra: &str,
) -> PathBuf {
    if !env.join("origin.git").exists() {
        env.bare_remote("origin.git");
    }
    let work = env.work_repo(rel);
    env.git(rel, ["remote", "add", "origin", "../origin.git"]);
    write_manifest(&work, name, src, literal, extra);
    work
}

pub(crate) fn write_manifest(work: &Path, name: &str, src: &Path, literal: &str, extra: &str) {
    std::fs::create_dir_all(work.join("cache-manifests")).unwrap();
    std::fs::write(
        work.join(format!("cache-manifests/{name}.toml")),
        format!(
            "[[key]]\nname = \"v\"\nliteral = \"{literal}\"\n\n[pack]\nroot = \"{}\"\n\n[restore]\npath = \"restored\"\n{extra}",
            src.display()
        ),
    )
    .unwrap();
}

pub(crate) fn publish_json(env: &TestEnv, work: &str, name: &str) -> serde_json::Value {
    let mut cmd = env.xtask_in(work);
    cmd.args(["cache", "publish", name, "--json"]);
    let r = run(&mut cmd).ok();
    serde_json::from_str(&r.stdout())
        .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", show(&r.out)))
}

/// The bytes of `rev:path` in the bare repository `bare`, through `git cat-file`.
pub(crate) fn blob(env: &TestEnv, bare: &str, spec: &str) -> Vec<u8> {
    let mut cmd = Command::new("git");
    cmd.current_dir(env.join(bare))
        .args(["cat-file", "blob", spec]);
    env.isolate(&mut cmd);
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "git cat-file {spec}: {}", show(&out));
    out.stdout
}

/// `zstd -d` of `bytes`, by the zstd command line tool.
pub(crate) fn unzstd(bytes: &[u8]) -> Vec<u8> {
    let mut child = Command::new("zstd")
        .args(["-d", "-c", "-q"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("zstd is installed by tools/test.sh");
    let mut stdin = child.stdin.take().unwrap();
    let input = bytes.to_vec();
    let feeder = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap().unwrap();
    assert!(out.status.success(), "zstd -d: {}", show(&out));
    out.stdout
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The branch's warmstart.json.
pub(crate) fn branch_json(env: &TestEnv, branch: &str) -> serde_json::Value {
    let bytes = blob(
        env,
        "origin.git",
        &format!("refs/heads/{branch}:warmstart.json"),
    );
    serde_json::from_slice(&bytes).unwrap()
}

/// The names in the branch's root tree.
pub(crate) fn tree_names(env: &TestEnv, branch: &str) -> Vec<String> {
    env.git(
        "origin.git",
        ["ls-tree", "--name-only", &format!("refs/heads/{branch}")],
    )
    .lines()
    .map(str::to_string)
    .collect()
}

/// Names a tricky tree lacks: a newline, a byte that is not UTF-8, a
/// 200-byte component, a symlink with spaces, a hardlink to a long name.
fn add_odd_names(src: &Path) {
    std::fs::write(src.join("new\nline.txt"), b"newline\n").unwrap();
    std::fs::write(
        src.join(OsStr::from_bytes(b"latin1-\xe9t\xe9.txt")),
        b"latin1\n",
    )
    .unwrap();
    let long = "y".repeat(200);
    std::fs::write(src.join(&long), vec![b'z'; 70_000]).unwrap();
    std::os::unix::fs::symlink("name with spaces.txt", src.join("a link with spaces")).unwrap();
    std::fs::hard_link(src.join(&long), src.join("zz-hard-to-long")).unwrap();
    std::fs::create_dir_all(src.join("another/empty dir")).unwrap();
}

fn pad512(n: u64) -> u64 {
    n.div_ceil(512) * 512
}

/// Every index line equals what an independent reader finds in the tar at
/// that place: kind, mode, size, path, target, content digest, and the
/// entry's bytes `offset..end` read alone as a tar give that entry.
fn check_index_against_tar(index: &Index, tar_bytes: &[u8]) {
    let mut archive = tar::Archive::new(tar_bytes);
    let mut expected_start = 0u64;
    let mut n = 0;
    for (i, entry) in archive.entries().unwrap().enumerate() {
        let mut entry = entry.unwrap();
        let line = index
            .entries
            .get(i)
            .unwrap_or_else(|| panic!("the index has no line {i}"));
        let header_at = entry.raw_header_position();
        let data_at = entry.raw_file_position();
        let size = entry.header().size().unwrap();
        let path = entry.path_bytes().into_owned();
        let path = path.strip_suffix(b"/").unwrap_or(&path).to_vec();
        let what = String::from_utf8_lossy(&path).into_owned();
        assert_eq!(line.path, path, "line {i}");
        assert_eq!(line.offset, expected_start, "{what}: offset");
        assert!(line.offset <= header_at, "{what}: starts after its header");
        assert_eq!(line.end, pad512(data_at + size), "{what}: end");
        assert_eq!(
            line.mode,
            entry.header().mode().unwrap() & 0o7777,
            "{what}: mode"
        );
        let kind = match entry.header().entry_type() {
            tar::EntryType::Directory => Kind::Dir,
            tar::EntryType::Regular => Kind::File,
            tar::EntryType::Symlink => Kind::Symlink,
            tar::EntryType::Link => Kind::Hardlink,
            other => panic!("{what}: unexpected entry type {other:?}"),
        };
        assert_eq!(line.kind, kind, "{what}: kind");
        let target = entry.link_name_bytes().map(|t| t.into_owned());
        assert_eq!(line.target, target, "{what}: target");
        let mut content = Vec::new();
        entry.read_to_end(&mut content).unwrap();
        if kind == Kind::File {
            assert_eq!(line.size, size, "{what}: size");
            let digest: [u8; 32] = Sha256::digest(&content).into();
            assert_eq!(line.sha256, Some(digest), "{what}: sha256");
        } else {
            assert_eq!((line.size, line.sha256), (0, None), "{what}");
        }
        // The entry's bytes alone are a tar of that one entry.
        let mut alone = tar_bytes[line.offset as usize..line.end as usize].to_vec();
        alone.extend_from_slice(&[0u8; 1024]);
        let mut one = tar::Archive::new(&alone[..]);
        let mut entries = one.entries().unwrap();
        let first = entries.next().unwrap().unwrap();
        let first_path = first.path_bytes().into_owned();
        assert_eq!(
            first_path.strip_suffix(b"/").unwrap_or(&first_path),
            &path[..],
            "{what}: its bytes alone"
        );
        drop(first);
        assert!(entries.next().is_none(), "{what}: more than one entry");
        expected_start = line.end;
        n += 1;
    }
    assert_eq!(
        n,
        index.entries.len(),
        "the index lists entries the tar lacks"
    );
    // After the last entry: the two zero blocks that end the archive.
    assert_eq!(expected_start + 1024, tar_bytes.len() as u64);
}

#[test]
fn the_file_index_matches_the_tar_byte_for_byte() {
    let env = TestEnv::new();
    let src = env.join("src");
    make_tricky_tree(&src, false);
    add_odd_names(&src);
    setup(&env, &src, "idx", "one");
    let j = publish_json(&env, "work", "idx");
    assert_eq!(j["status"], "published", "{j}");
    let key = j["key"].as_str().unwrap().to_string();
    let branch = j["branch"].as_str().unwrap().to_string();

    let manifest = branch_json(&env, &branch);
    let entry = &manifest["keys"][&key];
    let index_file = entry["index"]["file"].as_str().unwrap();
    assert_eq!(index_file, format!("{key}.files.zst"));
    // Stored in parts, whose concatenation is the index file.
    let parts: Vec<String> = entry["index_parts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["file"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(parts[0], format!("{key}.files.zst.part000"));
    let compressed: Vec<u8> = parts
        .iter()
        .flat_map(|p| blob(&env, "origin.git", &format!("refs/heads/{branch}:{p}")))
        .collect();
    assert_eq!(entry["index"]["size"], compressed.len() as u64);
    assert_eq!(entry["index"]["sha256"], hex(&Sha256::digest(&compressed)));
    let text = String::from_utf8(unzstd(&compressed)).expect("the index is text");
    let index = Index::parse(&text).unwrap();
    assert_eq!(index.entries.len() as u64, entry["files"].as_u64().unwrap());

    // SHA256SUMS names exactly the chunks (what today's restorers require).
    let sums = String::from_utf8(blob(
        &env,
        "origin.git",
        &format!("refs/heads/{branch}:SHA256SUMS"),
    ))
    .unwrap();
    assert!(!sums.contains(".files.zst"), "{sums}");
    let chunks: Vec<String> = entry["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["file"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(sums.lines().count(), chunks.len(), "{sums}");
    let names = tree_names(&env, &branch);
    assert!(parts.iter().all(|p| names.contains(p)), "{names:?}");
    assert!(!names.contains(&index_file.to_string()), "{names:?}");

    let mut stream = Vec::new();
    for c in &chunks {
        stream.extend(blob(
            &env,
            "origin.git",
            &format!("refs/heads/{branch}:{c}"),
        ));
    }
    let tar_bytes = unzstd(&stream);
    assert_eq!(hex(&Sha256::digest(&tar_bytes)), entry["tar_sha256"]);
    check_index_against_tar(&index, &tar_bytes);
    let odd: Vec<&[u8]> = vec![
        b"new\nline.txt",
        b"latin1-\xe9t\xe9.txt",
        b"another/empty dir",
    ];
    for name in odd {
        assert!(
            index.entries.iter().any(|e| e.path == name),
            "{} is not in the index",
            String::from_utf8_lossy(name)
        );
    }
    assert!(index.entries.iter().any(
        |e| e.kind == Kind::Hardlink && e.target.as_deref() == Some("y".repeat(200).as_bytes())
    ));
}

/// The index leaves the branch with its key, and stays with the keys kept.
#[test]
fn the_file_index_goes_and_stays_with_its_key() {
    let env = TestEnv::new();
    let src = env.join("src");
    make_tricky_tree(&src, false);
    let work = setup(&env, &src, "idx", "one");
    let first = publish_json(&env, "work", "idx");
    let branch = first["branch"].as_str().unwrap().to_string();
    let one = first["key"].as_str().unwrap().to_string();
    std::fs::write(src.join("plain.txt"), b"changed\n").unwrap();
    write_manifest(&work, "idx", &src, "two", "");
    let second = publish_json(&env, "work", "idx");
    let two = second["key"].as_str().unwrap().to_string();
    let names = tree_names(&env, &branch);
    for k in [&one, &two] {
        assert!(
            names.contains(&format!("{k}.files.zst.part000")),
            "{names:?}"
        );
    }
    let mut cmd = env.xtask_in("work");
    cmd.args(["cache", "prune", "idx", "--keep", "1", "--json"]);
    let r = run(&mut cmd).ok();
    assert!(r.stdout().contains(&one), "{}", show(&r.out));
    let names = tree_names(&env, &branch);
    assert!(
        !names
            .iter()
            .any(|n| n.starts_with(&format!("{one}.files.zst"))),
        "{names:?}"
    );
    assert!(
        names.contains(&format!("{two}.files.zst.part000")),
        "{names:?}"
    );
    let manifest = branch_json(&env, &branch);
    assert!(manifest["keys"].get(&one).is_none());
    assert_eq!(
        manifest["keys"][&two]["index"]["file"],
        format!("{two}.files.zst")
    );
}

/// Chunk files and blob ids of `key` on the branch, in order.
fn chunk_blobs(env: &TestEnv, branch: &str, key: &str) -> Vec<(String, String)> {
    let manifest = branch_json(env, branch);
    let listing = env.git("origin.git", ["ls-tree", &format!("refs/heads/{branch}")]);
    let oid_of = |file: &str| {
        listing
            .lines()
            .find(|l| l.ends_with(&format!("\t{file}")))
            .and_then(|l| l.split_whitespace().nth(2))
            .unwrap_or_else(|| panic!("{file} is not on {branch}"))
            .to_string()
    };
    manifest["keys"][key]["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let file = c["file"].as_str().unwrap().to_string();
            let oid = oid_of(&file);
            (file, oid)
        })
        .collect()
}

/// Bytes of pack files in a bare repository: with `receive.unpackLimit
/// = 1` every push lands as one pack, so the growth is what was pushed.
fn pack_bytes(env: &TestEnv, bare: &str) -> u64 {
    std::fs::read_dir(env.join(bare).join("objects/pack"))
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".pack"))
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

/// A tree of `files` files of `size` pseudo-random bytes each (nothing to
/// compress: the bytes pushed are the bytes packed).
fn random_tree(src: &Path, files: usize, size: u64) {
    for i in 0..files {
        write_pseudo_random(
            &src.join(format!("d{:02}/f{i:04}.bin", i / 20)),
            size,
            i as u64 + 1,
        );
    }
}

/// Same tree, same chunk blobs: two clones that share nothing but the
/// remote publish two keys of one tree, and every chunk of the second is
/// the blob of the first (git stores and sends it once).
#[test]
fn the_same_tree_gives_the_same_chunk_blobs_from_any_clone() {
    let env = TestEnv::new();
    let src = env.join("src");
    make_tricky_tree(&src, false);
    random_tree(&src.join("r"), 8, 300_000);
    let extra = "[publish]\nchunk_avg = \"64KiB\"\n";
    setup_in(&env, "one", &src, "det", "a", extra);
    setup_in(&env, "two", &src, "det", "b", extra);
    let a = publish_json(&env, "one", "det");
    let b = publish_json(&env, "two", "det");
    assert_eq!(a["tar_sha256"], b["tar_sha256"]);
    let branch = a["branch"].as_str().unwrap();
    let ka = chunk_blobs(&env, branch, a["key"].as_str().unwrap());
    let kb = chunk_blobs(&env, branch, b["key"].as_str().unwrap());
    assert!(ka.len() >= 20, "{} chunks", ka.len());
    let ids = |k: &[(String, String)]| k.iter().map(|(_, o)| o.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&ka), ids(&kb));
    // Every chunk is one frame, and the chunks' raw slices tile the tar.
    let manifest = branch_json(&env, branch);
    let entry = &manifest["keys"][a["key"].as_str().unwrap()];
    let frames = &entry["frames"];
    assert_eq!(frames["chunker"], "fastcdc-2020");
    assert_eq!(frames["avg_size"], 64 << 10);
    assert_eq!(frames["level"], 3);
    let raw: u64 = entry["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["raw_size"].as_u64().unwrap())
        .sum();
    assert_eq!(raw, entry["tar_size"].as_u64().unwrap());
    let (file, oid) = &ka[ka.len() / 2];
    let one = blob(&env, "origin.git", oid);
    let c = entry["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["file"] == file.as_str())
        .unwrap();
    let raw = unzstd(&one);
    assert_eq!(raw.len() as u64, c["raw_size"].as_u64().unwrap());
    assert_eq!(hex(&Sha256::digest(&raw)), c["raw_sha256"]);
}

/// One file changed early in a 20 MB tree: a publish from a fresh clone
/// keeps most chunk blobs and pushes a small fraction of a full publish.
#[test]
fn an_early_change_reuses_most_chunks_and_pushes_little() {
    let env = TestEnv::new();
    let src = env.join("src");
    random_tree(&src, 200, 100_000);
    let extra = "[publish]\nchunk_avg = \"256KiB\"\n";
    setup_in(&env, "one", &src, "inc", "a", extra);
    let before = pack_bytes(&env, "origin.git");
    let a = publish_json(&env, "one", "inc");
    let full = pack_bytes(&env, "origin.git") - before;
    // Same size, new content, in the third file of the tar.
    write_pseudo_random(&src.join("d00/f0002.bin"), 100_000, 999);
    setup_in(&env, "two", &src, "inc", "b", extra);
    let before = pack_bytes(&env, "origin.git");
    let b = publish_json(&env, "two", "inc");
    let pushed = pack_bytes(&env, "origin.git") - before;
    assert_eq!(b["status"], "published", "{b}");
    let branch = a["branch"].as_str().unwrap();
    let ka = chunk_blobs(&env, branch, a["key"].as_str().unwrap());
    let kb = chunk_blobs(&env, branch, b["key"].as_str().unwrap());
    let old: std::collections::BTreeSet<&String> = ka.iter().map(|(_, o)| o).collect();
    let kept = kb.iter().filter(|(_, o)| old.contains(o)).count();
    eprintln!(
        "1 of 200 files changed: {kept} of {} chunks reused; pushed {pushed} bytes after a full push of {full}",
        kb.len()
    );
    assert!(kb.len() >= 40, "{} chunks", kb.len());
    assert!(
        kept * 10 >= kb.len() * 7,
        "{kept} of {} chunks reused",
        kb.len()
    );
    // The new chunks (the two or three around the change: under a MiB)
    // and the small files, not the 13 MB of a full publish.
    assert!(full > 10_000_000, "{full}");
    assert!(pushed * 10 < full, "pushed {pushed} of {full}");
}

/// A level or chunk size the manifest cannot mean is exit 10, in one line
/// naming the setting and what it allows, and nothing is pushed.
#[test]
fn unknown_levels_and_chunk_sizes_are_refused_in_one_line() {
    let env = TestEnv::new();
    let src = env.join("src");
    make_tricky_tree(&src, false);
    let work = setup(&env, &src, "bad", "one");
    for (extra, says) in [
        (
            "[publish]\nlevel = \"tiny\"\n",
            "\"fast\" (zstd 3), \"small\" (zstd 19)",
        ),
        ("[publish]\nlevel = 22\n", "level from 1 to 19"),
        ("[publish]\nchunk_avg = \"lots\"\n", "chunk_avg"),
        (
            "[publish]\nchunk_avg = \"64MiB\"\n",
            "chunk_avg must be from 256",
        ),
    ] {
        write_manifest(&work, "bad", &src, "one", extra);
        let mut cmd = env.xtask_in("work");
        cmd.args(["cache", "publish", "bad"]);
        let r = run(&mut cmd).expect_code(10);
        let err = r.stderr();
        assert!(err.contains(says), "{extra}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{extra}: {err}");
    }
    assert!(env.git("origin.git", ["for-each-ref"]).trim().is_empty());
}

/// A re-publish from the clone that made the last one compresses only the
/// chunks that changed: the others' frames are in its cache.git, checked
/// to decode to the chunk before use, and the branch gets the same blobs.
#[test]
fn a_republish_compresses_only_what_changed() {
    let env = TestEnv::new();
    let src = env.join("src");
    random_tree(&src, 40, 50_000);
    let extra = "[publish]\nchunk_avg = \"64KiB\"\nlevel = \"small\"\n";
    setup_in(&env, "work", &src, "re", "a", extra);
    let a = publish_json(&env, "work", "re");
    write_pseudo_random(&src.join("d00/f0001.bin"), 50_000, 77);
    let mut cmd = env.xtask_in("work");
    cmd.args(["cache", "publish", "re"]);
    let r = run(&mut cmd).ok();
    let said = r.stdout();
    let n: usize = said
        .split(" not compressed again")
        .next()
        .and_then(|head| head.rsplit('(').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no reuse said: {said}"));
    let chunks = a["chunks"].as_array().unwrap().len();
    assert!(n * 10 >= chunks * 7, "{n} of {chunks} reused: {said}");
    assert!(n < chunks, "{said}");
    let branch = a["branch"].as_str().unwrap();
    let manifest = branch_json(&env, branch);
    assert_eq!(
        manifest["keys"]["re-a"]["frames"]["level"], 19,
        "{manifest}"
    );
    // What is on the branch restores: the chunks decode to the new tar.
    let entry = &manifest["keys"]["re-a"];
    let mut stream = Vec::new();
    for c in entry["chunks"].as_array().unwrap() {
        let file = c["file"].as_str().unwrap();
        stream.extend(blob(
            &env,
            "origin.git",
            &format!("refs/heads/{branch}:{file}"),
        ));
    }
    assert_eq!(hex(&Sha256::digest(unzstd(&stream))), entry["tar_sha256"]);
}
