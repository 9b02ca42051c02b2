"""A 10,000-point sweep's time on one worker and on two, and the speed-up, in one run.

    python benchmarks/sweep_speed.py [--workers 1 2] [--json out.json]

The spec: 5 profiles x 5 HBM bandwidths (x0.5 ... x2) x 40 layers (N 256 ... 4,096, d 64 and 128, causal or not,
batch 2 or 8, 16 heads) x 5 algorithms x 2 passes (forward, training step). Each run starts from nothing (no
--out folder), on local worker processes (one worker: in this process).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time

from iosim.sweep import parse_spec, points, run_sweep

SPEC = {
    "sweep": {"profiles": ["a100_40gb", "a100_80gb", "h100_pcie", "h100_sxm", "h200_sxm"],
              "algorithms": ["naive", "flash1", "flash2", "eager", "torch_flash"],
              "passes": ["forward", "forward+backward"]},
    "what_if": {"scale": {"hbm_bandwidth_gb_s": [0.5, 0.75, 1.0, 1.5, 2.0]}},
    "layers": [{"name": "sweep", "batch": [2, 8], "heads": 16, "seqlen_q": [256, 512, 1024, 2048, 4096],
                "head_dim": [64, 128], "causal": [False, True]}],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    spec = parse_spec(SPEC)
    n = len(points(spec))
    out = {"points": n, "cores": os.cpu_count(), "python": platform.python_version(), "seconds": {}}
    for w in args.workers:
        t = time.perf_counter()
        df = run_sweep(spec, None, workers=w)
        out["seconds"][w] = time.perf_counter() - t
        ok = int(df["error"].isna().sum())
        print(f"{n} points, {w} worker{'s' if w > 1 else ''}: {out['seconds'][w]:.0f} s "
              f"({ok} predicted, {n - ok} refused by their plan)", flush=True)
    if 1 in out["seconds"] and len(out["seconds"]) > 1:
        for w, s in out["seconds"].items():
            if w != 1:
                print(f"speed-up, {w} workers over 1: {out['seconds'][1] / s:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
