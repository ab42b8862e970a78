//! What git's error text means: the one line of cause a message quotes
//! (boilerplate, progress and hints dropped), refused credentials (exit 13)
//! against everything else a remote says (exit 8), and a host's refusal by
//! branch protection. Pure: text in, text or an error out.

use crate::exit::{Code, fail};

/// git's and OpenSSH's lines that carry no cause of their own.
const BOILERPLATE: [&str; 4] = [
    "Please make sure you have the correct access rights",
    "and the repository exists.",
    "Could not read from remote repository.",
    "the remote end hung up unexpectedly",
];

/// Authentication refused, by what git 2.47 (http.c, remote-curl.c),
/// libcurl (OpenSSL and GnuTLS builds), OpenSSH and the big hosts print.
/// Each pattern with the fix that goes with it.
const AUTH: [(&str, &str); 22] = [
    ("Authentication failed for", FIX_CREDENTIALS),
    ("could not read Username for", FIX_CREDENTIALS),
    ("could not read Password for", FIX_CREDENTIALS),
    ("The requested URL returned error: 401", FIX_CREDENTIALS),
    ("The requested URL returned error: 403", FIX_CREDENTIALS),
    ("HTTP Basic: Access denied", FIX_CREDENTIALS),
    ("Invalid username or password", FIX_CREDENTIALS),
    (
        "Support for password authentication was removed",
        FIX_CREDENTIALS,
    ),
    ("The requested URL returned error: 407", FIX_PROXY),
    ("CONNECT tunnel failed, response 407", FIX_PROXY),
    ("Received HTTP code 407 from proxy", FIX_PROXY),
    ("Proxy CONNECT aborted", FIX_PROXY),
    ("SSL certificate problem", FIX_CERT),
    ("server certificate verification failed", FIX_CERT),
    (
        "SSL peer certificate or SSH remote key was not OK",
        FIX_CERT,
    ),
    ("certificate verify failed", FIX_CERT),
    ("does not match target host name", FIX_CERT),
    ("no alternative certificate subject name matches", FIX_CERT),
    ("Permission denied (", FIX_SSH_KEY),
    ("Permission denied, please try again", FIX_SSH_KEY),
    ("Too many authentication failures", FIX_SSH_KEY),
    ("Host key verification failed", FIX_HOST_KEY),
];

const FIX_CREDENTIALS: &str = "check the credentials git uses for this remote (credential helper, token in http.extraheader or the URL)";
const FIX_PROXY: &str =
    "check the proxy's credentials (http.proxy, or the user:password in https_proxy)";
const FIX_CERT: &str = "the server's certificate does not verify: give git its CA (http.sslCAInfo or GIT_SSL_CAINFO) or fix the certificate";
const FIX_SSH_KEY: &str =
    "check the ssh key this remote accepts (ssh-agent, ~/.ssh/config, core.sshCommand)";
const FIX_HOST_KEY: &str =
    "the server's host key is not known or changed: check it and add it to ~/.ssh/known_hosts";

/// Whether a line is git's frame around a push or fetch, which says
/// where and how much, never why: `To <url>`, `From <url>`, porcelain's
/// `Done`, the pack's `Total ...` line, `failed to push some refs`, and a
/// server's empty `remote:` lines.
fn is_frame(l: &str) -> bool {
    l.starts_with("To ")
        || l.starts_with("From ")
        || l == "Done"
        || l == "remote:"
        || (l.starts_with("Total ") && l.contains("reused"))
        || l.starts_with("error: failed to push some refs")
}

/// How many of git's lines a cause keeps: a hook's or a server's message
/// is often a few lines, and all of them say why.
const CAUSE_LINES: usize = 6;

/// The lines of a git error that say something: progress, hints, git's
/// frame and boilerplate dropped (the hung-up line only when something
/// else is left), runs of blanks and tabs as one space.
pub fn cause_lines(stderr: &str) -> Vec<String> {
    let lines: Vec<String> = stderr
        .split(['\r', '\n'])
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| {
            !l.is_empty() && !l.starts_with("hint:") && !crate::net::is_progress(l) && !is_frame(l)
        })
        .filter(|l| !BOILERPLATE[..3].iter().any(|b| l.contains(b)))
        .collect();
    let hung_up = |l: &String| l.contains(BOILERPLATE[3]);
    if lines.iter().all(hung_up) {
        lines
    } else {
        lines.into_iter().filter(|l| !hung_up(l)).collect()
    }
}

