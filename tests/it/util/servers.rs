//! Real network servers on 127.0.0.1, as users meet them: nginx serving
//! `git http-backend` (through fcgiwrap) over HTTPS with basic auth and a
//! test CA, squid as an authenticating CONNECT proxy, and sshd with
//! key-only login.
//!
//! Each server is a struct that writes its configuration into a temporary
//! directory of its own, starts the real daemon in the foreground in its own
//! process group on a free port, waits until it listens, and kills the group
//! when dropped. Keys, certificates and password files are made at run time
//! with `openssl` and `ssh-keygen`; nothing of the system's service setup
//! (systemd units, /etc configs) is used. `tools/test.sh` installs the
//! packages; a missing binary panics with the package to install.

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::git_daemon::free_port;

/// The user and password nginx's basic auth accepts.
pub const GIT_USER: &str = "alice";
pub const GIT_PASSWORD: &str = "git-s3cret-9f2e";
/// The user and password squid's basic auth accepts.
pub const PROXY_USER: &str = "bob";
pub const PROXY_PASSWORD: &str = "proxy-s3cret-41c7";

/// A daemon in its own process group, killed with the group on drop.
struct Daemon {
    child: Child,
    what: &'static str,
}

impl Daemon {
    fn spawn(mut cmd: Command, what: &'static str, log: &Path, package: &str) -> Daemon {
        let log = std::fs::File::create(log).unwrap();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("starting {what}: {e} (tools/test.sh installs the package {package})")
            });
        Daemon { child, what }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Panics with the daemon's log if it has exited.
    fn check_alive(&mut self, log: &Path) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!(
                "{} exited ({status}) while starting:\n{}",
                self.what,
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: kill(2) has no memory-safety preconditions; the group is
        // our child's, which is not reaped yet, so its id is still ours.
        unsafe {
            libc::kill(-self.pid(), libc::SIGCONT);
            libc::kill(-self.pid(), libc::SIGKILL);
        }
        let _ = self.child.wait();
    }
}

