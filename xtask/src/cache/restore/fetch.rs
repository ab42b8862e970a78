//! The fetch step: the cache branch into cache.git, read and cross-checked
//! before any key of it is used. It never installs anything.

use super::*;

/// A spinner (`crate::progress`) when `on`, else a hidden one.
pub fn spinner(on: bool, what: String) -> indicatif::ProgressBar {
    if on {
        crate::progress::spinner(what)
    } else {
        crate::progress::hidden()
    }
}

/// Fetches `m`'s branch into cache.git, without its big chunks (see
/// `CacheGit::try_fetch_branch`), and reads it (cross-checked). The chunks
/// of a v1 key are fetched by `unpack_into` as it reads them; the parts of
/// a legacy branch (no declared sizes) are fetched here.
pub fn fetch(
    sh: &Shell,
    repo: &Repo,
    m: &CacheManifest,
    remote: Option<&str>,
    progress: bool,
) -> Result<(CacheGit, Branch)> {
    let mut git = CacheGit::open(sh, repo)?;
    git.set_network(&m.network)?;
    let remote = git.resolve_remote(sh, remote.unwrap_or(&m.remote))?;
    let spin = spinner(progress, format!("fetching {} from {remote}", m.branch));
    let packs = git.pack_indexes();
    let commit = git.fetch_branch(&remote, &m.branch);
    spin.finish_and_clear();
    let commit = commit?;
    fetch_metadata(&git, &remote, &m.branch, &commit)?;
    let mut branch = Branch::read(&git, remote.clone(), &m.branch, commit)?;
    // What this fetch brought (it keeps its pack: `fetch.unpackLimit=1`),
    // so that chunks small enough to come with it count as fetched.
    let new_packs = git.pack_indexes();
    branch.fresh = git.objects_in_packs(new_packs.difference(&packs))?;
    if let Content::Legacy { parts, .. } = &branch.content {
        let oids: Vec<String> = branch
            .entries
            .iter()
            .filter(|e| e.kind == "blob" && e.size.is_none() && parts.contains(&e.name))
            .map(|e| e.oid.clone())
            .collect();
        if !oids.is_empty() {
            let spin = spinner(progress, format!("fetching the parts of {}", m.branch));
            let r = prefetch::fetch_all(&git, &remote, &m.branch, &oids);
            spin.finish_and_clear();
            r?;
            let commit = git.fetch_branch_local(&m.branch)?;
            let mut fresh = std::mem::take(&mut branch.fresh);
            fresh.extend(oids);
            branch = Branch::read(&git, remote, &m.branch, commit)?;
            branch.fresh = fresh;
        }
    }
    Ok((git, branch))
}

/// Fetches by id the branch's own files that its fetch left out for
/// their size (a `warmstart.json` of thousands of chunks can pass
/// `WARMSTART_FETCH_BLOB_LIMIT`), so that the branch can be read: one
/// `git fetch`, only when one is missing.
pub(super) fn fetch_metadata(
    git: &CacheGit,
    remote: &Remote,
    branch: &str,
    commit: &str,
) -> Result<()> {
    const FILES: [&str; 3] = ["warmstart.json", "SHA256SUMS", "README.md"];
    let entries = git
        .ls_tree(commit)
        .with_context(|| format!("listing branch {branch}"))?;
    let missing: Vec<String> = entries
        .iter()
        .filter(|e| e.kind == "blob" && e.size.is_none() && FILES.contains(&e.name.as_str()))
        .map(|e| e.oid.clone())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    git.fetch_blobs(remote, &missing, &mut |_| {}).map_err(|e| {
        let why = match e {
            crate::git::BlobFetchError::Network { code, message } => {
                return fail(
                    code,
                    format!("cannot fetch the files of {branch} from {remote}: {message}"),
                );
            }
            crate::git::BlobFetchError::NotOnRemote => "the remote does not have them".to_string(),
            crate::git::BlobFetchError::Refused => "the server refuses objects by id".to_string(),
            crate::git::BlobFetchError::Failed(why) => why,
        };
        fail(
            Code::Remote,
            format!("cannot fetch the files of {branch} from {remote}: {why}"),
        )
    })
}

/// The advice on a damaged branch.
pub fn republish_fix(name: &str) -> String {
    format!(
        "the branch is damaged or was edited by hand; republish it with `{cmd} cache publish {name}`",
        cmd = crate::invocation::command(),
    )
}
