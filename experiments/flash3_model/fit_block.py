"""flash3's one fitted value: the time a block holds its SM before its first load (`Fitted.block_overhead_s`).

flash3 launches a block per 128 query rows, each of which sets its registers (setmaxnreg), initialises its
mbarriers and waits for Q and its first K/V tile before any matmul; cuDNN's persistent blocks start once and load
the next work tile under the current one. With the builds' counted cycles in series (docs/decisions.md,
2026-12-07), flash3's calibration records come out about 10% fast and cuDNN's within 2% (signed medians). This
scans the overhead on the calibration records of reports/measurements/h100_flash3 (h100_sxm, the H200's behaviour
carried, nothing else fitted), minimising the median |time error| (ties: the mean), and writes the chosen value:

    python experiments/flash3_model/fit_block.py [--write]

`--write` stores it as the `flash3` family in hw_profiles/h200_sxm.calibrated.kernels.json, in the H200's clocks
(`iosim.transfer` carries a fixed cost as clocks, so on the H100 it is the value fitted here).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from iosim import validate as v  # noqa: E402
from iosim.hardware import load_profile  # noqa: E402
from iosim.plan import Traits  # noqa: E402
from iosim.records import load_records  # noqa: E402
from iosim.transfer import SOURCE, transferred  # noqa: E402

RECORDS = ROOT / "reports" / "measurements" / "h100_flash3"
KERNELS = ROOT / "hw_profiles" / "h200_sxm.calibrated.kernels.json"
GRID_US = [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0]


def score(overhead_s: float, which: str = "calibration") -> list[float]:
    moved = transferred(load_profile("h100_sxm"))
    fitted = dict(moved.traits) | {"flash3": Traits(block_overhead_s=overhead_s)}
    recs = [r for r in load_records(RECORDS) if r["algorithm"] == "flash3"]
    return [row.time_err for row in v.validate(recs, moved.profile, which, fitted)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    rows = []
    for us in GRID_US:
        e = score(us * 1e-6)
        rows.append((statistics.median(map(abs, e)), statistics.fmean(map(abs, e)), us, max(map(abs, e)),
                     statistics.median(e), len(e)))
        print(f"block overhead {us:4.1f} us: calibration time median {rows[-1][0]:6.1%}  mean {rows[-1][1]:6.1%}  "
              f"max {rows[-1][3]:6.1%}  signed median {rows[-1][4]:+6.1%}", flush=True)
    best = min(rows)
    print(f"chosen: {best[2]} us (n {best[5]} calibration records)")
    if args.write:
        h100, h200 = load_profile("h100_sxm"), load_profile(SOURCE)
        doc = json.loads(KERNELS.read_text())
        doc["kernels"]["flash3"] = {
            "traits": {"block_overhead_s": best[2] * 1e-6 * h100.clock_hz / h200.clock_hz},
            "calibration_records": best[5], "calibration_median_time_error": best[0],
            "calibration_mean_time_error": best[1], "calibration_max_time_error": best[3],
            "date": date.today().isoformat(),
            "how": "experiments/flash3_model/fit_block.py on reports/measurements/h100_flash3's calibration records "
                   "(an H100; h100_sxm with the H200's behaviour carried): block_overhead_s alone, the rest at their "
                   "defaults; stored in the H200's clocks"}
        KERNELS.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"written: {KERNELS}")


if __name__ == "__main__":
    main()
