"""The plan format shared by the analytic model's tests and the engine.

A `Plan` is a list of `KernelPlan`s run in sequence. A kernel is a grid of thread blocks in launch order; blocks
with the same *signature* do the same work on different data. The engine asks a kernel for *cohorts* (consecutive
blocks with one signature, started together) and gets their steps: loads from HBM/L2, compute, stores; each
`Access` is a byte range of a named tensor, touched `count` times by the cohort's members.
"""
from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Hashable, Iterable, Iterator

import numpy as np

from ..hardware import HardwareProfile
from .behaviour import Placement, StepLoop
from .traits import Build, Fitted, Traits  # noqa: F401  (the plan format's)


@dataclass(frozen=True, slots=True)
class Access:
    tensor: str
    lo: int
    hi: int
    count: int = 1  # how many members of the cohort request this same range
    extra: int = 0  # bytes requested beyond count x the range, of lines within it (`coalesced`)

    @property
    def nbytes(self) -> int:
        return self.hi - self.lo

    @property
    def requested(self) -> int:
        """The bytes requested of the range, all its requesters together."""
        return (self.hi - self.lo) * self.count + self.extra


@dataclass(slots=True)
class Step:
    """What a cohort does in one (macro-)step, totals over its members."""
    loads: list[Access] = field(default_factory=list)
    stores: list[Access] = field(default_factory=list)
    # loads of state the block itself stored at an earlier step (flash1's O, m, l): issued when the step starts,
    # after the previous step's stores, never prefetched with `loads`, so L2 sees the write before the re-read
    reloads: list[Access] = field(default_factory=list)
    # loads the step's compute overlaps: tiles of its later inner steps, which the block prefetches behind its
    # compute (flash1's Q_i past the first query block of an outer step); issued when the step starts
    streams: list[Access] = field(default_factory=list)
    # read-modify-writes the step issues and does not wait on (FlashAttention-2's fp32 dQ accumulated by atomic
    # adds): L2 performs them, reading the lines from HBM where it does not hold them; issued with the stores
    atomics: list[Access] = field(default_factory=list)
    mma_flops: int = 0
    exp_ops: int = 0
    other_flops: int = 0   # fp32 non-tensor arithmetic: scaling, max, sums, rescaling
    sram_bytes: int = 0    # bytes written into and read out of shared memory
    # L1 line lookups of the step's register-direct global loads and stores (our kernels' O, m, l in the mma
    # fragment layout: a warp instruction touches 8 rows, a line each, for 16 or 32 bytes of each): the SM's L1
    # serves `HardwareProfile.l1_lines_per_clk_per_sm` of them, its warps issuing them between their matmuls
    l1_lines: int = 0
    # inner steps that each wait on their own re-read (flash1: one a query block re-reading O, m, l): a memory
    # latency apiece in the block's chain, which co-resident blocks' chains do not cover
    serial_reloads: int = 0
    # thread instructions issued, where they rather than a pipe bound the step (naive's softmax): one a lane a
    # clock, the FMA rate; the exp and fp32 pipes run beside the issue, so the step takes the longer
    issue: int = 0
    # the step's compute takes this many times what its counted work does (time only, the counts stay): its
    # tiles crossing the causal diagonal run a kernel's masked code (`Fitted.diagonal_tile_cost`)
    compute_scale: float = 1.0
    # register spills the members store to local memory (`Build.spill_bytes_per_tile`): L1 writes them through to
    # L2, where the few MB of scratch stay, rewritten in place; counted as L2 writes and timed on L2's bandwidth,
    # not placed in the cache
    local_bytes: int = 0
    # the SM's non-tensor pipe cycles of the step, members summed, where the kernel's build was counted
    # (`Build.tile_pipe_cycles`): they stand for the counted exp and fp32 work's time, not for its counts
    pipe_cycles: float = 0.0
    # tiles that run the kernel's masked loop body (crossing the causal diagonal or the sequence's end), members
    # summed: a first-wave block fetches that code cold (`HardwareProfile.code_fetch_gb_s`)
    masked_tiles: int = 0
    # bytes by tensor of re-reads and re-writes beyond L2's reach, each through L2 to HBM without a place in the
    # cache (a folded loop's repeats whose reuse distance L2 does not hold: `flash.Flash1Kernel.coarse`)
    far_reads: dict = field(default_factory=dict)
    far_streams: dict = field(default_factory=dict)
    far_reloads: dict = field(default_factory=dict)
    far_writes: dict = field(default_factory=dict)

    def store_bytes(self) -> int:
        return sum(a.requested for a in self.stores) + sum(self.far_writes.values())


