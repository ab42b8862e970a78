//! Write-back on a miss: when the branch has no key for today's pins and no
//! fallback stands in, a restore whose manifest sets `[build] on_miss`
//! builds the key here (`cache::build::run`), then publishes it where this
//! machine may, and otherwise installs it from the pack root and stamps it
//! built-not-published.
//!
//! "May publish" is `cache publish`'s own rule, checked before anything is
//! packed: HEAD on the remote's branch (`publish::pushed`), the manifest's
//! gates green for this tree on records that count (`gates::require_green`,
//! signed ones only under `signed_gates`), and a signing key where the trust
//! policy is `require`; the publish itself then refuses a key not allowed
//! for this cache. A published key is installed the ordinary way, verified
//! from the branch. An unpublished one is installed from the pack root
//! through the same staging and swap as a restore (`unpack`), and its stamp
//! carries `built`, so the warm path stays free of network calls until
//! `build.recheck` sends a restore to the branch again; that recheck
//! rebuilds only when the pack root no longer holds what was installed.
//! Before any of that, `cache::build::publishable` (before the build and
//! after it): HEAD and the key unchanged, no change under an input.
//! Never: build a key the branch has, build where `build.platforms` says
//! not to, build from a foreground step, or push what a gate did not clear.

use super::*;

use crate::cache::build::Built;
use crate::cache::format::trust::Policy;
use crate::cache::publish::pack;

/// What a write-back did.
#[derive(Debug)]
pub struct WriteBack {
    /// The key built (or found built) here.
    pub key: String,
    /// The build, when one ran (`None`: the pack root still held the
    /// unpublished install's tree, so no build was needed).
    pub built: Option<Built>,
    /// Set when this machine published the key: the restore from the
    /// branch that followed.
    pub published: Option<RestoreOutcome>,
    /// Set when it did not: why, and what to run where to publish it (as
    /// the stamp's `built.unpublished` says).
    pub unpublished: Option<String>,
    /// The install's target.
    pub target: PathBuf,
}

/// The write-back for a restore of `name` that failed with `miss`: `Err`
/// with `miss` itself (perhaps with why no build runs) when it was not an
/// exact miss or the manifest does not build on one; `background` says
/// whether the restore step runs in the background worker (the only place
/// a build runs from).
pub fn on_miss(
    sh: &Shell,
    repo: &Repo,
    name: &str,
    opts: &RestoreOptions,
    background: bool,
    miss: anyhow::Error,
) -> Result<WriteBack> {
    if crate::exit::code_of(&miss) != Code::NotFound || opts.key.is_some() {
        return Err(miss);
    }
    let Ok(m) = crate::cache::manifests::load(repo, name) else {
        return Err(miss);
    };
    let Some(b) = m.build.as_ref().filter(|b| b.on_miss) else {
        return Err(miss);
    };
    if let Err(why) = b.allowed_here(&crate::cache::format::key::platform(), &m.file) {
        return Err(miss.context(format!("no write-back build: {why}")));
    }
    if !background {
        return Err(miss.context(format!(
            "build.on_miss builds a missing key only from a background step: set `background = true` on this step in restore.toml, or run `{} cache build {name}`",
            crate::invocation::command()
        )));
    }
    let key = crate::cache::manifests::compute_key(sh, repo, &m)?;
    let state_dir = records_dir(repo, &m)?;
    let stamp_file = stamp::path(&state_dir, name);
    let (lock, _) = lock_target(&state_dir, &m.restore_path, opts.lock_timeout)?;
    // Pins read HEAD, the build reads the work tree: what is published
    // under `key` must be what HEAD held then and still holds.
    let before = crate::cache::build::Before::take(sh, repo, &key.value);
    let dirty = crate::cache::build::publishable(sh, repo, &m, &before).err();
    let built = if still_built(&m, &key, &stamp_file)? {
        None
    } else {
        Some(crate::cache::build::run(repo, &m)?)
    };
    let remote = opts.remote.clone().unwrap_or_else(|| m.remote.clone());
    let unpublishable = dirty
        .or_else(|| crate::cache::build::publishable(sh, repo, &m, &before).err())
        .map(|why| fail(Code::Config, why));
    let refusal = match unpublishable.map_or_else(|| may_publish(sh, repo, &m, &remote), Err) {
        Ok(()) => {
            let req = crate::cache::publish::Request {
                name: name.to_string(),
                remote: opts.remote.clone(),
                expect_key: Some(key.value.clone()),
                quiet: true,
                ..Default::default()
            };
            crate::cache::publish::publish(sh, repo, &req).err()
        }
        Err(e) => Some(e),
    };
    let Some(refusal) = refusal else {
        // Installed the ordinary way: fetched and verified from the branch.
        drop(lock);
        let o = restore_named(sh, repo, name, opts)?;
        return Ok(WriteBack {
            key: key.value,
            built,
            published: Some(o),
            unpublished: None,
            target: m.restore_path.clone(),
        });
    };
    let unpublished = publish_hint(sh, repo, &m, &remote, &refusal);
    install_built(sh, repo, &m, &key, &stamp_file, &unpublished)?;
    drop(lock);
    Ok(WriteBack {
        key: key.value,
        built,
        published: None,
        unpublished: Some(unpublished),
        target: m.restore_path.clone(),
    })
}

