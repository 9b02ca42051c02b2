"""The traits each planned kernel runs with: the fitted values of its family (`iosim fit`) joined to the facts of
the build that runs it (ours from `builds`, PyTorch's from `torch_fa2`)."""
from __future__ import annotations

import re

from dataclasses import replace

from ..plan import flash3
from ..plan.traits import Build, Traits
from ..plan.tiling import Tiling
from ..workload import AttentionConfig
from . import torch_fa2
from .builds import (BWD_SPILLS, code_bytes, key as build_key, masked_pipe_cycles, pipe_cycles, registers, row_build,
                     softmax_code_bytes)

ALGORITHMS = ("naive", "flash1", "flash2", "flash3", "torch_flash", "torch_naive", "torch_cudnn")
# flash3's build (gpu_kernels/hopper.cu, nvcc 13.0 for sm_90a, every instance): its registers and its wgmma are what
# the kernel is (`plan.flash3.Flash3Kernel` sets them: `launch_registers` of its threads); its softmax, though
# designed to run under the other warpgroups' matmuls, measured in series with them
# (experiments/flash3_model/overlap.py), as is cuDNN's: the pipe table's tile is what
# the build's key tile measured beyond its matmuls (`builds.measured_tiles`)
FLASH3_BUILD = Build()
# cuDNN's sm_90 forward as PyTorch 2.11 / cuDNN 9 launch it (Nsight Compute, H100, N 8k d 128: 168 registers a
# thread, 232.45 kB (227 KiB, the most a block may have) of dynamic shared memory; experiments/flash3_pipeline/h100_2026-12-06)
CUDNN_BUILD = Build(registers_per_thread=168, smem_bytes=227 * 1024)

# kernels fitted one at a time on their own Nsight times (`iosim.fit_kernels`), each under its own name: eager
# PyTorch's elementwise and softmax kernels, and FlashAttention-2's backward (PyTorch's; iosim's flash2 backward
# plans the same kernels)
KERNEL_FAMILIES = ("eager_scale", "eager_mask_ones", "eager_mask_triu", "eager_masked_fill", "eager_masked_fill_vec",
                   "eager_softmax_warp", "eager_softmax_reg", "eager_softmax_smem", "eager_softmax_block",
                   "eager_mul", "eager_softmax_bwd_warp", "eager_softmax_bwd_block", "eager_masked_fill_bwd",
                   "eager_masked_fill_vec_bwd", "eager_scale_bwd", "sdpa_copy", "gqa_sum",
                   "flash2_bwd_dot", "flash2_bwd_convert", "flash2_bwd",
                   "iosim_bwd_dot", "iosim_flash2_bwd", "iosim_bwd_convert", "iosim_bwd_init", "iosim_flash1_bwd",
                   "iosim_softmax_bwd", "cublas_align1_qk", "cublas_align1_pv", "cublas_align1_pv_nt",
                   "cublas_splitk_reduce")
# cuBLAS's alignment-1 GEMMs (`plan.align1`), naive's and eager PyTorch's alike where the N x N rows are misaligned,
# and the reduce kernel after those it splits
ALIGN1_GEMMS = ("cublas_align1_qk", "cublas_align1_pv", "cublas_align1_pv_nt")
ALIGN1 = ALIGN1_GEMMS + ("cublas_splitk_reduce",)
# iosim's own backward kernels (gpu_kernels/backward.cu) are other builds than PyTorch's under the same planned
# names: planned kernel -> the family whose fitted traits it runs with, for our naive, flash1 and flash2
OWN_BACKWARD = {"flash2_bwd_dot": "iosim_bwd_dot", "flash2_bwd": "iosim_flash2_bwd",
                "flash2_bwd_convert": "iosim_bwd_convert", "flash1_bwd_init": "iosim_bwd_init",
                "flash1_bwd": "iosim_flash1_bwd", "flash1_bwd_convert": "iosim_bwd_convert",
                "naive_softmax_bwd": "iosim_softmax_bwd", "gqa_sum": "gqa_sum"}


def family_of(alg: str, kernel: str) -> str:
    """The fitted family a planned kernel of `alg` belongs to."""
    return OWN_BACKWARD.get(kernel, kernel) if alg in ("naive", "flash1", "flash2") else kernel


def planned(alg: str, cfg: AttentionConfig, tiling: Tiling | None, sm_count: int,
            blocks: tuple[int, int] | None = None) -> tuple[str, Tiling | None]:
    """The plan family iosim plans for `alg` and the tiling it runs: PyTorch's flash backend is `torch_flash`
    (flash2's kernels at FlashAttention-2's tiling, with SDPA's layout copies), its eager attention `eager`; ours
    run the tiling given; flash3 its geometry on `sm_count` SMs, or `blocks` (a record's, `recorded_blocks`)."""
    if alg == "torch_flash":
        return "torch_flash", torch_fa2.tiling(cfg, sm_count)
    if alg in flash3.ALGORITHMS:
        return alg, flash3.tiling(cfg, alg, sm_count, blocks)
    if alg == "torch_naive":
        return "eager", None
    return alg, tiling


