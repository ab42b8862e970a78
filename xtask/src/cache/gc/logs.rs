//! Old logs under `<state>/logs`: those of steps restore.toml no longer
//! names, and the worker's appended log cut to its tail. It never reads
//! restore.toml (the caller passes the live step names in `Options`), and
//! never removes a step log when it is not told which steps are live.

use anyhow::{Context, Result};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::time::Duration;

use super::{LogReport, Options, read_dir_or_empty, remove_file};
use crate::repo::Repo;

/// Logs of steps restore.toml no longer names go after this.
pub const LOG_AGE: Duration = Duration::from_secs(30 * 24 * 3600);
/// The worker's appended log is cut when over this size...
const WORKER_LOG_MAX: u64 = 1 << 20;
/// ...to its last this many bytes, once idle for `WORKER_LOG_IDLE`.
const WORKER_LOG_KEEP: u64 = 256 << 10;
const WORKER_LOG_IDLE: Duration = Duration::from_secs(600);

/// Logs of steps restore.toml no longer names, older than `LOG_AGE`, and
/// the worker's appended log cut to its tail. No step log goes when the
/// caller could not tell the live steps (`Options::live_steps` is `None`:
/// restore.toml does not load, and a typo must not cost the logs).
pub(super) fn collect_logs(repo: &Repo, opts: &Options) -> Result<LogReport> {
    let dir = repo.state_dir().join("logs");
    let mut r = LogReport::default();
    let steps = opts.live_steps.as_ref();
    for e in read_dir_or_empty(&dir)? {
        let path = e.path();
        let file = e.file_name().to_string_lossy().into_owned();
        let Ok(m) = e.metadata() else { continue };
        if !m.is_file() {
            continue;
        }
        let idle = m.modified().ok().and_then(|t| t.elapsed().ok());
        if file == "restore-worker.log" {
            if m.len() > WORKER_LOG_MAX && idle.is_some_and(|d| d > WORKER_LOG_IDLE) {
                if !opts.dry_run {
                    trim_tail(&path, WORKER_LOG_KEEP)?;
                }
                r.trimmed.push(path);
            }
            continue;
        }
        let step = file
            .strip_suffix(".service.log")
            .or_else(|| file.strip_suffix(".log"));
        let (Some(step), Some(steps)) = (step, steps) else {
            continue;
        };
        if !steps.contains(step) && idle.is_some_and(|d| d > LOG_AGE) {
            if !opts.dry_run {
                remove_file(&path)?;
            }
            r.removed.push(path);
        }
    }
    Ok(r)
}

/// Keeps the last `keep` bytes of `path` (from a line start), atomically.
fn trim_tail(path: &Path, keep: u64) -> Result<()> {
    let mut f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let len = f.metadata()?.len();
    f.seek(SeekFrom::Start(len.saturating_sub(keep)))?;
    let mut tail = Vec::new();
    f.read_to_end(&mut tail)
        .with_context(|| format!("reading {}", path.display()))?;
    let start = tail.iter().position(|&b| b == b'\n').map_or(0, |i| i + 1);
    let mut text = b"[older lines removed by cache gc]\n".to_vec();
    text.extend_from_slice(&tail[start..]);
    crate::fsio::write_atomic(path, &text)
}
