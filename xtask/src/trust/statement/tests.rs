//! Tests of `statement`: both versions' layouts byte for byte, strict
//! parsing, and every field each version binds.

use super::*;
use crate::cache::format::Chunk;

fn entry() -> KeyEntry {
    KeyEntry {
        archive: "k.tar.zst".into(),
        compression: "zstd".into(),
        chunks: (0..3)
            .map(|i| Chunk {
                file: format!("k.tar.zst.part{i:03}"),
                size: 10 + i,
                sha256: format!("{i}").repeat(64),
                raw_size: None,
                raw_sha256: None,
            })
            .collect(),
        tar_sha256: "b".repeat(64),
        tar_size: 10240,
        files: 7,
        key_parts: vec![],
        source_commit: Some("c".repeat(40)),
        source_tree: Some("d".repeat(40)),
        gates: serde_json::json!({"tree": "d", "gates": {"unit": "green"}}),
        ungated: false,
        created_at: "2026-12-01T10:00:00Z".into(),
        tool_version: "warmstart 0".into(),
        frames: None,
        index: None,
        index_parts: Vec::new(),
    }
}

/// The v1 statement of `entry()` exactly as the build before statement
/// v2 rendered it (captured from that code): every branch signed
/// before v2 must keep verifying, so its bytes never change.
const V1_GOLDEN: &str = "warmstart-statement 1
cache art
key k
created_at 2026-12-01T10:00:00Z
source_commit cccccccccccccccccccccccccccccccccccccccc
source_tree dddddddddddddddddddddddddddddddddddddddd
gates_sha256 7e3345408ed968f6e3606160f275e485bb4f0ca4c30e263606c75afba531ed12
ungated false
compression zstd
tar_sha256 bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb
tar_size 10240
files 7
0000000000000000000000000000000000000000000000000000000000000000  k.tar.zst.part000
1111111111111111111111111111111111111111111111111111111111111111  k.tar.zst.part001
2222222222222222222222222222222222222222222222222222222222222222  k.tar.zst.part002
";

#[test]
fn an_entry_without_the_new_fields_renders_the_v1_bytes() {
    let s = Statement::from_entry("art", "k", &entry());
    assert_eq!(s.render(), V1_GOLDEN);
    assert_eq!(Statement::parse(V1_GOLDEN).unwrap(), s);
}

#[test]
fn round_trips_and_is_line_oriented() {
    let s = Statement::from_entry("art", "k", &entry());
    let text = s.render();
    assert!(text.starts_with("warmstart-statement 1\ncache art\nkey k\n"));
    assert!(text.contains(&format!("\n{}  k.tar.zst.part001\n", "1".repeat(64))));
    assert_eq!(Statement::parse(&text).unwrap(), s);
    let mut e = entry();
    e.gates = serde_json::Value::Null;
    e.source_commit = None;
    let s = Statement::from_entry("art", "k", &e);
    assert!(s.render().contains("\ngates_sha256 -\nungated false\n"));
    assert_eq!(Statement::parse(&s.render()).unwrap(), s);
}

#[test]
fn every_field_of_the_entry_that_matters_is_bound() {
    let base = Statement::from_entry("art", "k", &entry());
    type Edit = Box<dyn Fn(&mut KeyEntry)>;
    let edits: Vec<(&str, Edit)> = vec![
        (
            "created_at",
            Box::new(|e| e.created_at = "2026-12-01T10:00:01Z".into()),
        ),
        ("source_commit", Box::new(|e| e.source_commit = None)),
        (
            "source_tree",
            Box::new(|e| e.source_tree = Some("e".repeat(40))),
        ),
        (
            "gates_sha256",
            Box::new(|e| e.gates = serde_json::json!({"forged": true})),
        ),
        ("ungated", Box::new(|e| e.ungated = true)),
        ("tar_sha256", Box::new(|e| e.tar_sha256 = "f".repeat(64))),
        ("tar_size", Box::new(|e| e.tar_size += 1)),
        ("files", Box::new(|e| e.files += 1)),
        ("chunks", Box::new(|e| e.chunks.swap(0, 1))),
        ("chunks", Box::new(|e| e.chunks[2].sha256 = "9".repeat(64))),
        ("chunks", Box::new(|e| drop(e.chunks.pop()))),
    ];
    for (field, edit) in edits {
        let mut e = entry();
        edit(&mut e);
        let other = Statement::from_entry("art", "k", &e);
        assert_eq!(base.first_difference(&other), Some(field));
    }
    let other = Statement::from_entry("other", "k", &entry());
    assert_eq!(base.first_difference(&other), Some("cache"));
    assert_eq!(base.first_difference(&base.clone()), None);
}