/// Waits until `port` on 127.0.0.1 accepts connections, or panics with `log`.
fn wait_listening(daemon: &mut Daemon, port: u16, log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        daemon.check_alive(log);
        assert!(
            Instant::now() < deadline,
            "{} did not listen on port {port}:\n{}",
            daemon.what,
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A daemon's program: the one in /usr/sbin (which a non-login PATH may
/// lack), else whatever PATH finds.
fn sbin(name: &str) -> PathBuf {
    let p = Path::new("/usr/sbin").join(name);
    if p.exists() { p } else { PathBuf::from(name) }
}

/// Runs a setup command, panicking with its output when it fails.
fn setup(cmd: &mut Command) -> String {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}\n{}", super::show(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// An htpasswd line for `user` (apr1, which nginx and squid's
/// basic_ncsa_auth both read).
fn htpasswd_line(user: &str, password: &str) -> String {
    let hash = setup(Command::new("openssl").args(["passwd", "-apr1", password]));
    format!("{user}:{}\n", hash.trim())
}

/// A certificate authority made for one test, and a certificate for
/// 127.0.0.1 it signed.
pub struct TestCa {
    /// The CA's certificate: what a client must trust (`GIT_SSL_CAINFO`).
    pub cert: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
}

impl TestCa {
    pub fn create(dir: &Path) -> TestCa {
        let p = |name: &str| dir.join(name);
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
        setup(
            Command::new("openssl")
                .args(["req", "-x509", "-nodes", "-days", "2"])
                .args(ec)
                .args(["-subj", "/CN=warmstart test CA", "-keyout"])
                .arg(p("ca.key"))
                .arg("-out")
                .arg(p("ca.crt")),
        );
        setup(
            Command::new("openssl")
                .args(["req", "-nodes"])
                .args(ec)
                .args(["-subj", "/CN=127.0.0.1", "-keyout"])
                .arg(p("server.key"))
                .arg("-out")
                .arg(p("server.csr")),
        );
        std::fs::write(
            p("ext.cnf"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n",
        )
        .unwrap();
        setup(
            Command::new("openssl")
                .args(["x509", "-req", "-days", "2", "-in"])
                .arg(p("server.csr"))
                .arg("-CA")
                .arg(p("ca.crt"))
                .arg("-CAkey")
                .arg(p("ca.key"))
                .arg("-CAcreateserial")
                .arg("-extfile")
                .arg(p("ext.cnf"))
                .arg("-out")
                .arg(p("server.crt")),
        );
        TestCa {
            cert: p("ca.crt"),
            server_cert: p("server.crt"),
            server_key: p("server.key"),
        }
    }
}

fn tempdir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(prefix).tempdir().unwrap()
}

/// nginx serving every bare repository under a base directory through
/// `git http-backend` (run by fcgiwrap), over HTTPS with basic auth.
pub struct Nginx {
    pub port: u16,
    pub ca: TestCa,
    dir: tempfile::TempDir,
    // Dropped first: nginx, then the fcgiwrap it talks to.
    _nginx: Daemon,
    _fcgiwrap: Daemon,
}

impl Nginx {
    /// Serves the repositories under `base`, read and push, to `GIT_USER`.
    pub fn start(base: &Path) -> Nginx {
        for entry in std::fs::read_dir(base).unwrap() {
            let path = entry.unwrap().path();
            if path.join("HEAD").is_file() {
                setup(Command::new("git").arg("--git-dir").arg(&path).args([
                    "config",
                    "http.receivepack",
                    "true",
                ]));
            }
        }
        let dir = tempdir("warmstart-nginx-");
        let d = dir.path();
        let ca = TestCa::create(d);
        std::fs::write(d.join("htpasswd"), htpasswd_line(GIT_USER, GIT_PASSWORD)).unwrap();
        std::fs::create_dir_all(d.join("tmp")).unwrap();
        let socket = d.join("fcgi.sock");
        let mut fcgi = Command::new(sbin("fcgiwrap"));
        // Several workers: a restore reads two chunks at once, next to the
        // requests of git's own fetches.
        fcgi.args(["-c", "8", "-s"])
            .arg(format!("unix:{}", socket.display()));
        let fcgi_log = d.join("fcgiwrap.log");
        let mut fcgiwrap = Daemon::spawn(fcgi, "fcgiwrap", &fcgi_log, "fcgiwrap");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !socket.exists() {
            fcgiwrap.check_alive(&fcgi_log);
            assert!(Instant::now() < deadline, "fcgiwrap made no socket");
            std::thread::sleep(Duration::from_millis(20));
        }
        let port = free_port();
        let backend = Path::new(
            &setup(Command::new("git").arg("--exec-path"))
                .trim()
                .to_string(),
        )
        .join("git-http-backend");
        std::fs::write(
            d.join("nginx.conf"),
            nginx_conf(d, port, &ca, &socket, &backend, base),
        )
        .unwrap();
        let log = d.join("nginx.log");
        let mut cmd = Command::new(sbin("nginx"));
        cmd.arg("-e")
            .arg(d.join("error.log"))
            .arg("-p")
            .arg(d)
            .arg("-c")
            .arg(d.join("nginx.conf"));
        let mut nginx = Daemon::spawn(cmd, "nginx", &log, "nginx-light");
        wait_listening(&mut nginx, port, &d.join("error.log"));
        Nginx {
            port,
            ca,
            dir,
            _nginx: nginx,
            _fcgiwrap: fcgiwrap,
        }
    }

    /// The URL of a repository below the base, without credentials.
    pub fn url(&self, rel: &str) -> String {
        format!("https://127.0.0.1:{}/{rel}", self.port)
    }

    /// The URL with `user:password@` in it (GitLab CI's checkout form).
    pub fn url_with(&self, rel: &str, user: &str, password: &str) -> String {
        format!("https://{user}:{password}@127.0.0.1:{}/{rel}", self.port)
    }

    /// nginx's access log: one line per request, with the user.
    pub fn access_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default()
    }
}

fn nginx_conf(
    d: &Path,
    port: u16,
    ca: &TestCa,
    socket: &Path,
    backend: &Path,
    base: &Path,
) -> String {
    let d = d.display();
    format!(
        r#"daemon off;
user root;
worker_processes 1;
pid {d}/nginx.pid;
events {{ worker_connections 256; }}
http {{
  access_log {d}/access.log;
  client_body_temp_path {d}/tmp/body;
  fastcgi_temp_path {d}/tmp/fastcgi;
  proxy_temp_path {d}/tmp/proxy;
  uwsgi_temp_path {d}/tmp/uwsgi;
  scgi_temp_path {d}/tmp/scgi;
  client_max_body_size 0;
  server {{
    listen 127.0.0.1:{port} ssl;
    ssl_certificate {cert};
    ssl_certificate_key {key};
    auth_basic "git";
    auth_basic_user_file {d}/htpasswd;
    location / {{
      fastcgi_pass unix:{socket};
      fastcgi_buffering off;
      fastcgi_request_buffering off;
      fastcgi_read_timeout 600s;
      fastcgi_param SCRIPT_FILENAME {backend};
      fastcgi_param GIT_PROJECT_ROOT {base};
      fastcgi_param GIT_HTTP_EXPORT_ALL 1;
      fastcgi_param GIT_CONFIG_NOSYSTEM 1;
      fastcgi_param PATH_INFO $uri;
      fastcgi_param QUERY_STRING $query_string;
      fastcgi_param REQUEST_METHOD $request_method;
      fastcgi_param CONTENT_TYPE $content_type;
      fastcgi_param CONTENT_LENGTH $content_length;
      fastcgi_param REMOTE_USER $remote_user;
      fastcgi_param REMOTE_ADDR $remote_addr;
      fastcgi_param SERVER_PROTOCOL $server_protocol;
      fastcgi_param GIT_PROTOCOL $http_git_protocol;
    }}
  }}
}}
"#,
        cert = ca.server_cert.display(),
        key = ca.server_key.display(),
        socket = socket.display(),
        backend = backend.display(),
        base = base.display(),
    )
}

/// squid as an authenticating CONNECT proxy (basic auth), no cache, no DNS
/// beyond 127.0.0.1.
pub struct Squid {
    pub port: u16,
    dir: tempfile::TempDir,
    daemon: Daemon,
}

impl Squid {
    pub fn start() -> Squid {
        Squid::start_denying(&[])
    }

    /// squid that answers `403 Forbidden` to a `CONNECT` to any of `ports`
    /// on 127.0.0.1 (a host the proxy's policy blocks), after its auth.
    pub fn start_denying(ports: &[u16]) -> Squid {
        let dir = tempdir("warmstart-squid-");
        let d = dir.path();
        // squid drops root for its user, which must read its config and
        // password file and write its logs and pid file.
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(d.join("passwd"), htpasswd_line(PROXY_USER, PROXY_PASSWORD)).unwrap();
        let port = free_port();
        let helper = [
            "/usr/lib/squid/basic_ncsa_auth",
            "/usr/lib64/squid/basic_ncsa_auth",
        ]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("squid's basic_ncsa_auth helper (tools/test.sh installs the package squid)");
        std::fs::write(d.join("squid.conf"), squid_conf(d, port, helper, ports)).unwrap();
        setup(Command::new("chown").args(["-R", "proxy:proxy"]).arg(d));
        let log = d.join("squid.out");
        let mut cmd = Command::new(sbin("squid"));
        // -n: a service name of our own, so that concurrent squids never
        // share a pid file or a shared-memory segment name.
        cmd.args(["-N", "-n", &format!("warmstart{port}"), "-f"])
            .arg(d.join("squid.conf"));
        let mut daemon = Daemon::spawn(cmd, "squid", &log, "squid");
        wait_listening(&mut daemon, port, &d.join("cache.log"));
        Squid { port, dir, daemon }
    }

    /// `http.proxy` with the proxy's credentials in it.
    pub fn proxy_url(&self) -> String {
        self.proxy_url_with(PROXY_USER, PROXY_PASSWORD)
    }

    pub fn proxy_url_with(&self, user: &str, password: &str) -> String {
        format!("http://{user}:{password}@127.0.0.1:{}", self.port)
    }

    /// squid's access log: a `CONNECT host:port user` line per tunnel,
    /// written when the tunnel closes.
    pub fn access_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default()
    }

    /// Tunnels squid carried for `PROXY_USER` to `127.0.0.1:port`.
    pub fn tunnels_to(&self, port: u16) -> usize {
        let target = format!(" CONNECT 127.0.0.1:{port} {PROXY_USER} ");
        self.access_log()
            .lines()
            .filter(|l| l.contains("TCP_TUNNEL/200") && l.contains(&target))
            .count()
    }

    /// SIGSTOP to squid: every tunnel stalls mid-transfer, connections stay open.
    pub fn pause(&self) {
        // SAFETY: kill(2) has no memory-safety preconditions; the pid is
        // our unreaped child's.
        unsafe {
            libc::kill(self.daemon.pid(), libc::SIGSTOP);
        }
    }

    pub fn resume(&self) {
        // SAFETY: as in `pause`.
        unsafe {
            libc::kill(self.daemon.pid(), libc::SIGCONT);
        }
    }
}

