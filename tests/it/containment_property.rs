//! The containment invariant as a property (ARCHITECTURE.md): for any
//! sequence of archives, each accepted alone, no byte is written outside
//! the target.
//!
//! Archives come from a small deterministic PRNG over a tiny vocabulary of
//! names, so that they collide: links to `..` at several depths, a
//! directory in one archive where another has a link, long names, and
//! absolute links (with `allow_external_symlinks`) into the sentinel
//! directories. Only archives that install alone into an empty prefix go
//! into the pool; sequences of them are then installed, in merge mode and
//! now and then in replace mode, into `s2/s1/prefix`, which may also hold
//! links of its "user" (`lib64 -> lib`, `up -> ..`, an absolute one). After
//! every install nothing under `s2` but the prefix may differ, and a refused
//! install must leave the prefix exactly as it was.
//!
//! It runs in-process through the same library calls as `cache restore`
//! and `conda unpack` (`extract_tar` into `staging_dir_for`, then
//! `merge_into_with` or `swap_dir`), once with `openat2` and once with the
//! fallback walk; `WARMSTART_CONTAINMENT_SEQUENCES` (default 500) sets the
//! number of sequences per resolver, `WARMSTART_CONTAINMENT_SEED` the seed.
//!
//! A third run installs some archives with a cache manifest's
//! `pack.absolute_symlinks` (`ABSOLUTE`): their absolute links, some with a
//! `..` inside, land at matching and non-matching paths, and later entries
//! go under them. The same invariant holds, and no accepted archive holds an
//! absolute link the setting does not allow.

use crate::util::rng::Rng;
use crate::util::tree::{Detail, snapshot};
use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::Instant;
use warmstart::exit::{Code, code_of};
use warmstart::unpack::{self, Limits, MergeOptions, Options};

#[derive(Clone, Debug)]
enum Entry {
    Dir(String),
    File(String),
    Link(String, String),
}

#[derive(Clone, Debug)]
struct Archive {
    entries: Vec<Entry>,
    external: bool,
    /// Installed with `ABSOLUTE` as `pack.absolute_symlinks`.
    absolute: bool,
    tar: Vec<u8>,
}

/// The `pack.absolute_symlinks` of the third run: some names of `NAMES`
/// at some depths, so that generated links both match and miss.
const ABSOLUTE: &[&str] = &["l", "a/l", "**/lib64", "x/zz"];

fn absolute_patterns() -> Vec<warmstart::glob::Pattern> {
    ABSOLUTE
        .iter()
        .map(|g| warmstart::glob::Pattern::new(g).unwrap())
        .collect()
}

const NAMES: &[&str] = &["a", "l", "x", "zz", "lib", "lib64"];

/// Relative targets: up at several depths, sideways, and `..` after a name.
const TARGETS: &[&str] = &[
    "..", "../..", "../../..", ".", "a", "l", "zz", "../a", "../l", "../zz", "lib", "x/..",
    "../../zz", "l/../..",
];

fn long_name() -> String {
    "n".repeat(200)
}

