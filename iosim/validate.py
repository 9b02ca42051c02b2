"""Predicted against measured: the engine's time, DRAM bytes and L2 bytes for each stored measurement record.

Predictions are made as the measurements were taken: L2 emptied before each kernel (Nsight Compute's default
--cache-control all) and DRAM writes counted only while a kernel runs. Time is compared with the sum of the
kernels' durations that Nsight Compute reported (device time, no launch gaps); the CUDA-event time of the whole
call, which includes the launcher's host work, is kept beside it. Our kernels are simulated with the register
counts ptxas gives them (`kernels.builds`), so the engine holds as many of their blocks an SM as the GPU, and with
their machine code's size, which each reads from HBM through the emptied L2 as it starts; PyTorch's kernels too,
with the code sizes torch's library carries for them (`kernels.torch_fa2.recorded_code`, by the names the record ran).
cuBLAS's GEMMs are not built here: their code is not counted (measured, 15-22 KB a GEMM beyond their data).
Naive's GEMMs run in the tiles and clusters cuBLAS chose for the record, read from its kernels' names
(`recorded_gemm_tiles`), as our kernels run in the record's tiling.

L2 bytes are compared as Nsight's `lts__t_bytes` counts them (`iosim.counters`): the SMs' requests plus, on a
chip with two L2 partitions, the crossings between them (half the read misses and writes; `experiments/l2_counters`
takes the counter apart), less the first wave's merged repeats and the partial-sector writes the counter does not
see, plus the code each GPC's cache fetches. PyTorch's kernel also writes its register spills through L1 to L2 at
every key tile (`kernels.torch_fa2.SPILL_BYTES`): L2 writes, counted and timed.

PyTorch's SDPA flash kernel is predicted as flash2's kernels with FlashAttention-2's tiling (128x128, 4 warps for
d <= 64; 128x64 for d 128), or its split-KV path and combine kernel where FlashAttention-2's heuristic takes it
(`kernels.torch_fa2.tiling`), and around its backward the layout copies SDPA adds (the plan family `torch_flash`). PyTorch's eager naive attention is predicted kernel by kernel as it runs
(`plan.eager`). A record of the backward pass or of a training step is predicted for that pass; its rows carry the
pass after the algorithm ('torch_flash bwd', 'torch_naive fwd+bwd').
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field, replace

from . import counters
from .engine import simulate
from .errors import IosimError
from .hardware import HardwareProfile
from .kernels import torch_fa2
from .kernels.catalogue import ALGORITHMS as PREDICTED, planned, recorded_blocks, run_traits
from .kernels.cublas import GemmTile
from .plan import Tiling, Traits
from .records import SETS, load_records  # noqa: F401  (load_records: the API's)
from .workload import AttentionConfig

@dataclass
class Row:
    key: str
    set: str
    algorithm: str
    label: str
    pred_time_s: float
    meas_time_s: float
    event_time_s: float
    pred_dram_bytes: float
    meas_dram_bytes: float
    pred_l2_bytes: float
    meas_l2_bytes: float
    pred_kernel_s: list[float] = field(default_factory=list)   # per kernel, in launch order
    meas_kernel_s: list[float] = field(default_factory=list)   # Nsight Compute's, where it saw the same kernels
    run: str = ""   # the algorithm and the record's tiling, e.g. 'flash2 128x128 4w 2st' (one build of a kernel)

    @staticmethod
    def _err(p: float, m: float) -> float:
        return (p - m) / m if m else float("nan")

    @property
    def time_err(self) -> float:
        return self._err(self.pred_time_s, self.meas_time_s)

    @property
    def dram_err(self) -> float:
        return self._err(self.pred_dram_bytes, self.meas_dram_bytes)

    @property
    def l2_err(self) -> float:
        return self._err(self.pred_l2_bytes, self.meas_l2_bytes)


EXACT = True   # False: as users' predictions are made, within the engine's budget (`engine.scale`)


def predict(rec: dict, hw: HardwareProfile, traits: dict[str, Traits] | None = None) -> Row | None:
    """The engine's prediction for one record, or None where the record is not predicted."""
    alg = rec["algorithm"]
    if alg not in PREDICTED or rec.get("error") or not rec.get("ncu") or not rec.get("time"):
        return None
    cfg = AttentionConfig.make(**rec["config"])
    model_alg, tiling = planned(alg, cfg, Tiling.make(**rec["tiling"]) if rec.get("tiling") else None, hw.sm_count,
                                recorded_blocks(rec["ncu"]) if alg == "flash3" else None)
    # 4 steps a block keeps validation to about a minute; bytes and work are exact whatever the folding (flash1
    # and the naive GEMMs keep their own steps). Against 16 steps it moves predicted time by a median of 0% and
    # at most 25% (flash2 and PyTorch, B1 H8 N4096 d64 causal) over the 160 validation records (measured
    # 2026-11-30, third session, with the fitted traits of that day)
    kt = run_traits(alg, cfg, tiling, traits or {}, hw.clock_hz)
    n = rec["ncu"]
    if alg == "torch_flash" and kt:
        codes = torch_fa2.recorded_code(n)
        kt = {name: replace(t, code_bytes=codes[name]) if name in codes else t for name, t in kt.items()}
    # every block simulated (the model the fit and this table hold to account; bounded-cost predictions sit within
    # a few percent of it: docs/model.md)
    # (flash3's and cuDNN's kernels fold into no fewer than their `least_steps`)
    r = simulate(cfg, model_alg, hw, tiling, traits=kt, cold_l2=True, max_steps=4, exact=EXACT,
                 gemm_tiles=recorded_gemm_tiles(n) if alg == "naive" and cfg.pass_ == "forward" else None)
    meas_k = [k["gpu__time_duration.sum"] for k in n.get("kernels", [])]
    family = alg + {"forward": "", "backward": " bwd", "forward+backward": " fwd+bwd"}[cfg.pass_]
    return Row(key=rec["key"], set=rec["set"], algorithm=family, label=cfg.label(),
               pred_time_s=sum(k.time_s for k in r.kernels), meas_time_s=n["duration_s"],
               event_time_s=rec["time"]["median_s"],
               pred_dram_bytes=r.hbm_read_bytes + sum(k.hbm_write_bytes for k in r.kernels),
               meas_dram_bytes=n["dram_read_bytes"] + n["dram_write_bytes"],
               pred_l2_bytes=counters.l2_bytes(r, counters.for_profile(hw.key)), meas_l2_bytes=n["l2_bytes"],
               pred_kernel_s=[k.time_s for k in r.kernels],
               meas_kernel_s=meas_k if len(meas_k) == len(r.kernels) else [],
               run=alg + (f" {tiling.block_q}x{tiling.block_kv} {tiling.warps}w {tiling.stages}st"
                          if rec.get("tiling") else ""))