/// The cause git gave, on one line: its last meaningful lines
/// (`CAUSE_LINES` at most), or the authentication line when there is one.
pub fn cause(stderr: &str) -> String {
    if let Some((line, _)) = auth_refused(stderr) {
        return line;
    }
    let lines = cause_lines(stderr);
    let s = lines[lines.len().saturating_sub(CAUSE_LINES)..].join("; ");
    if s.is_empty() {
        "no message from git".to_string()
    } else {
        s
    }
}

/// When git's error says the remote refused who we are: the line that
/// says so, and the fix.
pub fn auth_refused(stderr: &str) -> Option<(String, &'static str)> {
    cause_lines(stderr).into_iter().find_map(|l| {
        AUTH.iter()
            .find(|(pat, _)| l.contains(pat))
            .map(|(_, fix)| (plain(&l), *fix))
    })
}

/// What git says when the disk it writes to on this machine is full
/// (`write error: No space left on device`, index-pack's `Out of
/// diskspace`, a quota). Never from the server's `remote:` lines: the
/// server's full disk is the server's, and reported as the remote's failure.
const DISK_FULL: [&str; 3] = [
    "No space left on device",
    "Out of diskspace",
    "Disk quota exceeded",
];

/// git's line saying the local disk is full, if it says so (see `DISK_FULL`).
pub fn disk_full_line(stderr: &str) -> Option<String> {
    cause_lines(stderr)
        .into_iter()
        .filter(|l| !l.starts_with("remote:"))
        .find(|l| DISK_FULL.iter().any(|w| l.contains(w)))
}

/// Whether `err` is, anywhere in its chain, an I/O error of a full disk
/// or quota (ENOSPC, EDQUOT): what a write of ours (a chunk file) says.
pub fn is_disk_full(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::raw_os_error)
            .is_some_and(|n| n == libc::ENOSPC || n == libc::EDQUOT)
    })
}

/// The error for a full disk under the private store `dir` (exit 1, never
/// 8: the remote is fine, and retrying will not help until space is made).
/// Always says `No space left on device` and the path, whatever git's
/// words were.
pub fn disk_full_error(prefix: &str, dir: &std::path::Path, line: &str) -> anyhow::Error {
    fail(
        Code::Failed,
        format!(
            "{prefix}: No space left on device under {}: the disk is full, not the remote at fault; make space there (`{cmd} cache gc` removes what nothing needs) and run it again ({})",
            dir.display(),
            crate::redact::text(line),
            cmd = crate::invocation::command(),
        ),
    )
}

/// The error for a git command that talked to a remote and failed: exit 13
/// with git's cause and the fix when the remote refused the credentials,
/// key or certificate; else exit 8 with `prefix: <git's cause>`.
pub fn remote_failure(prefix: &str, stderr: &str) -> anyhow::Error {
    match auth_refused(stderr) {
        Some((line, fix)) => fail(
            Code::AuthRefused,
            format!("{prefix}: authentication refused: {line}: {fix}"),
        ),
        None => fail(Code::Remote, format!("{prefix}: {}", cause(stderr))),
    }
}

/// Branch protection and hosting rules that refuse a force push or a
/// deletion: GitHub (classic protection and rulesets), GitLab, and plain
/// git's `receive.denyNonFastForwards` / `receive.denyDeletes`.
const PROTECTED: [&str; 8] = [
    "GH006: Protected branch update failed",
    "GH013: Repository rule violations",
    "protected branch hook declined",
    "not allowed to force push",
    "Cannot force-push",
    "denying non-fast-forward",
    "denying ref deletion",
    "Cannot update this protected ref",
];

/// The line of a refused push that names a branch protection rule.
pub fn protected_refusal(said: &str) -> Option<String> {
    said.split(['\r', '\n'])
        .map(str::trim)
        .find(|l| PROTECTED.iter().any(|p| l.contains(p)))
        .map(|l| plain(l.trim_start_matches("remote:").trim()))
}

/// A git line without its `fatal: ` or `error: ` label.
fn plain(line: &str) -> String {
    line.trim_start_matches("fatal: ")
        .trim_start_matches("error: ")
        .to_string()
}

#[cfg(test)]
mod tests;
