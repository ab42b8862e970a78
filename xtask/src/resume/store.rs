//! The index on disk: reading it, and changing it under the lock with a
//! durable write (temp file in the same directory, fsync, rename, fsync of
//! the directory).
//!
//! A corrupt, truncated, unreadable or unknown-version index is never
//! written over: a change fails with exit 5 and leaves the file as it was,
//! unless the caller asked to re-initialise, in which case the bad file is
//! renamed to `<index>.corrupt-<ms>` first. Readers take no lock: a writer
//! replaces the file by rename, so a reader sees the old or the new version.

use super::index::{FormatError, Index};
use super::lock::{self, Lock, Timing, with_suffix};
use crate::exit::{Code, fail};
use anyhow::{Context, Result};
use std::fs;
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the epoch, the index's timestamps.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// One index file and the limits its lock is taken with.
#[derive(Clone, Debug)]
pub struct Store {
    pub path: PathBuf,
    pub timing: Timing,
}

/// What was found at the index path.
enum Found {
    Missing,
    Good(Index),
    /// Exists but cannot be used; the text says why.
    Bad(String),
}

impl Store {
    pub fn new(path: PathBuf) -> Store {
        Store {
            path,
            timing: Timing::from_env(),
        }
    }

    fn find(&self) -> Found {
        let meta = match fs::metadata(&self.path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == ErrorKind::NotFound => return Found::Missing,
            Err(e) => return Found::Bad(format!("cannot be read ({e})")),
        };
        // Never open a fifo or device: reading one could block forever.
        if !meta.is_file() {
            let kind = if meta.is_dir() {
                "a directory"
            } else {
                "not a regular file"
            };
            return Found::Bad(format!("is {kind}"));
        }
        let bytes = match fs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(e) => return Found::Bad(format!("cannot be read ({e})")),
        };
        match Index::parse(&bytes) {
            Ok(index) => Found::Good(index),
            Err(FormatError::Json(e)) if e.is_eof() => Found::Bad(format!("is truncated ({e})")),
            Err(e) => Found::Bad(e.to_string()),
        }
    }

    fn corrupt(&self, reason: &str) -> anyhow::Error {
        fail(
            Code::Corrupt,
            format!(
                "the crash-resume index {} {reason}; it was left untouched: repair or remove it, or run `cargo xtask resume record ... --reinit` to move it aside and start a new index",
                self.path.display()
            ),
        )
    }

    /// The index for reading: empty when there is no file yet.
    pub fn read(&self) -> Result<Index> {
        match self.find() {
            Found::Missing => Ok(Index::default()),
            Found::Good(index) => Ok(index),
            Found::Bad(reason) => Err(self.corrupt(&reason)),
        }
    }

    /// Changes the index under the lock. `edit` returns its result and
    /// whether it changed anything; only a change is written. `create` makes
    /// the index's directory when missing (for `record`); without it a
    /// missing directory means an empty index that is not written.
    pub fn update<T>(
        &self,
        create: bool,
        reinit: bool,
        edit: impl FnOnce(&mut Index) -> Result<(T, bool)>,
    ) -> Result<T> {
        let dir = parent_dir(&self.path);
        if create {
            fs::create_dir_all(dir)
                .with_context(|| format!("creating the index directory {}", dir.display()))?;
        } else if !dir.exists() {
            // No directory, so no index and no lock to serialise with.
            return edit(&mut Index::default()).map(|(out, _)| out);
        }
        let lock = lock::acquire(&lock::lock_path(&self.path), self.timing)?;
        if let Some(age) = lock.stole {
            eprintln!(
                "warning: took over the stale index lock {} ({} old; its writer must have died)",
                lock.path().display(),
                crate::clock::human(age)
            );
        }
        self.sweep(dir);
        let mut index = match self.find() {
            Found::Missing => Index::default(),
            Found::Good(index) => index,
            Found::Bad(reason) if reinit => {
                let aside = with_suffix(&self.path, &format!(".corrupt-{}", now_ms()));
                fs::rename(&self.path, &aside).with_context(|| {
                    format!(
                        "moving the corrupt index {} aside to {}",
                        self.path.display(),
                        aside.display()
                    )
                })?;
                eprintln!(
                    "warning: the crash-resume index {} {reason}; moved it to {} and started a new index",
                    self.path.display(),
                    aside.display()
                );
                Index::default()
            }
            Found::Bad(reason) => return Err(self.corrupt(&reason)),
        };
        let (out, changed) = edit(&mut index)?;
        if changed {
            self.write(&index.to_bytes(), &lock)?;
        }
        lock.release()?;
        Ok(out)
    }

    /// Removes what a killed writer left: temp files (only a lock holder
    /// makes one, and we hold the lock) and stale locks moved aside by a
    /// stealer that died before removing them.
    fn sweep(&self, dir: &Path) {
        let Some(name) = self
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
        else {
            return;
        };
        let (tmp, stale) = (format!("{name}.tmp-"), format!("{name}.lock.stale-"));
        let Ok(listing) = fs::read_dir(dir) else {
            return;
        };
        for entry in listing.flatten() {
            let file = entry.file_name().to_string_lossy().into_owned();
            if file.starts_with(&tmp) {
                let _ = fs::remove_file(entry.path());
            } else if file.starts_with(&stale) {
                let old = entry
                    .metadata()
                    .ok()
                    .and_then(|m| m.modified().ok())
                    .and_then(|m| m.elapsed().ok())
                    .is_some_and(|age| age > self.timing.stale);
                if old {
                    let _ = fs::remove_dir(entry.path());
                }
            }
        }
    }

    /// Replaces the index with `bytes` durably, if the lock is still ours.
    fn write(&self, bytes: &[u8], lock: &Lock) -> Result<()> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let tmp = with_suffix(&self.path, &format!(".tmp-{}-{nanos}", std::process::id()));
        let result = self.write_via(&tmp, bytes, lock);
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
    }

    fn write_via(&self, tmp: &Path, bytes: &[u8], lock: &Lock) -> Result<()> {
        let mode = fs::metadata(&self.path)
            .ok()
            .map(|m| m.permissions().mode() & 0o7777);
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o666)
            .open(tmp)
            .with_context(|| format!("creating the temporary index {}", tmp.display()))?;
        if let Some(mode) = mode {
            // Keep the permissions the old index had.
            file.set_permissions(fs::Permissions::from_mode(mode))
                .with_context(|| format!("setting permissions of {}", tmp.display()))?;
        }
        let context = || format!("writing the temporary index {}", tmp.display());
        let (head, tail) = bytes.split_at(bytes.len() / 2);
        file.write_all(head).with_context(context)?;
        if let Some(delay) = crate::settings::millis("WARMSTART_TEST_WRITE_DELAY_MS")? {
            // Test-only: widen the window in which a killed writer leaves a
            // half-written temp file, to show the index never tears.
            file.flush().with_context(context)?;
            std::thread::sleep(delay);
        }
        file.write_all(tail).with_context(context)?;
        file.sync_all().with_context(context)?;
        drop(file);
        if !lock.still_owned() {
            return Err(fail(
                Code::Busy,
                format!(
                    "lost the index lock {} while writing (held past the stale limit and taken over); {} was not changed",
                    lock.path().display(),
                    self.path.display()
                ),
            ));
        }
        fs::rename(tmp, &self.path)
            .with_context(|| format!("renaming {} to {}", tmp.display(), self.path.display()))?;
        let dir = parent_dir(&self.path);
        fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .with_context(|| format!("syncing the directory {}", dir.display()))
    }
}

fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exit::code_of;
    use crate::resume::index::Record;

    fn rec(surface: &str) -> Record<'_> {
        Record {
            surface,
            session: "sess",
            repo: "warmstart",
            role: None,
            cwd: None,
        }
    }

    #[test]
    fn creates_directory_and_file_and_leaves_nothing_else() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path().join("golems/index.json"));
        store
            .update(true, false, |i| {
                i.record(&rec("s1"), 1);
                Ok(((), true))
            })
            .unwrap();
        let names: Vec<_> = fs::read_dir(tmp.path().join("golems"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["index.json"]);
        assert!(store.read().unwrap().get("s1").is_some());
    }

    #[test]
    fn unchanged_index_is_not_created() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path().join("golems/index.json"));
        let touched = store
            .update(false, false, |i| Ok((i.touch("s", 1), false)))
            .unwrap();
        assert!(!touched);
        assert!(!tmp.path().join("golems").exists());
    }

    #[test]
    fn corrupt_index_is_refused_then_moved_aside_on_reinit() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("index.json");
        fs::write(&path, "{\"version\": 1, \"entr").unwrap();
        let store = Store::new(path.clone());
        let add = |i: &mut Index| {
            i.record(&rec("s1"), 1);
            Ok(((), true))
        };
        let err = store.update(true, false, add).unwrap_err();
        assert_eq!(code_of(&err), Code::Corrupt);
        assert!(format!("{err:#}").contains("truncated"), "{err:#}");
        assert_eq!(fs::read(&path).unwrap(), b"{\"version\": 1, \"entr");
        store.update(true, true, add).unwrap();
        let aside: Vec<_> = fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("index.json.corrupt-"))
            .collect();
        assert_eq!(aside.len(), 1);
        assert!(store.read().unwrap().get("s1").is_some());
    }
}
