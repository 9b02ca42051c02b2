"""Fitting what the engine cannot know from a datasheet: each kernel family's efficiency against the measured
peaks, how its throughput depends on what else runs on the SM, and a per-block overhead. Fitted on the calibration
set only; the validation set is never seen here (`iosim validate` reports on it).

For each kernel family the traits minimise the mean |relative time error| over a grid, in two stages (every
combination of all three would take an hour of simulation): first every efficiency (one for matmul, exp and
fp32 together) with every *shape* at overheads 0, 3 and 6 us, then the overheads between for the best few. A shape is
either a solo share (a lone block uses at most that share of its SM, co-resident blocks overlap one's softmax
with another's matmul) or a latency-hiding scale (`Fitted.latency_rows`: an SM runs at 1 - exp(-rows resident /
scale) of its rates, each block's matmul and softmax in turn) with a share of the co-resident blocks' softmax
hidden behind their matmuls (`Fitted.block_overlap`). Which describes a kernel family is the fit's choice.
The first stage scores every point on the *screening* records only (batch x heads x queries <= SCREEN_ROWS: the
cheap ones to simulate; the large causal grids, each thousands of cohorts, cost flash2's fit five sixths of its
time), then the best SCREEN_KEEP (efficiency, shape) pairs are scored on every calibration record.
(The mean, not the median: the median fit left 7 of flash2's 26 calibration records 13-34% off, unseen by it.)
(Choosing one trait at a time stalled: flash2's first choice of solo share, made at efficiency 1, held it at a
15% median where the grid finds 6%.) Then the last stages (`_last_stages`) choose what the grid does not hold, one
after another from its choice, each never leaving the calibration mean worse: the store-issue rate with the block
overhead, the latency scale refined, the diagonal tile's cost.
"""
from __future__ import annotations

import itertools
import json
import statistics
from dataclasses import asdict, fields
from datetime import date
from pathlib import Path

from .hardware import HardwareProfile, profiles_dir
from .errors import IosimError
from .plan import Traits
from .plan.traits import Fitted
from .validate import predict

# ("solo", share) or ("latency", rows); ("solo", None): a lone block gets its share at full occupancy
SHAPES = (("solo", None), ("solo", 0.33), ("solo", 0.5), ("solo", 1.0),
          ("latency", 16.0), ("latency", 32.0), ("latency", 64.0), ("latency", 128.0), ("latency", 256.0))
OVERLAPS = (0.0, 0.5, 1.0)   # block_overlap values tried with each latency shape
EFFICIENCIES = tuple(round(0.5 + 0.1 * i, 1) for i in range(6))   # 0.5 ... 1.0
# cuBLAS's GEMMs (naive's qk and pv) run wgmma, whose ceiling (about 790 TFLOP/s on the H200) is above the
# mma.sync rate the calibrated profile measures (619): their efficiency against it may pass 1
GEMM_EFFICIENCIES = EFFICIENCIES + (1.1, 1.2, 1.3)
OVERHEADS_US = (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0)
FIRST_OVERHEADS_US = (0.0, 3.0, 6.0)   # the overheads tried with every efficiency and shape
KEEP = 4                               # best (efficiency, shape) pairs then tried with the other overheads
SCREEN_ROWS = 262_144                  # records of at most this batch x heads x queries screen the first stage
SCREEN_KEEP = 8                        # best pairs of the screen then scored on every calibration record
# The last stages, each with the traits it does not choose kept. First, for our kernels (which write their output
# from the mma accumulators, 4 bytes a lane), the rate a block issues its stores at (`Traits.
# store_issue_bytes_per_s`, None: at once) together with the block overhead: the block traces end each block with
# an epilogue of 0.7-2.8 us that grows with the output tile (experiments/block_placement/block_trace_h200_2026-12-01),
# which one overhead for every tiling cannot follow
STORE_ISSUE_GB_S = (None, 8.0, 12.0, 16.0, 24.0, 32.0)
STORE_OVERHEADS_US = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0)
STORE_TARGETS = ("flash1", "flash2")
# then, for a latency shape, its scale, the efficiency and the block overlap refined about the grid's choice (the
# grid's steps of 2x in latency rows are coarse where a lone block of 64 rows sits: it runs at 1 - exp(-64 / rows)
# of the SM's rates; its overlaps of 0, 0.5 and 1 are coarse where the block traces put a 2-4 blocks' SM: with
# every SM full, a key tile takes 1.5-2.2 times a lone block's, experiments/block_placement/block_trace_h200_2026-12-01)
LATENCY_REFINE = (0.75, 0.875, 1.0, 1.25)
EFFICIENCY_REFINE = (-0.05, 0.0, 0.05)
OVERLAP_REFINE = (-0.25, -0.125, 0.0, 0.125, 0.25)
# last, for the tiled kernels: a key tile crossing the causal diagonal costs this many interior ones
# (`Fitted.diagonal_tile_cost`; the block traces put the causal grids' misses there:
# experiments/block_placement/block_trace_h200_2026-12-01)
DIAGONAL_COSTS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0)
DIAGONAL_TARGETS = ("flash1", "flash2", "torch_flash")

