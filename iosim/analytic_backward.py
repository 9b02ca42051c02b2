"""Exact closed-form counts of the backward pass (two-level model: every load, store and atomic goes to HBM).

Written from the algorithms' definitions as sums over query blocks, apart from the plans' steps; the engine with L2
off must reproduce them exactly (a test). An atomic add counts as a read and a write. The row kernels around the
attention kernels (`plan.rows.RowKernel`) are counted from what they declare: rows times bytes a row.
"""
from __future__ import annotations

from .counts import KernelCounts
from .kernels.cublas import Cublas, GemmTile
from .kernels.torch_fa2 import backward_blocks
from .plan import Plan, Tiling
from .plan.blocks import RowBlocks
from .plan.costs import BWD_OTHER_PER_SCORE
from .plan.naive import pv_partial_bytes
from .plan.passes import key_major
from .plan.rows import RowKernel
from .workload import STAT_BYTES, AttentionConfig


def row_counts(k: RowKernel) -> KernelCounts:
    c = KernelCounts(k.name)
    c.hbm_read.update(k.bytes_read())
    c.hbm_write.update(k.bytes_written())
    c.exp_ops, c.other_flops = k.exp_per_row * k.rows, k.other_per_row * k.rows
    return c


def _rows(plan: Plan, *names: str) -> list[KernelCounts]:
    return [row_counts(k) for k in plan.kernels if k.name in names and isinstance(k, RowKernel)]


def qk_counts(name: str, cfg: AttentionConfig, blas: Cublas, tiles, a: str, b: str, out: str) -> KernelCounts:
    """A GEMM of S's shape (rows x keys, reduced over d) reading `a` (a row strip's operand) and `b` (a key tile's)."""
    bh, nq, nk, d, e = cfg.bh, cfg.seqlen_q, cfg.seqlen_k, cfg.head_dim, cfg.elem_bytes
    t = blas.tiles(cfg, tiles)["qk"]
    k = KernelCounts(name)
    k.hbm_read[a] += bh * t.b_loads(nk) * nq * d * e
    k.hbm_read[b] += bh * t.a_loads(nq) * nk * d * e
    k.hbm_write[out] += bh * nq * nk * e
    k.mma_flops = 2 * bh * nq * nk * d
    return k


def pv_counts(name: str, cfg: AttentionConfig, blas: Cublas, tiles, p: str, v: str, out: str,
              part: str) -> KernelCounts:
    """A GEMM of O's shape (rows x d, reduced over the keys) reading `p` (rows x keys) and `v` (keys x d)."""
    bh, nq, nk, d, e = cfg.bh, cfg.seqlen_q, cfg.seqlen_k, cfg.head_dim, cfg.elem_bytes
    t = blas.tiles(cfg, tiles)["pv"]
    k = KernelCounts(name)
    k.hbm_read[p] += t.b_loads(d) * bh * nq * nk * e
    k.hbm_read[v] += bh * t.a_loads(nq) * nk * d * e
    k.hbm_write[out] += bh * nq * d * e
    split = pv_partial_bytes(cfg, blas, tiles)
    if split:
        k.hbm_write[part] += split
        k.hbm_read[part] += split
    k.mma_flops = 2 * bh * nq * nk * d
    return k


def gemm_counts(kind: str, name: str, cfg: AttentionConfig, blas: Cublas, tiles, a: str, b: str, out: str,
                part: str = "") -> list[KernelCounts]:
    """The counts of the kernels cuBLAS runs for one GEMM: the GEMM's, and where it splits its reduction over
    the keys (`Cublas.splits`), the GEMM writing `splits` fp32 partials of the output in its place and the reduce
    kernel reading them and writing the output."""
    if kind == "qk":
        return [qk_counts(name, cfg, blas, tiles, a, b, out)]
    k = pv_counts(name, cfg, blas, tiles, a, b, out, part)
    splits = blas.splits(cfg, "pv", blas.tiles(cfg, tiles))
    if splits == 1:
        return [k]
    rows, d = cfg.bh * cfg.seqlen_q, cfg.head_dim
    r = KernelCounts(f"{name}_reduce")
    r.hbm_read[part] = k.hbm_write[part] = splits * rows * d * 4
    r.hbm_write[out] = k.hbm_write.pop(out)
    r.other_flops = splits * rows * d
    return [k, r]


def transposed(cfg: AttentionConfig, kv_heads: int | None = None) -> AttentionConfig:
    """The shape of P^T dO and dS^T Q: rows are keys, reduced over the queries (GEMMs ignore the mask)."""
    return cfg.model_copy(update={"seqlen_q": cfg.seqlen_k, "seqlen_k": cfg.seqlen_q, "causal": False,
                                  "kv_heads": kv_heads or cfg.kv_heads, "pass_": "forward"})


