#!/usr/bin/env python3
"""Benchmark of what trust (issue 16) costs: signing at publish, checking at a cold restore.

A bare remote set up like a hosting server (receive.unpackLimit 1) holds one
cache branch with 4 cache keys (4 literal pins, ~4 MB of noise each), every
key signed by an ed25519 key made here with ssh-keygen and listed in a
committed cache-manifests/allowed_signers, policy "require".

- Publish: each of the 4 publishes reports `timings_ms.sign` (statement,
  `ssh-keygen -Y sign`, and the check of the new signature against HEAD's
  allowed signers) and `timings_ms.check_kept` (the check of the other keys
  the branch keeps: 0, 1, 2, then 3 of them). Their sum is what signing adds.
- The same with no memo of verified signatures (a fresh clone publishing
  key 4 again while 3 kept keys must be checked), 3 times.
- Cold restore: the stamp and the install are removed before each run (the
  chunks stay in .git/warmstart/cache.git, so the run measures restore work,
  not the network); `timings_ms.trust` is the check between the branch fetch
  and the first chunk. Runs alternate between the manifest's `[trust] policy`
  "require" and "off" (A B A B ...), and the medians of their whole durations
  are compared too.
- Warm restore: `signature_checks` must be 0.

It measures the dev build (target/debug/xtask, what `cargo xtask` runs) and
asserts nothing about times; it prints a Markdown table and JSON.

    tools/bench-trust.py [--runs 7] [--json out.json]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sh(args, cwd=None, env=None, check=True):
    p = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    if check and p.returncode != 0:
        sys.exit(f"failed: {args}\n{p.stdout}\n{p.stderr}")
    return p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--json")
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/debug/xtask"))
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-trust-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMSTART_")}
    env.update(
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.path.join(tmp, "none"),
        GIT_AUTHOR_NAME="b",
        GIT_AUTHOR_EMAIL="b@b.invalid",
        GIT_COMMITTER_NAME="b",
        GIT_COMMITTER_EMAIL="b@b.invalid",
    )
    try:
        result = bench(a, tmp, env)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(table(result))
    out = json.dumps(result, indent=2)
    if a.json:
        with open(a.json, "w") as f:
            f.write(out + "\n")
    print(out)


def bench(a, tmp, env):
    remote, work = os.path.join(tmp, "origin.git"), os.path.join(tmp, "work")
    sh(["git", "init", "-q", "--bare", remote], env=env)
    sh(["git", "-C", remote, "config", "receive.unpackLimit", "1"], env=env)
    sh(["git", "-C", remote, "config", "uploadpack.allowFilter", "true"], env=env)
    sh(["git", "-C", remote, "config", "uploadpack.allowReachableSHA1InWant", "true"], env=env)
    sh(["git", "init", "-q", "-b", "main", work], env=env)
    sh(["git", "-C", work, "remote", "add", "origin", remote], env=env)
    key = os.path.join(tmp, "ci")
    sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ci", "-f", key])
    man = os.path.join(work, "cache-manifests")
    os.makedirs(man)
    with open(os.path.join(man, "allowed_signers"), "w") as f:
        f.write("ci " + open(key + ".pub").read())
    with open(os.path.join(man, "trust.toml"), "w") as f:
        f.write('policy = "require"\n')
    sh(["git", "-C", work, "add", "-A"], env=env)
    sh(["git", "-C", work, "commit", "-q", "-m", "trust root"], env=env)

    def manifest(literal, policy="require"):
        src = os.path.join(tmp, f"src-{literal}")
        with open(os.path.join(man, "art.toml"), "w") as f:
            f.write(
                f'[[key]]\nname = "v"\nliteral = "{literal}"\n\n[pack]\nroot = "{src}"\n\n'
                f'[restore]\npath = "restored/art"\n\n[trust]\npolicy = "{policy}"\n'
            )
        return src

    def xtask(*args):
        p = sh([a.bin, *args], cwd=work, env=env)
        return json.loads(p.stdout)

    publishes = []
    for i in range(1, 5):
        src = manifest(str(i))
        os.makedirs(os.path.join(src, "bin"))
        with open(os.path.join(src, "noise.bin"), "wb") as f:
            f.write(os.urandom(4 << 20))
        with open(os.path.join(src, "bin", "tool"), "w") as f:
            f.write(f"#!/bin/sh\necho {i}\n")
        s = xtask("cache", "publish", "art", "--json", "--signing-key", key)
        t = s["timings_ms"]
        publishes.append(
            {
                "key": s["key"],
                "sign_ms": t["sign"],
                "check_kept_ms": t.get("check_kept", 0),
                "total_ms": s["duration_ms"],
            }
        )
        print(f"published {s['key']}: {t}", file=sys.stderr)

    state = os.path.join(work, ".git", "warmstart")
    # The worst case: a clone that never verified the 3 kept keys (no memo
    # in .git/warmstart/trust) republishes key 4 with new bytes.
    fresh = []
    for r in range(3):
        shutil.rmtree(os.path.join(state, "trust"), ignore_errors=True)
        with open(os.path.join(src, "noise.bin"), "wb") as f:
            f.write(os.urandom(4 << 20))
        s = xtask("cache", "publish", "art", "--json", "--signing-key", key)
        t = s["timings_ms"]
        fresh.append({"sign_ms": t["sign"], "check_kept_ms": t["check_kept"], "total_ms": s["duration_ms"]})
    cold = {"require": [], "off": []}
    for r in range(a.runs):
        for policy in ("require", "off"):
            manifest("4", policy)
            shutil.rmtree(os.path.join(state, "cache", "stamps"), ignore_errors=True)
            shutil.rmtree(os.path.join(state, "trust"), ignore_errors=True)
            shutil.rmtree(os.path.join(work, "restored"), ignore_errors=True)
            o = xtask("cache", "restore", "art", "--json")
            assert o["state"] == "restored", o
            cold[policy].append(
                {
                    "duration_ms": o["duration_ms"],
                    "trust_ms": o["timings_ms"]["trust"],
                    "signature_checks": o["signature_checks"],
                }
            )
    manifest("4", "require")
    warm = [xtask("cache", "restore", "art", "--json") for _ in range(5)]
    assert all(w["state"] == "warm" for w in warm), warm
    med = lambda xs: statistics.median(xs)
    return {
        "keys_on_branch": 4,
        "runs": a.runs,
        "publish": publishes,
        "publish_fresh_clone": fresh,
        "publish_fresh_sign_plus_check_ms_median": med([p["sign_ms"] + p["check_kept_ms"] for p in fresh]),
        "publish_sign_plus_check_ms_median": med([p["sign_ms"] + p["check_kept_ms"] for p in publishes]),
        "publish_sign_plus_check_ms_max": max(p["sign_ms"] + p["check_kept_ms"] for p in publishes),
        "cold_trust_ms_median": med([c["trust_ms"] for c in cold["require"]]),
        "cold_trust_ms_max": max(c["trust_ms"] for c in cold["require"]),
        "cold_require_ms_median": med([c["duration_ms"] for c in cold["require"]]),
        "cold_off_ms_median": med([c["duration_ms"] for c in cold["off"]]),
        "cold_signature_checks": sorted({c["signature_checks"] for c in cold["require"]}),
        "warm_signature_checks": sorted({w["signature_checks"] for w in warm}),
        "warm_ms_median": med([w["duration_ms"] for w in warm]),
    }


def table(r):
    rows = [
        ("publish: sign + check kept keys (median of 4, ms)", r["publish_sign_plus_check_ms_median"]),
        ("publish: sign + check kept keys (max, 4th key checks 3 others, ms)", r["publish_sign_plus_check_ms_max"]),
        ("publish, no memo: sign + check 3 kept keys (median of 3, ms)", r["publish_fresh_sign_plus_check_ms_median"]),
        ("cold restore: trust check (median, ms)", r["cold_trust_ms_median"]),
        ("cold restore: trust check (max, ms)", r["cold_trust_ms_max"]),
        ("cold restore, policy require (median, ms)", r["cold_require_ms_median"]),
        ("cold restore, policy off (median, ms)", r["cold_off_ms_median"]),
        ("cold restore: signature_checks", r["cold_signature_checks"]),
        ("warm restore: signature_checks", r["warm_signature_checks"]),
        ("warm restore (median, ms)", r["warm_ms_median"]),
    ]
    return "| measure | value |\n|---|---:|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows)


if __name__ == "__main__":
    main()
