//! Unit tests of the verified stream: hashing before decoding, mismatches named, the framed decoders.

use super::*;
use crate::exit::code_of;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Reads `r` to its end, counting in `seen` what the consumer saw.
fn drain_counting(r: &mut dyn Read, seen: &std::sync::atomic::AtomicU64) -> Result<()> {
    let mut buf = [0u8; 4096];
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        seen.fetch_add(n as u64, Ordering::Relaxed);
    }
}

fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, name, *data).unwrap();
    }
    b.into_inner().unwrap()
}

/// A v1 plan over `tar` compressed with zstd and cut into `parts` pieces.
fn v1(tar: &[u8], parts: usize) -> (Plan, Vec<Vec<u8>>) {
    let z = zstd::encode_all(tar, 3).unwrap();
    let step = z.len().div_ceil(parts);
    let chunks: Vec<Vec<u8>> = z.chunks(step).map(<[u8]>::to_vec).collect();
    let pieces = chunks
        .iter()
        .enumerate()
        .map(|(i, c)| Piece {
            file: format!("k.tar.zst.part{i:03}"),
            size: c.len() as u64,
            sha256: Some(Sha256::digest(c).into()),
        })
        .collect();
    let plan = Plan {
        label: "key k on branch b".into(),
        fix: "republish".into(),
        pieces,
        check: Check::PerPiece,
        codec: Codec::Zstd,
        tar_sha256: Some(Sha256::digest(tar).into()),
        tar_size: Some(tar.len() as u64),
        tar_cap: tar.len() as u64,
        hash_tar: true,
        frames: None,
    };
    (plan, chunks)
}

fn run(plan: &Plan, chunks: &[Vec<u8>]) -> Result<(Vec<u8>, Stats)> {
    let chunks = chunks.to_vec();
    let mut open = move |i: usize| -> Result<Opened> {
        Ok(Opened::unchecked(io::Cursor::new(chunks[i].clone())))
    };
    stream(plan, &mut open, &|_, _| {}, |r| {
        let mut out = Vec::new();
        r.read_to_end(&mut out)?;
        Ok(out)
    })
}

