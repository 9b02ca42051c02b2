"""Runs a plan's kernels on a hardware profile as a SimPy discrete-event simulation.

Kernels run one after another, each after the launch overhead. A kernel's blocks are dispatched in launch order
to the chip's slots (SMs x blocks per SM by occupancy): the first wave one block an SM before any SM takes a
second (block b on SM b % SMs), later blocks where the kernel's `Placement` puts them. Blocks with the same
signature that start together (in launch order or not) form a *cohort* and run as one SimPy process: under fair
sharing they progress in lockstep, so a wave of identical blocks costs one process instead of hundreds. A cohort's
steps load (HBM and L2 shared by all transfers in flight), compute (its slots' share of the SMs' tensor,
special-function, fp32 and shared-memory rates: `sharing`), and store (`tallies`), as the kernel's `StepLoop`
overlaps them. A first-wave block waits at its first masked tile for the code its SM's instruction caches do
not hold (`cold_code_s`).
A kernel whose blocks would cost more cohort steps than the engine's budget runs *coarse* (from its start where
`scale.kernel_cost` says so, else from the step its cohorts exceed the budget): freed slots are pooled until a
share of the chip's are free (`COARSE_POOL`, more where many blocks are left), the blocks they take are split into
at most `COARSE_SPLIT` cohorts by the kernel's `bucket` (members of one cohort may differ in their work, and run as
its mean member), each folded into at most `COARSE_STEPS` steps, and each cohort starts with a credit of the time
its slots stood free. A coarse cohort's members' ranges of one tensor are looked up as their union (`union`), and
where more than `MAX_WAVES` waves are left, a slot takes a chain of blocks, run back to back as one member (their
work and bytes summed). Bytes and work stay exact; time moves by up to 7%
(tests/test_engine_scale.py).
L2's bytes are the requests made. What a profiler's counter sees of them differs (merged repeats, partial-sector
writes, code fetched by each GPC): the engine records what `iosim.counters` needs to say so, and times none of it.
"""
from __future__ import annotations

import heapq
from collections import Counter, deque

import numpy as np
import simpy

from ..hardware import HardwareProfile
from ..plan import Plan, Step
from ..plan.kernel import Access, KernelPlan, coalesced, union_ranges
from .bandwidth import SharedBandwidth
from .l2 import L2Cache
from .result import KernelResult, Timeline
from .sharing import sharing_for
from .tallies import Tallies

# coarse dispatch: a pool of freed slots is dispatched once it holds 1 / COARSE_POOL of the chip's slots, in at
# most COARSE_SPLIT cohorts
COARSE_POOL = 8
COARSE_SPLIT = 2   # (more cohorts put a head's blocks of different work apart, each cohort's ranges looked up apart)
COARSE_STEPS = 6   # and a block's loop folded into at most this many steps
# and the pool grows so that the dispatches left cost no more than the kernel's budget (at least this many)
MIN_DISPATCHES = 16
MIN_KERNEL_BUDGET = 200   # a kernel's share of a plan's budget is at least this
# row kernels of more waves than this are simulated in fewer, larger blocks, other kernels' blocks chained when coarse
MAX_WAVES = 32


class CountingEnvironment(simpy.Environment):
    """A SimPy environment that counts the events it schedules (for the speed benchmark)."""

    def __init__(self) -> None:
        super().__init__()
        self.events = 0

    def schedule(self, event, priority=1, delay=0):
        self.events += 1
        super().schedule(event, priority, delay)


