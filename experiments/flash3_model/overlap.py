"""Does flash3's softmax run beside its matmuls or after them? Both, scored on the calibration records.

flash3's plan declares its softmax overlapped (`Build.overlap_softmax`: a step computes max(matmul, softmax)); the
pipe census of its build and of cuDNN's (experiments/pipe_cycles/pipe_census_h100_hopper_2026-12-07) gives each
key tile's non-tensor cycles. This scores the H100 records of both kernels (reports/measurements/h100_flash3) with
the step as max(matmul, softmax) and as matmul + softmax, on the h100_sxm profile with the H200's measured
behaviour carried (`iosim.transfer`), nothing fitted:

    python experiments/flash3_model/overlap.py [--set calibration|validation|all]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from iosim import validate as v  # noqa: E402
from iosim.hardware import load_profile  # noqa: E402
from iosim.plan import flash3  # noqa: E402
from iosim.plan.flash import Flash2Kernel  # noqa: E402
from iosim.records import load_records  # noqa: E402
from iosim.transfer import transferred  # noqa: E402

RECORDS = Path(__file__).resolve().parents[2] / "reports" / "measurements" / "h100_flash3"


def score(which: str, overlap: bool) -> list:
    def init(self, cfg, t, traits):
        Flash2Kernel.__init__(self, cfg, t, replace(traits, wgmma=True, overlap_softmax=overlap))
        self.name = "flash3_fwd"
        self.smem_bytes = flash3.smem_bytes(cfg, (t.block_q // 64, t.block_kv)) if traits.smem_bytes is None else \
            traits.smem_bytes
        self.smem_readers = t.block_q // 64
    flash3.Flash3Kernel.__init__ = init
    hw = transferred(load_profile("h100_sxm")).profile
    return v.validate(load_records(RECORDS), hw, which)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", default="calibration")
    args = ap.parse_args()
    for overlap in (True, False):
        rows = score(args.set, overlap)
        print(f"step = {'max(matmul, softmax)' if overlap else 'matmul + softmax'} ({args.set})")
        for alg in sorted({r.algorithm for r in rows}):
            e = [r.time_err for r in rows if r.algorithm == alg]
            print(f"  {alg:12} n {len(e):3}  time median |err| {statistics.median(map(abs, e)):6.1%}  max "
                  f"{max(map(abs, e)):6.1%}  signed median {statistics.median(e):+6.1%}")


if __name__ == "__main__":
    main()