fn big_tar() -> Vec<u8> {
    // Incompressible enough to make several chunks.
    let data: Vec<u8> = (0..300_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    tar_of(&[("a", b"hello"), ("b/c", &data)])
}

#[test]
fn verified_stream_decodes_to_the_tar() {
    let tar = big_tar();
    let (plan, chunks) = v1(&tar, 4);
    let (out, stats) = run(&plan, &chunks).unwrap();
    assert_eq!(out, tar);
    assert_eq!(stats.tar_bytes, tar.len() as u64);
    assert_eq!(stats.tar_sha256, hex::encode(&Sha256::digest(&tar)));
    let compressed: u64 = chunks.iter().map(|c| c.len() as u64).sum();
    assert_eq!(stats.compressed_bytes, compressed);
    // Every chunk is hashed twice (verify pass, decode pass), the tar once.
    assert_eq!(stats.bytes_hashed, 2 * compressed + tar.len() as u64);
    let totals = plan.progress_totals();
    assert_eq!(totals.compressed, compressed);
    assert_eq!(totals.tar, Some(tar.len() as u64));
}

/// Streams `plan` with each chunk opened `checked` or not, and returns
/// the bytes reported per phase.
fn reported(plan: &Plan, chunks: &[Vec<u8>], checked: bool) -> (u64, u64) {
    use std::sync::atomic::AtomicU64;
    let (verified, unpacked) = (AtomicU64::new(0), AtomicU64::new(0));
    let chunks = chunks.to_vec();
    let mut open = move |i: usize| -> Result<Opened> {
        Ok(Opened {
            reader: Box::new(io::Cursor::new(chunks[i].clone())),
            checked,
        })
    };
    let on = |phase: Phase, n: u64| {
        let counter = match phase {
            Phase::Verified => &verified,
            Phase::Unpacked => &unpacked,
        };
        counter.fetch_add(n, Ordering::Relaxed);
    };
    stream(plan, &mut open, &on, |r| {
        // Read in odd-sized bites, as an extractor does.
        let mut buf = [0u8; 7919];
        while r.read(&mut buf)? > 0 {}
        Ok(())
    })
    .unwrap();
    (verified.into_inner(), unpacked.into_inner())
}

/// Regression: the restore bar counted every chunk twice (its total was
/// twice the download, and so was its rate). Each phase now reports
/// each of its bytes once, adding up to the totals the bars are given,
/// for v1 chunks (checked on arrival or not) and legacy parts.
#[test]
fn progress_counts_each_compressed_and_each_tar_byte_once() {
    let tar = big_tar();
    for parts in [1, 4] {
        let (plan, chunks) = v1(&tar, parts);
        let totals = plan.progress_totals();
        let compressed: u64 = chunks.iter().map(|c| c.len() as u64).sum();
        assert_eq!(totals.compressed, compressed);
        assert_eq!(totals.tar, Some(tar.len() as u64));
        for checked in [false, true] {
            let got = reported(&plan, &chunks, checked);
            assert_eq!(got, (compressed, tar.len() as u64), "{parts} {checked}");
        }
    }
    let (plan, chunks) = legacy(&tar, 3);
    let totals = plan.progress_totals();
    let compressed: u64 = chunks.iter().map(|c| c.len() as u64).sum();
    assert_eq!(
        totals,
        Totals {
            compressed,
            tar: None
        }
    );
    assert_eq!(
        reported(&plan, &chunks, false),
        (compressed, tar.len() as u64)
    );
}

#[test]
fn a_flipped_byte_in_any_chunk_is_refused_before_the_decoder_sees_a_byte_of_it() {
    use std::sync::atomic::AtomicU64;
    let tar = big_tar();
    for bad in 0..4 {
        let (plan, mut chunks) = v1(&tar, 4);
        chunks[bad][10] ^= 1;
        let seen = AtomicU64::new(0);
        // How often each chunk was opened, in which order.
        let opens: Vec<AtomicUsize> = (0..4).map(|_| AtomicUsize::new(0)).collect();
        let order = std::sync::Mutex::new(Vec::new());
        let mut open = |i: usize| -> Result<Opened> {
            opens[i].fetch_add(1, Ordering::SeqCst);
            order.lock().unwrap().push(i);
            Ok(Opened::unchecked(io::Cursor::new(chunks[i].clone())))
        };
        let err = stream(&plan, &mut open, &|_, _| {}, |r| drain_counting(r, &seen)).unwrap_err();
        assert_eq!(code_of(&err), Code::Verify, "{err:#}");
        let msg = format!("{err:#}");
        assert!(msg.contains(&format!("k.tar.zst.part00{bad}")), "{msg}");
        assert!(msg.contains("republish"), "{msg}");
        // The damaged chunk was read once, to hash it, and never again
        // (the second read is the one that feeds the decoder); the
        // chunks after it were never opened.
        assert_eq!(opens[bad].load(Ordering::SeqCst), 1, "chunk {bad}");
        for (later, n) in opens.iter().enumerate().skip(bad + 1) {
            assert_eq!(n.load(Ordering::SeqCst), 0, "chunk {later}");
        }
        // Each chunk before it: hashed, then passed on, in order.
        let expected: Vec<usize> = (0..bad).flat_map(|i| [i, i]).chain([bad]).collect();
        assert_eq!(*order.lock().unwrap(), expected);
        if bad == 0 {
            assert_eq!(seen.load(Ordering::Relaxed), 0, "the consumer saw bytes");
        }
    }
}

#[test]
fn a_chunk_that_changes_between_the_two_reads_is_refused() {
    let tar = big_tar();
    let (plan, chunks) = v1(&tar, 3);
    let opened = std::sync::atomic::AtomicUsize::new(0);
    let mut open = move |i: usize| -> Result<Opened> {
        let mut c = chunks[i].clone();
        // The second time chunk 1 is opened, it reads differently.
        if i == 1 && opened.fetch_add(1, std::sync::atomic::Ordering::SeqCst) > 0 {
            c[0] ^= 1;
        }
        Ok(Opened::unchecked(io::Cursor::new(c)))
    };
    let err = stream(&plan, &mut open, &|_, _| {}, |r| {
        io::copy(r, &mut io::sink())?;
        Ok(())
    })
    .unwrap_err();
    assert_eq!(code_of(&err), Code::Verify, "{err:#}");
    assert!(format!("{err:#}").contains("part001"), "{err:#}");
}

#[test]
fn a_checked_chunk_is_read_once_and_still_rehashed() {
    let tar = big_tar();
    let (plan, chunks) = v1(&tar, 3);
    let opens: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
    let run_with = |damage: bool| {
        for o in &opens {
            o.store(0, Ordering::SeqCst);
        }
        let chunks = chunks.clone();
        let mut open = |i: usize| -> Result<Opened> {
            opens[i].fetch_add(1, Ordering::SeqCst);
            let mut c = chunks[i].clone();
            if damage && i == 1 {
                // Changed after it was checked.
                c[3] ^= 1;
            }
            Ok(Opened {
                reader: Box::new(io::Cursor::new(c)),
                checked: i != 0,
            })
        };
        stream(&plan, &mut open, &|_, _| {}, |r| {
            let mut v = Vec::new();
            r.read_to_end(&mut v)?;
            Ok(v)
        })
    };
    let (out, stats) = run_with(false).unwrap();
    assert_eq!(out, tar);
    let opened: Vec<usize> = opens.iter().map(|o| o.load(Ordering::SeqCst)).collect();
    assert_eq!(opened, vec![2, 1, 1]);
    // Checked chunks count as hashed twice: once as they arrived.
    assert!(stats.tar_hashed);
    assert_eq!(
        stats.bytes_hashed,
        2 * stats.compressed_bytes + stats.tar_bytes
    );
    let err = run_with(true).unwrap_err();
    assert_eq!(crate::exit::code_of(&err), Code::Verify, "{err:#}");
    assert!(format!("{err}").contains("has sha256"), "{err:#}");
}

#[test]
fn a_truncated_or_long_chunk_is_refused() {
    let tar = big_tar();
    let (plan, mut chunks) = v1(&tar, 3);
    chunks[1].pop();
    let err = run(&plan, &chunks).unwrap_err();
    assert_eq!(code_of(&err), Code::Verify);
    assert!(format!("{err:#}").contains("part001 of key k on branch b ends after"));
    let (plan, mut chunks) = v1(&tar, 3);
    chunks[0].push(0);
    let err = run(&plan, &chunks).unwrap_err();
    assert!(format!("{err:#}").contains("longer than"), "{err:#}");
}

#[test]
fn a_wrong_tar_digest_or_size_is_refused() {
    let tar = big_tar();
    let (mut plan, chunks) = v1(&tar, 2);
    plan.tar_sha256 = Some([7; 32]);
    let err = run(&plan, &chunks).unwrap_err();
    assert_eq!(code_of(&err), Code::Verify);
    assert!(
        format!("{err:#}").contains("the tar stream of key k"),
        "{err:#}"
    );
    let (mut plan, chunks) = v1(&tar, 2);
    plan.tar_size = Some(tar.len() as u64 + 512);
    plan.tar_cap = tar.len() as u64 + 512;
    assert!(format!("{:#}", run(&plan, &chunks).unwrap_err()).contains("but warmstart.json says"));
    // Without the tar hash the size is still checked.
    plan.hash_tar = false;
    assert!(format!("{:#}", run(&plan, &chunks).unwrap_err()).contains("but warmstart.json says"));
}

#[test]
fn without_the_tar_hash_the_declared_digest_is_reported() {
    let tar = big_tar();
    let (mut plan, chunks) = v1(&tar, 3);
    let (_, hashed) = run(&plan, &chunks).unwrap();
    assert!(hashed.tar_hashed);
    plan.hash_tar = false;
    let (out, trusted) = run(&plan, &chunks).unwrap();
    assert_eq!(out, tar);
    assert!(!trusted.tar_hashed);
    assert_eq!(trusted.tar_sha256, hashed.tar_sha256);
    assert_eq!(trusted.bytes_hashed + tar.len() as u64, hashed.bytes_hashed);
    // The chunks are still checked before the decoder sees them.
    let mut bad = chunks.clone();
    bad[1][0] ^= 1;
    assert_eq!(code_of(&run(&plan, &bad).unwrap_err()), Code::Verify);
}

#[test]
fn more_bytes_than_declared_are_refused_as_unsafe() {
    let tar = big_tar();
    let (mut plan, chunks) = v1(&tar, 2);
    plan.tar_cap = 4096;
    plan.tar_size = Some(4096);
    let err = run(&plan, &chunks).unwrap_err();
    assert_eq!(code_of(&err), Code::Unsafe, "{err:#}");
}

#[test]
fn oversized_chunks_are_refused_before_reading() {
    let tar = big_tar();
    let (mut plan, chunks) = v1(&tar, 2);
    plan.pieces[0].size = MAX_CHUNK_BYTES + 1;
    let err = run(&plan, &chunks).unwrap_err();
    assert_eq!(code_of(&err), Code::Verify);
}

fn legacy(tar: &[u8], parts: usize) -> (Plan, Vec<Vec<u8>>) {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    io::Write::write_all(&mut gz, tar).unwrap();
    let z = gz.finish().unwrap();
    let step = z.len().div_ceil(parts);
    let chunks: Vec<Vec<u8>> = z.chunks(step).map(<[u8]>::to_vec).collect();
    let pieces = chunks
        .iter()
        .enumerate()
        .map(|(i, c)| Piece {
            file: format!("cache.tar.gz.part{i:02}"),
            size: c.len() as u64,
            sha256: None,
        })
        .collect();
    let plan = Plan {
        label: "branch b".into(),
        fix: "re-seed it".into(),
        pieces,
        check: Check::Whole {
            archive: "cache.tar.gz".into(),
            sha256: Sha256::digest(&z).into(),
        },
        codec: Codec::Gzip,
        tar_sha256: None,
        tar_size: None,
        tar_cap: 1 << 30,
        hash_tar: true,
        frames: None,
    };
    (plan, chunks)
}

#[test]
fn legacy_archives_check_the_whole_digest_before_the_decoder_sees_a_byte() {
    let tar = big_tar();
    for parts in [1, 3] {
        let (plan, chunks) = legacy(&tar, parts);
        let (out, stats) = run(&plan, &chunks).unwrap();
        assert_eq!(out, tar);
        assert_eq!(stats.tar_sha256, hex::encode(&Sha256::digest(&tar)));
        let compressed: u64 = chunks.iter().map(|c| c.len() as u64).sum();
        assert_eq!(plan.progress_totals().compressed, compressed);
        // A flipped byte anywhere, even in the last part or the gzip
        // trailer: refused, and the consumer never saw a byte. Offsets
        // from a small deterministic PRNG, plus both ends of each part.
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut flips: Vec<(usize, usize)> = Vec::new();
        for (bad, c) in chunks.iter().enumerate() {
            let n = c.len();
            flips.extend([(bad, 0), (bad, n - 1), (bad, n / 2)]);
        }
        for _ in 0..40 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let bad = (rng % parts as u64) as usize;
            flips.push((bad, (rng >> 20) as usize % chunks[bad].len()));
        }
        for (bad, at) in flips {
            let (plan, mut chunks) = legacy(&tar, parts);
            chunks[bad][at] ^= 0xff;
            let seen = AtomicUsize::new(0);
            let chunks2 = chunks.clone();
            let mut open = move |i: usize| -> Result<Opened> {
                Ok(Opened::unchecked(io::Cursor::new(chunks2[i].clone())))
            };
            let err = stream(&plan, &mut open, &|_, _| {}, |r| {
                let mut buf = [0u8; 4096];
                loop {
                    let n = r.read(&mut buf)?;
                    if n == 0 {
                        return Ok(());
                    }
                    seen.fetch_add(n, Ordering::Relaxed);
                }
            })
            .unwrap_err();
            assert_eq!(code_of(&err), Code::Verify, "{err:#}");
            let msg = format!("{err:#}");
            assert!(msg.contains("cache.tar.gz"), "{msg}");
            assert!(msg.contains("SHA256SUMS"), "{msg}");
            assert_eq!(seen.load(Ordering::Relaxed), 0, "the consumer saw bytes");
        }
    }
}

