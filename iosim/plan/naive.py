"""Naive (standard) attention as the paper's Algorithm 0: three kernels that pass S and P through HBM.

The GEMMs are planned as cuBLAS runs them on Hopper: persistent, one block per SM walking its share of the output
tiles (tile b, b + P, b + 2P, ...), the next tile's loads overlapping this one's matmul and the last one's stores.
Their tiles are cuBLAS's (`kernels.cublas`, in its column-major terms: S^T = K Q^T, O^T = V^T P^T): an m x n tile of the
output, and thread-block clusters of cm x cn tiles whose members that share an operand tile receive it by one
multicast load (TMA), so L2 serves it once a cluster.
- `qk`: tiles of n queries x m keys of S = scale*Q K^T (query strip i, key tile j, key tile fastest); a tile reads
  Q_i and K_j and writes its part of S, its stores at cuBLAS's epilogue rate on the chip (`CublasRule.qk_store_rate`).
- `softmax`: one block per row (gpu_kernels' softmax_rows), reading the row of S once and writing the row of P.
- `pv`: output strips of n rows of O = P V, each a loop over 64-key slices of P_i and V; O_i written at the end.
  A tile m < d wide reads its strip of P d/m times (once a cluster of cm). With fewer strips than SMs the key
  loop is split stream-K fashion (as cuBLAS does for a short, deep GEMM, in one kernel): block m takes units
  (strip, slice) [m L, (m+1) L), a block ending inside a strip writes its fp32 partial and the one finishing the
  strip reads those partials back before writing O_i.
S and P are addressed strip by strip (each strip of qk's n rows of a head contiguous, its key tiles in order), so
the softmax's rows and the pv slices find the bytes the qk tiles wrote; the byte totals are those of row-major S.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Hashable, Iterator, Literal

import numpy as np

from ..kernels.cublas import PV_KEYS, Cublas, GemmTile, gemm_smem_bytes, rows_aligned
from ..workload import AttentionConfig
from .behaviour import OutOfPhase
from .blocks import RowBlocks
from .costs import GEMM_SMEM_READS, gemm_flops, softmax_issue, softmax_work
from .kernel import KernelPlan, Step, Traits, fold, merged

NAIVE_WARPS = 4
GEMM_MIN_STEPS = 32
SOFTMAX_THREADS = 256
SOFTMAX_MAX_BLOCKS = 65536
SOFTMAX_SMEM_MAX = 96 * 1024   # rows of up to 24k keys held in shared memory


class NaiveKernel(KernelPlan):
    def __init__(self, cfg: AttentionConfig, kind: Literal["qk", "softmax", "pv"], traits: Traits, cublas: Cublas,
                 tiles: dict[str, GemmTile] | None = None, names: dict[str, str] | None = None,
                 name: str | None = None):
        """names: the tensors a GEMM of the backward reads and writes in place of Q, K, S (qk) or P, V, O (pv):
        dP = dO V^T is a qk with Q -> dO, K -> V, S -> dP."""
        self.cfg, self.kind = cfg, kind
        self.names = names or {}
        self.tiles = cublas.tiles(cfg, tiles)
        sm_count = cublas.sm_count
        s_rows = self.tiles["qk"].n     # S's strips: qk's query tiles
        e = cfg.elem_bytes
        self.launches_per_block = 1
        if kind == "softmax":
            # one block of 256 threads per row, the row held in shared memory as fp32 (gpu_kernels' softmax_rows).
            # Simulated, one modelled block stands for `rows` consecutive rows that one slot handles one after
            # another, so that a grid has at most SOFTMAX_MAX_BLOCKS of them (bytes and work are unchanged)
            rows = min(cfg.seqlen_q, max(1, -(-cfg.bh * cfg.seqlen_q // SOFTMAX_MAX_BLOCKS)))
            self.g = RowBlocks(cfg, rows, s_rows)
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
            # The kernel's loads of masked scores are predicated off (`c < keys ? s[c] : -inf`): a causal row
            # reads only the keys it sees. Where those bytes lie in the strip-by-strip layout of S: each row's
            # visible scores packed after those of the earlier rows of its strip (bytes exact, addresses
            # close), from a head's first row
            r = np.arange(cfg.seqlen_q + 1, dtype=np.int64)
            keys = np.clip(r[:-1] + cfg.causal_offset + 1, 0, cfg.seqlen_k) if cfg.causal \
                else np.full(cfg.seqlen_q, cfg.seqlen_k, dtype=np.int64)
            self._seen_cum = np.concatenate(([0], np.cumsum(keys)))           # keys seen by rows [0, r)
            strip0 = (r // s_rows) * s_rows
            before = self._seen_cum - self._seen_cum[np.minimum(strip0, cfg.seqlen_q)]   # in the row's strip
            self._s_pos = (strip0 * cfg.seqlen_k + before) * e
        else:
            # two pipeline stages of both operands; a GEMM is built to use a whole SM even alone on it (a
            # library's large tiles), so a lone block is not held to a shared SM's rate
            t = self.tiles[kind]
            # qk: strips of n queries, tiles of m keys; pv: strips of n queries, the key loop in PV_KEYS slices
            self.g = RowBlocks(cfg, t.n, t.m) if kind == "qk" else RowBlocks(cfg, t.n, PV_KEYS)
            self.threads = 32 * NAIVE_WARPS
            if kind == "qk":
                self.smem_bytes = gemm_smem_bytes(cfg, kind, t)
                self.n_items = cfg.bh * self.g.n_q * self.g.n_kv      # S tiles
            else:
                self.smem_bytes = gemm_smem_bytes(cfg, kind, t)
                self.n_items = cfg.bh * self.g.n_q                    # O strips
            self.n_blocks = min(sm_count, self.n_items)                # persistent: one block per SM at most
            self.units_per_block = _stream_k_units(self.n_items, self.g.n_kv, sm_count) if kind == "pv" else 0
            if self.units_per_block:
                self.n_blocks = -(-self.n_items * self.g.n_kv // self.units_per_block)
            self.traits = traits if traits.solo_sm_share is not None else replace(traits, solo_sm_share=1.0)
        self.name = name or f"naive_{kind}"
        self.store_rate = cublas.rule.qk_store_rate if kind == "qk" else 1.0
        self.rows_per_block = self.g.block_q
        self.double_buffered = kind != "softmax"
        if kind == "softmax":
            self.loop = OutOfPhase()   # many short rows an SM, their phases drifting apart

    def _n(self, tensor: str) -> str:
        return self.names.get(tensor, tensor)

    def lookahead(self, n_steps: int) -> int:
        """A GEMM block keeps its tile's stages less one of 64-deep slices in flight: that many of its steps' worth
        (its steps fold its slices: a qk tile's d / 64, a pv strip's key slices, over all its items)."""
        if self.kind == "softmax":
            return 1
        per_item = -(-self.cfg.head_dim // 64) if self.kind == "qk" else self.g.n_kv
        slices = self.units_per_block or -(-self.n_items // self.n_blocks) * per_item
        return max(1, -(-(self.tiles[self.kind].stages - 1) * n_steps // max(1, slices)))

    def runs(self) -> Iterator[tuple[int, int, Hashable]]:
        if self.kind != "softmax":
            # persistent blocks start together and walk items m, m + P, ...; the first n_items % P walk one more,
            # which their last step carries (one cohort keeps a step's items one run of consecutive items)
            yield 0, self.n_blocks, "persistent"
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
            r0 = qi * g.block_q                                 # first row in its head
            s_lo = bh * cfg.seqlen_q * nk * e + self._s_pos[r0]
            seen = self._seen_cum[r0 + rq] - self._seen_cum[r0]
            ex, oth = softmax_work(int(seen.sum()))
            return [Step(loads=merged("S", s_lo, s_lo + seen * e),
                         stores=merged("P", row0 * nk * e, (row0 + rq) * nk * e), exp_ops=ex, other_flops=oth,
                         issue=softmax_issue(int(rq.sum()) * nk, int(seen.sum())))]
        p, n_kv, n = self.n_blocks, g.n_kv, self.n_items
        if len(b) != p or b[0] != 0:
            raise ValueError("a persistent GEMM's blocks run as one cohort")
        items = -(-n // p)   # items of the busiest member; the others' last item is past n
        # a persistent block's pipeline hides its loads behind its matmuls only if its steps are short: at least
        # GEMM_MIN_STEPS of them (one or two cohorts a kernel: cheap)
        steps_max = max(max_steps, GEMM_MIN_STEPS)
        if self.kind == "qk":
            # the cohort's items in steps s0..s1 are the consecutive items P*s0 ... P*s1 - 1
            return [self._gemm_step(*_item_runs(np.array([p * s0]), np.array([min(p * s1, n)]), n_kv))
                    for s0, s1 in fold(items, steps_max)]
        if self.units_per_block:
            return self._stream_k(b, steps_max)
        # pv: a member's units are (strip, key slice) pairs, slices fastest; member m walks strips m, m + P, ...:
        # at its t-th strip the members together cover strips [P t, P t + P), all with the same key slices
        chunks = fold(items * n_kv, steps_max)
        if items >= steps_max:
            # a strip or more a step: the middle steps start and end at a strip's edge, so that only the steps next
            # to the first and last carry partial strips (a range of P each, one a member); the time moves by well
            # under 0.1% (naive and eager grids of 16-124 strips a member, exact engine)
            bounds = [a for a, _ in chunks] + [chunks[-1][1]]
            inner = {round(x / n_kv) * n_kv for x in bounds[2:-2]}
            bounds = sorted(set(bounds[:2] + bounds[-2:]) | {x for x in inner if bounds[1] < x < bounds[-2]})
            chunks = list(zip(bounds[:-1], bounds[1:]))
        steps = []
        for u0, u1 in chunks:
            t = np.arange(u0 // n_kv, (u1 - 1) // n_kv + 1)
            t = t[p * t < n]
            steps.append(self._gemm_step(p * t, np.minimum(p, n - p * t), np.maximum(u0 - t * n_kv, 0),
                                         np.minimum(u1 - t * n_kv, n_kv)))
        return steps

    def _stream_k(self, b: np.ndarray, steps_max: int) -> list[Step]:
        """pv split over the key loop: member m's units are [m L, (m+1) L) of all (strip, slice) pairs."""
        g, d = self.g, self.cfg.head_dim
        n_kv, lu = g.n_kv, self.units_per_block
        first, last = b * lu, np.minimum((b + 1) * lu, self.n_items * n_kv)
        steps = []
        for u0, u1 in fold(lu, steps_max):
            lo, hi = first + u0, np.minimum(first + u1, last)
            steps.append(self._gemm_step(*_item_runs(lo[lo < hi], hi[lo < hi], n_kv)))

        def part(strip: np.ndarray, count: np.ndarray | int = 1) -> list:
            row0 = (strip // g.n_q) * self.cfg.seqlen_q + (strip % g.n_q) * g.block_q
            return merged(self._n("Opart"), row0 * d * 4, (row0 + g.rows[strip % g.n_q]) * d * 4, count)
        # a member ending inside a strip writes its fp32 partial as it ends; the strip's finisher (its range
        # began at slice jl of the strip and runs to the strip's end) waits for them, one from each member before
        # it, and reads them from L2
        steps[-1].stores += part(last[last % n_kv > 0] // n_kv)
        fin = (first % n_kv > 0) & (last >= (first // n_kv + 1) * n_kv)
        fixup = part(first[fin] // n_kv, -(-(first[fin] % n_kv) // lu))
        return steps + ([Step(reloads=fixup)] if fixup else [])

    def _gemm_step(self, first: np.ndarray, count: np.ndarray, jl: np.ndarray, jh: np.ndarray) -> Step:
        """One step over runs of row strips (over batch x heads x strips): strips [first, first + count), each with
        key tiles [jl, jh). qk reads Q_i once a tile and the K tiles, and writes its S tiles; pv reads the P slices
        and V slices and writes O_i after its last slice. A run of whole strips of one head is one segment (its
        strips' ranges touch, and the work sums over them): the cost of a step grows with the heads it spans, not
        with its strips (a GEMM over an S of 10^12 elements has millions)."""
        cfg, g = self.cfg, self.g
        d, e, nk = cfg.head_dim, cfg.elem_bytes, cfg.seqlen_k
        first, count, jl, jh = self._segments(first, count, jl, jh)
        bh, qi = first // g.n_q, first % g.n_q
        rq = g.rows_before[qi + count] - g.rows_before[qi]   # rows of the segment's strips
        row0 = bh * cfg.seqlen_q + qi * g.block_q
        k0, k1 = np.minimum(jl * g.block_kv, nk), np.minimum(jh * g.block_kv, nk)
        keys = k1 - k0
        kv0 = g.kv_head(bh) * nk
        s_lo = row0 * nk * e + rq * k0 * e                    # S and P: a strip's key tiles in order
        flops = int(gemm_flops(rq, keys, d).sum())
        t = self.tiles[self.kind]
        # a cluster's tiles that share an operand tile load it once: the first of them (in its head's grid)
        lead_n = -(-(qi + count) // t.cn) - -(-qi // t.cn)   # strips of the segment that lead along n
        if self.kind == "qk":
            # Q_i by the tiles j of [jl, jh) that lead their cluster along m; K_j by strips leading along n
            q_loads = -(-jh // t.cm) - -(-jl // t.cm)
            loads = merged(self._n("Q"), row0 * d * e, (row0 + rq) * d * e, q_loads) + \
                merged(self._n("K"), (kv0 + k0) * d * e, (kv0 + k1) * d * e, lead_n)
            staged = int((rq * d * e * (jh - jl) + count * keys * d * e).sum())
            return Step(loads=loads, stores=merged(self._n("S"), s_lo, s_lo + rq * keys * e), mma_flops=flops,
                        sram_bytes=(1 + GEMM_SMEM_READS) * staged)
        last = jh == g.n_kv                                   # O_i goes out after its last slice
        # the tiles across d read P_i, once a cluster
        loads = merged(self._n("P"), s_lo, s_lo + rq * keys * e, t.b_loads(d)) + \
            merged(self._n("V"), (kv0 + k0) * d * e, (kv0 + k1) * d * e, lead_n)
        staged = int((rq * keys * e + count * keys * d * e).sum())
        return Step(loads=loads, stores=merged(self._n("O"), row0[last] * d * e, (row0[last] + rq[last]) * d * e),
                    mma_flops=flops, sram_bytes=(1 + GEMM_SMEM_READS) * staged)

    def _segments(self, first: np.ndarray, count: np.ndarray, jl: np.ndarray, jh: np.ndarray) -> tuple:
        """Runs of strips cut into segments: a run of whole strips (every key tile) at each head's boundary, a run
        of partial strips into single strips (their ranges do not touch)."""
        n_q, n_kv = self.g.n_q, self.g.n_kv
        first, count, jl, jh = (np.asarray(x, dtype=np.int64) for x in (first, count, jl, jh))
        part = ((jl > 0) | (jh < n_kv)) & (count > 1)
        if part.any():   # one strip each
            rep = np.where(part, count, 1)
            off = np.arange(int(rep.sum())) - np.repeat(np.cumsum(rep) - rep, rep)
            first, jl, jh = np.repeat(first, rep) + off, np.repeat(jl, rep), np.repeat(jh, rep)
            count = np.where(np.repeat(part, rep), 1, np.repeat(count, rep))
        end = first + count
        heads = (end - 1) // n_q - first // n_q + 1
        if (heads == 1).all():
            return first, count, jl, jh
        h = np.repeat(first // n_q, heads) + np.arange(int(heads.sum())) - np.repeat(np.cumsum(heads) - heads, heads)
        lo = np.maximum(np.repeat(first, heads), h * n_q)
        hi = np.minimum(np.repeat(end, heads), (h + 1) * n_q)
        return lo, hi - lo, np.repeat(jl, heads), np.repeat(jh, heads)


def _stream_k_units(strips: int, n_kv: int, sm_count: int) -> int:
    """(strip, key slice) units a pv block takes when it has fewer strips than SMs and splits its key loop; else 0."""
    if strips >= sm_count:
        return 0
    units = strips * n_kv
    return -(-units // min(sm_count, units))


def pv_partial_bytes(cfg: AttentionConfig, cublas: Cublas, tiles: dict[str, GemmTile] | None = None) -> int:
    """Bytes of fp32 partials a stream-K pv writes (and its strips' finishers read back); 0 without a split, and
    for CUTLASS's alignment-1 kernels, which split in a kernel of their own (`align1`)."""
    if not rows_aligned(cfg):
        return 0
    sm_count = cublas.sm_count
    g = RowBlocks(cfg, cublas.tiles(cfg, tiles)["pv"].n, PV_KEYS)
    strips = cfg.bh * g.n_q
    lu = _stream_k_units(strips, g.n_kv, sm_count)
    if not lu:
        return 0
    ends = np.arange(lu, strips * g.n_kv, lu)       # members' range ends before the last
    inside = ends[ends % g.n_kv > 0] // g.n_kv      # strips a member leaves unfinished
    return int(g.rows[inside % g.n_q].sum()) * cfg.head_dim * 4


def _item_runs(lo: np.ndarray, hi: np.ndarray, n_kv: int) -> tuple[np.ndarray, ...]:
    """Runs of items [lo, hi) (key tile fastest within a strip) as runs of strips (first, count, first tile, end
    tile): a partial first strip, the whole strips, a partial last strip."""
    sa, sb = lo // n_kv, (hi - 1) // n_kv
    jl, jh = lo - sa * n_kv, hi - sb * n_kv
    one = sa == sb
    whole_lo = np.where(jl > 0, sa + 1, sa)
    whole_hi = np.where(jh < n_kv, sb, sb + 1)
    parts = [(sa[one], np.ones(one.sum(), dtype=np.int64), jl[one], jh[one])]
    head, tail, mid = ~one & (jl > 0), ~one & (jh < n_kv), ~one & (whole_hi > whole_lo)
    parts.append((sa[head], np.ones(head.sum(), dtype=np.int64), jl[head], np.full(head.sum(), n_kv)))
    parts.append((whole_lo[mid], (whole_hi - whole_lo)[mid], np.zeros(mid.sum(), dtype=np.int64),
                  np.full(mid.sum(), n_kv)))
    parts.append((sb[tail], np.ones(tail.sum(), dtype=np.int64), np.zeros(tail.sum(), dtype=np.int64), jh[tail]))
    return tuple(np.concatenate([p[i] for p in parts]).astype(np.int64) for i in range(4))
