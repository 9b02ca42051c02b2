"""The discrete-event engine: runs a plan's kernels on a profile's SMs, SRAM, L2 and HBM (SimPy)."""
from __future__ import annotations

from ..errors import IosimError
from ..hardware import HardwareProfile
from ..kernels.cublas import GemmTile
from ..plan import Tiling, Traits, build_plan
from ..workload import AttentionConfig
from .result import KernelResult, SimResult, Timeline
from .run import run_plan

__all__ = ["KernelResult", "SimResult", "Timeline", "simulate"]


def simulate(cfg: AttentionConfig, algorithm: str, hw: HardwareProfile, tiling: Tiling | None = None, *,
             l2: bool = True, traits: Traits | dict[str, Traits] | None = None, timeline: bool = False,
             max_steps: int = 16, cold_l2: bool = False, gemm_tiles: dict[str, GemmTile] | None = None) -> SimResult:
    """Simulate one algorithm ('naive', 'flash1', 'flash2') of `cfg` on `hw`.

    l2=False (or a profile with l2_capacity_mib = 0) gives the paper's two-level model: every load and store
    goes to HBM. `max_steps` folds a block's K/V loop into at most that many steps (bytes and work stay exact).
    cold_l2=True writes back and empties L2 before every kernel, as Nsight Compute measures by default.
    gemm_tiles: naive's cuBLAS tiles ('qk', 'pv'), where known (a record's kernel names); else cuBLAS's choice on `hw`.
    """
    if not isinstance(max_steps, int) or max_steps < 3:
        raise IosimError(f"max_steps must be an integer of at least 3 (a block's first and last steps stay whole), "
                         f"got {max_steps!r}")
    plan = build_plan(cfg, algorithm, hw, tiling, traits, gemm_tiles)
    kernels, flush, events, tl = run_plan(plan, hw, cfg.dtype, l2, max_steps, timeline, cold_l2)
    return SimResult(algorithm=algorithm, profile=hw.key, config_label=cfg.label(),
                     l2_enabled=l2 and hw.l2_bytes > 0, kernels=kernels, hbm_flush_bytes=flush,
                     peak_footprint_bytes=plan.peak_footprint_bytes(), events=events, timeline=tl)