def recorded_blocks(ncu: dict) -> tuple[int, int] | None:
    """(consumer warpgroups, key-tile width) of the flash3 build Nsight Compute named in a record, if it named one."""
    for k in ncu.get("kernels", []):
        m = re.search(r"flash3_fwd<\s*\d+,\s*(\d+),\s*\d+,\s*(\d+),", k.get("name", ""))
        if m:
            return int(m.group(2)), int(m.group(1))
    return None


def run_traits(alg: str, cfg: AttentionConfig, tiling: Tiling | None, fitted: dict[str, Traits],
               clock_hz: float) -> Traits | dict[str, Traits] | None:
    """The traits `alg`'s kernels run with at `cfg` and `tiling`: the fitted ones, and for our kernels what nvcc
    built of them: their register count (ptxas), so that the engine holds as many blocks an SM as the chip did,
    their code bytes and, where Nsight Compute counted the build, its non-tensor pipe cycles (in cycles of
    `clock_hz`); PyTorch's: `torch_fa2.build_traits`."""
    kt = kernel_traits(alg, fitted)
    if cfg.pass_ != "forward" or alg == "torch_naive":
        # per kernel: the forward's as below, the others by their own names; eager PyTorch's GEMMs are cuBLAS's, as
        # naive attention's
        if alg in ("naive", "flash1", "flash2"):
            own = {name: _with_build(fitted[fam], row_build(name, cfg.head_dim, cfg.dtype))
                   for name, fam in OWN_BACKWARD.items() if fam in fitted}
            for order in ("flash1", "flash2"):
                name, per = f"{order}_bwd", BWD_SPILLS.get((order, cfg.head_dim, cfg.causal), 0)
                if name in own and per:
                    own[name] = replace(own[name], spill_bytes_per_tile=per, spill_bytes_per_diagonal_tile=per)
        else:
            own = {name: fitted[name] for name in KERNEL_FAMILIES if name in fitted}
        gemm = {"naive": fitted["naive"], "eager_gemm": fitted["naive"]} if "naive" in fitted else {}
        gemm |= {name: fitted[name] for name in ALIGN1 if name in fitted}
        if alg == "torch_naive":
            return own | gemm
        fwd = run_traits(alg, cfg.with_pass("forward"), tiling, fitted, clock_hz)
        if isinstance(fwd, Traits):
            fwd = {name: fwd for name in ("naive_qk", "naive_softmax", "naive_pv", "flash1_fwd", "flash2_fwd",
                                          "flash2_fwd_split", "flash2_combine")}
        return (fwd or {}) | own | gemm
    if alg == "torch_flash" and tiling is not None:
        return torch_fa2.build_traits(cfg, tiling, kt, clock_hz)
    if alg in flash3.ALGORITHMS:
        t3 = tiling or flash3.tiling(cfg, alg)
        bkey = build_key(alg, cfg.head_dim, t3.block_q, t3.block_kv, t3.warps, t3.stages, cfg.dtype == "bf16")
        tile, block = pipe_cycles(bkey, clock_hz) or (0.0, 0.0)
        build = replace(FLASH3_BUILD if alg == "flash3" else CUDNN_BUILD, tile_pipe_cycles=tile,
                        block_pipe_cycles=block, masked_tile_pipe_cycles=masked_pipe_cycles(bkey, clock_hz))
        return Traits.join(kt.fitted if kt else None, build)
    if alg == "naive":
        code = softmax_code_bytes(cfg.dtype)
        return kt | {"naive_softmax": replace(kt["naive_softmax"], code_bytes=code)} if code else kt
    if alg not in ("flash1", "flash2") or tiling is None:
        return kt
    regs, code = registers(alg, cfg.head_dim, tiling, cfg.dtype), code_bytes(alg, cfg.head_dim, tiling, cfg.dtype)
    if not regs:
        return kt
    tile, block = pipe_cycles(build_key(alg, cfg.head_dim, tiling.block_q, tiling.block_kv, tiling.warps,
                                        tiling.stages, cfg.dtype == "bf16"), clock_hz) or (0.0, 0.0)
    return Traits.join(kt.fitted if kt else None, Build(registers_per_thread=regs, code_bytes=code,
                                                      tile_pipe_cycles=tile, block_pipe_cycles=block))


def _with_build(traits: Traits, build: dict[str, int]) -> Traits:
    """`traits` with the registers and code bytes of the build that runs them (ptxas's report), where known: the
    occupancy of our row kernels is theirs (8 blocks of 256 threads an SM at 18-32 registers), not an unknown
    build's 128 registers."""
    if not build:
        return traits
    return replace(traits, registers_per_thread=build["registers"], code_bytes=build["code_bytes"])


def kernel_traits(alg: str, fitted: dict[str, Traits]) -> Traits | dict[str, Traits] | None:
    """The fitted traits each planned kernel of `alg` runs with, keyed by algorithm; naive's GEMMs take 'naive'
    (cuBLAS's alignment-1 kernels their own families) and its softmax 'naive_softmax' (fitted apart: a
    row-per-block softmax is another kind of kernel)."""
    if alg != "naive":
        return fitted.get(alg)
    gemm = fitted.get("naive", Traits())
    return {"naive_qk": gemm, "naive_pv": gemm, "naive_softmax": fitted.get("naive_softmax", gemm)} | \
        {name: fitted[name] for name in ALIGN1 if name in fitted}
