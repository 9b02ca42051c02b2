"""The backward pass's kernels for each algorithm, and the tensors each holds in HBM.

The backward takes dO and what the forward saved (naive: P; tiled: O and the log-sum-exp L) and returns dQ, dK
and dV. With grouped-query attention each query head's dK and dV are computed apart (dKexp, dVexp) and a last
kernel sums each group's, as PyTorch's FlashAttention-2 backward does.
- flash2 (and PyTorch's flash backend): D = rowsum(dO * O) with the fp32 dQ accumulator zeroed, the main kernel
  (`backward.Flash2BwdKernel`), dQ converted from fp32; FlashAttention-2's block sizes (`torch_fa2.backward_blocks`).
- flash1: the accumulator zeroed, the paper's Algorithm 4 at the backward's blocks (`Tiling.backward`), dQ
  converted. iosim's own flash1 and flash2 backward kernels take their shared memory from `iosim_bwd_smem`.
- naive: dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dP * P)) scaled (one row kernel), dQ = dS K,
  dK = dS^T Q: cuBLAS's GEMMs (`align1.cublas_gemm` with the backward's tensors); grouped heads summed by the
  GEMMs themselves (`key_major`).
- eager: PyTorch's eager naive attention, kernel by kernel (`eager`).
"""
from __future__ import annotations

from typing import Callable

from ..errors import IosimError
from ..hardware import HardwareProfile
from ..kernels.cublas import Cublas, GemmTile
from ..kernels.torch_fa2 import backward_blocks
from ..workload import STAT_BYTES, AttentionConfig
from .backward import Flash1BwdKernel, Flash2BwdKernel, flash2_bwd_smem, iosim_bwd_smem
from .kernel import KernelPlan, Traits
from .align1 import cublas_gemm, with_partials
from .rows import RowIO, RowKernel
from .tiling import Tiling

ROW_THREADS = 256
# gpu_kernels' softmax_bwd_rows holds its row's P and dP in shared memory, 4 bytes a key and up to 64 more where
# the row starts off a 16-byte boundary: long rows leave fewer blocks an SM (3 at 16k keys on the H200)
SOFTMAX_BWD_SMEM_PER_KEY = 4
SOFTMAX_BWD_SMEM_PAD = 64


def grad_bytes(cfg: AttentionConfig) -> dict[str, int]:
    """Bytes of the backward's tensors in HBM besides the forward's."""
    tb = cfg.tensor_bytes()
    rows = cfg.bh * cfg.seqlen_q
    out = {"dO": tb["O"], "dQ": tb["Q"], "dK": tb["K"], "dV": tb["V"], "D": rows * STAT_BYTES,
           "dQacc": rows * cfg.head_dim * 4, "dP": tb["S"], "dS": tb["S"], "dPP": tb["S"],
           "mask": cfg.seqlen_q * cfg.seqlen_k, "dO_bshd": tb["O"], "O_bshd": tb["O"]}
    if cfg.group > 1:
        out["dKexp"] = out["dVexp"] = cfg.bh * cfg.seqlen_k * cfg.head_dim * cfg.elem_bytes
    return out


def group_sum(cfg: AttentionConfig, traits: Traits) -> list[KernelPlan]:
    """dK and dV each summed over each group of query heads, a reduction kernel apiece (none without grouped-query
    attention)."""
    if cfg.group == 1:
        return []
    d, e, g = cfg.head_dim, cfg.elem_bytes, cfg.group
    return [RowKernel("gqa_sum", cfg.batch * cfg.kv_heads * cfg.seqlen_k, [RowIO(f"{x}exp", g * d * e)],
                      [RowIO(x, d * e)], traits, rows_per_block=8, threads=ROW_THREADS, other_per_row=g * d)
            for x in ("dK", "dV")]