/// Never: a statement that is not exactly what `render` writes parses.
/// Random single-byte edits of a valid statement either fail to parse
/// or parse to a different statement (which the restore then compares
/// with warmstart.json): none is silently the same one.
#[test]
fn random_edits_never_parse_to_the_same_statement() {
    for e in [entry(), framed()] {
        random_edits_of(&Statement::from_entry("art", "k", &e));
    }
}

fn random_edits_of(s: &Statement) {
    let text = s.render().into_bytes();
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let alphabet = b"0123456789abcdefABCDEF -_:\nTZtruefals.%rw";
    for _ in 0..3000 {
        let mut t = text.clone();
        let at = (next() % t.len() as u64) as usize;
        match next() % 3 {
            0 => t[at] = alphabet[(next() % alphabet.len() as u64) as usize],
            1 => drop(t.remove(at)),
            _ => t.insert(at, alphabet[(next() % alphabet.len() as u64) as usize]),
        }
        if t == text {
            continue;
        }
        if let Ok(text) = std::str::from_utf8(&t)
            && let Ok(parsed) = Statement::parse(text)
        {
            assert_ne!(&parsed, s, "edited text parsed as the original: {text:?}");
            assert_eq!(parsed.render(), text);
        }
    }
}

#[test]
fn hostile_statements_are_refused() {
    let good = Statement::from_entry("art", "k", &entry()).render();
    for bad in [
        String::new(),
        good.replacen("warmstart-statement 1", "warmstart-statement 2", 1),
        good.replacen("key k\n", "key ../k\n", 1),
        good.replacen(
            "created_at 2026-12-01T10:00:00Z",
            "created_at 2026-12-01",
            1,
        ),
        good.replacen("ungated false", "ungated no", 1),
        good.replacen("tar_size 10240", "tar_size 010240", 1),
        good.trim_end().to_string(),
        format!("{good}extra line\n"),
        good.replace("  k.tar.zst.part002", "  ../etc/passwd"),
        good.replacen("files 7\n", "files 7\nfiles 8\n", 1),
    ] {
        assert!(Statement::parse(&bad).is_err(), "parsed: {bad:?}");
    }
}

/// The entry of `entry()` with every field `Version::Reuse` binds, and key
/// parts whose values need escaping.
fn framed() -> KeyEntry {
    let mut e = entry();
    for (i, c) in e.chunks.iter_mut().enumerate() {
        c.raw_size = Some(4096 + i as u64 * 1024);
        c.raw_sha256 = Some(format!("{}", i + 5).repeat(64));
    }
    e.tar_size = 4096 * 3 + 3 * 1024;
    e.frames = Some(Frames {
        chunker: "fastcdc-2020".into(),
        min_size: 1 << 20,
        avg_size: 4 << 20,
        max_size: 16 << 20,
        zstd: "1.5.7".into(),
        level: 19,
        window_log: Some(27),
        checksum: true,
    });
    e.index = Some(IndexFile {
        file: "k.files.zst".into(),
        size: 321,
        sha256: "e".repeat(64),
    });
    e.key_parts = vec![
        crate::cache::format::KeyPart {
            name: "platform".into(),
            value: "x86_64-linux".into(),
        },
        crate::cache::format::KeyPart {
            name: "rustc".into(),
            value: "1.95.0 (abc 100%)\n".into(),
        },
        crate::cache::format::KeyPart {
            name: "empty".into(),
            value: String::new(),
        },
        crate::cache::format::KeyPart {
            name: "dash".into(),
            value: "-".into(),
        },
    ];
    e
}

