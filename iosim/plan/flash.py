"""Tiled attention kernels: FlashAttention-2's loop order (flash2) and the paper's Algorithm 1 (flash1)."""
from __future__ import annotations

import copy
from typing import Hashable, Iterator

import numpy as np

from ..workload import STAT_BYTES, AttentionConfig
from .blocks import RowBlocks
from .costs import combine_work, finish_work, tile_work
from .behaviour import FillWholeSMs
from .kernel import (Access, KernelPlan, Step, Traits, fold, fold_members, fragment_writes, member_ranges,
                     heads_runs, merged, rows_as, runs_of, spill_bytes)
from .tiling import Tiling


def combine_rows(head_dim: int) -> int:
    """Rows a combine block merges: FlashAttention-2's kBlockM, as small as 128 threads loading 512 elements allow
    (4 where head_dim divides by 128, 8 by 64, else 16; the combine kernels Nsight saw carry 4 and 8 in their names)."""
    return 4 if head_dim % 128 == 0 else 8 if head_dim % 64 == 0 else 16


def fragment_lines(accesses: list[Access], elem_bytes: int) -> int:
    """L1 line lookups of loads and stores between registers in the mma fragment layout and global memory: a warp
    instruction covers 8 rows, 4 lanes of each, 2 values a lane (the output O: 8 x elem_bytes bytes of a row; the
    fp32 O, m and l flash1 keeps: 32 bytes, m and l being 8 rows' consecutive floats)."""
    return sum(a.nbytes * a.count // (8 * elem_bytes if a.tensor == "O" else 32) for a in accesses)


def flash2_sram(rq, keys, tiles: int, first: bool, d: int, e: int, warps: int):
    """Shared-memory bytes of a flash2 block's steps over `tiles` key tiles holding `keys` keys: K and V written
    once and read by every warp; Q written once, and each warp's rows read again at every key tile (the kernel's
    and FlashAttention-2's Q K^T takes its A fragments from shared memory each time: Q is not kept in registers)."""
    return (1 + warps) * 2 * keys * d * e + rq * d * e * tiles + rq * d * e * first


def far_lines(far: dict, elem_bytes: int) -> int:
    """`fragment_lines` of the bytes a folded step sends straight to HBM (`Step.far_reloads`, `far_writes`)."""
    return sum(n // (8 * elem_bytes if t == "O" else 32) for t, n in far.items())


class Flash2Kernel(KernelPlan):
    """One block per (batch, head, query block, K/V split); loops over the K/V tiles it sees in its split;
    writes O and L once, or with splits its partial O and log-sum-exp (fp32) for `SplitCombineKernel`."""

    def __init__(self, cfg: AttentionConfig, tiling: Tiling, traits: Traits):
        self.cfg, self.tiling, self.traits = cfg, tiling, traits
        self.g = RowBlocks(cfg, tiling.block_q, tiling.block_kv)
        self.splits = tiling.kv_splits
        self.per_split = -(-self.g.n_kv // self.splits)          # K/V tiles one split covers
        self.name = "flash2_fwd" if self.splits == 1 else "flash2_fwd_split"
        self.n_blocks = cfg.bh * self.g.n_q * self.splits
        self.rows_per_block = tiling.block_q
        self.threads = tiling.threads
        self.smem_bytes = tiling.smem_bytes(cfg) if traits.smem_bytes is None else traits.smem_bytes
        self.double_buffered = tiling.stages >= 2
        self.l2_merge = True
        self.partial_writes = fragment_writes(traits, cfg.elem_bytes)
        self.smem_readers = tiling.warps   # each warp reads the whole K and V tile out of shared memory

    def block_ids(self, b):
        """(batch-head, query block, split) of launch-order block numbers (arrays or one int). The split is the
        middle index of the grid, as in FlashAttention-2's split-KV grid (query blocks, splits, heads)."""
        g, n_s, n_bh = self.g, self.splits, self.cfg.bh
        if self.tiling.grid_order == "q_fastest":
            qi, sp, bh = b % g.n_q, (b // g.n_q) % n_s, b // (g.n_q * n_s)
        else:
            bh, sp, qi = b % n_bh, (b // n_bh) % n_s, b // (n_bh * n_s)
        return bh, (g.n_q - 1 - qi if self.tiling.q_order == "descending" else qi), sp

    def tile_range(self, qi, sp):
        """(first K/V tile, tiles) that query block qi visits in split sp."""
        lo = sp * self.per_split
        return lo, np.clip(np.minimum(self.g.nvis[qi], lo + self.per_split) - lo, 0, None)

    def _diagonal(self, interior, lo, j0: int, j1: int) -> tuple[float, int, int]:
        """(compute scale, spill bytes, masked tiles) of the step over tiles lo + [j0, j1), from its tiles past each
        member's interior ones (the masked tiles, members summed): those cost `Fitted.diagonal_tile_cost` interior
        tiles each (mean over a cohort's members), and every tile stores the kernel's spills
        (`Build.spill_bytes_per_tile`, `_per_diagonal_tile`; members summed)."""
        tr = self.traits
        masked = self.g.diagonal_tiles(interior, lo + j0, lo + j1)
        return (1.0 + (tr.diagonal_tile_cost - 1.0) * float(np.mean(masked)) / (j1 - j0),
                spill_bytes(tr, j1 - j0, masked), int(np.sum(masked)))

    def _sig(self, i: int, sp: int = 0) -> Hashable:
        return int(self.g.rows[i]), int(self.tile_range(i, sp)[1])

    def runs(self) -> Iterator[tuple[int, int, Hashable]]:
        g, bh, n_s = self.g, self.cfg.bh, self.splits
        sigs = {(i, sp): self._sig(i, sp) for i in range(g.n_q) for sp in range(n_s)}
        if len(set(sigs.values())) == 1:
            yield 0, self.n_blocks, sigs[(0, 0)]
            return
        order = range(g.n_q) if self.tiling.q_order == "ascending" else range(g.n_q - 1, -1, -1)
        if self.tiling.grid_order == "q_fastest":
            yield from heads_runs([sigs[(i, sp)] for sp in range(n_s) for i in order], bh)
        else:
            yield from runs_of((sigs[(i, sp)], bh) for i in order for sp in range(n_s))

    def bucket(self, sig: Hashable) -> tuple[Hashable, int]:
        """Blocks the engine's coarse dispatch may run as one cohort: those of one row count, ranked by tiles."""
        return sig[0], sig[1]

    def buckets(self, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        _, qi, sp = self.block_ids(blocks)
        return self.g.rows[qi], self.tile_range(qi, sp)[1]

    def cohort(self, blocks: np.ndarray, max_steps: int) -> list[Step]:
        if len(blocks) == 1:
            return self._single(int(blocks[0]), max_steps)
        blocks = np.asarray(blocks, dtype=np.int64)
        _, qi, sp = self.block_ids(blocks)
        lo, nv = self.tile_range(qi, sp)
        if (nv != nv[0]).any() or (self.g.rows[qi] != self.g.rows[qi[0]]).any():
            return self._mixed(blocks, max_steps)
        return self._many(blocks, max_steps)

    def _outputs(self, row0, sp) -> tuple[str, int, str, int, object]:
        """(O tensor, its bytes a row, L tensor, its bytes a row, first row of each member in them)."""
        cfg = self.cfg
        if self.splits == 1:
            return "O", cfg.head_dim * cfg.elem_bytes, "L", STAT_BYTES, row0
        return "Oacc", cfg.head_dim * 4, "Lacc", STAT_BYTES, sp * cfg.bh * cfg.seqlen_q + row0

    def _many(self, blocks: np.ndarray, max_steps: int) -> list[Step]:
        cfg, g, t = self.cfg, self.g, self.tiling
        d, e, nk = cfg.head_dim, cfg.elem_bytes, cfg.seqlen_k
        count = len(blocks)
        bh, qi, sp = self.block_ids(blocks)
        rq, nv = self._sig(int(qi[0]), int(sp[0]))
        lo = sp * self.per_split                                        # first K/V tile of each member
        row0 = bh * cfg.seqlen_q + qi * t.block_q                      # first query row of each member
        o_name, o_row, l_name, l_row, out0 = self._outputs(row0, sp)
        stores = merged(o_name, out0 * o_row, (out0 + rq) * o_row) + merged(l_name, out0 * l_row, (out0 + rq) * l_row)
        if nv == 0:  # every row masked, or nothing left for this split: the block only writes zeros and -inf
            return [Step(stores=stores)]
        kvh = g.kv_head(bh)
        steps = []
        for j0, j1 in fold(nv, max_steps):
            k0 = np.minimum((lo + j0) * t.block_kv, nk)
            k1 = np.minimum((lo + j1) * t.block_kv, nk)
            loads = []
            if j0 == 0:
                loads += merged("Q", row0 * d * e, (row0 + rq) * d * e)
            kv_base = kvh * nk
            kv = merged("rows", kv_base + k0, kv_base + k1)
            loads += rows_as("K", kv, d * e) + rows_as("V", kv, d * e)
            mma, ex, oth = tile_work(rq, k1 - k0, d, j1 - j0)
            sram = flash2_sram(rq, k1 - k0, j1 - j0, j0 == 0, d, e, self.smem_readers)
            scale, spills, masked = self._diagonal(g.interior[qi], lo, j0, j1)
            steps.append(Step(loads=loads, mma_flops=int(mma.sum()), exp_ops=int(ex.sum()),
                              other_flops=int(oth.sum()), sram_bytes=int(sram.sum()), compute_scale=scale,
                              local_bytes=spills, masked_tiles=masked,
                              pipe_cycles=self.traits.tile_pipe_cycles * (j1 - j0) * count
                              + self.traits.masked_tile_pipe_cycles * masked))
        fe, fo = finish_work(rq, d)
        steps[-1].exp_ops += fe * count
        steps[-1].other_flops += fo * count
        steps[-1].pipe_cycles += self.block_cycles() * count
        steps[-1].stores = stores
        return steps

    def _mixed(self, blocks: np.ndarray, max_steps: int) -> list[Step]:
        """`_many` for members of different tiles (the engine's coarse cohorts): step s covers the same tiles of
        each member, those it has (`fold_members`); bytes and work are the members' own, summed."""
        cfg, g, t = self.cfg, self.g, self.tiling
        d, e, nk = cfg.head_dim, cfg.elem_bytes, cfg.seqlen_k
        bh, qi, sp = self.block_ids(blocks)
        rq = g.rows[qi]
        lo, nv = self.tile_range(qi, sp)
        row0 = bh * cfg.seqlen_q + qi * t.block_q
        o_name, o_row, l_name, l_row, out0 = self._outputs(row0, sp)
        stores = merged(o_name, out0 * o_row, (out0 + rq) * o_row) + merged(l_name, out0 * l_row, (out0 + rq) * l_row)
        kv_base = g.kv_head(bh) * nk
        seen = nv > 0
        steps = []
        for s, (j0, j1) in enumerate(fold_members(np.zeros_like(nv), nv, max_steps)):
            k0 = np.minimum((lo + j0) * t.block_kv, nk)
            k1 = np.minimum((lo + j1) * t.block_kv, nk)
            loads = merged("Q", row0 * d * e, (row0 + rq * seen) * d * e) if s == 0 else []
            kv = merged("rows", kv_base + k0, kv_base + k1)
            loads += rows_as("K", kv, d * e) + rows_as("V", kv, d * e)
            tiles = j1 - j0
            mma, ex, oth = tile_work(rq, k1 - k0, d, tiles)
            sram = flash2_sram(rq, k1 - k0, tiles, seen if s == 0 else 0, d, e, self.smem_readers)
            tr = self.traits
            masked = g.diagonal_tiles(g.interior[qi], lo + j0, lo + j1)
            scale = 1.0 + (tr.diagonal_tile_cost - 1.0) * masked.sum() / max(1, tiles.sum())
            steps.append(Step(loads=loads, mma_flops=int(mma.sum()), exp_ops=int(ex.sum()),
                              other_flops=int(oth.sum()), sram_bytes=int(sram.sum()), compute_scale=float(scale),
                              local_bytes=spill_bytes(tr, tiles, masked),
                              masked_tiles=int(masked.sum()), pipe_cycles=tr.tile_pipe_cycles * int(tiles.sum())
                              + tr.masked_tile_pipe_cycles * int(masked.sum())))
        fe, fo = finish_work(rq * seen, d)
        steps[-1].exp_ops += int(fe.sum())
        steps[-1].other_flops += int(fo.sum())
        steps[-1].pipe_cycles += self.block_cycles() * len(blocks)
        steps[-1].stores = stores
        return steps

    def _single(self, block: int, max_steps: int) -> list[Step]:
        """`_many` for one block in plain Python: causal grids dispatch many one-block cohorts, and numpy's
        call overhead on one-element arrays would dominate. Same steps, same numbers (a test holds them equal)."""
        cfg, g, t = self.cfg, self.g, self.tiling
        d, e, nk = cfg.head_dim, cfg.elem_bytes, cfg.seqlen_k
        bh, qi, sp = self.block_ids(block)
        rq, nv = self._sig(qi, sp)
        lo = sp * self.per_split
        row0 = bh * cfg.seqlen_q + qi * t.block_q
        o_name, o_row, l_name, l_row, out0 = self._outputs(row0, sp)
        stores = [Access(o_name, out0 * o_row, (out0 + rq) * o_row), Access(l_name, out0 * l_row, (out0 + rq) * l_row)]
        if nv == 0:
            return [Step(stores=stores)]
        kv_base = int(g.kv_head(np.int64(bh))) * nk
        steps = []
        for j0, j1 in fold(nv, max_steps):
            k0, k1 = min((lo + j0) * t.block_kv, nk), min((lo + j1) * t.block_kv, nk)
            loads = [Access("Q", row0 * d * e, (row0 + rq) * d * e)] if j0 == 0 else []
            loads += [Access("K", (kv_base + k0) * d * e, (kv_base + k1) * d * e),
                      Access("V", (kv_base + k0) * d * e, (kv_base + k1) * d * e)]
            mma, ex, oth = tile_work(rq, k1 - k0, d, j1 - j0)
            sram = flash2_sram(rq, k1 - k0, j1 - j0, j0 == 0, d, e, self.smem_readers)
            scale, spills, masked = self._diagonal(int(g.interior[qi]), lo, j0, j1)
            steps.append(Step(loads=loads, mma_flops=mma, exp_ops=ex, other_flops=oth, sram_bytes=sram,
                              compute_scale=scale, local_bytes=spills, masked_tiles=masked,
                              pipe_cycles=self.traits.tile_pipe_cycles * (j1 - j0)
                              + self.traits.masked_tile_pipe_cycles * masked))
        fe, fo = finish_work(rq, d)
        steps[-1].exp_ops += fe
        steps[-1].other_flops += fo
        steps[-1].pipe_cycles += self.block_cycles()
        steps[-1].stores = stores
        return steps


class SplitCombineKernel(KernelPlan):
    """After a split flash2: one block per `combine_rows` rows reads every split's partial O and log-sum-exp and
    writes O and L (FlashAttention-2's combine kernel)."""

    def __init__(self, cfg: AttentionConfig, splits: int, traits: Traits):
        self.cfg, self.splits, self.traits = cfg, splits, traits
        self.rows = cfg.bh * cfg.seqlen_q
        self.name = "flash2_combine"
        self.rows_per_block = combine_rows(cfg.head_dim)
        self.n_blocks = -(-self.rows // self.rows_per_block)
        self.threads = 128
        self.smem_bytes = self.rows_per_block * splits * STAT_BYTES if traits.smem_bytes is None else traits.smem_bytes
        self.double_buffered = False

    def runs(self) -> Iterator[tuple[int, int, Hashable]]:
        per = self.rows_per_block
        last = self.rows - (self.n_blocks - 1) * per
        if last == per:
            yield 0, self.n_blocks, per
        else:
            if self.n_blocks > 1:
                yield 0, self.n_blocks - 1, per
            yield self.n_blocks - 1, 1, last

    def cohort(self, blocks: np.ndarray, max_steps: int) -> list[Step]:
        cfg, d = self.cfg, self.cfg.head_dim
        r0 = np.asarray(blocks, dtype=np.int64) * self.rows_per_block
        r1 = np.minimum(r0 + self.rows_per_block, self.rows)
        loads = []
        for sp in range(self.splits):
            base = sp * self.rows
            loads += merged("Lacc", (base + r0) * STAT_BYTES, (base + r1) * STAT_BYTES)
        for sp in range(self.splits):
            base = sp * self.rows
            loads += merged("Oacc", (base + r0) * d * 4, (base + r1) * d * 4)
        rows = int((r1 - r0).sum())
        ex, oth = combine_work(rows, d, self.splits)
        return [Step(loads=loads, stores=merged("O", r0 * d * cfg.elem_bytes, r1 * d * cfg.elem_bytes)
                     + merged("L", r0 * STAT_BYTES, r1 * STAT_BYTES), exp_ops=ex, other_flops=oth)]


# a coarse flash1 block's loop, outer steps folded into this many (its time rests on each inner step's wait on its
# own re-reads, which a few folded steps blur: tests/test_engine_scale.py)
FOLDED_STEPS = 16


class HeadLoopKernel(KernelPlan):
    """A block a head looping over every tile pair of it (the paper's flash1, forward and backward): never folded
    but when coarse, when its re-reads of a query block's state (`state_bytes` a query row) miss L2 where a head's
    state times the blocks resident exceeds what L2 holds, as the exact loop's LRU finds them then, else hit."""

    folds = 0        # outer steps the loop is folded into (0: none)
    far = False      # whether a folded step's repeats miss L2
    state_bytes = 0

    def cost_steps(self, hw, max_steps: int) -> int:
        # a step a key tile, of twice a flash2 step's events (loads, streams, re-reads and stores each timed), its
        # members' look-ups (where every query block sees every tile, a member's ranges merge with the next's: a
        # step costs what some 20 members' do; causal, each member's state tensors apart: some 3) and its query
        # blocks' ranges built (some 200 cost a step)
        members = min(self.n_blocks, self.blocks_per_sm(hw) * hw.sm_count)
        return self.g.n_kv * (2 + members // (3 if self.cfg.causal else 20) + self.g.n_q // 200)

    def coarse(self, hw) -> "HeadLoopKernel":
        k = copy.copy(self)
        k.folds = FOLDED_STEPS
        members = min(self.n_blocks, self.blocks_per_sm(hw) * hw.sm_count)
        k.far = self.cfg.seqlen_q * self.state_bytes * members > hw.l2_holding_bytes
        return k

    def state_ranges(self, head0: np.ndarray, row0: np.ndarray, rows: np.ndarray, members: int):
        """rng(name, width, n, far=None): the ranges of a per-row tensor (`width` bytes a row) over one head's query
        blocks (first rows `row0`, `rows` rows) requested n times, at every member's first row `head0`. Where the
        loop is folded beyond L2's reach (`far`), none: every byte goes to HBM, added to `far`."""
        def rng(name: str, width: int, n: np.ndarray, far: dict | None = None) -> list[Access]:
            if far is not None and self.far:
                nbytes = int((n * rows).sum()) * width * members
                if nbytes:
                    far[name] = far.get(name, 0) + nbytes
                return []
            return member_ranges(name, head0 * width, row0 * width, (row0 + rows) * width, n)
        return rng

    def tile_ranges(self, name: str, lo: np.ndarray, hi: np.ndarray, count: np.ndarray | int, far: dict) -> list[Access]:
        """`merged` ranges of a K/V-side tile the members each read or write once; where the loop is folded beyond
        L2's reach and no two members share a tile, none: its bytes go to `far` (first touches either way)."""
        if self.far and np.all(np.asarray(count) == 1):
            nbytes = int(np.sum(np.asarray(hi) - np.asarray(lo)))
            if nbytes:
                far[name] = far.get(name, 0) + nbytes
            return []
        return merged(name, lo, hi, count)

    def outer_steps(self, n_outer: int, max_steps: int) -> list[tuple[int, int]]:
        """The loop's outer tiles in steps: one a tile, or folded when coarse."""
        return fold(n_outer, max(max_steps, self.folds) if self.folds else n_outer)


class Flash1Kernel(HeadLoopKernel):
    """The paper's Algorithm 1: one block per (batch, head); for each K/V tile j (outer), for each query block i
    that sees it (inner): read Q_i and, after the first tile, the fp32 O_i with m_i and l_i; write them back, or O_i
    and L_i when j is the last tile that i sees."""

    def __init__(self, cfg: AttentionConfig, tiling: Tiling, traits: Traits):
        self.cfg, self.tiling, self.traits = cfg, tiling, traits
        self.g = RowBlocks(cfg, tiling.block_q, tiling.block_kv)
        self.name = "flash1_fwd"
        self.n_blocks = cfg.bh
        self.rows_per_block = tiling.block_q   # one query block of the inner loop at a time
        self.threads = tiling.threads
        self.smem_bytes = tiling.smem_bytes(cfg) if traits.smem_bytes is None else traits.smem_bytes
        self.double_buffered = tiling.stages >= 2
        self.partial_writes = fragment_writes(traits, cfg.elem_bytes)
        self.placement = FillWholeSMs()   # its blocks wait on their own re-reads: an SM's pace is its memory path's
        self.state_bytes = cfg.head_dim * (cfg.elem_bytes + 4) + 2 * STAT_BYTES   # Q, O (fp32), m, l a row

    def runs(self) -> Iterator[tuple[int, int, Hashable]]:
        yield 0, self.n_blocks, "head"

    def cohort(self, blocks: np.ndarray, max_steps: int) -> list[Step]:
        cfg, g, t = self.cfg, self.g, self.tiling
        d, e, S = cfg.head_dim, cfg.elem_bytes, STAT_BYTES
        bh = np.asarray(blocks, dtype=np.int64)
        count = len(bh)
        kvh, per_head = np.unique(g.kv_head(bh), return_counts=True)
        rows, nv = g.rows, g.nvis
        # every member (head) loops alike: a step's work is one head's times the members, its ranges one head's
        # at each member's offset
        row0 = np.arange(g.n_q, dtype=np.int64) * t.block_q
        head0 = bh * cfg.seqlen_q
        rng = self.state_ranges(head0, row0, rows, count)
        steps = []
        n_outer = int(nv.max()) if g.n_q else 0
        # one step per outer K/V tile, folded only when coarse: Q_i and O_i come back once per outer step, after
        # every other query block of the head, and whether L2 still holds them depends on that distance (folded
        # steps decide it once: `HeadLoopKernel.coarse`)
        for j0, j1 in self.outer_steps(n_outer, max_steps):
            k0, k1 = g.kv_rows(j0, j1)
            kv_base = kvh * cfg.seqlen_k
            visits = np.clip(np.minimum(nv, j1) - j0, 0, None)                 # inner steps of i in this chunk
            rereads = np.clip(np.minimum(nv, j1) - max(j0, 1), 0, None)        # ... that re-read O, m, l
            finals = ((nv - 1 >= j0) & (nv - 1 < j1)).astype(np.int64)         # ... the last one of i
            keeps = visits - finals                                            # ... that write O, m, l back
            # the block waits for K_j, V_j and its first query block's Q; the later Q_i it prefetches behind the
            # inner steps' compute (two stages; with one it loads each after the step before, a wait not charged)
            seen = visits > 0
            first = (seen & (np.cumsum(seen) == 1)) * visits
            far_r: dict = {}
            far_s: dict = {}
            far_rr: dict = {}
            far_w: dict = {}
            loads = self.tile_ranges("K", (kv_base + k0) * d * e, (kv_base + k1) * d * e, per_head, far_r) + \
                self.tile_ranges("V", (kv_base + k0) * d * e, (kv_base + k1) * d * e, per_head, far_r) + \
                rng("Q", d * e, first, far_r)
            streams = rng("Q", d * e, visits - first, far_s)
            reloads = rng("Oacc", d * 4, rereads, far_rr) + rng("m", S, rereads, far_rr) + rng("l", S, rereads, far_rr)
            stores = rng("Oacc", d * 4, keeps, far_w) + rng("m", S, keeps, far_w) + rng("l", S, keeps, far_w) + \
                rng("O", d * e, finals, far_w) + rng("L", S, finals, far_w)
            # keys each inner step covers: tiles j0..j1 clipped to what query block i sees
            keys = np.clip(np.minimum(g.keys_in, k1) - k0, 0, None)
            mma, ex, oth = tile_work(rows, keys, d, visits)
            fe, fo = finish_work(rows, d)
            ex, oth = ex + fe * finals, oth + fo * finals
            # K/V staged once per outer step; at every inner step each warp reads them again, and the Q tile is
            # staged and read once (O, m and l go straight between HBM and registers)
            sram = 2 * (k1 - k0) * d * e * count + \
                int((t.warps * 2 * keys * d * e + 2 * d * e * rows * visits).sum()) * count
            # inner steps on tiles crossing query block i's diagonal take the kernel's masked loop body
            diagonal = int(g.diagonal_tiles(g.interior, j0, np.minimum(nv, j1)).sum())
            scale = 1.0 + (self.traits.diagonal_tile_cost - 1.0) * diagonal / max(1, int(visits.sum()))
            steps.append(Step(loads=loads, stores=stores, reloads=reloads, streams=streams,
                              mma_flops=int(mma.sum()) * count, exp_ops=int(ex.sum()) * count,
                              other_flops=int(oth.sum()) * count, sram_bytes=sram,
                              l1_lines=fragment_lines(reloads + stores, e) + far_lines(far_rr, e) + far_lines(far_w, e),
                              far_reads=far_r, far_streams=far_s, far_reloads=far_rr, far_writes=far_w,
                              serial_reloads=int(rereads.sum()) * count,
                              compute_scale=float(scale), masked_tiles=diagonal * count,
                              pipe_cycles=(self.traits.tile_pipe_cycles * int(visits.sum())
                                           + self.traits.masked_tile_pipe_cycles * diagonal) * count))
        if steps:
            steps[-1].pipe_cycles += self.block_cycles() * count
        masked = nv == 0  # query blocks that see no key: written once, at the end
        if masked.any():
            z = masked.astype(np.int64)
            end = rng("O", d * e, z) + rng("L", S, z)
            if steps:
                steps[-1].stores += end
                steps[-1].l1_lines += fragment_lines(end, e)
            else:
                steps.append(Step(stores=end, l1_lines=fragment_lines(end, e)))
        return steps
