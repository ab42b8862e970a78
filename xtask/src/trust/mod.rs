//! Trust: signed cache keys, and restores that refuse what the repository
//! does not trust (README "Trust").
//!
//! Each key of a cache branch has a signed statement (`statement`), signed
//! and checked with `ssh-keygen` (`sshsig`) against the allowed signers of
//! the commit being restored for (`policy`). `judge` decides one key's
//! verdict from the branch's bytes; `enforce` turns a verdict into nothing,
//! a warning or exit 12 by the policy; `seen` is the per-clone record of the
//! newest statement seen per key, which refuses rollbacks. Never: read a
//! trust root from a cache branch or the work tree, fetch a chunk before the
//! verdict, or sign another publisher's key.

pub mod armor;
pub mod gatesig;
pub mod policy;
pub mod seen;
pub mod sign;
pub mod sshsig;
pub mod statement;

use anyhow::{Context, Result};
use serde::Serialize;
use std::collections::BTreeMap;
use xshell::Shell;

use crate::cache::format::KeyEntry;
use crate::cache::format::manifest::CacheManifest;
use crate::cache::restore::branch::{Branch, Content};
use crate::exit::{Code, fail};
use crate::git::{CacheGit, TreeEntry};
use crate::repo::Repo;
use policy::{CacheTrust, Policy, Root, Source};
use sshsig::{Verdict, Verifier};
use statement::Statement;

/// Statements larger than this are refused unread: a real one is a few
/// hundred bytes per chunk.
pub const MAX_STATEMENT_BYTES: u64 = 1 << 20;

/// One key's verdict, as `cache status`, `cache list` and `--json` show it.
#[derive(Clone, Debug, Serialize)]
pub struct KeyTrust {
    pub key: String,
    /// `principal (SHA256:...)` of an allowed signer, or the fingerprint of
    /// a key the allowed signers do not list; null when unsigned.
    pub signer: Option<String>,
    /// `trusted`, `unsigned`, `untrusted`, `invalid`, `mismatch`,
    /// `ungated` or `rollback`.
    pub verdict: &'static str,
    /// Why it is not trusted (null when trusted).
    pub reason: Option<String>,
    /// The signed `created_at` (when the statement parsed).
    #[serde(skip)]
    pub created_at: Option<String>,
}

impl KeyTrust {
    pub fn trusted(&self) -> bool {
        self.verdict == "trusted"
    }

    fn not(key: &str, verdict: &'static str, signer: Option<String>, reason: String) -> KeyTrust {
        KeyTrust {
            key: key.to_string(),
            signer,
            verdict,
            reason: Some(reason),
            created_at: None,
        }
    }
}

/// The files of one key on a branch, as bytes (`None`: not on the branch).
pub struct KeyFiles {
    pub statement: Option<Vec<u8>>,
    pub sig: Option<Vec<u8>>,
}

/// Checks keys against one trust root.
pub struct Checker {
    pub root: Root,
    verifier: Option<Verifier>,
    state_dir: std::path::PathBuf,
    repo_root: std::path::PathBuf,
    /// Each cache's `[trust]` table at HEAD, read once.
    committed: std::collections::HashMap<String, CacheTrust>,
}

impl Checker {
    /// Reads the trust root at HEAD of `repo`.
    pub fn new(sh: &Shell, repo: &Repo) -> Result<Checker> {
        Ok(Checker {
            root: policy::load_root(sh, repo)?,
            verifier: None,
            state_dir: repo.state_dir(),
            repo_root: repo.root.clone(),
            committed: std::collections::HashMap::new(),
        })
    }

    /// Cache `name`'s `[trust]` table as committed at HEAD
    /// (`policy::committed_cache_trust`): never the work tree's.
    pub fn cache_trust(&mut self, sh: &Shell, name: &str) -> Result<CacheTrust> {
        if let Some(t) = self.committed.get(name) {
            return Ok(t.clone());
        }
        let t = policy::committed_cache_trust(sh, &self.repo_root, name)?;
        self.committed.insert(name.to_string(), t.clone());
        Ok(t)
    }