def recorded_gemm_tiles(ncu: dict) -> dict[str, GemmTile] | None:
    """The tiles of the cuBLAS kernels a naive record ran (qk first, pv last), read from their names; None where
    a name gives none (then the engine takes cuBLAS's usual tiles)."""
    ks = ncu.get("kernels", [])
    if len(ks) < 2:
        return None
    qk, pv = GemmTile.from_kernel_name(ks[0]["name"]), GemmTile.from_kernel_name(ks[-1]["name"])
    return {"qk": qk, "pv": pv} if qk and pv else None


def validate(records: list[dict], hw: HardwareProfile, which: str = "validation",
             traits: dict[str, Traits] | None = None, progress=None) -> list[Row]:
    if which not in SETS + ("all",):
        raise IosimError(f"--set must be one of {', '.join(SETS)} or all, got '{which}'")
    chosen = [r for r in records if which == "all" or r.get("set") == which]
    rows = []
    for rec in (progress(chosen) if progress else chosen):
        row = predict(rec, hw, traits)
        if row is not None:
            rows.append(row)
    return rows


def summary(rows: list[Row]) -> dict[tuple[str, str], dict[str, float]]:
    """Per (set, algorithm): count, and median and max absolute relative error of time, DRAM and L2 bytes."""
    out = {}
    for key in sorted({(r.set, r.algorithm) for r in rows}):
        sel = [r for r in rows if (r.set, r.algorithm) == key]
        s = {"n": len(sel)}
        for what in ("time", "dram", "l2"):
            errs = [abs(getattr(r, f"{what}_err")) for r in sel]
            s[f"{what}_median"] = statistics.median(errs)
            s[f"{what}_max"] = max(errs)
        out[key] = s
    return out


def bias(rows: list[Row]) -> dict[tuple[str, str], dict[str, float]]:
    """Per (set, run): count, and the mean and median of the signed relative time error: where one build of a
    kernel is predicted slow or fast as a whole, which the absolute errors of `summary` do not show."""
    out = {}
    for key in sorted({(r.set, r.run or r.algorithm) for r in rows}):
        errs = [r.time_err for r in rows if (r.set, r.run or r.algorithm) == key]
        out[key] = {"n": len(errs), "time_mean": statistics.fmean(errs), "time_median": statistics.median(errs)}
    return out


def over_thresholds(summ: dict, limits: dict[str, float | None]) -> list[str]:
    """The summaries beyond a limit ('time_median': 0.05, ...), as readable lines."""
    bad = []
    for (st, alg), s in summ.items():
        for name, lim in limits.items():
            if lim is not None and not s[name] <= lim:   # NaN, an error that cannot be computed, never passes
                bad.append(f"{st} {alg}: {name.replace('_', ' ')} error {s[name]:.1%} > {lim:.1%}")
    return bad


def rows_as_json(rows: list[Row]) -> list[dict]:
    return [asdict(r) | {"time_err": r.time_err, "dram_err": r.dram_err, "l2_err": r.l2_err} for r in rows]


def markdown(summ: dict, title: str) -> str:
    """The summary as a Markdown table, a row per (set, algorithm): what docs/accuracy.md holds."""
    lines = [title, "", "| set | algorithm | n | time median | time max | DRAM median | DRAM max | L2 median | L2 max |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (st, alg), s in summ.items():
        lines.append(f"| {st} | {alg} | {s['n']} | " + " | ".join(
            f"{s[k]:.1%}" for k in ("time_median", "time_max", "dram_median", "dram_max", "l2_median", "l2_max")) + " |")
    return "\n".join(lines) + "\n"
