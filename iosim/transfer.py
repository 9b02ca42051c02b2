"""Fitted traits carried to a chip they were not fitted on.

`iosim fit` fits each kernel family's traits on one calibrated chip (the H200): efficiencies against the rates that
chip's microbenchmarks measured, and fixed costs in seconds. On another chip neither is the datasheet's: the rates
a kernel's instructions sustain are a share of the datasheet's peak, and a fixed cost in seconds is so many clocks.
`transferred(profile)` expresses what the source chip measured in units that carry from chip to chip and applies
them to `profile`'s datasheet values:

- rates as shares of the datasheet's (HBM copy, exp2, shared memory), and the tensor rate of the instruction the
  kernels issue: our kernels and FlashAttention-2 issue mma.sync, which on sm_90 sustains 0.63 of the dense rate
  the datasheet gives for wgmma; where mma.sync is the chip's own full-rate path (sm_80, sm_86, sm_89) it sustains
  what the full-rate instruction alone sustains on Hopper (wgmma's microbenchmark, 0.987 of the datasheet);
- L2's request rate per SM and clock, its latency in clocks; DRAM latency, launch and empty-kernel times as they
  are (a memory's and a driver's, not the SM clock's); the dirty bytes L2 keeps as a share of its capacity;
- fitted fixed costs in clocks (block overheads, store-issue rates), and cuBLAS's own GEMMs at the share of the
  dense rate they reached on the source (on sm_90 cuBLAS runs wgmma, our kernels and CUTLASS's alignment-1 GEMMs
  mma.sync).

Nothing is refitted. What the transfer costs in accuracy is measured (docs/model.md, "Chips nothing was fitted
on") and travels with every prediction as its error band (`band`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace

from .errors import IosimError
from .hardware import HardwareProfile, load_profile, profiles_dir
from .plan import Traits

SOURCE = "h200_sxm.calibrated"
# the full-rate instruction alone sustains this share of the datasheet's dense rate: wgmma, register and shared-memory
# resident, 976.2 of 989.4 TFLOP/s on an H100 (benchmarks/results/wgmma_h100_2026-12-06.json); on sm_80 the
# full-rate instruction is mma.sync, which our kernels and FlashAttention-2 issue
FULL_RATE_INSTRUCTION_SHARE = 976.2 / 989.4
# cuBLAS's own GEMMs: their fitted efficiency is against mma.sync's measured rate, and cuBLAS runs wgmma on sm_90, so
# on sm_80 it is rescaled to keep the share of the dense rate they reached on the source. Not CUTLASS's alignment-1
# GEMMs (`cublas_align1_*`): sm_75 code issuing mma.sync, they carry as our kernels do
GEMM_FAMILIES = ("naive",)
# architectures whose tensor cores run mma.sync at their full rate (no wgmma)
MMA_SYNC_FULL_RATE = ("sm_80", "sm_86", "sm_87", "sm_89")

SHARE = ("hbm_bandwidth_gb_s", "sfu_ops_per_clk_per_sm", "smem_bandwidth_bytes_per_clk_per_sm")
AS_IS = ("hbm_latency_ns", "kernel_launch_us", "kernel_floor_us", "l1_lines_per_clk_per_sm")
BANDS = profiles_dir() / "transfer_bands.json"


@dataclass(frozen=True)
class Transferred:
    """A profile with the source chip's measured behaviour carried over, the source's traits made to fit it, and
    what was carried (field -> how, for `iosim profiles show` and the notes)."""
    profile: HardwareProfile
    traits: dict[str, Traits]
    source: str
    carried: dict[str, str]


def _datasheet_of(calibrated: HardwareProfile) -> HardwareProfile:
    key = calibrated.key.removesuffix(".calibrated")
    if key == calibrated.key:
        raise IosimError(f"transfer source '{calibrated.key}' must be a calibrated profile (<name>.calibrated)")
    return load_profile(key)


def _measured(p: HardwareProfile, field: str) -> bool:
    return p.sources.get(field, "").startswith("measured:") and getattr(p, field) is not None


def mma_sync_share(target: HardwareProfile, cal: HardwareProfile, sheet: HardwareProfile, dtype: str) -> float:
    """The share of `target`'s datasheet dense rate that mma.sync sustains, from what the source measured."""
    field = f"tensor_{dtype}_tflops"
    if target.arch in MMA_SYNC_FULL_RATE and cal.arch not in MMA_SYNC_FULL_RATE:
        return FULL_RATE_INSTRUCTION_SHARE
    return getattr(cal, field) / getattr(sheet, field)


