//! The gate evidence rule as a property: over records generated from a fixed
//! seed (unsigned, signed by a stranger, signed by the allowed signer for
//! another tree, another gate or another command digest, replayed for
//! exactly this one, merged from two), a gate is skipped or a publish
//! accepted only on a trusted entry of exactly that tree, gate and command
//! (under `signed_gates`), or, without it, a skip only on this clone's own
//! entry. Real signatures by ssh-keygen, checked against allowed_signers at
//! HEAD of a real repository, through the library's `gates::evidence`.

use crate::util::rng::Rng;
use crate::util::{TestEnv, show};
use std::collections::BTreeMap;
use std::process::Command;
use warmstart::gates::evidence::{self, Rule, Standing, Use};
use warmstart::gates::manifest::Gate;
use warmstart::gates::record::{Entry, Record};

/// Generated cases, each judged for both gates under every rule and use.
const CASES: usize = 400;
/// Cases per setup run through the binary (each a few processes).
const BINARY_CASES: usize = 15;

const SIGNED_GATES: &str = "policy = \"require\"\nsigned_gates = true\n";

/// The attestation a gate signature is over, spelled out here so that the
/// format is pinned too.
fn attestation(tree: &str, gate: &str, digest: &str) -> String {
    format!("warmstart-gate 1\ntree {tree}\ngate {gate}\ndigest {digest}\n")
}

fn sign(env: &TestEnv, key: &str, text: &str) -> String {
    let data = env.join("to-sign");
    std::fs::write(&data, text).unwrap();
    let _ = std::fs::remove_file(data.with_extension("sig"));
    let out = Command::new("ssh-keygen")
        .args(["-q", "-Y", "sign", "-n", "warmstart-cache", "-f"])
        .arg(env.join(format!("keys/{key}")))
        .arg(&data)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", show(&out));
    std::fs::read_to_string(data.with_extension("sig")).unwrap()
}

/// A signature in the pool, and what it was made over.
struct Sig {
    text: String,
    key: &'static str,
    tree: String,
    gate: String,
    digest: String,
}

struct World {
    tree: String,
    gates: Vec<Gate>,
    pool: Vec<Sig>,
    digests: Vec<String>,
}

impl World {
    /// The one signature that makes an entry of `gate` with `digest` trusted.
    fn exact(&self, gate: &str, digest: &str) -> Option<&Sig> {
        self.pool
            .iter()
            .find(|s| s.key == "ci" && s.tree == self.tree && s.gate == gate && s.digest == digest)
    }

    /// The oracle: signed by the allowed signer over exactly this tree, this
    /// gate and its current digest.
    fn trusted(&self, gate: &Gate, e: &Entry) -> bool {
        let sig = e.extra.get("signature").and_then(|v| v.as_str());
        e.digest == gate.digest
            && sig.is_some_and(|s| {
                self.pool.iter().any(|p| {
                    p.text == s
                        && p.key == "ci"
                        && p.tree == self.tree
                        && p.gate == gate.name
                        && p.digest == gate.digest
                })
            })
    }

    fn entry(&self, rng: &mut Rng, gate: &Gate) -> Entry {
        let digest = match rng.below(10) {
            0 | 1 => rng.pick(&self.digests).clone(),
            _ => gate.digest.clone(),
        };
        let mut extra = serde_json::Map::new();
        let sig = match rng.below(20) {
            0..=3 => None,
            4 => Some("-----BEGIN SSH SIGNATURE-----\nAAAA\n-----END SSH SIGNATURE-----\n".into()),
            // A replay of the allowed signer's signature for exactly this
            // gate and the entry's digest (trusted when that is current).
            5..=10 => self.exact(&gate.name, &digest).map(|s| s.text.clone()),
            _ => Some(rng.pick(&self.pool).text.clone()),
        };
        if let Some(s) = sig {
            extra.insert("signature".into(), s.into());
        }
        Entry {
            digest,
            command: "true".into(),
            cwd: ".".into(),
            duration_ms: rng.below(1000) as u64,
            host: rng.pick(&["ci", "laptop", "pusher"]).to_string(),
            tool: "warmstart 0.1.0".into(),
            finished_at: format!("2026-12-0{}T00:00:0{}Z", 1 + rng.below(3), rng.below(10)),
            commit: "c0ffee".into(),
            extra,
        }
    }

