"""Naive (standard) attention as the paper's Algorithm 0: three kernels that pass S and P through HBM.

The GEMMs are planned as cuBLAS runs them on Hopper: persistent, one block per SM walking its share of the output
tiles (tile b, b + P, b + 2P, ...), the next tile's loads overlapping this one's matmul and the last one's stores.
- `qk`: output tiles of 128x128 of S = scale*Q K^T (query strip i, key tile j, key tile fastest); a tile reads
  Q_i and K_j and writes its part of S.
- `softmax`: one block per row (gpu_kernels' softmax_rows), reading the row of S once and writing the row of P.
- `pv`: output strips of 64 rows of O = P V, each a loop over 64-key slices of P_i and V; O_i written at the end.
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
GEMM_MIN_STEPS = 32
SOFTMAX_THREADS = 256
SOFTMAX_MAX_BLOCKS = 65536
SOFTMAX_SMEM_MAX = 96 * 1024   # rows of up to 24k keys held in shared memory


class NaiveKernel(KernelPlan):
    def __init__(self, cfg: AttentionConfig, kind: Literal["qk", "softmax", "pv"], traits: Traits, sm_count: int = 132):
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
            # and its row loop loads 2 bytes a thread, unrolled 4 times (its PTX): 2 KiB a block in flight
            in_flight = traits.bytes_in_flight or SOFTMAX_THREADS * 4 * cfg.elem_bytes
            self.traits = replace(traits, registers_per_thread=regs, bytes_in_flight=in_flight)
            self.n_blocks = cfg.bh * self.g.n_q
        else:
            # two pipeline stages of both operands; a GEMM is built to use a whole SM even alone on it (a
            # library's large tiles), so a lone block is not held to a shared SM's rate
            self.g = RowBlocks(cfg, NAIVE_ROWS, NAIVE_ROWS) if kind == "qk" else RowBlocks(cfg, PV_ROWS, PV_KEYS)
            self.threads = 32 * NAIVE_WARPS
            if kind == "qk":
                self.smem_bytes = 2 * (NAIVE_ROWS + NAIVE_ROWS) * min(cfg.head_dim, 64) * e
                self.n_items = cfg.bh * self.g.n_q * self.g.n_kv      # S tiles
            else:
                self.smem_bytes = 2 * (self.g.block_q + cfg.head_dim) * PV_KEYS * e
                self.n_items = cfg.bh * self.g.n_q                    # O strips
            self.n_blocks = min(sm_count, self.n_items)                # persistent: one block per SM at most
            self.traits = traits if traits.solo_sm_share is not None else replace(traits, solo_sm_share=1.0)
        self.name = f"naive_{kind}"
        self.rows_per_block = self.g.block_q
        self.double_buffered = kind != "softmax"
        g = self.g
        # visible scores per row block (causal softmax does work only on them)
        self._visible = np.array([sum_keys_seen(cfg, i * g.block_q, i * g.block_q + int(r))
                                  for i, r in enumerate(g.rows)], dtype=np.int64)
        self._keys = np.minimum(g.block_kv, cfg.seqlen_k - np.arange(g.n_kv, dtype=np.int64) * g.block_kv)

    def runs(self) -> Iterator[tuple[int, int, Hashable]]:
        if self.kind != "softmax":
            # persistent blocks differ only in how many items they walk: the first n_items % P one more
            p, extra = self.n_blocks, self.n_items % self.n_blocks
            if extra:
                yield 0, extra, self.n_items // p + 1
            yield extra, p - extra, self.n_items // p
            return
        # softmax blocks differ only in their rows (the last strip may be short); causal strips also differ in
        # visible scores, which the cohort averages: these blocks are memory-bound
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
        if self.kind == "softmax":
            bh, qi = b // g.n_q, b % g.n_q
            rq = g.rows[qi]
            row0 = bh * cfg.seqlen_q + qi * g.block_q
            s_rng = (row0 * nk * e, (row0 + rq) * nk * e)
            vis = int(self._visible[qi].sum())
            return [Step(loads=merged("S", *s_rng), stores=merged("P", *s_rng), exp_ops=vis,
                         other_flops=OTHER_PER_SCORE * vis)]
        items = (self.n_items - int(b[0]) + self.n_blocks - 1) // self.n_blocks   # per member, same in a cohort
        # a persistent block's pipeline hides its loads behind its matmuls only if its steps are short: at least
        # GEMM_MIN_STEPS of them (one or two cohorts a kernel: cheap)
        steps_max = max(max_steps, GEMM_MIN_STEPS)
        if self.kind == "qk":
            return [self._qk(b[:, None] + self.n_blocks * np.arange(s0, s1)[None, :])
                    for s0, s1 in fold(items, steps_max)]
        # pv: a member's units are (strip, key slice) pairs, slices fastest
        steps = []
        for u0, u1 in fold(items * g.n_kv, steps_max):
            u = np.arange(u0, u1)
            steps.append(self._pv(b[:, None] + self.n_blocks * (u // g.n_kv)[None, :],
                                  np.broadcast_to(u % g.n_kv, (len(b), len(u)))))
        return steps

    def _qk(self, item: np.ndarray) -> Step:
        cfg, g = self.cfg, self.g
        d, e, nk = cfg.head_dim, cfg.elem_bytes, cfg.seqlen_k
        item = item.ravel()
        j, rest = item % g.n_kv, item // g.n_kv
        bh, qi = rest // g.n_q, rest % g.n_q
        rq, keys = g.rows[qi], self._keys[j]
        row0 = bh * cfg.seqlen_q + qi * g.block_q
        k0 = g.kv_head(bh) * nk + j * g.block_kv
        s_lo = row0 * nk * e + rq * j * g.block_kv * e        # the tile's bytes within its strip
        loads = merged("Q", row0 * d * e, (row0 + rq) * d * e) + merged("K", k0 * d * e, (k0 + keys) * d * e)
        staged = int((rq * d * e + keys * d * e).sum())
        return Step(loads=loads, stores=merged("S", s_lo, s_lo + rq * keys * e),
                    mma_flops=int(gemm_flops(rq, keys, d).sum()), sram_bytes=(1 + GEMM_SMEM_READS) * staged)

    def _pv(self, strip: np.ndarray, kslice: np.ndarray) -> Step:
        cfg, g = self.cfg, self.g
        d, e, nk = cfg.head_dim, cfg.elem_bytes, cfg.seqlen_k
        strip, kslice = strip.ravel(), kslice.ravel()
        bh, qi = strip // g.n_q, strip % g.n_q
        rq, keys = g.rows[qi], self._keys[kslice]
        row0 = bh * cfg.seqlen_q + qi * g.block_q
        k0 = kslice * g.block_kv
        p_lo = row0 * nk * e + rq * k0 * e                    # P slices addressed as the qk tiles wrote them
        v0 = g.kv_head(bh) * nk + k0
        last = kslice == g.n_kv - 1                           # O_i goes out after its last slice
        loads = merged("P", p_lo, p_lo + rq * keys * e) + merged("V", v0 * d * e, (v0 + keys) * d * e)
        staged = int((rq * keys * e + keys * d * e).sum())
        return Step(loads=loads, stores=merged("O", row0[last] * d * e, (row0[last] + rq[last]) * d * e),
                    mma_flops=int(gemm_flops(rq, keys, d).sum()), sram_bytes=(1 + GEMM_SMEM_READS) * staged)
