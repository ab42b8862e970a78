//! Unit tests of the delta install: the record, the link decision against user edits, chunk selection.

use super::*;
use crate::cache::format::{Chunk, Frames};
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;

/// One entry of a hand-made tar.
#[derive(Clone)]
enum Item {
    D(String, u32),
    F(String, u32, Vec<u8>),
    L(String, String),
    H(String, String),
}

fn path_of(i: &Item) -> &str {
    match i {
        Item::D(p, _) | Item::F(p, _, _) | Item::L(p, _) | Item::H(p, _) => p,
    }
}

fn header(ty: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(ty);
    h.set_mode(mode);
    h.set_size(size);
    h.set_mtime(FIXED_MTIME);
    h
}

/// A tar as publish writes it (GNU, fixed mtime, path order), and its index.
fn tar_of(items: &[Item]) -> (Vec<u8>, Index) {
    let mut items = items.to_vec();
    items.sort_by(|a, b| path_of(a).as_bytes().cmp(path_of(b).as_bytes()));
    let mut b = tar::Builder::new(Vec::new());
    for it in &items {
        match it {
            Item::D(p, m) => {
                let mut h = header(tar::EntryType::Directory, *m, 0);
                b.append_data(&mut h, p, io::empty()).unwrap();
            }
            Item::F(p, m, data) => {
                let mut h = header(tar::EntryType::Regular, *m, data.len() as u64);
                b.append_data(&mut h, p, &data[..]).unwrap();
            }
            Item::L(p, t) => {
                let mut h = header(tar::EntryType::Symlink, 0o777, 0);
                b.append_link(&mut h, p, t).unwrap();
            }
            Item::H(p, t) => {
                let mut h = header(tar::EntryType::Link, 0o644, 0);
                b.append_link(&mut h, p, t).unwrap();
            }
        }
    }
    let tar = b.into_inner().unwrap();
    let index = index_of(&tar, &items);
    (tar, index)
}

/// The index of `tar`, from where each entry's data lies.
fn index_of(tar: &[u8], items: &[Item]) -> Index {
    let mut ar = tar::Archive::new(tar);
    let mut entries = Vec::new();
    let mut offset = 0;
    for (te, it) in ar.entries().unwrap().zip(items) {
        let te = te.unwrap();
        let end = te.raw_file_position() + te.size().div_ceil(512) * 512;
        let (kind, mode, size, sha256, target) = match it {
            Item::D(_, m) => (Kind::Dir, *m, 0, None, None),
            Item::F(_, m, d) => (
                Kind::File,
                *m,
                d.len() as u64,
                Some(Sha256::digest(d).into()),
                None,
            ),
            Item::L(_, t) => (Kind::Symlink, 0o777, 0, None, Some(t.as_bytes().to_vec())),
            Item::H(_, t) => (Kind::Hardlink, 0o644, 0, None, Some(t.as_bytes().to_vec())),
        };
        let path = path_of(it).as_bytes().to_vec();
        entries.push(Entry {
            offset,
            end,
            kind,
            mode,
            size,
            sha256,
            path,
            target,
        });
        offset = end;
    }
    Index { entries }
}

/// A key entry with chunks cut every `cut` bytes of the tar (anywhere,
/// as a content-defined chunker does), or no frames.
fn key_entry(tar: &[u8], index: &Index, cut: Option<usize>) -> (KeyEntry, Vec<(u64, u64)>) {
    let step = cut.unwrap_or(tar.len());
    let spans: Vec<(u64, u64)> = (0..tar.len())
        .step_by(step)
        .map(|s| (s as u64, (s + step).min(tar.len()) as u64))
        .collect();
    let chunks = spans
        .iter()
        .enumerate()
        .map(|(i, s)| Chunk {
            file: format!("k.tar.zst.part{i:03}"),
            size: 1,
            sha256: "0".repeat(64),
            raw_size: cut.map(|_| s.1 - s.0),
            raw_sha256: cut.map(|_| "0".repeat(64)),
        })
        .collect();
    let frames = cut.map(|c| Frames {
        chunker: crate::cache::format::CHUNKER.into(),
        min_size: 1,
        avg_size: c as u64,
        max_size: c as u64,
        zstd: "1".into(),
        level: 3,
        window_log: None,
        checksum: true,
    });
    let entry = KeyEntry {
        archive: "k.tar.zst".into(),
        compression: "zstd".into(),
        chunks,
        tar_sha256: hex::encode(&Sha256::digest(tar)),
        tar_size: tar.len() as u64,
        files: index.entries.len() as u64,
        key_parts: Vec::new(),
        source_commit: None,
        source_tree: None,
        gates: serde_json::Value::Null,
        ungated: false,
        created_at: String::new(),
        tool_version: String::new(),
        frames,
        index: None,
        index_parts: Vec::new(),
    };
    (entry, spans)
}

