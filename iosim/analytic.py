"""Exact closed-form counts of the forward and backward passes, and the roofline time bound that follows from them.

Counts are those of the two-level model (every load and store of a plan goes to HBM; no L2): the paper's
accounting. They are written from the algorithms' definitions, sums over query blocks, independently of the
plans' step-by-step form; the engine with L2 off must reproduce them exactly (a test).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from .hardware import HardwareProfile
from .kernels import cublas
from .kernels.cublas import Cublas, GemmTile
from .plan import Tiling, build_plan
from .plan.blocks import RowBlocks
from .plan.costs import OTHER_PER_SCORE, combine_work, softmax_work
from .analytic_backward import eager_counts, flash_backward_counts, gemm_counts, naive_backward_counts
from .counts import KernelCounts
from .totals import Totals
from .workload import STAT_BYTES, AttentionConfig, sum_keys_seen


@dataclass
class Analysis(Totals):
    """The analytic model's answer for one algorithm: per-kernel counts, totals, footprint, roofline."""
    algorithm: str
    config: AttentionConfig
    profile: HardwareProfile
    tiling: Tiling | None
    kernels: list[KernelCounts]
    peak_footprint_bytes: int

    @property
    def hbm_read_bytes(self) -> int:
        return self._sum("read_bytes")

    @property
    def hbm_write_bytes(self) -> int:
        return self._sum("write_bytes")

    def per_tensor(self) -> dict[str, tuple[int, int]]:
        out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for k in self.kernels:
            for t, b in k.hbm_read.items():
                out[t][0] += b
            for t, b in k.hbm_write.items():
                out[t][1] += b
        return {t: (r, w) for t, (r, w) in out.items()}

    @property
    def recompute_flops(self) -> int:
        return self._sum("recompute_flops")

    def roofline_by_kernel(self) -> list[dict[str, float]]:
        return [k.roofline(self.profile, self.config.dtype) for k in self.kernels]

    @property
    def time_bound_s(self) -> float:
        """Kernels run one after another: the sum of each kernel's max(bytes / bandwidth, work / peak)."""
        return sum(max(r.values()) for r in self.roofline_by_kernel())

    @property
    def time_s(self) -> float:
        return self.time_bound_s

    @property
    def bound(self) -> str:
        """The resource that sets most of the bound."""
        share: dict[str, float] = defaultdict(float)
        for r in self.roofline_by_kernel():
            name = max(r, key=r.get)
            share[name] += r[name]
        return max(share, key=share.get)


def analyze(cfg: AttentionConfig, algorithm: str, hw: HardwareProfile, tiling: Tiling | None = None,
            gemm_tiles: dict[str, GemmTile] | None = None) -> Analysis:
    """Exact counts of `algorithm` on `cfg`'s pass, and their roofline on `hw` (naive's GEMMs in `gemm_tiles`, else
    cuBLAS's choice on `hw`)."""
    plan = build_plan(cfg, algorithm, hw, tiling, gemm_tiles=gemm_tiles)   # validates the tiling, gives the footprint
    tiling = plan.tiling
    blas = cublas.for_chip(hw)
    fwd = cfg.with_pass("forward")
    kernels: list[KernelCounts] = []
    if "forward" in cfg.passes:
        if algorithm == "eager":
            kernels += eager_counts(fwd, plan, blas, gemm_tiles, "forward")
        elif tiling is None:
            kernels += _naive(fwd, blas, gemm_tiles)
        elif tiling.loop_order == "flash2":
            kernels += _flash2(fwd, tiling)
        else:
            kernels.append(_flash1(fwd, tiling))
    if "backward" in cfg.passes:
        if algorithm == "eager":
            kernels += eager_counts(cfg, plan, blas, gemm_tiles, "backward")
        elif tiling is None:
            kernels += naive_backward_counts(cfg, plan, blas, gemm_tiles)
        else:
            kernels += flash_backward_counts(cfg, plan, tiling)
    return Analysis(algorithm, cfg, hw, tiling, kernels, plan.peak_footprint_bytes())


def _naive(cfg: AttentionConfig, blas: Cublas, gemm_tiles: dict[str, GemmTile] | None) -> list[KernelCounts]:
    """Q K^T and P V as cuBLAS runs them (`analytic_backward.gemm_counts`: S^T = K Q^T and O^T = V^T P^T, a
    cluster's tiles sharing an operand tile load it once), and the softmax between."""
    bh, nq, nk, e = cfg.bh, cfg.seqlen_q, cfg.seqlen_k, cfg.elem_bytes
    sm = KernelCounts("naive_softmax")
    visible = bh * sum_keys_seen(cfg)
    sm.hbm_read["S"] = visible * e                        # masked scores' loads are predicated off
    sm.hbm_write["P"] = bh * nq * nk * e
    sm.exp_ops, sm.other_flops = softmax_work(visible)
    return [*gemm_counts("qk", "naive_qk", cfg, blas, gemm_tiles, "Q", "K", "S"), sm,
            *gemm_counts("pv", "naive_pv", cfg, blas, gemm_tiles, "P", "V", "O", "Opart")]


