"""Launcher of flash3, the Hopper forward pass (hopper.cu): TMA tensor maps encoded with cuda-python, the kernel
compiled by NVRTC for sm_90a. Layout and call shape as `ops.flash_attention`; forward only, Hopper only."""
from __future__ import annotations

import ctypes
import functools
import math

import numpy as np

from iosim.errors import IosimError
from iosim.plan.flash3 import STAGES, geometry, smem_bytes

from . import build, ops
from .reference import LOG2E

HEAD_DIMS = (64, 128)      # built at iosim.plan.flash3's geometry: 64 query rows a consumer, two K/V stages
_maps: dict[tuple, object] = {}
_counters: dict[int, object] = {}
_module = None


def _kernel(name: str):
    global _module
    import cupy as cp
    if _module is None or name not in _module[1]:
        names = sorted(set(build.flash3_names()) | {name} | (_module[1] if _module else set()))
        mod = cp.RawModule(code=build.hopper_source(), options=("-std=c++17", "-arch=sm_90a"), name_expressions=names)
        mod.compile()
        _module = (mod, set(names))
    return _module[0].get_function(name)


def _encode(ptr: int, bh: int, n: int, d: int, rows: int, bf16: bool) -> np.ndarray:
    """The 128-byte tensor map of a (bh, n, d) tensor read in boxes of 64 columns x `rows` rows, 128-byte swizzle,
    rows past n filled with zeros."""
    from cuda.bindings import driver as drv
    dtype = drv.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 if bf16 else \
        drv.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16
    args = ([d, n, bh], [d * 2, n * d * 2], [64, rows, 1], [1, 1, 1])
    try:
        err, tm = drv.cuTensorMapEncodeTiled(dtype, 3, ptr, *args, drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
                                             drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
                                             drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                             drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    except TypeError:   # older bindings want their own integer types
        u64, u32 = drv.cuuint64_t, drv.cuuint32_t
        err, tm = drv.cuTensorMapEncodeTiled(dtype, 3, ptr, [u64(x) for x in args[0]], [u64(x) for x in args[1]],
                                             [u32(x) for x in args[2]], [u32(x) for x in args[3]],
                                             drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
                                             drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
                                             drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                             drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if err != drv.CUresult.CUDA_SUCCESS:
        raise IosimError(f"cuTensorMapEncodeTiled failed ({err}) for a ({bh}, {n}, {d}) tensor")
    return np.frombuffer(ctypes.string_at(tm.getPtr(), 128), dtype=np.uint64).copy()


def _tensor_maps(qa, ka, va, cfg, block_q: int, block_kv: int):
    """Q, K and V's maps side by side in GPU memory, kept per (pointers, shape, boxes): a map holds nothing else."""
    import cupy as cp
    bf16, d = cfg.dtype == "bf16", cfg.head_dim
    key = (qa.ptr, ka.ptr, va.ptr, cfg.batch, cfg.heads, cfg.kv_heads, cfg.seqlen_q, cfg.seqlen_k, d, bf16, block_q,
           block_kv)
    if key not in _maps:
        if len(_maps) > 256:
            _maps.clear()
        bq, bkv = cfg.batch * cfg.heads, cfg.batch * cfg.kv_heads
        host = np.concatenate([_encode(qa.ptr, bq, cfg.seqlen_q, d, block_q, bf16),
                               _encode(ka.ptr, bkv, cfg.seqlen_k, d, block_kv, bf16),
                               _encode(va.ptr, bkv, cfg.seqlen_k, d, block_kv, bf16)])
        _maps[key] = cp.asarray(host)
    return _maps[key]


def _claims():
    """The two ints a persistent grid claims work tiles with, zero between launches (the kernel's last block sets
    them back), one pair a device: its launches on one stream run one after another."""
    import cupy as cp
    dev = cp.cuda.Device().id
    if dev not in _counters:
        _counters[dev] = cp.zeros(2, dtype=cp.int32)
    return _counters[dev]


def _sm_count() -> int:
    import cupy as cp
    return _device_sms(cp.cuda.Device().id)


@functools.cache
def _device_sms(dev: int) -> int:
    import cupy as cp
    return cp.cuda.Device(dev).attributes["MultiProcessorCount"]


@functools.lru_cache(maxsize=1024)
def _geometry(cfg, sm_count: int | None) -> tuple[int, int]:
    # kept per shape: the choice walks a causal grid's work tiles, which a call must not pay for each time
    return geometry(cfg, "flash3", sm_count)


def flash3_attention(q, k, v, *, causal: bool = False, scale: float | None = None, return_lse: bool = False,
                     out=None, pingpong: bool = True, q_descending: bool | None = None,
                     v_offsets: tuple[int, int] | None = None, blocks: tuple[int, int] | None = None,
                     persistent: bool = True, claims: bool | None = None):
    """flash3's forward pass: O (and L, natural-log log-sum-exp, fp32, if asked). `pingpong`: the consumer
    warpgroups take turns at the tensor cores; `q_descending` (causal's default) launches a head's longest query
    blocks first. `v_offsets` overrides the V descriptor's (leading, stride) byte offsets (a layout probe's);
    `blocks` overrides the (consumer warpgroups, key-tile width) iosim.plan.flash3.geometry gives (a benchmark's);
    `persistent`: a grid of one block an SM, each taking work tiles in turn (else one block a work tile), by
    `claims` (default: causal's) the next unclaimed tile, as the hardware deals blocks, else every SM count-th."""
    import cupy as cp
    qa, ka, va = ops._arg(q, "q"), ops._arg(k, "k"), ops._arg(v, "v")
    cfg = ops._config(qa, ka, va, causal)
    d = cfg.head_dim
    if cp.cuda.Device().compute_capability != "90":
        raise IosimError(f"flash3 needs a Hopper GPU (sm_90); this one is sm_{cp.cuda.Device().compute_capability}")
    if d not in HEAD_DIMS:
        raise IosimError(f"head_dim {d} has no flash3 kernel; built for {', '.join(map(str, HEAD_DIMS))}")
    consumers, block_kv = blocks or _geometry(cfg, _sm_count() if persistent else None)
    if consumers not in (2, 3) or block_kv not in (64, 128, 192):
        raise IosimError(f"blocks {consumers, block_kv}: flash3 is built for 2 or 3 consumers and key tiles of 64, "
                         "128 or 192")
    block_q = 64 * consumers
    smem = smem_bytes(cfg, (consumers, block_kv))
    fn = _kernel(build.flash3_name(d, block_kv, STAGES, consumers, pingpong, cfg.dtype == "bf16"))
    fn.max_dynamic_shared_size_bytes = smem
    b, h, nq = cfg.batch, cfg.heads, cfg.seqlen_q
    if out is None:
        out = ops._empty(qa, (b, h, nq, d), cfg.dtype)
    else:
        oa = ops._arg(out, "out")
        if oa.shape != qa.shape or oa.dtype != qa.dtype or oa.kind != qa.kind:
            raise IosimError(f"out must match q: shape {qa.shape} {qa.dtype} {qa.kind}")
    lse = ops._empty(qa, (b, h, nq), "fp32")
    maps = _tensor_maps(qa, ka, va, cfg, block_q, block_kv)
    scale_log2 = np.float32((1 / math.sqrt(d) if scale is None else scale) * LOG2E)
    lbo, sbo = v_offsets or (block_kv * 128, 1024)
    desc = causal if q_descending is None else q_descending
    with ops._stream(qa):
        tiles = b * h * -(-nq // block_q)
        grid = min(tiles, _sm_count()) if persistent else tiles
        dynamic = persistent and grid < tiles and (causal if claims is None else claims)
        fn((grid,), (128 * (consumers + 1),),
           (np.uint64(maps.data.ptr), np.uint64(ops._ptr(out)), np.uint64(ops._ptr(lse)),
            *[np.int32(x) for x in (b, h, cfg.kv_heads, nq, cfg.seqlen_k)], scale_log2, np.int32(causal),
            np.int32(desc), np.uint32(lbo), np.uint32(sbo), np.uint64(_claims().data.ptr if dynamic else 0)),
           shared_mem=smem)
    return (out, lse) if return_lse else out
