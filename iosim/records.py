"""The stored measurement records that fit and validate read, and where they live.

One JSON record per (configuration, algorithm, tiling) on one GPU, with its provenance (gpu_kernels.measure writes
them). They live in `reports/measurements/<record set>/` of the source checkout. A record's `set` says what it is
for: `calibration` (the fit reads it), `validation` (scored once the model is settled) or, for every record of a
set measured after the model was settled, `holdout` (never fitted on).
"""
from __future__ import annotations

import json
from pathlib import Path

from .errors import IosimError

SETS = ("calibration", "validation", "holdout")

# record set -> the set its records are scored in (None: each record's own, fixed by a hash of its configuration
# before anything was fitted)
RECORD_SETS = {"h200": None, "h200_calibration2": None, "h200_holdout": "holdout"}


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
    recs = [json.loads(f.read_text()) for f in sorted(folder.glob("*.json"))]
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
