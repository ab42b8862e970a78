//! Signed statement version 2 (the fields of the framed format): what it adds to version 1 is
//! bound, so a pusher who cannot sign changes none of it. The restore
//! refuses (exit 12) before a chunk of the new key is fetched, and the
//! install stays; the shell bootstrap reads version 2 and refuses a version
//! it does not know. Real ssh-keygen keys, a real `git daemon`, branches
//! crafted by `cache_format_compat` from a real publish's tar.

use crate::cache_format_compat::{
    Cx, Files, Shape, branch_of, craft, sign_into, statement_of, tar_of,
};
use crate::util::rng::Rng;
use crate::util::{show, source_root};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::PathBuf;

/// Chunks above this stay out of the branch fetch, so that a chunk in
/// cache.git means a chunk was fetched.
const BLOB_LIMIT: &str = "8k";
const LIMIT_BYTES: usize = 8 << 10;

/// `art-1` installed from a trusted publish; then, with the pin moved to 2,
/// the honest signed version 2 branch of `art-2` (frames, raw digests, an
/// index, key parts), its entry, and its files.
fn setup() -> (Cx, Value, Files) {
    let cx = Cx::new();
    cx.policy(Some("require"));
    cx.publish(Some("ci")).ok();
    cx.restore(&[]).ok();
    cx.pin("2", "");
    cx.content("second");
    cx.commit("pin 2");
    cx.publish(Some("ci")).ok();
    let (tar, base) = tar_of(&cx.branch(), "art-2");
    let (mut entry, mut chunks) = craft(&cx.env, "art-2", &tar, &base, Shape::Frames(6));
    assert!(
        chunks.values().all(|c| c.len() > LIMIT_BYTES),
        "chunks stay out of the branch fetch"
    );
    // The published key's own per-file index: the crafted chunks hold the
    // same tar.
    let published = cx.branch();
    entry["index"] = base["index"].clone();
    // Stored whole (the shape before parts, still read): this test is
    // about what the statement binds of `index`.
    let index: Vec<u8> = base["index_parts"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| published[p["file"].as_str().unwrap()].clone())
        .collect();
    entry.as_object_mut().unwrap().remove("index_parts");
    assert_eq!(entry["index"]["file"], "art-2.files.zst", "{base}");
    assert!(
        !entry["key_parts"].as_array().unwrap().is_empty(),
        "{entry}"
    );
    chunks.insert("art-2.files.zst".into(), index);
    let mut files = branch_of(vec![("art-2", entry.clone(), chunks)]);
    let text = statement_of("art", "art-2", &entry);
    assert!(text.starts_with("warmstart-statement 2\n"), "{text}");
    assert!(text.len() < LIMIT_BYTES);
    sign_into(&cx, &mut files, "art-2", &text, "ci");
    (cx, entry, files)
}