fn zst(index: &Index) -> NewIndex {
    NewIndex {
        bytes: zstd::encode_all(index.render().as_bytes(), 3).unwrap(),
        index: index.clone(),
    }
}

/// kind, mode, mtime, content or target of every path; hardlink groups.
fn snapshot(root: &Path) -> (BTreeMap<String, String>, Vec<Vec<String>>) {
    let mut out = BTreeMap::new();
    let mut inodes: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for e in std::fs::read_dir(root.join(&rel)).unwrap() {
            let rel = rel.join(e.unwrap().file_name());
            let p = root.join(&rel);
            let md = std::fs::symlink_metadata(&p).unwrap();
            let what = if md.is_dir() {
                stack.push(rel.clone());
                "dir".to_string()
            } else if md.file_type().is_symlink() {
                format!("-> {}", std::fs::read_link(&p).unwrap().display())
            } else {
                inodes
                    .entry(md.ino())
                    .or_default()
                    .push(rel.display().to_string());
                hex::encode(&Sha256::digest(std::fs::read(&p).unwrap()))
            };
            let mode = if md.file_type().is_symlink() {
                0
            } else {
                md.mode() & 0o7777
            };
            out.insert(
                rel.display().to_string(),
                format!("{what} {mode:o} {}", md.mtime()),
            );
        }
    }
    let mut groups: Vec<Vec<String>> = inodes.into_values().filter(|g| g.len() > 1).collect();
    groups.iter_mut().for_each(|g| g.sort());
    groups.sort();
    (out, groups)
}

fn extract(tar: &[u8], dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    crate::unpack::extract_tar(
        tar,
        dir,
        &unpack::Limits::GENEROUS,
        &unpack::Options::default(),
    )
    .unwrap();
}

/// A scratch area with the old key installed and recorded.
struct Fx {
    t: tempfile::TempDir,
    target: PathBuf,
    state: PathBuf,
    old: Index,
}

impl Fx {
    fn new(items: &[Item]) -> Fx {
        Fx::installed_then(items, false)
    }

    /// With `settled`, the record is made a racy interval after the
    /// install, so that no ctime is racy and the stat alone decides.
    fn installed_then(items: &[Item], settled: bool) -> Fx {
        let t = tempfile::tempdir().unwrap();
        let (tar, old) = tar_of(items);
        let target = t.path().join("target");
        extract(&tar, &target);
        if settled {
            std::thread::sleep(std::time::Duration::from_nanos(RACY_NS as u64 + 5_000_000));
        }
        let state = t.path().join("state");
        let tar_hex = hex::encode(&Sha256::digest(&tar));
        remember(&state, "c", &target, "k1", &tar_hex, &zst(&old), true).unwrap();
        Fx {
            t,
            target,
            state,
            old,
        }
    }

    fn installed(&self) -> Installed {
        let text = std::fs::read_to_string(record_path(&self.state, "c")).unwrap();
        let r = Record::parse(&text).unwrap();
        installed(
            &self.state,
            "c",
            "k1",
            &r.tar_sha256,
            self.old.entries.len() as u64,
        )
        .unwrap()
        .unwrap()
    }

    /// Builds `items` as a delta; the report, the chunks decoded, and
    /// checks the result against a cold extract of the same tar.
    fn delta(&self, items: &[Item], cut: Option<usize>) -> Result<(Report, Vec<usize>)> {
        let (tar, new) = tar_of(items);
        let (entry, spans) = key_entry(&tar, &new, cut);
        let stage = self.t.path().join("stage");
        let _ = crate::unpack::remove_tree(&stage);
        std::fs::create_dir(&stage).unwrap();
        let mut seen = Vec::new();
        let mut decode =
            |chunks: &[usize], consume: &mut dyn FnMut(&mut dyn Read) -> Result<()>| {
                seen.extend_from_slice(chunks);
                let bytes: Vec<u8> = chunks
                    .iter()
                    .flat_map(|&i| tar[spans[i].0 as usize..spans[i].1 as usize].to_vec())
                    .collect();
                consume(&mut &bytes[..])
            };
        let report = build(
            &stage,
            &self.target,
            &new,
            &entry,
            &self.installed(),
            &mut decode,
            &[],
        )?;
        let cold = self.t.path().join("cold");
        let _ = crate::unpack::remove_tree(&cold);
        extract(&tar, &cold);
        assert_eq!(snapshot(&stage), snapshot(&cold));
        Ok((report, seen))
    }