fn squid_conf(d: &Path, port: u16, helper: &str, denied: &[u16]) -> String {
    let d = d.display();
    let denied = match denied {
        [] => String::new(),
        ports => {
            let list: Vec<String> = ports.iter().map(u16::to_string).collect();
            format!(
                "acl denied_ports port {}\nhttp_access deny denied_ports\n",
                list.join(" ")
            )
        }
    };
    format!(
        r#"http_port 127.0.0.1:{port}
visible_hostname warmstart-test-proxy
auth_param basic program {helper} {d}/passwd
auth_param basic children 2
auth_param basic realm warmstart test proxy
acl authed proxy_auth REQUIRED
http_access deny !authed
{denied}http_access allow authed
http_access deny all
cache deny all
cache_mem 0 MB
access_log stdio:{d}/access.log
cache_log {d}/cache.log
cache_store_log none
pid_filename {d}/squid.pid
coredump_dir {d}
netdb_filename none
pinger_enable off
dns_nameservers 127.0.0.1
cache_effective_user proxy
shutdown_lifetime 0 seconds
"#
    )
}

/// sshd with key-only login for root on 127.0.0.1, accepting GIT_PROTOCOL.
pub struct Sshd {
    pub port: u16,
    /// The private key sshd accepts.
    pub key: PathBuf,
    /// A key sshd does not accept.
    pub wrong_key: PathBuf,
    pub known_hosts: PathBuf,
    dir: tempfile::TempDir,
    _daemon: Daemon,
}