class KernelPlan:
    """Base of the planned kernels. Subclasses set the sizes and implement `runs` and `cohort`."""

    name: str
    n_blocks: int
    rows_per_block: int   # query rows one block works on at a time (what `Fitted.latency_rows` counts)
    launches_per_block: int = 1   # real thread blocks one modelled block stands for (each pays the block overhead)
    threads: int
    smem_bytes: int
    traits: Traits
    double_buffered: bool
    # its blocks load K/V tiles with cp.async, those of the first wave in step: the engine records which of their
    # requests repeat others' (`iosim.counters`); cuBLAS's GEMMs multicast shared tiles instead
    l2_merge: bool = False
    # tensors whose stores write part of a 32-byte sector a request: tensor -> requests a sector
    # (`Build.o_fragment_stores`); a profiler's L2 counter sees part of the later ones (`iosim.counters`)
    partial_writes: dict = {}   # (a class default, never mutated)
    # where its blocks after the first wave go, and how a cohort's steps overlap (`plan.behaviour`)
    placement: Placement = Placement()
    loop: StepLoop = StepLoop()
    # below 1, the kernel's epilogue, not the memory, holds its stores: they pass through it at this share of HBM's
    # rate, its blocks together, whether L2 or HBM takes them (naive's qk on sm_90: `CublasRule.qk_store_rate`)
    store_rate: float = 1.0
    # the fewest steps its blocks' loops fold into whatever the engine is asked (0: as asked)
    least_steps: int = 0

    def lookahead(self, n_steps: int) -> int:
        """Steps whose loads a double-buffered block has issued beyond the one it computes (its pipeline's stages
        less one, in its `n_steps` steps): one, double buffering, unless a kernel keeps more in flight."""
        return 1

    def runs(self) -> Iterator[tuple[int, int, Hashable]]:
        """(first block, number of blocks, signature) for consecutive blocks of one signature, in launch order."""
        raise NotImplementedError

    def cost_steps(self, hw: HardwareProfile, max_steps: int) -> int:
        """What one of its cohorts costs the engine, in steps of a cohort of a few members (`engine.scale`)."""
        return max_steps

    def coarse(self, hw: HardwareProfile) -> "KernelPlan":
        """The kernel as the engine's coarse dispatch runs it: itself, unless its loop never folds otherwise."""
        return self

    def repeat_key(self) -> Hashable | None:
        """Equal for kernels that do the same work on different rows of a tensor (parts of one operator), which
        the engine may time once (`run.run_plan`); None: this kernel is never taken for another."""
        return None

    def bucket(self, sig: Hashable) -> tuple[Hashable, int]:
        """(key, rank) of a signature for the engine's coarse dispatch: blocks of one key may run as one cohort,
        ranked by the rank (the work they do); by default only blocks of one signature."""
        return sig, 0

    def buckets(self, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """`bucket`'s (key, rank) of each of `blocks` as integer arrays, for a grid of many runs (the coarse dispatch
        then takes blocks without walking `runs`); None where the kernel has no such form."""
        return None

    def cohort(self, blocks: np.ndarray, max_steps: int) -> list[Step]:
        """Steps of `blocks` (launch-order numbers, ascending, one signature, or one `bucket` key), folded to at
        most `max_steps` where folding keeps L2 reuse as it is (flash1 folds only when coarse)."""
        raise NotImplementedError

    def block_cycles(self) -> float:
        """A block's prologue and epilogue on the non-tensor pipes, where its build's key tiles are counted too (a
        block's cycles alone would leave its tiles at the counted work's rates)."""
        return self.traits.block_pipe_cycles if self.traits.tile_pipe_cycles else 0.0

    def blocks_per_sm(self, hw: HardwareProfile) -> int:
        """Occupancy: how many blocks fit on one SM by shared memory, threads, registers and the block limit."""
        smem = self.smem_bytes + int(hw.smem_reserved_per_block_kib * 1024)
        limits = [hw.max_blocks_per_sm, hw.max_threads_per_sm // self.threads,
                  hw.registers_per_sm // (-(-self.traits.registers_per_thread // 8) * 8 * self.threads)]  # 8 at a time
        if smem > 0:
            limits.append(hw.smem_per_sm_bytes // smem)
        return max(0, min(limits))


@dataclass
class Plan:
    algorithm: str
    kernels: list[KernelPlan]
    # tensor -> bytes, and for each kernel the tensors alive while it runs (for the peak HBM footprint)
    tensor_bytes: dict[str, int]
    live: list[list[str]]
    tiling: object = None   # the Tiling the tiled kernels run (None for naive)
    _peak: int | None = field(default=None, repr=False, compare=False)
    _keys: list | None = field(default=None, repr=False, compare=False)

    def repeat_keys(self) -> list:
        """Each kernel's `repeat_key`, made once (an eager plan has tens of thousands of parts): a plan's kernels
        are not changed once it is built."""
        if self._keys is None:
            self._keys = [k.repeat_key() for k in self.kernels]
        return self._keys

    def distinct(self) -> Iterator[KernelPlan]:
        """Its kernels, but the second and later of a run of identical parts of an operator (`repeat_key`)."""
        prev = None
        for k, key in zip(self.kernels, self.repeat_keys()):
            if key is None or key != prev:
                yield k
            prev = key

    def peak_footprint_bytes(self) -> int:
        if self._peak is None:
            self._peak = max(sum(self.tensor_bytes[t] for t in names) for names in self.live)
        return self._peak


# ---- helpers for building merged access lists --------------------------------------------------------

def fragment_writes(traits: Traits, elem_bytes: int) -> dict:
    """`KernelPlan.partial_writes` of a kernel storing O from its mma fragments: 8 x elem_bytes bytes of a row a
    request, so 32 / that requests a 32-byte sector."""
    return {"O": 32 // (8 * elem_bytes)} if traits.o_fragment_stores and 8 * elem_bytes < 32 else {}


def spill_bytes(traits: Traits, tiles, masked) -> int:
    """Register spills stored over `tiles` key-tile visits, `masked` of them crossing the causal diagonal or the
    sequence's end (`Build.spill_bytes_per_tile`, `_per_diagonal_tile`); arrays (a cohort's members) are summed."""
    return int(np.sum(traits.spill_bytes_per_tile * (tiles - masked) + traits.spill_bytes_per_diagonal_tile * masked))


# set by the engine while it builds a coarse cohort's steps: `merged` then gives a tensor's many ranges as their
# union (`union`)
union_ranges: ContextVar[bool] = ContextVar("union_ranges", default=False)
UNION_FROM = 8   # ranges of a tensor in one step beyond which a coarse cohort looks up their union


def merged(tensor: str, lo: np.ndarray, hi: np.ndarray, count: np.ndarray | int = 1) -> list[Access]:
    """Ranges [lo, hi) each requested `count` times: identical ranges add their counts, and touching ranges
    with equal counts merge, so a cohort of consecutive blocks usually needs one range per tensor."""
    lo = np.asarray(lo, dtype=np.int64)
    if lo.size == 0:
        return []
    hi = np.asarray(hi, dtype=np.int64)
    scalar = isinstance(count, (int, np.integer))
    if lo.size <= 64 and not (lo.size > UNION_FROM and union_ranges.get()):
        # numpy's call overhead dominates small cohorts: the same rules in plain Python
        if lo.size == 1:
            a, b, c = int(lo.flat[0]), int(hi.flat[0]), int(count) if scalar else int(np.asarray(count).flat[0])
            return [Access(tensor, a, b, c)] if b > a and c > 0 else []
        cnt = [int(count)] * lo.size if scalar else \
            np.broadcast_to(np.asarray(count, dtype=np.int64), lo.shape).ravel().tolist()
        return _merged_small(tensor, lo.ravel().tolist(), hi.ravel().tolist(), cnt)
    cnt = np.broadcast_to(np.asarray(count, dtype=np.int64), lo.shape)
    if lo.size > UNION_FROM and union_ranges.get():
        return union(tensor, lo, hi, (hi - lo) * cnt)
    return _merged(tensor, lo, hi, cnt)


def runs_of(pairs: Iterable[tuple[Hashable, int]]) -> Iterator[tuple[int, int, Hashable]]:
    """`KernelPlan.runs` of consecutive (signature, blocks) pairs: those of one signature in a row merged."""
    first, count, cur = 0, 0, None
    for sig, n in pairs:
        if sig != cur and count:
            yield first, count, cur
            first, count = first + count, 0
        cur = sig
        count += n
    if count:
        yield first, count, cur


def heads_runs(head: list, heads: int) -> Iterator[tuple[int, int, Hashable]]:
    """`runs_of` a grid whose every head launches blocks of the signatures `head` in order: one head's runs,
    repeated (a grid of thousands of heads walked a run at a time, not a block)."""
    one = [(sig, n) for _, n, sig in runs_of((sig, 1) for sig in head)]
    return runs_of(pair for _ in range(heads) for pair in one)


def rows_as(tensor: str, rows: list[Access], width: int) -> list[Access]:
    """`merged` ranges of rows as the bytes of `tensor`, `width` bytes a row: scaling keeps which ranges touch,
    overlap or repeat, so this is `merged` of the scaled ranges (tensors of one row layout merged once)."""
    return [Access(tensor, a.lo * width, a.hi * width, a.count, a.extra * width) for a in rows]


def _merged(tensor: str, lo: np.ndarray, hi: np.ndarray, cnt: np.ndarray) -> list[Access]:
    if lo.size <= 64:
        return _merged_small(tensor, lo.tolist(), hi.tolist(), cnt.tolist())
    keep = (hi > lo) & (cnt > 0)
    lo, hi, cnt = lo[keep], hi[keep], cnt[keep]
    if lo.size == 0:
        return []
    if not (lo[1:] > lo[:-1]).all():   # (most cohorts give their ranges ascending already)
        order = np.lexsort((hi, lo))
        lo, hi, cnt = lo[order], hi[order], cnt[order]
    new = np.ones(lo.size, dtype=bool)
    new[1:] = (lo[1:] != lo[:-1]) | (hi[1:] != hi[:-1])
    starts = np.flatnonzero(new)
    lo, hi, cnt = lo[starts], hi[starts], np.add.reduceat(cnt, starts)
    run = np.ones(lo.size, dtype=bool)
    run[1:] = (lo[1:] != hi[:-1]) | (cnt[1:] != cnt[:-1])
    first = np.flatnonzero(run)
    last = np.append(first[1:] - 1, lo.size - 1)
    return [Access(tensor, a, b, c) for a, b, c in zip(lo[first].tolist(), hi[last].tolist(), cnt[first].tolist())]


def _merged_small(tensor: str, lo: list, hi: list, cnt: list) -> list[Access]:
    acc: dict[tuple[int, int], int] = {}
    for a, b, c in zip(lo, hi, cnt):
        if b > a and c > 0:
            acc[(a, b)] = acc.get((a, b), 0) + c
    out: list[Access] = []
    for (a, b), c in sorted(acc.items()):
        if out and out[-1].hi == a and out[-1].count == c:
            out[-1] = Access(tensor, out[-1].lo, b, c)
        else:
            out.append(Access(tensor, a, b, c))
    return out


def union(tensor: str, lo: np.ndarray, hi: np.ndarray, requested: np.ndarray) -> list[Access]:
    """Ranges [lo, hi) of `requested` bytes each as the union of their bytes: one range for each run of overlapping
    or touching ones, requested once, the rest of their requests its `extra` (an engine's coarse cohort, whose many
    members each request ranges of their own: bytes stay exact, look-ups go to the union)."""
    if lo.size <= 64:   # numpy's call overhead dominates small cohorts: the same in plain Python
        out: list[Access] = []
        a0 = b0 = t0 = None
        for a, b, t in sorted(zip(lo.tolist(), hi.tolist(), requested.tolist())):
            if b <= a or t <= 0:
                continue
            if a0 is not None and a <= b0:
                b0, t0 = max(b0, b), t0 + t
                continue
            if a0 is not None:
                out.append(Access(tensor, a0, b0, 1, t0 - (b0 - a0)))
            a0, b0, t0 = a, b, t
        if a0 is not None:
            out.append(Access(tensor, a0, b0, 1, t0 - (b0 - a0)))
        return out
    keep = (hi > lo) & (requested > 0)
    lo, hi, requested = lo[keep], hi[keep], requested[keep]
    if lo.size == 0:
        return []
    order = np.argsort(lo, kind="stable")
    lo, hi, requested = lo[order], hi[order], requested[order]
    reach = np.maximum.accumulate(hi)
    start = np.ones(lo.size, dtype=bool)
    start[1:] = lo[1:] > reach[:-1]
    first = np.flatnonzero(start)
    ends = reach[np.append(first[1:] - 1, lo.size - 1)]
    total = np.add.reduceat(requested, first)
    return [Access(tensor, a, b, 1, t - (b - a)) for a, b, t in zip(lo[first].tolist(), ends.tolist(), total.tolist())]


def coalesced(accesses: list[Access]) -> list[Access]:
    """`union` of each tensor's ranges where it has more than `UNION_FROM`."""
    if len(accesses) <= UNION_FROM:
        return accesses
    by: dict[str, list[Access]] = {}
    for a in accesses:
        by.setdefault(a.tensor, []).append(a)
    merge = {t for t, v in by.items() if len(v) > UNION_FROM and not _apart(v)}
    if not merge:
        return accesses
    out: list[Access] = []
    for tensor, acc in by.items():
        if tensor not in merge:
            out += acc
            continue
        out += union(tensor, np.array([a.lo for a in acc], dtype=np.int64), np.array([a.hi for a in acc], dtype=np.int64),
                     np.array([a.requested for a in acc], dtype=np.int64))
    return out


def _apart(acc: list[Access]) -> bool:
    """Ascending ranges with a gap between each and the next: their `union` is themselves (a coarse step's ranges
    most often, made by `union` already), the same bytes requested of the same look-ups."""
    return all(a.hi < b.lo for a, b in zip(acc, acc[1:]))


def fold(n_items: int, max_steps: int) -> list[tuple[int, int]]:
    """Split items 0..n into at most `max_steps` consecutive chunks: the first and last a single item (so a
    pipeline's fill and drain stay exact), the middle ones as even as possible."""
    if n_items <= max_steps or n_items <= 2:
        return [(j, j + 1) for j in range(n_items)]
    middle = max(1, max_steps - 2)
    inner = n_items - 2
    bounds = [1 + (inner * k) // middle for k in range(middle + 1)]
    chunks = [(0, 1)] + [(bounds[k], bounds[k + 1]) for k in range(middle) if bounds[k + 1] > bounds[k]]
    return chunks + [(n_items - 1, n_items)]


def member_ranges(tensor: str, bases: np.ndarray, lo: np.ndarray, hi: np.ndarray, count: np.ndarray | int = 1,
                  per_member: np.ndarray | int = 1) -> list[Access]:
    """`merged` for members doing the same: one member's ranges [lo, hi) (relative to its base) requested `count`
    times, at each member's byte offset `bases` (ascending), `per_member` times over. Costs what one member's ranges
    and the members do, not their product, where the members' spans are disjoint."""
    lo, hi = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
    head = _merged(tensor, lo, hi, np.broadcast_to(np.asarray(count, dtype=np.int64), lo.shape)) if lo.size else []
    bases = np.asarray(bases, dtype=np.int64)
    if not head or bases.size == 0:
        return []
    a = np.array([x.lo for x in head], dtype=np.int64)
    b = np.array([x.hi for x in head], dtype=np.int64)
    c = np.array([x.count for x in head], dtype=np.int64)
    mult = np.broadcast_to(np.asarray(per_member, dtype=np.int64), bases.shape)
    if bases.size > 1 and int(np.diff(bases).min()) < int(b.max() - a[0]):   # members overlap: the general rule
        return merged(tensor, (bases[:, None] + lo).ravel(), (bases[:, None] + hi).ravel(),
                      (mult[:, None] * np.broadcast_to(count, np.shape(lo))).ravel())
    lo_all, hi_all = (bases[:, None] + a).ravel(), (bases[:, None] + b).ravel()
    cnt = (mult[:, None] * c).ravel()
    if lo_all.size > UNION_FROM and union_ranges.get():
        return union(tensor, lo_all, hi_all, (hi_all - lo_all) * cnt)
    keep = cnt > 0
    lo_all, hi_all, cnt = lo_all[keep], hi_all[keep], cnt[keep]
    if lo_all.size == 0:
        return []
    run = np.ones(lo_all.size, dtype=bool)
    run[1:] = (lo_all[1:] != hi_all[:-1]) | (cnt[1:] != cnt[:-1])
    first = np.flatnonzero(run)
    last = np.append(first[1:] - 1, lo_all.size - 1)
    return [Access(tensor, x, y, z) for x, y, z in
            zip(lo_all[first].tolist(), hi_all[last].tolist(), cnt[first].tolist())]


def fold_members(lo: np.ndarray, hi: np.ndarray, max_steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """`fold` for members covering different items [lo, hi) of one range, all in the same steps: `fold`'s chunks
    of [min lo, max hi), each clipped to each member's items (members sharing items share their ranges)."""
    lo, hi = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
    first = int(lo.min())
    return [(np.clip(first + a, lo, hi), np.clip(first + b, lo, hi))
            for a, b in fold(int(hi.max()) - first, max_steps)]