    fn ino(&self, root: &str, rel: &str) -> u64 {
        std::fs::symlink_metadata(self.t.path().join(root).join(rel))
            .unwrap()
            .ino()
    }
}

fn f(p: &str, data: &str) -> Item {
    Item::F(p.into(), 0o644, data.as_bytes().to_vec())
}

/// Sixty files of 700 bytes in three directories, and the other kinds.
fn tree(version: &str, changed: &[usize]) -> Vec<Item> {
    let mut items = vec![
        Item::D("a".into(), 0o755),
        Item::D("b".into(), 0o750),
        Item::D("b/c".into(), 0o555),
        Item::D("empty".into(), 0o700),
        Item::D("long".into(), 0o755),
        Item::L("link".into(), "a/f03".into()),
        Item::H("b/hard".into(), "a/f00".into()),
        Item::F(format!("long/{}", "n".repeat(150)), 0o755, b"long".to_vec()),
    ];
    for i in 0..60 {
        let dir = ["a", "b", "b/c"][i % 3];
        let body = if changed.contains(&i) { version } else { "1" };
        let data = format!("{body}{i:02}{}", "x".repeat(697)).into_bytes();
        items.push(Item::F(format!("{dir}/f{i:02}"), 0o644, data));
    }
    items
}

#[test]
fn a_new_key_links_what_did_not_change_and_decodes_only_its_chunks() {
    let fx = Fx::new(&tree("1", &[]));
    let before = fx.ino("target", "b/f04");
    let (r, seen) = fx.delta(&tree("2", &[4, 5, 40]), Some(2000)).unwrap();
    assert_eq!(r.files_written, 3, "{r:?}");
    assert_eq!(r.files_linked, 58, "{r:?}");
    assert_eq!(r.bytes_linked, 57 * 700 + 4, "{r:?}");
    assert!(r.chunks_decoded < r.chunks_total / 4, "{r:?}");
    assert_eq!(seen.len() as u64, r.chunks_decoded);
    // Unchanged: the installed inode; changed: a new one.
    assert_eq!(fx.ino("stage", "a/f03"), fx.ino("target", "a/f03"));
    assert_ne!(fx.ino("stage", "b/f04"), before);
    assert_eq!(
        r.stats.files + r.stats.dirs + r.stats.symlinks + r.stats.hardlinks,
        68
    );
}

#[test]
fn without_frames_everything_is_decoded_but_still_linked() {
    let fx = Fx::new(&tree("1", &[]));
    let (r, seen) = fx.delta(&tree("2", &[59]), None).unwrap();
    assert_eq!((r.files_written, r.files_linked), (1, 60), "{r:?}");
    assert_eq!(seen, vec![0]);
    // Nothing changed at all: nothing to decode. (A fresh install: the
    // links and their removal moved the ctimes of the first one.)
    let fx = Fx::new(&tree("1", &[]));
    let (r, seen) = fx.delta(&tree("1", &[]), Some(999)).unwrap();
    assert_eq!((r.files_written, r.chunks_decoded), (0, 0), "{r:?}");
    assert!(seen.is_empty());
}

#[test]
fn the_same_content_twice_is_one_link_and_one_copy_and_a_new_mode_a_copy() {
    let fx = Fx::new(&[f("x", "same"), f("y", "other")]);
    let items = [
        f("x", "same"),
        f("x2", "same"),
        Item::F("y".into(), 0o600, b"other".to_vec()),
    ];
    let (r, _) = fx.delta(&items, Some(700)).unwrap();
    assert_eq!(
        (r.files_linked, r.files_copied + r.files_linked),
        (1, 3),
        "{r:?}"
    );
    assert_ne!(fx.ino("stage", "x"), fx.ino("stage", "x2"));
}

