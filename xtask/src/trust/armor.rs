//! Just enough of the SSH formats to know who a signature claims to be by,
//! without running a process: the public key inside an armored SSHSIG, the
//! keys of an `allowed_signers` file, and `SHA256:` fingerprints.
//!
//! Pure, and never a judge of validity: `sshsig` still has `ssh-keygen`
//! verify every signature it accepts. This only picks which principal to
//! verify as (saving `find-principals`), and names the signer of a key the
//! file does not list (saving `check-novalidate`). Anything it does not
//! understand (a certificate authority line, an odd option) makes the
//! caller fall back to asking ssh-keygen.

use sha2::{Digest, Sha256};

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with optional padding; `None` on anything else.
pub fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let text = text.trim_end_matches('=');
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for c in text.bytes() {
        let v = ALPHABET.iter().position(|&a| a == c)? as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// Base64 without padding, as OpenSSH prints fingerprints.
pub fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.len();
        let v = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for i in 0..=n {
            out.push(ALPHABET[(v >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

/// `SHA256:<base64>` of a public key blob (what `ssh-keygen -l` prints).
pub fn fingerprint(key: &[u8]) -> String {
    format!("SHA256:{}", base64_encode(&Sha256::digest(key)))
}

/// The public key blob inside an armored SSH signature.
pub fn sig_public_key(armored: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(armored).ok()?;
    let body: String = text
        .lines()
        .skip_while(|l| l.trim() != "-----BEGIN SSH SIGNATURE-----")
        .skip(1)
        .take_while(|l| l.trim() != "-----END SSH SIGNATURE-----")
        .map(str::trim)
        .collect();
    let blob = base64_decode(&body)?;
    let rest = blob.strip_prefix(b"SSHSIG")?;
    let (version, rest) = rest.split_at_checked(4)?;
    if version != [0, 0, 0, 1] {
        return None;
    }
    let (key, _) = ssh_string(rest)?;
    Some(key.to_vec())
}

/// One length-prefixed string of the SSH wire format, and what follows.
fn ssh_string(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let (len, rest) = b.split_at_checked(4)?;
    let len = u32::from_be_bytes(len.try_into().ok()?) as usize;
    rest.split_at_checked(len)
}

/// The `(principals, key blob)` of each line of an allowed_signers file;
/// `None` when a line is beyond this reader (options with quotes or
/// spaces, certificate authorities): then ssh-keygen must be asked.
pub fn allowed_keys(file: &[u8]) -> Option<Vec<(Vec<String>, Vec<u8>)>> {
    let text = std::str::from_utf8(file).ok()?;
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let at = fields.iter().position(|f| is_key_type(f))?;
        // Principals, then at most one options field, which must be simple.
        let options = &fields[1..at];
        if at == 0
            || options.len() > 1
            || options
                .iter()
                .any(|o| o.contains('"') || o.contains("cert-authority"))
        {
            return None;
        }
        let key = base64_decode(fields.get(at + 1)?)?;
        let principals = fields[0].split(',').map(String::from).collect();
        out.push((principals, key));
    }
    Some(out)
}

fn is_key_type(f: &str) -> bool {
    f.starts_with("ssh-") || f.starts_with("ecdsa-sha2-") || f.starts_with("sk-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_every_length() {
        let mut rng = 0x1234_5678_9abc_def1u64;
        for len in 0..70 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng as u8
                })
                .collect();
            let text = base64_encode(&bytes);
            assert_eq!(base64_decode(&text).unwrap(), bytes, "length {len}");
        }
        assert_eq!(base64_encode(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64_decode("Zm9vYg==").unwrap(), b"foob");
        assert_eq!(base64_decode("Zm9v!"), None);
    }

    #[test]
    fn allowed_signers_lines_are_read_or_refused() {
        let k = "AAAAC3NzaC1lZDI1NTE5AAAAIJ";
        let file = format!(
            "# ci\nci,release ssh-ed25519 {k}A comment\nbob namespaces=x ssh-ed25519 {k}B\n"
        );
        let got = allowed_keys(file.as_bytes()).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0, ["ci", "release"]);
        for beyond in [
            format!("ca cert-authority ssh-ed25519 {k}A\n"),
            format!("x namespaces=\"a b\" ssh-ed25519 {k}A\n"),
            "no key here\n".to_string(),
        ] {
            assert!(allowed_keys(beyond.as_bytes()).is_none(), "{beyond}");
        }
    }
}
