//! Tricky source trees for cache tests, and a strict equality check between two trees.
//!
//! `make_tricky_tree` builds what real artifacts contain and naive archivers
//! get wrong: executables, empty directories, relative (and dangling)
//! symlinks, hardlinks, names longer than tar's 100-byte field, unicode and
//! spaces, and optionally one file over 200 MB that crosses chunk
//! boundaries. `assert_same_tree` compares content, permission bits, link
//! targets and hardlink identity, and lists every difference it finds.

use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};

/// Size of the big file: over 200 MB, so that with 99 MiB chunks its
/// (incompressible) bytes span three chunks.
pub const BIG_FILE_BYTES: u64 = 210 * 1000 * 1000;

/// A name component of 120 bytes: longer than tar's 100-byte name field.
pub fn long_component() -> String {
    format!("long-name-{}", "x".repeat(110))
}

/// Builds the tricky tree under `dir` (created if missing). With `big`,
/// adds `big/random.bin` of `BIG_FILE_BYTES` pseudo-random bytes.
pub fn make_tricky_tree(dir: &Path, big: bool) {
    fs::create_dir_all(dir).unwrap();
    let w = |rel: &str, content: &[u8], mode: u32| {
        let p = dir.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, content).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
    };
    w("plain.txt", b"plain text\n", 0o644);
    w("empty-file", b"", 0o644);
    w("bin/tool", b"#!/bin/sh\necho tool\n", 0o755);
    w("bin/private-tool", b"#!/bin/sh\necho private\n", 0o700);
    w("secret.key", b"not really secret\n", 0o600);
    w("read-only.txt", b"read only\n", 0o444);
    w("dir/nested/deep.txt", b"deep\n", 0o644);
    w("name with spaces.txt", b"spaces\n", 0o644);
    w("-leading-dash", b"dash\n", 0o644);
    w(
        "ünïcødé/日本語ファイル.txt",
        "こんにちは\n".as_bytes(),
        0o644,
    );
    w("emoji-🦀.rs", b"fn main() {}\n", 0o644);
    // Binary content with every byte value, and a NUL-heavy block.
    let all: Vec<u8> = (0..=255u8).cycle().take(64 * 1024).collect();
    w("data/all-bytes.bin", &all, 0o644);
    w("data/zeros.bin", &vec![0u8; 200 * 1024], 0o644);
    // Sorting traps: `a-b` sorts between the directory `a` and `a/b`.
    w("a/b", b"a/b\n", 0o644);
    w("a-b", b"a-b\n", 0o644);

    // Names longer than 100 bytes: a long file name, and a long directory
    // name holding a file (the full path is over 250 bytes).
    let long = long_component();
    w(&format!("long/{long}.txt"), b"long name\n", 0o644);
    w(&format!("long/{long}/{long}/inner.txt"), b"inner\n", 0o755);

    // Empty directories, one with unusual permissions.
    fs::create_dir_all(dir.join("empty")).unwrap();
    fs::create_dir_all(dir.join("dir/empty-inner")).unwrap();
    fs::create_dir_all(dir.join("locked-dir")).unwrap();
    fs::set_permissions(dir.join("locked-dir"), fs::Permissions::from_mode(0o750)).unwrap();

    // Relative symlinks: to a file, up and across, to a directory, dangling,
    // and one with a target longer than 100 bytes.
    symlink("plain.txt", dir.join("link-to-plain")).unwrap();
    symlink("../dir/nested/deep.txt", dir.join("bin/link-up")).unwrap();
    symlink("dir", dir.join("link-to-dir")).unwrap();
    symlink("does-not-exist", dir.join("dangling-link")).unwrap();
    symlink(
        format!("long/{long}/{long}/inner.txt"),
        dir.join("link-long-target"),
    )
    .unwrap();

    // Hardlinks: a pair in different directories, and a third name that is
    // long (its link target in the tar is the first name in path order).
    fs::hard_link(dir.join("bin/tool"), dir.join("dir/tool-hardlink")).unwrap();
    fs::hard_link(
        dir.join("data/all-bytes.bin"),
        dir.join(format!("long/{long}/all-bytes-hardlink.bin")),
    )
    .unwrap();
    fs::hard_link(dir.join("plain.txt"), dir.join("zz-plain-hardlink")).unwrap();

    if big {
        write_pseudo_random(&dir.join("big/random.bin"), BIG_FILE_BYTES, 0x5eed);
    }
}