/// What a user may do to an installed file. Each must keep it out of
/// the new tree (which still equals a cold restore: `Fx::delta`).
fn hostile(i: usize, root: &Path, rel: &str, outside: &Path) {
    let p = root.join(rel);
    let mtime = std::fs::metadata(&p).unwrap().modified().unwrap();
    let same_size = |p: &Path| {
        let n = std::fs::metadata(p).unwrap().len() as usize;
        std::fs::write(p, "Z".repeat(n)).unwrap();
    };
    match i % 8 {
        0 => same_size(&p),
        1 => std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap(),
        2 => {
            std::fs::remove_file(&p).unwrap();
            std::os::unix::fs::symlink("f00", &p).unwrap();
        }
        3 => {
            std::fs::remove_file(&p).unwrap();
            std::fs::create_dir(&p).unwrap();
        }
        4 => std::fs::hard_link(&p, outside.join(format!("h{i}"))).unwrap(),
        5 => {
            same_size(&p);
            std::fs::File::options()
                .write(true)
                .open(&p)
                .unwrap()
                .set_modified(mtime)
                .unwrap();
        }
        6 => {
            let tmp = root.join(format!("{rel}.tmp"));
            same_size(&p);
            std::fs::rename(&p, &tmp).unwrap();
            std::fs::rename(&tmp, &p).unwrap();
        }
        _ => std::fs::remove_file(&p).unwrap(),
    }
}

