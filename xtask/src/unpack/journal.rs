//! The merge journal's file format: the plan of a merge into a shared prefix,
//! written (and fsynced) before the first file moves.
//!
//! Byte-exact for any path (names need not be UTF-8), so fields are
//! NUL-terminated after a text header line:
//! ```text
//! warmstart-merge-journal 1\n
//! staging\0<path>\0 prefix\0<path>\0
//! symlinks\0external\0   only when external symlinks are allowed
//! abslink\0<glob>\0 ...   paths whose symlink may be absolute (no `..`)
//! d\0<rel>\0 ...   directories to create, parents first
//! f\0<rel>\0 ...   files and symlinks to move
//! end\0
//! ```
//! The trailing `end` marks a complete file; the journal is written to a
//! temporary name and renamed, so a torn journal means a corrupt disk.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

const HEADER: &[u8] = b"warmstart-merge-journal 1\n";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Journal {
    pub staging: PathBuf,
    pub prefix: PathBuf,
    /// Staged symlinks may lead outside the prefix (`--allow-external-symlinks`):
    /// the replay judges them as the first run did.
    pub external_symlinks: bool,
    /// The merge's `absolute_symlinks` globs, so the replay judges staged
    /// links by the same rule as the first run.
    pub absolute_symlinks: Vec<String>,
    pub entries: Vec<(Kind, PathBuf)>,
}

impl Journal {
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = HEADER.to_vec();
        let mut field = |tag: &[u8], value: &OsStr| {
            out.extend_from_slice(tag);
            out.push(0);
            out.extend_from_slice(value.as_bytes());
            out.push(0);
        };
        field(b"staging", self.staging.as_os_str());
        field(b"prefix", self.prefix.as_os_str());
        if self.external_symlinks {
            field(b"symlinks", OsStr::new("external"));
        }
        for glob in &self.absolute_symlinks {
            field(b"abslink", OsStr::new(glob));
        }
        for (kind, rel) in &self.entries {
            let tag: &[u8] = match kind {
                Kind::Dir => b"d",
                Kind::File => b"f",
            };
            field(tag, rel.as_os_str());
        }
        out.extend_from_slice(b"end\0");
        out
    }

    /// Parses a journal; the error says what is wrong, for the caller to
    /// report with the file's path.
    pub fn parse(bytes: &[u8]) -> Result<Journal, String> {
        let body = bytes
            .strip_prefix(HEADER)
            .ok_or("not a warmstart merge journal (version 1)")?;
        let body = body
            .strip_suffix(b"end\0")
            .ok_or("truncated: no end marker")?;
        let fields: Vec<&[u8]> = body.split(|&b| b == 0).collect();
        // `split` yields one empty piece after the final NUL.
        let fields = match fields.split_last() {
            Some(([], rest)) => rest,
            _ => return Err("malformed: fields are not NUL-terminated".into()),
        };
        if fields.len() % 2 != 0 {
            return Err("malformed: a tag without a value".into());
        }
        let mut staging = None;
        let mut prefix = None;
        let mut external_symlinks = false;
        let mut absolute_symlinks = Vec::new();
        let mut entries = Vec::new();
        for pair in fields.chunks(2) {
            let value = PathBuf::from(OsStr::from_bytes(pair[1]));
            match pair[0] {
                b"staging" => staging = Some(value),
                b"prefix" => prefix = Some(value),
                b"symlinks" if pair[1] == b"external" => external_symlinks = true,
                b"abslink" => absolute_symlinks.push(
                    String::from_utf8(pair[1].to_vec())
                        .map_err(|_| "malformed: a glob that is not UTF-8")?,
                ),
                b"d" => entries.push((Kind::Dir, value)),
                b"f" => entries.push((Kind::File, value)),
                tag => {
                    return Err(format!(
                        "malformed: unknown tag `{}`",
                        String::from_utf8_lossy(tag)
                    ));
                }
            }
            if let Some((_, rel)) = entries.last()
                && (rel.is_absolute()
                    || rel
                        .components()
                        .any(|c| !matches!(c, std::path::Component::Normal(_))))
            {
                return Err(format!("malformed: unsafe path `{}`", rel.display()));
            }
        }
        Ok(Journal {
            staging: staging.ok_or("malformed: no staging path")?,
            prefix: prefix.ok_or("malformed: no prefix path")?,
            external_symlinks,
            absolute_symlinks,
            entries,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Journal {
        Journal {
            staging: "/p/.x.staging-1".into(),
            prefix: "/usr/local".into(),
            external_symlinks: false,
            absolute_symlinks: Vec::new(),
            entries: vec![
                (Kind::Dir, "bin".into()),
                (Kind::File, "bin/wasm-merge".into()),
                (
                    Kind::File,
                    PathBuf::from(OsStr::from_bytes(b"lib/\xffodd name")),
                ),
            ],
        }
    }

    #[test]
    fn round_trips_any_bytes() {
        let mut j = sample();
        assert_eq!(Journal::parse(&j.to_bytes()).unwrap(), j);
        j.external_symlinks = true;
        assert_eq!(Journal::parse(&j.to_bytes()).unwrap(), j);
        j.absolute_symlinks = vec!["venv/bin/python*".into()];
        assert_eq!(Journal::parse(&j.to_bytes()).unwrap(), j);
    }

    #[test]
    fn torn_or_foreign_journals_are_refused() {
        let bytes = sample().to_bytes();
        let torn = &bytes[..bytes.len() - 3];
        assert!(Journal::parse(torn).unwrap_err().contains("truncated"));
        assert!(
            Journal::parse(b"{}")
                .unwrap_err()
                .contains("not a warmstart")
        );
        let mut bad = HEADER.to_vec();
        bad.extend_from_slice(b"staging\0/s\0prefix\0/p\0f\0../etc/passwd\0end\0");
        assert!(Journal::parse(&bad).unwrap_err().contains("unsafe path"));
    }
}
