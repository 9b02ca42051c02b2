"""How attention is executed: the kernels, their grids and their steps, for naive and tiled algorithms."""
from __future__ import annotations

from typing import Literal

from ..errors import IosimError
from ..hardware import HardwareProfile
from ..workload import STAT_BYTES, AttentionConfig
from .flash import Flash1Kernel, Flash2Kernel, SplitCombineKernel
from .kernel import Access, KernelPlan, Plan, Step, Traits
from ..kernels import cublas
from ..kernels.cublas import GemmTile
from .naive import NaiveKernel
from .tiling import Tiling

Algorithm = Literal["naive", "flash1", "flash2"]
ALGORITHMS = ("naive", "flash1", "flash2")

__all__ = ["ALGORITHMS", "Access", "Algorithm", "GemmTile", "KernelPlan", "Plan", "Step", "Tiling",
           "Traits", "build_plan", "resolve_tiling"]


def resolve_tiling(cfg: AttentionConfig, algorithm: str, tiling: Tiling | None) -> Tiling | None:
    """The tiling an algorithm runs with: the given one (its loop order set to the algorithm), or practice."""
    if algorithm == "naive":
        return None
    if algorithm not in ALGORITHMS:
        raise IosimError(f"unknown algorithm '{algorithm}'; choose one of {', '.join(ALGORITHMS)}")
    if tiling is None:
        return Tiling.practice(cfg, loop_order=algorithm)
    if algorithm == "flash1" and tiling.kv_splits > 1:
        raise IosimError(f"kv_splits = {tiling.kv_splits}: splitting a query block's keys is flash2's split-KV path; "
                         "flash1 has none (use 1)")
    return tiling if tiling.loop_order == algorithm else tiling.model_copy(update={"loop_order": algorithm})


def build_plan(cfg: AttentionConfig, algorithm: str, hw: HardwareProfile, tiling: Tiling | None = None,
               traits: Traits | dict[str, Traits] | None = None,
               gemm_tiles: dict[str, GemmTile] | None = None) -> Plan:
    """Plan `algorithm` ('naive', 'flash1', 'flash2') for `cfg`; a tiling that cannot fit on `hw` is refused.
    traits: one for every kernel, or per kernel name ('naive_qk', 'naive_softmax', ...; others get Traits()).
    gemm_tiles: naive's cuBLAS tiles by GEMM ('qk', 'pv'); those not given are cuBLAS's choice on `hw`."""
    def traits_of(name: str) -> Traits:
        if isinstance(traits, dict):
            return traits.get(name, Traits())
        return traits or Traits()

    default = tiling is None
    tiling = resolve_tiling(cfg, algorithm, tiling)
    if default and tiling is not None:   # the default tiling shrinks to one that fits, rather than refusing
        tiling = tiling.shrunk_to_fit(cfg, hw)
    hw.tensor_flops_per_s(cfg.dtype)     # a dtype the chip has no tensor cores for is refused here, not later
    tb = cfg.tensor_bytes()
    inputs = ["Q", "K", "V"]
    if tiling is None:
        kernels: list[KernelPlan] = [NaiveKernel(cfg, k, traits_of(f"naive_{k}"), cublas.for_chip(hw), gemm_tiles)
                                     for k in ("qk", "softmax", "pv")]
        live = [inputs + ["S"], inputs + ["S", "P"], inputs + ["P", "O"]]
    else:
        tiling.check_fits(cfg, hw)
        if tiling.loop_order == "flash2" and tiling.kv_splits > 1:
            n = tiling.kv_splits
            kernels = [Flash2Kernel(cfg, tiling, traits_of("flash2_fwd_split")),
                       SplitCombineKernel(cfg, n, traits_of("flash2_combine"))]
            rows = cfg.bh * cfg.seqlen_q
            tb = tb | {"Oacc": n * rows * cfg.head_dim * 4, "Lacc": n * rows * STAT_BYTES}
            live = [inputs + ["Oacc", "Lacc"], inputs + ["Oacc", "Lacc", "O", "L"]]
        elif tiling.loop_order == "flash2":
            kernels = [Flash2Kernel(cfg, tiling, traits_of("flash2_fwd"))]
            live = [inputs + ["O", "L"]]
        else:
            kernels = [Flash1Kernel(cfg, tiling, traits_of("flash1_fwd"))]
            rows = cfg.bh * cfg.seqlen_q
            tb = tb | {"Oacc": rows * cfg.head_dim * 4, "m": rows * STAT_BYTES, "l": rows * STAT_BYTES}
            live = [inputs + ["O", "L", "Oacc", "m", "l"]]
    for k in kernels:
        if k.blocks_per_sm(hw) < 1:
            raise IosimError(f"kernel {k.name} cannot fit one block on an SM of {hw.key} "
                             f"({k.smem_bytes} B shared memory, {k.threads} threads)")
    return Plan(algorithm=algorithm, kernels=kernels, tensor_bytes=tb, live=live, tiling=tiling)
