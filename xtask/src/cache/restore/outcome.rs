//! What a restore reports: its state, the phases it timed, what it fetched,
//! linked and kept, and the one line people read. It only describes a
//! restore; it never does one.

use super::*;

/// What a restore did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// The stamp matched and the ready-probe held: nothing was done.
    Warm,
    /// Fetched, verified and installed.
    Restored,
    /// Another restorer of the same target finished while this one waited
    /// for the lock; its install is used as is.
    Reused,
    /// `--verify`: the installed copy was compared with the verified cache
    /// and found identical; nothing was replaced.
    Verified,
    /// `--verify`: the installed copy differed and was replaced.
    Repaired,
    /// The branch lacks the exact key; a `[[restore.fallback]]` key stands
    /// in for it (installed now, or earlier and still within
    /// `restore.recheck`). `RestoreOutcome::partial` says which and how.
    Partial,
}

/// What a `partial` install stands in for (`--json`'s `partial`).
#[derive(Clone, Debug, Serialize)]
pub struct PartialInfo {
    /// The exact key today's pins give.
    pub wanted: String,
    /// The key installed in its place.
    pub used: String,
    /// The fallback that matched (`drop src`, `prefix vc-`).
    pub fallback: String,
    /// The key parts that differ.
    pub differs: Vec<crate::cache::format::fallback::PartDiff>,
    /// When the next run looks for the exact key again (RFC 3339).
    pub recheck_after: String,
}

/// Time spent in each phase of a cold restore, in milliseconds.
///
/// `fetch_ms` is the branch fetch (commit, tree, small files: big chunks
/// are left out); the chunks are fetched by id during `unpack_ms`, which
/// `chunk_fetch_ms` (time spent fetching chunks, overlapping the unpack)
/// and `chunk_wait_ms` (time the unpack waited for a chunk) break down.
///
/// `--json` prints them as `timings_ms` without the `_ms` suffixes (the
/// contract's one convention for a breakdown, README.md "JSON output").
#[derive(Clone, Debug, Default, Serialize)]
pub struct Phases {
    #[serde(rename = "lock_wait")]
    pub lock_wait_ms: u64,
    #[serde(rename = "fetch")]
    pub fetch_ms: u64,
    /// The trust check between the branch fetch and the first chunk
    /// (reading the trust root, `ssh-keygen` verify); 0 with policy off.
    /// Kept in microseconds here; `--json` rounds it to milliseconds.
    #[serde(rename = "trust", serialize_with = "crate::contract::micros_as_ms")]
    pub trust_us: u64,
    #[serde(rename = "unpack")]
    pub unpack_ms: u64,
    #[serde(rename = "chunk_fetch")]
    pub chunk_fetch_ms: u64,
    #[serde(rename = "chunk_wait")]
    pub chunk_wait_ms: u64,
    #[serde(rename = "install")]
    pub install_ms: u64,
}