/// The version 2 layout, as README "Trust" documents it.
const V2_GOLDEN: &str = "warmstart-statement 2
cache art
key k
created_at 2026-12-01T10:00:00Z
source_commit cccccccccccccccccccccccccccccccccccccccc
source_tree dddddddddddddddddddddddddddddddddddddddd
gates_sha256 7e3345408ed968f6e3606160f275e485bb4f0ca4c30e263606c75afba531ed12
ungated false
compression zstd
tar_sha256 bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb
tar_size 15360
files 7
key_part platform x86_64-linux
key_part rustc 1.95.0%20(abc%20100%25)%0A
key_part empty -
key_part dash %2D
chunker fastcdc-2020
min_size 1048576
avg_size 4194304
max_size 16777216
zstd 1.5.7
level 19
window_log 27
checksum true
index 321 eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee k.files.zst
raw 4096 5555555555555555555555555555555555555555555555555555555555555555 k.tar.zst.part000
raw 5120 6666666666666666666666666666666666666666666666666666666666666666 k.tar.zst.part001
raw 6144 7777777777777777777777777777777777777777777777777777777777777777 k.tar.zst.part002
0000000000000000000000000000000000000000000000000000000000000000  k.tar.zst.part000
1111111111111111111111111111111111111111111111111111111111111111  k.tar.zst.part001
2222222222222222222222222222222222222222222222222222222222222222  k.tar.zst.part002
";

#[test]
fn an_entry_with_the_new_fields_renders_version_2() {
    let s = Statement::from_entry("art", "k", &framed());
    assert_eq!(s.version, Version::Reuse);
    assert_eq!(s.render(), V2_GOLDEN);
    assert_eq!(Statement::parse(V2_GOLDEN).unwrap(), s);
    // The chunk lines a shell greps out are exactly the chunks.
    let grepped: Vec<&str> = V2_GOLDEN
        .lines()
        .filter(|l| {
            l.len() > 66
                && l.as_bytes()[..64].iter().all(u8::is_ascii_hexdigit)
                && &l[64..66] == "  "
        })
        .collect();
    assert_eq!(grepped.len(), 3);
    assert!(grepped.iter().all(|l| l.contains("  k.tar.zst.part")));
    // Any one of the new fields alone makes it version 2; the others
    // then render as `-` or are absent.
    let mut e = entry();
    e.index = framed().index;
    let s = Statement::from_entry("art", "k", &e);
    assert_eq!(s.version, Version::Reuse);
    let text = s.render();
    assert!(text.contains("\nchunker -\nindex 321 "), "{text}");
    assert!(!text.contains("\nraw "), "{text}");
    assert_eq!(Statement::parse(&text).unwrap(), s);
    let mut e = entry();
    e.chunks[1].raw_size = Some(7);
    let s = Statement::from_entry("art", "k", &e);
    let text = s.render();
    assert!(
        text.contains("\nindex -\nraw - - k.tar.zst.part000\nraw 7 - k.tar.zst.part001\n"),
        "{text}"
    );
    assert_eq!(Statement::parse(&text).unwrap(), s);
}

#[test]
fn every_new_field_is_bound_in_version_2() {
    let base = Statement::from_entry("art", "k", &framed());
    type Edit = Box<dyn Fn(&mut KeyEntry)>;
    fn f(e: &mut KeyEntry) -> &mut Frames {
        e.frames.as_mut().unwrap()
    }
    let edits: Vec<(&str, Edit)> = vec![
        (
            "key_parts",
            Box::new(|e| e.key_parts[0].value = "aarch64-linux".into()),
        ),
        (
            "key_parts",
            Box::new(|e| e.key_parts[1].name = "rust".into()),
        ),
        ("key_parts", Box::new(|e| drop(e.key_parts.pop()))),
        ("key_parts", Box::new(|e| e.key_parts.swap(0, 1))),
        ("key_parts", Box::new(|e| e.key_parts.clear())),
        ("frames", Box::new(|e| f(e).level = 3)),
        ("frames", Box::new(|e| f(e).window_log = None)),
        ("frames", Box::new(|e| f(e).avg_size /= 2)),
        ("frames", Box::new(|e| f(e).min_size += 1)),
        ("frames", Box::new(|e| f(e).max_size += 1)),
        ("frames", Box::new(|e| f(e).zstd = "1.5.6".into())),
        ("frames", Box::new(|e| f(e).checksum = false)),
        ("frames", Box::new(|e| f(e).chunker = "fastcdc-2016".into())),
        ("frames", Box::new(|e| e.frames = None)),
        (
            "index",
            Box::new(|e| e.index.as_mut().unwrap().sha256 = "f".repeat(64)),
        ),
        ("index", Box::new(|e| e.index.as_mut().unwrap().size += 1)),
        (
            "index",
            Box::new(|e| e.index.as_mut().unwrap().file = "x.files.zst".into()),
        ),
        ("index", Box::new(|e| e.index = None)),
        (
            "raw",
            Box::new(|e| e.chunks[1].raw_sha256 = Some("9".repeat(64))),
        ),
        ("raw", Box::new(|e| e.chunks[2].raw_size = Some(1))),
        ("raw", Box::new(|e| e.chunks[0].raw_sha256 = None)),
        ("chunks", Box::new(|e| e.chunks[2].sha256 = "9".repeat(64))),
    ];
    for (field, edit) in edits {
        let mut e = framed();
        edit(&mut e);
        let other = Statement::from_entry("art", "k", &e);
        assert_eq!(base.first_difference(&other), Some(field), "{other:?}");
    }
    // Stripping every new field turns the entry into version 1, which
    // a signed version 2 statement never matches.
    let mut e = framed();
    e.frames = None;
    e.index = None;
    for c in &mut e.chunks {
        (c.raw_size, c.raw_sha256) = (None, None);
    }
    let other = Statement::from_entry("art", "k", &e);
    assert_eq!(other.version, Version::Entry);
    assert_eq!(base.first_difference(&other), Some("key_parts"));
    let mut v1_signed = other.clone();
    v1_signed.version = Version::Reuse;
    assert_eq!(v1_signed.first_difference(&other), Some("version"));
}

