"""How attention is executed: the kernels, their grids and their steps, for naive and tiled algorithms."""
from __future__ import annotations

from typing import Literal

from ..errors import IosimError
from ..hardware import HardwareProfile
from ..workload import STAT_BYTES, AttentionConfig
from .flash import Flash1Kernel, Flash2Kernel, SplitCombineKernel
from . import flash3
from .kernel import Access, KernelPlan, Plan, Step, Traits
from ..kernels import cublas
from ..kernels.cublas import GemmTile
from .eager import MEASURED, EagerProgram, eager_backward, eager_forward, program_bytes
from .align1 import cublas_gemm, partials, with_partials
from .naive import NaiveKernel
from .passes import flash_backward, grad_bytes, naive_backward
from .tiling import Tiling

Algorithm = Literal["naive", "flash1", "flash2", "flash3", "eager", "torch_flash", "torch_cudnn"]
# eager: PyTorch's eager naive attention, operator by operator (`plan.eager`); torch_flash: FlashAttention-2's
# kernels (flash2) as PyTorch's SDPA runs them, with the layout copies it adds around the backward; flash3: the
# Hopper forward (`plan.flash3`); torch_cudnn: SDPA's cuDNN forward on sm_90, flash3's design (`flash3.CudnnFwdKernel`)
ALGORITHMS = ("naive", "flash1", "flash2", "flash3", "eager", "torch_flash", "torch_cudnn")
HOPPER = flash3.ALGORITHMS   # forward only, wgmma, one tiling

__all__ = ["ALGORITHMS", "Access", "Algorithm", "GemmTile", "KernelPlan", "Plan", "Step", "Tiling",
           "Traits", "build_plan", "resolve_tiling"]


def resolve_tiling(cfg: AttentionConfig, algorithm: str, tiling: Tiling | None,
                   sm_count: int | None = None) -> Tiling | None:
    """The tiling an algorithm runs with: the given one (its loop order set to the algorithm), or practice; a Hopper
    kernel's own on `sm_count` SMs, or another it is built at."""
    if algorithm not in ALGORITHMS:
        raise IosimError(f"unknown algorithm '{algorithm}'; choose one of {', '.join(ALGORITHMS)}")
    if algorithm in ("naive", "eager"):
        return None
    if algorithm in HOPPER:
        own = flash3.tiling(cfg, algorithm, sm_count)
        if tiling is None:
            return own
        for blocks in flash3.built(cfg, algorithm):
            t = flash3.tiling(cfg, algorithm, blocks=blocks)
            if tiling.model_copy(update={"q_order": t.q_order}) == t:
                return t
        raise IosimError(f"{algorithm} runs its own tiling ({own.describe()}); leave the tiling out")
    loop = "flash2" if algorithm == "torch_flash" else algorithm
    if tiling is None:
        return Tiling.practice(cfg, loop_order=loop)
    if algorithm == "flash1" and tiling.kv_splits > 1:
        raise IosimError(f"kv_splits = {tiling.kv_splits}: splitting a query block's keys is flash2's split-KV path; "
                         "flash1 has none (use 1)")
    return tiling if tiling.loop_order == loop else tiling.model_copy(update={"loop_order": loop})