    /// The verdict on `key` of cache `m` (its warmstart.json `entry` and
    /// its files), with `seen` the newest created_at this clone saw.
    pub fn judge(
        &mut self,
        sh: &Shell,
        m: &CacheManifest,
        key: &str,
        entry: &KeyEntry,
        files: &KeyFiles,
        seen: Option<&str>,
    ) -> Result<KeyTrust> {
        let committed = self.cache_trust(sh, &m.name)?;
        let (cache, trust): (&str, &CacheTrust) = (&m.name, &committed);
        let Some(text) = &files.statement else {
            return Ok(KeyTrust::not(
                key,
                "unsigned",
                None,
                format!("it has no signed statement ({})", statement::file_name(key)),
            ));
        };
        let Some(sig) = &files.sig else {
            return Ok(KeyTrust::not(
                key,
                "unsigned",
                None,
                format!(
                    "its statement has no signature ({})",
                    statement::sig_name(key)
                ),
            ));
        };
        let Some(verdict) = self.verify(sh, &trust.principals, text, sig)? else {
            return Ok(KeyTrust::not(
                key,
                "untrusted",
                None,
                format!(
                    "{} does not exist, so nobody is allowed",
                    self.root.signers_where()
                ),
            ));
        };
        let signer = match signer_of(verdict, key, trust) {
            Ok(signer) => signer,
            Err(refused) => return Ok(refused),
        };
        Ok(judge_statement(
            cache, key, entry, text, signer, seen, trust,
        ))
    }

    /// Whether `sig` is a good signature over `text` by one of `principals`
    /// of the allowed signers (`None`: the trust root lists none).
    fn verify(
        &mut self,
        sh: &Shell,
        principals: &[String],
        text: &[u8],
        sig: &[u8],
    ) -> Result<Option<Verdict>> {
        let Some(allowed) = &self.root.allowed_signers else {
            return Ok(None);
        };
        if self.verifier.is_none() {
            let dir = sshsig::scratch_dir(&self.state_dir, "verify");
            self.verifier = Some(Verifier::new(dir, allowed)?);
        }
        let verifier = self.verifier.as_mut().expect("set above");
        // A signature this clone already verified against these very
        // signers is not verified again (`seen::verified`): a publish that
        // keeps three other keys, or `cache status`, costs no process for
        // them. Only trusted results are remembered.
        sshsig::count_check();
        let memo = seen::verified_digest(allowed, principals, text, sig);
        let memo_file = seen::verified_path(&self.state_dir);
        if let Some((principal, fingerprint)) = seen::verified(&memo_file, &memo) {
            return Ok(Some(Verdict::Trusted {
                principal,
                fingerprint,
            }));
        }
        let v = verifier.verify(sh, sig, text, principals)?;
        if let Verdict::Trusted {
            principal,
            fingerprint,
        } = &v
        {
            seen::remember_verified(&memo_file, &memo, principal, fingerprint);
        }
        Ok(Some(v))
    }
}

/// The signer `principal (fingerprint)` of a good signature, or the verdict
/// on a key whose signature is not one.
fn signer_of(verdict: Verdict, key: &str, trust: &CacheTrust) -> Result<String, KeyTrust> {
    match verdict {
        Verdict::Trusted {
            principal,
            fingerprint,
        } => Ok(format!("{principal} ({fingerprint})")),
        Verdict::Untrusted {
            fingerprint,
            principals,
        } => {
            let why = if principals.is_empty() {
                "its signing key is not an allowed signer".to_string()
            } else {
                format!(
                    "its signer {} is not among this cache's [trust] principals [{}]",
                    principals.join(", "),
                    trust.principals.join(", ")
                )
            };
            Err(KeyTrust::not(key, "untrusted", Some(fingerprint), why))
        }
        Verdict::Invalid => Err(KeyTrust::not(
            key,
            "invalid",
            None,
            "its signature does not verify over its statement".into(),
        )),
    }
}

/// The verdict on a key whose statement `signer` signed: the statement must
/// say what warmstart.json says, be no older than the newest one this clone
/// saw (`seen`), and be gated unless the cache allows it.
fn judge_statement(
    cache: &str,
    key: &str,
    entry: &KeyEntry,
    text: &[u8],
    signer: String,
    seen: Option<&str>,
    trust: &CacheTrust,
) -> KeyTrust {
    let parsed = match std::str::from_utf8(text)
        .map_err(|_| anyhow::anyhow!("is not UTF-8"))
        .and_then(Statement::parse)
    {
        Ok(s) => s,
        Err(e) => {
            return KeyTrust::not(
                key,
                "mismatch",
                Some(signer),
                format!("its signed statement cannot be read ({e:#})"),
            );
        }
    };
    let expected = Statement::from_entry(cache, key, entry);
    if let Some(field) = parsed.first_difference(&expected) {
        return KeyTrust::not(
            key,
            "mismatch",
            Some(signer),
            format!("warmstart.json disagrees with its signed statement in `{field}`"),
        );
    }
    let mut verdict = KeyTrust {
        key: key.to_string(),
        signer: Some(signer),
        verdict: "trusted",
        reason: None,
        created_at: Some(parsed.created_at.clone()),
    };
    if let Some(seen) = seen
        && parsed.created_at.as_str() < seen
    {
        verdict.verdict = "rollback";
        verdict.reason = Some(format!(
            "its signed statement of {} is older than the one of {seen} this machine already saw (a rollback)",
            parsed.created_at
        ));
    } else if parsed.ungated && !trust.allow_ungated {
        verdict.verdict = "ungated";
        verdict.reason = Some(
            "it was published --allow-ungated and its manifest does not set [trust] allow_ungated = true"
                .into(),
        );
    }
    verdict
}

