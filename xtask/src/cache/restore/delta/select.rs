//! The chunks a delta decodes (only those that hold an entry to write) and
//! the tar offsets of the bytes they decode to. It never decides what the
//! bytes are; `verify::stream` checks every chunk first.

use super::*;

/// The chunks that hold any of `writes` (ascending), and the tar span of
/// each: all of them, as one span, when the chunks are not independent
/// frames.
/// A slice of the tar: `start..end`.
pub(super) type Span = (u64, u64);

pub(super) fn select(entry: &KeyEntry, writes: &[&Entry]) -> Result<(Vec<usize>, Vec<Span>)> {
    let n = entry.chunks.len();
    if entry.frames.is_none() {
        return Ok(((0..n).collect(), vec![(0, entry.tar_size)]));
    }
    let mut spans = Vec::with_capacity(n);
    let mut off = 0u64;
    for c in &entry.chunks {
        let raw = c
            .raw_size
            .ok_or_else(|| fallback(format!("chunk {} has no raw_size", c.file)))?;
        spans.push((off, off + raw));
        off += raw;
    }
    let mut chosen = vec![false; n];
    for e in writes {
        let mut k = spans.partition_point(|s: &(u64, u64)| s.1 <= e.offset);
        while k < n && spans[k].0 < e.end {
            chosen[k] = true;
            k += 1;
        }
    }
    let picked: Vec<usize> = (0..n).filter(|&k| chosen[k]).collect();
    let picked_spans = picked.iter().map(|&k| spans[k]).collect();
    Ok((picked, picked_spans))
}

/// The decoded stream of the chosen chunks, with each byte's tar offset.
pub(super) struct Positioned<'r> {
    pub(super) inner: &'r mut dyn Read,
    pub(super) spans: &'r [(u64, u64)],
    pub(super) at: usize,
    pub(super) pos: u64,
}

impl<'r> Positioned<'r> {
    pub(super) fn new(inner: &'r mut dyn Read, spans: &'r [(u64, u64)]) -> Positioned<'r> {
        let pos = spans.first().map_or(0, |s| s.0);
        Positioned {
            inner,
            spans,
            at: 0,
            pos,
        }
    }

    /// Moves on to the next span once this one is read.
    pub(super) fn settle(&mut self) {
        while self.at < self.spans.len() && self.pos >= self.spans[self.at].1 {
            self.at += 1;
            if let Some(s) = self.spans.get(self.at) {
                self.pos = s.0;
            }
        }
    }

    /// Reads and drops the bytes up to tar offset `off`.
    pub(super) fn skip_to(&mut self, off: u64) -> io::Result<()> {
        loop {
            self.settle();
            let Some(&(_, end)) = self.spans.get(self.at) else {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "past the chunks",
                ));
            };
            if off < self.pos {
                return Err(io::Error::other(format!(
                    "offset {off} is not in a decoded chunk"
                )));
            }
            let stop = off.min(end);
            let want = stop - self.pos;
            let got = io::copy(&mut (&mut *self.inner).take(want), &mut io::sink())?;
            if got != want {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "chunks end early",
                ));
            }
            self.pos = stop;
            if off < end {
                return Ok(());
            }
        }
    }
}

impl Read for Positioned<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.settle();
        let Some(&(_, end)) = self.spans.get(self.at) else {
            return Ok(0);
        };
        let want = buf
            .len()
            .min(usize::try_from(end - self.pos).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        if n == 0 && want > 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "chunks end early",
            ));
        }
        self.pos += n as u64;
        Ok(n)
    }
}
