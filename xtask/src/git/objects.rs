//! Objects in the private stores: blobs read and written as streams, trees
//! listed and made, root commits, local refs. Never talks to a remote.

use anyhow::{Context, Result, anyhow, bail};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Stdio};

use super::*;

/// One line of `git ls-tree -l`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeEntry {
    /// `100644`, `100755`, `040000`, `120000`, `160000`.
    pub mode: String,
    /// `blob`, `tree` or `commit`.
    pub kind: String,
    pub oid: String,
    /// Blob size in bytes (`None` for trees and submodules).
    pub size: Option<u64>,
    pub name: String,
}

impl CacheGit {
    /// The pack files in cache.git now (names of their `.idx` files).
    pub fn pack_indexes(&self) -> std::collections::HashSet<String> {
        let dir = self.dir.join("objects").join("pack");
        std::fs::read_dir(dir)
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.ends_with(".idx"))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The objects of the packs whose `.idx` files are `names`
    /// (`git show-index`): what a fetch that made those packs brought.
    pub fn objects_in_packs<'a>(
        &self,
        names: impl Iterator<Item = &'a String>,
    ) -> Result<std::collections::HashSet<String>> {
        let mut out = std::collections::HashSet::new();
        for name in names {
            let path = self.dir.join("objects").join("pack").join(name);
            let idx = std::fs::File::open(&path)
                .with_context(|| format!("opening {}", path.display()))?;
            let listed = self
                .git()
                .arg("show-index")
                .stdin(idx)
                .output()
                .context("running git show-index")?;
            check_status(&listed, "git show-index", None)?;
            for line in String::from_utf8_lossy(&listed.stdout).lines() {
                if let Some(oid) = line.split_whitespace().nth(1) {
                    out.insert(oid.to_string());
                }
            }
        }
        Ok(out)
    }

    /// The size of each blob that is in cache.git (`None`: not here, e.g.
    /// left out by a filtered fetch), in the order given.
    pub fn blob_sizes(&self, oids: &[String]) -> Result<Vec<Option<u64>>> {
        if oids.is_empty() {
            return Ok(Vec::new());
        }
        if !missing_lookups_safe() {
            // Older git dies on the first missing id (see `ls_tree`).
            let sizes = self
                .local_blob_sizes()
                .with_context(|| format!("listing the blobs of {}", self.dir.display()))?;
            return Ok(oids.iter().map(|o| sizes.get(o).copied()).collect());
        }
        let input: String = oids.iter().map(|o| format!("{o}\n")).collect();
        let out = run_with_input(
            self.git().args([
                "cat-file",
                "--batch-check=%(objectname) %(objecttype) %(objectsize)",
            ]),
            input.into_bytes(),
            "git cat-file --batch-check",
        )?;
        let text = String::from_utf8_lossy(&out);
        let sizes: Vec<Option<u64>> = text
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                match f[..] {
                    [_, "blob", size] => size.parse().ok(),
                    _ => None,
                }
            })
            .collect();
        if sizes.len() != oids.len() {
            bail!(
                "git cat-file --batch-check answered {} of {} objects",
                sizes.len(),
                oids.len()
            );
        }
        Ok(sizes)
    }

    /// The commit `refs/warmstart/<branch>` points at from the last fetch or
    /// publish in this clone, without contacting the remote.
    pub fn local_branch(&self, branch: &str) -> Result<Option<String>> {
        self.rev_parse(&local_ref(branch))
    }

    /// Points `refs/warmstart/<branch>` at `commit` (after a publish pushed it,
    /// so the next fetch of that commit downloads nothing).
    pub fn set_local_branch(&self, branch: &str, commit: &str) -> Result<()> {
        let _lock = self.lock()?;
        run(self.git().args(["update-ref", &local_ref(branch), commit]))
            .map(drop)
            .with_context(|| format!("recording {branch} at {commit} in {}", self.dir.display()))
    }

    pub(super) fn rev_parse(&self, rev: &str) -> Result<Option<String>> {
        let out = self
            .git()
            .args([
                "rev-parse",
                "--verify",
                "--quiet",
                &format!("{rev}^{{commit}}"),
            ])
            .output()
            .context("running git rev-parse")?;
        Ok(if out.status.success() {
            Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            None
        })
    }

    /// The parents a commit object names (a shallow fetch keeps them in the
    /// object even though the parents themselves are absent).
    pub fn commit_parents(&self, commit: &str) -> Result<Vec<String>> {
        let out = run(self.git().args(["cat-file", "commit", commit]))
            .with_context(|| format!("reading commit {commit}"))?;
        let text = String::from_utf8_lossy(&out);
        Ok(text
            .lines()
            .take_while(|l| !l.is_empty())
            .filter_map(|l| l.strip_prefix("parent "))
            .map(str::to_string)
            .collect())
    }

    /// The root tree of a commit (`git ls-tree -l -z`), in git's order. A
    /// blob the filtered fetch left out has no size. Git before 2.47 dies in
    /// `ls-tree -l` on such a blob (Debian 12's 2.39 fails its lazy fetch,
    /// which `GIT_NO_LAZY_FETCH` forbids), so there the tree is listed
    /// without sizes, and the sizes of the blobs this store holds come from
    /// `cat-file --batch-all-objects`, which never looks up a missing one.
    pub fn ls_tree(&self, rev: &str) -> Result<Vec<TreeEntry>> {
        let sized = missing_lookups_safe();
        let mut cmd = self.git();
        cmd.arg("ls-tree");
        if sized {
            cmd.arg("-l");
        }
        let out = run(cmd.args(["-z", "--full-tree", rev]))
            .with_context(|| format!("listing the tree of {rev}"))?;
        let mut entries = parse_ls_tree(&out)?;
        if !sized {
            let sizes = self
                .local_blob_sizes()
                .with_context(|| format!("listing the blobs of {}", self.dir.display()))?;
            for e in entries.iter_mut().filter(|e| e.kind == "blob") {
                e.size = sizes.get(&e.oid).copied();
            }
        }
        Ok(entries)
    }

    /// The size of every blob this store holds (packs and loose objects),
    /// by id: enumerated, so no missing object is ever looked up.
    pub(super) fn local_blob_sizes(&self) -> Result<std::collections::HashMap<String, u64>> {
        let out = run(self.git().args([
            "cat-file",
            "--batch-check=%(objectname) %(objecttype) %(objectsize)",
            "--batch-all-objects",
            "--unordered",
        ]))?;
        Ok(parse_blob_sizes(&String::from_utf8_lossy(&out)))
    }

    /// Streams a blob: the reader fails (rather than ending early) if git
    /// exits with an error before the whole blob was read.
    pub fn read_blob(&self, oid: &str) -> Result<BlobReader> {
        let mut child = self
            .git()
            .args(["cat-file", "blob", oid])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("running git cat-file")?;
        let stdout = child.stdout.take().expect("piped stdout");
        Ok(BlobReader {
            child: Some(child),
            stdout,
            oid: oid.to_string(),
            store: self.dir.clone(),
        })
    }

    /// A whole small blob (e.g. `warmstart.json`) as bytes.
    pub fn read_blob_bytes(&self, oid: &str) -> Result<Vec<u8>> {
        let mut buf = Vec::new();
        self.read_blob(oid)?
            .read_to_end(&mut buf)
            .with_context(|| format!("reading blob {oid}"))?;
        Ok(buf)
    }

    /// Writes a small blob from memory.
    pub fn write_blob_bytes(&self, bytes: &[u8]) -> Result<String> {
        let out = run_with_input(
            self.git().args(["hash-object", "-w", "--stdin"]),
            bytes.to_vec(),
            "git hash-object",
        )?;
        parse_oid(&out)
    }

    /// Starts a writer that turns files (big chunks) into blobs. Each file
    /// is streamed by git into its own pack, uncompressed (see `CONFIG`):
    /// no loose 99 MiB objects, no zlib, no copy through a pipe.
    pub fn blob_writer(&self) -> Result<BlobWriter> {
        self.hash_objects(true)
    }

    /// Starts a hasher: the blob id each file would have in cache.git
    /// (in its object format), storing nothing. A publish compares it with
    /// the id a branch gives a chunk before it lets that blob stand for the
    /// chunk it just made: the name a pusher wrote in `warmstart.json`
    /// proves nothing, the id of the bytes does.
    pub fn blob_hasher(&self) -> Result<BlobWriter> {
        self.hash_objects(false)
    }

    fn hash_objects(&self, write: bool) -> Result<BlobWriter> {
        let mut cmd = self.git();
        cmd.arg("hash-object");
        if write {
            cmd.arg("-w");
        }
        let mut child = cmd
            .args(["--no-filters", "--stdin-paths"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("running git hash-object --stdin-paths")?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        Ok(BlobWriter {
            child,
            stdin: Some(stdin),
            stdout,
            objects: self.dir.join("objects"),
            started: std::time::SystemTime::now(),
        })
    }

    /// Builds a tree from entries (`mode`, `kind`, `oid`, `name`; sizes are
    /// ignored). Names must be unique; git sorts them.
    pub fn mktree(&self, entries: &[TreeEntry]) -> Result<String> {
        let mut input = Vec::new();
        for e in entries {
            if e.name.contains('\0') || e.name.contains('/') {
                bail!("tree entry name {:?} is not a plain file name", e.name);
            }
            write!(input, "{} {} {}\t{}\0", e.mode, e.kind, e.oid, e.name)?;
        }
        // `--missing`: a publish keeps the chunks of other keys, which a
        // filtered fetch left on the remote.
        let out = run_with_input(
            self.git().args(["mktree", "-z", "--missing"]),
            input,
            "git mktree",
        )?;
        parse_oid(&out)
    }

    /// A commit of `tree` with no parent (a cache branch is always one root
    /// commit). The identity is fixed: the commit is made by a machine, and
    /// a runner without `user.name` must still publish.
    pub fn commit_tree(&self, tree: &str, message: &str) -> Result<String> {
        let out = self
            .git()
            .args(["commit-tree", tree, "-m", message])
            .env("GIT_AUTHOR_NAME", "warmstart")
            .env("GIT_AUTHOR_EMAIL", "warmstart@localhost")
            .env("GIT_COMMITTER_NAME", "warmstart")
            .env("GIT_COMMITTER_EMAIL", "warmstart@localhost")
            .stdin(Stdio::null())
            .output()
            .context("running git commit-tree")?;
        check_status(&out, "git commit-tree", Some(&self.dir))?;
        parse_oid(&out.stdout)
    }
}

/// `git hash-object --stdin-paths`, kept running across chunks.
pub struct BlobWriter {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    /// cache.git's object directory, and when this writer started: the
    /// `tmp_obj_*` a failed `git hash-object` leaves (it does on a full
    /// disk) are the ones made since, that nobody holds open.
    objects: PathBuf,
    started: std::time::SystemTime,
}

impl BlobWriter {
    /// Writes the file at `path` (absolute) as a blob; returns its oid. The
    /// file may be deleted once this returns.
    pub fn write_file(&mut self, path: &Path) -> Result<String> {
        let text = path
            .to_str()
            .filter(|p| !p.contains('\n'))
            .ok_or_else(|| anyhow!("{} cannot be passed to git by name", path.display()))?;
        let stdin = self.stdin.as_mut().expect("writer is open");
        let sent = writeln!(stdin, "{text}").and_then(|()| stdin.flush());
        let mut line = String::new();
        let read = self.stdout.read_line(&mut line);
        if sent.is_err() || !matches!(read, Ok(n) if n > 0) {
            return Err(self.failure(&format!("writing {} to cache.git", path.display())));
        }
        parse_oid(line.as_bytes())
    }

    pub(super) fn failure(&mut self, what: &str) -> anyhow::Error {
        drop(self.stdin.take());
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        let _ = self.child.wait();
        remove_dead_loose_temps(&self.objects, self.started);
        anyhow!("{what}: git hash-object failed: {}", last_lines(&err))
    }

    /// Closes the writer and checks git's exit status.
    pub fn finish(mut self) -> Result<()> {
        drop(self.stdin.take());
        let status = self.child.wait().context("waiting for git hash-object")?;
        if !status.success() {
            let mut err = String::new();
            if let Some(mut e) = self.child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            remove_dead_loose_temps(&self.objects, self.started);
            bail!("git hash-object failed: {}", last_lines(&err));
        }
        Ok(())
    }
}

impl Drop for BlobWriter {
    fn drop(&mut self) {
        if self.stdin.take().is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
            remove_dead_loose_temps(&self.objects, self.started);
        }
    }
}

