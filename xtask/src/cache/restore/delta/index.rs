//! The new key's file index, trusted only once its size and sha256 match
//! `warmstart.json` and it agrees with the key. It never reads the tar.

use super::*;

/// A key's index, checked against its entry.
#[derive(Clone, Debug)]
pub struct NewIndex {
    /// The file as on the branch (zstd of the text), kept for the record.
    pub bytes: Vec<u8>,
    pub index: Index,
}

/// The most index text accepted per entry: a long path escaped (`%XX`)
/// twice over (a hardlink's target) and the numbers.
pub(super) const INDEX_BYTES_PER_ENTRY: u64 = 2 * 3 * 4096 + 256;

/// Decompresses and parses an index of a key with `files` entries.
pub(super) fn decode_index(bytes: &[u8], files: u64) -> Result<Index, String> {
    let cap = files
        .saturating_add(1)
        .saturating_mul(INDEX_BYTES_PER_ENTRY);
    let mut text = Vec::new();
    zstd::stream::read::Decoder::new(bytes)
        .and_then(|d| d.take(cap + 1).read_to_end(&mut text))
        .map_err(|e| format!("it does not decompress ({e})"))?;
    if text.len() as u64 > cap {
        return Err(format!("it decompresses to more than {cap} bytes"));
    }
    let text = String::from_utf8(text).map_err(|_| "it is not UTF-8 text".to_string())?;
    Index::parse(&text).map_err(|e| format!("{e:#}"))
}

/// Checks a fetched index against its key: its size and sha256 as
/// `warmstart.json` gives them, then that it agrees with the key.
pub fn check_index(bytes: Vec<u8>, entry: &KeyEntry) -> Result<NewIndex, String> {
    let Some(i) = &entry.index else {
        return Err("the key has no file index".into());
    };
    if bytes.len() as u64 != i.size {
        return Err(format!(
            "{} is {} bytes but warmstart.json says {}",
            i.file,
            bytes.len(),
            i.size
        ));
    }
    let got = hex::encode(&Sha256::digest(&bytes));
    if !got.eq_ignore_ascii_case(&i.sha256) {
        return Err(format!(
            "{} has sha256 {got} but warmstart.json says {}",
            i.file, i.sha256
        ));
    }
    let index = decode_index(&bytes, entry.files).map_err(|e| format!("{}: {e}", i.file))?;
    agree(&index, entry).map_err(|e| format!("{}: {e}", i.file))?;
    Ok(NewIndex { bytes, index })
}

/// The index covers the key's tar: one line per entry, from offset 0 to
/// the end-of-archive blocks.
pub(super) fn agree(index: &Index, entry: &KeyEntry) -> Result<(), String> {
    if index.entries.len() as u64 != entry.files {
        return Err(format!(
            "it lists {} entries but the key has {}",
            index.entries.len(),
            entry.files
        ));
    }
    let (Some(first), Some(last)) = (index.entries.first(), index.entries.last()) else {
        return Ok(());
    };
    if first.offset != 0 || last.end.saturating_add(1024) > entry.tar_size {
        return Err(format!(
            "its entries span {}..{} but the tar is {} bytes",
            first.offset, last.end, entry.tar_size
        ));
    }
    Ok(())
}
