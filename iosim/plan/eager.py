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

That is the program `gpu_kernels.measure` runs as torch_naive, under PyTorch 2.11 (`MEASURED`). Other code computing
the same attention launches other kernels (`EagerProgram`): `FLASH_BENCHMARK` is the standard attention of the
FlashAttention-2 and -3 papers' figures.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from ..errors import IosimError
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


@dataclass(frozen=True)
class EagerProgram:
    """Which eager attention code runs, under which PyTorch: both decide the kernels.

    packed_qkv: q, k and v are views of one (batch, seq, 3, heads, d) tensor, copied to (batch * heads, seq, d)
    before their GEMMs (einops' rearrange: K to (batch * heads, d, seq); V inside the einsum), and their gradients
    stacked back into one at the end. scale_in_gemm: the scale is the Q K^T GEMM's alpha (baddbmm), not a pass over
    S; its backward scales the d-wide dQ and dK. additive_mask: causal scores are S + a mask made in fp32
    (full(-10000), triu) and cast to S's dtype, whose gradient is S's own: no masked_fill passes. warp_softmax_keys:
    the longest row of the warp-per-row softmax, forward and backward; reg_softmax: the register-held block softmax
    exists (PyTorch's SoftMax.cu gained both the 2,048-key warp softmax and cunn_SoftMaxForwardReg in
    pytorch/pytorch#144679, January 2025, for 2.7)."""
    packed_qkv: bool = False
    scale_in_gemm: bool = False
    additive_mask: bool = False
    warp_softmax_keys: int = WARP_SOFTMAX_KEYS
    reg_softmax: bool = True


# gpu_kernels.measure's torch_naive: softmax(q @ k^T * scale, masked_fill with a bool triu mask) @ v on (b, h, s, d)
# tensors, PyTorch 2.11
MEASURED = EagerProgram()
# `attention_pytorch` of FlashAttention's benchmark scripts (benchmarks/benchmark_flash_attention.py,
# hopper/benchmark_flash_attention.py): packed qkv, baddbmm with alpha, the additive fp32 mask, dropout at p = 0 (no kernel),
# einsum for P V; the papers' figures (2023, 2024) ran a PyTorch before 2.7
FLASH_BENCHMARK = EagerProgram(packed_qkv=True, scale_in_gemm=True, additive_mask=True, warp_softmax_keys=1024,
                               reg_softmax=False)


def softmax_passes(cfg: AttentionConfig, program: EagerProgram = MEASURED) -> tuple[str, int]:
    """(PyTorch's softmax kernel for rows of `seqlen_k` keys, times it reads a row). The H200's records ran
    softmax_warp_forward up to 2,048 keys, cunn_SoftMaxForwardReg at 4,096, cunn_SoftMaxForwardSmem at 16,384."""
    row = cfg.seqlen_k * cfg.elem_bytes
    if cfg.seqlen_k <= program.warp_softmax_keys and row <= 8192:
        return "softmax_warp", 1
    if cfg.seqlen_k <= REG_SOFTMAX_KEYS and program.reg_softmax:
        return "softmax_reg", 1
    if row <= SOFTMAX_SMEM_BYTES:
        return "softmax_smem", 1
    return "softmax_block", 3


def masked_fill_name(cfg: AttentionConfig) -> str:
    """masked_fill over S with the mask broadcast over batch and heads runs PyTorch's generic elementwise kernel;
    with one head of one batch the mask is S's shape and the kernel is the vectorized one (the H200's records)."""
    return "eager_masked_fill" if cfg.bh > 1 else "eager_masked_fill_vec"