    fn record(&self, rng: &mut Rng) -> Record {
        let mut r = Record::new(&self.tree);
        for g in &self.gates {
            if rng.chance(85) {
                r.insert(&g.name, self.entry(rng, g));
            }
        }
        r
    }
}

/// Repository `dir` with gates `test` and `lint`, `ci` its one allowed
/// signer (`evil`, a key made beside it, is a stranger), trust.toml `trust`
/// (none: no file), a cache `art` requiring both gates with the further
/// manifest tables `cache_trust`, pushed to `<dir>.git`; and the pool of
/// signatures: each key over this tree and another, each gate, each gate's
/// digest and a made-up one.
fn world(env: &TestEnv, dir: &str, trust: Option<&str>, cache_trust: &str) -> World {
    for k in ["ci", "evil"] {
        if !env.join(format!("keys/{k}")).exists() {
            env.ssh_key(k);
        }
    }
    let repo = env.work_repo(dir);
    let other = env
        .git(dir, ["rev-parse", "HEAD^{tree}"])
        .trim()
        .to_string();
    std::fs::create_dir_all(repo.join("cache-manifests")).unwrap();
    std::fs::write(
        repo.join("cache-manifests/gates.toml"),
        "[[gate]]\nname = \"test\"\ncommand = \"true\"\n\n[[gate]]\nname = \"lint\"\ncommand = [\"true\", \"lint\"]\n",
    )
    .unwrap();
    let ci = std::fs::read_to_string(env.join("keys/ci.pub")).unwrap();
    std::fs::write(
        repo.join("cache-manifests/allowed_signers"),
        format!("ci {ci}"),
    )
    .unwrap();
    if let Some(t) = trust {
        std::fs::write(repo.join("cache-manifests/trust.toml"), t).unwrap();
    }
    let src = env.join(format!("src-{dir}"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("tool"), "a tool\n").unwrap();
    crate::util::fixture::Manifest::literal("1", &src)
        .publish("gates = [\"test\", \"lint\"]")
        .extra(cache_trust)
        .write(&repo, "art");
    env.git(dir, ["add", "-A"]);
    env.git(dir, ["commit", "-q", "-m", "gates and trust"]);
    let origin = env.bare_remote(&format!("{dir}.git"));
    env.git(dir, ["remote", "add", "origin", origin.to_str().unwrap()]);
    env.git(dir, ["push", "-q", "origin", "main"]);
    let tree = env
        .git(dir, ["rev-parse", "HEAD^{tree}"])
        .trim()
        .to_string();
    let gates = warmstart::gates::manifest::load(&repo).unwrap().gates;
    let mut digests: Vec<String> = gates.iter().map(|g| g.digest.clone()).collect();
    digests.push(format!("sha256:{}", "0".repeat(64)));
    let mut pool = Vec::new();
    for key in ["ci", "evil"] {
        for t in [&tree, &other] {
            for g in ["test", "lint"] {
                for d in &digests {
                    pool.push(Sig {
                        text: sign(env, key, &attestation(t, g, d)),
                        key,
                        tree: t.clone(),
                        gate: g.into(),
                        digest: d.clone(),
                    });
                }
            }
        }
    }
    let texts: std::collections::BTreeSet<&String> = pool.iter().map(|p| &p.text).collect();
    assert_eq!(texts.len(), pool.len(), "one signature per text");
    World {
        tree,
        gates,
        pool,
        digests,
    }
}

/// What the rule must say of one gate, from the oracle alone.
fn expected(
    w: &World,
    rule: Rule,
    use_: Use,
    g: &Gate,
    shared: Option<&Entry>,
    mine: Option<&Entry>,
) -> (bool, &'static str) {
    let current = |e: Option<&Entry>| e.is_some_and(|e| e.digest == g.digest);
    let trusted = |e: Option<&Entry>| e.is_some_and(|e| w.trusted(g, e));
    let counts = match (rule, use_) {
        (Rule::Signed, _) => trusted(shared) || trusted(mine),
        (Rule::Open, Use::Skip) => current(mine),
        (Rule::Open, Use::Publish) => current(shared) || current(mine),
    };
    let kind = if counts {
        "counts"
    } else if current(shared) || current(mine) {
        "not-evidence"
    } else if shared.is_none() && mine.is_none() {
        "missing"
    } else {
        "stale"
    };
    (counts, kind)
}

fn kind(s: &Standing) -> &'static str {
    match s {
        Standing::Counts(_) => "counts",
        Standing::NotEvidence(_) => "not-evidence",
        Standing::Missing => "missing",
        Standing::Stale => "stale",
    }
}

