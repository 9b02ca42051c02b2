"""Fitting kernel families one kernel at a time: eager PyTorch's kernels and FlashAttention-2's backward.

Nsight Compute times each kernel of a record, and with its default `--cache-control all` each starts on an empty
L2, so a kernel's prediction does not depend on the kernels before it: each family is fitted on its own kernels'
times, over the calibration records only. What is fitted is a property of the compiled kernel that carries to other
chips:
- a memory-bound kernel (an elementwise pass, a row softmax): the bytes one block keeps in flight
  (`Fitted.bytes_in_flight`; Little's law turns it into a rate with the chip's memory latency);
- a kernel bound by its SMs (FlashAttention-2's backward): its efficiency against the chip's matmul, exp and fp32
  rates, with the latency-hiding shape its forward was fitted with;
- cuBLAS's alignment-1 GEMMs (`plan.align1`): their matmul's efficiency and the bytes of their N x N operand an SM
  moves a clock, together.
Each family takes the grid point with the least median |relative time error| of its kernels (the alignment-1 GEMMs:
the least mean, over their two fields and the block overhead together).
"""
from __future__ import annotations

import itertools
import statistics
from dataclasses import replace
from datetime import date

from .engine.run import run_plan
from .hardware import HardwareProfile
from .kernels.catalogue import ALIGN1_GEMMS, KERNEL_FAMILIES, family_of, planned, run_traits
from .plan import Plan, Tiling, Traits, build_plan
from .workload import AttentionConfig

FLIGHTS = (None,) + tuple(int(256 * 2 ** (k / 4)) for k in range(33))   # 256 B to 64 KiB, 19% steps
OVERHEADS_US = (0.0, 0.5, 1.0, 2.0, 4.0)
EFFICIENCIES = (0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.9, 1.0)

