//! An ssh remote reached the way `git fetch` reaches it, for the direct
//! chunk reader (`cache::fetch::direct`): the same URL forms, the same ssh program
//! and the same arguments as git's `connect.c` (`parse_connect_url`,
//! `fill_ssh_args`, `push_ssh_options`, `determine_ssh_variant`), so that a
//! restore logs in with whatever key, config and wrapper the user's git
//! uses.
//!
//! - The program: `GIT_SSH_COMMAND`, else `core.sshCommand` (both run by
//!   the shell, with arguments appended), else `GIT_SSH` (run directly),
//!   else `ssh`.
//! - Its variant: `GIT_SSH_VARIANT`, else `ssh.variant`, else the program's
//!   base name, else git's probe (`<ssh> -G ...` succeeds: OpenSSH).
//! - Protocol v2 is asked for as git asks: `GIT_PROTOCOL=version=2` in the
//!   environment and `-o SendEnv=GIT_PROTOCOL`, which reaches the server's
//!   `git upload-pack` only where sshd has `AcceptEnv GIT_PROTOCOL` (GitHub
//!   and GitLab do). Elsewhere the server answers protocol v0 and the
//!   reader hands the chunks to `git fetch`.
//!
//! Only OpenSSH-like programs can send `GIT_PROTOCOL`; for plink, putty or
//! a "simple" variant git itself speaks v0, so this module declines them,
//! and it declines the URL forms it does not parse exactly like git
//! (escapes, bracketed hosts) rather than guess a different server.
//! It never runs anything but the probe and the transport itself.

use std::process::{Command, Stdio};

use crate::git::CacheGit;

/// Where an ssh URL points, as git's `parse_connect_url` splits it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// `[user@]host`, as passed to ssh.
    pub host: String,
    pub port: Option<String>,
    /// The repository path as sent to the server (`~user/...` kept).
    pub path: String,
}

/// The ssh remote `url` names: `Ok(None)` when it is not an ssh URL at
/// all, `Err(why)` when it is one this module does not handle.
pub fn target(url: &str) -> Result<Option<Target>, String> {
    let (hostport, path) = if let Some((scheme, rest)) = url.split_once("://") {
        if !matches!(scheme, "ssh" | "git+ssh" | "ssh+git") {
            return Ok(None);
        }
        if rest.contains('%') {
            return Err("an ssh URL with %-escapes".into());
        }
        match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => return Err("an ssh URL without a path".into()),
        }
    } else {
        // scp-like `[user@]host:path`: a colon before any slash (git's
        // `url_is_local_not_ssh`).
        let colon = url.find(':');
        let slash = url.find('/');
        match (colon, slash) {
            (Some(c), s) if s.is_none_or(|s| c < s) => (&url[..c], &url[c..]),
            _ => return Ok(None),
        }
    };
    if hostport.contains('[') {
        return Err("an ssh URL with a bracketed host".into());
    }
    // The path starts after the ':' of the scp-like form; git then drops
    // one more character when the next is '~' (`/~user/repo` -> `~user/repo`).
    let mut path = path.strip_prefix(':').unwrap_or(path);
    if path.as_bytes().get(1) == Some(&b'~') {
        path = &path[1..];
    }
    if path.is_empty() {
        return Err("an ssh URL without a path".into());
    }
    let (host, port) = match hostport.split_once(':') {
        None => (hostport, None),
        Some((h, "")) => (h, None),
        Some((h, p)) if p.parse::<u16>().is_ok() => (h, Some(p.to_string())),
        Some(_) => return Err("an ssh URL whose port is not a number".into()),
    };
    if host.is_empty() || host.starts_with('-') || path.starts_with('-') {
        return Err(
            "an ssh URL git would refuse (empty host, or a host or path like an option)".into(),
        );
    }
    Ok(Some(Target {
        host: host.to_string(),
        port,
        path: path.to_string(),
    }))
}

/// The ssh program to run, resolved once per restore.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ssh {
    /// A command line for the shell (`GIT_SSH_COMMAND`, `core.sshCommand`)
    /// or a program (`GIT_SSH`, `ssh`).
    program: String,
    shell: bool,
    target: Target,
}