_job: dict = {}   # the records, profile and target being fitted, and the Workers that score them


# what is fitted: (traits name, algorithm whose records score it, kernels (launch-order index) whose time is
# scored, None: the whole call). Naive attention's GEMMs and its softmax are different kernels, fitted apart on
# their own Nsight Compute times
TARGETS = (("naive", "naive", (0, 2)), ("naive_softmax", "naive", (1,)), ("flash1", "flash1", None),
           ("flash2", "flash2", None), ("torch_flash", "torch_flash", None))
# flash1's blocks wait on their own O, m and l between inner steps (re-read after they were stored, never
# prefetched) and issue them line by line (`Step.l1_lines`): its compute chain runs well below the pipes' rates
TARGET_EFFICIENCIES = {"naive": GEMM_EFFICIENCIES, "flash1": (0.3, 0.4) + EFFICIENCIES}
# naive's softmax: its blocks share their SM's issue ports by occupancy (one shape, the solo share at full
# occupancy); it waits on its loads a memory latency for each `bytes_in_flight` of them (its PTX keeps 2 KiB a block
# in flight; under load a latency is longer than the idle one the profile measures), so the bytes a latency serves
# are fitted; and its block overhead, which its one-row blocks pay up to 65,536 times, in quarter microseconds, all
# in one stage (a two-stage search missed its best overhead)
TARGET_SHAPES = {"naive_softmax": (("solo", None),)}
TARGET_FLIGHTS = {"naive_softmax": (1024, 1536, 2048)}
TARGET_OVERHEADS_US = {"naive_softmax": tuple(0.25 * i for i in range(13))}   # 0 ... 3


def _err(row, kernels: tuple | None) -> float | None:
    if kernels is None:
        return row.time_err
    if not row.meas_kernel_s:
        return None
    p = sum(row.pred_kernel_s[i] for i in kernels)
    m = sum(row.meas_kernel_s[i] for i in kernels)
    return (p - m) / m


def _abs_err(rec: dict, hw: HardwareProfile, name: str, kernels: tuple | None, traits: Traits) -> float | None:
    """|time error| of one record predicted with `traits` (None where it has no time to compare)."""
    row = predict(rec, hw, {name: traits})
    e = _err(row, kernels) if row is not None else None
    return None if e is None else abs(e)


def _errors(records: list[dict], hw: HardwareProfile, name: str, kernels: tuple | None,
            traits: Traits) -> list[float]:
    return [e for r in records if (e := _abs_err(r, hw, name, kernels, traits)) is not None]


def _score(point: tuple) -> float:
    """One point's mean |time error| on the job's records, in this process."""
    errs = _errors(_job["recs"], _job["hw"], _job["name"], _job["kernels"], _traits(*point))
    return statistics.mean(errs) if errs else float("inf")


def _one(task: tuple[int, int], job: dict) -> tuple[int, int, float | None]:
    """Point p's |time error| on record i, on a worker (`job`: the records, profile, target and points)."""
    p, i = task
    return p, i, _abs_err(job["recs"][i], job["hw"], job["name"], job["kernels"], _traits(*job["points"][p]))


def _shapes() -> list[tuple]:
    """Every shape, a latency shape once with each overlap: (kind, value[, overlap])."""
    return [sh + (o,) if sh[0] == "latency" else sh for sh in SHAPES
            for o in (OVERLAPS if sh[0] == "latency" else (None,))]