/// Writes `len` bytes that zstd cannot shrink (xorshift64*, never
/// repeating), so the compressed file is as big as the file itself.
pub fn write_pseudo_random(path: &Path, len: u64, seed: u64) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut f = std::io::BufWriter::with_capacity(1 << 20, fs::File::create(path).unwrap());
    let mut state = seed | 1;
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        for word in buf.chunks_exact_mut(8) {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            word.copy_from_slice(&state.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
        }
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n]).unwrap();
        left -= n as u64;
    }
    f.flush().unwrap();
}

/// What one path is, for comparison.
#[derive(Debug, PartialEq, Eq)]
enum Node {
    Dir {
        mode: u32,
    },
    File {
        mode: u32,
        size: u64,
        sha256: String,
    },
    Symlink {
        target: PathBuf,
    },
}

struct Scan {
    nodes: BTreeMap<String, Node>,
    /// Paths of regular files grouped by inode, for groups of two or more.
    hardlinks: Vec<Vec<String>>,
}

fn scan(root: &Path) -> Scan {
    let mut nodes = BTreeMap::new();
    let mut inodes: BTreeMap<(u64, u64), Vec<String>> = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        for entry in fs::read_dir(&dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        {
            let entry = entry.unwrap();
            let rel = rel.join(entry.file_name());
            let path = root.join(&rel);
            let key = rel.to_string_lossy().into_owned();
            let md = fs::symlink_metadata(&path).unwrap();
            let ft = md.file_type();
            let node = if ft.is_dir() {
                stack.push(rel.clone());
                Node::Dir {
                    mode: md.mode() & 0o7777,
                }
            } else if ft.is_symlink() {
                Node::Symlink {
                    target: fs::read_link(&path).unwrap(),
                }
            } else if ft.is_file() {
                if md.nlink() > 1 {
                    inodes
                        .entry((md.dev(), md.ino()))
                        .or_default()
                        .push(key.clone());
                }
                Node::File {
                    mode: md.mode() & 0o7777,
                    size: md.len(),
                    sha256: file_sha256(&path),
                }
            } else {
                panic!(
                    "{} is neither a file, a directory nor a symlink",
                    path.display()
                );
            };
            nodes.insert(key, node);
        }
    }
    let mut hardlinks: Vec<Vec<String>> = inodes
        .into_values()
        .filter(|g| g.len() > 1)
        .map(|mut g| {
            g.sort();
            g
        })
        .collect();
    hardlinks.sort();
    Scan { nodes, hardlinks }
}

fn file_sha256(path: &Path) -> String {
    let mut f = fs::File::open(path).unwrap();
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// What a `snapshot` records of each path beyond its kind, permission bits,
/// symlink target and file content (size and sha256).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Detail {
    /// Directory mtimes (seconds). Off where staging beside a directory, or
    /// a tar without directory entries, changes them legitimately.
    pub dir_mtimes: bool,
    /// File mtimes (seconds).
    pub file_mtimes: bool,
    /// The nanoseconds of every recorded mtime too.
    pub mtime_nsec: bool,
    /// File link counts (hardlinks).
    pub nlink: bool,
}

impl Detail {
    /// Mtimes (seconds) of files and directories and link counts: what
    /// an extraction must reproduce.
    pub const EXTRACTED: Detail = Detail {
        dir_mtimes: true,
        file_mtimes: true,
        mtime_nsec: false,
        nlink: true,
    };
    /// File mtimes to the nanosecond, no directory mtimes: what a refused
    /// or contained install must leave untouched.
    pub const UNTOUCHED: Detail = Detail {
        dir_mtimes: false,
        file_mtimes: true,
        mtime_nsec: true,
        nlink: false,
    };
}

/// Every path under `root` (relative, as the key) with what it is: kind,
/// permission bits, link target or content, and what `detail` asks for.
/// Two snapshots are equal exactly when nothing they record changed.
pub fn snapshot(root: &Path, detail: Detail) -> BTreeMap<String, String> {
    let mtime = |m: &fs::Metadata| {
        if detail.mtime_nsec {
            format!(" mtime {}.{}", m.mtime(), m.mtime_nsec())
        } else {
            format!(" mtime {}", m.mtime())
        }
    };
    let mut out = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        for e in fs::read_dir(&dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display())) {
            let rel = rel.join(e.unwrap().file_name());
            let p = root.join(&rel);
            let m = fs::symlink_metadata(&p).unwrap();
            let mode = m.mode() & 0o7777;
            let mut what = if m.file_type().is_symlink() {
                format!("link -> {}", fs::read_link(&p).unwrap().display())
            } else if m.is_dir() {
                stack.push(rel.clone());
                format!("dir {mode:o}")
            } else {
                format!("file {mode:o}")
            };
            if m.is_dir() && detail.dir_mtimes || m.is_file() && detail.file_mtimes {
                what.push_str(&mtime(&m));
            }
            if m.is_file() {
                if detail.nlink {
                    what.push_str(&format!(" nlink {}", m.nlink()));
                }
                what.push_str(&format!(" {} bytes {}", m.len(), file_sha256(&p)));
            }
            out.insert(rel.to_string_lossy().into_owned(), what);
        }
    }
    out
}