#[test]
fn gate_evidence_is_only_a_trusted_entry_of_exactly_this_tree_gate_and_command() {
    let env = TestEnv::new();
    let w = world(&env, "work", Some(SIGNED_GATES), "");
    let sh = xshell::Shell::new().unwrap();
    let repo = warmstart::repo::Repo::discover(&env.join("work")).unwrap();
    let mut judge = warmstart::trust::gatesig::Judge::new(&sh, &repo).unwrap();
    assert!(judge.root.signed_gates);
    let mut rng = Rng(0x6a7e_5eed_0000_0001);
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    for case in 0..CASES {
        // None, one record, or two merged (as a fetch of diverged records does).
        let shared = match rng.below(10) {
            0 => None,
            1..=6 => Some(w.record(&mut rng)),
            _ => {
                let (a, b) = (w.record(&mut rng), w.record(&mut rng));
                let m = a.merge(&b);
                for (name, e) in &m.gates {
                    assert!(
                        a.gates.get(name) == Some(e) || b.gates.get(name) == Some(e),
                        "case {case}: a merge changed the entry of {name} (its signature must travel with it)"
                    );
                }
                *tally.entry("merged records".into()).or_default() += 1;
                Some(m)
            }
        };
        let mut own = BTreeMap::new();
        for g in &w.gates {
            if rng.chance(40) {
                own.insert(g.name.clone(), w.entry(&mut rng, g));
            }
        }
        for g in &w.gates {
            let s = shared.as_ref().and_then(|r| r.gates.get(&g.name));
            let mine = own.get(&g.name);
            for rule in [Rule::Signed, Rule::Open] {
                for use_ in [Use::Skip, Use::Publish] {
                    let got = evidence::standing(
                        &sh,
                        &mut judge,
                        rule,
                        use_,
                        &w.tree,
                        g,
                        shared.as_ref(),
                        &own,
                    )
                    .unwrap();
                    let (counts, want) = expected(&w, rule, use_, g, s, mine);
                    assert_eq!(
                        kind(&got),
                        want,
                        "case {case}, gate {}, {rule:?} {use_:?}: shared {s:#?}, own {mine:#?}",
                        g.name
                    );
                    if let Standing::Counts(e) = &got {
                        // What counts is what a publish embeds: it must be
                        // a candidate, and under the signed rule a trusted one.
                        assert!(Some(&**e) == s || Some(&**e) == mine, "case {case}");
                        if rule == Rule::Signed {
                            assert!(w.trusted(g, e), "case {case}: counted an untrusted entry");
                        }
                    }
                    *tally
                        .entry(format!(
                            "{rule:?} {use_:?} {}",
                            if counts { "counts" } else { "refused" }
                        ))
                        .or_default() += 1;
                }
            }
            if let Some(e) = s.into_iter().chain(mine).next() {
                let sig = e.extra.get("signature").and_then(|v| v.as_str());
                let what = match w.pool.iter().find(|p| Some(p.text.as_str()) == sig) {
                    None if sig.is_none() => "unsigned",
                    None => "not a signature",
                    Some(p) if p.key == "evil" => "signed by a stranger",
                    Some(p) if p.tree != w.tree => "signed for another tree",
                    Some(p) if p.gate != g.name => "signed for another gate",
                    Some(p) if p.digest != e.digest => "signed for another digest",
                    Some(_) if e.digest != g.digest => "signed, digest not current",
                    Some(_) => "trusted, exactly this one",
                };
                *tally.entry(what.into()).or_default() += 1;
            }
        }
    }
    // Every kind of case was generated, and some of each outcome.
    for must in [
        "unsigned",
        "not a signature",
        "signed by a stranger",
        "signed for another tree",
        "signed for another gate",
        "signed for another digest",
        "trusted, exactly this one",
        "merged records",
        "Signed Skip counts",
        "Signed Skip refused",
        "Open Skip counts",
        "Open Skip refused",
        "Open Publish counts",
        "Open Publish refused",
    ] {
        assert!(
            tally.get(must).is_some_and(|n| *n > 0),
            "no case of {must}: {tally:#?}"
        );
    }
    eprintln!("{CASES} cases: {tally:#?}");
}