def sdpa_copies(cfg: AttentionConfig, traits: Traits) -> list[KernelPlan]:
    """PyTorch's SDPA, before FlashAttention-2's backward: two copies of a query-sized tensor into FlashAttention's
    (batch, seq, heads, d) layout where there is more than one head (the H200's records: two direct_copy kernels
    of dO's bytes each whenever heads > 1, none with one head; which two tensors Nsight does not say)."""
    if cfg.heads == 1:
        return []
    rows, w = cfg.bh * cfg.seqlen_q, cfg.head_dim * cfg.elem_bytes
    return [RowKernel("sdpa_copy", rows, [RowIO(x, w)], [RowIO(f"{x}_bshd", w)], traits, rows_per_block=8,
                      threads=128) for x in ("dO", "O")]


def flash_backward(cfg: AttentionConfig, loop_order: str, hw: HardwareProfile, tiling: Tiling | None,
                   traits_of: Callable[[str], Traits], sdpa: bool = False) -> tuple[list[KernelPlan], list[list[str]]]:
    """The tiled backward's kernels and the tensors each holds (sdpa: as PyTorch's SDPA runs FlashAttention-2's,
    after its layout copies)."""
    d, e = cfg.head_dim, cfg.elem_bytes
    rows = cfg.bh * cfg.seqlen_q
    saved = ["Q", "K", "V", "O", "L", "dO"]
    dk, dv = ("dKexp", "dVexp") if cfg.group > 1 else ("dK", "dV")
    if loop_order == "flash2":
        bq, bkv, warps = backward_blocks(d)
        smem = flash2_bwd_smem(cfg, bq, bkv) if sdpa else iosim_bwd_smem("flash2", d, bq, bkv)
        main: KernelPlan = Flash2BwdKernel(cfg, bq, bkv, warps, traits_of("flash2_bwd"), smem, dk, dv)
        first = RowKernel("flash2_bwd_dot", rows, [RowIO("dO", d * e), RowIO("O", d * e)],
                          [RowIO("D", STAT_BYTES), RowIO("dQacc", d * 4)], traits_of("flash2_bwd_dot"),
                          other_per_row=2 * d, **_row_grid(d, bq, warps, sdpa))
        last = _convert("flash2_bwd_convert", cfg, traits_of, bq, warps, sdpa)
        stats = ["D", "dQacc"]
    else:
        if cfg.group > 1:
            raise IosimError("flash1's backward does not take grouped-query attention (kv_heads < heads); use "
                             "flash2")
        bq, bkv, warps = backward_blocks(d)   # gpu_kernels' flash1 backward runs flash2's backward blocks
        smem = iosim_bwd_smem("flash1", d, bq, bkv)
        main = Flash1BwdKernel(cfg, bq, bkv, warps, traits_of("flash1_bwd"), smem)
        first = RowKernel("flash1_bwd_init", rows, [], [RowIO("dQacc", d * 4)], traits_of("flash1_bwd_init"),
                          rows_per_block=bq, threads=32 * warps)
        last = _convert("flash1_bwd_convert", cfg, traits_of, bq, warps, sdpa)
        stats = ["dQacc"]
    if smem > hw.smem_per_block_bytes:
        raise IosimError(f"{main.name}: {bq}x{bkv} tiles need {smem / 1024:g} KiB of shared memory a block at "
                         f"head_dim={d} {cfg.dtype}; {hw.key} allows {hw.smem_per_block_kib:g} KiB")
    copies = sdpa_copies(cfg, traits_of("sdpa_copy")) if sdpa else []
    sums = group_sum(cfg, traits_of("gqa_sum"))
    kernels = copies + [first, main, last] + sums
    # FlashAttention-2 allocates its outputs and scratch before its first kernel; SDPA's copies live through it
    held = saved + (["dO_bshd", "O_bshd"] if copies else []) + stats + ["dQ", dk, dv]
    live = [saved + ["dO_bshd", "O_bshd"]] * len(copies) + [held] * 3 + \
        [held + (["dK", "dV"] if sums else [])] * len(sums)
    return kernels, live


