//! The pack a direct read receives, parsed as it streams: whole blobs
//! only, each inflated into a partial file of the store while it is
//! hashed, and stored under its sha256 once its size and digest matched a
//! want. It never stores a blob that matched no want, and anything it
//! does not expect (a delta, another object type) is `Error::Unsupported`.

use anyhow::anyhow;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::Write;
use std::path::PathBuf;

use super::{Error, Partial, Store, Want};

#[derive(Debug, PartialEq, Eq)]
enum Part {
    Header,
    Object,
    Body,
    Trailer,
}

/// The blob being inflated: its partial file in the store.
struct Current {
    tmp: PathBuf,
    file: File,
    /// Removes the partial file on SIGTERM or Ctrl-C (not 15 minutes on,
    /// `Store::sweep`).
    _guard: crate::process::signals::TempGuard,
    hasher: Sha256,
    size: u64,
    written: u64,
}

/// Parses a pack of whole blobs, the ones `wants` asks for, inflating
/// each into a partial file of the store while hashing it, and storing it
/// under its sha256 once it matched.
pub(super) struct PackSink<'a> {
    part: Part,
    /// Bytes of the pack header, an object header or the trailer so far.
    held: Vec<u8>,
    /// Objects the pack says it holds, and how many were read.
    count: u32,
    seen: u32,
    inflate: flate2::Decompress,
    out: Vec<u8>,
    store: &'a Store,
    wants: &'a [Want],
    /// Which wants are stored.
    done: Vec<bool>,
    current: Option<Current>,
    on_stored: &'a mut dyn FnMut(usize),
}

impl<'a> PackSink<'a> {
    pub(super) fn new(
        store: &'a Store,
        wants: &'a [Want],
        on_stored: &'a mut dyn FnMut(usize),
    ) -> Self {
        PackSink {
            part: Part::Header,
            held: Vec::new(),
            count: 0,
            seen: 0,
            inflate: flate2::Decompress::new(true),
            out: vec![0; 1 << 20],
            store,
            wants,
            done: vec![false; wants.len()],
            current: None,
            on_stored,
        }
    }

    /// The first want still awaited (for messages about the pack as a whole).
    fn first_awaited(&self) -> usize {
        self.done.iter().position(|d| !d).unwrap_or(0)
    }

    pub(super) fn feed(&mut self, mut data: &[u8]) -> Result<(), Error> {
        while !data.is_empty() {
            data = match self.part {
                Part::Header => self.header(data)?,
                Part::Object => self.object_header(data)?,
                Part::Body => self.body(data)?,
                Part::Trailer => {
                    self.held.extend_from_slice(data);
                    if self.held.len() > 20 {
                        return Err(Error::Unsupported("bytes after the pack".into()));
                    }
                    &[]
                }
            };
        }
        Ok(())
    }

