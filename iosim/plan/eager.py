"""Eager PyTorch's naive attention, kernel by kernel as it runs: `softmax(q @ k^T * scale [masked]) @ v`.

Every operator is its own kernel and its result goes through HBM:
- forward: the Q K^T GEMM (S, unscaled), a pass scaling S, where causal the mask built (ones, then triu: one
  byte a score, shared by every head) and a masked_fill over S, the row softmax (S -> P), the P V GEMM;
- backward (autograd, last operator first): dV = P^T dO and dP = dO V^T, the softmax's gradient (a multiply of
  dP by P, then the softmax backward kernel reading that product and P: the pair Nsight Compute shows on the
  H200), where causal masked_fill's gradient, the scale's, then dQ = dS K and dK = dS^T Q.
The GEMMs are cuBLAS's (`align1.cublas_gemm`). An elementwise pass over more than 2^31 - 1 elements runs as several
kernels (TensorIterator splits it until each part indexes in 32 bits: the next power of two). The softmax kernel
changes with the row (PyTorch's SoftMax.cu): a warp a row up to 2,048 keys (`softmax_warp_forward`), else a block
a row holding it in registers (`cunn_SoftMaxForwardReg`) or shared memory (`cunn_SoftMaxForwardSmem`) where it fits,
else a block a row reading it three times (max, sum, write: `cunn_SoftMaxForward`; not seen in a record).
"""
from __future__ import annotations

import math
from typing import Callable

from ..kernels.cublas import Cublas, GemmTile
from ..workload import AttentionConfig
from .kernel import KernelPlan, Traits
from .align1 import cublas_gemm, with_partials
from .rows import RowIO, RowKernel

INDEX_LIMIT = 2**31 - 1           # elements a TensorIterator kernel indexes in 32 bits
WARP_SOFTMAX_KEYS = 2048          # rows up to this many keys (and 8 KiB) take the warp-per-row softmax
REG_SOFTMAX_KEYS = 8192           # ... up to this many, a block a row holding it in registers
SOFTMAX_SMEM_BYTES = 48 * 1024    # ... up to this many bytes, a block a row holding it in shared memory
ELEMENTWISE_ROWS = 8              # rows of S a modelled elementwise block covers (bytes do not depend on it)


def softmax_passes(cfg: AttentionConfig) -> tuple[str, int]:
    """(PyTorch's softmax kernel for rows of `seqlen_k` keys, times it reads a row). The H200's records ran
    softmax_warp_forward up to 2,048 keys, cunn_SoftMaxForwardReg at 4,096, cunn_SoftMaxForwardSmem at 16,384."""
    row = cfg.seqlen_k * cfg.elem_bytes
    if cfg.seqlen_k <= WARP_SOFTMAX_KEYS and row <= 8192:
        return "softmax_warp", 1
    if cfg.seqlen_k <= REG_SOFTMAX_KEYS:
        return "softmax_reg", 1
    if row <= SOFTMAX_SMEM_BYTES:
        return "softmax_smem", 1
    return "softmax_block", 3


def masked_fill_name(cfg: AttentionConfig) -> str:
    """masked_fill over S with the mask broadcast over batch and heads runs PyTorch's generic elementwise kernel;
    with one head of one batch the mask is S's shape and the kernel is the vectorized one (the H200's records)."""
    return "eager_masked_fill" if cfg.bh > 1 else "eager_masked_fill_vec"