#[test]
fn a_file_the_user_changed_is_never_linked() {
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    for case in 0..48 {
        let settled = case % 2 == 1;
        let fx = Fx::installed_then(&tree("1", &[]), settled);
        let racy = fx
            .installed()
            .stats
            .iter()
            .flatten()
            .filter(|s| s.ctime_ns > fx.installed().racy_after_ns)
            .count();
        // Unsettled, the files are usually racy (hashed before use);
        // a loaded machine may take longer than RACY_NS to install.
        assert!(!settled || racy == 0, "case {case}: {racy} racy files");
        let outside = fx.t.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let victim = 3 + (rng % 57) as usize;
        let rel = format!("{}/f{victim:02}", ["a", "b", "b/c"][victim % 3]);
        // b/c is read-only, as installed: let the user in.
        std::fs::set_permissions(
            fx.target.join("b/c"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        hostile(case, &fx.target, &rel, &outside);
        let edited = std::fs::symlink_metadata(fx.target.join(&rel))
            .map(|m| m.ino())
            .ok();
        let cut = [None, Some(512), Some(1777)][case % 3];
        let (r, _) = fx
            .delta(&tree("1", &[]), cut)
            .unwrap_or_else(|e| panic!("case {case}: {e:#}"));
        assert_eq!(r.files_written, 1, "case {case} ({rel}): {r:?}");
        assert_ne!(Some(fx.ino("stage", &rel)), edited, "case {case} ({rel})");
    }
}

#[test]
fn an_index_that_disagrees_with_the_tar_is_a_fallback() {
    let fx = Fx::new(&tree("1", &[]));
    let (tar, mut new) = tar_of(&tree("2", &[7]));
    let e = new.entries.iter_mut().find(|e| e.path == b"b/f07").unwrap();
    e.sha256 = Some([9; 32]);
    let (entry, spans) = key_entry(&tar, &new, Some(1024));
    let stage = fx.t.path().join("stage");
    std::fs::create_dir(&stage).unwrap();
    let mut decode = |chunks: &[usize], consume: &mut dyn FnMut(&mut dyn Read) -> Result<()>| {
        let bytes: Vec<u8> = chunks
            .iter()
            .flat_map(|&i| tar[spans[i].0 as usize..spans[i].1 as usize].to_vec())
            .collect();
        consume(&mut &bytes[..])
    };
    let err = build(
        &stage,
        &fx.target,
        &new,
        &entry,
        &fx.installed(),
        &mut decode,
        &[],
    )
    .unwrap_err();
    let why = fallback_reason(&err).unwrap_or_else(|| panic!("{err:#}"));
    assert!(why.contains("b/f07") && why.contains("file index"), "{why}");
    // A path a full install refuses is left to it.
    let mut bad = new.clone();
    bad.entries[0].path = b"../up".to_vec();
    let err = build(
        &stage,
        &fx.target,
        &bad,
        &entry,
        &fx.installed(),
        &mut decode,
        &[],
    )
    .unwrap_err();
    assert!(fallback_reason(&err).unwrap().contains(".."), "{err:#}");
    // The index names another path, mode or size than the tar holds
    // at that offset (each in a fresh staging directory).
    type Edit = fn(&mut Entry);
    let edits: [Edit; 3] = [|e| e.path.push(b'x'), |e| e.mode = 0o600, |e| e.size += 1];
    for edit in edits {
        let (_, mut bad) = tar_of(&tree("2", &[7]));
        edit(
            bad.entries
                .iter_mut()
                .find(|e| e.path.starts_with(b"b/f07"))
                .unwrap(),
        );
        crate::unpack::remove_tree(&stage).unwrap();
        std::fs::create_dir(&stage).unwrap();
        let old = fx.installed();
        let err = build(&stage, &fx.target, &bad, &entry, &old, &mut decode, &[]).unwrap_err();
        let why = fallback_reason(&err).unwrap_or_else(|| panic!("{err:#}"));
        assert!(why.contains("differs from the index"), "{why}");
    }
}

/// A directory of the installed tree swapped for a symlink to a copy
/// outside (whose files keep their inodes and stats): nothing under it
/// is linked, as nothing is ever read through a symlink.
#[test]
fn nothing_is_linked_through_a_symlinked_directory() {
    let fx = Fx::new(&tree("1", &[]));
    let outside = fx.t.path().join("outside-a");
    std::fs::rename(fx.target.join("a"), &outside).unwrap();
    std::os::unix::fs::symlink(&outside, fx.target.join("a")).unwrap();
    let (r, _) = fx.delta(&tree("1", &[]), Some(4096)).unwrap();
    assert_eq!(r.files_written, 20, "{r:?}");
    let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
    assert_ne!(
        ino(&fx.t.path().join("stage/a/f00")),
        ino(&outside.join("f00"))
    );
}

#[test]
fn records_and_indexes_are_checked_before_use() {
    let fx = Fx::new(&tree("1", &[]));
    let r = std::fs::read_to_string(record_path(&fx.state, "c")).unwrap();
    let rec = Record::parse(&r).unwrap();
    assert_eq!(Record::parse(&rec.render()).unwrap(), rec);
    let files = fx.old.entries.len() as u64;
    let load = || installed(&fx.state, "c", "k1", &rec.tar_sha256, files);
    assert!(load().unwrap().is_some());
    assert!(
        installed(&fx.state, "c", "k2", &rec.tar_sha256, files)
            .unwrap_err()
            .contains("k1")
    );
    for bad in [
        r.replace("clock ", "clock x"),
        r.replace("verified yes", "verified maybe"),
        r.replacen(" 100644 ", " 10064x ", 1),
        r.replacen(" 100644 ", " ", 1),
        r[..r.trim_end().rfind('\n').unwrap() + 1].to_string(),
        r.replacen("warmstart-installed 1", "warmstart-installed 2", 1),
        String::new(),
    ] {
        std::fs::write(record_path(&fx.state, "c"), &bad).unwrap();
        assert!(load().is_err(), "{bad}");
    }
    std::fs::write(record_path(&fx.state, "c"), &r).unwrap();
    std::fs::write(index_path(&fx.state, "c"), b"forged").unwrap();
    assert!(load().unwrap_err().contains("not the index"));
    forget(&fx.state, "c").unwrap();
    assert!(load().unwrap().is_none());
    assert_eq!(std::fs::read_dir(dir(&fx.state)).unwrap().count(), 0);

    // The branch's index: size, digest, then agreement with the key.
    let (tar, index) = tar_of(&tree("1", &[]));
    let (mut entry, _) = key_entry(&tar, &index, None);
    let ni = zst(&index);
    entry.index = Some(crate::cache::format::IndexFile {
        file: "k.files.zst".into(),
        size: ni.bytes.len() as u64,
        sha256: hex::encode(&Sha256::digest(&ni.bytes)),
    });
    assert!(check_index(ni.bytes.clone(), &entry).is_ok());
    let mut flipped = ni.bytes.clone();
    flipped[9] ^= 1;
    assert!(check_index(flipped, &entry).unwrap_err().contains("sha256"));
    assert!(
        check_index(ni.bytes[1..].to_vec(), &entry)
            .unwrap_err()
            .contains("bytes")
    );
    entry.files += 1;
    assert!(
        check_index(ni.bytes.clone(), &entry)
            .unwrap_err()
            .contains("entries")
    );
    entry.files -= 1;
    entry.tar_size = index.entries.last().unwrap().end;
    assert!(check_index(ni.bytes, &entry).unwrap_err().contains("span"));
}