/// Removes the `tmp_obj_*` files under `objects/??/` made since `since`
/// that no process holds open: what a `git hash-object` of ours left
/// when it failed or was killed (a live git writing one holds it open).
fn remove_dead_loose_temps(objects: &Path, since: std::time::SystemTime) {
    let Ok(rd) = std::fs::read_dir(objects) else {
        return;
    };
    let mut found = Vec::new();
    for d in rd.flatten().filter(|d| d.file_name().len() == 2) {
        for f in std::fs::read_dir(d.path()).into_iter().flatten().flatten() {
            let recent = f
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t >= since - std::time::Duration::from_secs(1));
            if recent && f.file_name().to_string_lossy().starts_with("tmp_obj_") {
                found.push(f.path());
            }
        }
    }
    if found.is_empty() {
        return;
    }
    let open = crate::process::group::files_open_under(objects);
    for f in found.into_iter().filter(|f| !open.contains(f)) {
        let _ = std::fs::remove_file(f);
    }
}

/// A blob streamed from `git cat-file blob`. End of stream is only reported
/// after git exited successfully, so a failing git never looks like a short
/// blob.
pub struct BlobReader {
    child: Option<Child>,
    stdout: ChildStdout,
    oid: String,
    store: PathBuf,
}

impl Read for BlobReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.stdout.read(buf)?;
        if n == 0
            && !buf.is_empty()
            && let Some(mut child) = self.child.take()
        {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            let status = child.wait()?;
            if !status.success() {
                let said = format!(
                    "git cat-file blob {} failed: {}",
                    self.oid,
                    last_lines(&err)
                );
                // A damaged store travels inside the I/O error, so that
                // `damage_of` finds it under whatever the reader's caller
                // wraps it in.
                return Err(match StoreDamaged::of(&self.store, &err) {
                    Some(d) => std::io::Error::other(d),
                    None => std::io::Error::other(said),
                });
            }
        }
        Ok(n)
    }
}