/// The one line of a refusal (exit 12) or a `warn` policy's warning.
pub fn refusal_line(cache: &str, branch: &Branch, v: &KeyTrust, root: &Root) -> String {
    let planted = if branch.entries.iter().any(|e| e.name == "allowed_signers") {
        format!("; the allowed_signers on branch {} is ignored", branch.name)
    } else {
        String::new()
    };
    // Signed, but by nobody allowed now: the usual story is a signer taken
    // out of allowed_signers, whose keys are refused from then on.
    let removed = match (&v.signer, v.verdict) {
        (Some(signer), "untrusted") => format!(
            "; if {signer} was an allowed signer and was removed, its keys stay refused: republish them (`{cmd} cache publish {cache}`), or next time re-sign them with `{cmd} cache resign {cache} --signing-key KEY` before the old signer is removed",
            cmd = crate::invocation::command()
        ),
        _ => String::new(),
    };
    format!(
        "untrusted: key {} of cache {cache} on branch {} ({}): {}; signer seen: {}; who may sign is listed in {}{planted}{removed}",
        v.key,
        branch.name,
        v.verdict,
        v.reason.as_deref().unwrap_or("not trusted"),
        v.signer.as_deref().unwrap_or("none"),
        root.signers_where(),
    )
}

/// The files of `key` on `branch`, read from cache.git.
pub fn key_files(git: &CacheGit, branch: &Branch, key: &str) -> Result<KeyFiles> {
    let mut all = files_of_keys(git, &branch.entries, &[key.to_string()])?;
    Ok(all.remove(key).expect("asked for"))
}

/// The statement and signature of each of `keys`, from a branch's tree
/// `entries`, read with one `git cat-file --batch` (the branch fetch
/// brings small blobs; an oversized one is not read and cannot match).
pub fn files_of_keys(
    git: &CacheGit,
    entries: &[TreeEntry],
    keys: &[String],
) -> Result<BTreeMap<String, KeyFiles>> {
    let find = |name: String| {
        entries
            .iter()
            .find(|e| e.name == name && e.kind == "blob")
            .cloned()
    };
    let mut wanted = Vec::new();
    for k in keys {
        wanted.push(find(statement::file_name(k)));
        wanted.push(find(statement::sig_name(k)));
    }
    let to_read: Vec<&TreeEntry> = wanted
        .iter()
        .flatten()
        .filter(|e| e.size.is_some_and(|s| s <= MAX_STATEMENT_BYTES))
        .collect();
    let mut bytes: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    if !to_read.is_empty() {
        let input: String = to_read.iter().map(|e| format!("{}\n", e.oid)).collect();
        let mut cmd = git.git();
        cmd.args(["cat-file", "--batch"]);
        let out = run_with_stdin(cmd, input.as_bytes())
            .with_context(|| format!("reading statements in {}", git.dir.display()))?;
        let answers = policy::parse_batch(&out, to_read.len())
            .with_context(|| format!("reading statements in {}", git.dir.display()))?;
        for (e, a) in to_read.iter().zip(answers) {
            if let Some((_, b)) = a {
                bytes.insert(e.oid.clone(), b);
            }
        }
    }
    let get = |e: &Option<TreeEntry>| -> Option<Vec<u8>> {
        e.as_ref().map(|e| {
            bytes
                .get(&e.oid)
                .cloned()
                .unwrap_or_else(|| b"(too large to be a statement)".to_vec())
        })
    };
    Ok(keys
        .iter()
        .zip(wanted.chunks(2))
        .map(|(k, pair)| {
            (
                k.clone(),
                KeyFiles {
                    statement: get(&pair[0]),
                    sig: get(&pair[1]),
                },
            )
        })
        .collect())
}

