"""cuBLAS's GEMMs in the calibration records: which kernel cuBLAS ran, at what rate, and what iosim predicts of it.

    PYTHONPATH=. python experiments/cublas_alignment/survey.py [--set calibration] [--out survey.json]

For every naive and eager (torch_naive) record of the set, each GEMM kernel Nsight Compute timed: its variant (nvjet
for Hopper's own kernels; CUTLASS's sm75/sm80 kernels by their operand alignment, `align1`, `align2`, ...), whether a
split-K reduce kernel follows it, its measured time, its matmul FLOPs (the plan's) and the rate they give, and
iosim's predicted time for it (the record's kernels matched to the plan's in order, where the counts agree). Prints the rate and the predicted / measured ratio by variant, and for the align1 GEMMs of grids of 128 or more
(batch, head) pairs a least-squares fit of their time as a sum, t = a F + b B (F their matmul FLOPs, B the bytes of
their N x N operand), apart for those that write it (`tn`) and those that read it (`nn`, `nt`). Records are predicted as
`iosim validate` predicts them (cold L2 each kernel, the fitted traits, every block).
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
from datetime import datetime, timezone
from collections import defaultdict

from iosim.engine import simulate
from iosim.hardware import load_profile
from iosim.kernels.catalogue import planned, run_traits
from iosim.plan import Tiling
from iosim.records import load_all
from iosim.fit import load as load_traits
from iosim.validate import recorded_gemm_tiles
from iosim.workload import AttentionConfig

GEMM = re.compile(r"nvjet|gemm")


def variant(name: str) -> str:
    """nvjet, or CUTLASS's architecture and alignment (`sm75 align1`); '' for a kernel that is no GEMM."""
    if "nvjet" in name:
        return "nvjet"
    hit = re.search(r"cutlass_(\d+)_\w*?_align(\d+)", name)
    if hit:
        return f"sm{hit[1]} align{hit[2]}"
    return "other gemm" if GEMM.search(name) else ""


def survey(which: str) -> list[dict]:
    hw = load_profile("h200_sxm.calibrated")
    fitted = load_traits(hw) or {}
    out = []
    for rec in load_all():
        if rec.get("set") != which or rec["algorithm"] not in ("naive", "torch_naive") or not rec.get("ncu"):
            continue
        cfg = AttentionConfig.make(**rec["config"])
        tiling = Tiling.make(**rec["tiling"]) if rec.get("tiling") else None
        alg, tiling = planned(rec["algorithm"], cfg, tiling, hw.sm_count)
        kt = run_traits(rec["algorithm"], cfg, tiling, fitted, hw.clock_hz)
        n = rec["ncu"]
        r = simulate(cfg, alg, hw, tiling, traits=kt, cold_l2=True, max_steps=4, exact=True,
                     gemm_tiles=recorded_gemm_tiles(n) if alg == "naive" and cfg.pass_ == "forward" else None)
        measured = n["kernels"]
        matched = len(measured) == len(r.kernels)
        for i, k in enumerate(measured):
            v = variant(k["name"])
            if not v:
                continue
            split = i + 1 < len(measured) and "splitKreduce" in measured[i + 1]["name"]
            row = {"record": rec["key"], "seqlen_k": cfg.seqlen_k, "dtype": cfg.dtype, "kernel": k["name"][:90],
                   "variant": v, "split_k": split, "measured_s": k["gpu__time_duration.sum"],
                   "reduce_s": measured[i + 1]["gpu__time_duration.sum"] if split else 0.0}
            if matched:
                p = r.kernels[i]
                row |= {"planned": p.name, "predicted_s": p.time_s, "mma_flops": p.mma_flops,
                        "tflops": p.mma_flops / k["gpu__time_duration.sum"] / 1e12}
            out.append(row)
    return out


def additive_fit(rows: list[dict]) -> dict[str, dict]:
    """Per direction of the N x N operand: (a, b) of t = a F + b B over the align1 GEMMs of >= 128 pairs, as a rate
    (TFLOP/s, TB/s), with each GEMM's relative residual."""
    import numpy as np
    out = {}
    for way, layouts in (("writes N x N (tn)", ("tn",)), ("reads N x N (nn, nt)", ("nn", "nt"))):
        use = []
        for r in rows:
            hit = re.match(r"B(\d+)_H(\d+)_N(\d+)_", r["record"])
            lay = re.search(r"_(\w\w)_align", r["kernel"])
            b, h, n = (int(x) for x in hit.groups())
            if r["variant"] == "sm75 align1" and r.get("mma_flops") and b * h >= 128 and lay[1] in layouts:
                use.append((r["mma_flops"], b * h * n * n * (2 if r["dtype"] in ("fp16", "bf16") else 4),
                            r["measured_s"], r["record"]))
        if len(use) < 2:
            continue
        x = np.array([[f, nb] for f, nb, _, _ in use], dtype=float)
        t = np.array([m for _, _, m, _ in use])
        (a, b), *_ = np.linalg.lstsq(x, t, rcond=None)
        res = (x @ np.array([a, b]) - t) / t
        out[way] = {"gemms": len(use), "tflops": 1e-12 / a if a > 0 else float("inf"), "tb_s": 1e-12 / b,
                    "residuals": [float(e) for e in res]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", default="calibration")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = survey(args.set)
    by = defaultdict(list)
    for r in rows:
        by[r["variant"]].append(r)
    print(f"{'variant':<14}{'GEMMs':>6}{'split-K':>8}{'matched':>8}  {'TFLOP/s median (range)':<26}"
          f"{'predicted/measured median (range)'}")
    for v, rs in sorted(by.items()):
        m = [r for r in rs if "tflops" in r and r["mma_flops"]]
        tf = sorted(r["tflops"] for r in m)
        ratio = sorted(r["predicted_s"] / r["measured_s"] for r in m)
        fmt = (lambda xs, f: f"{statistics.median(xs):{f}} ({xs[0]:{f}}-{xs[-1]:{f}})" if xs else "-")
        print(f"{v:<14}{len(rs):>6}{sum(r['split_k'] for r in rs):>8}{len(m):>8}  {fmt(tf, '.0f'):<26}"
              f"{fmt(ratio, '.2f')}")
    for way, f in additive_fit(rows).items():
        res = f["residuals"]
        print(f"align1, {way}: {f['gemms']} GEMMs of >= 128 pairs, t = F / ({f['tflops']:.0f} TFLOP/s) + "
              f"B / ({f['tb_s']:.2f} TB/s), residuals {min(res):+.1%} to {max(res):+.1%}")
    if args.out:
        with open(args.out, "w") as f:
            commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
            json.dump({"provenance": {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                      "commit": commit, "method": f"experiments/cublas_alignment/survey.py --set "
                                                                  f"{args.set}: the stored records' Nsight times, "
                                                                  "iosim's predictions at this commit"},
                       "set": args.set, "profile": "h200_sxm.calibrated", "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