/// Why the stamp of cache `name` says its install was built here and not
/// published, when it does and its key is today's: for the table's
/// warning on a warm run. Reads the stamp only.
pub fn unpublished(sh: &Shell, repo: &Repo, name: &str) -> Option<String> {
    let m = crate::cache::manifests::load(repo, name).ok()?;
    let key = crate::cache::manifests::compute_key(sh, repo, &m).ok()?;
    let file = stamp::path(&records_place(repo, &m), name);
    match stamp::load(&file) {
        Loaded::Found(s) if s.key == key.value => s.built.map(|b| b.unpublished),
        _ => None,
    }
}

/// Whether the install is this key, built here and unpublished, and the
/// pack root still holds exactly the tree that was installed: then a
/// recheck needs no new build, only another try at publishing.
fn still_built(m: &CacheManifest, key: &Key, stamp_file: &Path) -> Result<bool> {
    let Loaded::Found(s) = stamp::load(stamp_file) else {
        return Ok(false);
    };
    if s.built.is_none() || s.key != key.value || ready(m).is_err() || !m.pack_root.is_dir() {
        return Ok(false);
    }
    let plan = pack::plan(m)?;
    let digest = pack::tar_digest(&plan, &mut |_| {})?;
    Ok(digest.sha256 == s.tar_sha256 && digest.size == s.tar_size)
}

/// `cache publish`'s refusals, asked before anything is packed: HEAD not
/// on the remote, gates not green for this tree, no signing key where the
/// policy requires one.
fn may_publish(sh: &Shell, repo: &Repo, m: &CacheManifest, remote: &str) -> Result<()> {
    let out = crate::cache::publish::report::Reporter::new(true, false);
    if m.registry.is_none() {
        let remote = crate::git::resolve_remote(sh, &repo.root, remote)?;
        crate::cache::publish::pushed::check(sh, &repo.root, &remote, false, &out)?;
    }
    let signed = m
        .trust
        .signed_gates
        .then(|| format!("{} sets [trust] signed_gates = true", m.file.display()));
    crate::gates::require_green(sh, repo, &m.gates, signed).with_context(|| {
        format!(
            "publishing {} requires gates [{}]",
            m.name,
            m.gates.join(", ")
        )
    })?;
    let checker = crate::trust::Checker::new(sh, repo)?;
    let (policy, _) = checker.root.effective(&m.trust);
    if policy == Policy::Require && crate::trust::sign::signing_key(None).is_none() {
        return Err(fail(
            Code::Untrusted,
            format!(
                "no signing key on this machine ({} is unset) and the trust policy of cache {} is `require`",
                crate::trust::sign::KEY_VAR,
                m.name
            ),
        ));
    }
    Ok(())
}

