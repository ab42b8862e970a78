//! `cargo xtask resume` against what the JavaScript tool really writes
//! (node running `tests/fixtures/crash-resume-index.js`): strings with lone
//! surrogates, which `JSON.stringify` writes as `\udXXX`, byte for byte. And
//! the other escapes found around the index: a lock dated in the
//! future, a symlinked index, launcher names taken from the index, an empty
//! repo. Each test is named after the bug it pins.

use crate::resume::{Idx, PATIENT_MS, node, spawn, wait_all};
use crate::util::rng::Rng;
use crate::util::{run, show};
use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// Any UTF-16 string as a JSON literal, every unit outside printable ASCII
/// as a `\uXXXX` escape: how a test hands node strings that no command-line
/// argument can carry (a lone surrogate is not UTF-8).
fn js_literal(units: &[u16]) -> String {
    let mut out = String::from("\"");
    for &u in units {
        match u8::try_from(u) {
            Ok(b) if (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\' => out.push(b as char),
            _ => {
                let _ = write!(out, "\\u{u:04x}");
            }
        }
    }
    out.push('"');
    out
}

fn units(s: &str) -> Vec<u16> {
    s.encode_utf16().collect()
}

/// Up to `max` UTF-16 units of what breaks naive JSON writers: lone high and
/// low surrogates, emoji (surrogate pairs), control characters, quotes and
/// backslashes, line separators, bidi and zero-width characters, and any
/// unit at all.
fn hostile(rng: &mut Rng, max: usize) -> Vec<u16> {
    const ODD: [u16; 12] = [
        0x22, 0x5C, 0x2F, 0x2028, 0x2029, 0x202E, 0x2066, 0x2069, 0xFEFF, 0x200B, 0xAD, 0x85,
    ];
    let mut out = Vec::new();
    for _ in 0..1 + rng.below(max) {
        match rng.below(10) {
            0 => out.push(0xD800 + rng.below(0x400) as u16),
            1 => out.push(0xDC00 + rng.below(0x400) as u16),
            2 => out.extend([0xD83D, 0xDE00 + rng.below(0x50) as u16]),
            3 => out.push(if rng.below(8) == 0 {
                0x7F
            } else {
                rng.below(0x20) as u16
            }),
            4 => out.push(ODD[rng.below(ODD.len())]),
            5 => out.push(rng.next() as u16),
            6 => out.push(0xC0 + rng.below(0x100) as u16),
            _ => out.push(0x20 + rng.below(0x5F) as u16),
        }
    }
    out
}

/// A spec for the fixture's `record-file`: `[surface, session, repo, role]`.
fn spec(rows: &[[Option<Vec<u16>>; 4]]) -> String {
    let cell = |c: &Option<Vec<u16>>| c.as_deref().map_or("null".into(), js_literal);
    let rows: Vec<String> = rows
        .iter()
        .map(|r| format!("[{}]", r.iter().map(cell).collect::<Vec<_>>().join(",")))
        .collect();
    format!("[{}]", rows.join(",\n"))
}

/// The JavaScript tool records every row of `spec`, one lock each.
fn node_records(idx: &Idx, name: &str, spec: &str) {
    let file = idx.env.join(name);
    fs::write(&file, spec).unwrap();
    run(&mut idx.node(&["record-file", file.to_str().unwrap()])).ok();
}

/// What node writes for `original` with the entries `added` (taken from
/// `written`) set, as the same record would leave it.
fn node_merge(original: &Path, written: &Path, added: &[&str]) -> Vec<u8> {
    let merge = r#"
        const fs = require('fs');
        const x = JSON.parse(fs.readFileSync(process.argv[1], 'utf8'));
        const w = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
        for (const k of JSON.parse(process.argv[3])) x.entries[k] = w.entries[k];
        process.stdout.write(JSON.stringify(x, null, 2) + '\n');
    "#;
    let keys = serde_json::to_string(added).unwrap();
    let out = run(node()
        .arg("-e")
        .arg(merge)
        .arg(original)
        .arg(written)
        .arg(keys))
    .ok();
    out.out.stdout
}

/// True when node reads `text` as JSON and writes it back unchanged (so it
/// is exactly what JSON.stringify(value, null, 2) + "\n" makes).
fn node_reads_back_unchanged(text: &[u8]) -> bool {
    let check = r#"
        const t = require('fs').readFileSync(0, 'utf8');
        process.exit(JSON.stringify(JSON.parse(t), null, 2) + '\n' === t ? 0 : 1);
    "#;
    let mut cmd = node();
    cmd.arg("-e")
        .arg(check)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    use std::io::Write as _;
    child.stdin.take().unwrap().write_all(text).unwrap();
    child.wait_with_output().unwrap().status.success()
}

/// The index bytes up to the end of the last entry: what a record of a new
/// (non-numeric) surface must keep exactly.
fn entries_prefix(bytes: &[u8]) -> &[u8] {
    let tail = b"\n  }\n}\n";
    assert!(bytes.ends_with(tail), "{}", String::from_utf8_lossy(bytes));
    &bytes[..bytes.len() - tail.len()]
}

#[test]
fn a_lone_surrogate_written_by_the_javascript_tool_no_longer_makes_the_index_unreadable() {
    let idx = Idx::new();
    fs::create_dir_all(idx.dir()).unwrap();
    // "x\ud83d" is "x😀".slice(0, 2): a repo name cut through an emoji.
    let cut = run(node()
        .arg("-e")
        .arg("process.stdout.write(JSON.stringify('x😀'.slice(0, 2)))"))
    .ok();
    assert_eq!(cut.stdout(), r#""x\ud83d""#, "node's JSON.stringify");
    node_records(
        &idx,
        "spec.json",
        r#"[["cut-\ud83d", "sess-\udc00", "x\ud83d", "r\ud83d"],
            ["plain", "s2", "lc\ud83d", null],
            ["emoji", "s3", "x😀", "\ud83d\ude00"]]"#,
    );
    let before = idx.bytes();
    let before_text = String::from_utf8(before.clone()).unwrap();
    assert!(
        before_text.contains(r#""repo": "x\ud83d""#),
        "{before_text}"
    );
    let original = idx.env.join("original.json");
    fs::write(&original, &before).unwrap();

    // record, lookup and list all work on it.
    idx.run(&["record", "ours", "our-session", "ws", "lead"])
        .ok();
    let after = idx.bytes();
    assert_eq!(
        String::from_utf8_lossy(&node_merge(&original, &idx.path, &["ours"])),
        String::from_utf8_lossy(&after),
        "warmstart's bytes differ from what node writes after the same record"
    );
    assert!(
        after.starts_with(entries_prefix(&before)),
        "an unchanged entry changed its bytes"
    );
    assert!(node_reads_back_unchanged(&after));
    let ours = idx.run(&["lookup", "plain"]).ok();
    let theirs = run(&mut idx.node(&["lookup", "plain"])).ok();
    assert_eq!(ours.out.stdout, theirs.out.stdout);
    assert!(
        ours.stdout().contains(r#""repo": "lc\ud83d""#),
        "{}",
        ours.stdout()
    );
    let list = idx.run(&["list"]).ok();
    assert!(list.stdout().contains("x\\u{d83d}"), "{}", list.stdout());
    assert_eq!(list.stdout().lines().count(), 5, "{}", list.stdout());
    let json = idx.run(&["list", "--json"]).ok();
    assert!(node_reads_back_unchanged(&json.out.stdout));
    assert!(json.stdout().contains(r#""sessionId": "sess-\udc00""#));
    // The repo cut through an emoji cannot name a launcher.
    let r = idx.run(&["resume-cmd", "plain"]).ok();
    assert_eq!(r.stdout(), "repoGolem --resume s2\n");
    assert!(r.stderr().contains("lone surrogate"), "{}", r.stderr());
    // And the JavaScript tool goes on reading what warmstart wrote.
    let js = run(&mut idx.node(&["lookup", "ours"])).ok();
    assert!(js.stdout().contains(r#""sessionId": "our-session""#));
    run(&mut idx.node(&["record", "js-after", "s", "r"])).ok();
    idx.run(&["record", "ours-2", "s", "ws"]).ok();
    assert!(node_reads_back_unchanged(&idx.bytes()));
}

#[test]
fn any_string_the_javascript_tool_writes_round_trips_byte_for_byte() {
    let mut rng = Rng(0x12_0000_5EED);
    let (rounds, per_round) = (3, 100);
    for round in 0..rounds {
        let idx = Idx::new();
        fs::create_dir_all(idx.dir()).unwrap();
        let rows: Vec<[Option<Vec<u16>>; 4]> = (0..per_round)
            .map(|i| {
                // Half the surfaces are hostile too (keys); the prefix keeps
                // them apart from array-index keys, which sort first.
                let surface = if i % 2 == 0 {
                    units(&format!("p{i}"))
                } else {
                    [units("h"), hostile(&mut rng, 10)].concat()
                };
                let role = (rng.below(3) > 0).then(|| hostile(&mut rng, 10));
                [
                    Some(surface),
                    Some(hostile(&mut rng, 10)),
                    Some(hostile(&mut rng, 10)),
                    role,
                ]
            })
            .collect();
        node_records(&idx, "spec.json", &spec(&rows));
        let before = idx.bytes();
        let original = idx.env.join("original.json");
        fs::write(&original, &before).unwrap();
        let surface = format!("ours-{round}");
        idx.run(&["record", &surface, "s", "ws"]).ok();
        let after = idx.bytes();
        assert_eq!(
            String::from_utf8_lossy(&node_merge(&original, &idx.path, &[&surface])),
            String::from_utf8_lossy(&after),
            "round {round}: warmstart's bytes differ from node's"
        );
        assert!(after.starts_with(entries_prefix(&before)), "round {round}");
        let ours = idx.run(&["lookup", "p0"]).ok();
        let theirs = run(&mut idx.node(&["lookup", "p0"])).ok();
        assert_eq!(ours.out.stdout, theirs.out.stdout, "round {round}");
        let list = idx.run(&["list", "--json"]).ok();
        assert!(node_reads_back_unchanged(&list.out.stdout), "round {round}");
        // The table shows every entry on one line each, whatever it holds.
        let table = idx.run(&["list"]).ok();
        assert_eq!(
            table.stdout().lines().count(),
            per_round + 2,
            "round {round}"
        );
    }
}

#[test]
fn javascript_and_warmstart_writers_racing_on_an_index_with_lone_surrogates_lose_nothing() {
    let idx = Idx::new();
    fs::create_dir_all(idx.dir()).unwrap();
    let mut rng = Rng(0xACE5);
    let specs: Vec<String> = (0..4)
        .map(|w| {
            let rows: Vec<_> = (0..8)
                .map(|i| {
                    [
                        Some(units(&format!("js{w}-{i}"))),
                        Some(hostile(&mut rng, 6)),
                        Some([units("x"), vec![0xD83D]].concat()),
                        Some(hostile(&mut rng, 6)),
                    ]
                })
                .collect();
            spec(&rows)
        })
        .collect();
    node_records(&idx, "seed.json", &specs[0]);
    let mut children = Vec::new();
    for (w, spec) in specs.iter().enumerate().skip(1) {
        let file = idx.env.join(format!("spec{w}.json"));
        fs::write(&file, spec).unwrap();
        let mut js = idx.node(&["record-file", file.to_str().unwrap()]);
        children.push(spawn(js.env("WARMSTART_RESUME_LOCK_WAIT_MS", PATIENT_MS)));
    }
    for i in 0..16 {
        let surface = format!("rs-{i}");
        children.push(spawn(&mut idx.patient(&["record", &surface, "s", "ws"])));
    }
    for out in wait_all(children) {
        assert!(out.status.success(), "{}", show(&out));
    }
    // Every row of every spec is there with its exact strings.
    let check = r#"
        const fs = require('fs');
        const x = JSON.parse(fs.readFileSync(process.argv[1], 'utf8'));
        let n = 0;
        for (const f of process.argv.slice(2)) {
            for (const [s, id, repo, role] of JSON.parse(fs.readFileSync(f, 'utf8'))) {
                const e = x.entries[s];
                if (!e || e.sessionId !== id || e.repo !== repo || e.role !== role) {
                    throw new Error('lost or changed: ' + JSON.stringify(s));
                }
                n++;
            }
        }
        process.stdout.write(`${n} ${Object.keys(x.entries).length}\n`);
    "#;
    fs::write(idx.env.join("spec0.json"), &specs[0]).unwrap();
    let mut cmd = node();
    cmd.arg("-e").arg(check).arg(&idx.path);
    for w in 0..4 {
        cmd.arg(idx.env.join(format!("spec{w}.json")));
    }
    assert_eq!(run(&mut cmd).ok().stdout(), "32 48\n");
    assert!(node_reads_back_unchanged(&idx.bytes()));
    assert!(
        idx.leftovers().is_empty(),
        "left behind: {:?}",
        idx.leftovers()
    );
}

fn make_lock_dated(idx: &Idx, ahead: Duration) {
    fs::create_dir(idx.lock()).unwrap();
    fs::File::open(idx.lock())
        .unwrap()
        .set_modified(SystemTime::now() + ahead)
        .unwrap();
}

#[test]
fn a_lock_dated_in_the_future_is_stale_at_once_instead_of_busy_forever() {
    let idx = Idx::new();
    idx.run(&["record", "s0", "zero", "ws"]).ok();
    make_lock_dated(&idx, Duration::from_secs(3600));
    let mut cmd = idx.cmd(&["record", "s1", "one", "ws"]);
    let r = run(cmd.env("WARMSTART_RESUME_LOCK_WAIT_MS", "2000")).ok();
    assert!(
        r.stderr().contains("60m in the future (clock skew"),
        "{}",
        r.stderr()
    );
    assert!(r.stderr().contains(&idx.lock().display().to_string()));
    assert!(idx.read_entries().contains(&"s1".to_string()));
    assert!(!idx.lock().exists());
    // A little ahead (under the limit) is a live writer on a clock that is
    // slightly off: waited on, and the timeout says how far ahead it is.
    make_lock_dated(&idx, Duration::from_secs(5));
    let mut cmd = idx.cmd(&["record", "s2", "two", "ws"]);
    let r = run(cmd.env("WARMSTART_RESUME_LOCK_WAIT_MS", "300")).expect_code(3);
    assert!(r.stderr().contains("in the future"), "{}", r.stderr());
    fs::remove_dir(idx.lock()).unwrap();
    // The JavaScript tool (Date.now() - mtime) still waits on a far-future
    // lock, as the README says.
    make_lock_dated(&idx, Duration::from_secs(3600));
    let mut js = idx.node(&["record", "js", "s", "r"]);
    let out = js
        .env("WARMSTART_RESUME_LOCK_WAIT_MS", "300")
        .output()
        .unwrap();
    assert!(!out.status.success(), "{}", show(&out));
    assert!(idx.lock().is_dir());
}

impl Idx {
    fn read_entries(&self) -> Vec<String> {
        let v: serde_json::Value = serde_json::from_slice(&self.bytes()).unwrap();
        v["entries"].as_object().unwrap().keys().cloned().collect()
    }
}

#[test]
fn a_symlinked_index_stays_a_link_and_its_target_gets_the_writes() {
    let idx = Idx::new();
    fs::create_dir_all(idx.dir()).unwrap();
    let synced = idx.env.join("synced");
    fs::create_dir_all(&synced).unwrap();
    let target = synced.join("crash-resume-index.json");
    // The JavaScript tool wrote the real file, lone surrogate included.
    let mut js = idx.node(&["record", "js", "s", "r"]);
    run(js.env("CRASH_RESUME_INDEX_PATH", &target)).ok();
    std::os::unix::fs::symlink(&target, &idx.path).unwrap();
    let relative = idx.dir().join("relative.json");
    std::os::unix::fs::symlink("../synced/crash-resume-index.json", &relative).unwrap();

    idx.run(&["record", "s1", "one", "ws"]).ok();
    let children = (0..8)
        .map(|i| spawn(&mut idx.patient(&["record", &format!("c{i}"), "s", "ws"])))
        .collect();
    for out in wait_all(children) {
        assert!(out.status.success(), "{}", show(&out));
    }
    let mut via_relative = idx.cmd(&["record", "rel", "s", "ws"]);
    via_relative.args(["--path"]).arg(&relative);
    run(&mut via_relative).ok();

    for link in [&idx.path, &relative] {
        let meta = fs::symlink_metadata(link).unwrap();
        assert!(
            meta.file_type().is_symlink(),
            "{} was replaced",
            link.display()
        );
    }
    assert_eq!(fs::read_link(&idx.path).unwrap(), target);
    let real: serde_json::Value = serde_json::from_slice(&fs::read(&target).unwrap()).unwrap();
    let mut keys: Vec<_> = real["entries"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "c0", "c1", "c2", "c3", "c4", "c5", "c6", "c7", "js", "rel", "s1"
        ]
    );
    // Nothing left beside the link (lock, temp files) or beside the target.
    let mut names: Vec<_> = fs::read_dir(idx.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["index.json", "relative.json"]);
    let names: Vec<_> = fs::read_dir(&synced)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["crash-resume-index.json"]);
    assert!(node_reads_back_unchanged(&fs::read(&target).unwrap()));
    // The JavaScript tool reads through the link too.
    let js = run(&mut idx.node(&["lookup", "s1"])).ok();
    assert!(
        js.stdout().contains(r#""sessionId": "one""#),
        "{}",
        js.stdout()
    );
}

/// One `resume-cmd --json` on a planted entry: (launcher, command, stderr).
fn resume_json(idx: &Idx, surface: &str) -> (String, String, String) {
    let r = idx.run(&["resume-cmd", surface, "--json"]).ok();
    let v: serde_json::Value = serde_json::from_str(&r.stdout()).unwrap();
    (
        v["launcher"].as_str().unwrap().into(),
        v["shell_command"].as_str().unwrap().into(),
        r.stderr(),
    )
}

#[test]
fn a_repo_with_a_slash_or_format_characters_never_names_the_launcher() {
    // Every format character (Unicode Cf) node's ICU knows.
    let list = r#"
        const cf = [];
        for (let c = 0; c < 0x110000; c++) {
            if ((c < 0xD800 || c > 0xDFFF) && /\p{Cf}/u.test(String.fromCodePoint(c))) cf.push(c);
        }
        process.stdout.write(JSON.stringify(cf));
    "#;
    let cf: Vec<u32> =
        serde_json::from_str(&run(node().arg("-e").arg(list)).ok().stdout()).unwrap();
    assert!(cf.len() > 150 && cf.contains(&0x202E) && cf.contains(&0xFEFF));
    let mut rng = Rng(0x1A0_4C4E);
    let benign = |rng: &mut Rng| -> Vec<u16> {
        let words = ["ws", "Warm", "start", "café", "ü", "x-1", "a.b", "_"];
        units(words[rng.below(words.len())])
    };
    let mut hostile_names: Vec<Vec<u16>> = Vec::new();
    for &c in &cf {
        let mut name = units("ws");
        let mut buf = [0u16; 2];
        name.extend_from_slice(char::from_u32(c).unwrap().encode_utf16(&mut buf));
        name.extend(units("x"));
        hostile_names.push(name);
    }
    for c in (0u16..0x20).chain(0x7F..0xA0) {
        hostile_names.push([units("a"), vec![c], units("b")].concat());
    }
    for name in [
        "lc/x",
        "/bin/sh",
        "./x",
        "x/",
        "a/../b",
        "/",
        "..//..",
        "a\u{2028}b",
        "a\u{2029}b",
    ] {
        hostile_names.push(units(name));
    }
    hostile_names.push(units("x").into_iter().chain([0xD83D]).collect());
    hostile_names.push(vec![0xDC00]);
    // Random names: benign text around at least one hostile unit, never at
    // either end (where whitespace such as a newline is trimmed away).
    const BAD: [u16; 10] = [
        0x2F, 0x0A, 0x1B, 0x202E, 0x2066, 0x200B, 0xFEFF, 0xD83D, 0xDE00, 0x7F,
    ];
    for _ in 0..100 {
        let mut name = benign(&mut rng);
        for _ in 0..1 + rng.below(3) {
            let at = 1 + rng.below(name.len());
            name.insert(at, BAD[rng.below(BAD.len())]);
            let more = hostile(&mut rng, 3);
            name.splice(at..at, more);
        }
        name.push(u16::from(b'z'));
        hostile_names.push(name);
    }
    // Names that stay launchers, so the test can tell the two apart.
    let fine = [
        ("Warmstart", "warmstartClaude"),
        ("café", "caféClaude"),
        ("my-repo.v2", "my-repo.v2Claude"),
        ("orchestrator", "orcClaude"),
        (" ws ", "wsClaude"),
        ("x😀", "x😀Claude"),
    ];
    // Names with a lone surrogate go to an index of their own, so that the
    // launcher check runs on the others even where such an index is refused.
    let (plain, lone) = (Idx::new(), Idx::new());
    let mut rows = (Vec::new(), Vec::new());
    let row = |surface: String, name: &[u16]| {
        format!(
            r#""{surface}": {{"surfaceId": "{surface}", "sessionId": "s", "repo": {}, "role": null, "captured_at": 1, "last_active": 1}}"#,
            js_literal(name)
        )
    };
    for (i, name) in hostile_names.iter().enumerate() {
        let to = if String::from_utf16(name).is_ok() {
            &mut rows.0
        } else {
            &mut rows.1
        };
        to.push(row(format!("h{i}"), name));
    }
    for (i, (name, _)) in fine.iter().enumerate() {
        rows.0.push(row(format!("f{i}"), &units(name)));
    }
    for (idx, rows) in [(&plain, &rows.0), (&lone, &rows.1)] {
        fs::create_dir_all(idx.dir()).unwrap();
        let text = format!(r#"{{"version": 1, "entries": {{{}}}}}"#, rows.join(",\n"));
        fs::write(&idx.path, text).unwrap();
    }
    assert!(rows.1.len() > 20, "too few names with lone surrogates");
    let mut checked = 0;
    for wanted_plain in [true, false] {
        for (i, name) in hostile_names.iter().enumerate() {
            if String::from_utf16(name).is_ok() != wanted_plain {
                continue;
            }
            let idx = if wanted_plain { &plain } else { &lone };
            let (launcher, command, stderr) = resume_json(idx, &format!("h{i}"));
            let shown = js_literal(name);
            assert_eq!(launcher, "repoGolem", "repo {shown} named the launcher");
            assert_eq!(command, "repoGolem --resume s", "repo {shown}");
            assert!(
                stderr.contains("warning") && stderr.contains("repoGolem"),
                "repo {shown}: no warning: {stderr}"
            );
            assert!(
                !stderr
                    .chars()
                    .any(|c| c == '\u{1b}' || (c as u32 >= 0x2000 && c as u32 <= 0x206f)),
                "the warning prints what it warns of: {stderr:?}"
            );
            checked += 1;
        }
        if wanted_plain {
            for (i, (name, want)) in fine.iter().enumerate() {
                let (launcher, _, stderr) = resume_json(&plain, &format!("f{i}"));
                assert_eq!(launcher, *want, "repo {name:?}");
                assert_eq!(stderr, "", "repo {name:?}");
            }
        }
    }
    assert_eq!(checked, hostile_names.len());
}

#[test]
fn format_characters_in_a_session_id_or_cwd_are_refused_like_control_characters() {
    let idx = Idx::new();
    fs::create_dir_all(idx.dir()).unwrap();
    fs::write(
        &idx.path,
        r#"{"version": 1, "entries": {
            "a": {"surfaceId": "a", "sessionId": "x\u202e; rm -rf ~ #", "repo": "ws"},
            "b": {"surfaceId": "b", "sessionId": "ok", "repo": "ws", "cwd": "/w/\u2066x\u2069"}}}"#,
    )
    .unwrap();
    for s in ["a", "b"] {
        let r = idx.run(&["resume-cmd", s]).expect_code(4);
        assert_eq!(r.stdout(), "", "surface {s}");
        assert!(r.stderr().contains("format characters"), "{}", r.stderr());
    }
    // A lone surrogate cannot be printed as UTF-8 at all.
    fs::write(
        &idx.path,
        r#"{"version": 1, "entries": {"c": {"surfaceId": "c", "sessionId": "x\ud83d", "repo": "ws"}}}"#,
    )
    .unwrap();
    let r = idx.run(&["resume-cmd", "c"]).expect_code(4);
    assert!(r.stderr().contains("lone surrogate"), "{}", r.stderr());
}

#[test]
fn record_refuses_an_empty_or_blank_repo() {
    let idx = Idx::new();
    for repo in ["", " ", "\t", " \u{3000} "] {
        let r = idx.run(&["record", "p", "s", repo]).expect_code(2);
        assert!(r.stderr().contains("repo"), "{}", r.stderr());
        assert!(!idx.path.exists(), "repo {repo:?} was recorded");
    }
    idx.run(&["record", "p", "s", "ws"]).ok();
    let before = idx.bytes();
    idx.run(&["record", "q", "s", ""]).expect_code(2);
    assert_eq!(idx.bytes(), before);
}