#[test]
fn an_unknown_version_names_the_version_it_needs() {
    let good = Statement::from_entry("art", "k", &framed()).render();
    for v in ["3", "10"] {
        let text = good.replacen(
            "warmstart-statement 2",
            &format!("warmstart-statement {v}"),
            1,
        );
        let err = format!("{:#}", Statement::parse(&text).unwrap_err());
        assert!(
            err.contains(&format!("is statement version {v} but warmstart "))
                && err.contains(&format!(
                    "upgrade to a warmstart that reads statement version {v}"
                )),
            "{err}"
        );
        assert!(!err.contains('\n'), "{err}");
    }
    let err = Statement::parse("warmstart-statement x\n").unwrap_err();
    assert!(err.to_string().contains("does not start with"), "{err}");
}

#[test]
fn hostile_version_2_statements_are_refused() {
    let good = Statement::from_entry("art", "k", &framed()).render();
    for bad in [
            // Version 2's lines in a version 1 statement, and the reverse.
            good.replacen("warmstart-statement 2", "warmstart-statement 1", 1),
            good.replacen("chunker fastcdc-2020\n", "", 1),
            good.replacen("index 321 ", "index 0321 ", 1),
            good.replacen("index 321 eeee", "index 321 EEEE", 1),
            good.replacen(" k.files.zst\n", " ../k.files.zst\n", 1),
            good.replacen("level 19", "level +19", 1),
            good.replacen("window_log 27", "window_log 99999999999", 1),
            good.replacen("checksum true", "checksum yes", 1),
            good.replacen("key_part dash %2D", "key_part dash -%", 1),
            good.replacen("key_part dash %2D", "key_part dash %2d", 1),
            good.replacen("key_part empty -", "key_part empty %41", 1),
            good.replacen("raw 5120 6666", "raw 5120 GGGG", 1),
            good.replacen(" k.tar.zst.part001\nraw", " k.tar.zst.part009\nraw", 1),
            good.replacen("raw 6144 ", "raw 06144 ", 1),
            good.replacen(
                "raw 6144 7777777777777777777777777777777777777777777777777777777777777777 k.tar.zst.part002\n",
                "",
                1,
            ),
            format!("{good}raw 1 {} k.tar.zst.part002\n", "1".repeat(64)),
        ] {
            assert_ne!(bad, good, "the edit did not apply");
            assert!(Statement::parse(&bad).is_err(), "parsed: {bad:?}");
        }
}

#[test]
fn words_round_trip_and_have_one_spelling() {
    for t in ["", "-", "%", "a b", "x86_64-linux", "ü\t\n", "--", "%2D"] {
        let w = word(t);
        assert!(
            !w.is_empty() && !w.contains(' ') && !w.contains('\n'),
            "{w:?}"
        );
        assert_eq!(unword(&w).unwrap(), t);
    }
    assert!(unword("%4").is_err() && unword("%zz").is_err() && unword("%FF").is_err());
}
