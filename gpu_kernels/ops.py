"""Launchers: naive and tiled attention on CuPy arrays or torch tensors (zero-copy), layout (B, H, N, d).

Block sizes, warps, buffering and grid order come from an `iosim.plan.Tiling`, the same object the simulator
reads. Inputs must be on the GPU, contiguous, fp16 or bf16 (bf16 through torch: CuPy has no bf16 dtype), with
q (B, H, Nq, d) and k, v (B, Hkv, Nk, d), H a multiple of Hkv.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from iosim.errors import IosimError
from iosim.plan import Tiling
from iosim.workload import AttentionConfig

from . import build
from .reference import LOG2E


@dataclass
class _Arg:
    ptr: int
    shape: tuple
    dtype: str        # "fp16" or "bf16"
    kind: str         # "cupy" or "torch"
    obj: object


def _arg(x, name: str) -> _Arg:
    mod = type(x).__module__.split(".")[0]
    if mod == "torch":
        import torch
        if not x.is_cuda:
            raise IosimError(f"{name} is a CPU tensor; move it to the GPU (.cuda())")
        if not x.is_contiguous():
            raise IosimError(f"{name} is not contiguous; call .contiguous() first")
        dt = {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(x.dtype)
        if dt is None:
            raise IosimError(f"{name} has dtype {x.dtype}; the tensor-core kernels take float16 or bfloat16")
        return _Arg(x.data_ptr(), tuple(x.shape), dt, "torch", x)
    if mod == "cupy":
        if not x.flags.c_contiguous:
            raise IosimError(f"{name} is not contiguous; call cupy.ascontiguousarray first")
        if x.dtype != np.float16:
            raise IosimError(f"{name} has dtype {x.dtype}; CuPy arrays must be float16 (bf16 through torch)")
        return _Arg(x.data.ptr, tuple(x.shape), "fp16", "cupy", x)
    raise IosimError(f"{name} must be a CuPy array or a torch CUDA tensor, got {type(x).__name__}")


def _config(q: _Arg, k: _Arg, v: _Arg, causal: bool) -> AttentionConfig:
    for a, n in ((q, "q"), (k, "k"), (v, "v")):
        if len(a.shape) != 4:
            raise IosimError(f"{n} must be 4-D (batch, heads, seq, head_dim), got shape {a.shape}")
    if k.shape != v.shape:
        raise IosimError(f"k and v must have one shape, got {k.shape} and {v.shape}")
    if q.dtype != k.dtype or q.dtype != v.dtype or q.kind != k.kind or q.kind != v.kind:
        raise IosimError("q, k and v must share dtype and kind (all CuPy or all torch)")
    (b, h, nq, d), (bk, hkv, nk, dk) = q.shape, k.shape
    if bk != b or dk != d:
        raise IosimError(f"k/v shape {k.shape} does not match q shape {q.shape} in batch or head_dim")
    return AttentionConfig.make(batch=b, heads=h, kv_heads=hkv, seqlen_q=nq, seqlen_k=nk, head_dim=d,
                                dtype=q.dtype, causal=causal)


POISON = False   # tests set it: every buffer a launcher allocates starts as NaN, so an element left unwritten shows


def _empty(like: _Arg, shape: tuple, dtype: str):
    if like.kind == "torch":
        import torch
        t = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
        if POISON:
            return torch.full(shape, float("nan"), dtype=t, device=like.obj.device)
        return torch.empty(shape, dtype=t, device=like.obj.device)
    import cupy as cp
    dt = {"fp16": np.float16, "fp32": np.float32}[dtype]
    return cp.full(shape, np.nan, dtype=dt) if POISON else cp.empty(shape, dtype=dt)


def _ptr(x) -> int:
    return x.data_ptr() if type(x).__module__.startswith("torch") else x.data.ptr


def _stream(like: _Arg):
    import cupy as cp
    if like.kind == "torch":
        import torch
        ts = torch.cuda.current_stream(like.obj.device)
        try:
            return cp.cuda.Stream.from_external(ts)       # CuPy >= 14: the CUDA stream protocol
        except (AttributeError, TypeError):
            return cp.cuda.ExternalStream(ts.cuda_stream)
    return cp.cuda.get_current_stream()


def _smem_limit() -> int:
    import cupy as cp
    dev = cp.cuda.Device()
    if dev.id not in _SMEM_LIMIT:   # Device.attributes queries every attribute: ~100 driver calls, once a device
        _SMEM_LIMIT[dev.id] = dev.attributes["MaxSharedMemoryPerBlockOptin"]
    return _SMEM_LIMIT[dev.id]


_SMEM_LIMIT: dict[int, int] = {}


def flash_attention(q, k, v, *, causal: bool = False, tiling: Tiling | None = None, scale: float | None = None,
                    return_lse: bool = False, out=None):
    """Tiled forward pass in `tiling.loop_order` (flash2 by default). Returns O (and L, fp32, if asked).
    `out`, if given, is written in place (same shape, dtype and kind as q)."""
    return _flash(q, k, v, tiling.loop_order if tiling else "flash2", causal, tiling, scale, return_lse, out)


def _flash(q, k, v, loop_order: str, causal: bool, tiling: Tiling | None, scale: float | None,
           return_lse: bool, out):
    qa, ka, va = _arg(q, "q"), _arg(k, "k"), _arg(v, "v")   # parsed and checked once per call
    cfg = _config(qa, ka, va, causal)
    t = tiling or Tiling.practice(cfg, loop_order)
    if t.loop_order != loop_order:
        t = t.model_copy(update={"loop_order": loop_order})
    d = cfg.head_dim
    if t.kv_splits != 1:
        raise IosimError(f"tiling kv_splits={t.kv_splits}: split-KV is modelled by iosim but has no kernel here; "
                         "use kv_splits=1")
    key = (t.block_q, t.block_kv, t.warps, t.stages)
    if d not in build.TILINGS:
        raise IosimError(f"head_dim {d} has no kernel; built for {', '.join(map(str, build.TILINGS))}")
    if key not in build.TILINGS[d]:
        offered = ", ".join(f"{a}x{b} {w}w {s}st" for a, b, w, s in build.TILINGS[d])
        raise IosimError(f"no kernel built for tiling {t.block_q}x{t.block_kv} {t.warps}w {t.stages}st at "
                         f"head_dim {d}; built: {offered}")
    smem = t.smem_bytes(cfg)
    if smem > _smem_limit():
        raise IosimError(f"tiling {t.describe()} needs {smem} B of shared memory per block; this GPU allows "
                         f"{_smem_limit()} B")
    fn = build.kernel(build.flash_name(t.loop_order, d, *key, cfg.dtype == "bf16"))
    fn.max_dynamic_shared_size_bytes = smem
    b, h, nq = cfg.batch, cfg.heads, cfg.seqlen_q
    if out is None:
        out = _empty(qa, (b, h, nq, d), cfg.dtype)
    else:
        oa = _arg(out, "out")
        if oa.shape != qa.shape or oa.dtype != qa.dtype or oa.kind != qa.kind:
            raise IosimError(f"out must match q: shape {qa.shape} {qa.dtype} {qa.kind}")
    lse = _empty(qa, (b, h, nq), "fp32")
    scale_log2 = np.float32((1 / math.sqrt(d) if scale is None else scale) * LOG2E)
    ints = [np.int32(x) for x in (b, h, cfg.kv_heads, nq, cfg.seqlen_k)]
    ptrs = [np.uint64(p) for p in (qa.ptr, ka.ptr, va.ptr, _ptr(out), _ptr(lse))]
    with _stream(qa):
        if t.loop_order == "flash2":
            grid = (b * h * -(-nq // t.block_q),)
            fn(grid, (t.threads,), (*ptrs, *ints, scale_log2, np.int32(causal),
                                    np.int32(t.grid_order == "bh_fastest"), np.int32(t.q_order == "descending")),
               shared_mem=smem)
        else:
            acc = _empty(qa, (b, h, nq, d), "fp32")
            m, l = _empty(qa, (b, h, nq), "fp32"), _empty(qa, (b, h, nq), "fp32")
            fn((b * h,), (t.threads,), (*ptrs, np.uint64(_ptr(acc)), np.uint64(_ptr(m)), np.uint64(_ptr(l)),
                                        *ints, scale_log2, np.int32(causal)), shared_mem=smem)
    return (out, lse) if return_lse else out


def naive_attention(q, k, v, *, causal: bool = False, scale: float | None = None, return_p: bool = False):
    """The paper's standard attention: S = Q K^T (cuBLAS) to HBM; P = softmax(scale * S) to HBM (a RawKernel
    reading S once and writing P once); O = P V (cuBLAS). With return_p, also P ((B, Hkv, G * Nq, Nk): the rows
    of a group's query heads stacked), which the backward takes."""
    qa, ka, va = _arg(q, "q"), _arg(k, "k"), _arg(v, "v")
    cfg = _config(qa, ka, va, causal)
    b, h, hkv, nq, nk, d = cfg.batch, cfg.heads, cfg.kv_heads, cfg.seqlen_q, cfg.seqlen_k, cfg.head_dim
    row_bytes = 4 * nk
    if row_bytes > _smem_limit():
        raise IosimError(f"naive softmax holds a row of {nk} keys in shared memory ({row_bytes} B); this GPU "
                         f"allows {_smem_limit()} B")
    # grouped heads: query heads of one kv head are contiguous, so (B, Hkv, G*Nq, d) is a free reshape
    qg = q.reshape(b, hkv, (h // hkv) * nq, d)
    s = qg @ (k.transpose(-1, -2) if qa.kind == "torch" else k.transpose(0, 1, 3, 2))
    p = _empty(qa, (b, hkv, (h // hkv) * nq, nk), cfg.dtype)
    fn = build.kernel(build.softmax_name(cfg.dtype == "bf16"))
    fn.max_dynamic_shared_size_bytes = row_bytes
    scale_log2 = np.float32((1 / math.sqrt(d) if scale is None else scale) * LOG2E)
    with _stream(qa):
        fn((b * h * nq,), (build.SOFTMAX_THREADS,), (np.uint64(_ptr(s)), np.uint64(_ptr(p)), np.int32(nq),
                                                     np.int32(nk), scale_log2, np.int32(causal)),
           shared_mem=row_bytes)
    o = (p @ v).reshape(b, h, nq, d)
    return (o, p) if return_p else o


def attention(q, k, v, algorithm: str = "flash2", *, causal: bool = False, tiling: Tiling | None = None,
              scale: float | None = None, is_causal: bool | None = None, bwd_tiling: Tiling | None = None):
    """Run `algorithm` ('naive', 'flash1', 'flash2'; 'flash3' on Hopper, forward only) on q, k, v; the result is
    of q's kind. Called as
    `F.scaled_dot_product_attention` is (q, k, v, is_causal=..., scale=...; grouped heads taken as they come);
    torch tensors that require grad go through `autograd.Attention`, so the result is differentiable (the
    backward runs the same algorithm's backward kernels). `tiling` sets the forward's blocks, `bwd_tiling` the
    backward's (`Tiling.backward` by default); flash3 takes one of the blocks it is built at (`iosim.plan.flash3`)."""
    causal = causal if is_causal is None else is_causal
    if algorithm not in ("naive", "flash1", "flash2", "flash3"):
        raise IosimError(f"unknown algorithm '{algorithm}'; choose naive, flash1, flash2 or flash3")
    if type(q).__module__.startswith("torch"):
        import torch
        if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
            if algorithm == "flash3":
                raise IosimError("flash3 has a forward pass only; use flash2 where gradients are needed")
            from .autograd import Attention
            return Attention.apply(q, k, v, algorithm, causal, scale, tiling, bwd_tiling)
    if algorithm == "naive":
        return naive_attention(q, k, v, causal=causal, scale=scale)
    if algorithm == "flash3":
        from .hopper import flash3_attention
        blocks = (tiling.block_q // 64, tiling.block_kv) if tiling is not None else None
        return flash3_attention(q, k, v, causal=causal, scale=scale, blocks=blocks)
    return _flash(q, k, v, algorithm, causal, tiling, scale, False, None)