/// A setup of the binary's property: trust.toml, the cache's own tables,
/// and the rule each use must follow there.
struct Mode {
    name: &'static str,
    trust: Option<&'static str>,
    cache_trust: &'static str,
    skip: Rule,
    publish: Rule,
}

const MODES: [Mode; 3] = [
    Mode {
        name: "trust.toml signed_gates",
        trust: Some(SIGNED_GATES),
        cache_trust: "",
        skip: Rule::Signed,
        publish: Rule::Signed,
    },
    Mode {
        name: "the cache's [trust] signed_gates",
        trust: Some("policy = \"require\"\n"),
        cache_trust: "\n[trust]\nsigned_gates = true\n",
        skip: Rule::Open,
        publish: Rule::Signed,
    },
    Mode {
        name: "no policy",
        trust: None,
        cache_trust: "",
        skip: Rule::Open,
        publish: Rule::Open,
    },
];

fn xt(env: &TestEnv, dir: &str, args: &[&str]) -> crate::util::Run {
    crate::util::run(env.xtask_in(dir).args(args))
}

/// git in `dir` that may fail; its stdout when it did not.
fn git_maybe(env: &TestEnv, dir: &str, args: &[&str], input: Option<&[u8]>) -> Option<String> {
    use std::io::Write;
    let mut cmd = Command::new("git");
    cmd.current_dir(env.join(dir)).args(args);
    env.isolate(&mut cmd);
    cmd.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.unwrap_or_default()).unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The local record of the world's tree in `dir`, read with plain git.
fn local_record(env: &TestEnv, dir: &str, w: &World) -> Option<Record> {
    let spec = format!("refs/warmstart/gates/{}:gates.json", w.tree);
    let text = git_maybe(env, dir, &["cat-file", "blob", &spec], None)?;
    Some(Record::parse(text.as_bytes(), &w.tree).unwrap())
}

/// A record someone else pushed: `record`, as a commit on `dir`'s origin.
fn push_foreign(env: &TestEnv, dir: &str, w: &World, record: &Record) {
    let blob = git_maybe(
        env,
        dir,
        &["hash-object", "-w", "--stdin"],
        Some(&record.to_bytes()),
    )
    .unwrap();
    let listing = format!("100644 blob {blob}\tgates.json\n");
    let tree = git_maybe(env, dir, &["mktree"], Some(listing.as_bytes())).unwrap();
    let commit = git_maybe(
        env,
        dir,
        &["commit-tree", &tree, "-m", "someone's record"],
        None,
    )
    .unwrap();
    let dst = format!("{commit}:refs/warmstart/gates/{}", w.tree);
    env.git(dir, ["push", "-q", "origin", &dst]);
}