#[test]
fn a_legacy_part_that_changes_between_the_two_reads_is_refused() {
    let tar = big_tar();
    let (plan, chunks) = legacy(&tar, 2);
    let opened = AtomicUsize::new(0);
    let mut open = move |i: usize| -> Result<Opened> {
        let mut c = chunks[i].clone();
        if i == 1 && opened.fetch_add(1, Ordering::SeqCst) > 0 {
            let n = c.len();
            c[n - 1] ^= 1;
        }
        Ok(Opened::unchecked(io::Cursor::new(c)))
    };
    let err = stream(&plan, &mut open, &|_, _| {}, |r| {
        io::copy(r, &mut io::sink())?;
        Ok(())
    })
    .unwrap_err();
    assert_eq!(code_of(&err), Code::Verify, "{err:#}");
    assert!(
        format!("{err:#}").contains("changed while being read"),
        "{err:#}"
    );
}

#[test]
fn a_consumer_failure_is_reported_as_is() {
    let tar = big_tar();
    let (plan, chunks) = v1(&tar, 4);
    let chunks = chunks.to_vec();
    let mut open = move |i: usize| -> Result<Opened> {
        Ok(Opened::unchecked(io::Cursor::new(chunks[i].clone())))
    };
    let err = stream(&plan, &mut open, &|_, _| {}, |_r| -> Result<()> {
        Err(fail(Code::Unsafe, "refusing tar entry `x`"))
    })
    .unwrap_err();
    assert_eq!(code_of(&err), Code::Unsafe);
    assert_eq!(format!("{err:#}"), "refusing tar entry `x`");
}