def _row_grid(d: int, bq: int, warps: int, sdpa: bool) -> dict:
    """The grid of the backward's per-row kernels (D = rowsum(dO * O), the dQ conversion): PyTorch's
    FlashAttention-2 takes a query block a block; gpu_kernels' take ROW_THREADS threads a block, 8 elements a
    thread, so 8 * ROW_THREADS / d rows."""
    if sdpa:
        return {"rows_per_block": bq, "threads": 32 * warps}
    return {"rows_per_block": max(1, 8 * ROW_THREADS // d), "threads": ROW_THREADS}


def _convert(name: str, cfg: AttentionConfig, traits_of: Callable[[str], Traits], bq: int, warps: int,
             sdpa: bool) -> RowKernel:
    """dQ = scale * dQacc in the input dtype."""
    d = cfg.head_dim
    return RowKernel(name, cfg.bh * cfg.seqlen_q, [RowIO("dQacc", d * 4)], [RowIO("dQ", d * cfg.elem_bytes)],
                     traits_of(name), other_per_row=d, **_row_grid(d, bq, warps, sdpa))


def key_major(cfg: AttentionConfig) -> AttentionConfig:
    """The shape of P^T dO and dS^T Q as gpu_kernels runs them: rows are keys, reduced over the queries of the key
    head's whole group (its query heads' rows stacked, as the forward's P is), so each GEMM sums the group."""
    return cfg.model_copy(update={"heads": cfg.kv_heads, "seqlen_q": cfg.seqlen_k,
                                  "seqlen_k": cfg.group * cfg.seqlen_q, "causal": False, "pass_": "forward"})


def naive_backward(cfg: AttentionConfig, traits_of: Callable[[str], Traits], blas: Cublas,
                   gemm_tiles: dict[str, GemmTile] | None) -> tuple[list[KernelPlan], list[list[str]]]:
    """Naive attention's backward: four GEMMs around one row kernel (the softmax's gradient, scale folded in)."""
    e = cfg.elem_bytes
    t_cfg = key_major(cfg)
    gemm = traits_of("naive")

    def blas_gemm(shape: AttentionConfig, kind, names: dict[str, str], name: str, layout="nn") -> list[KernelPlan]:
        return cublas_gemm(shape, kind, gemm, traits_of, blas, gemm_tiles, names, name, layout)
    # the layouts of CUTLASS's alignment-1 kernels gpu_kernels' calls get (their names in the records)
    dv = blas_gemm(t_cfg, "pv", {"V": "dO", "O": "dV", "Opart": "dVpart"}, "naive_dv", "nt")
    dp = blas_gemm(cfg, "qk", {"Q": "dO", "K": "V", "S": "dP"}, "naive_dp")
    grad = RowKernel("naive_softmax_bwd", cfg.bh * cfg.seqlen_q,
                     [RowIO("P", cfg.seqlen_k * e), RowIO("dP", cfg.seqlen_k * e)], [RowIO("dS", cfg.seqlen_k * e)],
                     traits_of("naive_softmax_bwd"), rows_per_block=1, threads=ROW_THREADS,
                     other_per_row=4 * cfg.seqlen_k,
                     smem_bytes=SOFTMAX_BWD_SMEM_PER_KEY * cfg.seqlen_k + SOFTMAX_BWD_SMEM_PAD)
    dq = blas_gemm(cfg, "pv", {"P": "dS", "V": "K", "O": "dQ", "Opart": "dQpart"}, "naive_dq")
    dk = blas_gemm(t_cfg, "pv", {"P": "dS", "V": "Q", "O": "dK", "Opart": "dKpart"}, "naive_dk", "nt")
    kernels: list[KernelPlan] = dv + dp + [grad] + dq + dk
    saved = ["Q", "K", "V", "P", "dO"]
    live = with_partials(dv, saved + ["dV"]) + with_partials(dp, saved + ["dV", "dP"]) + \
        [saved + ["dV", "dP", "dS"]] + with_partials(dq, saved + ["dV", "dS", "dQ"]) + \
        with_partials(dk, saved + ["dV", "dS", "dQ", "dK"])
    return kernels, live
