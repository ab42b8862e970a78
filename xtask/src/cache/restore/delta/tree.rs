//! Handles on the staging and installed trees: every path is reached
//! through directory handles that never follow a symlink.

use super::*;

/// An entry's path as a checked relative path (`Fallback` for anything a
/// full install would refuse, so that it is the one to refuse it).
pub(super) fn entry_rel(e: &Entry) -> Result<PathBuf> {
    let rel = unpack::safe_relative(&e.path)
        .map_err(|why| fallback(format!("entry {}: {why}", shown(&e.path))))?;
    if rel.as_os_str().is_empty() && e.kind != Kind::Dir {
        return Err(fallback(format!("entry {} names the root", shown(&e.path))));
    }
    Ok(rel)
}

pub(super) fn shown(path: &[u8]) -> String {
    format!("`{}`", String::from_utf8_lossy(path))
}

/// A tree reached through handles: its root, and the last parent opened
/// (entries come in path order, so siblings share it).
pub(super) struct Tree {
    pub(super) root: Dir,
    pub(super) last: Option<(PathBuf, Dir)>,
}

impl Tree {
    pub(super) fn open(path: &Path) -> Result<Tree> {
        let root = Dir::open_path(path).with_context(|| format!("opening {}", path.display()))?;
        Ok(Tree { root, last: None })
    }

    /// The directory `parent` (relative), never through a symlink.
    pub(super) fn dir(&mut self, parent: &Path) -> io::Result<&Dir> {
        if parent.as_os_str().is_empty() {
            return Ok(&self.root);
        }
        if !matches!(&self.last, Some((p, _)) if p == parent) {
            let d = unpack::open_beneath(&self.root, parent, Links::None)?;
            self.last = Some((parent.to_path_buf(), d));
        }
        Ok(&self.last.as_ref().expect("just set").1)
    }

    /// The parent directory of `rel` and its last name.
    pub(super) fn parent<'a>(&mut self, rel: &'a Path) -> io::Result<(&Dir, &'a OsStr)> {
        let name = rel.file_name().ok_or_else(|| io::Error::other("no name"))?;
        let parent = rel.parent().unwrap_or(Path::new(""));
        Ok((self.dir(parent)?, name))
    }

    /// `parent`, creating missing directories on the way (as the extractor
    /// does, mode 0777 less the umask), never through a symlink.
    pub(super) fn parent_made<'a>(&mut self, rel: &'a Path) -> Result<(&Dir, &'a OsStr)> {
        let parent = rel.parent().unwrap_or(Path::new(""));
        if let Err(e) = self.dir(parent) {
            if e.kind() != io::ErrorKind::NotFound {
                return Err(fallback(format!(
                    "the parent of `{}` is not a directory ({e})",
                    rel.display()
                )));
            }
            let mut cur = self.root.try_clone()?;
            for c in parent.components() {
                let name = c.as_os_str();
                match cur.mkdir_at(name, 0o777) {
                    Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                        return Err(e).with_context(|| format!("creating {}", parent.display()));
                    }
                    _ => {}
                }
                cur = cur.open_dir_at(name).map_err(|e| {
                    fallback(format!("`{}` is not a directory ({e})", parent.display()))
                })?;
            }
        }
        Ok(self.parent(rel)?)
    }
}