impl Sshd {
    pub fn start() -> Sshd {
        Sshd::start_with(true)
    }

    /// An sshd without `AcceptEnv GIT_PROTOCOL` (OpenSSH's default): its
    /// `git upload-pack` never hears that the client wants protocol v2.
    pub fn start_without_git_protocol() -> Sshd {
        Sshd::start_with(false)
    }

    fn start_with(accept_git_protocol: bool) -> Sshd {
        let dir = tempdir("warmstart-sshd-");
        let d = dir.path();
        for name in ["host_key", "client_key", "wrong_key"] {
            setup(
                Command::new("ssh-keygen")
                    .args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"])
                    .arg(d.join(name)),
            );
        }
        std::fs::copy(d.join("client_key.pub"), d.join("authorized_keys")).unwrap();
        let port = free_port();
        let host_pub = std::fs::read_to_string(d.join("host_key.pub")).unwrap();
        let host_pub: Vec<&str> = host_pub.split_whitespace().take(2).collect();
        let known_hosts = d.join("known_hosts");
        std::fs::write(
            &known_hosts,
            format!("[127.0.0.1]:{port} {}\n", host_pub.join(" ")),
        )
        .unwrap();
        let mut conf = sshd_conf(d, port);
        if accept_git_protocol {
            conf.push_str("AcceptEnv GIT_PROTOCOL\n");
        }
        std::fs::write(d.join("sshd_config"), conf).unwrap();
        // sshd refuses to start without its privilege separation directory,
        // which the package's service unit would have made.
        std::fs::create_dir_all("/run/sshd").unwrap();
        let log = d.join("sshd.log");
        // sshd must be started by its absolute path (it re-executes itself).
        let sshd = sbin("sshd");
        assert!(
            sshd.is_absolute(),
            "no /usr/sbin/sshd (tools/test.sh installs the package openssh-server)"
        );
        let mut cmd = Command::new(sshd);
        cmd.args(["-D", "-e", "-f"]).arg(d.join("sshd_config"));
        let mut daemon = Daemon::spawn(cmd, "sshd", &log, "openssh-server");
        wait_listening(&mut daemon, port, &log);
        Sshd {
            port,
            key: d.join("client_key"),
            wrong_key: d.join("wrong_key"),
            known_hosts,
            dir,
            _daemon: daemon,
        }
    }