def _scores(points: list[tuple]) -> list[float]:
    """Each point's mean |time error| on the job's records, on the job's `Workers` (this process where none). The
    work is shared out a (point, record) pair at a time, the largest grids first: a pool of one point each kept a
    16-core machine 10.8 of them busy, waiting on the points that hold the large causal grids."""
    recs = _job["recs"]
    job = {k: _job[k] for k in ("recs", "hw", "name", "kernels")} | {"points": points}
    tasks = [(p, i) for i in sorted(range(len(recs)), key=lambda i: -_rows(recs[i])) for p in range(len(points))]
    errs: list[list] = [[None] * len(recs) for _ in points]
    w = _job.get("workers")
    done = (r for _, r in w.map(_one, tasks, job)) if w is not None else (_one(t, job) for t in tasks)
    for p, i, e in done:
        errs[p][i] = e
    return [statistics.mean(k) if (k := [e for e in row if e is not None]) else float("inf") for row in errs]


def fit(records: list[dict], hw: HardwareProfile, progress=print, only: list[str] | None = None,
        incumbent: dict[str, Traits] | None = None, workers=None) -> dict[str, dict]:
    """Fitted traits per target; `only` fits those targets alone (each target's fit is independent of the
    others': it predicts its own kernels with its own traits). workers: an open `sweep.Workers` to score on."""
    _job["workers"] = workers
    calib = [r for r in records if r.get("set") == "calibration"]
    out = {}
    for name, alg, kernels in TARGETS:
        if only is not None and name not in only:
            continue
        recs = [r for r in calib if r["algorithm"] == alg]
        if not recs:
            continue
        _job.update(recs=recs, hw=hw, name=name, kernels=kernels)
        effs = TARGET_EFFICIENCIES.get(name, EFFICIENCIES)
        flights = TARGET_FLIGHTS.get(name, (None,))
        overheads = TARGET_OVERHEADS_US.get(name, OVERHEADS_US)
        shapes = TARGET_SHAPES.get(name) or _shapes()
        firsts = overheads if name in TARGET_OVERHEADS_US else [o for o in FIRST_OVERHEADS_US if o in overheads]
        first = list(itertools.product(effs, shapes, firsts, flights))
        screen = [r for r in recs if _rows(r) <= SCREEN_ROWS]
        if 0 < len(screen) < len(recs):   # screen every point on the cheap records, rescore the best on all
            _job.update(recs=screen)
            screened = sorted(zip(_scores(first), first), key=lambda x: x[0])
            _job.update(recs=recs)
            kept = list(dict.fromkeys((eff, shape, fl) for _, (eff, shape, _, fl) in screened))[:SCREEN_KEEP]
            first = [(eff, shape, ovh, fl) for eff, shape, fl in kept for ovh in firsts]
        scored = sorted(zip(_scores(first), first), key=lambda x: x[0])
        pairs = list(dict.fromkeys((eff, shape, fl) for _, (eff, shape, _, fl) in scored))[:KEEP]
        second = [(eff, shape, ovh, fl) for eff, shape, fl in pairs for ovh in overheads if ovh not in firsts]
        best, point = min(scored + list(zip(_scores(second), second)), key=lambda x: x[0])
        point += (1.0, None)
        if incumbent and name in incumbent:   # the traits fitted before compete: the grid's stages can miss them
            held = _point(incumbent[name])
            held_score = _scores([held])[0]
            if held_score < best:
                best, point = held_score, held
        best, point = _last_stages(name, point, best)
        out[name] = _entry(name, recs, kernels, point, best, hw, progress)
    return out


