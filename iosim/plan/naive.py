"""Naive (standard) attention as the paper's Algorithm 0: three kernels that pass S and P through HBM.

The GEMMs are cut as a library GEMM (cuBLAS) cuts them, so that small batches still fill the chip:
- `qk`: one block per 128x128 tile of S = scale*Q K^T (query strip i, key tile j, key tile fastest); it reads Q_i
  and K_j and writes the tile. Its reduction (head_dim) is short: one step, overlap comes from resident blocks.
- `softmax`: one block per row (gpu_kernels' softmax_rows), reading the row of S once and writing the row of P.
- `pv`: one block per 64-row strip of O = P V; it loops over 64-key slices of P_i and V, double-buffered, and
  writes O_i at the end.
S and P are addressed strip by strip (each 128-row strip of a head contiguous, its key tiles in order), so the
softmax's rows and the pv slices find the bytes the qk tiles wrote; the byte totals are those of row-major S.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Hashable, Iterator, Literal

import numpy as np

from ..workload import AttentionConfig, sum_keys_seen
from .blocks import RowBlocks
from .costs import GEMM_SMEM_READS, OTHER_PER_SCORE, gemm_flops
from .kernel import KernelPlan, Step, Traits, fold, merged

NAIVE_ROWS = 128       # qk: query rows and keys of an S tile
PV_ROWS = 64           # pv: rows of an O strip
PV_KEYS = 64           # pv: keys of a P/V slice staged per pipeline stage
NAIVE_WARPS = 4
SOFTMAX_THREADS = 256
SOFTMAX_MAX_BLOCKS = 65536
SOFTMAX_SMEM_MAX = 96 * 1024   # rows of up to 24k keys held in shared memory


class NaiveKernel(KernelPlan):
    def __init__(self, cfg: AttentionConfig, kind: Literal["qk", "softmax", "pv"], traits: Traits):
        self.cfg, self.kind = cfg, kind
        e = cfg.elem_bytes
        self.launches_per_block = 1
        if kind == "softmax":
            # one block of 256 threads per row, the row held in shared memory as fp32 (gpu_kernels' softmax_rows).
            # Simulated, one modelled block stands for `rows` consecutive rows that one slot handles one after
            # another, so that a grid has at most SOFTMAX_MAX_BLOCKS of them (bytes and work are unchanged)
            rows = min(cfg.seqlen_q, max(1, -(-cfg.bh * cfg.seqlen_q // SOFTMAX_MAX_BLOCKS)))
            self.g = RowBlocks(cfg, rows, NAIVE_ROWS)
            self.launches_per_block = rows
            self.threads = SOFTMAX_THREADS
            # the row in shared memory where it fits (the kernel's way); longer rows are assumed streamed by an
            # online softmax that still reads S once (the kernel refuses those rows)
            self.smem_bytes = 4 * cfg.seqlen_k if 4 * cfg.seqlen_k <= SOFTMAX_SMEM_MAX else 0
            # ptxas: 32 registers a thread (tests/test_kernel_sources.py reads the same report), unless the
            # traits say otherwise
            regs = 32 if traits.registers_per_thread == Traits().registers_per_thread else traits.registers_per_thread
            self.traits = replace(traits, registers_per_thread=regs)
            self.n_blocks = cfg.bh * self.g.n_q
        else:
            # two pipeline stages of both operands; a GEMM is built to use a whole SM even alone on it (a
            # library's large tiles), so a lone block is not held to a shared SM's rate
            self.g = RowBlocks(cfg, NAIVE_ROWS if kind == "qk" else PV_ROWS, NAIVE_ROWS if kind == "qk" else PV_KEYS)
            self.threads = 32 * NAIVE_WARPS
            if kind == "qk":
                self.smem_bytes = 2 * (NAIVE_ROWS + NAIVE_ROWS) * min(cfg.head_dim, 64) * e
                self.n_blocks = cfg.bh * self.g.n_q * self.g.n_kv
            else:
                self.smem_bytes = 2 * (PV_ROWS + cfg.head_dim) * PV_KEYS * e
                self.n_blocks = cfg.bh * self.g.n_q
            self.traits = traits if traits.solo_sm_share is not None else replace(traits, solo_sm_share=1.0)
        self.name = f"naive_{kind}"
        self.rows_per_block = self.g.block_q
        self.double_buffered = kind == "pv"
        g = self.g
        # visible scores per row block (causal softmax does work only on them)
        self._visible = np.array([sum_keys_seen(cfg, i * g.block_q, i * g.block_q + int(r))
                                  for i, r in enumerate(g.rows)], dtype=np.int64)
        self._keys = np.minimum(g.block_kv, cfg.seqlen_k - np.arange(g.n_kv, dtype=np.int64) * g.block_kv)

    def runs(self) -> Iterator[tuple[int, int, Hashable]]:
        # Blocks differ only in their rows (the last strip may be short) and, for qk, their keys (so may the last
        # tile); causal strips also differ in visible scores, which the cohort averages: these blocks are
        # memory-bound and the bytes are what differ little.
        g = self.g
        per = g.n_kv if self.kind == "qk" else 1
        ragged_rows = g.n_q > 1 and g.rows[-1] != g.rows[0]
        ragged_keys = self.kind == "qk" and g.n_kv > 1 and self._keys[-1] != self._keys[0]
        if not ragged_rows and not ragged_keys:
            yield 0, self.n_blocks, (int(g.rows[0]), int(self._keys[0]) if per > 1 else 0)
            return
        first = 0
        for _ in range(self.cfg.bh):
            for i in range(g.n_q):
                r = int(g.rows[i])
                if per == 1:
                    yield first, 1, (r, 0)
                elif ragged_keys:
                    yield first, per - 1, (r, int(self._keys[0]))
                    yield first + per - 1, 1, (r, int(self._keys[-1]))
                else:
                    yield first, per, (r, int(self._keys[0]))
                first += per

    def cohort(self, blocks: np.ndarray, max_steps: int) -> list[Step]:
        cfg, g = self.cfg, self.g
        d, e, nk = cfg.head_dim, cfg.elem_bytes, cfg.seqlen_k
        b = np.asarray(blocks, dtype=np.int64)
        count = len(b)
        if self.kind == "qk":
            j, b = b % g.n_kv, b // g.n_kv
        bh, qi = b // g.n_q, b % g.n_q
        rq = g.rows[qi]
        row0 = bh * cfg.seqlen_q + qi * g.block_q
        rows = int(rq.sum())
        q_rng = (row0 * d * e, (row0 + rq) * d * e)
        kv_base = g.kv_head(bh) * nk
        if self.kind == "qk":
            k0 = j * g.block_kv
            keys = self._keys[j]
            # the tile's bytes within its strip: the strip's earlier key tiles come first
            s_lo = row0 * nk * e + rq * k0 * e
            loads = merged("Q", *q_rng) + merged("K", (kv_base + k0) * d * e, (kv_base + k0 + keys) * d * e)
            staged = int((rq * d * e + keys * d * e).sum())
            return [Step(loads=loads, stores=merged("S", s_lo, s_lo + rq * keys * e),
                         mma_flops=int(gemm_flops(rq, keys, d).sum()), sram_bytes=(1 + GEMM_SMEM_READS) * staged)]
        s_rng = (row0 * nk * e, (row0 + rq) * nk * e)
        if self.kind == "softmax":
            vis = int(self._visible[qi].sum())
            return [Step(loads=merged("S", *s_rng), stores=merged("P", *s_rng), exp_ops=vis,
                         other_flops=OTHER_PER_SCORE * vis)]
        steps = []
        for j0, j1 in fold(g.n_kv, max_steps):
            k0, k1 = g.kv_rows(j0, j1)
            p_lo = row0 * nk * e + rq * k0 * e   # P slices addressed as the qk tiles wrote them
            loads = merged("P", p_lo, p_lo + rq * (k1 - k0) * e) + \
                merged("V", (kv_base + k0) * d * e, (kv_base + k1) * d * e)
            staged = rows * (k1 - k0) * e + count * (k1 - k0) * d * e
            steps.append(Step(loads=loads, mma_flops=gemm_flops(rows, k1 - k0, d),
                              sram_bytes=(1 + GEMM_SMEM_READS) * staged))
        steps[-1].stores = merged("O", *q_rng)
        return steps