/// The result of `restore_named`, also printed by `--json`.
#[derive(Clone, Debug, Serialize)]
pub struct RestoreOutcome {
    pub name: String,
    pub state: State,
    pub key: String,
    pub target: PathBuf,
    pub mode: &'static str,
    pub branch: String,
    /// The remote the install came from (for warm runs: the one recorded
    /// in the stamp), as people read it; `--json` gives `remote: {name, url}`.
    #[serde(rename = "remote", serialize_with = "crate::contract::shown_remote")]
    pub source: String,
    pub commit: String,
    /// `v1`, `legacy-gzip` or `legacy-zstd`.
    pub layout: String,
    /// Uncompressed tar bytes unpacked (0 when nothing was unpacked).
    #[serde(rename = "tar_bytes")]
    pub bytes: u64,
    /// Compressed chunk bytes read (from cache.git or its chunk store).
    pub compressed_bytes: u64,
    /// How the chunks reached cache.git: `present` (with the branch fetch,
    /// or from an earlier run), `byid` (fetched one by one while unpacking),
    /// `refetch` (the server refuses objects by id: the branch was fetched
    /// whole); `null` when nothing was unpacked.
    pub chunk_source: Option<prefetch::Source>,
    /// What the machine had and what was fetched: `chunks_reused`,
    /// `chunks_from_clone`, `chunks_fetched`, `bytes_fetched`.
    #[serde(flatten)]
    pub reuse: prefetch::Reuse,
    /// Of those, chunks read straight from the pack a remote on this
    /// machine sent, without `git fetch` (see `cache::fetch::direct`).
    pub chunks_direct: u64,
    /// Why the rest of the chunks went through `git fetch` after all
    /// (the server's answer was not what the direct reader handles), or
    /// why it was skipped (an ssh remote, a `url.*` setting); `null` when
    /// it read every chunk or none had to be fetched.
    pub direct_fallback: Option<String>,
    /// Entries installed (files, directories, links), as the stamp records
    /// (`entries` in JSON, as verify, publish and demo say).
    #[serde(rename = "entries")]
    pub files: u64,
    /// Bytes that went through sha256 in this run: 0 on the warm path.
    pub bytes_hashed: u64,
    /// `ssh-keygen` signature checks in this run: 0 on the warm path.
    pub signature_checks: u64,
    /// The trust policy and this key's verdict (null when warm or reused).
    pub trust: Option<crate::trust::Checked>,
    pub duration_ms: u64,
    #[serde(skip)]
    pub duration: Duration,
    #[serde(rename = "timings_ms")]
    pub phases: Phases,
    /// With `--verify`: the first difference found in the installed copy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub difference: Option<String>,
    /// Why the stamp did not make this run warm (`None` when warm, reused
    /// or with `--verify`), e.g. `installed key tc-1 differs: v 1 -> 2`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// With state `partial`: the exact key, the one used, what differs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partial: Option<PartialInfo>,
    /// Overlay mode, when something was unpacked: files kept because the
    /// user changed them since warmstart installed them (or made them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept: Option<u64>,
    /// The delta install (replace mode, `cache::restore::delta`).
    #[serde(flatten)]
    pub delta: DeltaInfo,
}

/// What a delta install of a new key over an installed one saved (all 0
/// when none was made), in `--json` beside the fetch counters.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DeltaInfo {
    /// Files hardlinked (or reflinked) from the installed tree instead of
    /// written, and their bytes: what this install did not write.
    pub files_linked: u64,
    pub bytes_linked: u64,
    /// Chunks of the key that were not decoded at all.
    pub chunks_skipped: u64,
    /// Installed files whose bytes were read to check them before linking.
    pub files_hashed: u64,
    /// Why a delta was possible but a full install was made instead
    /// (`null` when not).
    pub delta_fallback: Option<String>,
}

impl DeltaInfo {
    pub(super) fn of(report: &Option<delta::Report>, fallback: Option<String>) -> DeltaInfo {
        let r = report.clone().unwrap_or_default();
        DeltaInfo {
            files_linked: r.files_linked,
            bytes_linked: r.bytes_linked,
            chunks_skipped: r.chunks_total.saturating_sub(r.chunks_decoded),
            files_hashed: r.files_hashed,
            delta_fallback: fallback,
        }
    }
}

impl RestoreOutcome {
    /// `; kept 2 files the user changed` (overlay mode), else nothing.
    pub fn kept_words(&self) -> String {
        match self.kept {
            Some(n) if n > 0 => format!(
                "; kept {n} file{} the user changed since warmstart installed {}",
                if n == 1 { "" } else { "s" },
                if n == 1 { "it" } else { "them" }
            ),
            _ => String::new(),
        }
    }

    /// `; fetched 3 chunks (1.2 MiB), reused 37 (12 from the repository)`
    /// when chunks were read, else nothing.
    pub fn fetch_words(&self) -> String {
        let r = &self.reuse;
        if r.chunks_fetched + r.chunks_reused == 0 {
            return String::new();
        }
        let clone = match r.chunks_from_clone {
            0 => String::new(),
            n => format!(" ({n} from the repository)"),
        };
        format!(
            "; fetched {} chunk{} ({}), reused {}{clone}",
            r.chunks_fetched,
            if r.chunks_fetched == 1 { "" } else { "s" },
            human_bytes(r.bytes_fetched),
            r.chunks_reused
        )
    }

