"""The stored measurement records that fit and validate read, and where they live.

One JSON record per (configuration, algorithm, tiling) on one GPU, with its provenance (gpu_kernels.measure writes
them). They live in `reports/measurements/<record set>/` of the source checkout. A record's `set` says what it is
for: `calibration` (the fit reads it), `validation` (scored once the model is settled) or, for every record of a
set measured after the model was settled, `holdout` (never fitted on).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import IosimError, one_line

SETS = ("calibration", "validation", "holdout")

# record set -> the set its records are scored in (None: each record's own, fixed by a hash of its configuration
# before anything was fitted)
RECORD_SETS = {"h200": None, "h200_calibration2": None, "h200_holdout": "holdout", "h200_backward": None,
               "h200_backward_ours": None}

# a time recorded in seconds lies in this range; a record whose times are microseconds read as seconds does not
_SECONDS = (1e-7, 100.0)


def _positive_seconds(v: float, what: str) -> float:
    if not (math.isfinite(v) and _SECONDS[0] <= v <= _SECONDS[1]):
        raise ValueError(f"{what} must be a time in seconds, {_SECONDS[0]:g} to {_SECONDS[1]:g}, got {v!r} "
                         "(microseconds read as seconds, or no measurement)")
    return v


class Timing(BaseModel):
    """CUDA-event time of one call, seconds."""
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    median_s: float

    @field_validator("median_s")
    @classmethod
    def _seconds(cls, v: float) -> float:
        return _positive_seconds(v, "median_s")


class Ncu(BaseModel):
    """Nsight Compute's sums over the call's kernels: bytes and seconds, as converted from the units it printed."""
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    duration_s: float
    dram_read_bytes: float = Field(ge=0)
    dram_write_bytes: float = Field(ge=0)
    l2_bytes: float = Field(gt=0)
    kernels: list[dict[str, Any]] = Field(default_factory=list)

    @field_validator("duration_s")
    @classmethod
    def _seconds(cls, v: float) -> float:
        return _positive_seconds(v, "duration_s")

    @field_validator("dram_write_bytes")
    @classmethod
    def _some_dram(cls, v: float, info) -> float:
        if v + info.data.get("dram_read_bytes", 1.0) <= 0:
            raise ValueError("DRAM bytes read and written are both 0: no measurement")
        return v


class Record(BaseModel):
    """One measurement record (gpu_kernels.measure writes them): what ran, its set, and what was measured."""
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    key: str = Field(min_length=1)
    set: str
    algorithm: str = Field(min_length=1)
    config: dict[str, Any]
    tiling: dict[str, Any] | None = None
    time: Timing | None = None
    ncu: Ncu | None = None
    error: str | None = None

    @field_validator("set")
    @classmethod
    def _known_set(cls, v: str) -> str:
        if v not in SETS:
            raise ValueError(f"must be one of {', '.join(SETS)}")
        return v


def check_record(data: Any, where: str) -> dict:
    """`data` as a record, checked (a failed run, with `error`, need not carry measurements); else one line naming
    `where` and the field."""
    if not isinstance(data, dict):
        raise IosimError(f"{where}: not a measurement record (a JSON object), got a JSON {type(data).__name__}")
    try:
        Record.model_validate(data)
    except ValidationError as e:
        raise IosimError(one_line(e, where)) from None
    ncu, time = data.get("ncu"), data.get("time")
    if not data.get("error") and ncu and not time:
        raise IosimError(f"{where}: field 'time' is missing: a record measured by Nsight carries its CUDA-event time")
    if ncu and time:
        # the units: the kernels run inside the call, and no GPU kernel moves its L2 bytes below 1 GB/s (the stored
        # H200 records: 30 GB/s and up); times in microseconds read as seconds fail one or the other
        if ncu["duration_s"] > 1.5 * time["median_s"]:
            raise IosimError(f"{where}: field 'ncu.duration_s' = {ncu['duration_s']!r} is longer than the call's "
                             f"time.median_s = {time['median_s']!r}: both must be seconds")
        if ncu["l2_bytes"] / ncu["duration_s"] < 1e9:
            raise IosimError(f"{where}: field 'ncu.duration_s' = {ncu['duration_s']!r}: {ncu['l2_bytes']:.0f} L2 bytes "
                             "in that many seconds is below 1 GB/s; times must be seconds (microseconds read as "
                             "seconds?)")
    return data


def records_dir() -> Path:
    """reports/measurements of the source checkout this package runs from, else of the working directory."""
    here = Path(__file__).resolve().parent.parent / "reports" / "measurements"
    return here if here.is_dir() else Path.cwd() / "reports" / "measurements"


def default_folders() -> list[Path]:
    """Every record set fit and validate read by default."""
    return [records_dir() / name for name in RECORD_SETS]


def load_records(folder: str | Path) -> list[dict]:
    """The records of one folder, in file-name order; a held-out set's records in the `holdout` set."""
    folder = Path(folder)
    if not folder.is_dir():
        raise IosimError(f"no measurement folder at {folder}")
    recs = []
    for f in sorted(folder.glob("*.json")):
        try:
            data = json.loads(f.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise IosimError(f"{f}: not valid JSON: {e}") from None
        recs.append(check_record(data, str(f)))
    if not recs:
        raise IosimError(f"no records (*.json) in {folder}")
    as_set = RECORD_SETS.get(folder.name) if folder.resolve().parent == records_dir().resolve() else None
    if as_set:
        for r in recs:
            r["set"] = as_set
    return recs


def load_all(folders: list[str | Path] | None = None) -> list[dict]:
    """The records of several folders (default: every record set)."""
    return [r for f in (folders or default_folders()) for r in load_records(f)]
