"""Tiled attention's backward pass: S and P recomputed from Q, K and the forward's log-sum-exp, never stored.

Per visited (query tile of rq rows, key tile of rk keys) pair, a block recomputes S = Q K^T and P = exp(S - L),
then dV += P^T dO, dP = dO V^T, dS = P * (dP - D), dK += dS^T Q and dQ += dS K: five GEMMs, 10 rq rk d FLOPs,
of which the recomputed S is 2 rq rk d (`costs.bwd_tile_work`). D = rowsum(dO * O) comes from a pass before.
- `Flash2BwdKernel`: FlashAttention-2's (PyTorch's SDPA flash backward): one block per (batch, head, key tile),
  launched key tile fastest; it keeps K_j and V_j and accumulates dK_j and dV_j on chip while it loops over the
  query blocks that see key tile j, reading Q_i, dO_i, L_i and D_i and adding its share of dQ_i into an fp32 dQ
  accumulator by atomic adds (performed in L2); dK_j and dV_j written at the end.
- `Flash1BwdKernel`: the paper's Algorithm 4: one block per (batch, head), K/V tiles outer, query blocks inner;
  at each inner step it reads Q_i, O_i, dO_i, L_i and its fp32 dQ_i, computes D_i from dO_i and O_i, and writes
  dQ_i back (plain loads and stores: no other block touches its head).
The kernels around them (D's pass, dQ's conversion, the grouped-query sums) are `rows.RowKernel`s.
"""
from __future__ import annotations

from typing import Hashable, Iterator

import numpy as np

from ..workload import STAT_BYTES, AttentionConfig
from .blocks import RowBlocks
from .costs import bwd_tile_work
from .flash import HeadLoopKernel
from .kernel import KernelPlan, Step, Traits, fold, fold_members, heads_runs, merged, rows_as, spill_bytes


def bwd_sram(rq, rk, d: int, e: int, q_visits=1, k_visits=1):
    """Shared-memory bytes of backward tile visits: Q_i and dO_i, and the P and dS tiles, each staged once and
    read by two GEMMs; K_j read by two GEMMs and V_j by one. Summed over visits: rq rows each of `q_visits` visits
    (their scores rq rk in all), rk keys each of `k_visits`."""
    return 3 * 2 * rq * d * e * q_visits + 3 * 2 * rq * rk * e + 3 * rk * d * e * k_visits