def _last_stages(name: str, point: tuple, score: float) -> tuple[float, tuple]:
    """The store-issue, refining and diagonal stages a target takes, from `point` (eff, shape, overhead, flight,
    diagonal, store rate) scored `score`. Each stage keeps the traits it does not choose as they are and scores
    the point it starts from among its own, so no stage leaves the calibration mean worse."""
    if name in STORE_TARGETS:
        score, point = _best(point, score, [point[:2] + (ovh, point[3], point[4], rate)
                                            for rate in STORE_ISSUE_GB_S for ovh in STORE_OVERHEADS_US])
    if point[1][0] == "latency":
        eff, (kind, rows, overlap) = point[0], point[1]
        score, point = _best(point, score, [(round(eff + de, 2), (kind, rows * f, round(overlap + do, 3)))
                                            + point[2:] for de in EFFICIENCY_REFINE for f in LATENCY_REFINE
                                            for do in OVERLAP_REFINE if eff + de > 0 and 0 <= overlap + do <= 1])
    if name in DIAGONAL_TARGETS:
        score, point = _best(point, score, [point[:4] + (c, point[5]) for c in DIAGONAL_COSTS])
    return score, point


def _best(point: tuple, score: float, points: list[tuple]) -> tuple[float, tuple]:
    """The better scored of `point` (scored `score`) and `points`."""
    points = [p for p in dict.fromkeys(points) if p != point]
    return min([(score, point)] + list(zip(_scores(points), points)), key=lambda x: x[0])


def _entry(name: str, recs: list[dict], kernels, point: tuple, best: float, hw: HardwareProfile, progress) -> dict:
    eff, shape, ovh, fl = point[:4]
    traits = _traits(*point)
    errs = _errors(recs, hw, name, kernels, traits)
    over = f" overlap {shape[2]:g}" if len(shape) > 2 else ""
    over += f"  {fl} B a latency" if fl else ""
    over += f"  diagonal tile {traits.diagonal_tile_cost:g}" if name in DIAGONAL_TARGETS else ""
    if name in STORE_TARGETS:
        rate = traits.store_issue_bytes_per_s
        over += f"  stores issued at {rate / 1e9:g} GB/s a block" if rate else "  stores issued at once"
    progress(f"{name:<13} efficiency {eff:.2f}  {shape[0]} {shape[1]}{over}  block overhead {ovh:g} us  mean "
             f"|time error| {best:.1%} (median {statistics.median(errs):.1%}, max {max(errs):.1%}) on "
             f"{len(recs)} calibration records")
    return {"traits": asdict(traits.fitted), "calibration_records": len(recs), "calibration_mean_time_error": best,
            "calibration_median_time_error": statistics.median(errs), "calibration_max_time_error": max(errs),
            "date": date.today().isoformat()}


def last_stage(records: list[dict], hw: HardwareProfile, fitted: dict[str, Traits], progress=print,
               only: list[str] | None = None, workers=None) -> dict[str, dict]:
    """The last stages alone (store issue with the block overhead for our kernels, the latency shape refined, the
    diagonal tile's cost), starting from the traits fitted before: what a new plan-level trait costs to fit
    without the whole grid again."""
    _job["workers"] = workers
    calib = [r for r in records if r.get("set") == "calibration"]
    out = {}
    for name, alg, kernels in TARGETS:
        if name not in DIAGONAL_TARGETS + STORE_TARGETS or (only is not None and name not in only) \
                or name not in fitted:
            continue
        recs = [r for r in calib if r["algorithm"] == alg]
        if not recs:
            continue
        _job.update(recs=recs, hw=hw, name=name, kernels=kernels)
        point = _point(fitted[name])
        best, point = _last_stages(name, point, _scores([point])[0])
        out[name] = _entry(name, recs, kernels, point, best, hw, progress)
    return out


def _point(t: Traits) -> tuple:
    """Fitted traits as a point of the search: (efficiency, shape, overhead us, flight, diagonal, store rate)."""
    kind = ("latency", t.latency_rows, t.block_overlap) if t.latency_rows is not None else ("solo", t.solo_sm_share)
    rate = t.store_issue_bytes_per_s / 1e9 if t.store_issue_bytes_per_s else None
    return (t.mma_efficiency, kind, round(t.block_overhead_s * 1e6, 6), t.bytes_in_flight, t.diagonal_tile_cost,
            rate)


def _rows(rec: dict) -> int:
    c = rec["config"]
    return c["batch"] * c["heads"] * c["seqlen_q"]


