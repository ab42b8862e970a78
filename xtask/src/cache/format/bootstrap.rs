//! The `[bootstrap]` table of a binary-cache manifest, and the limits it puts
//! on that manifest so that the generated shell script reads it exactly as
//! warmstart does.
//!
//! `tools/warmstart-bootstrap.sh` (written by `init`, template in
//! `crate::init`) parses the manifest in awk and computes the key in shell,
//! before any warmstart binary exists on the machine. So this manifest may use
//! only what shell computes the same way (pins `literal`, `platform`,
//! `git_tree`, `file`) and only the TOML the script's reader understands (one
//! value per line; strings without `"` or `\`; no `~` or `$VAR` in paths).
//! Every command that loads the manifest refuses anything else (exit 10), so
//! `init` and `cache publish` never accept a manifest the script would misread.

use anyhow::{Result, bail};
use serde::Deserialize;
use std::path::{Component, Path};

/// `[bootstrap]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBootstrap {
    exec: String,
    #[serde(default)]
    build: Vec<String>,
    built: Option<String>,
    pip: Option<String>,
    #[serde(default)]
    pip_hashes: Vec<String>,
}

/// `[bootstrap]`, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bootstrap {
    /// The executable, relative to the restore path.
    pub exec: String,
    /// The compile fallback's command, run at the repository root.
    pub build: Vec<String>,
    /// Where `build` leaves the executable, relative to the repository root.
    pub built: Option<String>,
    /// The registry fallback: an exact requirement (`warmstart==0.1.0`).
    pub pip: Option<String>,
    /// Its hashes for `pip --require-hashes` (`sha256:<64 hex>`).
    pub pip_hashes: Vec<String>,
}

/// The pin kinds the script computes (`[[key]]` fields besides `name`).
pub const SHELL_PINS: [&str; 4] = ["literal", "platform", "git_tree", "file"];

/// Validates `[bootstrap]` together with the whole manifest `text`, its pin
/// kinds (`kinds[i]` is the value field of pin i) and its restore path.
pub fn resolve(
    raw: RawBootstrap,
    text: &str,
    kinds: &[&str],
    restore_path: &str,
) -> Result<Bootstrap> {
    for kind in kinds {
        if !SHELL_PINS.contains(kind) {
            bail!(
                "a [bootstrap] manifest's key is computed in shell: pin kind `{kind}` is not one of {}; use a `file` pin (a one-line file) instead",
                SHELL_PINS.join(", ")
            );
        }
    }
    check_subset(text)?;
    plain_relative("restore.path", target_relative(restore_path))?;
    plain_relative("bootstrap.exec", &raw.exec)?;
    if let Some(b) = &raw.built {
        plain_relative("bootstrap.built", target_relative(b))?;
    }
    if raw.build.is_empty() != raw.built.is_none() {
        bail!(
            "bootstrap.build and bootstrap.built go together (the command, and where it leaves the executable)"
        );
    }
    match (&raw.pip, raw.pip_hashes.is_empty()) {
        (Some(req), false) => {
            let ok = req
                .split_once("==")
                .is_some_and(|(n, v)| !n.is_empty() && !v.is_empty() && !v.contains(['*', ',']));
            if !ok {
                bail!("bootstrap.pip {req:?} must pin one exact version, as `warmstart==0.1.0`");
            }
        }
        (None, true) => {}
        _ => bail!("bootstrap.pip and bootstrap.pip_hashes go together (pip --require-hashes)"),
    }
    for h in &raw.pip_hashes {
        let hex = h.strip_prefix("sha256:").unwrap_or("");
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            bail!("bootstrap.pip_hashes entry {h:?} is not `sha256:` and 64 hex digits");
        }
    }
    Ok(Bootstrap {
        exec: raw.exec,
        build: raw.build,
        built: raw.built,
        pip: raw.pip,
        pip_hashes: raw.pip_hashes,
    })
}

/// The one variable a [bootstrap] manifest's paths may start with, and
/// only as this prefix: the script expands it as `expand_path` does (the
/// variable's value, else `target`). Cargo's own `build.target-dir` setting
/// is not followed by either (README "Adopting warmstart").
pub const TARGET_PREFIX: &str = "$CARGO_TARGET_DIR/";

