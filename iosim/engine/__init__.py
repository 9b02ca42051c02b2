"""The discrete-event engine: runs a plan's kernels on a profile's SMs, SRAM, L2 and HBM (SimPy)."""
from __future__ import annotations

from fractions import Fraction

from ..errors import IosimError
from ..hardware import HardwareProfile
from ..kernels.cublas import GemmTile
from ..plan import Tiling, Traits, build_plan
from ..plan.eager import MEASURED, EagerProgram
from ..workload import AttentionConfig
from .result import KernelResult, SimResult, Timeline
from . import scale
from .run import run_plan

__all__ = ["KernelResult", "SimResult", "Timeline", "simulate"]


def simulate(cfg: AttentionConfig, algorithm: str, hw: HardwareProfile, tiling: Tiling | None = None, *,
             l2: bool = True, traits: Traits | dict[str, Traits] | None = None, timeline: bool = False,
             max_steps: int = 16, cold_l2: bool = False, gemm_tiles: dict[str, GemmTile] | None = None,
             exact: bool = False, program: EagerProgram = MEASURED) -> SimResult:
    """Simulate one algorithm ('naive', 'flash1', 'flash2') of `cfg` on `hw`.

    l2=False (or a profile with l2_capacity_mib = 0) gives the paper's two-level model: every load and store
    goes to HBM. `max_steps` folds a block's K/V loop into at most that many steps (bytes and work stay exact).
    cold_l2=True writes back and empties L2 before every kernel, as Nsight Compute measures by default.
    gemm_tiles: naive's cuBLAS tiles ('qk', 'pv'), where known (a record's kernel names); else cuBLAS's choice on `hw`.
    A plan that would cost the engine more than `scale.BUDGET` is simulated on fewer (batch, head) pairs and
    extrapolated (`SimResult.scaled` says from what); exact=True simulates every block however long it takes.
    program: which eager code runs (`plan.eager.EagerProgram`: the one measured as torch_naive, or another's).
    """
    if not isinstance(max_steps, int) or max_steps < 3:
        raise IosimError(f"max_steps must be an integer of at least 3 (a block's first and last steps stay whole), "
                         f"got {max_steps!r}")
    plan = build_plan(cfg, algorithm, hw, tiling, traits, gemm_tiles, program)
    scaled = None
    if not exact and not timeline:
        cost = sum(scale.kernel_costs(plan, hw, max_steps))
        pairs = scale.pair_counts(cfg, plan, hw, max_steps, cost) if cost > scale.BUDGET else None
        runs = _reduced_runs(cfg, algorithm, hw, plan, pairs, l2, traits, max_steps, cold_l2, gemm_tiles, program) \
            if pairs else None
        if runs:
            (k1, f1, e1), (k2, f2, e2) = runs
            r = pairs[0]
            t = Fraction(cfg.bh - r, r)
            kernels = [scale.extrapolate(a, b, t, k.n_blocks) for a, b, k in zip(k1, k2, plan.kernels)]
            flush, events = scale.lerp(f1, f2, t), e1 + e2
            scaled = f"{cfg.bh} (batch, head) pairs extrapolated from runs of {r} and {2 * r}"
    if scaled is None:
        kernels, flush, events, tl = run_plan(plan, hw, cfg.dtype, l2, max_steps, timeline, cold_l2,
                                              None if exact else scale.BUDGET)
    else:
        tl = None
    return SimResult(algorithm=algorithm, profile=hw.key, config_label=cfg.label(),
                     l2_enabled=l2 and hw.l2_bytes > 0, kernels=kernels, hbm_flush_bytes=flush,
                     peak_footprint_bytes=plan.peak_footprint_bytes(), events=events, timeline=tl, scaled=scaled)


def _reduced_runs(cfg, algorithm, hw, plan, pairs, l2, traits, max_steps, cold_l2, gemm_tiles, program):
    """The runs of `plan` on pairs[0] and pairs[1] (batch, head) pairs, or None where a reduced plan would not
    run the same kernels as the full one."""
    out = []
    want = scale.shape(plan, hw)
    for r, budget in zip(pairs, (scale.BUDGET // 3, 2 * scale.BUDGET // 3)):
        small = scale.reduced(cfg, r)
        if small is None:
            return None
        tiles = None
        for k in plan.kernels:   # the full plan's cuBLAS tiles, whatever a smaller grid would make cuBLAS pick
            if getattr(k, "tiles", None):
                tiles = gemm_tiles or k.tiles
                break
        p = build_plan(small, algorithm, hw, plan.tiling, traits, tiles, program)
        if scale.shape(p, hw) != want:
            return None
        kernels, flush, events, _ = run_plan(p, hw, cfg.dtype, l2, max_steps, False, cold_l2, budget)
        out.append((kernels, flush, events))
    return out