# family -> (the Fitted field chosen, its grid, the fitted family whose other values it starts from)
# (the tiled backward's main kernels: an efficiency, starting from the forward kernel of the same build family)
_MAIN = {"flash2_bwd": "torch_flash", "iosim_flash2_bwd": "flash2", "iosim_flash1_bwd": "flash1"}
# (cuBLAS's alignment-1 GEMMs: the matmul's efficiency and the N x N operand's bytes an SM moves a clock together,
# their time a sum of the two; the survey's least squares put them near 0.16 and 0.7 of the tensor rate, 6.7 and
# 5.6 bytes a cycle: experiments/cublas_alignment)
ALIGN1_EFFICIENCIES = (0.1, 0.12, 0.14, 0.17, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
OPERAND_BYTES_PER_CYCLE = tuple(round(2 * 2 ** (k / 4), 2) for k in range(13))   # 2 to 16, 19% steps
ALIGN1_GRID = tuple(itertools.product(ALIGN1_EFFICIENCIES, OPERAND_BYTES_PER_CYCLE))
ALIGN1_FIELD = "efficiency+operand_bytes_per_cycle"
FAMILIES: dict[str, tuple[str, tuple, str | None]] = {
    name: ("efficiency", EFFICIENCIES, _MAIN[name]) if name in _MAIN else
    (ALIGN1_FIELD, ALIGN1_GRID, None) if name in ALIGN1_GEMMS else ("bytes_in_flight", FLIGHTS, None)
    for name in KERNEL_FAMILIES}


def kernel_samples(records: list[dict], hw: HardwareProfile, fitted: dict[str, Traits]) -> dict[str, list]:
    """Per family: (planned kernel, its dtype, measured seconds) of every calibration record whose planned kernels
    match, one for one, the kernels Nsight Compute timed."""
    out: dict[str, list] = {name: [] for name in FAMILIES}
    for rec in records:
        if rec.get("set") != "calibration" or rec.get("error") or not rec.get("ncu"):
            continue
        if rec["algorithm"] not in ("torch_naive", "torch_flash") and rec["config"].get("pass", "forward") == "forward":
            continue   # our forward kernels are fitted with the grid (`fit`), their backward ones here
        cfg = AttentionConfig.make(**rec["config"])
        alg, tiling = planned(rec["algorithm"], cfg, Tiling.make(**rec["tiling"]) if rec.get("tiling") else None,
                              hw.sm_count)
        plan = build_plan(cfg, alg, hw, tiling, run_traits(rec["algorithm"], cfg, tiling, fitted, hw.clock_hz))
        measured = rec["ncu"]["kernels"]
        if len(measured) != len(plan.kernels):
            continue
        for k, m in zip(plan.kernels, measured):
            fam = getattr(k, "family", None) or family_of(rec["algorithm"], k.name)
            if fam in out:
                out[fam].append((k, cfg.dtype, m["gpu__time_duration.sum"]))
    return out


def kernel_time(kernel, dtype: str, hw: HardwareProfile, traits: Traits) -> float:
    """One kernel's predicted seconds with `traits`, on an empty L2 (as Nsight Compute ran it)."""
    kernel.traits = traits
    plan = Plan(algorithm="one", kernels=[kernel], tensor_bytes={}, live=[[]])
    results, *_ = run_plan(plan, hw, dtype, l2=True, max_steps=4, timeline=False, cold_l2=True)
    return results[0].time_s


def _candidate(field: str, value, base: Traits) -> Traits:
    if field == ALIGN1_FIELD:
        eff, rate = value
        return replace(_candidate("efficiency", eff, base), operand_bytes_per_cycle=rate)
    if field == "efficiency":
        return replace(base, mma_efficiency=value, exp_efficiency=value, fp32_efficiency=value)
    return replace(base, **{field: value})


def fit_family(name: str, samples: list, hw: HardwareProfile, fitted: dict[str, Traits]) -> dict | None:
    """The grid point of family `name` with the least median |relative time error| on its kernels, as an entry
    of the fitted traits file; None without samples."""
    if not samples:
        return None
    field, grid, start = FAMILIES[name]
    base = fitted.get(start, Traits()) if start else Traits()
    best = None
    kept = ("latency_rows", "block_overlap", "block_overhead_s", "diagonal_tile_cost")
    overheads = (base.block_overhead_s * 1e6,) if start else OVERHEADS_US

    # a grid of two fields and the overhead (the alignment-1 GEMMs) is scored by the mean |error|: at the median's
    # best point half its kernels may be left far off, and with three fields to choose the median found such points
    # (docs/decisions.md, 2026-12-07)
    score_of = statistics.mean if field == ALIGN1_FIELD else statistics.median

    def trial(value, over):
        errs = []
        for k, dtype, meas in samples:
            t = _candidate(field, value, replace(k.traits, **{f: getattr(base, f) for f in kept}))
            t = replace(t, block_overhead_s=over * 1e-6)
            errs.append(abs(kernel_time(k, dtype, hw, t) - meas) / meas)
        return score_of(errs), value, over, errs
    best = min((trial(value, over) for value in grid for over in overheads), key=lambda x: x[0])
    score, value, over, errs = best
    chosen = replace(_candidate(field, value, base), block_overhead_s=over * 1e-6).fitted
    return {"traits": {f: getattr(chosen, f) for f in chosen.__dataclass_fields__},
            "calibration_kernels": len(samples), "calibration_median_time_error": statistics.median(errs),
            "calibration_mean_time_error": statistics.mean(errs),
            "calibration_max_time_error": max(errs), "date": date.today().isoformat(),
            "how": (f"{field} from {list(ALIGN1_EFFICIENCIES)} x {list(OPERAND_BYTES_PER_CYCLE)}"
                    if field == ALIGN1_FIELD else f"{field} from {list(grid)}") +
                   ("" if start else f", with block overheads of {list(OVERHEADS_US)} us") +
                   f", least {'mean' if field == ALIGN1_FIELD else 'median'} |relative time error| over the "
                   "family's kernels in the calibration records (Nsight Compute's per-kernel times)"}


def fit_kernels(records: list[dict], hw: HardwareProfile, fitted: dict[str, Traits], progress=print,
                only: list[str] | None = None) -> dict:
    """Every family of `FAMILIES` with samples (or those of `only`): {family: entry}."""
    samples = kernel_samples(records, hw, fitted)
    out = {}
    for name in only or FAMILIES:
        entry = fit_family(name, samples[name], hw, fitted)
        if entry:
            out[name] = entry
            progress(f"{name}: {entry['calibration_kernels']} kernels, median |error| "
                     f"{entry['calibration_median_time_error']:.1%}, max {entry['calibration_max_time_error']:.1%}")
    return out
