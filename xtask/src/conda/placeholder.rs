//! Prefix placeholder rewriting, streamed (memory stays bounded whatever the
//! file size), with conda's semantics:
//! - text: every occurrence of the placeholder becomes the new prefix;
//! - binary: each C string (placeholder up to the next NUL) has every
//!   placeholder in it replaced, then NULs are added before its terminator
//!   so the file keeps its length (conda's `binary_replace`). The new prefix
//!   must not be longer than the placeholder. A placeholder with no NUL
//!   after it before the end of the file is left as it is (conda's regex
//!   does not match there either).

use memchr::memmem;
use std::io::{self, Read, Write};

const CHUNK: usize = 1 << 20;

/// Longest C string (from a placeholder to its NUL) held in memory while
/// rewriting a binary file.
pub const MAX_BINARY_STRING: usize = 16 << 20;

/// Reads up to CHUNK more bytes onto `buf`; returns false at end of input.
fn fill<R: Read>(r: &mut R, buf: &mut Vec<u8>) -> io::Result<bool> {
    let old = buf.len();
    buf.resize(old + CHUNK, 0);
    loop {
        match r.read(&mut buf[old..]) {
            Ok(n) => {
                buf.truncate(old + n);
                return Ok(n > 0);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                buf.truncate(old);
                return Err(e);
            }
        }
    }
}

/// Text mode: replaces every occurrence; returns how many.
pub fn rewrite_text<R: Read, W: Write>(
    mut r: R,
    mut w: W,
    from: &[u8],
    to: &[u8],
) -> io::Result<u64> {
    assert!(!from.is_empty());
    let finder = memmem::Finder::new(from);
    let mut buf = Vec::with_capacity(CHUNK + from.len());
    let mut count = 0;
    loop {
        let more = fill(&mut r, &mut buf)?;
        let mut start = 0;
        while let Some(i) = finder.find(&buf[start..]) {
            w.write_all(&buf[start..start + i])?;
            w.write_all(to)?;
            start += i + from.len();
            count += 1;
        }
        // Keep a tail that may be the start of a match split across reads.
        let keep = if more {
            (from.len() - 1).min(buf.len() - start)
        } else {
            0
        };
        let end = buf.len() - keep;
        w.write_all(&buf[start..end])?;
        buf.drain(..end);
        if !more {
            return Ok(count);
        }
    }
}

/// Writes one C string (its NUL not included in `s`) with every placeholder
/// replaced, NUL-padded to its old length so that offsets after it hold;
/// returns how many it replaced.
fn write_padded<W: Write>(
    w: &mut W,
    s: &[u8],
    finder: &memmem::Finder<'_>,
    from: &[u8],
    to: &[u8],
) -> io::Result<u64> {
    let n = memmem::find_iter(s, from).count();
    w.write_all(&replace_all(s, finder, from, to))?;
    w.write_all(&vec![0u8; (from.len() - to.len()) * n])?;
    w.write_all(&[0])?;
    Ok(n as u64)
}