/// Through the binary: own runs (`gates run`, unsigned or signed by the
/// allowed signer or a stranger), records someone else pushed (generated as
/// above) fetched and merged over them, then `gates run --skip-green` and
/// `cache publish`. Under each setup's rule a gate is skipped, and a publish
/// accepted, only as the oracle says; a refused publish is exit 9 when a gate
/// has no entry of its current definition at all, else 12.
#[test]
fn gate_records_skip_and_publish_only_as_the_rule_says_through_the_binary() {
    let env = TestEnv::new();
    let mut rng = Rng(0x6a7e_5eed_0000_0002);
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    for (m, mode) in MODES.iter().enumerate() {
        let dir = format!("work{m}");
        let w = world(&env, &dir, mode.trust, mode.cache_trust);
        let dir = dir.as_str();
        let refname = format!("refs/warmstart/gates/{}", w.tree);
        for case in 0..BINARY_CASES {
            let at = format!("{}, case {case}", mode.name);
            git_maybe(&env, dir, &["update-ref", "-d", &refname], None);
            git_maybe(
                &env,
                &format!("{dir}.git"),
                &["update-ref", "-d", &refname],
                None,
            );
            let _ = std::fs::remove_dir_all(env.join(dir).join(".git/warmstart/gates/own"));

            // This clone's own runs, and each one's signature as recorded.
            let mut own: BTreeMap<String, Option<&str>> = BTreeMap::new();
            if rng.chance(60) {
                let key = *rng.pick(&[None, Some("ci"), Some("evil")]);
                let names: Vec<&str> = w
                    .gates
                    .iter()
                    .filter(|_| rng.chance(60))
                    .map(|g| g.name.as_str())
                    .collect();
                if !names.is_empty() {
                    let mut args = vec!["gates", "run"];
                    args.extend(&names);
                    let k = key.map(|k| env.join(format!("keys/{k}")));
                    if let Some(k) = &k {
                        args.extend(["--signing-key", k.to_str().unwrap()]);
                    }
                    xt(&env, dir, &args).ok();
                    for n in names {
                        own.insert(n.to_string(), key);
                    }
                }
            }
            let own_sigs: BTreeMap<String, String> = local_record(&env, dir, &w)
                .map(|r| {
                    r.gates
                        .iter()
                        .filter_map(|(n, e)| {
                            Some((n.clone(), e.extra.get("signature")?.as_str()?.to_string()))
                        })
                        .collect()
                })
                .unwrap_or_default();
            // Someone else's record, fetched (merged when both have one).
            if rng.chance(75) {
                push_foreign(&env, dir, &w, &w.record(&mut rng));
                let r = xt(&env, dir, &["gates", "fetch", "--json"]).ok();
                let fetched: serde_json::Value = serde_json::from_str(&r.stdout()).unwrap();
                *tally
                    .entry(format!("fetch {}", fetched["result"].as_str().unwrap()))
                    .or_default() += 1;
            }
            let shared = local_record(&env, dir, &w);

            // The oracle.
            let mut skip_want = Vec::new();
            let (mut all, mut any_absent) = (true, false);
            for g in &w.gates {
                let s = shared.as_ref().and_then(|r| r.gates.get(&g.name));
                let own_sig = own_sigs.get(&g.name).map(String::as_str);
                let trusted_shared = s.is_some_and(|e| {
                    w.trusted(g, e)
                        || (own.get(&g.name) == Some(&Some("ci"))
                            && e.digest == g.digest
                            && e.extra.get("signature").and_then(|v| v.as_str()) == own_sig)
                });
                let own_trusted = own.get(&g.name) == Some(&Some("ci"));
                let current = s.is_some_and(|e| e.digest == g.digest) || own.contains_key(&g.name);
                let signed = trusted_shared || own_trusted;
                let skip = match mode.skip {
                    Rule::Signed => signed,
                    Rule::Open => own.contains_key(&g.name),
                };
                if skip {
                    skip_want.push(g.name.clone());
                }
                all &= match mode.publish {
                    Rule::Signed => signed,
                    Rule::Open => current,
                };
                any_absent |= !current;
            }
            let code_want = if all {
                0
            } else if any_absent || mode.publish == Rule::Open {
                9
            } else {
                12
            };

            let r = xt(
                &env,
                dir,
                &["gates", "run", "--skip-green", "--no-record", "--json"],
            )
            .ok();
            let doc: serde_json::Value = serde_json::from_str(&r.stdout()).unwrap();
            let skipped: Vec<String> = doc["gates"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|g| g["result"] == "already-green")
                .map(|g| g["name"].as_str().unwrap().to_string())
                .collect();
            let mut skip_want_sorted = skip_want.clone();
            skip_want_sorted.sort();
            let mut skipped_sorted = skipped.clone();
            skipped_sorted.sort();
            assert_eq!(
                skipped_sorted, skip_want_sorted,
                "{at}: skipped; own {own:?}, shared {shared:#?}"
            );
            let key = env.join("keys/ci");
            let mut args = vec!["cache", "publish", "art", "--json"];
            if mode.trust.is_some() {
                args.extend(["--signing-key", key.to_str().unwrap()]);
            }
            let p = xt(&env, dir, &args);
            assert_eq!(
                p.code(),
                code_want,
                "{at}: publish; own {own:?}, shared {shared:#?}\n{}",
                show(&p.out)
            );
            *tally
                .entry(format!("skipped {}", skipped.len()))
                .or_default() += 1;
            *tally
                .entry(format!("publish exit {code_want}"))
                .or_default() += 1;
        }
    }
    for must in [
        "publish exit 0",
        "publish exit 9",
        "publish exit 12",
        "fetch merged",
        "skipped 0",
        "skipped 1",
    ] {
        assert!(
            tally.get(must).is_some_and(|n| *n > 0),
            "no case of {must}: {tally:#?}"
        );
    }
    eprintln!(
        "{} cases through the binary: {tally:#?}",
        MODES.len() * BINARY_CASES
    );
}