/// A framed v1 plan: `tar` cut into `parts` slices, each compressed as
/// its own zstd frame (as a publisher with `frames` writes them).
fn framed_v1(tar: &[u8], parts: usize) -> (Plan, Vec<Vec<u8>>) {
    let step = tar.len().div_ceil(parts);
    let raws: Vec<&[u8]> = tar.chunks(step).collect();
    let chunks: Vec<Vec<u8>> = raws
        .iter()
        .map(|r| zstd::encode_all(*r, 3).unwrap())
        .collect();
    let (mut plan, _) = v1(tar, parts);
    plan.pieces = chunks
        .iter()
        .enumerate()
        .map(|(i, c)| Piece {
            file: format!("k.tar.zst.part{i:03}"),
            size: c.len() as u64,
            sha256: Some(Sha256::digest(c).into()),
        })
        .collect();
    plan.frames = Some(raws.iter().map(|r| r.len() as u64).collect());
    (plan, chunks)
}

#[test]
fn framed_chunks_decode_in_parallel_to_the_tar_in_order() {
    let tar = big_tar();
    for parts in [1, 2, 7, 13] {
        let (mut plan, chunks) = framed_v1(&tar, parts);
        assert!(framed::workers(&plan).is_some());
        let (out, stats) = run(&plan, &chunks).unwrap();
        assert!(out == tar, "{parts} parts");
        let compressed: u64 = chunks.iter().map(|c| c.len() as u64).sum();
        assert_eq!(stats.compressed_bytes, compressed);
        assert_eq!(stats.tar_sha256, hex::encode(&Sha256::digest(&tar)));
        // Each chunk is read and hashed once (held in memory between
        // the check and the decoder), the tar once.
        assert_eq!(stats.bytes_hashed, compressed + tar.len() as u64);
        assert_eq!(
            reported(&plan, &chunks, false),
            (compressed, tar.len() as u64)
        );
        plan.hash_tar = false;
        let (out, stats) = run(&plan, &chunks).unwrap();
        assert!(out == tar && !stats.tar_hashed);
    }
}