/// The object ids cache.git holds (enumerated: no lazy fetch of a missing one).
fn local_objects(cx: &Cx) -> BTreeSet<String> {
    let dir = cx.work.join(".git/warmstart/cache.git");
    let out = std::process::Command::new("git")
        .arg("--git-dir")
        .arg(&dir)
        .args([
            "cat-file",
            "--batch-all-objects",
            "--batch-check=%(objectname)",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", show(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// The chunk store's files and the oids of `entry`'s chunks on origin.
fn chunk_oids(cx: &Cx, entry: &Value) -> Vec<String> {
    let bare = cx.env.join("srv/origin.git");
    entry["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let spec = format!("art-cache:{}", c["file"].as_str().unwrap());
            cx.env.git(&bare, ["rev-parse", &spec]).trim().to_string()
        })
        .collect()
}

fn store(cx: &Cx) -> BTreeSet<String> {
    std::fs::read_dir(cx.work.join(".git/warmstart/cache.git/chunks"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// One hostile edit of a covered field, as a pusher who knows the format
/// but cannot sign would make it: warmstart.json stays valid and
/// SHA256SUMS agrees, the signed statement and signature stay.
fn mutate(rng: &mut Rng, e: &mut Value, files: &mut Files) -> &'static str {
    let n = e["chunks"].as_array().unwrap().len();
    let hex = |rng: &mut Rng| format!("{:016x}", rng.next()).repeat(4);
    match rng.below(12) {
        0 => {
            e["chunks"][rng.below(n)]["raw_sha256"] = hex(rng).into();
            "raw"
        }
        1 => {
            // Bytes moved between two chunks' raw sizes: the sum still holds.
            let (i, j) = (rng.below(n), rng.below(n));
            let d = 1 + rng.below(512) as u64;
            let (a, b) = (
                e["chunks"][i]["raw_size"].as_u64().unwrap(),
                e["chunks"][j]["raw_size"].as_u64().unwrap(),
            );
            if i == j {
                e["chunks"][i]["raw_size"] = a.into();
                e["chunks"][i]["raw_sha256"] = hex(rng).into();
            } else {
                e["chunks"][i]["raw_size"] = (a + d).into();
                e["chunks"][j]["raw_size"] = (b - d).into();
            }
            "raw"
        }
        2 => {
            let level = e["frames"]["level"].as_i64().unwrap();
            e["frames"]["level"] = (level + 1 + rng.below(18) as i64).into();
            "frames"
        }
        3 => {
            let field = *rng.pick(&["min_size", "avg_size", "max_size"]);
            e["frames"][field] =
                (e["frames"][field].as_u64().unwrap() + 1 + rng.below(1 << 20) as u64).into();
            "frames"
        }
        4 => {
            match rng.below(3) {
                0 => e["frames"]["zstd"] = "1.5.0".into(),
                1 => e["frames"]["checksum"] = false.into(),
                _ => e["frames"]["window_log"] = (20 + rng.below(8)).into(),
            }
            "frames"
        }
        5 => {
            e["index"]["sha256"] = hex(rng).into();
            "index"
        }
        6 => {
            e["index"]["size"] =
                (e["index"]["size"].as_u64().unwrap() + 1 + rng.below(100) as u64).into();
            "index"
        }
        7 => {
            e.as_object_mut().unwrap().remove("index");
            files.remove("art-2.files.zst");
            "index"
        }
        8 => {
            let parts = e["key_parts"].as_array_mut().unwrap();
            let i = rng.below(parts.len());
            // Appended to, so the edit never writes the value back (a
            // random 0-999 was "2", the pin's own value, once in a thousand).
            let old = parts[i]["value"].as_str().unwrap().to_string();
            parts[i]["value"] = format!("{old}{}", rng.next() % 1000).into();
            "key_parts"
        }
        9 => {
            let parts = e["key_parts"].as_array_mut().unwrap();
            if rng.chance(50) {
                parts.push(serde_json::json!({"name": "platform", "value": "x86_64-linux"}));
            } else {
                parts.clear();
            }
            "key_parts"
        }
        10 => {
            // Every new field dropped: the entry now renders version 1.
            let o = e.as_object_mut().unwrap();
            o.remove("frames");
            o.remove("index");
            files.remove("art-2.files.zst");
            for c in o["chunks"].as_array_mut().unwrap() {
                let c = c.as_object_mut().unwrap();
                c.remove("raw_size");
                c.remove("raw_sha256");
            }
            "key_parts"
        }
        _ => {
            // The index renamed, its file with it.
            let bytes = files.remove("art-2.files.zst").unwrap();
            files.insert("art-2.old.files.zst".into(), bytes);
            e["index"]["file"] = "art-2.old.files.zst".into();
            "index"
        }
    }
}

/// Never: a signed version 2 key whose warmstart.json changes a field the
/// statement covers (a raw digest, the frames, the index, the key parts)
/// restores. Each generated edit is exit 12 with one line naming the field,
/// before any chunk of the key is fetched, and the install stays.
#[test]
fn any_edit_of_a_field_version_2_covers_is_refused_before_a_chunk_is_read() {
    let (cx, entry, files) = setup();
    let env = [("WARMSTART_FETCH_BLOB_LIMIT", BLOB_LIMIT)];
    let before = cx.installed();
    assert!(!before.0.is_empty());
    let mut rng = Rng(0x5eed_0018_c0de_0002 ^ u64::from(std::process::id()));
    for round in 0..14 {
        let (mut e, mut f) = (entry.clone(), files.clone());
        let field = mutate(&mut rng, &mut e, &mut f);
        let mut chunks: Files = f.clone();
        chunks.retain(|name, _| name.contains(".tar.zst.part") || name.ends_with(".files.zst"));
        let mut branch = branch_of(vec![("art-2", e.clone(), chunks)]);
        for s in ["art-2.statement", "art-2.statement.sig"] {
            branch.insert(s.into(), f[s].clone());
        }
        cx.push(&branch);
        let r = cx.restore(&env);
        assert_eq!(
            r.code(),
            12,
            "round {round}: {field} edit not refused\n{}",
            show(&r.out)
        );
        let err = r.stderr();
        let line = err
            .lines()
            .find(|l| l.contains("untrusted: key art-2"))
            .unwrap_or_else(|| panic!("{err}"));
        assert!(
            line.contains(&format!("`{field}`")),
            "round {round}: {line}"
        );
        assert_eq!(cx.installed(), before, "round {round}: the install changed");
        let objects = local_objects(&cx);
        for oid in chunk_oids(&cx, &e) {
            assert!(
                !objects.contains(&oid),
                "round {round}: chunk {oid} was fetched"
            );
        }
        let sums: Vec<&str> = e["chunks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["sha256"].as_str().unwrap())
            .collect();
        assert!(
            store(&cx).iter().all(|s| !sums.contains(&s.as_str())),
            "round {round}: a chunk reached the store"
        );
    }
    // The same branch unedited restores.
    cx.push(&files);
    let r = cx.restore(&env).ok();
    let v: Value = serde_json::from_str(&r.stdout()).unwrap();
    assert_eq!(v["trust"]["key"]["verdict"], "trusted", "{v}");
    crate::util::tree::assert_same_tree(&cx.src(), &cx.target);
}

/// The shell bootstrap reads a version 2 statement (its chunk lines and
/// fields), and refuses a validly signed version it does not know, going
/// on to its next fallback with exit 12.
#[test]
fn the_bootstrap_reads_version_2_and_refuses_an_unknown_version() {
    let (cx, entry, mut files) = setup();
    let tools = cx.work.join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    std::fs::copy(
        source_root().join("tools/warmstart-bootstrap.sh"),
        tools.join("warmstart-bootstrap.sh"),
    )
    .unwrap();
    let manifest = cx.work.join("cache-manifests/art.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(
        &manifest,
        format!("{text}\n[bootstrap]\nexec = \"bin/tool\"\n"),
    )
    .unwrap();
    cx.commit("bootstrap");
    let boot = || {
        let mut cmd = std::process::Command::new("bash");
        cmd.arg(tools.join("warmstart-bootstrap.sh"))
            .arg("--prebuilt-only")
            .current_dir(&cx.work);
        cx.env.isolate(&mut cmd);
        crate::util::run(&mut cmd)
    };
    cx.push(&files);
    let r = boot();
    assert!(
        r.stderr().contains("binary cache: art-2 is signed by ci"),
        "{}",
        show(&r.out)
    );
    assert!(
        r.stdout().contains("second"),
        "ran the installed tool\n{}",
        show(&r.out)
    );

    let v3 = statement_of("art", "art-2", &entry).replacen(
        "warmstart-statement 2",
        "warmstart-statement 3",
        1,
    );
    sign_into(&cx, &mut files, "art-2", &v3, "ci");
    cx.push(&files);
    let _ = std::fs::remove_file(cx.work.join(".git/warmstart/bootstrap/art.key"));
    let r = boot();
    assert_eq!(r.code(), 12, "{}", show(&r.out));
    assert!(
        r.stderr()
            .contains("is version 3 and this script reads versions 1 and 2 only"),
        "{}",
        show(&r.out)
    );
}

/// A chunk the machine already holds (in its chunk store, from the key it
/// installed) is reused only after the new key's signature check passed:
/// the stored copies are damaged on purpose, and a refused key that shares
/// them leaves them exactly as they were (a read would have found the
/// damage and replaced them); the honest key then restores.
#[test]
fn a_stored_chunk_is_not_read_for_a_key_that_is_refused() {
    let cx = Cx::new();
    let env = [("WARMSTART_FETCH_BLOB_LIMIT", BLOB_LIMIT)];
    // A path remote: chunks are read straight from the server's pack into
    // the chunk store.
    let bare = cx.env.join("srv/origin.git");
    cx.env.git(
        "work",
        ["remote", "set-url", "origin", bare.to_str().unwrap()],
    );
    cx.policy(Some("require"));
    cx.publish(Some("ci")).ok();
    let (tar, base) = tar_of(&cx.branch(), "art-1");
    let signed = |key: &str, e: &Value, chunks: Files| {
        let mut files = branch_of(vec![(key, e.clone(), chunks)]);
        sign_into(&cx, &mut files, key, &statement_of("art", key, e), "ci");
        files
    };
    let (e1, c1) = craft(&cx.env, "art-1", &tar, &base, Shape::Frames(5));
    cx.push(&signed("art-1", &e1, c1));
    cx.restore(&env).ok();
    let before = cx.installed();
    let stored: Vec<PathBuf> = store(&cx)
        .iter()
        .map(|s| cx.work.join(".git/warmstart/cache.git/chunks").join(s))
        .collect();
    assert_eq!(
        stored.len(),
        5,
        "the installed key's chunks are in the store"
    );
    for p in &stored {
        let mut bytes = std::fs::read(p).unwrap();
        bytes.iter_mut().for_each(|b| *b ^= 0x5a);
        std::fs::write(p, bytes).unwrap();
    }
    let damaged: Vec<(Vec<u8>, std::time::SystemTime)> = stored
        .iter()
        .map(|p| {
            (
                std::fs::read(p).unwrap(),
                std::fs::metadata(p).unwrap().modified().unwrap(),
            )
        })
        .collect();

    // The same tar under key art-2: the same chunk bytes, so every chunk is
    // one the machine holds.
    cx.pin("2", "");
    cx.commit("pin 2");
    let mut base2 = base.clone();
    base2["key_parts"][0]["value"] = "2".into();
    let (e2, c2) = craft(&cx.env, "art-2", &tar, &base2, Shape::Frames(5));
    let honest = signed("art-2", &e2, c2.clone());
    let mut forged = e2.clone();
    forged["frames"]["level"] = 19.into();
    let mut branch = branch_of(vec![("art-2", forged, c2)]);
    for s in ["art-2.statement", "art-2.statement.sig"] {
        branch.insert(s.into(), honest[s].clone());
    }
    cx.push(&branch);
    let r = cx.restore(&env);
    assert_eq!(r.code(), 12, "{}", show(&r.out));
    assert!(r.stderr().contains("`frames`"), "{}", show(&r.out));
    assert_eq!(cx.installed(), before);
    for (p, (bytes, mtime)) in stored.iter().zip(&damaged) {
        assert_eq!(
            &std::fs::read(p).unwrap(),
            bytes,
            "{} was touched",
            p.display()
        );
        assert_eq!(&std::fs::metadata(p).unwrap().modified().unwrap(), mtime);
    }

    cx.push(&honest);
    let r = cx.restore(&env).ok();
    let v: Value = serde_json::from_str(&r.stdout()).unwrap();
    assert_eq!(v["trust"]["key"]["verdict"], "trusted", "{v}");
    crate::util::tree::assert_same_tree(&cx.src(), &cx.target);
}