/// Binary mode: NUL-padded replacement; returns how many placeholders were
/// replaced. `to` must not be longer than `from` (the caller checks first
/// and refuses with a message that names the file).
pub fn rewrite_binary<R: Read, W: Write>(
    mut r: R,
    mut w: W,
    from: &[u8],
    to: &[u8],
) -> io::Result<u64> {
    assert!(!from.is_empty() && to.len() <= from.len());
    let finder = memmem::Finder::new(from);
    let mut buf: Vec<u8> = Vec::with_capacity(CHUNK + from.len());
    // The current C string, from its first placeholder, when inside one.
    let mut string: Option<Vec<u8>> = None;
    let mut count = 0;
    let mut more = true;
    while more {
        more = fill(&mut r, &mut buf)?;
        let mut start = 0;
        loop {
            if let Some(s) = string.as_mut() {
                match memchr::memchr(0, &buf[start..]) {
                    Some(j) => {
                        s.extend_from_slice(&buf[start..start + j]);
                        count += write_padded(&mut w, s, &finder, from, to)?;
                        string = None;
                        start += j + 1;
                    }
                    None => {
                        s.extend_from_slice(&buf[start..]);
                        start = buf.len();
                        if s.len() > MAX_BINARY_STRING {
                            return Err(io::Error::other(format!(
                                "a string holding the placeholder runs over {MAX_BINARY_STRING} bytes without a NUL"
                            )));
                        }
                        break;
                    }
                }
            } else {
                match finder.find(&buf[start..]) {
                    Some(i) => {
                        w.write_all(&buf[start..start + i])?;
                        string = Some(Vec::new());
                        start += i;
                    }
                    None => {
                        let keep = if more {
                            (from.len() - 1).min(buf.len() - start)
                        } else {
                            0
                        };
                        let end = buf.len() - keep;
                        w.write_all(&buf[start..end])?;
                        start = end;
                        break;
                    }
                }
            }
        }
        buf.drain(..start);
    }
    // End of file inside a string: no NUL, so nothing to rewrite there.
    if let Some(s) = string {
        w.write_all(&s)?;
    }
    w.write_all(&buf)?;
    Ok(count)
}

fn replace_all(s: &[u8], finder: &memmem::Finder<'_>, from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut start = 0;
    while let Some(i) = finder.find(&s[start..]) {
        out.extend_from_slice(&s[start..start + i]);
        out.extend_from_slice(to);
        start += i + from.len();
    }
    out.extend_from_slice(&s[start..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that returns at most `n` bytes per read, to split matches
    /// across reads.
    struct Dribble<'a>(&'a [u8], usize);
    impl Read for Dribble<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.0.len().min(self.1).min(buf.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    fn text(input: &[u8], from: &str, to: &str, step: usize) -> (Vec<u8>, u64) {
        let mut out = Vec::new();
        let n = rewrite_text(
            Dribble(input, step),
            &mut out,
            from.as_bytes(),
            to.as_bytes(),
        )
        .unwrap();
        (out, n)
    }

    fn binary(input: &[u8], from: &str, to: &str, step: usize) -> (Vec<u8>, u64) {
        let mut out = Vec::new();
        let n = rewrite_binary(
            Dribble(input, step),
            &mut out,
            from.as_bytes(),
            to.as_bytes(),
        )
        .unwrap();
        (out, n)
    }

    #[test]
    fn text_replaces_everywhere_even_across_reads() {
        for step in [1, 2, 3, 7, 1000] {
            let (out, n) = text(
                b"a /opt/p/bin and /opt/p\n/opt/p",
                "/opt/p",
                "/usr/local",
                step,
            );
            assert_eq!(out, b"a /usr/local/bin and /usr/local\n/usr/local");
            assert_eq!(n, 3);
        }
        assert_eq!(text(b"/opt/", "/opt/p", "/x", 2), (b"/opt/".to_vec(), 0));
    }

    #[test]
    fn binary_pads_each_string_and_keeps_length() {
        // Same cases as conda's binary_replace (conda/core/portability.py).
        let input =
            b"xx/opt/placeholder/lib\0/opt/placeholder:/opt/placeholder/b\0tail/opt/placeholder";
        for step in [1, 3, 5, 1000] {
            let (out, n) = binary(input, "/opt/placeholder", "/usr", step);
            let mut want = b"xx/usr/lib".to_vec();
            want.extend_from_slice(&[0; 12]);
            want.push(0);
            want.extend_from_slice(b"/usr:/usr/b");
            want.extend_from_slice(&[0; 24]);
            want.push(0);
            // No NUL after the last placeholder: left alone.
            want.extend_from_slice(b"tail/opt/placeholder");
            assert_eq!(out, want, "step {step}");
            assert_eq!(out.len(), input.len());
            assert_eq!(n, 3);
        }
    }

    #[test]
    fn binary_same_length_is_a_plain_swap() {
        let (out, n) = binary(b"\0/opt/pp\0", "/opt/pp", "/usr/xx", 4);
        assert_eq!(out, b"\0/usr/xx\0");
        assert_eq!(n, 1);
    }
}