def elementwise(name: str, cfg: AttentionConfig, loads: list[RowIO], stores: list[RowIO],
                traits_of: Callable[[str], Traits], other_per_row: int = 0) -> list[KernelPlan]:
    """One pass over S's rows, as many kernels as TensorIterator splits it into."""
    rows = cfg.bh * cfg.seqlen_q
    numel = rows * cfg.seqlen_k
    parts = 1 if numel <= INDEX_LIMIT else 2 ** math.ceil(math.log2(numel / INDEX_LIMIT))
    per = -(-rows // parts)
    traits = traits_of(name)
    return [RowKernel(name, min(per, rows - p * per), loads, stores, traits, rows_per_block=ELEMENTWISE_ROWS,
                      threads=128, other_per_row=other_per_row, first_row=p * per)
            for p in range(parts) if p * per < rows]


def eager_forward(cfg: AttentionConfig, traits_of: Callable[[str], Traits], blas: Cublas,
                  gemm_tiles: dict[str, GemmTile] | None) -> tuple[list[KernelPlan], list[list[str]]]:
    nk, e = cfg.seqlen_k, cfg.elem_bytes
    row = RowIO("S", nk * e)
    gemm = traits_of("eager_gemm")
    kernels: list[KernelPlan] = cublas_gemm(cfg, "qk", gemm, traits_of, blas, gemm_tiles, name="eager_qk")
    live = [["Q", "K", "V", "S"]] * len(kernels)
    n_qk = len(kernels)
    kernels += elementwise("eager_scale", cfg, [row], [row], traits_of, nk)
    if cfg.causal:
        mask = RowIO("mask", nk, period=cfg.seqlen_q)
        one = cfg.model_copy(update={"batch": 1, "heads": 1, "kv_heads": 1})
        kernels += elementwise("eager_mask_ones", one, [], [mask], traits_of)
        kernels += elementwise("eager_mask_triu", one, [mask], [mask], traits_of)
        kernels += elementwise(masked_fill_name(cfg), cfg, [row, mask], [row], traits_of)
    live += [["Q", "K", "V", "S"] + (["mask"] if cfg.causal else [])] * (len(kernels) - n_qk)
    variant, times = softmax_passes(cfg)
    rows = cfg.bh * cfg.seqlen_q
    kernels.append(RowKernel(f"eager_{variant}", rows, [RowIO("S", nk * e, times)], [RowIO("P", nk * e)],
                             traits_of(f"eager_{variant}"), rows_per_block=4 if variant == "softmax_warp" else 1,
                             threads=128 if variant == "softmax_warp" else 256, exp_per_row=nk,
                             other_per_row=4 * nk, smem_bytes=nk * e if variant == "softmax_smem" else 0))
    pv = cublas_gemm(cfg, "pv", gemm, traits_of, blas, gemm_tiles, name="eager_pv")
    kernels += pv
    live += [["Q", "K", "V", "S", "P"]] + with_partials(pv, ["Q", "K", "V", "P", "O"])
    return kernels, live


def eager_backward(cfg: AttentionConfig, traits_of: Callable[[str], Traits], blas: Cublas,
                   gemm_tiles: dict[str, GemmTile] | None) -> tuple[list[KernelPlan], list[list[str]]]:
    nk, e = cfg.seqlen_k, cfg.elem_bytes
    gemm = traits_of("eager_gemm")

    def blas_gemm(shape: AttentionConfig, kind, names: dict[str, str], name: str, layout="nn") -> list[KernelPlan]:
        return cublas_gemm(shape, kind, gemm, traits_of, blas, gemm_tiles, names, name, layout)
    t_cfg = cfg.model_copy(update={"seqlen_q": cfg.seqlen_k, "seqlen_k": cfg.seqlen_q, "causal": False,
                                   "pass_": "forward"})
    saved = ["Q", "K", "V", "P", "dO"] + (["mask"] if cfg.causal else [])

    def row(t: str) -> RowIO:
        return RowIO(t, nk * e)
    # the layouts of CUTLASS's alignment-1 kernels autograd's calls get (their names in the records)
    dv = blas_gemm(t_cfg, "pv", {"V": "dO", "O": "dV", "Opart": "dVpart"}, "eager_dv", "nt")
    dp = blas_gemm(cfg, "qk", {"Q": "dO", "K": "V", "S": "dP"}, "eager_dp")
    kernels: list[KernelPlan] = dv + dp
    live = with_partials(dv, saved + ["dV"]) + with_partials(dp, saved + ["dV", "dP"])
    grad = elementwise("eager_mul", cfg, [row("dP"), row("P")], [row("dPP")], traits_of, nk)
    bwd = "eager_softmax_bwd_warp" if nk <= WARP_SOFTMAX_KEYS else "eager_softmax_bwd_block"   # PyTorch's variants
    warp = nk <= WARP_SOFTMAX_KEYS
    grad.append(RowKernel(bwd, cfg.bh * cfg.seqlen_q, [row("dPP"), row("P")], [row("dS")], traits_of(bwd),
                          rows_per_block=4 if warp else 1, threads=128 if warp else 256, other_per_row=3 * nk))
    if cfg.causal:
        mask = RowIO("mask", nk, period=cfg.seqlen_q)
        grad += elementwise(masked_fill_name(cfg) + "_bwd", cfg, [row("dS"), mask],
                            [row("dS")], traits_of)
    grad += elementwise("eager_scale_bwd", cfg, [row("dS")], [row("dS")], traits_of, nk)
    kernels += grad
    live += [saved + ["dV", "dP", "dPP", "dS"]] * len(grad)
    dq = blas_gemm(cfg, "pv", {"P": "dS", "V": "K", "O": "dQ", "Opart": "dQpart"}, "eager_dq", "nt")
    dk = blas_gemm(t_cfg, "pv", {"P": "dS", "V": "Q", "O": "dK", "Opart": "dKpart"}, "eager_dk")
    kernels += dq + dk
    live += with_partials(dq, saved + ["dV", "dS", "dQ"]) + with_partials(dk, saved + ["dV", "dS", "dQ", "dK"])
    return kernels, live