/// The config keys that choose the ssh program (`core.sshCommand`,
/// `ssh.variant`), as a `git config --get-regexp` pattern.
pub(super) const SSH_CONFIG: &str = r"^(core\.sshcommand|ssh\.variant)$";

/// What selects the ssh program, from the environment and git's config.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    pub ssh_command_env: Option<String>,
    pub ssh_command_config: Option<String>,
    pub git_ssh: Option<String>,
    pub variant_env: Option<String>,
    pub variant_config: Option<String>,
}

impl Settings {
    /// This process's environment and the config `git` sees in cache.git
    /// (system, global, forwarded from the user's repository).
    pub fn read(git: &CacheGit) -> Result<Settings, String> {
        let found = git
            .config_matching(SSH_CONFIG)
            .map_err(|e| format!("{e:#}"))?;
        // The last value wins, as for git.
        let last = |key: &str| {
            found
                .iter()
                .filter(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
                .next_back()
        };
        let env = |k: &str| std::env::var(k).ok();
        Ok(Settings {
            ssh_command_env: env("GIT_SSH_COMMAND"),
            ssh_command_config: last("core.sshcommand"),
            git_ssh: env("GIT_SSH"),
            variant_env: env("GIT_SSH_VARIANT"),
            variant_config: last("ssh.variant"),
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Auto,
    Ssh,
    /// plink, putty, tortoiseplink, simple: no `SendEnv`, so git speaks v0.
    Other,
}

impl Ssh {
    /// The program git would run for `target`, or why the direct reader
    /// should leave this remote to `git fetch`. `probe` runs git's `-G`
    /// test for a program whose variant its name does not tell.
    pub fn new(
        target: Target,
        settings: &Settings,
        probe: &mut dyn FnMut(&Ssh) -> bool,
    ) -> Result<Ssh, String> {
        let (program, shell) = match (&settings.ssh_command_env, &settings.ssh_command_config) {
            (Some(c), _) | (None, Some(c)) => (c.clone(), true),
            (None, None) => (
                settings.git_ssh.clone().unwrap_or_else(|| "ssh".into()),
                false,
            ),
        };
        let ssh = Ssh {
            program,
            shell,
            target,
        };
        let variant = match ssh.variant(settings) {
            Variant::Auto if probe(&ssh) => Variant::Ssh,
            Variant::Auto => Variant::Other,
            v => v,
        };
        if variant != Variant::Ssh {
            return Err(format!(
                "the ssh program ({}) is not OpenSSH, so git does not ask it for protocol v2",
                ssh.program
            ));
        }
        Ok(ssh)
    }

    /// git's `determine_ssh_variant`.
    fn variant(&self, settings: &Settings) -> Variant {
        if let Some(v) = settings
            .variant_env
            .as_deref()
            .or(settings.variant_config.as_deref())
        {
            return match v {
                "auto" => Variant::Auto,
                "plink" | "putty" | "tortoiseplink" | "simple" => Variant::Other,
                _ => Variant::Ssh,
            };
        }
        let first = if self.shell {
            match first_word(&self.program) {
                Some(w) => w,
                None => return Variant::Auto,
            }
        } else {
            self.program.clone()
        };
        let base = first.rsplit('/').next().unwrap_or("").to_ascii_lowercase();
        match base.as_str() {
            "ssh" | "ssh.exe" => Variant::Ssh,
            "plink" | "plink.exe" | "tortoiseplink" | "tortoiseplink.exe" => Variant::Other,
            _ => Variant::Auto,
        }
    }

    /// `ssh [first] -o SendEnv=GIT_PROTOCOL [-p port] host [last]`, through
    /// the shell for a command line, as git's `prepare_shell_cmd` runs it.
    fn command(&self, first: Option<&str>, last: Option<&str>) -> Command {
        let mut args: Vec<String> = vec!["-o".into(), "SendEnv=GIT_PROTOCOL".into()];
        if let Some(p) = &self.target.port {
            args.push("-p".into());
            args.push(p.clone());
        }
        let mut c = if self.shell {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg(format!("{} \"$@\"", self.program))
                .arg(&self.program);
            c
        } else {
            Command::new(&self.program)
        };
        c.args(first).args(args).arg(&self.target.host).args(last);
        // As git: the variable ssh sends, and none of the repository
        // variables of this process.
        c.env("GIT_PROTOCOL", "version=2");
        for v in [
            "GIT_DIR",
            "GIT_WORK_TREE",
            "GIT_INDEX_FILE",
            "GIT_OBJECT_DIRECTORY",
            "GIT_ALTERNATE_OBJECT_DIRECTORIES",
            "GIT_PREFIX",
        ] {
            c.env_remove(v);
        }
        c
    }

    /// git's probe of a program of unknown variant: `<ssh> -G <options> host`.
    pub fn probe_command(&self) -> Command {
        let mut c = self.command(Some("-G"), None);
        c.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    }

    /// `git-upload-pack '<path>'` on the server, over ssh.
    pub fn upload_pack(&self) -> Command {
        let remote = format!("git-upload-pack {}", sq_quote(&self.target.path));
        let mut c = self.command(None, Some(&remote));
        crate::process::group::die_with_parent(&mut c);
        c
    }
}

/// The first word of a command line, unquoted as git's `split_cmdline`
/// does (single quotes, double quotes with backslash escapes).
fn first_word(cmdline: &str) -> Option<String> {
    let mut word = String::new();
    let mut chars = cmdline.trim_start().chars();
    let mut quote = None;
    while let Some(c) = chars.next() {
        match (quote, c) {
            (None, c) if c.is_whitespace() => break,
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (Some('"'), '\\') => word.push(chars.next()?),
            (_, c) => word.push(c),
        }
    }
    (quote.is_none() && !word.is_empty()).then_some(word)
}

/// git's `sq_quote_buf`: single quotes, with `'` and `!` outside them.
fn sq_quote(s: &str) -> String {
    let mut q = String::from("'");
    for c in s.chars() {
        match c {
            '\'' | '!' => {
                q.push('\'');
                q.push('\\');
                q.push(c);
                q.push('\'');
            }
            c => q.push(c),
        }
    }
    q.push('\'');
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(host: &str, port: Option<&str>, path: &str) -> Option<Target> {
        Some(Target {
            host: host.into(),
            port: port.map(String::from),
            path: path.into(),
        })
    }

    #[test]
    fn ssh_urls_split_as_git_splits_them() {
        let cases = [
            (
                "ssh://git@host/org/repo.git",
                t("git@host", None, "/org/repo.git"),
            ),
            ("ssh://host:2222/srv/r", t("host", Some("2222"), "/srv/r")),
            ("git+ssh://u@h:22/r", t("u@h", Some("22"), "/r")),
            ("ssh+git://h/r", t("h", None, "/r")),
            ("ssh://h/~alice/r", t("h", None, "~alice/r")),
            ("ssh://h:/r", t("h", None, "/r")),
            (
                "git@github.com:org/repo.git",
                t("git@github.com", None, "org/repo.git"),
            ),
            ("host:/abs/path", t("host", None, "/abs/path")),
            ("host:/~alice/r", t("host", None, "~alice/r")),
            ("host:~/r", t("host", None, "~/r")),
        ];
        for (url, want) in cases {
            assert_eq!(target(url), Ok(want), "{url}");
        }
        // Not ssh at all: the caller looks at other forms.
        for url in [
            "/abs/path",
            "./rel:ative",
            "file:///x",
            "https://h/r",
            "git://h/r",
            "rel/path:x",
        ] {
            assert_eq!(target(url), Ok(None), "{url}");
        }
        // ssh, but not handled here: `git fetch` gets these.
        for url in [
            "ssh://h",
            "ssh://h/r%20x",
            "ssh://[::1]:22/r",
            "[h:22]:r",
            "ssh://h:port/r",
            "ssh://-oProxyCommand=x/r",
            "-oProxyCommand=x:r",
            "h:-r",
            "h:",
        ] {
            assert!(target(url).is_err(), "{url}: {:?}", target(url));
        }
    }

    fn args(c: &Command) -> Vec<String> {
        std::iter::once(c.get_program())
            .chain(c.get_args())
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    fn ssh_for(settings: &Settings, probe_ok: bool) -> Result<Ssh, String> {
        let target = target("ssh://git@h:2222/r/it's!.git").unwrap().unwrap();
        Ssh::new(target, settings, &mut |_| probe_ok)
    }

    #[test]
    fn the_program_and_arguments_are_gits() {
        let plain = ssh_for(&Settings::default(), false).unwrap();
        assert_eq!(
            args(&plain.upload_pack()),
            [
                "ssh",
                "-o",
                "SendEnv=GIT_PROTOCOL",
                "-p",
                "2222",
                "git@h",
                r"git-upload-pack '/r/it'\''s'\!'.git'"
            ]
        );
        let env = |c: &Command, k: &str| {
            c.get_envs()
                .find(|(n, _)| *n == k)
                .and_then(|(_, v)| v.map(|v| v.to_string_lossy().into_owned()))
        };
        assert_eq!(
            env(&plain.upload_pack(), "GIT_PROTOCOL").as_deref(),
            Some("version=2")
        );

        // GIT_SSH_COMMAND beats core.sshCommand beats GIT_SSH; the first two
        // go through the shell.
        let s = Settings {
            ssh_command_env: Some("ssh -i '/k ey'".into()),
            ssh_command_config: Some("ssh -i other".into()),
            git_ssh: Some("/usr/bin/ssh".into()),
            ..Settings::default()
        };
        let a = args(&ssh_for(&s, false).unwrap().upload_pack());
        assert_eq!(
            a[..4],
            ["sh", "-c", "ssh -i '/k ey' \"$@\"", "ssh -i '/k ey'"]
        );
        assert_eq!(a[4..6], ["-o", "SendEnv=GIT_PROTOCOL"]);
        let s = Settings {
            ssh_command_env: None,
            ..s
        };
        assert_eq!(
            args(&ssh_for(&s, false).unwrap().upload_pack())[3],
            "ssh -i other"
        );
        let s = Settings {
            ssh_command_config: None,
            ..s
        };
        assert_eq!(
            args(&ssh_for(&s, false).unwrap().upload_pack())[0],
            "/usr/bin/ssh"
        );

        // The probe: `-G` before the options and the host.
        assert_eq!(
            args(&plain.probe_command())[..4],
            ["ssh", "-G", "-o", "SendEnv=GIT_PROTOCOL"]
        );
    }

    #[test]
    fn only_openssh_like_programs_are_used() {
        let with = |git_ssh: &str, variant: Option<&str>, probe_ok: bool| {
            let s = Settings {
                git_ssh: Some(git_ssh.into()),
                variant_config: variant.map(String::from),
                ..Settings::default()
            };
            ssh_for(&s, probe_ok).is_ok()
        };
        assert!(with("/opt/bin/SSH.EXE", None, false));
        assert!(!with("plink", None, true));
        assert!(!with("/x/TortoisePlink.exe", None, true));
        // Unknown names: git's probe decides.
        assert!(with("/x/my-wrapper", None, true));
        assert!(!with("/x/my-wrapper", None, false));
        // ssh.variant overrides the name; GIT_SSH_VARIANT overrides both.
        assert!(!with("ssh", Some("putty"), true));
        assert!(!with("ssh", Some("simple"), true));
        assert!(with("plink", Some("ssh"), false));
        assert!(with("plink", Some("anything-else"), false));
        assert!(!with("ssh", Some("auto"), false));
        let s = Settings {
            git_ssh: Some("plink".into()),
            variant_env: Some("ssh".into()),
            variant_config: Some("plink".into()),
            ..Settings::default()
        };
        assert!(ssh_for(&s, false).is_ok());
        let s = Settings {
            ssh_command_env: Some("'/my dir/plink' -batch".into()),
            ..Settings::default()
        };
        assert!(ssh_for(&s, true).is_err());
        assert_eq!(
            first_word(r#"  "/a \"b\"/ssh" -x"#).as_deref(),
            Some(r#"/a "b"/ssh"#)
        );
        assert_eq!(first_word("'unclosed"), None);
    }
}