    fn header<'d>(&mut self, data: &'d [u8]) -> Result<&'d [u8], Error> {
        let take = (12 - self.held.len()).min(data.len());
        self.held.extend_from_slice(&data[..take]);
        if self.held.len() == 12 {
            let h = &self.held;
            let version = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
            if &h[..4] != b"PACK" || !(version == 2 || version == 3) {
                return Err(Error::Unsupported("not a pack".into()));
            }
            self.count = u32::from_be_bytes([h[8], h[9], h[10], h[11]]);
            self.held.clear();
            self.part = if self.count == 0 {
                Part::Trailer
            } else {
                Part::Object
            };
        }
        Ok(&data[take..])
    }

    fn object_header<'d>(&mut self, data: &'d [u8]) -> Result<&'d [u8], Error> {
        let b = data[0];
        self.held.push(b);
        if self.held.len() > 10 {
            return Err(Error::Unsupported("an object header over 10 bytes".into()));
        }
        if b & 0x80 != 0 {
            return Ok(&data[1..]);
        }
        let (kind, size) = object_header(&self.held)?;
        self.held.clear();
        match kind {
            3 => {}
            6 | 7 => {
                return Err(Error::Unsupported(
                    "the server sent a chunk as a delta".into(),
                ));
            }
            k => return Err(Error::Unsupported(format!("object type {k}"))),
        }
        if !self
            .wants
            .iter()
            .zip(&self.done)
            .any(|(w, d)| !d && w.size == size)
        {
            // An object nobody asked for, or a chunk of another size than
            // declared: git fetch takes what the server sends, and the
            // size check after it gives the verdict.
            return Err(Error::Unsupported(format!(
                "the pack holds a blob of {size} bytes, which no chunk asked for has"
            )));
        }
        let (tmp, file) = self.store.create_tmp(&[0; 32])?;
        self.current = Some(Current {
            _guard: crate::process::signals::register_temp(&tmp),
            tmp,
            file,
            hasher: Sha256::new(),
            size,
            written: 0,
        });
        self.inflate = flate2::Decompress::new(true);
        self.part = Part::Body;
        Ok(&data[1..])
    }

    fn body<'d>(&mut self, data: &'d [u8]) -> Result<&'d [u8], Error> {
        let cur = self.current.as_mut().expect("a body has an object");
        let in0 = self.inflate.total_in();
        let out0 = self.inflate.total_out();
        let status = self
            .inflate
            .decompress(data, &mut self.out, flate2::FlushDecompress::None)
            .map_err(|e| Error::Failed(anyhow!("the blob does not inflate: {e}")))?;
        let used = (self.inflate.total_in() - in0) as usize;
        let made = (self.inflate.total_out() - out0) as usize;
        cur.written += made as u64;
        if cur.written > cur.size {
            return Err(Error::Failed(anyhow!(
                "a blob of {} bytes inflates to more",
                cur.size
            )));
        }
        cur.hasher.update(&self.out[..made]);
        cur.file.write_all(&self.out[..made])?;
        if status == flate2::Status::StreamEnd {
            self.store_current()?;
            self.seen += 1;
            self.part = if self.seen == self.count {
                Part::Trailer
            } else {
                Part::Object
            };
        } else if used == 0 && made == 0 {
            return Err(Error::Failed(anyhow!("the blob does not inflate")));
        }
        Ok(&data[used..])
    }

    /// The blob just inflated: stored under its sha256 if a want awaits
    /// it (with its size), else refused.
    fn store_current(&mut self) -> Result<(), Error> {
        let cur = self.current.take().expect("an object was inflated");
        let remove = |e: Error| {
            let _ = std::fs::remove_file(&cur.tmp);
            e
        };
        if cur.written != cur.size {
            return Err(remove(Error::Failed(anyhow!(
                "a blob of {} bytes inflates to {}",
                cur.size,
                cur.written
            ))));
        }
        let got: [u8; 32] = cur.hasher.clone().finalize().into();
        let matching: Vec<usize> = (0..self.wants.len())
            .filter(|&i| !self.done[i] && self.wants[i].sha256 == got)
            .filter(|&i| self.wants[i].size == cur.size)
            .collect();
        if matching.is_empty() {
            // Named after the first awaited chunk of that size.
            let want = (0..self.wants.len())
                .find(|&i| !self.done[i] && self.wants[i].size == cur.size)
                .unwrap_or_else(|| self.first_awaited());
            return Err(remove(Error::Digest { want, got }));
        }
        let dest = self.store.path(&got);
        std::fs::rename(&cur.tmp, &dest).map_err(|e| {
            remove(Error::Failed(
                anyhow!(e).context(format!("storing {}", dest.display())),
            ))
        })?;
        for i in matching {
            self.done[i] = true;
            (self.on_stored)(i);
        }
        Ok(())
    }

    /// Whether any byte of the pack arrived.
    pub(super) fn started(&self) -> bool {
        self.part != Part::Header || !self.held.is_empty()
    }

    /// The blob being inflated, if the pack stopped inside one: taken for
    /// the first awaited want of its size.
    pub(super) fn partial(&self) -> Option<Partial> {
        let cur = self.current.as_ref()?;
        let want = (0..self.wants.len())
            .find(|&i| !self.done[i] && self.wants[i].size == cur.size)
            .unwrap_or_else(|| self.first_awaited());
        Some(Partial {
            want,
            size: cur.size,
            arrived: cur.written,
        })
    }

    /// Checks that the pack ended where it should and held every want.
    pub(super) fn finish(&self) -> Result<(), Error> {
        if self.part != Part::Trailer || self.held.len() != 20 {
            return Err(Error::Failed(anyhow!("the pack ended early")));
        }
        if let Some(i) = self.done.iter().position(|d| !d) {
            return Err(Error::NotOnRemote(Some(self.wants[i].oid.clone())));
        }
        Ok(())
    }
}

impl Drop for PackSink<'_> {
    fn drop(&mut self) {
        if let Some(cur) = self.current.take() {
            let _ = std::fs::remove_file(&cur.tmp);
        }
    }
}

/// A pack object header: type (bits 4-6 of the first byte) and inflated
/// size (4 bits, then 7 per continuation byte).
fn object_header(h: &[u8]) -> Result<(u8, u64), Error> {
    let kind = (h[0] >> 4) & 7;
    let mut size = u64::from(h[0] & 0x0f);
    let mut shift = 4;
    for &b in &h[1..] {
        if shift > 57 {
            return Err(Error::Unsupported("object size too large".into()));
        }
        size |= u64::from(b & 0x7f) << shift;
        shift += 7;
    }
    Ok((kind, size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_headers_parse() {
        // A blob of 103809024 bytes, as git writes it.
        assert_eq!(
            object_header(&[0xb0, 0x80, 0x80, 0x8c, 0x03]).unwrap(),
            (3, 103_809_024)
        );
        assert_eq!(object_header(&[0x35]).unwrap(), (3, 5));
        assert_eq!(object_header(&[0x6a]).unwrap().0, 6);
    }
}