def build_plan(cfg: AttentionConfig, algorithm: str, hw: HardwareProfile, tiling: Tiling | None = None,
               traits: Traits | dict[str, Traits] | None = None,
               gemm_tiles: dict[str, GemmTile] | None = None, program: EagerProgram = MEASURED) -> Plan:
    """Plan `algorithm` ('naive', 'flash1', 'flash2', 'eager') for `cfg`'s pass; a tiling that cannot fit on `hw`
    is refused. traits: one for every kernel of the forward, or per kernel name ('naive_qk', 'flash2_bwd', ...;
    others get Traits()). gemm_tiles: the cuBLAS tiles of naive's GEMMs by shape ('qk', 'pv'); those not given are
    cuBLAS's choice on `hw`. program: which eager code runs (`eager.EagerProgram`; algorithm 'eager' only)."""
    def traits_of(name: str, forward: bool = False) -> Traits:
        if isinstance(traits, dict):
            return traits.get(name, Traits())
        return (traits or Traits()) if forward else Traits()

    if algorithm in HOPPER and "backward" in cfg.passes:
        raise IosimError(f"{algorithm} has a forward pass only here; plan its backward as flash2's (pass: forward)")
    default = tiling is None and algorithm not in HOPPER
    tiling = resolve_tiling(cfg, algorithm, tiling, hw.sm_count)
    if default and tiling is not None:   # the default tiling shrinks to one that fits, rather than refusing
        tiling = tiling.shrunk_to_fit(cfg, hw)
    hw.tensor_flops_per_s(cfg.dtype)     # a dtype the chip has no tensor cores for is refused here, not later
    if algorithm in HOPPER:
        flash3.check_chip(cfg, hw, algorithm)
    fwd = cfg.with_pass("forward")
    tb = fwd.tensor_bytes()
    kernels: list[KernelPlan] = []
    live: list[list[str]] = []
    blas = cublas.for_chip(hw)
    if "forward" in cfg.passes:
        kernels, live, tb = _forward(fwd, algorithm, hw, tiling, lambda n: traits_of(n, True), blas, gemm_tiles, tb,
                                     program)
    if "backward" in cfg.passes:
        if algorithm == "eager":
            k, lv = eager_backward(cfg, traits_of, blas, gemm_tiles, program)
            tb = tb | program_bytes(cfg, program)
        elif algorithm == "naive":
            k, lv = naive_backward(cfg, traits_of, blas, gemm_tiles)
        else:
            k, lv = flash_backward(cfg, tiling.loop_order, hw, tiling, traits_of, sdpa=algorithm == "torch_flash")
        kernels, live, tb = kernels + k, live + lv, tb | grad_bytes(cfg)
    plan = Plan(algorithm=algorithm, kernels=kernels, tensor_bytes=tb | partials(kernels), live=live, tiling=tiling)
    for k in plan.distinct():
        if k.blocks_per_sm(hw) < 1:
            raise IosimError(f"kernel {k.name} cannot fit one block on an SM of {hw.key} "
                             f"({k.smem_bytes} B shared memory, {k.threads} threads)")
    return plan


def _forward(cfg, algorithm, hw, tiling, traits_of, blas, gemm_tiles, tb, program=MEASURED):
    """The forward's kernels, the tensors each holds, and every tensor's bytes."""
    inputs = ["Q", "K", "V"]
    if algorithm == "eager":
        kernels, live = eager_forward(cfg, traits_of, blas, gemm_tiles, program)
        return kernels, live, tb | {"mask": cfg.seqlen_q * cfg.seqlen_k} | program_bytes(cfg, program)
    if tiling is None:
        qk = cublas_gemm(cfg, "qk", traits_of("naive_qk"), traits_of, blas, gemm_tiles)
        pv = cublas_gemm(cfg, "pv", traits_of("naive_pv"), traits_of, blas, gemm_tiles)
        kernels: list[KernelPlan] = qk + [NaiveKernel(cfg, "softmax", traits_of("naive_softmax"), blas, gemm_tiles)] + pv
        return kernels, with_partials(qk, inputs + ["S"]) + [inputs + ["S", "P"]] + with_partials(pv, inputs + ["P", "O"]), tb
    if algorithm == "flash3":
        return [flash3.Flash3Kernel(cfg, tiling, traits_of("flash3_fwd"))], [inputs + ["O", "L"]], tb
    if algorithm == "torch_cudnn":
        return [flash3.CudnnFwdKernel(cfg, tiling, traits_of("cudnn_fwd"))], [inputs + ["O", "L"]], tb
    tiling.check_fits(cfg, hw)
    if tiling.loop_order == "flash2" and tiling.kv_splits > 1:
        n = tiling.kv_splits
        kernels = [Flash2Kernel(cfg, tiling, traits_of("flash2_fwd_split")),
                   SplitCombineKernel(cfg, n, traits_of("flash2_combine"))]
        rows = cfg.bh * cfg.seqlen_q
        tb = tb | {"Oacc": n * rows * cfg.head_dim * 4, "Lacc": n * rows * STAT_BYTES}
        return kernels, [inputs + ["Oacc", "Lacc"], inputs + ["Oacc", "Lacc", "O", "L"]], tb
    if tiling.loop_order == "flash2":
        return [Flash2Kernel(cfg, tiling, traits_of("flash2_fwd"))], [inputs + ["O", "L"]], tb
    rows = cfg.bh * cfg.seqlen_q
    tb = tb | {"Oacc": rows * cfg.head_dim * 4, "m": rows * STAT_BYTES, "l": rows * STAT_BYTES}
    return [Flash1Kernel(cfg, tiling, traits_of("flash1_fwd"))], [inputs + ["O", "L", "Oacc", "m", "l"]], tb