/// Every regular file under `dir` with its bytes and mtime, sorted (a
/// missing `dir` has none): a warm run must change none of them.
pub fn files_with_mtimes(dir: &Path) -> Vec<(PathBuf, Vec<u8>, std::time::SystemTime)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).into_iter().flatten() {
            let p = e.unwrap().path();
            let meta = fs::symlink_metadata(&p).unwrap();
            if meta.is_dir() {
                stack.push(p);
            } else if meta.is_file() {
                out.push((p.clone(), fs::read(&p).unwrap(), meta.modified().unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// Panics, listing every difference, unless the trees under `a` and `b` hold
/// the same paths with the same kind, content, permission bits (files and
/// directories), symlink targets and hardlink groups. The roots themselves
/// are not compared.
pub fn assert_same_tree(a: &Path, b: &Path) {
    let sa = scan(a);
    let sb = scan(b);
    let mut diffs = Vec::new();
    for (path, na) in &sa.nodes {
        match sb.nodes.get(path) {
            None => diffs.push(format!("only in {}: {path}", a.display())),
            Some(nb) if nb != na => diffs.push(format!("{path}: {na:?} != {nb:?}")),
            Some(_) => {}
        }
    }
    for path in sb.nodes.keys() {
        if !sa.nodes.contains_key(path) {
            diffs.push(format!("only in {}: {path}", b.display()));
        }
    }
    if sa.hardlinks != sb.hardlinks {
        diffs.push(format!(
            "hardlink groups differ:\n  {}: {:?}\n  {}: {:?}",
            a.display(),
            sa.hardlinks,
            b.display(),
            sb.hardlinks
        ));
    }
    assert!(
        diffs.is_empty(),
        "{} and {} differ:\n{}",
        a.display(),
        b.display(),
        diffs.join("\n")
    );
    assert!(
        !sa.nodes.is_empty(),
        "{} is empty: nothing was compared",
        a.display()
    );
}

#[test]
fn tricky_tree_equals_itself_and_differences_are_caught() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    let b = tmp.path().join("b");
    make_tricky_tree(&a, false);
    make_tricky_tree(&b, false);
    assert_same_tree(&a, &b);
    let s = scan(&a);
    assert_eq!(s.hardlinks.len(), 3, "{:?}", s.hardlinks);
    assert!(
        s.nodes.keys().any(|k| k.len() > 250),
        "a path over 250 bytes"
    );

    // Each kind of difference is caught: mode, content, link target,
    // hardlink identity, a missing empty directory.
    type Break<'a> = (&'a str, &'a dyn Fn(&Path));
    let breaks: [Break; 5] = [
        ("mode", &|d| {
            fs::set_permissions(d.join("bin/tool"), fs::Permissions::from_mode(0o644)).unwrap()
        }),
        ("content", &|d| {
            fs::write(d.join("plain.txt"), b"plain texT\n").unwrap()
        }),
        ("link", &|d| {
            fs::remove_file(d.join("link-to-plain")).unwrap();
            symlink("./plain.txt", d.join("link-to-plain")).unwrap();
        }),
        ("hardlink", &|d| {
            let p = d.join("zz-plain-hardlink");
            let bytes = fs::read(&p).unwrap();
            fs::remove_file(&p).unwrap();
            fs::write(&p, bytes).unwrap();
        }),
        ("empty dir", &|d| fs::remove_dir(d.join("empty")).unwrap()),
    ];
    for (what, break_it) in breaks {
        let c = tmp.path().join(format!("c-{}", what.replace(' ', "-")));
        make_tricky_tree(&c, false);
        break_it(&c);
        let caught = std::panic::catch_unwind(|| assert_same_tree(&a, &c));
        assert!(caught.is_err(), "a {what} difference was not caught");
    }
}