#[test]
fn framed_flights_stay_within_the_memory_budget() {
    let tar = big_tar();
    let (mut plan, _) = framed_v1(&tar, 4);
    let f = framed::workers(&plan).unwrap();
    assert!(f.workers >= 1 && f.window >= 2);
    // Chunks of 16 MiB decoding to 16 MiB: a few in flight, within it.
    for p in &mut plan.pieces {
        p.size = 16 << 20;
    }
    plan.frames = Some(vec![16 << 20; 4]);
    let f = framed::workers(&plan).unwrap();
    assert!(f.window as u64 * (32 << 20) <= framed::BUDGET, "{f:?}");
    // Too big for the budget, a legacy archive, no frames: one stream.
    plan.frames = Some(vec![99 << 20; 4]);
    assert_eq!(framed::workers(&plan), None);
    let (legacy, _) = legacy(&tar, 2);
    assert_eq!(framed::workers(&legacy), None);
    let (plain, _) = v1(&tar, 2);
    assert_eq!(framed::workers(&plain), None);
}

/// Property: a flipped byte anywhere in any chunk of a framed plan is
/// refused (exit 6, naming the chunk), no chunk after it is opened, and
/// the consumer never sees a byte of the damaged chunk's slice of the
/// tar, whatever was decoded in parallel before it.
#[test]
fn framed_a_damaged_chunk_is_refused_before_any_decoder_sees_it() {
    use std::sync::atomic::AtomicU64;
    let tar = big_tar();
    let parts = 9;
    let (plan, good) = framed_v1(&tar, parts);
    let raws = plan.frames.clone().unwrap();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    for case in 0..60 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let bad = if case < parts {
            case
        } else {
            (rng % parts as u64) as usize
        };
        let at = (rng >> 24) as usize % good[bad].len();
        let mut chunks = good.clone();
        chunks[bad][at] ^= 1 << (rng % 8);
        let opens: Vec<AtomicUsize> = (0..parts).map(|_| AtomicUsize::new(0)).collect();
        let seen = AtomicU64::new(0);
        let mut open = |i: usize| -> Result<Opened> {
            opens[i].fetch_add(1, Ordering::SeqCst);
            Ok(Opened {
                reader: Box::new(io::Cursor::new(chunks[i].clone())),
                checked: case % 2 == 0,
            })
        };
        let err = stream(&plan, &mut open, &|_, _| {}, |r| drain_counting(r, &seen)).unwrap_err();
        assert_eq!(code_of(&err), Code::Verify, "case {case}: {err:#}");
        let msg = format!("{err:#}");
        assert!(
            msg.contains(&format!("part{bad:03}")) && msg.contains("has sha256"),
            "{msg}"
        );
        for (later, n) in opens.iter().enumerate().skip(bad + 1) {
            assert_eq!(
                n.load(Ordering::SeqCst),
                0,
                "case {case}: chunk {later} opened"
            );
        }
        let before: u64 = raws[..bad].iter().sum();
        assert!(seen.load(Ordering::Relaxed) <= before, "case {case}");
    }
}