    /// An `ssh://` URL of a repository at an absolute path on this machine.
    pub fn url(&self, repo: &Path) -> String {
        format!("ssh://root@127.0.0.1:{}{}", self.port, repo.display())
    }

    /// `GIT_SSH_COMMAND` that logs in with `key` and trusts only this
    /// server's host key.
    pub fn ssh_command(&self, key: &Path) -> String {
        format!(
            "ssh -F /dev/null -i {} -o IdentitiesOnly=yes -o UserKnownHostsFile={} -o StrictHostKeyChecking=yes -o BatchMode=yes",
            key.display(),
            self.known_hosts.display()
        )
    }

    /// sshd's log (`-e`: what it would send to syslog).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sshd.log")).unwrap_or_default()
    }
}

fn sshd_conf(d: &Path, port: u16) -> String {
    let d = d.display();
    format!(
        r#"Port {port}
ListenAddress 127.0.0.1
HostKey {d}/host_key
PidFile {d}/sshd.pid
AuthorizedKeysFile {d}/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
SetEnv GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
LogLevel VERBOSE
"#
    )
}

/// A TCP server on 127.0.0.1 that accepts every connection and never
/// sends a byte (a proxy or an ssh server that hangs). Connections are held
/// open until it is dropped.
pub struct Silent {
    pub port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Silent {
    pub fn start() -> Silent {
        let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut held = Vec::new();
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        // Read what arrives, so the client never blocks on
                        // a full send buffer: it waits for an answer.
                        stream.set_nonblocking(true).unwrap();
                        held.push(stream);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        let mut buf = [0u8; 4096];
                        for c in &mut held {
                            let _ = c.read(&mut buf);
                        }
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(e) => panic!("accept: {e}"),
                }
            }
        });
        Silent {
            port,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Silent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The user and password the registry's basic auth accepts.
pub const REGISTRY_USER: &str = "carol";
pub const REGISTRY_PASSWORD: &str = "registry-s3cret-77d1";

/// The CNCF distribution registry (Debian's `docker-registry`) on
/// 127.0.0.1, over HTTPS with a test CA and htpasswd (bcrypt) basic auth,
/// storing on disk in its own temporary directory; its access log (one
/// line a request) is the log file.
pub struct Registry {
    pub port: u16,
    pub ca: TestCa,
    dir: tempfile::TempDir,
    daemon: Daemon,
}

impl Registry {
    pub fn start() -> Registry {
        let dir = tempdir("warmstart-registry-");
        let d = dir.path();
        let ca = TestCa::create(d);
        // The registry reads bcrypt only; `htpasswd -B` (apache2-utils) makes it.
        let line = setup(Command::new("htpasswd").args(["-nbB", REGISTRY_USER, REGISTRY_PASSWORD]));
        std::fs::write(d.join("htpasswd"), line.trim().to_string() + "\n").unwrap();
        let port = free_port();
        let config = format!(
            "version: 0.1\n\
             log:\n  level: info\n  formatter: text\n  accesslog:\n    disabled: false\n\
             storage:\n  filesystem:\n    rootdirectory: {storage}\n  delete:\n    enabled: true\n\
             http:\n  addr: 127.0.0.1:{port}\n  secret: warmstart-test-secret\n  tls:\n    certificate: {cert}\n    key: {key}\n\
             auth:\n  htpasswd:\n    realm: warmstart-test\n    path: {htpasswd}\n",
            storage = d.join("storage").display(),
            cert = ca.server_cert.display(),
            key = ca.server_key.display(),
            htpasswd = d.join("htpasswd").display(),
        );
        std::fs::write(d.join("config.yml"), config).unwrap();
        let log = d.join("registry.log");
        let program = ["/usr/bin/docker-registry", "/usr/sbin/docker-registry"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .unwrap_or("docker-registry");
        let mut cmd = Command::new(program);
        cmd.arg("serve").arg(d.join("config.yml"));
        let mut daemon = Daemon::spawn(cmd, "docker-registry", &log, "docker-registry");
        wait_listening(&mut daemon, port, &log);
        Registry {
            port,
            ca,
            dir,
            daemon,
        }
    }

    /// `127.0.0.1:<port>/<repo>`, as `[cache] registry` names it.
    pub fn name(&self, repo: &str) -> String {
        format!("127.0.0.1:{}/{repo}", self.port)
    }

    /// The registry's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// Request lines of the access log with this method whose path holds `part`.
    pub fn requests(&self, method: &str, part: &str) -> usize {
        let needle = format!("\"{method} /v2/");
        self.log()
            .lines()
            .filter(|l| l.contains(&needle) && l.contains(part))
            .count()
    }

    /// The file that holds blob `sha256` in the registry's storage.
    pub fn blob_file(&self, sha256: &str) -> PathBuf {
        self.dir.path().join(format!(
            "storage/docker/registry/v2/blobs/sha256/{}/{sha256}/data",
            &sha256[..2]
        ))
    }

    /// A docker `config.json` directory whose `auths` log in as `user`.
    pub fn docker_config(&self, at: &Path, user: &str, password: &str) -> PathBuf {
        std::fs::create_dir_all(at).unwrap();
        let auth = setup(
            Command::new("sh")
                .arg("-c")
                .arg("printf %s \"$1\" | base64 -w0")
                .arg("sh")
                .arg(format!("{user}:{password}")),
        );
        std::fs::write(
            at.join("config.json"),
            format!(
                "{{\"auths\": {{\"127.0.0.1:{}\": {{\"auth\": \"{}\"}}}}}}\n",
                self.port,
                auth.trim()
            ),
        )
        .unwrap();
        at.to_path_buf()
    }

    /// SIGSTOP: every request hangs, connections stay open.
    pub fn pause(&self) {
        // SAFETY: kill(2) has no memory-safety preconditions; the pid is
        // our unreaped child's.
        unsafe {
            libc::kill(self.daemon.pid(), libc::SIGSTOP);
        }
    }

    pub fn resume(&self) {
        // SAFETY: as in `pause`.
        unsafe {
            libc::kill(self.daemon.pid(), libc::SIGCONT);
        }
    }
}

/// nginx as a fleet's pull-through cache in front of a `Registry`, over
/// HTTPS with a CA of its own: blobs by digest are cached on disk and
/// concurrent misses of one blob collapse into one upstream request
/// (`proxy_cache_lock`); everything else (tags) is passed through
/// uncached. It holds the registry's credentials itself and asks none of
/// its clients, as a fleet's mirror does.
pub struct RegistryMirror {
    pub port: u16,
    pub ca: TestCa,
    dir: tempfile::TempDir,
    _nginx: Daemon,
}

impl RegistryMirror {
    pub fn start(upstream: &Registry) -> RegistryMirror {
        let dir = tempdir("warmstart-mirror-");
        let d = dir.path();
        let ca = TestCa::create(d);
        std::fs::create_dir_all(d.join("tmp")).unwrap();
        let auth = setup(
            Command::new("sh")
                .arg("-c")
                .arg("printf %s \"$1\" | base64 -w0")
                .arg("sh")
                .arg(format!("{REGISTRY_USER}:{REGISTRY_PASSWORD}")),
        );
        let port = free_port();
        let dd = d.display();
        let conf = format!(
            r#"daemon off;
user root;
worker_processes 1;
pid {dd}/nginx.pid;
events {{ worker_connections 512; }}
http {{
  access_log {dd}/access.log;
  client_body_temp_path {dd}/tmp/body;
  fastcgi_temp_path {dd}/tmp/fastcgi;
  proxy_temp_path {dd}/tmp/proxy;
  uwsgi_temp_path {dd}/tmp/uwsgi;
  scgi_temp_path {dd}/tmp/scgi;
  proxy_cache_path {dd}/cache levels=1:2 keys_zone=blobs:10m max_size=2g inactive=1h use_temp_path=off;
  server {{
    listen 127.0.0.1:{port} ssl;
    ssl_certificate {cert};
    ssl_certificate_key {key};
    proxy_http_version 1.1;
    proxy_set_header Host 127.0.0.1:{up};
    proxy_set_header Authorization "Basic {auth}";
    # Loopback in a test: the upstream's CA is one made a moment ago.
    proxy_ssl_verify off;
    location ~ "^/v2/.+/blobs/sha256:[0-9a-f]{{64}}$" {{
      proxy_pass https://127.0.0.1:{up};
      proxy_cache blobs;
      proxy_cache_key $uri;
      proxy_cache_valid 200 1h;
      proxy_cache_lock on;
      proxy_cache_lock_timeout 300s;
      proxy_cache_lock_age 300s;
      proxy_read_timeout 300s;
    }}
    location /v2/ {{
      proxy_pass https://127.0.0.1:{up};
    }}
  }}
}}
"#,
            cert = ca.server_cert.display(),
            key = ca.server_key.display(),
            up = upstream.port,
            auth = auth.trim(),
        );
        std::fs::write(d.join("nginx.conf"), conf).unwrap();
        let mut cmd = Command::new(sbin("nginx"));
        cmd.arg("-e")
            .arg(d.join("error.log"))
            .arg("-p")
            .arg(d)
            .arg("-c")
            .arg(d.join("nginx.conf"));
        let mut nginx = Daemon::spawn(cmd, "nginx", &d.join("nginx.log"), "nginx-light");
        wait_listening(&mut nginx, port, &d.join("error.log"));
        RegistryMirror {
            port,
            ca,
            dir,
            _nginx: nginx,
        }
    }

    /// `127.0.0.1:<port>`, as a mirror is named.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// nginx's access log: one line per request a client made of it.
    pub fn access_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default()
    }
}

/// One CA bundle for a client that reaches several test servers
/// (`CURL_CA_BUNDLE` names one file).
pub fn ca_bundle(at: &Path, certs: &[&Path]) -> PathBuf {
    let mut all = String::new();
    for c in certs {
        all.push_str(&std::fs::read_to_string(c).unwrap());
    }
    std::fs::write(at, all).unwrap();
    at.to_path_buf()
}

/// A static file server over HTTPS (python's `http.server`) that serves
/// the files under `root` and ignores `Range`: every answer is a whole
/// file with status 200, as some caches and object stores answer. Its log
/// has one line a request.
pub struct StaticHttps {
    pub port: u16,
    pub ca: TestCa,
    pub root: PathBuf,
    dir: tempfile::TempDir,
    _server: Daemon,
}

impl StaticHttps {
    pub fn start() -> StaticHttps {
        let dir = tempdir("warmstart-static-");
        let d = dir.path();
        let ca = TestCa::create(d);
        let root = d.join("root");
        std::fs::create_dir_all(&root).unwrap();
        let port = free_port();
        let script = r#"
import http.server, ssl, sys, functools
port, root, cert, key = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=root)
httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
httpd.serve_forever()
"#;
        let mut cmd = Command::new("python3");
        cmd.arg("-u")
            .arg("-c")
            .arg(script)
            .arg(port.to_string())
            .arg(&root)
            .arg(&ca.server_cert)
            .arg(&ca.server_key);
        let log = d.join("server.log");
        let mut server = Daemon::spawn(cmd, "python3 http.server", &log, "python3");
        wait_listening(&mut server, port, &log);
        StaticHttps {
            port,
            ca,
            root,
            dir,
            _server: server,
        }
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }
}