def _traits(eff: float, shape: tuple = ("solo", None), overhead_us: float = 0.0, flight: int | None = None,
            diagonal: float = 1.0, store_gb_s: float | None = None) -> Traits:
    kind, value = shape[:2]
    return Traits(mma_efficiency=eff, exp_efficiency=eff, fp32_efficiency=eff,
                  solo_sm_share=value if kind == "solo" else None,
                  latency_rows=value if kind == "latency" else None,
                  block_overlap=shape[2] if len(shape) > 2 else 0.0, block_overhead_s=overhead_us * 1e-6,
                  bytes_in_flight=flight, diagonal_tile_cost=diagonal,
                  store_issue_bytes_per_s=store_gb_s * 1e9 if store_gb_s else None)


def traits_path(hw: HardwareProfile) -> Path:
    return profiles_dir() / f"{hw.key}.kernels.json"


def save(fitted: dict, hw: HardwareProfile, records_dir: str, path: Path) -> None:
    path.write_text(json.dumps({
        "profile": hw.key, "date": date.today().isoformat(),
        "how": f"iosim fit --records {records_dir} --profile {hw.key}: for each algorithm, one efficiency (matmul, "
               f"exp, fp32) from {list(EFFICIENCIES)} (naive's GEMMs, on wgmma: {list(GEMM_EFFICIENCIES)}; flash1: "
               f"{list(TARGET_EFFICIENCIES['flash1'])}) with "
               f"every shape (solo SM share or latency-hiding rows) of "
               f"{[list(x) for x in SHAPES]} (latency shapes with block overlap {list(OVERLAPS)}) and block "
               f"overhead of {list(FIRST_OVERHEADS_US)} us, then the other overheads of {list(OVERHEADS_US)} us for "
               f"the {KEEP} best pairs; the first stage screened on the records of batch x heads x queries <= "
               f"{SCREEN_ROWS:,}, its {SCREEN_KEEP} best pairs then scored on every record (naive's softmax: the "
               f"solo share at full occupancy only, bytes a latency serves of "
               f"{list(TARGET_FLIGHTS['naive_softmax'])} and, in one stage, overheads of "
               f"{list(TARGET_OVERHEADS_US['naive_softmax'])} us); minimising the mean |relative time error| over "
               f"the calibration set only (naive's GEMMs and its softmax apart, on their own kernels' times); "
               f"then the last stages, each keeping the traits it does not choose: for "
               f"{', '.join(STORE_TARGETS)}, the rate a block issues its stores at of {list(STORE_ISSUE_GB_S)} "
               f"GB/s (None: at once) with block overheads of {list(STORE_OVERHEADS_US)} us; for a latency shape, "
               f"its rows times {list(LATENCY_REFINE)} with the efficiency {list(EFFICIENCY_REFINE)} and the block "
               f"overlap {list(OVERLAP_REFINE)} about the choice; for {', '.join(DIAGONAL_TARGETS)}, the cost of a "
               f"key tile crossing the causal diagonal of {list(DIAGONAL_COSTS)} interior tiles; each entry dated "
               f"(`iosim fit --only TARGET` refits one and keeps the others, the traits it had competing with the "
               f"grid's choice before the last stages; `--last-stage-only` runs the last stages on the traits "
               f"already fitted)",
        "kernels": fitted}, indent=1))


def load(hw: HardwareProfile, path: Path | None = None) -> dict[str, Traits] | None:
    """Fitted traits for `hw`, if a fit was saved beside its profile; `path` names a file that must exist."""
    if path is not None and not path.is_file():
        raise IosimError(f"--traits: no fitted traits file at {path}")
    path = path or traits_path(hw)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        data = None
    kernels = data.get("kernels") if isinstance(data, dict) else None
    if not isinstance(kernels, dict) or not all(isinstance(v, dict) and isinstance(v.get("traits"), dict)
                                                for v in kernels.values()):
        raise IosimError(f"{path}: not a fitted traits file (JSON with 'kernels': {{name: {{'traits': ...}}}})")
    known = {f.name for f in fields(Fitted)}
    for alg, v in data["kernels"].items():
        extra = sorted(set(v["traits"]) - known)
        if extra:
            raise IosimError(f"{path}: kernel '{alg}' has {extra[0]!r}, not a fitted value (fitted: {', '.join(known)})")
    return {alg: Traits(**v["traits"]) for alg, v in data["kernels"].items()}
