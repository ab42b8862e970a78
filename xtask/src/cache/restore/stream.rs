//! A key's verified stream: its chunks fetched as needed, each hashed before
//! the decoder sees a byte of it, into the extractor or a delta's writer.
//! Shared by `cache restore` and `cache verify`; it never installs.

use super::*;

/// The bars of `unpack_into` when `on` (else hidden ones): the compressed
/// bytes fetched and verified, and the tar bytes unpacked, one above the
/// other, each with its own total (`verify::Plan::progress_totals`).
pub(super) fn restore_bars(
    on: bool,
    totals: verify::Totals,
) -> (
    Option<indicatif::MultiProgress>,
    [indicatif::ProgressBar; 2],
) {
    if !on {
        return (None, [crate::progress::hidden(), crate::progress::hidden()]);
    }
    let stack = crate::progress::stack();
    let fetch = stack.add(crate::progress::bytes_bar(totals.compressed, "fetch"));
    let unpack = stack.add(match totals.tar {
        Some(len) => crate::progress::bytes_bar(len, "unpack"),
        None => crate::progress::bytes_count("unpack"),
    });
    (Some(stack), [fetch, unpack])
}

/// Streams `kp` (a key of `branch`) through verification into the empty
/// directory `dest`, fetching the chunks that are neither in cache.git nor
/// in its chunk store from the remote `branch` was fetched from, while the
/// earlier ones are unpacked. Returns what was unpacked, what was hashed,
/// and what was fetched.
pub fn unpack_into(
    git: &CacheGit,
    branch: &Branch,
    kp: &KeyPlan,
    dest: &Path,
    absolute_symlinks: &[crate::glob::Pattern],
    progress: bool,
) -> Result<(unpack::Stats, verify::Stats, prefetch::Stats)> {
    let opts = unpack::Options {
        absolute_symlinks: absolute_symlinks.to_vec(),
        ..unpack::Options::default()
    };
    stream_key(git, branch, kp, progress, |r| {
        unpack::extract_tar(r, dest, &kp.limits, &opts)
    })
}

/// One key of `branch` through a restore's verified stream into the empty
/// directory `dest`, as `cache verify` checks it: trusted before any chunk
/// is fetched (exit 12 fetches none), planned (`fix` says what to do about
/// a damaged branch), then fetched, hashed, decoded, checked and unpacked
/// by `unpack_into`. Returns the key's plan, what was unpacked and what was
/// hashed; it installs nothing.
#[allow(clippy::too_many_arguments)]
pub fn verified_unpack(
    sh: &Shell,
    repo: &Repo,
    m: &CacheManifest,
    git: &CacheGit,
    branch: &Branch,
    key: &str,
    fix: &str,
    dest: &Path,
    progress: bool,
) -> Result<(KeyPlan, unpack::Stats, verify::Stats)> {
    crate::trust::check_before_fetch(sh, repo, m, git, branch, key)?;
    let kp = branch.plan(key, fix)?;
    let (u, v, _) = unpack_into(git, branch, &kp, dest, &m.absolute_symlinks, progress)?;
    Ok((kp, u, v))
}

/// Streams `kp` through verification into `consume` (the extractor, or a
/// delta install's writer), fetching chunks as `unpack_into` says.
pub fn stream_key<T>(
    git: &CacheGit,
    branch: &Branch,
    kp: &KeyPlan,
    progress: bool,
    consume: impl FnOnce(&mut dyn Read) -> Result<T>,
) -> Result<(T, verify::Stats, prefetch::Stats)> {
    let (_stack, [fetch_bar, unpack_bar]) = restore_bars(progress, kp.plan.progress_totals());
    let chunks = prefetch::Prefetch::start(
        git,
        (&branch.remote, branch.registry.as_ref()),
        &branch.name,
        kp,
        &branch.fresh,
    )?;
    let reader = git.clone();
    let oids = kp.oids.clone();
    let chunks_ref = &chunks;
    let mut open = move |i: usize| -> Result<verify::Opened> {
        Ok(match chunks_ref.wait(i)? {
            prefetch::At::Git => verify::Opened::unchecked(reader.read_blob(&oids[i])?),
            prefetch::At::Clone(oid) => {
                verify::Opened::unchecked(crate::cache::fetch::reuse::open_blob(&reader, &oid)?)
            }
            prefetch::At::Store(path) => verify::Opened {
                reader: Box::new(
                    std::fs::File::open(&path)
                        .with_context(|| format!("opening {}", path.display()))?,
                ),
                checked: true,
            },
        })
    };
    let on_progress = |phase: verify::Phase, n: u64| match phase {
        verify::Phase::Verified => fetch_bar.inc(n),
        verify::Phase::Unpacked => unpack_bar.inc(n),
    };
    let r = if kp.plan.pieces.is_empty() {
        // A delta install with nothing to decode (zstd refuses an empty
        // stream): the consumer reads nothing.
        consume(&mut std::io::empty()).map(|v| (v, verify::Stats::default()))
    } else {
        verify::stream(&kp.plan, &mut open, &on_progress, consume)
    };
    fetch_bar.finish_and_clear();
    unpack_bar.finish_and_clear();
    let fetched = chunks.stats();
    drop(chunks);
    r.map(|(u, v)| (u, v, fetched)).map_err(|e| {
        if crate::exit::code_of(&e) == Code::Unsafe {
            // The extractor names the entry; say where it came from and
            // what to do, keeping the exit code.
            fail(
                Code::Unsafe,
                format!(
                    "{e:#} ({}: nothing was installed; republish it from a tree without such entries)",
                    kp.plan.label
                ),
            )
        } else {
            e
        }
    })
}
