"""Launchers of the backward passes: gradients dQ, dK, dV from dO and what the forward saved.

- flash2: D = rowsum(dO * O) with the fp32 dQ accumulator zeroed (`bwd_dot`), the main kernel (one block per
  key tile, dQ by atomics), dQ converted (`bwd_convert`); grouped heads' dK and dV summed after.
- flash1: the accumulator zeroed, the paper's Algorithm 4 (one block per head), dQ converted.
- naive: dV = P^T dO, dP = dO V^T (cuBLAS), dS = scale * P * (dP - rowsum(P * dP)) (`softmax_bwd_rows`),
  dQ = dS K, dK = dS^T Q (cuBLAS); grouped heads are summed by the GEMMs themselves (the group's rows stacked).
Block sizes come from an `iosim.plan.Tiling` (block_q, block_kv, warps; `Tiling.backward` by default), the same
object the planner reads. Layout (B, H, N, d), contiguous, of the kind (CuPy or torch) of q.
"""
from __future__ import annotations

import math

import numpy as np

from iosim.errors import IosimError
from iosim.plan import Tiling
from iosim.plan.backward import iosim_bwd_smem

from . import build
from .ops import _arg, _config, _empty, _ptr, _smem_limit, _stream
from .reference import LOG2E


def _check_like(a, name: str, like, shape: tuple, dtype: str) -> None:
    if a.kind != like.kind or a.shape != shape or a.dtype != dtype:
        raise IosimError(f"{name} must be {like.kind} {dtype} of shape {shape}, got {a.kind} {a.dtype} {a.shape}")


