"""L2 bytes the 64-row-chunk d 128 backward builds add over the 32-row ones, a (query block, key tile) visit.

    git worktree add /tmp/old 580efe6     # or any checkout holding the first take of h200_backward_ours
    python experiments/l2_counters/bwd_spill_delta.py /tmp/old/reports/measurements/h200_backward_ours \\
        reports/measurements/h200_backward_ours

The two takes of `h200_backward_ours` ran the same configurations on the same H200; at d 128 only the main
kernel's build changed (query chunks of 32 -> 64 rows, `gpu_kernels.build.QUERY_CHUNK`), and the new build
spills registers (ptxas: 40-60 bytes a thread) where the old one did not. Its extra `lts__t_bytes` divided by the
visits iosim's plan counts is the spill traffic a visit; calibration records only (the model is decided on them).
Causal and non-causal grids run separate builds, so each has its own figure.
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from experiments.l2_counters.bwd_spills import visits  # noqa: E402
from iosim.workload import AttentionConfig  # noqa: E402


def main_kernel(rec: dict) -> dict:
    return next(k for k in rec["ncu"]["kernels"] if "_bwd<" in k["name"] and "flash" in k["name"])


def main(old: Path, new: Path) -> None:
    per: dict[tuple[str, bool], list[float]] = {}
    for f in sorted(new.glob("*_d128_*.json")):
        rec = json.loads(f.read_text())
        if rec["algorithm"] == "naive" or rec["set"] != "calibration":
            continue
        cfg = AttentionConfig(**rec["config"])
        v = visits(cfg)
        extra = main_kernel(rec)["lts__t_bytes.sum"] - main_kernel(json.loads((old / f.name).read_text()))[
            "lts__t_bytes.sum"]
        per.setdefault((rec["algorithm"], cfg.causal), []).append(extra / v)
        print(f"{f.name[:60]:<62}{v:>8} visits {extra / v:8.0f} B/visit")
    for (alg, causal), v in sorted(per.items()):
        print(f"{alg} {'causal' if causal else 'full':<7} n {len(v):>2}  median {statistics.median(v):6.0f} "
              f"B/visit  [{min(v):.0f}, {max(v):.0f}]")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
