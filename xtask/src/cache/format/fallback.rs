//! Fallback keys: which branch key stands in when the exact key is missing.
//!
//! In the spirit of actions/cache's `restore-keys`, but explicit: the
//! manifest lists `[[restore.fallback]]` entries in order, each either
//! `drop = [parts]` (a key whose other parts equal today's) or `prefix =
//! "..."`. The first entry that matches any branch key wins, and among its
//! matches the newest by `created_at` (then the greatest name, so the
//! choice is stable). Pure: reads `warmstart.json` as parsed, nothing else.

use serde::Serialize;

use crate::cache::format::manifest::{Fallback, Key};
use crate::cache::format::{BranchManifest, KeyEntry};
use crate::clock::parse_rfc3339_ms;

/// One key part whose value differs between the exact key and the one used.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PartDiff {
    pub name: String,
    pub wanted: Option<String>,
    pub used: Option<String>,
}

/// The stand-in chosen for an exact key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    pub key: String,
    pub fallback: Fallback,
    pub differs: Vec<PartDiff>,
}

fn matches(f: &Fallback, wanted: &Key, key: &str, e: &KeyEntry) -> bool {
    match f {
        Fallback::Prefix(p) => key.starts_with(p.as_str()),
        Fallback::Drop(dropped) => {
            // Same pins, and every pin that is not dropped has today's value.
            // The parts are branch data that no statement signs; the key's
            // name is signed. Parts that do not spell the name (a pusher
            // relabelling another platform's key) never match.
            spells(wanted, key, e)
                && e.key_parts.len() == wanted.parts.len()
                && wanted.parts.iter().all(|w| {
                    e.key_parts
                        .iter()
                        .find(|p| p.name == w.name)
                        .is_some_and(|p| dropped.contains(&w.name) || p.value == w.value)
                })
        }
    }
}

/// Whether `key` is the name `e.key_parts` give, after the prefix (the
/// cache's name) that `wanted` has.
fn spells(wanted: &Key, key: &str, e: &KeyEntry) -> bool {
    let tail = |parts: &[crate::cache::format::KeyPart]| {
        let k = crate::cache::format::manifest::key_from_parts("x", parts.to_vec()).value;
        k["x".len()..].to_string()
    };
    let Some(prefix) = wanted.value.strip_suffix(&tail(&wanted.parts)) else {
        return false;
    };
    key.strip_prefix(prefix) == Some(tail(&e.key_parts).as_str())
}

/// The parts that differ between `wanted` and branch key entry `e`.
pub fn differs(
    wanted: &[crate::cache::format::KeyPart],
    used: &[crate::cache::format::KeyPart],
) -> Vec<PartDiff> {
    let mut out = Vec::new();
    for w in wanted {
        let u = used.iter().find(|p| p.name == w.name);
        if u.is_none_or(|u| u.value != w.value) {
            out.push(PartDiff {
                name: w.name.clone(),
                wanted: Some(w.value.clone()),
                used: u.map(|u| u.value.clone()),
            });
        }
    }
    for u in used {
        if !wanted.iter().any(|w| w.name == u.name) {
            out.push(PartDiff {
                name: u.name.clone(),
                wanted: None,
                used: Some(u.value.clone()),
            });
        }
    }
    out
}

/// The newest key of `branch` that the first matching fallback allows, if
/// any; never `wanted` itself.
pub fn choose(fallbacks: &[Fallback], wanted: &Key, branch: &BranchManifest) -> Option<Choice> {
    candidates(fallbacks, wanted, branch).into_iter().next()
}

