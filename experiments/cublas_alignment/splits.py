"""cuBLAS's alignment-1 GEMMs, as run against as planned: each GEMM's tile and the parts its reduction was split into.

    PYTHONPATH=. python experiments/cublas_alignment/splits.py [--set calibration] [--records FOLDER ...]

For every naive and eager (torch_naive) record of the set whose GEMMs are CUTLASS's alignment-1 kernels: per GEMM, the
tile in its kernel's name and, where a `splitKreduce_kernel` follows it, the parts it was split into, read back from
that kernel's DRAM reads (fp32 partials of the GEMM's rows x d output; Nsight Compute flushes the caches before each
kernel, so every partial is read from DRAM); beside them the tile and parts iosim plans (`Cublas.align1_tile`,
`Cublas.splits`). The GEMMs are matched to the plan's in order; a record whose GEMM count differs is listed unmatched.
"""
from __future__ import annotations

import argparse
import re
from collections import Counter

from iosim.hardware import load_profile
from iosim.kernels.catalogue import planned
from iosim.plan import build_plan
from iosim.plan.align1 import Align1Gemm
from iosim.records import load_all
from iosim.workload import AttentionConfig

NAME = re.compile(r"cutlass_\w*?gemm_\w*?_(\d+)x(\d+)_(\w\w)_align1")


def rows(which: str, folders: list[str] | None) -> list[dict]:
    hw = load_profile("h200_sxm.calibrated")
    out = []
    for rec in load_all(folders):
        if rec.get("set") != which or rec["algorithm"] not in ("naive", "torch_naive") or not rec.get("ncu"):
            continue
        ks = rec["ncu"]["kernels"]
        if not any(NAME.search(k["name"]) for k in ks):
            continue
        cfg = AttentionConfig.make(**rec["config"])
        alg, _ = planned(rec["algorithm"], cfg, None, hw.sm_count)
        gemms = [k for k in build_plan(cfg, alg, hw).kernels if isinstance(k, Align1Gemm)]
        ran = []
        for i, k in enumerate(ks):
            hit = NAME.search(k["name"])
            if not hit:
                continue
            parts = 1
            if i + 1 < len(ks) and "splitKreduce" in ks[i + 1]["name"]:
                parts = -1   # the output's rows x d is the plan's; filled in when matched
            ran.append((f"{hit[1]}x{hit[2]}", hit[3], parts, ks[i + 1]["dram__bytes_read.sum"] if parts < 0 else 0))
        matched = len(ran) == len(gemms)
        for j, (tile, layout, parts, reduce_read) in enumerate(ran):
            row = {"record": rec["key"], "gemm": j, "layout": layout, "tile": tile, "parts": parts}
            if matched:
                g = gemms[j]
                t = g.tiles[g.kind]
                if parts < 0:
                    row["parts"] = round(reduce_read / (g.cfg.bh * g.cfg.seqlen_q * g.cfg.head_dim * 4))
                row |= {"planned": g.name, "planned_tile": f"{t.m}x{t.n}", "planned_parts": g.splits}
            out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", default="calibration")
    ap.add_argument("--records", nargs="+", default=None, help="record folders (default: every record set)")
    args = ap.parse_args()
    rs = rows(args.set, args.records)
    print(f"{'record':<52}{'GEMM':<10}{'ran':>16}{'planned':>16}")
    for r in rs:
        ran = f"{r['layout']} {r['tile']} /{r['parts']}"
        plan = f"{r['planned_tile']} /{r['planned_parts']}" if "planned" in r else "unmatched"
        print(f"{r['record'][:51]:<52}{r.get('planned', '?'):<10}{ran:>16}{plan:>16}")
    m = [r for r in rs if "planned" in r]
    print(f"{len(m)} of {len(rs)} GEMMs matched; tile as run {sum(r['tile'] == r['planned_tile'] for r in m)}, "
          f"parts as run {sum(r['parts'] == r['planned_parts'] for r in m)}; parts of the split GEMMs: "
          f"{dict(sorted(Counter(r['parts'] for r in rs if r['parts'] != 1).items()))}")


if __name__ == "__main__":
    main()
