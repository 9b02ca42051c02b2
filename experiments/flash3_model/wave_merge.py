"""Do the later waves of a one-block-an-SM kernel stream in step, as the first does?

The engine records a first wave's repeated K/V reads (its blocks start together), of which Nsight's L2 counter sees
only part (`iosim.counters.merged_share`); later waves are taken as out of step. flash3 and cuDNN hold one block an
SM, so equal blocks end together and the next wave starts together too. This scores the L2 bytes of the calibration
records of reports/measurements/h100_flash3 (h100_sxm, the H200's behaviour carried) with every cohort of such a
kernel recorded as in step, against the engine as shipped (times do not move: repeats are the counters' only):

    python experiments/flash3_model/wave_merge.py [--set calibration|validation]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from iosim import validate as v  # noqa: E402
from iosim.engine import run  # noqa: E402
from iosim.hardware import load_profile  # noqa: E402
from iosim.records import load_records  # noqa: E402
from iosim.transfer import transferred  # noqa: E402

RECORDS = ROOT / "reports" / "measurements" / "h100_flash3"


def every_wave_in_step(self, blocks, sms, credit):
    import numpy as np
    np.add.at(self.taken, sms, 1)
    self.n_free -= len(sms)
    self.active += 1
    self.env.process(self._cohort(blocks, sms, self.launching or self.bps == 1, credit))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", default="calibration")
    args = ap.parse_args()
    moved = transferred(load_profile("h100_sxm"))
    recs = load_records(RECORDS)
    shipped = run.KernelRun._start
    for name, start in (("first wave in step (shipped)", shipped), ("every wave in step", every_wave_in_step)):
        run.KernelRun._start = start
        rows = v.validate(recs, moved.profile, args.set, dict(moved.traits))
        for alg in ("flash3", "torch_cudnn"):
            e = [r.l2_err for r in rows if r.algorithm == alg]
            print(f"{name:30} {alg:12} n {len(e):2}  L2 median {statistics.median(map(abs, e)):6.1%}  max "
                  f"{max(map(abs, e)):6.1%}  signed median {statistics.median(e):+6.1%}", flush=True)
    run.KernelRun._start = shipped


if __name__ == "__main__":
    main()
