//! Times the checked tar extractor alone (for A/B runs of `unpack`):
//! `cargo run -p warmstart --example extract -- TAR DEST` extracts TAR (a plain
//! tar, or a `.zst` decoded on a second thread as `cache restore` does) into
//! DEST, which must not exist, and prints one JSON line: wall and CPU seconds
//! and the extractor's `Stats`. `EXTRACT_WRITERS=N` sets `Options::writers`
//! (0: the main thread creates every file).

use std::io::{BufReader, Read};
use std::time::Instant;
use warmstart::unpack::{self, Limits, Options};

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [tar, dest] = args.as_slice() else {
        anyhow::bail!("usage: extract TAR DEST");
    };
    let dest = std::path::Path::new(dest);
    std::fs::create_dir(dest)?;
    let file = std::fs::File::open(tar)?;
    let start = Instant::now();
    let reader: Box<dyn Read> = if tar.ends_with(".zst") {
        // Decode on a second thread, as the restore pipeline does.
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(4);
        std::thread::spawn(move || {
            let mut dec = zstd::stream::read::Decoder::new(file).expect("zstd decoder");
            loop {
                let mut block = vec![0u8; 1 << 20];
                let n = dec.read(&mut block).expect("zstd decode");
                if n == 0 {
                    break;
                }
                block.truncate(n);
                if tx.send(block).is_err() {
                    break;
                }
            }
        });
        Box::new(ChannelReader {
            rx,
            cur: Vec::new(),
            pos: 0,
        })
    } else {
        Box::new(BufReader::with_capacity(1 << 20, file))
    };
    let opts = Options {
        writers: match std::env::var("EXTRACT_WRITERS") {
            Ok(n) => Some(n.parse()?),
            Err(_) => None,
        },
        ..Options::default()
    };
    let stats = unpack::extract_tar(reader, dest, &Limits::GENEROUS, &opts)?;
    println!(
        "{}",
        serde_json::json!({
            "wall_s": start.elapsed().as_secs_f64(),
            "cpu_s": cpu_seconds(),
            "stats": stats,
        })
    );
    Ok(())
}

struct ChannelReader {
    rx: std::sync::mpsc::Receiver<Vec<u8>>,
    cur: Vec<u8>,
    pos: usize,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.pos == self.cur.len() {
            match self.rx.recv() {
                Ok(b) => {
                    self.cur = b;
                    self.pos = 0;
                }
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.cur.len() - self.pos);
        buf[..n].copy_from_slice(&self.cur[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}
