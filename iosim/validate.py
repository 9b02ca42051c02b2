"""Predicted against measured: the engine's time, DRAM bytes and L2 bytes for each stored measurement record.

Predictions are made as the measurements were taken: L2 emptied before each kernel (Nsight Compute's default
--cache-control all) and DRAM writes counted only while a kernel runs. Time is compared with the sum of the
kernels' durations that Nsight Compute reported (device time, no launch gaps); the CUDA-event time of the whole
call, which includes the launcher's host work, is kept beside it. Our kernels are simulated with the register
counts ptxas gives them (`plan.compiled`), so the engine holds as many of their blocks an SM as the GPU, and with
their machine code's size, which each reads from HBM through the emptied L2 as it starts; PyTorch's kernels too,
with the code sizes torch's library carries for them (`recorded_fa2_code`, by the names the record ran).
cuBLAS's GEMMs are not built here: their code is not counted (measured, 15-22 KB a GEMM beyond their data).
Naive's GEMMs run in the tiles and clusters cuBLAS chose for the record, read from its kernels' names
(`recorded_gemm_tiles`), as our kernels run in the record's tiling.

L2 bytes are compared as Nsight's `lts__t_bytes` counts them: the SMs' requests plus, on a chip with two L2
partitions, the crossings between them (half the read misses and writes, of our kernels and cuBLAS's alike;
`experiments/l2_counters/l2_breakdown_h200_2026-11-30` takes the counter apart). Two things the counter does not
see in full, where the profile says how much it sees: a grid's first wave asking for the same K/V lines in step
(`HardwareProfile.l2_merge_share`), and the second of the two requests our kernels write each sector of O with
(`l2_partial_write_share`; flash1's own, `FLASH1_PARTIAL_WRITE_SHARE`); and one the counter sees more of: our
kernels' code, read from L2 by each GPC's cache (`l2_code_readers`). All change the count, not the time. PyTorch's
kernel also writes its register spills through L1 to L2 at every key tile (`FA2_SPILL_BYTES`): L2 writes, counted
and timed.

PyTorch's SDPA flash kernel is predicted as flash2 with FlashAttention-2's tiling (128x128, 4 warps for d <= 64;
128x64 for d 128), or its split-KV path and combine kernel where FlashAttention-2's heuristic takes it
(`fa2_tiling`). PyTorch's eager naive attention (more kernels than the paper's three) is not predicted.
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from .engine import simulate
from .errors import IosimError
from .hardware import HardwareProfile
from .plan import GemmTile, Tiling, Traits
from .plan.compiled import code_bytes, fa2_build, fa2_code_bytes, pipe_cycles, registers, softmax_code_bytes
from .plan.compiled import key as build_key
from .workload import AttentionConfig

PREDICTED = ("naive", "flash1", "flash2", "torch_flash")


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


def load_records(folder: str | Path) -> list[dict]:
    folder = Path(folder)
    if not folder.is_dir():
        raise IosimError(f"no measurement folder at {folder}")
    recs = [json.loads(f.read_text()) for f in sorted(folder.glob("*.json"))]
    if not recs:
        raise IosimError(f"no records (*.json) in {folder}")
    return recs


def fa2_tiling(cfg: AttentionConfig, sm_count: int = 132) -> Tiling:
    """FlashAttention-2's forward tiling as PyTorch's SDPA flash backend runs it: 128x128 tiles (128x64 above
    d 64), or, where batch x heads x 64-row query blocks would not reach 80% of two blocks per SM, its split-KV
    kernel (64-row blocks; 256, 128 or 64 keys a tile) with the number of splits its heuristic picks
    (`num_splits_heuristic` in FlashAttention-2's flash_api.cpp, which PyTorch vendors)."""
    d = cfg.head_dim
    n_kv_block = 256 if d <= 64 else 128 if d <= 128 else 64
    m_blocks = cfg.bh * -(-cfg.seqlen_q // 64)
    splits = _fa2_num_splits(m_blocks, 2 * sm_count, -(-cfg.seqlen_k // n_kv_block), 128)
    if splits > 1:
        return Tiling(block_q=64, block_kv=n_kv_block, warps=4, stages=2, kv_splits=splits)
    return Tiling(block_q=128, block_kv=128 if d <= 64 else 64, warps=4, stages=2)


# PyTorch's FlashAttention-2 kernels as built, under Nsight Compute (experiments/fa2_build/fa2_launch.sh,
# experiments/fa2_build/fa2_launch_h200_2026-12-01): the main and split-KV attention kernels 246-255 registers a
# thread, the split-KV combine kernel 54; their shared memory a Q tile and one K and one V tile
FA2_REGISTERS = {"flash2_fwd": 255, "flash2_fwd_split": 255, "flash2_combine": 54}

# and its register spills: bytes a block stores to local memory per interior and per diagonal key tile, which L1
# writes through to L2 (Nsight Compute's local-store bytes over the tiles the engine plans; five busy fp16 grids,
# experiments/l2_counters/l2_writes.sh SET=torch, experiments/l2_counters/l2_writes_h200_2026-12-02, `l2_writes.fa2_spills`). d 64
# causal from one grid: its mean for both. The split-KV kernel's were not measured (none counted)
FA2_SPILL_BYTES = {(64, False): (4480, 4480), (64, True): (6002, 6002),
                   (128, False): (7616, 7616), (128, True): (7176, 11172)}


# our flash1 stores O as flash2 does, two requests a sector, but amid its own fp32 O, m and l traffic L2 merges
# most second requests: 0.01-0.34 counted over six grids, median 0.26 (experiments/l2_counters/l2_writes.sh with SET=flash1,
# experiments/l2_counters/l2_writes_h200_2026-12-02), against the chip's 0.63 measured on flash2
FLASH1_PARTIAL_WRITE_SHARE = 0.26


def fa2_smem_bytes(cfg: AttentionConfig, tiling: Tiling) -> int:
    """FlashAttention-2's shared memory a block (`Flash_fwd_kernel_traits::kSmemSize`, Q not sharing K's
    buffer): the Q tile and one buffer each of K and V; it loads the next K tile into the buffer its last Q K^T
    read while P V runs."""
    return (tiling.block_q + 2 * tiling.block_kv) * cfg.head_dim * cfg.elem_bytes


def _fa2_num_splits(work: int, slots: int, n_blocks: int, max_splits: int) -> int:
    """FlashAttention-2's choice: no split when the blocks nearly fill the slots; else the fewest splits whose
    wave efficiency is within 85% of the best, among the split counts that change the blocks per split."""
    if work >= 0.8 * slots:
        return 1
    max_splits = min(max_splits, slots, n_blocks)
    eff = {}
    for n in range(1, max_splits + 1):
        if n == 1 or -(-n_blocks // n) != -(-n_blocks // (n - 1)):
            waves = work * n / slots
            eff[n] = waves / math.ceil(waves)
    best = max(eff.values(), default=0.0)
    return next((n for n in sorted(eff) if eff[n] >= 0.85 * best), 1)


def predict(rec: dict, hw: HardwareProfile, traits: dict[str, Traits] | None = None) -> Row | None:
    """The engine's prediction for one record, or None where the record is not predicted."""
    alg = rec["algorithm"]
    if alg not in PREDICTED or rec.get("error") or not rec.get("ncu") or not rec.get("time"):
        return None
    cfg = AttentionConfig.make(**rec["config"])
    if alg == "torch_flash":
        model_alg, tiling = "flash2", fa2_tiling(cfg, hw.sm_count)
    else:
        model_alg, tiling = alg, Tiling.make(**rec["tiling"]) if rec.get("tiling") else None
    # 4 steps a block keeps validation to about a minute; bytes and work are exact whatever the folding (flash1
    # and the naive GEMMs keep their own steps). Against 16 steps it moves predicted time by a median of 0% and
    # at most 25% (flash2 and PyTorch, B1 H8 N4096 d64 causal) over the 160 validation records (measured
    # 2026-11-30, third session, with the fitted traits of that day)
    kt = run_traits(alg, cfg, tiling, traits or {}, hw.clock_hz)
    n = rec["ncu"]
    if alg == "torch_flash" and kt:
        codes = recorded_fa2_code(n)
        kt = {name: replace(t, code_bytes=codes[name]) if name in codes else t for name, t in kt.items()}
    r = simulate(cfg, model_alg, hw, tiling, traits=kt, cold_l2=True, max_steps=4,
                 gemm_tiles=recorded_gemm_tiles(n) if alg == "naive" else None)
    meas_k = [k["gpu__time_duration.sum"] for k in n.get("kernels", [])]
    return Row(key=rec["key"], set=rec["set"], algorithm=alg, label=cfg.label(),
               pred_time_s=sum(k.time_s for k in r.kernels), meas_time_s=n["duration_s"],
               event_time_s=rec["time"]["median_s"],
               pred_dram_bytes=r.hbm_read_bytes + sum(k.hbm_write_bytes for k in r.kernels),
               meas_dram_bytes=n["dram_read_bytes"] + n["dram_write_bytes"],
               pred_l2_bytes=r.l2_counted_bytes, meas_l2_bytes=n["l2_bytes"],
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


def recorded_fa2_code(ncu: dict) -> dict[str, int]:
    """The code bytes of the PyTorch flash kernels a record ran (torch's library, `plan.compiled.fa2_code_bytes`),
    by the engine's names for them: the main or split-KV kernel, and the combine kernel."""
    out = {}
    for k in ncu.get("kernels", []):
        code = fa2_code_bytes(k["name"])
        if code:
            name = ("flash2_combine" if "combine" in k["name"] else
                    "flash2_fwd_split" if "splitkv" in k["name"] else "flash2_fwd")
            out[name] = code
    return out


def run_traits(alg: str, cfg: AttentionConfig, tiling: Tiling | None, traits: dict[str, Traits],
               clock_hz: float) -> Traits | dict[str, Traits] | None:
    """The traits `alg`'s kernels run with at `cfg` and `tiling`: the fitted ones, and for our kernels what nvcc
    built of them: their register count (ptxas), so that the engine holds as many blocks an SM as the chip did, and
    their code bytes (and for flash1 the share of its partial writes L2 counts); for PyTorch's kernel,
    FlashAttention-2's registers as Nsight Compute read them, its shared memory, its O staged into whole
    sectors, and its register spills written through to L2 (its code bytes depend on the instance it ran:
    `recorded_fa2_code`); for both, where Nsight Compute counted the build, its non-tensor pipe cycles
    (`plan.compiled.pipe_cycles`, in cycles of `clock_hz`)."""
    kt = kernel_traits(alg, traits)
    if alg == "torch_flash" and tiling is not None:
        base = kt or Traits()
        per, diag = FA2_SPILL_BYTES.get((cfg.head_dim, cfg.causal), (0, 0))
        tile, block = pipe_cycles(fa2_build(cfg.head_dim, tiling, cfg.dtype), clock_hz) or (0.0, 0.0)
        return {name: replace(base, registers_per_thread=regs, o_fragment_stores=False,
                              smem_bytes=None if name == "flash2_combine" else fa2_smem_bytes(cfg, tiling),
                              spill_bytes_per_tile=per if name == "flash2_fwd" else 0,
                              spill_bytes_per_diagonal_tile=diag if name == "flash2_fwd" else 0,
                              tile_pipe_cycles=0.0 if name == "flash2_combine" else tile,
                              block_pipe_cycles=0.0 if name == "flash2_combine" else block)
                for name, regs in FA2_REGISTERS.items()}
    if alg == "naive":
        code = softmax_code_bytes(cfg.dtype)
        return kt | {"naive_softmax": replace(kt["naive_softmax"], code_bytes=code)} if code else kt
    if alg not in ("flash1", "flash2") or tiling is None:
        return kt
    regs, code = registers(alg, cfg.head_dim, tiling, cfg.dtype), code_bytes(alg, cfg.head_dim, tiling, cfg.dtype)
    if not regs:
        return kt
    share = FLASH1_PARTIAL_WRITE_SHARE if alg == "flash1" else None
    tile, block = pipe_cycles(build_key(alg, cfg.head_dim, tiling.block_q, tiling.block_kv, tiling.warps,
                                        tiling.stages, cfg.dtype == "bf16"), clock_hz) or (0.0, 0.0)
    return replace(kt or Traits(), registers_per_thread=regs, code_bytes=code, partial_write_share=share,
                   tile_pipe_cycles=tile, block_pipe_cycles=block)


def kernel_traits(alg: str, traits: dict[str, Traits]) -> Traits | dict[str, Traits] | None:
    """The traits each planned kernel of `alg` runs with, from fitted traits keyed by algorithm; naive's GEMMs
    take 'naive' and its softmax 'naive_softmax' (fitted apart: a row-per-block softmax is another kind of
    kernel)."""
    if alg != "naive":
        return traits.get(alg)
    gemm = traits.get("naive", Traits())
    return {"naive_qk": gemm, "naive_pv": gemm, "naive_softmax": traits.get("naive_softmax", gemm)}


def validate(records: list[dict], hw: HardwareProfile, which: str = "validation",
             traits: dict[str, Traits] | None = None, progress=None) -> list[Row]:
    if which not in ("validation", "calibration", "all"):
        raise IosimError(f"--set must be validation, calibration or all, got '{which}'")
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
            if lim is not None and s[name] > lim:
                bad.append(f"{st} {alg}: {name.replace('_', ' ')} error {s[name]:.1%} > {lim:.1%}")
    return bad


def rows_as_json(rows: list[Row]) -> list[dict]:
    return [asdict(r) | {"time_err": r.time_err, "dram_err": r.dram_err, "l2_err": r.l2_err} for r in rows]
