"""Fit `counters.H200.merge_share` (the share of a first wave's repeated reads that L2's counters see) on the calibration
records' L2 bytes, flash2 and PyTorch's flash kernel together; nothing of the validation set is read.

    python experiments/l2_counters/fit_l2_merge.py [--json FILE]      # about 5 minutes on one core; prints a table

The engine takes the share off the bytes L2 counts and nothing else (time, HBM bytes stay), linearly: a kernel
counts `requested - repeats * (1 - share) * f`, f fixed by its tiling and grid (`KernelRun._merged_share`; f is at
most 1 for the calibration records' 64- and 128-row blocks, so no count is clipped). So two runs of the
calibration records, at share 1 and 0.75, give every record's count at any share of the grid; the grid picks the
share with the least mean absolute error over the records of both kernels.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from iosim import counters, fit, validate  # noqa: E402
from iosim.hardware import load_profile  # noqa: E402

FOLDERS = [ROOT / "reports/measurements/h200", ROOT / "reports/measurements/h200_calibration2"]
ALGORITHMS = ("flash2", "torch_flash")
GRID = [round(0.05 * i, 2) for i in range(1, 21)]


def counts(hw, traits, records, share: float) -> dict[str, tuple[str, float, float]]:
    """key -> (algorithm, predicted L2 bytes, measured L2 bytes), with Nsight's merge share at `share`."""
    counters.BY_CHIP["h200_sxm"] = counters.H200.model_copy(update={"merge_share": share})
    rows = validate.validate(records, hw, "calibration", traits)
    return {r.key: (r.algorithm, r.pred_l2_bytes, r.meas_l2_bytes) for r in rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the grid and the chosen share here")
    args = ap.parse_args()
    hw = load_profile("h200_sxm.calibrated")
    traits = fit.load(hw)
    records = [r for f in FOLDERS for r in validate.load_records(f) if r["algorithm"] in ALGORITHMS]
    full = counts(hw, traits, records, 1.0)
    part = counts(hw, traits, records, 0.75)
    grid = {}
    for share in GRID:
        errs: dict[str, list[float]] = {a: [] for a in ALGORITHMS}
        for key, (alg, pred1, meas) in full.items():
            pred = pred1 - (1 - share) / 0.25 * (pred1 - part[key][1])
            errs[alg].append(abs(pred / meas - 1))
        pooled = [e for v in errs.values() for e in v]
        grid[share] = {"mean": statistics.mean(pooled),
                       **{f"{a}_{s}": f(errs[a]) for a in ALGORITHMS
                          for s, f in (("mean", statistics.mean), ("median", statistics.median))}}
    best = min(grid, key=lambda s: grid[s]["mean"])
    per_alg = ", ".join(f"{a} {sum(v[0] == a for v in full.values())}" for a in ALGORITHMS)
    print(f"calibration records: {len(full)} ({per_alg})")
    print("share | mean |err| all | " + " | ".join(f"{a} mean / median" for a in ALGORITHMS))
    for s, g in grid.items():
        print(f"{s:5.2f} | {100 * g['mean']:5.1f}% | " + " | ".join(
            f"{100 * g[f'{a}_mean']:5.1f}% / {100 * g[f'{a}_median']:5.1f}%" for a in ALGORITHMS)
            + ("   <- least" if s == best else ""))
    if args.json:
        args.json.write_text(json.dumps({"chosen": best, "grid": grid, "records": len(full),
                                         "profile": "h200_sxm.calibrated", "algorithms": ALGORITHMS}, indent=1))


if __name__ == "__main__":
    main()
