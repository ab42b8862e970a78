//! Compares an installed tree with a freshly verified copy of the cache.
//!
//! Used by `cache restore --verify` (is the installed copy still what the
//! cache holds?) and `cache verify` (the same question, without installing).
//! Compares kind, permission bits, size, bytes and symlink targets; reads
//! both trees and never writes to either.

use anyhow::{Context, Result};
use std::fs::{self, File};
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The first difference between `expected` (a verified copy) and `actual`
/// (the install), as a one-line description naming the path, or `None`.
/// With `exact`, entries of `actual` that `expected` lacks are differences
/// too (a directory the cache owns); without, they are ignored (a shared
/// prefix). Also returns the bytes of file content compared.
pub fn first_difference(
    expected: &Path,
    actual: &Path,
    exact: bool,
) -> Result<(Option<String>, u64)> {
    let mut compared = 0u64;
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = expected.join(&rel);
        let mut names: Vec<_> = fs::read_dir(&dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<std::io::Result<_>>()
            .with_context(|| format!("reading {}", dir.display()))?;
        names.sort();
        for name in names {
            let rel = rel.join(&name);
            match entry_difference(expected, actual, &rel)? {
                Same::Differs(d) => return Ok((Some(d), compared)),
                Same::Dir => stack.push(rel),
                Same::Bytes(n) => compared += n,
            }
        }
        if exact && let Some(d) = extra_entry(&dir, &actual.join(&rel), &rel)? {
            return Ok((Some(d), compared));
        }
    }
    Ok((None, compared))
}

/// How one entry of the cache compares with the install.
enum Same {
    /// The first difference, in words.
    Differs(String),
    /// A directory of the same mode: its entries are compared next.
    Dir,
    /// A file or symlink that agrees; the file bytes compared.
    Bytes(u64),
}

/// Compares entry `rel` of `expected` with the same path in `actual`: kind,
/// permission bits, then the symlink's target or the file's size and bytes.
fn entry_difference(expected: &Path, actual: &Path, rel: &Path) -> Result<Same> {
    let (e, a) = (expected.join(rel), actual.join(rel));
    let shown = rel.display();
    let em = fs::symlink_metadata(&e).with_context(|| format!("reading {}", e.display()))?;
    let am = match fs::symlink_metadata(&a) {
        Ok(m) => m,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Same::Differs(format!("{shown} is missing")));
        }
        Err(err) => {
            return Err(err).with_context(|| format!("reading {}", a.display()));
        }
    };
    let (et, at) = (em.file_type(), am.file_type());
    if et.is_dir() != at.is_dir()
        || et.is_file() != at.is_file()
        || et.is_symlink() != at.is_symlink()
    {
        return Ok(Same::Differs(format!(
            "{shown} is a {} in the cache but a {} here",
            kind(&et),
            kind(&at)
        )));
    }
    if !et.is_symlink() && em.mode() & 0o7777 != am.mode() & 0o7777 {
        return Ok(Same::Differs(format!(
            "{shown} has mode {:o} but the cache says {:o}",
            am.mode() & 0o7777,
            em.mode() & 0o7777
        )));
    }
    if et.is_symlink() {
        let (el, al) = (fs::read_link(&e)?, fs::read_link(&a)?);
        if el != al {
            return Ok(Same::Differs(format!(
                "{shown} points to {} but the cache says {}",
                al.display(),
                el.display()
            )));
        }
        return Ok(Same::Bytes(0));
    }
    if et.is_dir() {
        return Ok(Same::Dir);
    }
    if em.len() != am.len() {
        return Ok(Same::Differs(format!(
            "{shown} is {} bytes but the cache says {}",
            am.len(),
            em.len()
        )));
    }
    if !same_bytes(&e, &a)? {
        return Ok(Same::Differs(format!("{shown} has different content")));
    }
    Ok(Same::Bytes(em.len()))
}

/// With `exact`: the first entry of the installed directory `adir` (at
/// `rel`) that the cache's `dir` lacks.
fn extra_entry(dir: &Path, adir: &Path, rel: &Path) -> Result<Option<String>> {
    for entry in fs::read_dir(adir).with_context(|| format!("reading {}", adir.display()))? {
        let name = entry?.file_name();
        if fs::symlink_metadata(dir.join(&name)).is_err() {
            return Ok(Some(format!(
                "{} is not in the cache",
                rel.join(&name).display()
            )));
        }
    }
    Ok(None)
}

fn kind(t: &fs::FileType) -> &'static str {
    if t.is_dir() {
        "directory"
    } else if t.is_symlink() {
        "symlink"
    } else if t.is_file() {
        "file"
    } else {
        "special file"
    }
}

fn same_bytes(a: &Path, b: &Path) -> Result<bool> {
    let mut fa = File::open(a).with_context(|| format!("opening {}", a.display()))?;
    let mut fb = File::open(b).with_context(|| format!("opening {}", b.display()))?;
    let mut ba = vec![0u8; 1 << 20];
    let mut bb = vec![0u8; 1 << 20];
    loop {
        let n = read_full(&mut fa, &mut ba).with_context(|| format!("reading {}", a.display()))?;
        let m = read_full(&mut fb, &mut bb).with_context(|| format!("reading {}", b.display()))?;
        if n != m || ba[..n] != bb[..m] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
    }
}

fn read_full(f: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match f.read(&mut buf[done..])? {
            0 => break,
            n => done += n,
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{PermissionsExt, symlink};

    fn tree(dir: &Path) {
        fs::create_dir_all(dir.join("d/e")).unwrap();
        fs::write(dir.join("d/f"), b"content").unwrap();
        fs::write(dir.join("x"), b"x").unwrap();
        symlink("d/f", dir.join("l")).unwrap();
    }

    #[test]
    fn equal_trees_have_no_difference_and_each_change_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        tree(&a);
        tree(&b);
        assert_eq!(first_difference(&a, &b, true).unwrap(), (None, 8));

        fs::write(b.join("d/f"), b"contenT").unwrap();
        let d = first_difference(&a, &b, true).unwrap().0.unwrap();
        assert_eq!(d, "d/f has different content");
        fs::write(b.join("d/f"), b"content").unwrap();

        fs::set_permissions(b.join("x"), fs::Permissions::from_mode(0o755)).unwrap();
        let d = first_difference(&a, &b, true).unwrap().0.unwrap();
        assert!(d.starts_with("x has mode 755"), "{d}");
        fs::set_permissions(b.join("x"), fs::Permissions::from_mode(0o644)).unwrap();

        fs::remove_file(b.join("l")).unwrap();
        symlink("x", b.join("l")).unwrap();
        let d = first_difference(&a, &b, true).unwrap().0.unwrap();
        assert_eq!(d, "l points to x but the cache says d/f");
        fs::remove_file(b.join("l")).unwrap();
        symlink("d/f", b.join("l")).unwrap();

        fs::remove_dir(b.join("d/e")).unwrap();
        let d = first_difference(&a, &b, true).unwrap().0.unwrap();
        assert_eq!(d, "d/e is missing");
        fs::create_dir(b.join("d/e")).unwrap();

        fs::write(b.join("d/e/extra"), b"").unwrap();
        let d = first_difference(&a, &b, true).unwrap().0.unwrap();
        assert_eq!(d, "d/e/extra is not in the cache");
        // A shared prefix may hold files of its own.
        assert_eq!(first_difference(&a, &b, false).unwrap().0, None);
    }
}