#[test]
fn framed_a_frame_of_another_size_than_declared_is_refused() {
    let tar = big_tar();
    let (mut plan, chunks) = framed_v1(&tar, 4);
    let raws = plan.frames.as_mut().unwrap();
    raws[1] -= 1;
    raws[2] += 1;
    let err = run(&plan, &chunks).unwrap_err();
    assert_eq!(code_of(&err), Code::Verify, "{err:#}");
    // Both frames are wrong and decode on different cores: whichever
    // finishes first is named.
    let err = format!("{err:#}");
    assert!(err.contains("part001") || err.contains("part002"), "{err}");
    assert!(
        err.contains("decodes to") || err.contains("does not decode as one zstd frame"),
        "{err}"
    );
    // A truncated chunk whose digest matches what the branch says
    // (a publisher that cut a frame short) does not decode.
    let (mut plan, mut chunks) = framed_v1(&tar, 4);
    let cut = chunks[3].len() - 4;
    chunks[3].truncate(cut);
    plan.pieces[3].size = chunks[3].len() as u64;
    plan.pieces[3].sha256 = Some(Sha256::digest(&chunks[3]).into());
    let err = run(&plan, &chunks).unwrap_err();
    assert_eq!(code_of(&err), Code::Verify, "{err:#}");
    assert!(format!("{err:#}").contains("part003"), "{err:#}");
    // More tar than the cap: exit 7, as the one-stream path says.
    let (mut plan, chunks) = framed_v1(&tar, 4);
    plan.tar_cap = 4096;
    plan.tar_size = Some(4096);
    assert_eq!(code_of(&run(&plan, &chunks).unwrap_err()), Code::Unsafe);
}

#[test]
fn digests_parse() {
    let d = parse_digest(&"ab".repeat(32)).unwrap();
    assert_eq!(d, [0xab; 32]);
    assert!(parse_digest("zz").is_err());
    assert!(parse_digest(&"g".repeat(64)).is_err());
}
