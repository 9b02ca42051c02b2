"""Peak HBM footprint of a training step: the plan's (the tensors its kernels hold) against torch's allocator
peak in the stored forward+backward records (reports/measurements/h200_backward). Prints a table.

    python experiments/training_footprint/footprint.py
"""
from __future__ import annotations

import statistics

from iosim.hardware import load_profile
from iosim.kernels.catalogue import planned
from iosim.plan import build_plan
from iosim.records import load_records, records_dir
from iosim.workload import AttentionConfig


BIG = 1e9


def main() -> None:
    hw = load_profile("h200_sxm.calibrated")
    ratios: dict[str, list[float]] = {}
    print(f"{'record':58s} {'measured':>10s} {'predicted':>10s} {'ratio':>6s}")
    for rec in sorted(load_records(records_dir() / "h200_backward"), key=lambda r: r["key"]):
        if rec["config"]["pass"] != "forward+backward" or not rec.get("time"):
            continue
        cfg = AttentionConfig.make(**rec["config"])
        alg, tiling = planned(rec["algorithm"], cfg, None, hw.sm_count)
        pred = build_plan(cfg, alg, hw, tiling).peak_footprint_bytes()
        meas = rec["time"]["peak_memory_bytes"]
        if meas >= BIG:   # below, the allocator's fixed ~70 MB (cuBLAS workspace, granularity) dominates
            ratios.setdefault(rec["algorithm"], []).append(pred / meas)
        print(f"{rec['key'][:58]:58s} {meas / 1e6:9.1f}M {pred / 1e6:9.1f}M {pred / meas:6.2f}")
    for alg, r in ratios.items():
        print(f"{alg}: predicted / measured peak where measured >= {BIG / 1e9:g} GB, median {statistics.median(r):.2f} [{min(r):.2f}, {max(r):.2f}] "
              f"over {len(r)} records")


if __name__ == "__main__":
    main()
