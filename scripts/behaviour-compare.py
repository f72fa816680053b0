#!/usr/bin/env python3
"""Compares two behaviour snapshots (scripts/behaviour-snapshot.sh): exit codes, verdicts,
confidences, evidence and every number of the --json output to a tolerance (default 1e-9),
ignoring wall times. Prints each difference and exits 1 if there is any.
Usage: scripts/behaviour-compare.py BEFORE AFTER [--tol 1e-9]"""
import json, math, os, sys

TIMING_KEYS = {"timings", "seconds", "elapsed", "wall_seconds"}
# what names the build rather than the run: the binary's path and the commit it was built from
IGNORED_PATHS = {"$.provenance.git_hash", "$.provenance.command[0]"}


def diff(a, b, path, tol, out):
    if path in IGNORED_PATHS:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k in TIMING_KEYS:
                continue
            if k not in a or k not in b:
                out.append(f"{path}.{k}: only in {'after' if k in b else 'before'}")
            else:
                diff(a[k], b[k], f"{path}.{k}", tol, out)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(f"{path}: length {len(a)} -> {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            diff(x, y, f"{path}[{i}]", tol, out)
    elif isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        if math.isnan(a) and math.isnan(b):
            return
        if abs(a - b) > tol * max(1.0, abs(a), abs(b)):
            out.append(f"{path}: {a!r} -> {b!r}")
    elif a != b:
        out.append(f"{path}: {a!r} -> {b!r}")


def main():
    args = sys.argv[1:]
    tol = 1e-9
    if "--tol" in args:
        i = args.index("--tol")
        tol = float(args[i + 1])
        del args[i : i + 2]
    before, after = args
    names = sorted(n[:-3] for n in os.listdir(before) if n.endswith(".rc"))
    bad = 0
    for n in names:
        out = []
        rc = [open(os.path.join(d, n + ".rc")).read().strip() for d in (before, after)]
        if rc[0] != rc[1]:
            out.append(f"exit {rc[0]} -> {rc[1]}")
        docs = []
        for d in (before, after):
            text = open(os.path.join(d, n + ".json")).read()
            try:
                docs.append(json.loads(text) if text.strip() else None)
            except json.JSONDecodeError:
                docs.append(("not json", text[:200]))
        diff(docs[0], docs[1], "$", tol, out)
        if rc[0] == "2":  # refused: the one-line message is the output
            e = [open(os.path.join(d, n + ".err")).read().strip() for d in (before, after)]
            if e[0] != e[1]:
                out.append(f"stderr {e[0]!r} -> {e[1]!r}")
        if out:
            bad += 1
            print(f"case {n}: {len(out)} differences")
            for line in out[:12]:
                print("   ", line)
    print(f"{len(names)} cases, {bad} differ (tolerance {tol:g})")
    sys.exit(1 if bad else 0)


main()
