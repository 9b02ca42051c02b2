"""Does the model reproduce PyTorch's FlashAttention-2 K/V re-reads from DRAM (issue 32) if its blocks walk their
K/V tiles last to first, as FlashAttention-2's forward does, and if L2 holds fewer distinct bytes, as two partitions
each keeping a copy of the lines both halves of the chip read would (a factor 2 on the capacity, not 1.5)?

    python experiments/effects/kv_walk.py [--records DIR] [--algorithms torch_flash,flash2] [--trials 0:1.5,1:1.5,...]

A trial `W:F` walks PyTorch's blocks last to first where W is 1 and holds capacity / F distinct bytes in L2 (the
shipped model: 0:1.5). Both are patched into the shipped plan and profile for this run only (`Flash2Kernel` of
torch_flash plans, `HardwareProfile.l2_holding_bytes`); our flash2 keeps its first-to-last walk. Prints each
record's signed time and DRAM errors and each family's DRAM median | max | min (calibrated H200 profile, its
fitted traits, the exact engine as `iosim validate` runs it).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import iosim.plan as plan  # noqa: E402
import iosim.plan.flash as flash  # noqa: E402
from iosim import fit, validate  # noqa: E402
from iosim.hardware import HardwareProfile, load_profile  # noqa: E402

TRIAL = {"reverse": False, "factor": 1.5}
_building_torch = [False]
_walking_back = [False]


def _patch() -> None:
    build = plan.build_plan

    def build_plan(cfg, algorithm, *a, **k):
        _building_torch[0] = algorithm == "torch_flash"
        try:
            return build(cfg, algorithm, *a, **k)
        finally:
            _building_torch[0] = False
    for mod in list(sys.modules.values()):   # every module that imported build_plan by name
        if getattr(mod, "build_plan", None) is build:
            mod.build_plan = build_plan

    init = flash.Flash2Kernel.__init__

    def kernel_init(self, *a, **k):
        init(self, *a, **k)
        self.walk_back = TRIAL["reverse"] and _building_torch[0]
    flash.Flash2Kernel.__init__ = kernel_init

    fold = flash.fold

    def folded(n, max_steps):
        segs = fold(n, max_steps)
        return [(n - b, n - a) for a, b in segs] if _walking_back[0] else segs
    flash.fold = folded
    for name in ("_many", "_single"):   # the exact engine's cohorts (`_mixed` serves coarse ones only)
        steps = getattr(flash.Flash2Kernel, name)

        def walked(self, *a, _steps=steps, **k):
            _walking_back[0] = getattr(self, "walk_back", False)
            try:
                return _steps(self, *a, **k)
            finally:
                _walking_back[0] = False
        setattr(flash.Flash2Kernel, name, walked)
    HardwareProfile.l2_holding_bytes = property(lambda hw: int(hw.l2_bytes / TRIAL["factor"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=Path, default=ROOT / "reports/measurements/h200_effects")
    ap.add_argument("--algorithms", default="torch_flash,flash2")
    ap.add_argument("--trials", default="0:1.5,1:1.5,0:2,1:2,0:3,1:3")
    args = ap.parse_args()
    _patch()
    hw = load_profile("h200_sxm.calibrated")
    traits = fit.load(hw)
    algs = args.algorithms.split(",")
    recs = [r for r in validate.load_records(args.records) if r.get("algorithm") in algs]
    for trial in args.trials.split(","):
        w, f = trial.split(":")
        TRIAL.update(reverse=w == "1", factor=float(f))
        rows = validate.validate(recs, hw, "all", traits)
        print(f"\nPyTorch's walk {'last to first' if TRIAL['reverse'] else 'first to last'}, L2 holds capacity / {f}")
        for r in rows:
            print(f"  {r.algorithm:<20}{r.label:<44}time {r.time_err * 100:+6.1f}%  DRAM {r.dram_err * 100:+6.1f}%")
        for alg in sorted({r.algorithm for r in rows}):
            d = [r.dram_err * 100 for r in rows if r.algorithm == alg]
            print(f"  {alg:<20}n {len(d):3d}  DRAM |error| median {statistics.median(map(abs, d)):5.1f}%  "
                  f"signed max {max(d):+6.1f}%  min {min(d):+6.1f}%")


if __name__ == "__main__":
    main()
