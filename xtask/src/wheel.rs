//! The pip requirement line that pins a built `warmstart` wheel by version and sha256.
//!
//! The generated bootstrap script's registry step runs
//! `pip install --require-hashes -r FILE`, and FILE holds this line: pip then
//! installs that exact wheel or nothing. `tools/wheel-requirement.sh` prints
//! the same line in shell (tests/it/wheel.rs checks that both agree).

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::Path;

/// The distribution name of the wheel (tools/wheel/pyproject.toml).
pub const DIST: &str = "warmstart";

/// A wheel's pin in its two parts, as a manifest keeps them: the
/// requirement (`warmstart==0.1.0`) and the hash (`sha256:HEX`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    pub requirement: String,
    pub hash: String,
}

/// `warmstart==VERSION --hash=sha256:HEX` for the wheel at `path`, with the
/// version read from its PEP 427 file name.
pub fn requirement_line(path: &Path) -> Result<String> {
    let p = pin(path)?;
    Ok(format!("{} --hash={}", p.requirement, p.hash))
}

/// The pin of the wheel at `path`.
pub fn pin(path: &Path) -> Result<Pin> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("wheel {}: no file name", path.display()))?;
    let version = version_of(name)?;
    let mut file = std::fs::File::open(path).with_context(|| {
        format!(
            "opening wheel {}: give the path of a built .whl",
            path.display()
        )
    })?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = file
            .read(&mut buf)
            .with_context(|| format!("reading wheel {}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let digest = crate::hex::encode(&hasher.finalize());
    Ok(Pin {
        requirement: format!("{DIST}=={version}"),
        hash: format!("sha256:{digest}"),
    })
}

/// The version field of `warmstart-VERSION-PY-ABI-PLATFORM.whl`.
fn version_of(name: &str) -> Result<&str> {
    let Some(stem) = name.strip_suffix(".whl") else {
        bail!("{name} is not a wheel: its name must end in .whl");
    };
    let fields: Vec<&str> = stem.split('-').collect();
    // name-version[-build]-python-abi-platform: five or six fields.
    let ok_shape = matches!(fields.len(), 5 | 6) && fields[0] == DIST;
    let version = fields.get(1).copied().unwrap_or("");
    let ok_version = !version.is_empty()
        && version
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".+!".contains(c));
    if !ok_shape || !ok_version || fields.iter().any(|f| f.is_empty()) {
        bail!("{name} is not named {DIST}-VERSION-PY-ABI-PLATFORM.whl: rename it as built");
    }
    Ok(version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_comes_from_the_file_name() {
        let n = "warmstart-0.1.0-py3-none-manylinux_2_17_x86_64.whl";
        assert_eq!(version_of(n).unwrap(), "0.1.0");
        let n = "warmstart-1.2.3rc1-7-py3-none-manylinux_2_17_x86_64.whl";
        assert_eq!(version_of(n).unwrap(), "1.2.3rc1");
    }

    #[test]
    fn other_names_are_refused() {
        for n in [
            "warmstart-0.1.0.tar.gz",
            "ruff-0.1.0-py3-none-any.whl",
            "warmstart-0.1.0-py3-none.whl",
            "warmstart--py3-none-any.whl",
            "warmstart-0.1 0-py3-none-any.whl",
            "warmstart-0.1.0-py3-none-any-x-y.whl",
            "warmstart-0.1.0-py3--any.whl",
            ".whl",
        ] {
            let e = version_of(n).unwrap_err().to_string();
            assert!(e.contains(n), "{n}: {e}");
        }
    }

    #[test]
    fn line_pins_version_and_digest() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir
            .path()
            .join("warmstart-0.1.0-py3-none-manylinux_2_17_x86_64.whl");
        std::fs::write(&p, b"abc").unwrap();
        // sha256("abc"), the FIPS 180-2 example.
        assert_eq!(
            requirement_line(&p).unwrap(),
            "warmstart==0.1.0 --hash=sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let missing = dir.path().join("warmstart-0.2.0-py3-none-any.whl");
        let e = format!("{:#}", requirement_line(&missing).unwrap_err());
        assert!(e.contains("opening wheel") && e.contains("0.2.0"), "{e}");
    }
}