def elementwise(name: str, cfg: AttentionConfig, loads: list[RowIO], stores: list[RowIO],
                traits_of: Callable[[str], Traits], other_per_row: int = 0,
                family: str | None = None) -> list[KernelPlan]:
    """One pass over S's rows, as many kernels as TensorIterator splits it into (with the fitted traits of `family`,
    a kernel of the same kind, where its own name has none)."""
    rows = cfg.bh * cfg.seqlen_q
    numel = rows * cfg.seqlen_k
    parts = 1 if numel <= INDEX_LIMIT else 2 ** math.ceil(math.log2(numel / INDEX_LIMIT))
    per = -(-rows // parts)
    traits = traits_of(family or name)
    return [RowKernel(name, min(per, rows - p * per), loads, stores, traits, rows_per_block=ELEMENTWISE_ROWS,
                      threads=128, other_per_row=other_per_row, first_row=p * per)
            for p in range(parts) if p * per < rows]


def d_wide(name: str, cfg: AttentionConfig, pairs: list[tuple[str, str, bool]], traits_of: Callable[[str], Traits],
           family: str) -> list[KernelPlan]:
    """Passes over head_dim-wide tensors (Q or dQ rows: queries; K, V: keys), one kernel a (read, written, key side)
    triple: einops' layout copies of packed q, k, v, a gradient's scaling by baddbmm's alpha."""
    w = cfg.head_dim * cfg.elem_bytes
    out: list[KernelPlan] = []
    for src, dst, keys in pairs:
        rows = cfg.batch * (cfg.kv_heads * cfg.seqlen_k if keys else cfg.heads * cfg.seqlen_q)
        out.append(RowKernel(name, rows, [RowIO(src, w)], [RowIO(dst, w)], traits_of(family),
                             rows_per_block=ELEMENTWISE_ROWS, threads=128))
    return out


def program_bytes(cfg: AttentionConfig, program: EagerProgram) -> dict[str, int]:
    """Bytes of the tensors a program adds to the plan's: the packed q, k, v (and their gradients), the fp32 mask."""
    tb = cfg.tensor_bytes()
    out = {}
    if program.packed_qkv:
        out |= {"qkv_q": tb["Q"], "qkv_k": tb["K"], "qkv_v": tb["V"], "dO_bthd": tb["O"],
                "dqkv": tb["Q"] + tb["K"] + tb["V"]}
    if program.additive_mask and cfg.causal:
        out |= {"mask32": 4 * cfg.seqlen_q * cfg.seqlen_k, "mask32t": 4 * cfg.seqlen_q * cfg.seqlen_k,
                "mask16": cfg.seqlen_q * cfg.seqlen_k * cfg.elem_bytes, "Sm": tb["S"]}
    return out


def check_program(cfg: AttentionConfig, program: EagerProgram) -> None:
    if program.packed_qkv and (cfg.seqlen_q != cfg.seqlen_k or cfg.kv_heads != cfg.heads):
        raise IosimError(f"packed qkv needs seqlen_q == seqlen_k and kv_heads == heads, got {cfg.seqlen_q} x "
                         f"{cfg.seqlen_k} keys, {cfg.heads} heads over {cfg.kv_heads}")


def eager_forward(cfg: AttentionConfig, traits_of: Callable[[str], Traits], blas: Cublas,
                  gemm_tiles: dict[str, GemmTile] | None,
                  program: EagerProgram = MEASURED) -> tuple[list[KernelPlan], list[list[str]]]:
    check_program(cfg, program)
    nk, e = cfg.seqlen_k, cfg.elem_bytes
    row = RowIO("S", nk * e)
    gemm = traits_of("eager_gemm")
    inputs = ["qkv_q", "qkv_k", "qkv_v"] if program.packed_qkv else []
    kernels: list[KernelPlan] = d_wide("eager_layout_copy", cfg, [("qkv_q", "Q", False), ("qkv_k", "K", True)],
                                       traits_of, "sdpa_copy") if program.packed_qkv else []
    live = [inputs + ["Q", "K"]] * len(kernels)
    qk = cublas_gemm(cfg, "qk", gemm, traits_of, blas, gemm_tiles, name="eager_qk")
    kernels += qk
    inputs += ["Q", "K"] if program.packed_qkv else ["Q", "K", "V"]
    live += [inputs + ["S"]] * len(qk)
    n_qk = len(kernels)
    if not program.scale_in_gemm:
        kernels += elementwise("eager_scale", cfg, [row], [row], traits_of, nk)
    held = []
    if cfg.causal and program.additive_mask:
        one = cfg.model_copy(update={"batch": 1, "heads": 1, "kv_heads": 1})
        m32, m32t, m16 = (RowIO(t, nk * b, period=cfg.seqlen_q) for t, b in (("mask32", 4), ("mask32t", 4),
                                                                             ("mask16", e)))
        kernels += elementwise("eager_mask_full", one, [], [m32], traits_of, family="eager_mask_ones")
        kernels += elementwise("eager_mask_triu", one, [m32], [m32t], traits_of)
        kernels += elementwise("eager_mask_cast", one, [m32t], [m16], traits_of, family="eager_scale")
        kernels += elementwise("eager_mask_add", cfg, [row, m16], [RowIO("Sm", nk * e)], traits_of,
                               family="eager_masked_fill")
        row, held = RowIO("Sm", nk * e), ["mask32", "mask32t", "mask16", "Sm"]
    elif cfg.causal:
        mask = RowIO("mask", nk, period=cfg.seqlen_q)
        one = cfg.model_copy(update={"batch": 1, "heads": 1, "kv_heads": 1})
        kernels += elementwise("eager_mask_ones", one, [], [mask], traits_of)
        kernels += elementwise("eager_mask_triu", one, [mask], [mask], traits_of)
        kernels += elementwise(masked_fill_name(cfg), cfg, [row, mask], [row], traits_of)
        held = ["mask"]
    live += [inputs + ["S"] + held] * (len(kernels) - n_qk)
    variant, times = softmax_passes(cfg, program)
    rows = cfg.bh * cfg.seqlen_q
    kernels.append(RowKernel(f"eager_{variant}", rows, [RowIO(row.tensor, nk * e, times)], [RowIO("P", nk * e)],
                             traits_of(f"eager_{variant}"), rows_per_block=4 if variant == "softmax_warp" else 1,
                             threads=128 if variant == "softmax_warp" else 256, exp_per_row=nk,
                             other_per_row=4 * nk, smem_bytes=nk * e if variant == "softmax_smem" else 0))
    live += [inputs + [row.tensor, "P"]]   # the mask and the unmasked S are freed once added
    if program.packed_qkv:
        kernels += d_wide("eager_layout_copy", cfg, [("qkv_v", "V", True)], traits_of, "sdpa_copy")
        inputs += ["V"]
        live += [inputs + ["P"]]
    pv = cublas_gemm(cfg, "pv", gemm, traits_of, blas, gemm_tiles, name="eager_pv")
    kernels += pv
    live += with_partials(pv, inputs + ["P", "O"])
    return kernels, live


def eager_backward(cfg: AttentionConfig, traits_of: Callable[[str], Traits], blas: Cublas,
                   gemm_tiles: dict[str, GemmTile] | None,
                   program: EagerProgram = MEASURED) -> tuple[list[KernelPlan], list[list[str]]]:
    """Autograd's kernels, last operator first. The softmax's gradient is planned as PyTorch 2.11 runs it (a multiply,
    then the gradient kernel) under every program: no record shows another PyTorch's."""
    check_program(cfg, program)
    nk, e = cfg.seqlen_k, cfg.elem_bytes
    gemm = traits_of("eager_gemm")

    def blas_gemm(shape: AttentionConfig, kind, names: dict[str, str], name: str, layout="nn") -> list[KernelPlan]:
        return cublas_gemm(shape, kind, gemm, traits_of, blas, gemm_tiles, names, name, layout)
    t_cfg = cfg.model_copy(update={"seqlen_q": cfg.seqlen_k, "seqlen_k": cfg.seqlen_q, "causal": False,
                                   "pass_": "forward"})
    saved = ["Q", "K", "V", "P", "dO"] + (["mask"] if cfg.causal and not program.additive_mask else [])

    def row(t: str) -> RowIO:
        return RowIO(t, nk * e)
    kernels: list[KernelPlan] = d_wide("eager_layout_copy", cfg, [("dO_bthd", "dO", False)], traits_of,
                                       "sdpa_copy") if program.packed_qkv else []
    live = [saved + ["dO_bthd"]] * len(kernels)
    # the layouts of CUTLASS's alignment-1 kernels autograd's calls get (their names in the records)
    dv = blas_gemm(t_cfg, "pv", {"V": "dO", "O": "dV", "Opart": "dVpart"}, "eager_dv", "nt")
    dp = blas_gemm(cfg, "qk", {"Q": "dO", "K": "V", "S": "dP"}, "eager_dp")
    kernels += dv + dp
    live += with_partials(dv, saved + ["dV"]) + with_partials(dp, saved + ["dV", "dP"])
    grad = elementwise("eager_mul", cfg, [row("dP"), row("P")], [row("dPP")], traits_of, nk)
    warp = nk <= program.warp_softmax_keys
    bwd = "eager_softmax_bwd_warp" if warp else "eager_softmax_bwd_block"   # PyTorch's variants
    grad.append(RowKernel(bwd, cfg.bh * cfg.seqlen_q, [row("dPP"), row("P")], [row("dS")], traits_of(bwd),
                          rows_per_block=4 if warp else 1, threads=128 if warp else 256, other_per_row=3 * nk))
    if cfg.causal and not program.additive_mask:
        mask = RowIO("mask", nk, period=cfg.seqlen_q)
        grad += elementwise(masked_fill_name(cfg) + "_bwd", cfg, [row("dS"), mask],
                            [row("dS")], traits_of)
    if not program.scale_in_gemm:
        grad += elementwise("eager_scale_bwd", cfg, [row("dS")], [row("dS")], traits_of, nk)
    kernels += grad
    live += [saved + ["dV", "dP", "dPP", "dS"]] * len(grad)
    dq = blas_gemm(cfg, "pv", {"P": "dS", "V": "K", "O": "dQ", "Opart": "dQpart"}, "eager_dq", "nt")
    dk = blas_gemm(t_cfg, "pv", {"P": "dS", "V": "Q", "O": "dK", "Opart": "dKpart"}, "eager_dk")
    alpha = (lambda t, keys: d_wide("eager_alpha_bwd", cfg, [(t, t, keys)], traits_of, "eager_scale")) \
        if program.scale_in_gemm else (lambda t, keys: [])
    dq += alpha("dQ", False)
    dk += alpha("dK", True)
    kernels += dq + dk
    live += with_partials(dq, saved + ["dV", "dS", "dQ"]) + with_partials(dk, saved + ["dV", "dS", "dQ", "dK"])
    if program.packed_qkv:   # unbind's gradient: torch.stack of dq, dk, dv into one (b, s, 3, h, d) tensor
        w = cfg.head_dim * e
        kernels.append(RowKernel("eager_stack", cfg.bh * cfg.seqlen_q, [RowIO(t, w) for t in ("dQ", "dK", "dV")],
                                 [RowIO("dqkv", 3 * w)], traits_of("sdpa_copy"), rows_per_block=ELEMENTWISE_ROWS,
                                 threads=128))
        live += [["dQ", "dK", "dV", "dqkv"]]
    return kernels, live
