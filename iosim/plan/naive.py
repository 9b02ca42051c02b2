"""Naive (standard) attention as the paper's Algorithm 0: three kernels that pass S and P through HBM.

The GEMMs work on strips of NAIVE_ROWS query rows of one (batch, head), one block per strip, launched strip
fastest (as a batched GEMM rasterises): `qk` reads Q_i and all of K and writes the strip of S = scale*Q K^T;
`pv` reads the strip of P and all of V and writes O_i. `softmax` runs one block per row, reading the row of S once
and writing the row of P once. A block is one step: these kernels are memory-bound streams, their overlap
comes from the many blocks resident at once.
"""
from __future__ import annotations

from dataclasses import replace
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
SOFTMAX_THREADS = 256
SOFTMAX_MAX_BLOCKS = 65536
SOFTMAX_SMEM_MAX = 96 * 1024   # rows of up to 24k keys held in shared memory


class NaiveKernel(KernelPlan):
    def __init__(self, cfg: AttentionConfig, kind: Literal["qk", "softmax", "pv"], traits: Traits):
        self.cfg, self.kind = cfg, kind
        e = cfg.elem_bytes
        if kind == "softmax":
            # one block of 256 threads per row, the row held in shared memory as fp32 (gpu_kernels' softmax_rows).
            # Simulated, one modelled block stands for `rows` consecutive rows that one slot handles one after
            # another, so that a grid has at most SOFTMAX_MAX_BLOCKS of them (bytes and work are unchanged)
            rows = min(cfg.seqlen_q, max(1, -(-cfg.bh * cfg.seqlen_q // SOFTMAX_MAX_BLOCKS)))
            self.g = RowBlocks(cfg, rows, NAIVE_GEMM_N)
            self.threads = SOFTMAX_THREADS
            # the row in shared memory where it fits (the kernel's way); longer rows are assumed streamed by an
            # online softmax that still reads S once (the kernel refuses those rows)
            self.smem_bytes = 4 * cfg.seqlen_k if 4 * cfg.seqlen_k <= SOFTMAX_SMEM_MAX else 0
            # ptxas: 32 registers a thread (tests/test_kernel_sources.py reads the same report)
            self.traits = traits if traits != Traits() else replace(traits, registers_per_thread=32)
        else:
            # a GEMM stages two 128x64 operand slices per stage, two stages, and is built to use a whole SM
            # even alone on it (cuBLAS's large tiles), so a lone block is not held to a shared SM's rate
            self.g = RowBlocks(cfg, NAIVE_ROWS, NAIVE_GEMM_N)
            self.threads = 32 * NAIVE_WARPS
            self.smem_bytes = 2 * (NAIVE_ROWS + NAIVE_GEMM_N) * NAIVE_GEMM_K * e
            self.traits = traits if traits.solo_sm_share is not None else replace(traits, solo_sm_share=1.0)
        self.name = f"naive_{kind}"
        self.n_blocks = cfg.bh * self.g.n_q
        self.double_buffered = False
        # visible scores per strip (causal softmax does work only on them)
        rows = self.g.block_q
        self._visible = np.array([sum_keys_seen(cfg, i * rows, i * rows + int(r))
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

    def cohort(self, blocks: np.ndarray, max_steps: int) -> list[Step]:
        cfg, g = self.cfg, self.g
        d, e, nk = cfg.head_dim, cfg.elem_bytes, cfg.seqlen_k
        b = np.asarray(blocks, dtype=np.int64)
        count = len(b)
        bh, qi = b // g.n_q, b % g.n_q
        rq = g.rows[qi]
        row0 = bh * cfg.seqlen_q + qi * g.block_q
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