def carried_profile(target: HardwareProfile, source: str = SOURCE) -> tuple[HardwareProfile, dict[str, str]]:
    """`target` with the source chip's measured shares, rates per clock and latencies carried over."""
    if any(_measured(target, f) for f in ("tensor_fp16_tflops", "tensor_bf16_tflops", *SHARE)):
        # its rates are measured already: the shares would scale them a second time
        raise IosimError(f"profile '{target.key}' holds measured rates; traits are carried to a datasheet profile "
                         f"(use --transfer with '{target.key.removesuffix('.calibrated')}', or '{target.key}' "
                         f"without it)")
    cal = load_profile(source)
    sheet = _datasheet_of(cal)
    src_sm_hz = cal.sm_count * cal.clock_hz
    tgt_sm_hz = target.sm_count * target.clock_hz
    changes, how = {}, {}

    def put(field: str, value: float, text: str) -> None:
        changes[field] = value
        how[field] = text

    for dt in ("fp16", "bf16"):
        f = f"tensor_{dt}_tflops"
        share = mma_sync_share(target, cal, sheet, dt)
        path = "the full-rate path's (mma.sync is it here)" if target.arch in MMA_SYNC_FULL_RATE else "mma.sync's"
        put(f, getattr(target, f) * share, f"{path} {share:.3f} of the datasheet's dense rate, as on {cal.key}")
    for f in SHARE:
        if _measured(cal, f):
            share = getattr(cal, f) / getattr(sheet, f)
            put(f, getattr(target, f) * share, f"{share:.3f} of the datasheet's, as on {cal.key}")
    if _measured(cal, "l2_bandwidth_gb_s") and target.l2_capacity_mib > 0:
        per = cal.l2_bytes_per_s / src_sm_hz
        put("l2_bandwidth_gb_s", max(per * tgt_sm_hz / 1e9, changes.get("hbm_bandwidth_gb_s", 0.0)),
            f"{per:.1f} B a clock an SM, as on {cal.key}")
    if _measured(cal, "l2_latency_ns"):
        cycles = cal.l2_latency_ns * cal.clock_hz / 1e9
        put("l2_latency_ns", cycles / target.clock_hz * 1e9, f"{cycles:.0f} clocks, as on {cal.key}")
    if _measured(cal, "code_fetch_gb_s") and target.gpc_count:   # a GPC's cache: where the die's GPCs are known
        per = cal.code_fetch_gb_s * 1e9 / cal.clock_hz
        put("code_fetch_gb_s", per * target.clock_hz / 1e9, f"{per:.0f} B a clock a GPC, as on {cal.key}")
        if _measured(cal, "code_cache_kib"):
            put("code_cache_kib", cal.code_cache_kib, f"as on {cal.key}")
    if _measured(cal, "l2_dirty_mib") and target.l2_capacity_mib > 0:
        share = cal.l2_dirty_mib / cal.l2_capacity_mib
        put("l2_dirty_mib", share * target.l2_capacity_mib, f"{share:.3f} of L2, as on {cal.key}")
    for f in AS_IS:
        if _measured(cal, f):
            put(f, getattr(cal, f), f"as on {cal.key}")
    prof = target.replace(note=f"carried from {cal.key}", **changes)
    sources = dict(prof.sources) | {f: f"estimate: {h} ({target.sources.get(f, 'not on the datasheet')})"
                                    for f, h in how.items()}
    return prof.model_copy(update={"sources": sources, "name": f"{target.name} (traits carried from {cal.key})"}), how


