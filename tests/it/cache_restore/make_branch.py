#!/usr/bin/env python3
"""Writes the files of a v1 cache branch without warmstart's publisher.

An independent implementation of docs/format.md (format 1) for the
restore tests: python's tarfile for the tar, the zstd CLI for compression,
python for chunking and digests. Hostile archives (entries a restorer must
refuse) are made from a JSON spec, which tarfile writes as given.

usage: make_branch.py OUT_DIR SPEC_JSON

SPEC_JSON: {"chunk_bytes": N, "keys": {KEY: KEYSPEC, ...}}
KEYSPEC:   {"dir": PATH}            tar the tree at PATH (sorted, as ".")
        or {"entries": [ENTRY...]}  tar exactly these entries
           optional "parts": [{"name", "value"}], "declare_tar_size": N
ENTRY:     {"name", "type": file|dir|symlink|hardlink|chr, "data": TEXT,
            "size": N (pseudo-random bytes), "mode": INT, "link": TARGET}
"""
import hashlib
import io
import json
import os
import random
import subprocess
import sys
import tarfile


def tar_bytes(keyspec):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        if "dir" in keyspec:
            root = keyspec["dir"]

            def reset(ti):
                ti.uid = ti.gid = 0
                ti.uname = ti.gname = ""
                ti.mtime = 946684800
                return ti

            tar.add(root, arcname=".", filter=reset)
        else:
            for e in keyspec["entries"]:
                ti = tarfile.TarInfo(e["name"])
                ti.mode = e.get("mode", 0o644)
                ti.mtime = 946684800
                kind = e.get("type", "file")
                data = None
                if kind == "file":
                    if "size" in e:
                        data = random.Random(e["name"]).randbytes(e["size"])
                    else:
                        data = e.get("data", "").encode()
                    ti.size = len(data)
                elif kind == "dir":
                    ti.type = tarfile.DIRTYPE
                    ti.mode = e.get("mode", 0o755)
                elif kind == "symlink":
                    ti.type = tarfile.SYMTYPE
                    ti.linkname = e["link"]
                elif kind == "hardlink":
                    ti.type = tarfile.LNKTYPE
                    ti.linkname = e["link"]
                elif kind == "chr":
                    ti.type = tarfile.CHRTYPE
                    ti.devmajor, ti.devminor = 1, 3
                else:
                    raise SystemExit(f"unknown entry type {kind}")
                tar.addfile(ti, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def main():
    out, spec_path = sys.argv[1], sys.argv[2]
    with open(spec_path) as f:
        spec = json.load(f)
    chunk_bytes = spec.get("chunk_bytes", 99 * 1024 * 1024)
    os.makedirs(out, exist_ok=True)
    manifest = {"format": 1, "keys": {}}
    sums = []
    for key, keyspec in sorted(spec["keys"].items()):
        tar = tar_bytes(keyspec)
        members = len(tarfile.open(fileobj=io.BytesIO(tar)).getmembers())
        z = subprocess.run(
            ["zstd", "-q", "-3", "-c"], input=tar, stdout=subprocess.PIPE, check=True
        ).stdout
        chunks = []
        for i in range(0, max(len(z), 1), chunk_bytes):
            name = f"{key}.tar.zst.part{i // chunk_bytes:03d}"
            piece = z[i : i + chunk_bytes]
            with open(os.path.join(out, name), "wb") as f:
                f.write(piece)
            digest = hashlib.sha256(piece).hexdigest()
            chunks.append({"file": name, "size": len(piece), "sha256": digest})
            sums.append((name, digest))
        manifest["keys"][key] = {
            "archive": f"{key}.tar.zst",
            "compression": "zstd",
            "chunks": chunks,
            "tar_sha256": hashlib.sha256(tar).hexdigest(),
            "tar_size": keyspec.get("declare_tar_size", len(tar)),
            "files": members,
            "key_parts": keyspec.get("parts", []),
            "source_commit": None,
            "source_tree": None,
            "gates": None,
            "ungated": True,
            "created_at": "2026-11-30T00:00:00Z",
            "tool_version": "make_branch.py",
        }
    with open(os.path.join(out, "warmstart.json"), "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    with open(os.path.join(out, "SHA256SUMS"), "w") as f:
        for name, digest in sorted(sums):
            f.write(f"{digest}  {name}\n")
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write("test cache branch made by make_branch.py\n")


if __name__ == "__main__":
    main()