/// Every key of `branch` some fallback allows, in the order they are tried:
/// fallback by fallback as the manifest lists them, and within one the
/// newest first (by `created_at`, then the greatest name, so the order is
/// stable). A key appears once, under the first fallback that allows it;
/// never `wanted` itself. A restore installs the first one the trust policy
/// lets through (README "Fallback keys").
pub fn candidates(fallbacks: &[Fallback], wanted: &Key, branch: &BranchManifest) -> Vec<Choice> {
    let mut out: Vec<Choice> = Vec::new();
    for f in fallbacks {
        let mut found: Vec<(&String, &KeyEntry)> = branch
            .keys
            .iter()
            .filter(|(k, e)| **k != wanted.value && matches(f, wanted, k, e))
            .filter(|(k, _)| !out.iter().any(|c| &c.key == *k))
            .collect();
        found.sort_by(|a, b| {
            parse_rfc3339_ms(&b.1.created_at)
                .cmp(&parse_rfc3339_ms(&a.1.created_at))
                .then_with(|| b.0.cmp(a.0))
        });
        out.extend(found.into_iter().map(|(k, e)| Choice {
            key: k.clone(),
            fallback: f.clone(),
            differs: differs(&wanted.parts, &e.key_parts),
        }));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::format::{Chunk, KeyPart};

    fn part(n: &str, v: &str) -> KeyPart {
        KeyPart {
            name: n.into(),
            value: v.into(),
        }
    }

    fn entry(parts: &[(&str, &str)], created: &str) -> KeyEntry {
        KeyEntry {
            archive: "k.tar.zst".into(),
            compression: "zstd".into(),
            chunks: vec![Chunk {
                file: "k.tar.zst.part000".into(),
                size: 1,
                sha256: "a".repeat(64),
                raw_size: None,
                raw_sha256: None,
            }],
            tar_sha256: "b".repeat(64),
            tar_size: 1,
            files: 1,
            key_parts: parts.iter().map(|(n, v)| part(n, v)).collect(),
            source_commit: None,
            source_tree: None,
            gates: serde_json::Value::Null,
            ungated: false,
            created_at: created.into(),
            tool_version: "t".into(),
            frames: None,
            index: None,
            index_parts: Vec::new(),
        }
    }

    #[test]
    fn the_first_fallback_that_matches_wins_and_its_newest_key() {
        let mut b = BranchManifest::new();
        b.keys.insert(
            "vc-1-x".into(),
            entry(&[("src", "1"), ("platform", "x")], "2026-01-02T00:00:00Z"),
        );
        b.keys.insert(
            "vc-0-x".into(),
            entry(&[("src", "0"), ("platform", "x")], "2026-01-03T00:00:00Z"),
        );
        b.keys.insert(
            "vc-1-y".into(),
            entry(&[("src", "1"), ("platform", "y")], "2026-01-09T00:00:00Z"),
        );
        let wanted = Key {
            value: "vc-2-x".into(),
            parts: vec![part("src", "2"), part("platform", "x")],
        };
        let drop_src = Fallback::Drop(vec!["src".into()]);
        let c = choose(std::slice::from_ref(&drop_src), &wanted, &b).unwrap();
        // vc-1-y is newer but of another platform; vc-0-x is the newest x.
        assert_eq!(c.key, "vc-0-x");
        assert_eq!(
            c.differs,
            [PartDiff {
                name: "src".into(),
                wanted: Some("2".into()),
                used: Some("0".into())
            }]
        );
        // A fallback that matches nothing passes to the next.
        let none = Fallback::Prefix("zz-".into());
        let any = Fallback::Prefix("vc-".into());
        let c = choose(&[none.clone(), any.clone(), drop_src.clone()], &wanted, &b).unwrap();
        assert_eq!((c.key.as_str(), c.fallback), ("vc-1-y", any.clone()));
        assert_eq!(choose(&[none], &wanted, &b), None);
        // Dropping a part the keys do not differ in finds nothing.
        let drop_platform = Fallback::Drop(vec!["platform".into()]);
        assert_eq!(choose(&[drop_platform], &wanted, &b), None);
        // The exact key is never its own stand-in.
        b.keys.insert(
            "vc-2-x".into(),
            entry(&[("src", "2"), ("platform", "x")], "2026-01-10T00:00:00Z"),
        );
        assert_eq!(
            choose(std::slice::from_ref(&drop_src), &wanted, &b)
                .unwrap()
                .key,
            "vc-0-x"
        );
        // The order candidates are tried in: the first fallback's keys
        // newest first, then the next fallback's keys not seen yet.
        let order: Vec<String> = candidates(&[drop_src, any], &wanted, &b)
            .into_iter()
            .map(|c| c.key)
            .collect();
        assert_eq!(order, ["vc-0-x", "vc-1-x", "vc-1-y"]);
    }
}
