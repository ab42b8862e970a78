//! The warm check: whether the stamp makes this restore a no-op, and the
//! manifest's ready-probe. It takes no lock, fetches nothing and hashes
//! nothing.

use super::*;

/// The stamp, if it makes the current restore warm; else why not. With
/// `set_aside`, a corrupt stamp is moved aside (with a warning) and counts
/// as missing, so the restore that follows writes a good one; without, it
/// is only reported (`Miss::Corrupt`) and nothing is written.
pub(super) fn warm_check(
    m: &CacheManifest,
    key: &Key,
    file: &Path,
    set_aside: bool,
) -> Result<Result<Stamp, Miss>> {
    let s = match stamp::load(file) {
        Loaded::Missing => return Ok(Err(Miss::NoStamp)),
        Loaded::Corrupt(e) if !set_aside => return Ok(Err(Miss::Corrupt(format!("{e:#}")))),
        Loaded::Corrupt(e) => {
            let aside = stamp::set_aside(file, clock::now_ms())?;
            eprintln!(
                "warning: {e:#}; moved it to {} and restoring from scratch",
                aside.display()
            );
            return Ok(Err(Miss::NoStamp));
        }
        Loaded::Found(s) => *s,
    };
    if let Some(p) = &s.partial
        && p.wanted == key.value
    {
        // A stand-in for today's key: warm until the recheck is due (a
        // clock read, no network), then the cold path looks again.
        if let Err(miss) = s.matches(&s.key, &s.key_parts, &m.restore_path, m.mode) {
            return Ok(Err(miss));
        }
        let recheck = m.recheck.unwrap_or_default().as_millis() as u64;
        if clock::now_ms().saturating_sub(p.checked_at_ms) >= recheck {
            return Ok(Err(Miss::Recheck {
                installed: s.key.clone(),
                wanted: p.wanted.clone(),
            }));
        }
        return Ok(ready(m).map(|()| s).map_err(Miss::NotReady));
    }
    if let Err(miss) = s.matches(&key.value, &key.parts, &m.restore_path, m.mode) {
        return Ok(Err(miss));
    }
    if let Some(b) = &s.built {
        // Built here, not published: warm until the recheck is due (a
        // clock read, no network), then the cold path looks for the key.
        let recheck = m.build.as_ref().map_or(Duration::ZERO, |b| b.recheck);
        if clock::now_ms().saturating_sub(b.checked_at_ms) >= recheck.as_millis() as u64 {
            return Ok(Err(Miss::BuiltRecheck { key: s.key.clone() }));
        }
    }
    Ok(ready(m).map(|()| s).map_err(Miss::NotReady))
}

/// The manifest's cheap ready-probe. `Err` says what is missing.
pub fn ready(m: &CacheManifest) -> Result<(), String> {
    let target = &m.restore_path;
    match &m.ready {
        Ready::Exists => {
            if target.is_dir() {
                Ok(())
            } else {
                Err(format!("{} is not a directory", target.display()))
            }
        }
        Ready::Path(p) => {
            let path = target.join(p);
            match std::fs::symlink_metadata(&path) {
                Ok(_) => Ok(()),
                Err(_) => Err(format!("{} does not exist", path.display())),
            }
        }
        Ready::Command { argv, matches } => {
            let dir = if target.is_dir() {
                target.clone()
            } else {
                std::env::temp_dir()
            };
            let out = std::process::Command::new(&argv[0])
                .args(&argv[1..])
                .current_dir(dir)
                .stdin(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .output()
                .map_err(|e| format!("running {}: {e}", argv[0]))?;
            if !out.status.success() {
                return Err(format!("`{}` failed ({})", argv.join(" "), out.status));
            }
            if let Some(re) = matches
                && !re.is_match(&String::from_utf8_lossy(&out.stdout))
            {
                return Err(format!(
                    "the output of `{}` does not match /{}/",
                    argv.join(" "),
                    re.as_str()
                ));
            }
            Ok(())
        }
    }
}
