#!/usr/bin/env python3
"""Benchmark of `cache restore` over the real network transports (issue 13).

For one cache of about 150 MB compressed (random and text files), it times a
full cold `cache restore` (branch fetch, chunk fetch, verify, unpack, install;
a fresh clone, so an empty chunk store and no stamp) and, in the same round,
`git fetch --depth 1` of the same cache branch into an empty repository
(fetch only), over three transports served on 127.0.0.1 by real daemons:

- https: nginx + fcgiwrap + `git http-backend`, TLS from a CA made at run
  time, basic auth (git's credential helper `store` holds the password);
- proxy: the same HTTPS server through squid as an authenticating CONNECT
  proxy (`http.proxy` with credentials);
- ssh: sshd with key-only login and `AcceptEnv GIT_PROTOCOL`.

Rounds are interleaved (every transport in every round, the order rotated
from round to round, restore and fetch alternating which goes first), each
contender starts after an untimed `sync`, and the ratio compared is
restore / fetch of the same round: only ratios from one run compare.

    nice tools/bench-transport.py --xtask target/debug/warmstart --runs 5
    tools/bench-transport.py --size-mb 20 --runs 1       # a quick look

It needs root (sshd, squid's user) and the packages tools/test.sh installs.
It prints a Markdown table and JSON on stdout (progress on stderr), asserts
nothing, and exits non-zero only when a contender fails.
"""

import argparse
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GIT_USER, GIT_PASSWORD = "alice", "bench-git-password"
PROXY_USER, PROXY_PASSWORD = "bob", "bench-proxy-password"
BRANCH = "bench-cache"


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(argv, **kw):
    return subprocess.run(argv, check=True, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, **kw).stdout


def wait_listening(proc, port, what, logfile):
    deadline = time.time() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                sys.exit(f"bench-transport: {what} did not start:\n{Path(logfile).read_text(errors='replace')}")
            time.sleep(0.05)