class Flash2BwdKernel(KernelPlan):
    """FlashAttention-2's main backward kernel (`flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel`)."""

    def __init__(self, cfg: AttentionConfig, block_q: int, block_kv: int, warps: int, traits: Traits,
                 smem_bytes: int, dk_name: str = "dK", dv_name: str = "dV"):
        self.cfg, self.traits = cfg, traits
        self.g = g = RowBlocks(cfg, block_q, block_kv)
        self.name = "flash2_bwd"
        self.n_blocks = cfg.bh * g.n_kv
        self.rows_per_block = block_q
        self.threads = 32 * warps
        self.smem_bytes = smem_bytes if traits.smem_bytes is None else traits.smem_bytes
        self.double_buffered = True
        self.dk, self.dv = dk_name, dv_name
        # for each key tile j: the first query block that sees it, the query blocks visited, and of those the
        # ones that mask part of it (crossing their causal diagonal or the sequence's end)
        j = np.arange(g.n_kv)
        self.first_q = np.array([int(np.argmax(g.nvis > jj)) if (g.nvis > jj).any() else g.n_q for jj in j],
                                dtype=np.int64)
        self.visits = g.n_q - self.first_q
        self.keys = np.minimum((j + 1) * block_kv, cfg.seqlen_k) - j * block_kv
        # query blocks [first_q, last_masked) mask key tile j (interior and visible tiles grow with the block)
        self.last_masked = np.searchsorted(g.interior, j, side="right")
        self.rows_cum = np.concatenate(([0], np.cumsum(g.rows)))

    def bucket(self, sig: Hashable) -> tuple[Hashable, int]:
        """Coarse cohorts: key tiles of one size, ranked by the query blocks they visit."""
        return sig[0], -sig[1]

    def buckets(self, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        j = blocks % self.g.n_kv
        return self.keys[j], -self.first_q[j]

    def _sig(self, j: int) -> Hashable:
        # (the query blocks masking the tile: those left of the diagonal see all of tile j but for causal Nq < Nk)
        return int(self.keys[j]), int(self.first_q[j]), int(self.last_masked[j])

    def runs(self) -> Iterator[tuple[int, int, Hashable]]:
        n_kv, bh = self.g.n_kv, self.cfg.bh
        sigs = [self._sig(j) for j in range(n_kv)]
        if len(set(sigs)) == 1:
            yield 0, self.n_blocks, sigs[0]
            return
        yield from heads_runs(sigs, bh)

    def cohort(self, blocks: np.ndarray, max_steps: int) -> list[Step]:
        cfg, g = self.cfg, self.g
        d, e, nq, nk = cfg.head_dim, cfg.elem_bytes, cfg.seqlen_q, cfg.seqlen_k
        b = np.asarray(blocks, dtype=np.int64)
        count = len(b)
        bh, j = b // g.n_kv, b % g.n_kv
        if (self.first_q[j] != self.first_q[j[0]]).any() or (self.keys[j] != self.keys[j[0]]).any() or \
                (self.last_masked[j] != self.last_masked[j[0]]).any():
            return self._mixed(bh, j, max_steps)
        jj = int(j[0])
        rk, i0 = int(self.keys[jj]), int(self.first_q[jj])
        k0 = j * g.block_kv
        kv0 = g.kv_head(bh) * nk + k0                  # first K/V row of each member
        out0 = bh * nk + k0                            # its rows of dK and dV (per query head)
        stores = merged("rows", out0, out0 + rk)
        stores = rows_as(self.dk, stores, d * e) + rows_as(self.dv, stores, d * e)
        kv = merged("rows", kv0, kv0 + rk)
        kv = rows_as("K", kv, d * e) + rows_as("V", kv, d * e)
        n_vis = g.n_q - i0
        if n_vis == 0:   # no query sees this key tile: dK_j and dV_j are zeros
            return [Step(loads=kv, stores=stores)]
        steps = []
        for a, z in fold(n_vis, max_steps):
            qa, qz = i0 + a, i0 + z                    # query blocks [qa, qz)
            r0 = bh * nq + qa * g.block_q
            r1 = bh * nq + np.minimum(qz * g.block_q, nq)
            rows = g.rows[qa:qz]
            rr = merged("rows", r0, r1)
            loads = (kv if a == 0 else []) + rows_as("Q", rr, d * e) + rows_as("dO", rr, d * e) + \
                rows_as("L", rr, STAT_BYTES) + rows_as("D", rr, STAT_BYTES)
            mma, ex, oth = bwd_tile_work(rows, rk, d)
            masked = int(((g.interior[qa:qz] <= jj) & (g.nvis[qa:qz] > jj)).sum())
            scale = 1.0 + (self.traits.diagonal_tile_cost - 1.0) * masked / (qz - qa)
            steps.append(Step(loads=loads, atomics=rows_as("dQacc", rr, d * 4),
                              mma_flops=int(mma.sum()) * count, exp_ops=int(ex.sum()) * count,
                              other_flops=int(oth.sum()) * count,
                              sram_bytes=int(bwd_sram(rows, rk, d, e).sum()) * count, compute_scale=scale,
                              local_bytes=spill_bytes(self.traits, qz - qa, masked) * count, masked_tiles=masked * count))
        steps[-1].stores = stores
        return steps


    def _mixed(self, bh: np.ndarray, j: np.ndarray, max_steps: int) -> list[Step]:
        """`cohort` for key tiles that differ in the query blocks they visit (the engine's coarse cohorts): step s
        covers the same query blocks of every member, those it visits (`fold_members`); bytes and work are the
        members' own."""
        cfg, g, tr = self.cfg, self.g, self.traits
        d, e, nq, nk = cfg.head_dim, cfg.elem_bytes, cfg.seqlen_q, cfg.seqlen_k
        rk, i0 = self.keys[j], self.first_q[j]
        k0 = j * g.block_kv
        kv0 = g.kv_head(bh) * nk + k0
        out0 = bh * nk + k0
        stores = merged("rows", out0, out0 + rk)
        stores = rows_as(self.dk, stores, d * e) + rows_as(self.dv, stores, d * e)
        kv = merged("rows", kv0, kv0 + rk)
        kv = rows_as("K", kv, d * e) + rows_as("V", kv, d * e)
        steps = []
        for s, (qa, qz) in enumerate(fold_members(i0, np.full_like(i0, g.n_q), max_steps)):
            r0 = bh * nq + qa * g.block_q
            r1 = bh * nq + np.minimum(qz * g.block_q, nq)
            rr = merged("rows", r0, r1)
            loads = (kv if s == 0 else []) + rows_as("Q", rr, d * e) + rows_as("dO", rr, d * e) + \
                rows_as("L", rr, STAT_BYTES) + rows_as("D", rr, STAT_BYTES)
            rows = self.rows_cum[qz] - self.rows_cum[qa]          # work and staging are linear in the rows,
            visits = qz - qa                                    # but for K_j's staging, once a visit
            mma, ex, oth = bwd_tile_work(rows, rk, d)
            sram = bwd_sram(rows, rk, d, e, k_visits=visits)
            masked = np.clip(np.minimum(qz, self.last_masked[j]) - np.maximum(qa, i0), 0, None)
            steps.append(Step(loads=loads, atomics=rows_as("dQacc", rr, d * 4),
                              mma_flops=int(mma.sum()), exp_ops=int(ex.sum()), other_flops=int(oth.sum()),
                              sram_bytes=int(sram.sum()),
                              compute_scale=1.0 + (tr.diagonal_tile_cost - 1.0) * masked.sum() / max(1, visits.sum()),
                              local_bytes=spill_bytes(tr, visits, masked),
                              masked_tiles=int(masked.sum())))
        if not steps:
            steps.append(Step(loads=kv))
        steps[-1].stores = stores
        return steps


class Flash1BwdKernel(HeadLoopKernel):
    """The paper's Algorithm 4: one block per (batch, head); key tiles outer, the query blocks that see each inner;
    dQ_i (fp32) read and written back at every inner step, dK_j and dV_j written after tile j's inner loop."""

    def __init__(self, cfg: AttentionConfig, block_q: int, block_kv: int, warps: int, traits: Traits,
                 smem_bytes: int):
        self.cfg, self.traits = cfg, traits
        self.g = RowBlocks(cfg, block_q, block_kv)
        self.name = "flash1_bwd"
        self.n_blocks = cfg.bh
        self.rows_per_block = block_q
        self.threads = 32 * warps
        self.smem_bytes = smem_bytes if traits.smem_bytes is None else traits.smem_bytes
        self.double_buffered = True
        self.state_bytes = cfg.head_dim * (3 * cfg.elem_bytes + 4) + STAT_BYTES   # Q, O, dO, dQ (fp32), L a row

    def runs(self) -> Iterator[tuple[int, int, Hashable]]:
        yield 0, self.n_blocks, "head"

    def cohort(self, blocks: np.ndarray, max_steps: int) -> list[Step]:
        cfg, g = self.cfg, self.g
        d, e, nq, nk, S = cfg.head_dim, cfg.elem_bytes, cfg.seqlen_q, cfg.seqlen_k, STAT_BYTES
        bh = np.asarray(blocks, dtype=np.int64)
        n = len(bh)
        kv_base = g.kv_head(bh) * nk
        out = bh * nk
        rng = self.state_ranges(bh * nq, np.arange(g.n_q, dtype=np.int64) * g.block_q, g.rows, n)
        steps = []
        # one step per key tile, folded only when coarse: dQ_i comes back once per key tile, after the head's other
        # query blocks, and whether L2 still holds it depends on that distance (folded steps decide it once)
        for j0, j1 in self.outer_steps(g.n_kv, max_steps):
            k0, k1 = g.kv_rows(j0, j1)
            far_r: dict = {}
            far_rr: dict = {}
            far_w: dict = {}
            kv = self.tile_ranges("K", (kv_base + k0) * d * e, (kv_base + k1) * d * e, 1, far_r) + \
                self.tile_ranges("V", (kv_base + k0) * d * e, (kv_base + k1) * d * e, 1, far_r)
            stores = self.tile_ranges("dK", (out + k0) * d * e, (out + k1) * d * e, 1, far_w) + \
                self.tile_ranges("dV", (out + k0) * d * e, (out + k1) * d * e, 1, far_w)
            visits = np.clip(np.minimum(g.nvis, j1) - j0, 0, None)   # key tiles of the step each query block sees
            vis = np.flatnonzero(visits)
            if not len(vis):
                steps.append(Step(loads=kv, stores=stores, far_reads=far_r, far_writes=far_w))
                continue
            rows, v = g.rows[vis], visits[vis]
            keys = np.minimum(g.keys_in[vis], k1) - k0                 # keys of the step each query block sees
            mma, ex, oth = bwd_tile_work(rows, keys, d)
            oth = oth + 2 * rows * d * v        # D_i = rowsum(dO_i * O_i), recomputed at each visit
            sram = bwd_sram(rows, keys, d, e, q_visits=v)
            masked = int(g.diagonal_tiles(g.interior[vis], j0, np.minimum(g.nvis[vis], j1)).sum())
            visited = int(v.sum())
            steps.append(Step(
                loads=kv + rng("Q", d * e, visits, far_r) + rng("O", d * e, visits, far_r) +
                rng("dO", d * e, visits, far_r) + rng("L", S, visits, far_r),
                reloads=rng("dQacc", d * 4, visits, far_rr), stores=rng("dQacc", d * 4, visits, far_w) + stores,
                far_reads=far_r, far_reloads=far_rr, far_writes=far_w,
                mma_flops=int(mma.sum()) * n, exp_ops=int(ex.sum()) * n, other_flops=int(oth.sum()) * n,
                sram_bytes=int(sram.sum()) * n, serial_reloads=visited * n,
                compute_scale=1.0 + (self.traits.diagonal_tile_cost - 1.0) * masked / visited,
                local_bytes=spill_bytes(self.traits, visited, masked) * n, masked_tiles=masked * n))
        return steps


# head_dims at which our flash2 backward runs FlashAttention-2's warp layout where its blocks are 64 x 128 (8 warps):
# gpu_kernels' `flash2_bwd_split`, which stages P^T beside dS^T in shared memory
SPLIT_LAYOUT: set[int] = set()


def split_layout(loop_order: str, d: int, block_q: int, block_kv: int) -> bool:
    """Whether our backward main kernel at these blocks is the FlashAttention-2 warp layout's build."""
    return loop_order == "flash2" and d in SPLIT_LAYOUT and (block_q, block_kv) == (64, 128)


def iosim_bwd_smem(loop_order: str, d: int, block_q: int, block_kv: int) -> int:
    """Shared memory a block of iosim's backward main kernel (gpu_kernels/backward.cu) takes, 16-bit tiles: K and V
    tiles, two buffers of Q and dO (and of O: flash1), dS^T (two buffers: flash2), P^T (the split layout's), and two
    buffers of L and D."""
    if loop_order == "flash1":
        tiles = 2 * block_kv * d + 6 * block_q * d + block_kv * block_q
    else:
        tiles = 2 * block_kv * d + 4 * block_q * d + 2 * block_kv * block_q
        tiles += block_kv * block_q if split_layout(loop_order, d, block_q, block_kv) else 0
    return 2 * tiles + 4 * 4 * block_q


def flash2_bwd_smem(cfg: AttentionConfig, block_q: int, block_kv: int) -> int:
    """FlashAttention-2's backward shared memory a block (`kSmemSize1colblock`): Q and dO tiles (three buffers
    between them), K and V tiles, and the dS and P tiles."""
    e, d = cfg.elem_bytes, cfg.head_dim
    return 3 * block_q * d * e + 2 * block_kv * d * e + 2 * block_q * block_kv * e