def carried_traits(fitted: dict[str, Traits], target: HardwareProfile, source: str = SOURCE) -> dict[str, Traits]:
    """The source's fitted traits in the target's clocks, cuBLAS's GEMMs at the source's share of the dense rate."""
    cal = load_profile(source)
    sheet = _datasheet_of(cal)
    clocks = cal.clock_hz / target.clock_hz
    gemm = 1.0
    if target.arch in MMA_SYNC_FULL_RATE and cal.arch not in MMA_SYNC_FULL_RATE:
        gemm = mma_sync_share(cal, cal, sheet, "fp16") / mma_sync_share(target, cal, sheet, "fp16")
    out = {}
    for name, t in fitted.items():
        t = replace(t, block_overhead_s=t.block_overhead_s * clocks,
                    store_issue_bytes_per_s=t.store_issue_bytes_per_s / clocks if t.store_issue_bytes_per_s else None)
        if name in GEMM_FAMILIES and gemm != 1.0:
            t = replace(t, mma_efficiency=t.mma_efficiency * gemm, exp_efficiency=t.exp_efficiency * gemm,
                        fp32_efficiency=t.fp32_efficiency * gemm)
        out[name] = t
    return out


def transferred(target: HardwareProfile, source: str = SOURCE) -> Transferred:
    """`target` as the source chip's measurements and fitted traits predict it."""
    from .fit import load
    cal = load_profile(source)
    fitted = load(cal)
    if fitted is None:
        raise IosimError(f"no fitted traits beside '{source}' to transfer ({source}.kernels.json)")
    prof, how = carried_profile(target, source)
    return Transferred(prof, carried_traits(fitted, prof, source), source, how)


def band(profile: HardwareProfile, algorithm: str) -> dict | None:
    """The measured error band of predictions with transferred traits for a chip of `profile`'s architecture and
    an algorithm (`transfer_bands.json`: the median and max |relative time error| the transfer study found), or
    None where the study has nothing for it."""
    if not BANDS.is_file():
        return None
    data = json.loads(BANDS.read_text())
    arch = data.get("bands", {}).get(profile.arch or "", {})
    return arch.get(algorithm) or arch.get("*")


def band_table() -> list[tuple[str, str, dict]]:
    """Every (architecture, algorithm, band) of the study, in order."""
    if not BANDS.is_file():
        return []
    data = json.loads(BANDS.read_text()).get("bands", {})
    return [(a, alg, b) for a in sorted(data) for alg, b in sorted(data[a].items())]


# the plan families `iosim compare/simulate` name -> the measured algorithm whose traits they run with
RUNS_AS = {"eager": "torch_naive"}


def for_prediction(cfg, hw: HardwareProfile, algorithm: str, tiling) -> tuple[HardwareProfile, object, dict]:
    """The profile and per-kernel traits a prediction of `algorithm` on `hw` runs with, and its error band: the
    chip's own fitted traits where `iosim fit` saved some beside it, else the H200's carried to it."""
    from .fit import load
    from .kernels.catalogue import run_traits
    own = load(hw)
    if own is not None:
        prof, fitted = hw, own
        b = {"source": hw.key, "text": f"traits fitted on this chip ({hw.key}); docs/accuracy.md gives their error"}
    else:
        moved = transferred(hw)
        prof, fitted = moved.profile, moved.traits
        found = band(hw, algorithm)
        b = {"source": moved.source} | (found or {})
        b["text"] = (f"traits carried from {moved.source}; " + (
            f"\u00b1{found['median']:.0%} (median |time error|, max {found['max']:.0%}, {found['n']} predictions: "
            f"{found['from']})" if found else "no measured error band for this algorithm on this architecture"))
    return prof, run_traits(RUNS_AS.get(algorithm, algorithm), cfg, tiling, fitted, prof.clock_hz), b