def _blocks(n: int, per: int) -> int:
    return -(-n // per)


def flash_attention_backward(q, k, v, o, lse, do, *, causal: bool = False, loop_order: str = "flash2",
                             tiling: Tiling | None = None, scale: float | None = None):
    """dQ, dK, dV of the tiled attention whose forward gave O and its log-sum-exp `lse` (fp32, (B, H, Nq))."""
    qa, ka, va = _arg(q, "q"), _arg(k, "k"), _arg(v, "v")
    cfg = _config(qa, ka, va, causal)
    oa, da = _arg(o, "o"), _arg(do, "do")
    _check_like(oa, "o", qa, qa.shape, qa.dtype)
    _check_like(da, "do", qa, qa.shape, qa.dtype)
    b, h, hkv, nq, nk, d = cfg.batch, cfg.heads, cfg.kv_heads, cfg.seqlen_q, cfg.seqlen_k, cfg.head_dim
    if tuple(lse.shape) != (b, h, nq):
        raise IosimError(f"lse must have shape {(b, h, nq)} (fp32 log-sum-exp of each row), got {tuple(lse.shape)}")
    if loop_order not in ("flash1", "flash2"):
        raise IosimError(f"unknown loop_order '{loop_order}'; choose flash1 or flash2")
    if loop_order == "flash1" and hkv != h:
        raise IosimError("flash1's backward does not take grouped-query attention (kv_heads < heads); use flash2")
    t = tiling or Tiling.backward(cfg, loop_order)
    key = (t.block_q, t.block_kv, t.warps)
    if d not in build.BWD_TILINGS:
        raise IosimError(f"head_dim {d} has no backward kernel; built for {', '.join(map(str, build.BWD_TILINGS))}")
    if key not in build.BWD_TILINGS[d]:
        offered = ", ".join(f"{a}x{c} {w}w" for a, c, w in build.BWD_TILINGS[d])
        raise IosimError(f"no backward kernel built for {t.block_q}x{t.block_kv} {t.warps}w at head_dim {d}; "
                         f"built: {offered}")
    smem = iosim_bwd_smem(loop_order, d, *key[:2])
    if smem > _smem_limit():
        raise IosimError(f"backward tiling {t.block_q}x{t.block_kv} needs {smem} B of shared memory a block; this "
                         f"GPU allows {_smem_limit()} B")
    bf = cfg.dtype == "bf16"
    scale = 1 / math.sqrt(d) if scale is None else scale
    rows = b * h * nq
    dq = _empty(qa, qa.shape, cfg.dtype)
    grouped = hkv != h
    dk = _empty(qa, (b, h, nk, d), cfg.dtype) if grouped else _empty(qa, ka.shape, cfg.dtype)
    dv = _empty(qa, (b, h, nk, d), cfg.dtype) if grouped else _empty(qa, va.shape, cfg.dtype)
    acc = _empty(qa, (rows * d,), "fp32")
    ints = [np.int32(x) for x in (b, h, hkv, nq, nk)] if loop_order == "flash2" else \
        [np.int32(x) for x in (b, h, nq, nk)]
    floats = (np.float32(scale * LOG2E), np.float32(scale), np.int32(causal))
    main = build.kernel(build.bwd_name(loop_order, d, *key, bf))
    main.max_dynamic_shared_size_bytes = smem
    p = [np.uint64(x) for x in (qa.ptr, ka.ptr, va.ptr)]
    with _stream(qa):
        if loop_order == "flash2":
            dsum = _empty(qa, (rows,), "fp32")
            per = build.ROW_THREADS // (d // 8)
            build.kernel(build.dot_name(d, bf))((_blocks(rows, per),), (build.ROW_THREADS,),
                                                (np.uint64(da.ptr), np.uint64(oa.ptr), np.uint64(_ptr(dsum)),
                                                 np.uint64(_ptr(acc)), np.int64(rows)))
            main((b * h * _blocks(nk, t.block_kv),), (32 * t.warps,),
                 (*p, np.uint64(da.ptr), np.uint64(_ptr(lse)), np.uint64(_ptr(dsum)), np.uint64(_ptr(acc)),
                  np.uint64(_ptr(dk)), np.uint64(_ptr(dv)), *ints, *floats), shared_mem=smem)
        else:
            acc.fill(0) if qa.kind == "cupy" else acc.zero_()
            main((b * h,), (32 * t.warps,),
                 (*p, np.uint64(oa.ptr), np.uint64(da.ptr), np.uint64(_ptr(lse)), np.uint64(_ptr(acc)),
                  np.uint64(_ptr(dk)), np.uint64(_ptr(dv)), *ints, *floats), shared_mem=smem)
        n8 = rows * d // 8
        build.kernel(build.convert_name(bf))((_blocks(n8, 256),), (256,), (np.uint64(_ptr(acc)), np.uint64(_ptr(dq)),
                                                                          np.int64(n8), np.float32(scale)))
    if grouped:   # each group's query heads' dK and dV summed, one reduction apiece
        dk, dv = (_group_sum(x, b, hkv, h // hkv, nk, d, qa.kind) for x in (dk, dv))
    return dq, dk, dv


def _group_sum(x, b, hkv, g, nk, d, kind):
    if kind == "torch":
        return x.view(b, hkv, g, nk, d).sum(2)
    return x.reshape(b, hkv, g, nk, d).sum(axis=2, dtype=np.float32).astype(x.dtype)


def naive_attention_backward(q, k, v, p, do, *, causal: bool = False, scale: float | None = None):
    """dQ, dK, dV of naive attention whose forward stored P ((B, Hkv, G * Nq, Nk): a group's query rows stacked).
    `causal` is not needed by the arithmetic (P is zero where masked) and is only checked."""
    qa, ka, va = _arg(q, "q"), _arg(k, "k"), _arg(v, "v")
    cfg = _config(qa, ka, va, causal)
    b, h, hkv, nq, nk, d = cfg.batch, cfg.heads, cfg.kv_heads, cfg.seqlen_q, cfg.seqlen_k, cfg.head_dim
    g = h // hkv
    _check_like(_arg(p, "p"), "p", qa, (b, hkv, g * nq, nk), qa.dtype)
    _check_like(_arg(do, "do"), "do", qa, qa.shape, qa.dtype)
    row_bytes = 4 * nk + build.SOFTMAX_BWD_SMEM_PAD
    if row_bytes > _smem_limit():
        raise IosimError(f"the softmax gradient holds a row of {nk} keys in shared memory ({row_bytes} B); this GPU "
                         f"allows {_smem_limit()} B")
    scale = 1 / math.sqrt(d) if scale is None else scale
    torch_kind = qa.kind == "torch"

    def t(x):   # the last two axes swapped, as a view: cuBLAS reads it transposed
        return x.transpose(-1, -2) if torch_kind else x.swapaxes(-1, -2)
    qg, dog = q.reshape(b, hkv, g * nq, d), do.reshape(b, hkv, g * nq, d)
    dv = t(p) @ dog
    dp = dog @ t(v)
    ds = _empty(qa, (b, hkv, g * nq, nk), cfg.dtype)
    fn = build.kernel(build.softmax_bwd_name(cfg.dtype == "bf16"))
    fn.max_dynamic_shared_size_bytes = row_bytes
    with _stream(qa):
        fn((b * h * nq,), (build.ROW_THREADS,), (np.uint64(_ptr(p)), np.uint64(_ptr(dp)), np.uint64(_ptr(ds)),
                                                 np.int32(nk), np.float32(scale)), shared_mem=row_bytes)
    dq = (ds @ k).reshape(b, h, nq, d)
    dk = t(ds) @ qg
    return dq, dk, dv
