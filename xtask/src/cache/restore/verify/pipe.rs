//! The channels between the stages of `verify::stream`: blocks of bytes, a
//! stage's failure, and the reader that turns them back into a stream. They
//! carry bytes and never look at them.

use super::*;

/// A stage stopped because the stage after it hung up (it failed first).
#[derive(Debug)]
pub(super) struct Cancelled;

impl std::fmt::Display for Cancelled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("cancelled")
    }
}

impl std::error::Error for Cancelled {}

pub(super) fn is_cancelled(e: &anyhow::Error) -> bool {
    e.downcast_ref::<Cancelled>().is_some()
}

/// Messages between stages: bytes, or "I failed" (the error itself is
/// returned by the failing stage's thread; this only stops the reader).
pub(super) enum Msg {
    Data(Vec<u8>),
    Failed(String),
}

/// Reads the blocks a stage sends, handing spent buffers back for reuse.
pub(super) struct BlockReader {
    rx: Receiver<Msg>,
    recycle: Sender<Vec<u8>>,
    cur: Vec<u8>,
    pos: usize,
    done: bool,
}

impl BlockReader {
    pub(super) fn new(rx: Receiver<Msg>, recycle: Sender<Vec<u8>>) -> BlockReader {
        BlockReader {
            rx,
            recycle,
            cur: Vec::new(),
            pos: 0,
            done: false,
        }
    }
}

impl Read for BlockReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.cur.len() {
            if self.done || buf.is_empty() {
                return Ok(0);
            }
            let spent = std::mem::take(&mut self.cur);
            if spent.capacity() > 0 {
                let _ = self.recycle.send(spent);
            }
            self.pos = 0;
            match self.rx.recv() {
                Ok(Msg::Data(block)) => self.cur = block,
                Ok(Msg::Failed(why)) => {
                    self.done = true;
                    return Err(io::Error::other(why));
                }
                // The sender finished: a clean end of stream.
                Err(_) => {
                    self.done = true;
                    return Ok(0);
                }
            }
        }
        let n = buf.len().min(self.cur.len() - self.pos);
        buf[..n].copy_from_slice(&self.cur[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Sends `block` on; `Cancelled` if the next stage is gone.
pub(super) fn send(tx: &SyncSender<Msg>, block: Vec<u8>) -> Result<()> {
    tx.send(Msg::Data(block)).map_err(|_| anyhow!(Cancelled))
}

/// Tells the next stage this one failed, and returns the error.
pub(super) fn failed(tx: &SyncSender<Msg>, err: anyhow::Error) -> anyhow::Error {
    if !is_cancelled(&err) {
        let _ = tx.send(Msg::Failed(format!("{err:#}")));
    }
    err
}

pub(super) fn take_buffer(recycle: &Receiver<Vec<u8>>) -> Vec<u8> {
    recycle.try_recv().unwrap_or_default()
}

/// Reads until `buf` is full or the reader ends; returns how much it read.
pub(super) fn fill(r: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match r.read(&mut buf[done..]) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}
