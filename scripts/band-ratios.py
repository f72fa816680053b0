#!/usr/bin/env python3
"""Per results.json of `kvprobe diagnose --json`: how far the device's tbt steps and prefill rows
sit from the precision-matched reference, against the band of today's `leaves_matched` and
against a band of the floors alone (docs/diagnosis.md, Known limits: the band question).

    scripts/band-ratios.py DIR_OR_RESULTS_JSON...

Columns: verdict; greedy median / worst step ratio and the fail flag (`leaves_matched`: mean miss
≥ MATCHED_GAP and median ratio ≥ PRECISION_RATIO, or one step ≥ LONE_STEP_RATIO with a miss ≥
LONE_STEP_GAP) under
  now    (1 − md) / (max(1 − rm, STEP_NOISE_FLOOR) + graph noise), graph noise as stateful.rs
         takes it: the larger of the prefill's and the self-only steps' miss against f32 (a ring
         device takes the smaller of the self-only steps' and the single-chunk rows': the
         results do not say which path ran, so read this column as the stateful one);
  floor  (1 − md) / (STEP_NOISE_FLOOR + REL_NOISE_FLOOR);
  pm     (1 − md) / (STEP_NOISE_FLOOR + the prefill rows' mean miss against the matched reference);
  jit    (1 − md) / (max(1 − jitter, STEP_NOISE_FLOOR) + graph noise against the matched
         reference): the jitter control (probes/src/matched_jitter.rs), jitter = the step's
         `matched.jitter`, graph noise = the larger of the prefill rows' and the self-only steps'
         mean miss against the matched reference (`selfmask.matched_mean_cosine`); "-" where a
         result has no jitter (the control did not apply);
and the prefill rows' median ratio now / at the floor / under the jitter control (its band: the
row's jitter + REL_NOISE_FLOOR). rm = f32 vs matched, md = matched vs device. "now" is the band
before the jitter control.
The constants are thresholds.rs's, copied here: this script reads results, it decides nothing.
"""
import json
import os
import statistics
import sys

STEP_NOISE_FLOOR, REL_NOISE_FLOOR = 1e-4, 1e-5
PRECISION_RATIO, MATCHED_GAP = 2.5, 2e-4
LONE_STEP_RATIO, LONE_STEP_GAP = 25.0, 2e-3


def judge(rows, band):
    """(median ratio, worst ratio, fails) of `leaves_matched` with a per-row band."""
    if not rows:
        return None
    ratios = [(1 - md) / band(rm) for rm, md in rows]
    mean_miss = sum(1 - md for _, md in rows) / len(rows)
    lone = any(1 - md >= LONE_STEP_GAP and r >= LONE_STEP_RATIO for (_, md), r in zip(rows, ratios))
    med = sorted(ratios)[len(ratios) // 2]
    return med, max(ratios), mean_miss >= MATCHED_GAP and (lone or med >= PRECISION_RATIO)


def pairs(items, key="reference_vs_matched"):
    return [(m.get(key), m["matched_vs_device"]) for m in
            (i.get("matched") for i in items) if m]


def jittered(items):
    """(jitter, md) per item, or [] when any item has no jitter."""
    j = pairs(items, "jitter")
    return j if j and all(b is not None for b, _ in j) else []


def fmt(j):
    return "-" if j is None else f"{j[0]:.2f}/{j[1]:.1f}{' FAIL' if j[2] else ''}"


def one(path):
    d = json.load(open(path))
    p = d["probes"]
    steps = (p.get("greedy") or {}).get("steps", [])[1:]
    g = pairs(steps)
    rows = pairs((p.get("prefill") or {}).get("rows", []))
    pf = p.get("prefill") or {}
    sm = p.get("selfmask") or {}
    noise = [REL_NOISE_FLOOR]
    if pf.get("mean_cosine") is not None:
        noise.append(1 - pf["mean_cosine"])
    if sm.get("mean_cosine") is not None:
        noise.append(1 - sm["mean_cosine"])
    gn = max(noise)
    pm = max([REL_NOISE_FLOOR] + ([statistics.mean(1 - md for _, md in rows)] if rows else []))
    gj = jittered(steps)
    rj = jittered((p.get("prefill") or {}).get("rows", []))
    sm_m = sm.get("matched_mean_cosine")
    gn_j = max([REL_NOISE_FLOOR] + ([statistics.mean(1 - md for _, md in rows)] if rows else [])
               + ([1 - sm_m] if sm_m is not None else []))
    jit_mean = statistics.mean(1 - b for b, _ in gj) if gj else float("nan")
    rm_mean = statistics.mean(1 - rm for rm, _ in g) if g else float("nan")
    md_mean = statistics.mean(1 - md for _, md in g) if g else float("nan")
    return [
        os.path.basename(os.path.dirname(os.path.abspath(path))),
        d.get("verdict") or "incomplete",
        f"{rm_mean:.1e}",
        f"{md_mean:.1e}",
        f"{gn:.1e}",
        fmt(judge(g, lambda rm: max(1 - rm, STEP_NOISE_FLOOR) + gn)),
        fmt(judge(g, lambda rm: STEP_NOISE_FLOOR + REL_NOISE_FLOOR)),
        fmt(judge(g, lambda rm: STEP_NOISE_FLOOR + pm)),
        f"{jit_mean:.1e}",
        f"{gn_j:.1e}",
        fmt(judge(gj, lambda b: max(1 - b, STEP_NOISE_FLOOR) + gn_j) if gj else None),
        fmt(judge(rows, lambda rm: max(1 - rm, STEP_NOISE_FLOOR) + REL_NOISE_FLOOR)),
        fmt(judge(rows, lambda rm: STEP_NOISE_FLOOR + REL_NOISE_FLOOR)),
        fmt(judge(rj, lambda b: max(1 - b, STEP_NOISE_FLOOR) + REL_NOISE_FLOOR) if rj else None),
    ]


def main():
    paths = []
    for a in sys.argv[1:]:
        paths.append(os.path.join(a, "results.json") if os.path.isdir(a) else a)
    head = ["case", "verdict", "f32-vs-matched", "matched-vs-dev", "graph noise",
            "greedy now", "greedy floor", "greedy pm", "jitter miss", "noise vs matched",
            "greedy jit", "prefill now", "prefill floor", "prefill jit"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for path in paths:
        try:
            print("| " + " | ".join(one(path)) + " |")
        except (OSError, KeyError, ValueError) as e:
            print(f"| {path} | unreadable: {e} |", file=sys.stderr)


if __name__ == "__main__":
    main()