/// The line an unpublished build leaves in the stamp, the table and
/// `restore status`: why, and exactly what to run where.
fn publish_hint(
    sh: &Shell,
    repo: &Repo,
    m: &CacheManifest,
    remote: &str,
    refusal: &anyhow::Error,
) -> String {
    let cmd = crate::invocation::command();
    let signing = crate::trust::Checker::new(sh, repo)
        .ok()
        .filter(|c| c.root.effective(&m.trust).0 == Policy::Require)
        .map(|c| {
            format!(
                " --signing-key <a key listed in {}>",
                c.root.signers_where()
            )
        })
        .unwrap_or_default();
    let mut needs = vec![format!("HEAD on {}", crate::redact::url(remote))];
    if !m.gates.is_empty() {
        needs.push(format!(
            "gates [{}] green for this tree",
            m.gates.join(", ")
        ));
    }
    if !signing.is_empty() {
        needs.push(format!("a signing key allowed for cache {}", m.name));
    }
    format!(
        "built here, not published ({refusal:#}): to publish it, run `{cmd} cache publish {name}{signing}` on a machine with {} (such as the CI job that publishes caches)",
        needs.join(", "),
        name = m.name,
    )
}

/// Installs the pack root into the restore path (unless they are one
/// directory) through a staging directory and one swap, then writes the
/// built-not-published stamp. The stamp goes before and comes back after,
/// so it never describes a half-replaced target.
fn install_built(
    sh: &Shell,
    repo: &Repo,
    m: &CacheManifest,
    key: &Key,
    stamp_file: &Path,
    unpublished: &str,
) -> Result<()> {
    let plan = pack::plan(m)?;
    stamp::remove(stamp_file)?;
    let (digest, files) = if m.pack_root == m.restore_path {
        let d = pack::tar_digest(&plan, &mut |_| {})?;
        (d, plan.items.len() as u64)
    } else {
        let staging = unpack::staging_dir_for(&m.restore_path)?;
        let mut tar_file = staging.clone().into_os_string();
        tar_file.push(".tar");
        let tar_file = PathBuf::from(tar_file);
        let result = (|| -> Result<(pack::TarDigest, u64)> {
            let f = File::create(&tar_file)
                .with_context(|| format!("creating {}", tar_file.display()))?;
            let mut w = std::io::BufWriter::new(f);
            let d = pack::write_tar(&plan, &mut w, &mut |_| {})?;
            w.flush()
                .with_context(|| format!("writing {}", tar_file.display()))?;
            drop(w);
            let opts = unpack::Options {
                absolute_symlinks: m.absolute_symlinks.clone(),
                ..unpack::Options::default()
            };
            let r =
                File::open(&tar_file).with_context(|| format!("reading {}", tar_file.display()))?;
            let stats = unpack::extract_tar(r, &staging, &unpack::Limits::GENEROUS, &opts)?;
            unpack::swap_dir(&staging, &m.restore_path)?;
            Ok((
                d,
                stats.files + stats.dirs + stats.symlinks + stats.hardlinks,
            ))
        })();
        let _ = std::fs::remove_file(&tar_file);
        if result.is_err() {
            let _ = unpack::remove_staging(&staging);
        }
        result.with_context(|| {
            format!(
                "installing the build of cache {} from {} into {}",
                m.name,
                m.pack_root.display(),
                m.restore_path.display()
            )
        })?
    };
    let now = clock::now_ms();
    let head = sh
        .cmd("git")
        .args(["-C"])
        .arg(&repo.root)
        .args(["rev-parse", "--verify", "--quiet", "HEAD"])
        .quiet()
        .ignore_stderr()
        .read()
        .unwrap_or_default();
    let s = Stamp {
        source: "this machine's build".into(),
        commit: head,
        layout: "built".into(),
        tar_sha256: digest.sha256,
        tar_size: digest.size,
        files,
        built: Some(stamp::Built {
            unpublished: unpublished.to_string(),
            checked_at_ms: now,
        }),
        ..Stamp::of(m, key, now)
    };
    stamp::store(stamp_file, &s)?;
    ready(m).map_err(|why| {
        anyhow!(
            "cache {} was built and installed at {}, but its ready-probe fails: {why}",
            m.name,
            m.restore_path.display()
        )
    })
}
