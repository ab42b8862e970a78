//! Lowercase hexadecimal, the one spelling of every digest warmstart writes
//! (chunk and tar sha256s, key digests, gate command digests). Pure: no I/O.

/// Lowercase hex of bytes.
pub fn encode(bytes: &[u8]) -> String {
    const H: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(H[(b >> 4) as usize] as char);
        s.push(H[(b & 15) as usize] as char);
    }
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn bytes_become_lowercase_pairs() {
        assert_eq!(super::encode(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
        assert_eq!(super::encode(&[]), "");
    }
}
