"""Fitting what the engine cannot know from a datasheet: each kernel family's efficiency against the measured
peaks, and the share of an SM one of its blocks can use alone. Fitted on the calibration set only; the
validation set is never seen here (`iosim validate` reports on it).

For each algorithm: first the solo share (from a few candidates, at efficiency 1), then one efficiency applied
to matmul, exp and fp32 rates together, each chosen to minimise the median |relative time error|.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import asdict
from datetime import date
from pathlib import Path

from .hardware import HardwareProfile, profiles_dir
from .plan import Traits
from .validate import PREDICTED, predict

SOLO_SHARES = (None, 0.5, 0.7, 1.0)
EFFICIENCIES = tuple(round(0.4 + 0.05 * i, 2) for i in range(13))   # 0.40 ... 1.00


def _median_err(records: list[dict], hw: HardwareProfile, alg: str, traits: Traits) -> float:
    rows = [predict(r, hw, {alg: traits}) for r in records]
    errs = [abs(x.time_err) for x in rows if x is not None]
    return statistics.median(errs) if errs else float("inf")


def fit(records: list[dict], hw: HardwareProfile, progress=print) -> dict[str, dict]:
    calib = [r for r in records if r.get("set") == "calibration"]
    out = {}
    for alg in PREDICTED:
        recs = [r for r in calib if r["algorithm"] == alg]
        if not recs:
            continue
        best_solo = min(SOLO_SHARES, key=lambda s: _median_err(recs, hw, alg, Traits(solo_sm_share=s)))
        scored = [(_median_err(recs, hw, alg, _traits(e, best_solo)), e) for e in EFFICIENCIES]
        err, eff = min(scored)
        out[alg] = {"traits": asdict(_traits(eff, best_solo)), "calibration_records": len(recs),
                    "calibration_median_time_error": err}
        progress(f"{alg:<12} efficiency {eff:.2f}  solo SM share {best_solo}  median |time error| {err:.1%} "
                 f"on {len(recs)} calibration records")
    return out


def _traits(eff: float, solo: float | None) -> Traits:
    return Traits(mma_efficiency=eff, exp_efficiency=eff, fp32_efficiency=eff, solo_sm_share=solo)


def traits_path(hw: HardwareProfile) -> Path:
    return profiles_dir() / f"{hw.key}.kernels.json"


def save(fitted: dict, hw: HardwareProfile, records_dir: str, path: Path) -> None:
    path.write_text(json.dumps({
        "profile": hw.key, "date": date.today().isoformat(),
        "how": f"iosim fit --records {records_dir} --profile {hw.key}: for each algorithm, the solo SM share from "
               f"{list(SOLO_SHARES)} then one efficiency (matmul, exp, fp32) from {EFFICIENCIES[0]} to "
               f"{EFFICIENCIES[-1]}, minimising the median |relative time error| over the calibration set only",
        "kernels": fitted}, indent=1))


def load(hw: HardwareProfile, path: Path | None = None) -> dict[str, Traits] | None:
    """Fitted traits for `hw`, if a fit was saved beside its profile."""
    path = path or traits_path(hw)
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return {alg: Traits(**v["traits"]) for alg, v in data["kernels"].items()}