    /// `; linked 990 unchanged files (1.2 MB) from the installed tree`.
    pub(super) fn linked_words(&self) -> String {
        match self.delta.files_linked {
            0 => String::new(),
            n => format!(
                "; linked {n} unchanged file{} ({}) from the installed tree",
                if n == 1 { "" } else { "s" },
                human_bytes(self.delta.bytes_linked)
            ),
        }
    }

    /// One line for people.
    pub fn summary(&self) -> String {
        let t = self.target.display();
        let secs = clock::human(self.duration);
        let from = format!(
            "{} {}@{}",
            self.source,
            self.branch,
            &self.commit[..self.commit.len().min(12)]
        );
        match self.state {
            State::Warm => format!(
                "cache {}: {} is installed at {t} (warm, {secs})",
                self.name, self.key
            ),
            State::Reused => format!(
                "cache {}: {} was installed at {t} by another restore while this one waited ({secs})",
                self.name, self.key
            ),
            State::Restored => format!(
                "cache {}: restored {} into {t}: {} in {} entries from {from} in {secs}{}{}{}",
                self.name,
                self.key,
                human_bytes(self.bytes),
                self.files,
                self.fetch_words(),
                self.kept_words(),
                self.linked_words()
            ),
            State::Verified => format!(
                "cache {}: the installed copy of {} at {t} matches {from} ({secs})",
                self.name, self.key
            ),
            State::Repaired => format!(
                "cache {}: the installed copy of {} at {t} differed ({}); replaced it from {from} in {secs}{}{}",
                self.name,
                self.key,
                self.difference.as_deref().unwrap_or("?"),
                self.fetch_words(),
                self.kept_words()
            ),
            State::Partial => {
                let p = self.partial.as_ref();
                format!(
                    "cache {}: {} stands in for {} at {t} (partial: {}; fallback {}; the exact key is looked for again after {}) ({secs})",
                    self.name,
                    self.key,
                    p.map_or("?", |p| &p.wanted),
                    p.map_or_else(|| "?".to_string(), |p| describe_differs(&p.differs)),
                    p.map_or("?", |p| &p.fallback),
                    p.map_or("?", |p| &p.recheck_after),
                )
            }
        }
    }
}

/// `src 2 -> 1, platform ...`: how a stand-in differs from the exact key.
pub(super) fn describe_differs(d: &[crate::cache::format::fallback::PartDiff]) -> String {
    d.iter()
        .map(|p| {
            format!(
                "{} {} -> {}",
                p.name,
                p.wanted.as_deref().unwrap_or("(none)"),
                p.used.as_deref().unwrap_or("(none)")
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The `partial` of an outcome, from its stamp.
pub(super) fn partial_info(m: &CacheManifest, s: &Stamp) -> Option<PartialInfo> {
    let p = s.partial.as_ref()?;
    let recheck = m.recheck.unwrap_or_default().as_millis() as u64;
    Some(PartialInfo {
        wanted: p.wanted.clone(),
        used: s.key.clone(),
        fallback: p.fallback.clone(),
        differs: crate::cache::format::fallback::differs(&p.wanted_parts, &s.key_parts),
        recheck_after: clock::rfc3339(p.checked_at_ms.saturating_add(recheck)),
    })
}

pub(super) fn from_stamp(
    m: &CacheManifest,
    s: &Stamp,
    state: State,
    start: Instant,
    phases: Phases,
) -> RestoreOutcome {
    let duration = start.elapsed();
    let partial = partial_info(m, s);
    let state = match state {
        State::Warm if partial.is_some() => State::Partial,
        other => other,
    };
    RestoreOutcome {
        name: m.name.clone(),
        state,
        key: s.key.clone(),
        target: s.target.clone(),
        mode: stamp::mode_name(m.mode),
        branch: s.branch.clone(),
        source: crate::redact::url(&s.source),
        commit: s.commit.clone(),
        layout: s.layout.clone(),
        bytes: 0,
        compressed_bytes: 0,
        chunk_source: None,
        reuse: prefetch::Reuse::default(),
        chunks_direct: 0,
        direct_fallback: None,
        files: s.files,
        bytes_hashed: 0,
        signature_checks: 0,
        trust: None,
        duration_ms: duration.as_millis() as u64,
        duration,
        phases,
        difference: None,
        reason: None,
        partial,
        kept: None,
        delta: DeltaInfo::default(),
    }
}
