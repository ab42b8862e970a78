//! The index on disk: reading it, and changing it under the lock with a
//! durable write (temp file in the same directory, fsync, rename, fsync of
//! the directory).
//!
//! A corrupt, truncated, unreadable or unknown-version index is never
//! written over: a change fails with exit 5 and leaves the file as it was,
//! unless the caller asked to re-initialise, in which case the bad file is
//! renamed to `<index>.corrupt-<ms>` first. Readers take no lock: a writer
//! replaces the file by rename, so a reader sees the old or the new version.
//!
//! An index path that is a symbolic link (`~/.golems` on a synced disk) is
//! written through: the temp file goes beside the link's final target and is
//! renamed over the target, so the link stays a link. The lock stays
//! `<index path as given>.lock`, the name the JavaScript tool uses.

use super::index::{FormatError, Index};
use super::lock::{self, Age, Lock, Timing, with_suffix};
use crate::exit::{Code, fail};
use anyhow::{Context, Result};
use std::fs;
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
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

    /// What is at `path` (the index, or the target of its link).
    fn find(path: &Path) -> Found {
        let meta = match fs::metadata(path) {
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
        let bytes = match fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) => return Found::Bad(format!("cannot be read ({e})")),
        };
        match Index::parse(&bytes) {
            Ok(index) => Found::Good(index),
            Err(FormatError::Json(e)) if e.eof => Found::Bad(format!("is truncated ({e})")),
            Err(e) => Found::Bad(e.to_string()),
        }
    }

    fn corrupt(&self, reason: &str) -> anyhow::Error {
        fail(
            Code::Corrupt,
            format!(
                "the crash-resume index {} {reason}; it was left untouched: repair or remove it, or run `{cmd} resume record ... --reinit` to move it aside and start a new index",
                self.path.display(),
                cmd = crate::invocation::command(),
            ),
        )
    }

    /// The index for reading: empty when there is no file yet.
    pub fn read(&self) -> Result<Index> {
        match Self::find(&self.path) {
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
        match lock.stole {
            Some(Age::Past(age)) => eprintln!(
                "warning: took over the stale index lock {} ({} old; its writer must have died)",
                lock.path().display(),
                crate::clock::human(age)
            ),
            Some(Age::Future(skew)) => eprintln!(
                "warning: took over the index lock {}, dated {} in the future (clock skew: its maker's clock is ahead of this machine's, or this one was set back); a lock more than {} ahead counts as stale",
                lock.path().display(),
                crate::clock::human(skew),
                crate::clock::human(self.timing.stale)
            ),
            None => {}
        }
        // Resolved under the lock: the link is what other writers follow too.
        // SAFETY: geteuid has no preconditions and cannot fail.
        let target = target_of(&self.path, unsafe { libc::geteuid() })?;
        self.sweep(dir, &target);
        let mut index = match Self::find(&target) {
            Found::Missing => Index::default(),
            Found::Good(index) => index,
            Found::Bad(reason) if reinit && target != self.path && !target.is_file() => {
                // Moving aside whatever a link points at (a directory, say)
                // could move anything on the disk: only a file is moved.
                return Err(fail(
                    Code::Corrupt,
                    format!(
                        "the crash-resume index {} is a link to {}, which {reason}; --reinit moves aside only a file: point the link at a file, or remove it",
                        self.path.display(),
                        target.display()
                    ),
                ));
            }
            Found::Bad(reason) if reinit => {
                let aside = with_suffix(&target, &format!(".corrupt-{}", now_ms()));
                fs::rename(&target, &aside).with_context(|| {
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
            self.write(&target, &index.to_bytes(), &lock)?;
        }
        lock.release()?;
        Ok(out)
    }

    /// Removes what a killed writer left: temp files beside the target
    /// (only a lock holder makes one, and we hold the lock) and stale locks
    /// moved aside, beside the lock, by a stealer that died before removing
    /// them.
    fn sweep(&self, dir: &Path, target: &Path) {
        let name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
        let each = |dir: &Path, prefix: String, remove: &dyn Fn(&fs::DirEntry)| {
            let Ok(listing) = fs::read_dir(dir) else {
                return;
            };
            for entry in listing.flatten() {
                if entry.file_name().to_string_lossy().starts_with(&prefix) {
                    remove(&entry);
                }
            }
        };
        if let Some(name) = name(target) {
            each(parent_dir(target), format!("{name}.tmp-"), &|e| {
                let _ = fs::remove_file(e.path());
            });
        }
        if let Some(name) = name(&self.path) {
            each(dir, format!("{name}.lock.stale-"), &|e| {
                let old = e
                    .metadata()
                    .is_ok_and(|m| Age::of(&m).is_stale(self.timing.stale));
                if old {
                    let _ = fs::remove_dir(e.path());
                }
            });
        }
    }

    /// Replaces `target` (the index, or its link's target) with `bytes`
    /// durably, if the lock is still ours.
    fn write(&self, target: &Path, bytes: &[u8], lock: &Lock) -> Result<()> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let tmp = with_suffix(target, &format!(".tmp-{}-{nanos}", std::process::id()));
        let result = self.write_via(target, &tmp, bytes, lock);
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
    }

    fn write_via(&self, target: &Path, tmp: &Path, bytes: &[u8], lock: &Lock) -> Result<()> {
        let mode = fs::metadata(target)
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
        fs::rename(tmp, target)
            .with_context(|| format!("renaming {} to {}", tmp.display(), target.display()))?;
        let dir = parent_dir(target);
        fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .with_context(|| format!("syncing the directory {}", dir.display()))
    }
}

/// The file a write to `path` must replace: `path` itself, or, when it is
/// a symbolic link, the end of its chain of links (which may not exist yet:
/// writing through a dangling link creates its target, as `echo >` does).
/// A chain longer than the kernel follows (a loop) gives `path`, which then
/// cannot be read, and the error says why.
///
/// Only links made by this user (`euid`) or by root are followed. Anyone
/// else's link (planted in a shared directory, or in a user's home when
/// root runs this with that HOME) could aim our write, or `--reinit`'s
/// rename, at any file we may write: it is refused, as the kernel's
/// protected_symlinks refuses such links in sticky directories.
fn target_of(path: &Path, euid: u32) -> Result<PathBuf> {
    let mut at = path.to_path_buf();
    // Linux follows at most 40 links when resolving a path.
    for _ in 0..40 {
        match fs::symlink_metadata(&at) {
            Ok(meta) if meta.file_type().is_symlink() => {
                if meta.uid() != euid && meta.uid() != 0 {
                    return Err(fail(
                        Code::Corrupt,
                        format!(
                            "the crash-resume index {} is reached through the symbolic link {}, which belongs to uid {}, not to this user (uid {euid}) or root: refusing to write through it; remove the link, or make it as the user who writes the index",
                            path.display(),
                            at.display(),
                            meta.uid()
                        ),
                    ));
                }
                match fs::read_link(&at) {
                    // A relative target is relative to the link's directory;
                    // an absolute one replaces the whole path.
                    Ok(next) => at = parent_dir(&at).join(next),
                    Err(_) => return Ok(path.to_path_buf()),
                }
            }
            _ => return Ok(at),
        }
    }
    Ok(path.to_path_buf())
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

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_linked_index_is_written_through_its_link() {
        let tmp = tempfile::tempdir().unwrap();
        let (home, synced) = (tmp.path().join("home"), tmp.path().join("synced"));
        fs::create_dir_all(&home).unwrap();
        fs::create_dir_all(&synced).unwrap();
        // A chain: home/index.json -> ../synced/hop -> real.json (relative).
        std::os::unix::fs::symlink("../synced/hop", home.join("index.json")).unwrap();
        std::os::unix::fs::symlink("real.json", synced.join("hop")).unwrap();
        let store = Store::new(home.join("index.json"));
        for surface in ["s1", "s2"] {
            store
                .update(true, false, |i| {
                    i.record(&rec(surface), 1);
                    Ok(((), true))
                })
                .unwrap();
        }
        assert!(
            fs::symlink_metadata(home.join("index.json"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert!(
            fs::symlink_metadata(synced.join("hop"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        let real = Index::parse(&fs::read(synced.join("real.json")).unwrap()).unwrap();
        assert!(real.get("s1").is_some() && real.get("s2").is_some());
        assert_eq!(names(&home), ["index.json"]);
        assert_eq!(names(&synced), ["hop", "real.json"]);
    }

    #[test]
    fn a_link_loop_or_a_link_to_a_directory_is_refused_and_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("a.json"), tmp.path().join("b.json"));
        std::os::unix::fs::symlink("b.json", &a).unwrap();
        std::os::unix::fs::symlink("a.json", &b).unwrap();
        let add = |i: &mut Index| {
            i.record(&rec("s1"), 1);
            Ok(((), true))
        };
        let err = Store::new(a.clone()).update(true, false, add).unwrap_err();
        assert_eq!(code_of(&err), Code::Corrupt, "{err:#}");
        let dir = tmp.path().join("dir");
        fs::create_dir(&dir).unwrap();
        let link = tmp.path().join("c.json");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        let err = Store::new(link.clone())
            .update(true, true, add)
            .unwrap_err();
        assert_eq!(code_of(&err), Code::Corrupt, "{err:#}");
        assert!(
            format!("{err:#}").contains("moves aside only a file"),
            "{err:#}"
        );
        assert!(
            dir.is_dir()
                && fs::symlink_metadata(&link)
                    .unwrap()
                    .file_type()
                    .is_symlink()
        );
        assert!(fs::symlink_metadata(&a).unwrap().file_type().is_symlink());
    }

    #[test]
    fn another_users_link_is_never_written_through() {
        let tmp = tempfile::tempdir().unwrap();
        let victim = tmp.path().join("victim");
        fs::write(&victim, "not an index").unwrap();
        let link = tmp.path().join("index.json");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        // As root, give the link to another user; otherwise play another
        // user, since a link of our own is trusted.
        let euid = if me == 0 {
            std::os::unix::fs::lchown(&link, Some(12345), None).unwrap();
            me
        } else {
            4242
        };
        let err = target_of(&link, euid).unwrap_err();
        assert_eq!(code_of(&err), Code::Corrupt);
        assert!(
            format!("{err:#}").contains("refusing to write through it"),
            "{err:#}"
        );
        if me == 0 {
            let err = Store::new(link.clone())
                .update(true, true, |i| {
                    i.record(&rec("s1"), 1);
                    Ok(((), true))
                })
                .unwrap_err();
            assert_eq!(code_of(&err), Code::Corrupt);
        }
        assert_eq!(fs::read(&victim).unwrap(), b"not an index");
        assert_eq!(names(tmp.path()), ["index.json", "victim"]);
        // Our own (or root's) link is followed.
        let own = tmp.path().join("own.json");
        std::os::unix::fs::symlink(&victim, &own).unwrap();
        assert_eq!(target_of(&own, me).unwrap(), victim);
    }

    #[test]
    fn a_dangling_link_gets_its_target_created() {
        let tmp = tempfile::tempdir().unwrap();
        let link = tmp.path().join("index.json");
        std::os::unix::fs::symlink("real.json", &link).unwrap();
        let store = Store::new(link.clone());
        store
            .update(true, false, |i| {
                i.record(&rec("s1"), 1);
                Ok(((), true))
            })
            .unwrap();
        assert!(
            fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert!(store.read().unwrap().get("s1").is_some());
        assert_eq!(names(tmp.path()), ["index.json", "real.json"]);
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