/// `p` without a leading `$CARGO_TARGET_DIR/`: the rest must be plain.
fn target_relative(p: &str) -> &str {
    p.strip_prefix(TARGET_PREFIX).unwrap_or(p)
}

/// A path the script joins to the repository root as is.
fn plain_relative(field: &str, p: &str) -> Result<()> {
    let path = Path::new(p);
    let plain = !p.is_empty()
        && !p.contains(['~', '$'])
        && path
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    if !plain {
        bail!(
            "{field} {p:?}: a [bootstrap] manifest's paths are relative, without `..`, `~` or `$VAR` (the script uses them as written), except a leading `$CARGO_TARGET_DIR/` in restore.path and bootstrap.built"
        );
    }
    Ok(())
}

/// Every line is one the script's awk reader reads the way TOML does: blank
/// or comment, `[table]`, `[[key]]`, or `field = ` a string without `"` or
/// `\`, `true`/`false`, an integer, or a one-line array of such strings;
/// each optionally followed by a comment. Printable ASCII only, so that the
/// script's byte-wise `tr` and the binary's char-wise sanitising agree.
pub fn check_subset(text: &str) -> Result<()> {
    let s = r#""[ -!#-\[\]-~]*""#;
    let tail = r"[ \t]*(#.*)?$";
    let line_re = regex_lite::Regex::new(&format!(
        r"^(?:[ \t]*(#.*)?$|\[\[key\]\]{tail}|\[[A-Za-z_]+\]{tail}|[A-Za-z_]+[ \t]*=[ \t]*(?:{s}|true|false|-?[0-9]+|\[[ \t]*(?:{s}[ \t]*,[ \t]*)*(?:{s}[ \t]*)?\]){tail})"
    ))
    .expect("a valid pattern");
    for (i, line) in text.lines().enumerate() {
        let ascii = line
            .bytes()
            .all(|b| b == b'\t' || (b' '..=b'~').contains(&b));
        if !ascii || !line_re.is_match(line) {
            bail!(
                "line {}: {line:?} is outside the TOML subset tools/warmstart-bootstrap.sh reads (one-line values; strings without `\"` or `\\`; printable ASCII)",
                i + 1
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_subset_takes_what_the_script_reads() {
        let ok = "# c\n[cache]\nbranch = \"b\" # c\n\n[[key]]\nname = \"p\"\nplatform = true\n[pack]\ninclude = [\"a\", \"b\",]\nlevel = 3\nnone = []\n";
        check_subset(ok).unwrap();
        for bad in [
            "a = 'literal'",
            "a = \"esc\\\"aped\"",
            "a = \"\"\"multi\"\"\"",
            "a = [\n\"x\"]",
            "a.b = \"dotted\"",
            "a = { inline = 1 }",
            "  a = \"indented\"",
            "a = \"caf\u{e9}\"",
            "a = 1.5",
            "[a.b]",
        ] {
            assert!(check_subset(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn pins_and_paths_the_script_cannot_compute_are_refused() {
        let raw = || RawBootstrap {
            exec: "warmstart".into(),
            build: vec![],
            built: None,
            pip: None,
            pip_hashes: vec![],
        };
        assert!(resolve(raw(), "", &["literal", "git_tree"], "target/bin").is_ok());
        let e = resolve(raw(), "", &["json"], "target/bin").unwrap_err();
        assert!(e.to_string().contains("pin kind `json`"), "{e}");
        for path in [
            "~/bin",
            "$HOME/bin",
            "../out",
            "/abs",
            "",
            "$CARGO_TARGET_DIR",
            "$CARGO_TARGET_DIR/../x",
            "${CARGO_TARGET_DIR}/x",
            "x/$CARGO_TARGET_DIR/y",
            "$CARGO_TARGET_DIR/$HOME",
        ] {
            assert!(resolve(raw(), "", &[], path).is_err(), "{path:?}");
        }
        assert!(resolve(raw(), "", &[], "$CARGO_TARGET_DIR/warmstart-bin").is_ok());
        let mut r = raw();
        r.pip = Some("warmstart>=0.1".into());
        r.pip_hashes = vec![format!("sha256:{}", "a".repeat(64))];
        assert!(resolve(r, "", &[], "t").is_err());
        let mut r = raw();
        r.pip = Some("warmstart==0.1.0".into());
        assert!(resolve(r, "", &[], "t").is_err(), "a pin without hashes");
    }
}
