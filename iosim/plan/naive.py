"""Naive (standard) attention as the paper's Algorithm 0: three kernels that pass S and P through HBM.

Each kernel works on strips of NAIVE_ROWS query rows of one (batch, head), one block per strip, launched strip
fastest (as a batched GEMM rasterises): `qk` reads Q_i and all of K and writes the strip of S = scale*Q K^T;
`softmax` reads the strip of S and writes P; `pv` reads the strip of P and all of V and writes O_i. A block is
one step: these kernels are memory-bound streams, their overlap comes from the many blocks resident at once.
"""
from __future__ import annotations

from typing import Hashable, Iterator, Literal

import numpy as np

from ..workload import AttentionConfig, sum_keys_seen
from .blocks import RowBlocks
from .costs import GEMM_SMEM_READS, OTHER_PER_SCORE, gemm_flops
from .kernel import KernelPlan, Step, Traits, merged

NAIVE_ROWS = 128       # query rows per block (a GEMM's M tile, a softmax block's rows)
NAIVE_GEMM_N = 128     # the GEMM's N/K tile, for its shared-memory staging
NAIVE_GEMM_K = 64     # the GEMM's reduction slice staged per pipeline stage
NAIVE_WARPS = 4


class NaiveKernel(KernelPlan):
    def __init__(self, cfg: AttentionConfig, kind: Literal["qk", "softmax", "pv"], traits: Traits):
        self.cfg, self.kind, self.traits = cfg, kind, traits
        self.g = RowBlocks(cfg, NAIVE_ROWS, NAIVE_GEMM_N)
        self.name = f"naive_{kind}"
        self.n_blocks = cfg.bh * self.g.n_q
        self.threads = 32 * NAIVE_WARPS
        e = cfg.elem_bytes
        # a GEMM stages two 128x64 operand slices per stage, two stages; the softmax keeps its rows in registers
        self.smem_bytes = 0 if kind == "softmax" else 2 * (NAIVE_ROWS + NAIVE_GEMM_N) * NAIVE_GEMM_K * e
        self.double_buffered = False
        # visible scores per strip (causal softmax does work only on them)
        self._visible = np.array([sum_keys_seen(cfg, i * NAIVE_ROWS, i * NAIVE_ROWS + int(r))
                                  for i, r in enumerate(self.g.rows)], dtype=np.int64)

    def runs(self) -> Iterator[tuple[int, int, Hashable]]:
        # Strips differ only in their row count (the last may be short); causal strips also differ in visible
        # scores, which the cohort averages: these blocks are memory-bound and the bytes are what differ little.
        g = self.g
        if g.n_q == 1 or g.rows[-1] == g.rows[0]:
            yield 0, self.n_blocks, int(g.rows[0])
            return
        for h in range(self.cfg.bh):
            yield h * g.n_q, g.n_q - 1, int(g.rows[0])
            yield h * g.n_q + g.n_q - 1, 1, int(g.rows[-1])

    def cohort(self, first: int, count: int, max_steps: int) -> list[Step]:
        cfg, g = self.cfg, self.g
        d, e, nk = cfg.head_dim, cfg.elem_bytes, cfg.seqlen_k
        b = np.arange(first, first + count, dtype=np.int64)
        bh, qi = b // g.n_q, b % g.n_q
        rq = g.rows[qi]
        row0 = bh * cfg.seqlen_q + qi * NAIVE_ROWS
        rows = int(rq.sum())
        q_rng = (row0 * d * e, (row0 + rq) * d * e)
        s_rng = (row0 * nk * e, (row0 + rq) * nk * e)
        kvh, per_head = np.unique(g.kv_head(bh), return_counts=True)
        head = (kvh * nk * d * e, (kvh + 1) * nk * d * e)
        if self.kind == "qk":
            loads = merged("Q", *q_rng) + merged("K", *head, per_head)
            staged = rows * d * e + count * nk * d * e
            return [Step(loads=loads, stores=merged("S", *s_rng), mma_flops=gemm_flops(rows, nk, d),
                         sram_bytes=(1 + GEMM_SMEM_READS) * staged)]
        if self.kind == "softmax":
            vis = int(self._visible[qi].sum())
            return [Step(loads=merged("S", *s_rng), stores=merged("P", *s_rng), exp_ops=vis,
                         other_flops=OTHER_PER_SCORE * vis)]
        loads = merged("P", *s_rng) + merged("V", *head, per_head)
        staged = rows * nk * e + count * nk * d * e
        return [Step(loads=loads, stores=merged("O", *q_rng), mma_flops=gemm_flops(rows, nk, d),
                     sram_bytes=(1 + GEMM_SMEM_READS) * staged)]