/// Runs `cmd` with `input` on stdin; its stdout, or an error with its stderr.
fn run_with_stdin(mut cmd: std::process::Command, input: &[u8]) -> Result<Vec<u8>> {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running git cat-file")?;
    // Small input (a line per blob): written whole before reading.
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(input)
        .context("writing to git cat-file")?;
    let out = child
        .wait_with_output()
        .context("waiting for git cat-file")?;
    if !out.status.success() {
        anyhow::bail!(
            "git cat-file failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.stdout)
}

/// What a cold restore or `cache verify` checked, for `--json`.
#[derive(Clone, Debug, Serialize)]
pub struct Checked {
    pub policy: &'static str,
    /// The key's verdict (null with policy `off`).
    pub key: Option<KeyTrust>,
    /// Set when no policy is set at all: the line a restore prints.
    pub note: Option<String>,
}

/// What the check of one key decided, before any chunk is fetched.
pub enum Gate {
    /// The policy lets it through (trusted, `warn` after its warning, or
    /// `off`).
    Pass(Checked),
    /// `require` refuses it: its verdict and the one refusal line.
    Refused { verdict: KeyTrust, line: String },
}

/// The check of a restore or verify, before any chunk is fetched: nothing
/// with `off` (and `note`, the line `cache restore` prints, when no policy
/// is set at all), a warning with
/// `warn`, exit 12 with `require`. A trusted key is recorded as seen.
pub fn check_before_fetch(
    sh: &Shell,
    repo: &Repo,
    m: &CacheManifest,
    git: &CacheGit,
    branch: &Branch,
    key: &str,
) -> Result<Checked> {
    let mut checker = Checker::new(sh, repo)?;
    match check_key(sh, repo, &mut checker, m, git, branch, key)? {
        Gate::Pass(checked) => Ok(checked),
        Gate::Refused { line, .. } => {
            Err(fail(Code::Untrusted, format!("{line}; {}", untouched(git))))
        }
    }
}

/// What a refusal before the chunk fetch left behind, said literally: the
/// branch fetch brought the branch's small blobs (the pusher's small
/// chunks among them) into the private store, and none was read.
pub fn untouched(git: &CacheGit) -> String {
    format!(
        "only the branch itself was fetched (its files under the blob limit, into {}), and none of its chunks was read or decoded; nothing was installed",
        git.dir.display()
    )
}

/// `check_before_fetch` without the exit: `require`'s refusal is returned,
/// so that a fallback restore can skip the key and try the next one.
pub fn check_key(
    sh: &Shell,
    repo: &Repo,
    checker: &mut Checker,
    m: &CacheManifest,
    git: &CacheGit,
    branch: &Branch,
    key: &str,
) -> Result<Gate> {
    let committed = checker.cache_trust(sh, &m.name)?;
    let (policy, source) = checker.root.effective(&committed);
    let note = (source == Source::Unset).then(|| {
        format!(
            "note: no trust policy: {} is not in HEAD, so signatures of cache {} are not checked (policy off); see docs/trust.md",
            policy::TRUST_FILE,
            m.name
        )
    });
    if policy == Policy::Off {
        return Ok(Gate::Pass(Checked {
            policy: policy.name(),
            key: None,
            note,
        }));
    }
    let verdict = match &branch.content {
        Content::Legacy { .. } => KeyTrust::not(
            key,
            "unsigned",
            None,
            "a legacy branch has no signed statements: republish it with `cache publish`".into(),
        ),
        Content::V1(manifest) => {
            let Some(entry) = manifest.keys.get(key) else {
                // No such key: `Branch::plan` says so with its own code.
                return Ok(Gate::Pass(Checked {
                    policy: policy.name(),
                    key: None,
                    note,
                }));
            };
            let files = key_files(git, branch, key)?;
            let seen_file = seen::path(&repo.state_dir());
            let seen = seen::load(&seen_file)?;
            let last = seen.get(&m.name, key);
            checker.judge(sh, m, key, entry, &files, last)?
        }
    };
    if !verdict.trusted() {
        let line = refusal_line(&m.name, branch, &verdict, &checker.root);
        if policy == Policy::Require {
            return Ok(Gate::Refused { verdict, line });
        }
        eprintln!("warning: {line} (policy warn: restoring anyway)");
    } else if let Some(at) = &verdict.created_at {
        seen::record(&seen::path(&repo.state_dir()), &m.name, key, at)?;
    }
    Ok(Gate::Pass(Checked {
        policy: policy.name(),
        key: Some(verdict),
        note,
    }))
}