fn path(rng: &mut Rng, depth: usize) -> String {
    (0..depth)
        .map(|_| {
            if rng.chance(8) {
                long_name()
            } else {
                rng.pick(NAMES).to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// One archive: random entries, or one of the shapes of the known escapes
/// with random depths.
fn archive(rng: &mut Rng, abs: &[String], with_absolute: bool) -> Archive {
    let external = rng.chance(25);
    let absolute = with_absolute && !external && rng.chance(50);
    let mut entries = Vec::new();
    if absolute {
        absolute_entries(rng, abs, &mut entries);
    } else {
        other_entries(rng, abs, external, &mut entries);
    }
    let tar = tar_of(&entries);
    Archive {
        entries,
        external,
        absolute,
        tar,
    }
}

/// Absolute links (now and then with a `..` inside) at paths `ABSOLUTE`
/// matches or misses, then entries under such a name or beside it.
fn absolute_entries(rng: &mut Rng, abs: &[String], entries: &mut Vec<Entry>) {
    for _ in 0..1 + rng.below(4) {
        let depth = 1 + rng.below(2);
        let p = match rng.chance(50) {
            true => rng
                .pick(&["l", "a/l", "lib64", "zz/lib64", "x/zz"])
                .to_string(),
            false => path(rng, depth),
        };
        let mut t = rng.pick(abs).clone();
        if rng.chance(20) {
            t = format!("{t}/../{}", rng.pick(NAMES));
        }
        entries.push(match rng.below(6) {
            0 => Entry::Dir(p),
            1 => Entry::File(format!("{p}/x")),
            2 => Entry::Link(p, rng.pick(TARGETS).to_string()),
            _ => Entry::Link(p, t),
        });
    }
}

fn other_entries(rng: &mut Rng, abs: &[String], external: bool, entries: &mut Vec<Entry>) {
    match rng.below(4) {
        0 => {
            // A link back up `k` levels from depth `k` (to the root) or one short.
            let k = 1 + rng.below(3);
            let dir = path(rng, k - 1);
            let up = k - rng.below(2).min(k - 1);
            let name = if dir.is_empty() {
                "l".to_string()
            } else {
                format!("{dir}/l")
            };
            entries.push(Entry::Link(name, vec![".."; up].join("/")));
        }
        1 => {
            // Through a directory that may be a link elsewhere: a link
            // climbing from there, then a write under its name.
            let depth = 1 + rng.below(2);
            let dir = path(rng, depth);
            let ups = 1 + rng.below(3);
            entries.push(Entry::Dir(dir.clone()));
            entries.push(Entry::Link(format!("{dir}/zz"), vec![".."; ups].join("/")));
            entries.push(Entry::File("zz/file".into()));
        }
        2 if external => {
            let name = rng.pick(NAMES).to_string();
            entries.push(Entry::Link(name.clone(), rng.pick(abs).clone()));
            entries.push(Entry::File(format!("{}/x", rng.pick(NAMES))));
        }
        _ => {
            for _ in 0..1 + rng.below(6) {
                let depth = 1 + rng.below(3);
                let p = path(rng, depth);
                entries.push(match rng.below(10) {
                    0..=2 => Entry::Dir(p),
                    3..=5 => Entry::File(p),
                    _ if external && rng.chance(40) => Entry::Link(p, rng.pick(abs).clone()),
                    _ => Entry::Link(p, rng.pick(TARGETS).to_string()),
                });
            }
        }
    }
}

fn tar_of(entries: &[Entry]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (i, e) in entries.iter().enumerate() {
        let mut h = tar::Header::new_gnu();
        h.set_mtime(946_684_800);
        match e {
            Entry::Dir(p) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_size(0);
                b.append_data(&mut h, p, std::io::empty()).unwrap();
            }
            Entry::File(p) => {
                let data = format!("payload {i}\n");
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(0o644);
                h.set_size(data.len() as u64);
                b.append_data(&mut h, p, data.as_bytes()).unwrap();
            }
            Entry::Link(p, t) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_size(0);
                b.append_link(&mut h, p, t).unwrap();
            }
        }
    }
    b.into_inner().unwrap()
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Merge,
    Replace,
}

/// Installs `a` into `prefix` as `cache restore` / `conda unpack` do: a
/// staging directory beside it, the checked extractor, then merge or swap;
/// a staging directory not handed to a journal is removed on failure.
fn install(
    a: &Archive,
    prefix: &Path,
    journal: &Path,
    mode: Mode,
    writers: Option<usize>,
) -> anyhow::Result<()> {
    let staging = unpack::staging_dir_for(prefix)?;
    let absolute = match a.absolute {
        true => absolute_patterns(),
        false => Vec::new(),
    };
    let opts = Options {
        allow_external_symlinks: a.external,
        writers,
        absolute_symlinks: absolute.clone(),
    };
    let r =
        unpack::extract_tar(&a.tar[..], &staging, &Limits::GENEROUS, &opts).and_then(
            |_| match mode {
                Mode::Merge => unpack::merge_into_with(
                    &staging,
                    prefix,
                    journal,
                    MergeOptions {
                        allow_external_symlinks: a.external,
                        absolute_symlinks: absolute,
                    },
                )
                .map(drop),
                Mode::Replace => unpack::swap_dir(&staging, prefix),
            },
        );
    if r.is_err() && !journal.exists() {
        unpack::remove_tree(&staging).unwrap();
    }
    r
}

fn fresh_dir(p: &Path) {
    if fs::symlink_metadata(p).is_ok() {
        unpack::remove_tree(p).unwrap();
    }
    fs::create_dir_all(p).unwrap();
}

/// The links a prefix's "user" may have made before any archive came.
fn user_links(rng: &mut Rng, prefix: &Path, abs: &[String]) {
    if rng.chance(40) {
        fs::create_dir(prefix.join("lib")).unwrap();
        symlink("lib", prefix.join("lib64")).unwrap();
    }
    if rng.chance(20) {
        symlink("..", prefix.join("up")).unwrap();
    }
    if rng.chance(20) {
        symlink(rng.pick(abs), prefix.join("x")).unwrap();
    }
}

fn env_number(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

/// A tmpfs when the machine has one (fsync is free there: this measures
/// containment, not the disk), else the usual temporary directory.
fn scratch() -> tempfile::TempDir {
    let b = tempfile::Builder::new()
        .prefix("warmstart-contain-")
        .clone();
    match Path::new("/dev/shm").is_dir() {
        true => b.tempdir_in("/dev/shm"),
        false => b.tempdir(),
    }
    .unwrap()
}

/// An archive accepted alone without external symlinks holds no absolute
/// link but those `ABSOLUTE` allows: at a matching path, without `..`.
fn assert_only_allowed_absolute_links(a: &Archive) {
    if a.external {
        return;
    }
    let patterns = absolute_patterns();
    for e in &a.entries {
        if let Entry::Link(p, t) = e
            && t.starts_with('/')
        {
            assert!(
                a.absolute
                    && patterns.iter().any(|g| g.matches(p))
                    && !t.split('/').any(|c| c == ".."),
                "accepted an absolute link the setting does not allow: {p} -> {t}: {a:#?}"
            );
        }
    }
}

fn property(walk: bool, with_absolute: bool) {
    unpack::force_walk(walk);
    let sequences = env_number("WARMSTART_CONTAINMENT_SEQUENCES", 500);
    let seed = env_number("WARMSTART_CONTAINMENT_SEED", 0x5eed_c0de) | 1;
    let t0 = Instant::now();
    let tmp = scratch();
    let s2 = tmp.path().join("s2");
    let s1 = s2.join("s1");
    let prefix = s1.join("prefix");
    let journal = tmp.path().join("state/merge.journal");
    for d in ["a", "zz", "l", "s1/a", "s1/lib", "s1/zz", "s1/outside"] {
        fs::create_dir_all(s2.join(d)).unwrap();
    }
    fs::write(s2.join("bait"), "two levels up\n").unwrap();
    fs::write(s1.join("bait"), "one level up\n").unwrap();
    fs::write(s1.join("zz/file"), "bait under zz\n").unwrap();
    let abs: Vec<String> = [
        &s1,
        &s2,
        &s1.join("outside"),
        &s2.join("a"),
        &s1.join("lib"),
    ]
    .iter()
    .map(|p| p.display().to_string())
    .collect();
    let outside = || {
        let mut t = snapshot(&s2, Detail::UNTOUCHED);
        t.retain(|k, _| k != "s1/prefix" && !k.starts_with("s1/prefix/"));
        t
    };
    let sentinels = outside();

    // The pool: archives that install alone into an empty prefix.
    let mut rng = Rng(seed);
    let alone = tmp.path().join("alone/prefix");
    let mut pool = Vec::new();
    let mut generated = 0;
    let mut allowed_links = 0;
    while pool.len() < 150 {
        generated += 1;
        assert!(
            generated < 20_000,
            "the generator makes too few acceptable archives"
        );
        let a = archive(&mut rng, &abs, with_absolute);
        fresh_dir(&alone);
        if install(
            &a,
            &alone,
            &tmp.path().join("alone.journal"),
            Mode::Merge,
            Some(0),
        )
        .is_ok()
        {
            assert_only_allowed_absolute_links(&a);
            let absolute_link = |e: &Entry| matches!(e, Entry::Link(_, t) if t.starts_with('/'));
            allowed_links += usize::from(a.absolute && a.entries.iter().any(absolute_link));
            pool.push(a);
        }
    }

    assert!(
        !with_absolute || allowed_links > 10,
        "only {allowed_links} archives of the pool hold an allowed absolute link"
    );
    let (mut installs, mut refused) = (0u64, 0u64);
    for seq in 0..sequences {
        fresh_dir(&prefix);
        user_links(&mut rng, &prefix, &abs);
        let mut history = Vec::new();
        for _ in 0..2 + rng.below(3) {
            let a = &pool[rng.below(pool.len())];
            let mode = if rng.chance(15) {
                Mode::Replace
            } else {
                Mode::Merge
            };
            let writers = *rng.pick(&[None, Some(0)]);
            history.push((mode, a.external, a.absolute, a.entries.clone()));
            let before = snapshot(&prefix, Detail::UNTOUCHED);
            let r = install(a, &prefix, &journal, mode, writers);
            installs += 1;
            let now = outside();
            assert_eq!(
                now, sentinels,
                "sequence {seq} (seed {seed:#x}, walk {walk}) wrote outside the prefix: {history:#?}"
            );
            if let Err(e) = r {
                refused += 1;
                assert_eq!(
                    code_of(&e),
                    Code::Unsafe,
                    "sequence {seq}: {e:#}\n{history:#?}"
                );
                assert!(
                    !journal.exists(),
                    "sequence {seq}: refused after the journal: {e:#}"
                );
                assert_eq!(
                    snapshot(&prefix, Detail::UNTOUCHED),
                    before,
                    "sequence {seq}: a refusal changed the prefix: {e:#}\n{history:#?}"
                );
            }
        }
    }
    let (by_openat2, by_walk) = unpack::resolutions();
    if walk {
        assert!(
            by_walk > 0 && by_openat2 == 0,
            "walk forced, yet openat2 {by_openat2}, walk {by_walk}"
        );
    } else {
        assert!(
            by_openat2 > 0 && by_walk == 0,
            "openat2 expected (kernel {}), yet openat2 {by_openat2}, walk {by_walk}",
            fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
        );
    }
    eprintln!(
        "containment property ({}{}): {sequences} sequences, {installs} installs ({refused} refused), pool of {} from {generated} archives, {by_openat2} openat2 + {by_walk} walk resolutions, seed {seed:#x}, {:.1} s",
        if walk { "fallback walk" } else { "openat2" },
        if with_absolute {
            ", pack.absolute_symlinks"
        } else {
            ""
        },
        pool.len(),
        t0.elapsed().as_secs_f64()
    );
}

#[test]
fn no_sequence_of_accepted_archives_writes_outside_the_target_with_openat2() {
    property(false, false);
}

#[test]
fn with_pack_absolute_symlinks_no_sequence_writes_outside_and_only_matching_links_are_accepted() {
    property(false, true);
}

#[test]
fn no_sequence_of_accepted_archives_writes_outside_the_target_with_the_walk() {
    property(true, false);
}