def naive_backward_counts(cfg: AttentionConfig, plan: Plan, blas: Cublas,
                          tiles: dict[str, GemmTile] | None) -> list[KernelCounts]:
    t_cfg = key_major(cfg)
    return [*gemm_counts("pv", "naive_dv", t_cfg, blas, tiles, "P", "dO", "dV", "dVpart"),
            *gemm_counts("qk", "naive_dp", cfg, blas, tiles, "dO", "V", "dP"),
            *_rows(plan, "naive_softmax_bwd"),
            *gemm_counts("pv", "naive_dq", cfg, blas, tiles, "dS", "K", "dQ", "dQpart"),
            *gemm_counts("pv", "naive_dk", t_cfg, blas, tiles, "dS", "Q", "dK", "dKpart")]


def eager_counts(cfg: AttentionConfig, plan: Plan, blas: Cublas, tiles: dict[str, GemmTile] | None,
                 which: str) -> list[KernelCounts]:
    """Eager PyTorch's kernels of one pass, in the plan's order: its GEMMs (and their split-K reduce kernels) in
    closed form, its elementwise and softmax kernels from their rows."""
    t_cfg = transposed(cfg)
    gemms = {"eager_qk": lambda: gemm_counts("qk", "eager_qk", cfg, blas, tiles, "Q", "K", "S"),
             "eager_pv": lambda: gemm_counts("pv", "eager_pv", cfg, blas, tiles, "P", "V", "O", "Opart"),
             "eager_dv": lambda: gemm_counts("pv", "eager_dv", t_cfg, blas, tiles, "P", "dO", "dV", "dVpart"),
             "eager_dp": lambda: gemm_counts("qk", "eager_dp", cfg, blas, tiles, "dO", "V", "dP"),
             "eager_dq": lambda: gemm_counts("pv", "eager_dq", cfg, blas, tiles, "dS", "K", "dQ", "dQpart"),
             "eager_dk": lambda: gemm_counts("pv", "eager_dk", t_cfg, blas, tiles, "dS", "Q", "dK", "dKpart")}
    first = {"forward": "eager_qk", "backward": "eager_dv"}[which]
    last = {"forward": "eager_pv", "backward": "eager_dk"}[which]
    names = [k.name for k in plan.kernels]
    i0 = names.index(first)
    i1 = max(i for i, n in enumerate(names) if n in (last, f"{last}_reduce"))
    out: list[KernelCounts] = []
    for k in plan.kernels[i0:i1 + 1]:
        if k.name in gemms:
            out += gemms[k.name]()
        elif not k.name.endswith("_reduce"):
            out.append(row_counts(k))
    return out


def flash_backward_counts(cfg: AttentionConfig, plan: Plan, tiling: Tiling) -> list[KernelCounts]:
    """The tiled backward: per head, query block i visits the key tiles it sees (nvis_i of them, keys_in_i keys)."""
    bh, d, e, nk = cfg.bh, cfg.head_dim, cfg.elem_bytes, cfg.seqlen_k
    flash2 = tiling.loop_order == "flash2"
    bq, bkv = backward_blocks(d)[:2]   # flash1's backward too: gpu_kernels runs it at the backward's blocks
    g = RowBlocks(cfg, bq, bkv)
    row_tiles = int((g.rows * g.nvis).sum())      # (query row, key tile) visits
    row_keys = int((g.rows * g.keys_in).sum())    # scores recomputed (whole visited tiles)
    k = KernelCounts("flash2_bwd" if flash2 else "flash1_bwd")
    kv = bh * nk * d * e                          # every key tile read once by its (batch, head)
    k.hbm_read["K"] = k.hbm_read["V"] = kv
    k.hbm_read["Q"] = k.hbm_read["dO"] = bh * row_tiles * d * e
    k.hbm_read["L"] = bh * row_tiles * STAT_BYTES
    k.hbm_read["dQacc"] = k.hbm_write["dQacc"] = bh * row_tiles * d * 4
    if flash2:
        k.hbm_read["D"] = bh * row_tiles * STAT_BYTES
    else:
        k.hbm_read["O"] = bh * row_tiles * d * e  # flash1 recomputes D_i from dO_i and O_i at each visit
    dk, dv = ("dKexp", "dVexp") if cfg.group > 1 else ("dK", "dV")
    k.hbm_write[dk] = k.hbm_write[dv] = kv
    k.mma_flops = 10 * bh * row_keys * d
    k.recompute_flops = 2 * bh * row_keys * d
    k.exp_ops = bh * row_keys
    k.other_flops = BWD_OTHER_PER_SCORE * bh * row_keys + (0 if flash2 else 2 * d * bh * row_tiles)
    first, last = ("flash2_bwd_dot", "flash2_bwd_convert") if flash2 else ("flash1_bwd_init", "flash1_bwd_convert")
    return [*_rows(plan, "sdpa_copy"), *_rows(plan, first), k, *_rows(plan, last), *_rows(plan, "gqa_sum")]