def _tile_sums(cfg: AttentionConfig, tiling: Tiling) -> tuple[RowBlocks, dict[str, int]]:
    """Per-head sums over query blocks i of rows_i * (keys covered, tiles visited, ...)."""
    g = RowBlocks(cfg, tiling.block_q, tiling.block_kv)
    r, n, keys = g.rows, g.nvis, g.keys_in
    seen = n > 0
    return g, {
        "row_keys": int((r * keys).sum()),       # scores computed (whole visited tiles)
        "row_tiles": int((r * n).sum()),         # (row, tile) visits
        "rows_seen": int(r[seen].sum()),         # rows that see at least one key
        "keys": int(keys.sum()),                 # keys loaded, summed over query blocks
        "row_rereads": int((r * np.maximum(n - 1, 0)).sum()),
        "kv_rows_outer": int(keys.max()) if len(keys) else 0,
    }


def _tile_flops(k: KernelCounts, cfg: AttentionConfig, s: dict[str, int]) -> None:
    bh, d = cfg.bh, cfg.head_dim
    k.mma_flops = 4 * bh * s["row_keys"] * d
    k.exp_ops = bh * (s["row_keys"] + s["row_tiles"] + s["rows_seen"])
    k.other_flops = bh * (OTHER_PER_SCORE * s["row_keys"] + d * s["row_tiles"] + d * s["rows_seen"])


def _flash2(cfg: AttentionConfig, tiling: Tiling) -> list[KernelCounts]:
    g, s = _tile_sums(cfg, tiling)
    bh, d, e, n = cfg.bh, cfg.head_dim, cfg.elem_bytes, tiling.kv_splits
    k = KernelCounts("flash2_fwd" if n == 1 else "flash2_fwd_split")
    # (query block, split) pairs that see a key: each reads Q_i and finishes its rows
    per = -(-g.n_kv // n)
    seen = [(int(g.rows[i]), sp) for i in range(g.n_q) for sp in range(n)
            if min(int(g.nvis[i]), (sp + 1) * per) > sp * per]
    rows_seen = sum(r for r, _ in seen)
    k.hbm_read["Q"] = bh * rows_seen * d * e
    k.hbm_read["K"] = k.hbm_read["V"] = bh * s["keys"] * d * e   # each query block reads the tiles it sees
    _tile_flops(k, cfg, s | {"rows_seen": rows_seen})
    rows = bh * cfg.seqlen_q
    if n == 1:
        k.hbm_write["O"] = rows * d * e
        k.hbm_write["L"] = rows * STAT_BYTES
        return [k]
    k.hbm_write["Oacc"] = n * rows * d * 4     # every split block writes its partial O and log-sum-exp
    k.hbm_write["Lacc"] = n * rows * STAT_BYTES
    c = KernelCounts("flash2_combine")
    c.hbm_read["Oacc"], c.hbm_read["Lacc"] = k.hbm_write["Oacc"], k.hbm_write["Lacc"]
    c.hbm_write["O"], c.hbm_write["L"] = rows * d * e, rows * STAT_BYTES
    c.exp_ops, c.other_flops = combine_work(rows, d, n)
    return [k, c]


def _flash1(cfg: AttentionConfig, tiling: Tiling) -> KernelCounts:
    g, s = _tile_sums(cfg, tiling)
    bh, d, e = cfg.bh, cfg.head_dim, cfg.elem_bytes
    k = KernelCounts("flash1_fwd")
    k.hbm_read["K"] = k.hbm_read["V"] = bh * s["kv_rows_outer"] * d * e   # each K/V tile once per head
    k.hbm_read["Q"] = bh * s["row_tiles"] * d * e                         # Q_i at every inner step
    k.hbm_read["Oacc"] = bh * s["row_rereads"] * d * 4                      # O_i, m_i, l_i after the first tile
    k.hbm_read["m"] = k.hbm_read["l"] = bh * s["row_rereads"] * STAT_BYTES
    k.hbm_write["Oacc"] = bh * s["row_rereads"] * d * 4                     # written back but at the last tile
    k.hbm_write["m"] = k.hbm_write["l"] = bh * s["row_rereads"] * STAT_BYTES
    k.hbm_write["O"] = bh * cfg.seqlen_q * d * e
    k.hbm_write["L"] = bh * cfg.seqlen_q * STAT_BYTES
    _tile_flops(k, cfg, s)
    return k