impl Drop for BlobReader {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The blob lines of `cat-file --batch-check='%(objectname) %(objecttype)
/// %(objectsize)'`, as id to size.
pub(super) fn parse_blob_sizes(text: &str) -> std::collections::HashMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            let (oid, kind, size) = (f.next()?, f.next()?, f.next()?);
            (kind == "blob").then(|| Some((oid.to_string(), size.parse().ok()?)))?
        })
        .collect()
}

/// Parses `git ls-tree -l -z` output (or, without `-l`, `ls-tree -z`'s:
/// every size `None`).
pub fn parse_ls_tree(out: &[u8]) -> Result<Vec<TreeEntry>> {
    let text = std::str::from_utf8(out).context("git ls-tree printed a non-UTF-8 name")?;
    let mut entries = Vec::new();
    for rec in text.split('\0').filter(|r| !r.is_empty()) {
        let (meta, name) = rec
            .split_once('\t')
            .ok_or_else(|| anyhow!("unexpected git ls-tree line {rec:?}"))?;
        let fields: Vec<&str> = meta.split_whitespace().collect();
        let (mode, kind, oid, size) = match fields[..] {
            [mode, kind, oid, size] => (mode, kind, oid, size),
            [mode, kind, oid] => (mode, kind, oid, "-"),
            _ => bail!("unexpected git ls-tree line {rec:?}"),
        };
        entries.push(TreeEntry {
            mode: mode.to_string(),
            kind: kind.to_string(),
            oid: oid.to_string(),
            size: size.parse().ok(),
            name: name.to_string(),
        });
    }
    Ok(entries)
}