class KernelRun:
    """One kernel on the chip: its blocks dispatched to slots (`KernelPlan.placement`), each cohort's steps run
    (`KernelPlan.loop`), their compute timed by SM sharing (`sharing`) and their traffic by `tallies`."""

    def __init__(self, env: CountingEnvironment, kernel: KernelPlan, hw: HardwareProfile, dtype: str,
                 hbm: SharedBandwidth, l2: SharedBandwidth | None, cache: L2Cache | None, max_steps: int,
                 timeline: Timeline | None, index: int = 0, coarse: bool = False, budget: int | None = None):
        self.env, self.k, self.hw, self.l2, self.cache = env, kernel, hw, l2, cache
        self.hbm = hbm
        self.index = index   # the kernel's place in its plan: where its code lies
        self.max_steps, self.timeline = max(max_steps, kernel.least_steps), timeline
        self.bps = kernel.blocks_per_sm(hw)
        self.share = sharing_for(kernel, hw, dtype, self.bps * hw.sm_count)
        self.pipe_cycles = 0.0   # the counted builds' non-tensor pipe cycles, for the utilisation
        self.per_sm = np.zeros(hw.sm_count, dtype=np.int64)   # blocks resident on each SM now
        self.taken = np.zeros(hw.sm_count, dtype=np.int64)   # slots taken on each SM (dispatched or resident)
        self.n_free = self.bps * hw.sm_count
        self.coarse, self.budget, self.spent = False, budget, 0
        self.pool, self.chain = max(1, self.n_free // COARSE_POOL), 1
        self.freed: deque = deque()   # [time, slots] freed, oldest first (coarse dispatch's credit)
        self.runs = iter(kernel.runs())
        self.run_left: tuple | None = None   # (next block, blocks left, signature) of the current run
        self.active = 0
        self.pending_stores: list = []
        self.done = env.event()
        self.r = KernelResult(kernel.name, 0.0, 0.0, kernel.n_blocks, self.bps, sm_count=hw.sm_count,
                              rows_per_block=kernel.rows_per_block, far_share=hw.l2_far_share)
        self.tallies = Tallies(env, kernel, hw, self.r, hbm, l2, cache)
        # the block scheduler starts blocks one after another: a cohort starts once it has started all its members
        self.dispatch_s = (hw.block_dispatch_ns or 0.0) * 1e-9 * kernel.launches_per_block
        self.dispatched_until = 0.0
        self.launching = False
        # the first wave's SMs start the masked loop body at once: code beyond what an SM's instruction caches
        # hold comes through its GPC's cache, shared by the GPC's SMs (experiments/cold_start/first_tile.py)
        self.cold_code_s = 0.0
        if hw.code_fetch_gb_s and hw.code_cache_kib:
            beyond = max(0.0, kernel.traits.code_bytes - hw.code_cache_kib * 1024)
            per_gpc = min(kernel.n_blocks, hw.sm_count) / (hw.gpc_count or 1)
            self.cold_code_s = beyond * per_gpc / (hw.code_fetch_gb_s * 1e9)
        if coarse:
            self._go_coarse()

    def run(self):
        self.r.start_s = self.env.now
        hbm0, l20 = self.hbm.bytes, self.l2.bytes if self.l2 else 0
        code = self.k.traits.code_bytes
        if code and self.cache is not None:
            # fetched beside the floor, not waited on; with L2 off (the paper's two-level model) only data counts.
            # Its latency bound is no block's: the blocks' out-of-phase steps read `least` of their own loads
            self.tallies.access([Access("code", self.index << 32, (self.index << 32) + code)], 1, write=False)
            self.tallies.least = 0.0
            self.r.code_bytes = code
        if self.hw.kernel_floor_us:   # what an empty kernel takes on the device: set-up and teardown
            yield self.env.timeout(self.hw.kernel_floor_us * 1e-6)
        self.dispatched_until = self.env.now
        self.launching = True
        self._dispatch()
        self.launching = False
        if self.active:
            yield self.done
        if self.pending_stores:
            yield simpy.AllOf(self.env, self.pending_stores)
        r, t = self.r, max(self.env.now - self.r.start_s, 1e-30)
        r.end_s = self.env.now
        sh, slots = self.share, self.bps * self.hw.sm_count
        tensor = r.mma_flops / (sh.rate_mma * slots) / t
        softmax = (self.pipe_cycles / (sh.rate_cycles * slots) if self.pipe_cycles else
                   r.exp_ops / (sh.rate_exp * slots) + r.other_flops / (sh.rate_fp32 * slots)) / t
        sram = r.sram_bytes / (sh.rate_smem * slots) / t
        r.utilisation = {
            "hbm": (self.hbm.bytes - hbm0) / (self.hbm.rate * t),
            # the SMs' time in matmul (or shared-memory reads, whichever is longer) plus softmax, as the cohorts
            # spend it; at the kernel's declared efficiencies
            "compute": max(tensor, sram, softmax) if sh.overlap_softmax else max(tensor, sram) + softmax,
            "tensor": tensor, "softmax": softmax, "sram": sram,
        }
        if self.l2:
            r.utilisation["l2"] = (self.l2.bytes - l20) / (self.l2.rate * t)

    def _dispatch(self) -> None:
        """Start as many blocks as there are free slots, in launch order; those of one signature form a cohort
        (neighbours in launch order or not: causal query blocks of many heads share signatures)."""
        if self.coarse and self.active and self.n_free < self.pool:
            return
        chain = self.chain if self.coarse and not self.launching else 1
        take = self.n_free * chain
        # the blocks taken, in launch order: their numbers, their group (cohort key) and their rank in it
        taken, gid, ranks, keys = [], [], [], {}
        bulk = self._take_bulk(take) if self.coarse and take else None
        if bulk is not None:
            taken, gid, ranks = [bulk[0]], [bulk[1]], [bulk[2]]
            take = 0
        while take:
            if self.run_left is None or self.run_left[1] == 0:
                nxt = next(self.runs, None)
                if nxt is None:
                    break
                self.run_left = (nxt[0], nxt[1], nxt[2])
            first, left, sig = self.run_left
            n = min(left, take)
            key, rank = self.k.bucket(sig) if self.coarse else (sig, 0)
            taken.append(np.arange(first, first + n, dtype=np.int64))
            gid.append(np.full(n, keys.setdefault(key, len(keys)), dtype=np.int64))
            ranks.append(np.full(n, rank, dtype=np.int64))
            self.run_left = (first + n, left - n, sig)
            take -= n
        if taken:
            blocks, gid, ranks = (np.concatenate(x) if len(x) > 1 else x[0] for x in (taken, gid, ranks))
            groups = [np.flatnonzero(gid == g) for g in np.unique(gid)]   # each ascending: launch order
            sms = self._slots(groups, chain)
            credit = self._credit(sum(len(x) for x in sms)) if self.coarse else 0.0
            for idx, slot in zip(groups, sms):
                b, r = blocks[idx], ranks[idx]
                if self.coarse and len(idx) > 1 and (r != r[0]).any():
                    # by work, cut into at most COARSE_SPLIT cohorts of as many members; a cohort's blocks ascending
                    cut = min(COARSE_SPLIT, len(slot))
                    order = np.argsort(r, kind="stable")
                    for bpart, spart in zip(np.array_split(order, cut), np.array_split(np.arange(len(slot)), cut)):
                        bpart = np.sort(bpart)
                        self._start(b[bpart], slot[bpart] if chain == 1 else slot[spart], credit)
                else:
                    self._start(b, slot, credit)
        if self.active == 0 and not self.done.triggered:
            self.done.succeed()

    def _take_bulk(self, take: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Coarse dispatch's next `take` blocks with their group and rank by the kernel's `buckets`, where it has
        them (a grid of many runs, not walked a run at a time); None where it has none."""
        first = self.run_left[0] if self.run_left else 0
        blocks = np.arange(first, min(self.k.n_blocks, first + take), dtype=np.int64)
        ids = self.k.buckets(blocks) if blocks.size else None
        if ids is None:
            return None
        self.run_left, self.runs = (first + blocks.size, 0, None), iter(())
        return blocks, np.asarray(ids[0], dtype=np.int64), np.asarray(ids[1], dtype=np.int64)

    def _slots(self, groups: list[np.ndarray], chain: int) -> list[np.ndarray]:
        """Each group's SMs, a slot each: block by block in launch order (the block scheduler places blocks in the
        order they are launched, and which blocks share an SM decides how long its busiest SM takes: causal grids);
        where blocks are chained, a group's slots in proportion to its blocks (at least one)."""
        # free slots by the placement's key, then the lowest SM: (key, SM, taken); the first wave puts block b on
        # SM b % SMs, one block an SM before any SM takes a second, as the device does
        placement, launching = self.k.placement, self.launching
        heap = [(int(c), sm, int(c)) for sm, c in enumerate(self.taken) if c < self.bps]
        heapq.heapify(heap)

        def pop() -> int:
            key, sm, c = heapq.heappop(heap)
            if c + 1 < self.bps:
                heapq.heappush(heap, (placement.key(key, c + 1, launching), sm, c + 1))
            return sm
        if chain == 1:
            sm = np.array([pop() for _ in range(sum(len(g) for g in groups))], dtype=np.int64)
            return [sm[idx] for idx in groups]
        total = sum(len(g) for g in groups)
        share = [max(1, len(g) * self.n_free // total) for g in groups]
        while sum(share) > self.n_free:
            share[share.index(max(share))] -= 1
        return [np.array([pop() for _ in range(min(len(g), k))], dtype=np.int64) for g, k in zip(groups, share)]

    def _go_coarse(self) -> None:
        """From now on, coarse dispatch; its pool holds enough of the blocks left that the dispatches left cost
        what is left of the budget (and at least 1 / COARSE_POOL of the slots); where more than MAX_WAVES waves
        are left, each slot takes a chain of blocks."""
        self.coarse = True
        self.max_steps = max(min(self.max_steps, COARSE_STEPS), self.k.least_steps)
        self.k = self.k.coarse(self.hw)
        slots = self.bps * self.hw.sm_count
        left = self.k.n_blocks - (self.run_left[0] if self.run_left else 0)
        dispatches = max(MIN_DISPATCHES, ((self.budget or 0) - self.spent) // (COARSE_SPLIT * COARSE_STEPS))
        self.pool = min(slots, max(self.pool, -(-left // dispatches)))
        # a grid of more waves than MAX_WAVES: as many of chained blocks
        self.chain = max(1, -(-left // (MAX_WAVES * slots)))

    def _start(self, blocks: np.ndarray, sms: np.ndarray, credit: float) -> None:
        np.add.at(self.taken, sms, 1)
        self.n_free -= len(sms)
        self.active += 1
        self.env.process(self._cohort(blocks, sms, self.launching, credit))

    def _credit(self, used: int) -> float:
        """How long, on average, the `used` slots taken now stood free (the oldest freed first)."""
        now, total, weighted = self.env.now, 0, 0.0
        while used > 0 and self.freed:
            t, n = self.freed[0]
            k = min(n, used)
            total, weighted, used = total + k, weighted + k * (now - t), used - k
            if k == n:
                self.freed.popleft()
            else:
                self.freed[0][1] = n - k
        return weighted / total if total else 0.0

    def _cohort(self, blocks: np.ndarray, sms: np.ndarray, lock: bool = False, credit: float = 0.0):
        env = self.env
        n = len(sms)   # members: a slot each, its chain of blocks (most often one) run back to back
        if self.coarse:   # many members' ranges each: a tensor's looked up as their union (bytes unchanged)
            token = union_ranges.set(True)
            steps = self.k.cohort(blocks, self.max_steps)
            union_ranges.reset(token)
            for s in steps:
                s.loads, s.stores, s.atomics = coalesced(s.loads), coalesced(s.stores), coalesced(s.atomics)
                s.reloads, s.streams = coalesced(s.reloads), coalesced(s.streams)
        else:
            steps = self.k.cohort(blocks, self.max_steps)
        self.spent += len(steps)
        if not self.coarse and self.budget is not None and self.spent > self.budget:
            self._go_coarse()   # the kernel costs more than its estimate: the rest of it coarse
        np.add.at(self.per_sm, sms, 1)
        if self.dispatch_s:
            self.dispatched_until = max(self.dispatched_until, env.now) + len(blocks) * self.dispatch_s
            yield env.timeout(self.dispatched_until - env.now)
        start = env.now
        stores: list = []
        if self.k.traits.block_overhead_s > 0:
            overhead = self.k.traits.block_overhead_s * self.k.launches_per_block
            yield env.timeout(overhead if len(blocks) == n else overhead * len(blocks) / n)
        yield from self.k.loop.run(self, steps, n, sms, lock, stores, credit)
        # a block retires once its stores are issued; the kernel, not the block, waits for them to drain
        self.pending_stores += stores
        if self.timeline is not None:
            self.timeline.blocks += [(int(sm), self.k.name, start, env.now, int(b)) for sm, b in zip(sms, blocks)]
        np.add.at(self.per_sm, sms, -1)
        np.add.at(self.taken, sms, -1)
        self.n_free += n
        self.active -= 1
        if self.coarse:
            self.freed.append([env.now, n])
        self._dispatch()

    def compute_s(self, s: Step, n: int, sms: np.ndarray, wait_s: float = 0.0) -> float:
        """Count the step's work and time it for the busiest of the cohort's SMs."""
        self.tallies.count_work(s)
        self.pipe_cycles += s.pipe_cycles
        return self.share.step_s(s, n, max(1, int(self.per_sm[sms].max())), wait_s)


def run_plan(plan: Plan, hw: HardwareProfile, dtype: str, l2: bool, max_steps: int, timeline: bool,
             cold_l2: bool = False, budget: int | None = None):
    """Simulate every kernel of `plan`; returns (kernel results, write-back outside kernels, events, timeline).
    cold_l2: write back and empty L2 before each kernel, as Nsight Compute's default --cache-control all does.
    budget: cohort steps the plan may cost; a kernel that would cost more than its share runs coarse, and
    identical parts of an operator after the second are not simulated again (None: every block simulated)."""
    from .scale import kernel_cost, kernel_costs
    keys = plan.repeat_keys()
    costs = None if budget is None else kernel_costs(plan, hw, max_steps, 2 * budget)
    # each kernel's share of the budget: in proportion to what it would cost (a repeated part counted once)
    total = max(1, sum({key or i: c for i, (key, c) in enumerate(zip(keys, costs))}.values())) if costs else 1
    env = CountingEnvironment()
    tl = Timeline() if timeline else None
    hbm = SharedBandwidth(env, hw.hbm_bytes_per_s, hw.hbm_latency_ns * 1e-9, "hbm", record=timeline)
    use_l2 = l2 and hw.l2_bytes > 0
    l2_tier = SharedBandwidth(env, hw.l2_bytes_per_s, hw.l2_latency_ns * 1e-9, "l2", record=timeline) \
        if use_l2 else None
    cache = L2Cache(hw.l2_holding_bytes, hw.l2_dirty_bytes) if use_l2 else None
    results = []
    outside: Counter = Counter()   # written back between kernels or after the last

    def main():
        launch = hw.kernel_launch_us * 1e-6
        i = 0
        while i < len(plan.kernels):
            k, key = plan.kernels[i], keys[i]
            if cold_l2 and cache is not None:
                outside.update(cache.flush())
                cache.clear()
            if budget is not None and key is not None and i >= 2 and keys[i - 1] == key == keys[i - 2]:
                # the third and later of identical kernels in a row (parts of one operator over a tensor far larger
                # than L2): each does what the one before did, and is not simulated again (L2 keeps its state)
                prev, j = results[-1], i
                while j < len(keys) and keys[j] == key:
                    j += 1
                t0 = env.now
                yield env.timeout((j - i) * (launch + prev.time_s))
                for m in range(j - i):   # (its tallies shared: a kernel's result is not changed once made)
                    r = object.__new__(KernelResult)   # (a shallow copy: copy.copy's protocol costs twice this)
                    r.__dict__.update(prev.__dict__)
                    r.start_s = t0 + m * (launch + prev.time_s) + launch
                    r.end_s = r.start_s + prev.time_s
                    results.append(r)
                i = j
                continue
            yield env.timeout(launch)
            share = cost = None
            if budget is not None:
                share, cost = max(MIN_KERNEL_BUDGET, budget * costs[i] // total), costs[i]
                slots = max(1, k.blocks_per_sm(hw) * hw.sm_count)
                if hasattr(k, "coarsened") and k.n_blocks > MAX_WAVES * slots:
                    # a grid of many more waves than a coarse run dispatches: fewer modelled blocks of more rows
                    k = k.coarsened(MAX_WAVES * slots)
                    cost = kernel_cost(k, hw, max_steps, 2 * share)
            coarse = share is not None and cost > share
            kr = KernelRun(env, k, hw, dtype, hbm, l2_tier, cache, max_steps, tl, i, coarse, share)
            yield from kr.run()
            results.append(kr.r)
            i += 1

    env.process(main())
    env.run()
    if cache is not None:
        outside.update(cache.flush())
    if tl is not None:
        tl.tiers = {"hbm": hbm.intervals or []} | ({"l2": l2_tier.intervals or []} if l2_tier else {})
    return results, outside, env.events, tl