class Daemons:
    """nginx + fcgiwrap, squid and sshd, each in its own process group."""

    def __init__(self, d, repos):
        self.d = d
        self.procs = []
        d.mkdir(parents=True)
        os.chmod(d, 0o755)
        self.https_port, self.proxy_port, self.ssh_port = free_port(), free_port(), free_port()
        self.tls()
        self.start_nginx(repos)
        self.start_squid()
        self.start_sshd()

    def spawn(self, argv, logname):
        f = open(self.d / logname, "wb")
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=f, stderr=f, start_new_session=True)
        self.procs.append(p)
        return p

    def stop(self):
        for p in self.procs:
            try:
                os.killpg(p.pid, 9)
            except ProcessLookupError:
                pass
            p.wait()

    def tls(self):
        d = self.d
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
        run(["openssl", "req", "-x509", "-nodes", "-days", "2", *ec, "-subj", "/CN=bench CA",
             "-keyout", d / "ca.key", "-out", d / "ca.crt"], stderr=subprocess.DEVNULL)
        run(["openssl", "req", "-nodes", *ec, "-subj", "/CN=127.0.0.1",
             "-keyout", d / "server.key", "-out", d / "server.csr"], stderr=subprocess.DEVNULL)
        (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")
        run(["openssl", "x509", "-req", "-days", "2", "-in", d / "server.csr", "-CA", d / "ca.crt",
             "-CAkey", d / "ca.key", "-CAcreateserial", "-extfile", d / "ext.cnf",
             "-out", d / "server.crt"], stderr=subprocess.DEVNULL)
        self.ca = d / "ca.crt"

    @staticmethod
    def htpasswd(user, password):
        return f"{user}:{run(['openssl', 'passwd', '-apr1', password]).decode().strip()}\n"

    def start_nginx(self, repos):
        d = self.d
        (d / "htpasswd").write_text(self.htpasswd(GIT_USER, GIT_PASSWORD))
        (d / "tmp").mkdir()
        sock = d / "fcgi.sock"
        self.spawn(["fcgiwrap", "-c", "8", "-s", f"unix:{sock}"], "fcgiwrap.log")
        while not sock.exists():
            time.sleep(0.02)
        backend = Path(run(["git", "--exec-path"]).decode().strip()) / "git-http-backend"
        (d / "nginx.conf").write_text(f"""daemon off;
user root;
worker_processes 2;
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
    listen 127.0.0.1:{self.https_port} ssl;
    ssl_certificate {d}/server.crt;
    ssl_certificate_key {d}/server.key;
    auth_basic "git";
    auth_basic_user_file {d}/htpasswd;
    location / {{
      fastcgi_pass unix:{sock};
      fastcgi_buffering off;
      fastcgi_request_buffering off;
      fastcgi_read_timeout 600s;
      fastcgi_param SCRIPT_FILENAME {backend};
      fastcgi_param GIT_PROJECT_ROOT {repos};
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
""")
        p = self.spawn(["nginx", "-e", d / "error.log", "-p", d, "-c", d / "nginx.conf"], "nginx.log")
        wait_listening(p, self.https_port, "nginx", d / "error.log")

    def start_squid(self):
        d = self.d / "squid"
        d.mkdir()
        os.chmod(d, 0o755)
        (d / "passwd").write_text(self.htpasswd(PROXY_USER, PROXY_PASSWORD))
        (d / "squid.conf").write_text(f"""http_port 127.0.0.1:{self.proxy_port}
visible_hostname warmstart-bench-proxy
auth_param basic program /usr/lib/squid/basic_ncsa_auth {d}/passwd
auth_param basic children 2
acl authed proxy_auth REQUIRED
http_access deny !authed
http_access allow authed
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
""")
        run(["chown", "-R", "proxy:proxy", d])
        p = self.spawn(["squid", "-N", "-n", f"wsbench{self.proxy_port}", "-f", d / "squid.conf"], "squid.log")
        wait_listening(p, self.proxy_port, "squid", d / "cache.log")

    def start_sshd(self):
        d = self.d / "ssh"
        d.mkdir()
        for name in ["host_key", "client_key"]:
            run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", d / name])
        shutil.copy(d / "client_key.pub", d / "authorized_keys")
        host = " ".join((d / "host_key.pub").read_text().split()[:2])
        (d / "known_hosts").write_text(f"[127.0.0.1]:{self.ssh_port} {host}\n")
        (d / "sshd_config").write_text(f"""Port {self.ssh_port}
ListenAddress 127.0.0.1
HostKey {d}/host_key
PidFile {d}/sshd.pid
AuthorizedKeysFile {d}/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
AcceptEnv GIT_PROTOCOL
SetEnv GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
""")
        os.makedirs("/run/sshd", exist_ok=True)
        p = self.spawn(["/usr/sbin/sshd", "-D", "-e", "-f", d / "sshd_config"], "sshd.log")
        wait_listening(p, self.ssh_port, "sshd", self.d / "sshd.log")
        self.ssh_command = (f"ssh -F /dev/null -i {d}/client_key -o IdentitiesOnly=yes "
                            f"-o UserKnownHostsFile={d}/known_hosts -o StrictHostKeyChecking=yes -o BatchMode=yes")

    def tunnels(self):
        log_path = self.d / "squid/access.log"
        text = log_path.read_text() if log_path.exists() else ""
        return sum(1 for l in text.splitlines() if "TCP_TUNNEL/200" in l and f" {PROXY_USER} " in l)


def make_tree(dest, size_mb, seed=13):
    """Random files (incompressible, 85% of the size) and text files (word
    salad that zstd shrinks about 3x), in files of 1-8 MB."""
    rnd = random.Random(seed)
    dest.mkdir(parents=True)
    random_bytes = size_mb * 85 // 100 * 1024 * 1024
    i = 0
    while random_bytes > 0:
        n = min(random_bytes, rnd.randint(1, 8) * 1024 * 1024)
        (dest / f"blob-{i:03}.bin").write_bytes(rnd.randbytes(n))
        random_bytes -= n
        i += 1
    words = [bytes(rnd.choice(b"abcdefghijklmnopqrstuvwxyz") for _ in range(rnd.randint(2, 10))) for _ in range(5000)]
    text_bytes = size_mb * 15 // 100 * 3 * 1024 * 1024
    (dest / "text").mkdir()
    i = 0
    while text_bytes > 0:
        lines = []
        size = 0
        while size < 1024 * 1024:
            line = b" ".join(rnd.choices(words, k=12)) + b"\n"
            lines.append(line)
            size += len(line)
        (dest / "text" / f"doc-{i:03}.txt").write_bytes(b"".join(lines))
        text_bytes -= size
        i += 1


def timed(argv, env, cwd=None):
    subprocess.run(["sync"], check=True)
    start = time.perf_counter()
    p = subprocess.run(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - start
    if p.returncode != 0:
        sys.exit(f"bench-transport: {argv!r} failed ({p.returncode}):\n{p.stderr.decode(errors='replace')}")
    return elapsed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--xtask", help="the binary to measure (default: build the dev binary)")
    ap.add_argument("--runs", type=int, default=5, help="interleaved rounds (default 5)")
    ap.add_argument("--size-mb", type=int, default=150, help="size of the generated tree in MB (default 150)")
    ap.add_argument("--baseline", help="also time this binary's restore in the same rounds (an A/B)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench-transport: run as root (sshd, squid's user)")
    if args.xtask:
        xtask = Path(args.xtask).resolve()
    else:
        run(["cargo", "build", "-q", "-p", "warmstart"], cwd=ROOT)
        xtask = ROOT / "target/debug/warmstart"

    base = Path(tempfile.mkdtemp(prefix="warmstart-bench-transport-"))
    os.chmod(base, 0o755)
    daemons = None
    try:
        home = base / "home"
        home.mkdir()
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("GIT_") and k.lower() not in
               ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "warmstart_trace")}
        env.update(HOME=str(home), GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=str(home / ".gitconfig"),
                   GIT_AUTHOR_NAME="bench", GIT_AUTHOR_EMAIL="bench@warmstart.invalid",
                   GIT_COMMITTER_NAME="bench", GIT_COMMITTER_EMAIL="bench@warmstart.invalid",
                   GIT_TERMINAL_PROMPT="0", NO_COLOR="1")
        src = base / "src"
        log(f"bench-transport: generating {args.size_mb} MB in {src}")
        make_tree(src, args.size_mb)
        repos = base / "repos"
        repos.mkdir()
        remote = repos / "origin.git"
        run(["git", "init", "-q", "--bare", remote], env=env)
        for k, v in [("receive.unpackLimit", "1"), ("uploadpack.allowFilter", "true"), ("http.receivepack", "true")]:
            run(["git", "config", k, v], cwd=remote, env=env)
        work = base / "work"
        run(["git", "init", "-q", "-b", "main", work], env=env)
        (work / "cache-manifests").mkdir()
        (work / "cache-manifests/bench.toml").write_text(
            f'[[key]]\nname = "v"\nliteral = "bench"\n\n[pack]\nroot = {json.dumps(str(src))}\n\n'
            '[restore]\npath = "${WARMSTART_BENCH_DEST}"\n')
        run(["git", "add", "-A"], cwd=work, env=env)
        run(["git", "commit", "-q", "-m", "bench"], cwd=work, env=env)
        log("bench-transport: publishing")
        env["WARMSTART_BENCH_DEST"] = str(base / "unused")
        run([xtask, "cache", "publish", "bench", "--quiet", "--remote", remote], cwd=work, env=env)
        packed = sum(p.stat().st_size for p in (remote / "objects/pack").glob("*.pack"))
        log(f"bench-transport: the remote's packs hold {packed / 1e6:.1f} MB")

        daemons = Daemons(base / "daemons", repos)
        store = base / "git-credentials"
        store.write_text(f"https://{GIT_USER}:{GIT_PASSWORD}@127.0.0.1:{daemons.https_port}\n")
        https_cfg = (f"[http]\n\tsslCAInfo = {daemons.ca}\n"
                     f"[credential]\n\thelper = store --file={store}\n")
        (home / "https.gitconfig").write_text(https_cfg)
        (home / "proxy.gitconfig").write_text(
            https_cfg + f"[http]\n\tproxy = http://{PROXY_USER}:{PROXY_PASSWORD}@127.0.0.1:{daemons.proxy_port}\n")
        (home / "ssh.gitconfig").write_text("")
        https_url = f"https://127.0.0.1:{daemons.https_port}/origin.git"
        transports = {
            "https": (https_url, dict(env, GIT_CONFIG_GLOBAL=str(home / "https.gitconfig"))),
            "proxy": (https_url, dict(env, GIT_CONFIG_GLOBAL=str(home / "proxy.gitconfig"))),
            "ssh": (f"ssh://root@127.0.0.1:{daemons.ssh_port}{remote}",
                    dict(env, GIT_CONFIG_GLOBAL=str(home / "ssh.gitconfig"), GIT_SSH_COMMAND=daemons.ssh_command)),
        }
        names = list(transports)
        contenders = ["restore", "fetch", "fetch_kept"] + (["baseline"] if args.baseline else [])
        results = {n: {c: [] for c in contenders} for n in names}
        n_runs = 0

        def fetch(name, keep_pack=False):
            url, tenv = transports[name]
            repo = base / "fetch-repo"
            shutil.rmtree(repo, ignore_errors=True)
            run(["git", "init", "-q", "--bare", repo], env=tenv)
            # A branch of a few objects is below fetch.unpackLimit (100), so
            # plain git explodes it into loose objects, zlib-compressing
            # each again; keep_pack is git at its fastest (the pack kept
            # as received, as for any fetch of 100 objects or more).
            opts = ["-c", "fetch.unpackLimit=1"] if keep_pack else []
            return timed(["git", "--git-dir", str(repo), *opts, "fetch", "-q", "--no-tags", "--depth", "1", url,
                          f"+refs/heads/{BRANCH}:refs/heads/{BRANCH}"], tenv)

        def restore(name, binary=xtask):
            nonlocal n_runs
            url, tenv = transports[name]
            clone = base / "clone"
            dest = base / f"dest-{n_runs}"
            n_runs += 1
            shutil.rmtree(clone, ignore_errors=True)
            run(["git", "clone", "-q", work, clone], env=tenv)
            t = timed([str(binary), "cache", "restore", "bench", "--quiet", "--remote", url], dict(tenv, WARMSTART_BENCH_DEST=str(dest)), cwd=clone)
            shutil.rmtree(dest)
            shutil.rmtree(clone)
            return t

        tunnels_before = daemons.tunnels()
        for r in range(args.runs):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                pair = [("restore", restore), ("fetch", fetch), ("fetch_kept", lambda n: fetch(n, True))]
                if args.baseline:
                    baseline = Path(args.baseline).resolve()
                    pair.append(("baseline", lambda n: restore(n, baseline)))
                k = r % len(pair)
                pair = pair[k:] + pair[:k]
                for what, f in pair:
                    t = f(name)
                    results[name][what].append(t)
                    log(f"bench-transport: round {r + 1} {name} {what} {t:.2f} s")
        tunnels = daemons.tunnels() - tunnels_before
    finally:
        if daemons:
            daemons.stop()
        shutil.rmtree(base, ignore_errors=True)

    out = {"size_mb": args.size_mb, "packed_bytes": packed, "runs": args.runs, "proxy_tunnels": tunnels,
           "transports": {}}
    print(f"{args.runs} interleaved rounds, {packed / 1e6:.1f} MB on the branch; "
          f"squid carried {tunnels} tunnels\n")
    med = statistics.median
    print("Medians in seconds; ratios are medians of the per-round ratios (restore / fetch of the same round).\n")
    print("| transport | restore | git fetch --depth 1 | same, pack kept | restore / fetch | restore / fetch, pack kept |"
          + (" baseline restore | baseline / fetch, pack kept |" if args.baseline else ""))
    print("|---|---:|---:|---:|---:|---:|" + ("---:|---:|" if args.baseline else ""))
    for name in names:
        res = results[name]
        row = {k: v for k, v in res.items()}
        rs = res["restore"]
        row["ratio_fetch"] = [a / b for a, b in zip(rs, res["fetch"])]
        row["ratio_fetch_kept"] = [a / b for a, b in zip(rs, res["fetch_kept"])]
        line = (f"| {name} | {med(rs):.2f} | {med(res['fetch']):.2f} | {med(res['fetch_kept']):.2f} | "
                f"{med(row['ratio_fetch']):.2f} | {med(row['ratio_fetch_kept']):.2f} |")
        if args.baseline:
            row["baseline_ratio_fetch_kept"] = [a / b for a, b in zip(res["baseline"], res["fetch_kept"])]
            line += f" {med(res['baseline']):.2f} | {med(row['baseline_ratio_fetch_kept']):.2f} |"
        out["transports"][name] = row
        print(line)
    print("\nPer round (restore / fetch, pack kept):\n")
    print("| transport | " + " | ".join(f"round {r + 1}" for r in range(args.runs)) + " |")
    print("|---|" + "---:|" * args.runs)
    for name in names:
        print(f"| {name} | " + " | ".join(f"{x:.2f}" for x in out["transports"][name]["ratio_fetch_kept"]) + " |")
    print()
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
