"""Fitting what the engine cannot know from a datasheet: each kernel family's efficiency against the measured
peaks, and the share of an SM one of its blocks can use alone. Fitted on the calibration set only; the
validation set is never seen here (`iosim validate` reports on it).

For each algorithm, three traits chosen together from a grid (every combination, spread over the CPU's cores) to
minimise the median |relative time error|: the solo share (of an SM's units one block can use alone), one
efficiency applied to matmul, exp and fp32 rates together, and the per-block overhead. (Choosing them one at a
time stalled: flash2's first choice of solo share, made at efficiency 1, held it at a 15% median where the grid
finds 6%.)
"""
from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import statistics
from dataclasses import asdict
from datetime import date
from pathlib import Path

from .hardware import HardwareProfile, profiles_dir
from .plan import Traits
from .validate import PREDICTED, predict

SOLO_SHARES = (None, 0.5, 1.0)
EFFICIENCIES = tuple(round(0.4 + 0.1 * i, 1) for i in range(7))   # 0.4 ... 1.0
OVERHEADS_US = (0.0, 1.0, 2.0, 3.0, 4.0)

_job: dict = {}   # the records and profile a worker process scores against (set before the pool forks)


def _median_err(records: list[dict], hw: HardwareProfile, alg: str, traits: Traits) -> float:
    rows = [predict(r, hw, {alg: traits}) for r in records]
    errs = [abs(x.time_err) for x in rows if x is not None]
    return statistics.median(errs) if errs else float("inf")


def _score(point: tuple) -> float:
    return _median_err(_job["recs"], _job["hw"], _job["alg"], _traits(*point))


def fit(records: list[dict], hw: HardwareProfile, progress=print) -> dict[str, dict]:
    calib = [r for r in records if r.get("set") == "calibration"]
    grid = list(itertools.product(EFFICIENCIES, SOLO_SHARES, OVERHEADS_US))
    out = {}
    for alg in PREDICTED:
        recs = [r for r in calib if r["algorithm"] == alg]
        if not recs:
            continue
        _job.update(recs=recs, hw=hw, alg=alg)
        workers = min(os.cpu_count() or 1, len(grid))
        if workers > 1:
            with multiprocessing.get_context("fork").Pool(workers) as pool:
                scores = pool.map(_score, grid)
        else:
            scores = [_score(p) for p in grid]
        best, (eff, solo, ovh) = min(zip(scores, grid), key=lambda x: x[0])
        out[alg] = {"traits": asdict(_traits(eff, solo, ovh)), "calibration_records": len(recs),
                    "calibration_median_time_error": best}
        progress(f"{alg:<12} efficiency {eff:.2f}  solo SM share {solo}  block overhead {ovh:g} us  median "
                 f"|time error| {best:.1%} on {len(recs)} calibration records")
    return out


def _traits(eff: float, solo: float | None, overhead_us: float = 0.0) -> Traits:
    return Traits(mma_efficiency=eff, exp_efficiency=eff, fp32_efficiency=eff, solo_sm_share=solo,
                  block_overhead_s=overhead_us * 1e-6)


def traits_path(hw: HardwareProfile) -> Path:
    return profiles_dir() / f"{hw.key}.kernels.json"


def save(fitted: dict, hw: HardwareProfile, records_dir: str, path: Path) -> None:
    path.write_text(json.dumps({
        "profile": hw.key, "date": date.today().isoformat(),
        "how": f"iosim fit --records {records_dir} --profile {hw.key}: for each algorithm, the solo SM share from "
               f"{list(SOLO_SHARES)}, one efficiency (matmul, exp, fp32) from {list(EFFICIENCIES)} and the per-block "
               f"overhead from {list(OVERHEADS_US)} us, every combination, minimising the median |relative time "
               f"error| over the calibration set only",
        "kernels": fitted}, indent=1))


def load(hw: HardwareProfile, path: Path | None = None) -> dict[str, Traits] | None:
    """Fitted traits for `hw`, if a fit was saved beside its profile."""
    path = path or traits_path(hw)
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return {alg: Traits(**v["traits"]) for alg, v in data["kernels"].items()}
