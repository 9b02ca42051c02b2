"""Runs a plan's kernels on a hardware profile as a SimPy discrete-event simulation.

Kernels run one after another, each after the launch overhead. A kernel's blocks are dispatched in launch order
to the chip's slots (SMs x blocks per SM by occupancy): the first wave one block an SM before any SM takes a
second (block b on SM b % SMs), later blocks each on the SM running fewest, or where an SM's blocks end together
(`KernelPlan.refill_whole_sms`) into the slots that freed, filling an SM before the next. Blocks with the same
signature that start together (in launch order or not) form a *cohort* and run as one SimPy process: under fair
sharing they progress in lockstep, so a wave of identical blocks costs one process instead of hundreds. A cohort's
steps load (HBM and L2 shared by all transfers in flight), compute (its slots' share of the SMs' tensor,
special-function, fp32 and shared-memory rates), and store; with two or more stages the next step's load overlaps
this step's compute (a deeper pipeline, cuBLAS's, keeps more steps' loads in flight, their bytes served in the order
they were issued). A first-wave block waits at its first masked tile for the code its SM's instruction caches do
not hold (`cold_code_s`).
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
from ..plan.kernel import Access, KernelPlan
from .bandwidth import SharedBandwidth
from .l2 import L2Cache
from .result import KernelResult, Timeline


class CountingEnvironment(simpy.Environment):
    """A SimPy environment that counts the events it schedules (for the speed benchmark)."""

    def __init__(self) -> None:
        super().__init__()
        self.events = 0

    def schedule(self, event, priority=1, delay=0):
        self.events += 1
        super().schedule(event, priority, delay)


class KernelRun:
    def __init__(self, env: CountingEnvironment, kernel: KernelPlan, hw: HardwareProfile, dtype: str,
                 hbm: SharedBandwidth, l2: SharedBandwidth | None, cache: L2Cache | None, max_steps: int,
                 timeline: Timeline | None, index: int = 0):
        self.env, self.k, self.hw, self.hbm, self.l2, self.cache = env, kernel, hw, hbm, l2, cache
        self.index = index   # the kernel's place in its plan: where its code lies
        self.max_steps, self.timeline = max_steps, timeline
        self.bps = kernel.blocks_per_sm(hw)
        slots = self.bps * hw.sm_count
        tr = kernel.traits
        # each resident block gets an equal share of its SM's units
        self.rate_mma = hw.tensor_flops_per_s(dtype) * tr.mma_efficiency / slots
        self.rate_exp = hw.exp_per_s * tr.exp_efficiency / slots
        self.rate_fp32 = hw.fp32_flops_per_s * tr.fp32_efficiency / slots
        self.rate_smem = hw.smem_bytes_per_s / slots
        self.rate_issue = hw.fp32_flops_per_s / 2 * tr.fp32_efficiency / slots   # a lane's FMA (2 flops) a clock
        self.rate_l1 = hw.l1_lines_per_s / slots if hw.l1_lines_per_s else None
        self.rate_cycles = hw.clock_hz * hw.sm_count / slots   # an SM's clocks, each sub-partition's pipes in step
        self.pipe_cycles = 0.0   # the counted builds' non-tensor pipe cycles, for the utilisation
        self.overlap_softmax = tr.overlap_softmax
        self.solo_share, self.latency_rows = tr.solo_sm_share, tr.latency_rows
        self.block_overlap = tr.block_overlap
        self.far_share = hw.l2_far_share if kernel.l2_fabric else 0.0   # of read misses and writes: crossings
        # a kernel whose epilogue holds its stores: they pass through it at store_rate of HBM's rate, whether L2
        # or HBM takes them (the blocks go on; the kernel ends when they have drained)
        self.epilogue = SharedBandwidth(env, kernel.store_rate * hw.hbm_bytes_per_s, 0.0, "epilogue") \
            if kernel.store_rate < 1.0 else None
        self.per_sm = np.zeros(hw.sm_count, dtype=np.int64)   # blocks resident on each SM now
        self.taken = np.zeros(hw.sm_count, dtype=np.int64)   # slots taken on each SM (dispatched or resident)
        self.n_free = slots
        self.runs = iter(kernel.runs())
        self.run_left: tuple | None = None   # (next block, blocks left, signature) of the current run
        self.active = 0
        self.pending_stores: list = []
        self.done = env.event()
        self.r = KernelResult(kernel.name, 0.0, 0.0, kernel.n_blocks, self.bps, sm_count=hw.sm_count,
                              rows_per_block=kernel.rows_per_block, far_share=self.far_share)
        # the block scheduler starts blocks one after another: a cohort starts once it has started all its members
        self.dispatch_s = (hw.block_dispatch_ns or 0.0) * 1e-9 * kernel.launches_per_block
        self.dispatched_until = 0.0
        self._least = 0.0   # the latency bound of the last access timed
        self._last_miss = 0.0  # the share of the last access's read bytes that missed L2 (1 without L2)
        # the first wave's blocks start together and stream the same lines in step (a head's query blocks read
        # its K/V tiles at once): recorded as repeats, which a profiler's counter sees only part of
        # (`iosim.counters`). `lock_reads`: per tensor, sorted [lo, hi, when the first wave last read it], those of
        # the last L2 latency; requests for those lines are repeats
        self.launching = False
        self.lock_reads: dict = {}
        self.merge = kernel.l2_merge and cache is not None
        # the first wave's SMs start the masked loop body at once: code beyond what an SM's instruction caches
        # hold comes through its GPC's cache, shared by the GPC's SMs (experiments/cold_start/first_tile.py)
        self.cold_code_s = 0.0
        if hw.code_fetch_gb_s and hw.code_cache_kib:
            beyond = max(0.0, tr.code_bytes - hw.code_cache_kib * 1024)
            per_gpc = min(kernel.n_blocks, hw.sm_count) / (hw.gpc_count or 1)
            self.cold_code_s = beyond * per_gpc / (hw.code_fetch_gb_s * 1e9)

    def run(self):
        self.r.start_s = self.env.now
        hbm0, l20 = self.hbm.bytes, self.l2.bytes if self.l2 else 0
        code = self.k.traits.code_bytes
        if code and self.cache is not None:
            # fetched beside the floor, not waited on; with L2 off (the paper's two-level model) only data counts.
            # Its latency bound is no block's: the blocks' out-of-phase steps read `_least` of their own loads
            self._access([Access("code", self.index << 32, (self.index << 32) + code)], 1, write=False)
            self._least = 0.0
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
        slots = self.bps * self.hw.sm_count
        tensor = r.mma_flops / (self.rate_mma * slots) / t
        softmax = (self.pipe_cycles / (self.rate_cycles * slots) if self.pipe_cycles else
                   r.exp_ops / (self.rate_exp * slots) + r.other_flops / (self.rate_fp32 * slots)) / t
        sram = r.sram_bytes / (self.rate_smem * slots) / t
        r.utilisation = {
            "hbm": (self.hbm.bytes - hbm0) / (self.hbm.rate * t),
            # the SMs' time in matmul (or shared-memory reads, whichever is longer) plus softmax, as the cohorts
            # spend it; at the kernel's declared efficiencies
            "compute": max(tensor, sram, softmax) if self.overlap_softmax else max(tensor, sram) + softmax,
            "tensor": tensor, "softmax": softmax, "sram": sram,
        }
        if self.l2:
            r.utilisation["l2"] = (self.l2.bytes - l20) / (self.l2.rate * t)

    def _dispatch(self) -> None:
        """Start as many blocks as there are free slots, in launch order; those of one signature form a cohort
        (neighbours in launch order or not: causal query blocks of many heads share signatures)."""
        take = self.n_free
        groups: dict = {}
        # free slots, least-taken SM first (then the lowest SM): the first wave puts block b on SM b % SMs, one
        # block an SM before any SM takes a second, as the device does; a later block goes where fewest run, or
        # with `KernelPlan.refill_whole_sms` into the freed slots an SM at a time. (load, SM, taken): the load
        # orders the SMs; refilling, it stays as the SM had it until the SM is full
        refill = self.k.refill_whole_sms and not self.launching
        sm_heap = [(int(c), sm, int(c)) for sm, c in enumerate(self.taken) if c < self.bps]
        heapq.heapify(sm_heap)
        while take:
            if self.run_left is None or self.run_left[1] == 0:
                nxt = next(self.runs, None)
                if nxt is None:
                    break
                self.run_left = (nxt[0], nxt[1], nxt[2])
            first, left, sig = self.run_left
            n = min(left, take)
            # slots are taken in launch order, whatever the cohort: the block scheduler places blocks in the order
            # they are launched, and which blocks share an SM decides how long its busiest SM takes (causal grids)
            parts = groups.setdefault(sig, ([], []))
            parts[0].append(np.arange(first, first + n, dtype=np.int64))
            for _ in range(n):
                load, sm, c = heapq.heappop(sm_heap)
                parts[1].append(sm)
                if c + 1 < self.bps:
                    heapq.heappush(sm_heap, (load if refill else c + 1, sm, c + 1))
            self.run_left = (first + n, left - n, sig)
            take -= n
        for blocks, sms in groups.values():
            sms = np.asarray(sms, dtype=np.int64)
            np.add.at(self.taken, sms, 1)
            self.n_free -= len(sms)
            self.active += 1
            self.env.process(self._cohort(np.concatenate(blocks) if len(blocks) > 1 else blocks[0], sms,
                                          self.launching))
        if self.active == 0 and not self.done.triggered:
            self.done.succeed()

    def _cohort(self, blocks: np.ndarray, sms: np.ndarray, lock: bool = False):
        env = self.env
        n = len(blocks)
        steps = self.k.cohort(blocks, self.max_steps)
        np.add.at(self.per_sm, sms, 1)
        if self.dispatch_s:
            self.dispatched_until = max(self.dispatched_until, env.now) + n * self.dispatch_s
            yield env.timeout(self.dispatched_until - env.now)
        start = env.now
        stores = []
        if self.k.traits.block_overhead_s > 0:
            yield env.timeout(self.k.traits.block_overhead_s * self.k.launches_per_block)
        # loads in flight: the current step's, and with double buffering `ahead` more steps' (the block's pipeline)
        ahead = self.k.lookahead(len(steps)) if self.k.double_buffered else 0
        pending = deque([self._load(steps[0], n, lock=lock)])
        for s in steps[1:ahead]:
            pending.append(self._prefetch(s, n, pending[-1], lock))
        issued = len(pending)
        load = pending.popleft()
        cold = lock and self.cold_code_s > 0
        for i, step in enumerate(steps):
            if self.k.out_of_phase:
                # its co-resident blocks stream their loads while the others compute, as the cohort's lockstep
                # would not: the step takes its latency chain and compute, or its share of bandwidth if longer
                waits = [load, env.timeout(self._least + self._compute_s(step, n, sms))]
                if step.streams:
                    waits.append(self._access(step.streams, n, write=False))
                if step.reloads:
                    waits.append(self._access(step.reloads, n, write=False))
                yield simpy.AllOf(env, waits)
                if step.stores:
                    stores.append(self._store(step, n))
                if i + 1 < len(steps):
                    load = self._load(steps[i + 1], n, lock=lock)
                continue
            yield load
            nxt = steps[i + 1] if i + 1 < len(steps) else None
            if self.k.double_buffered:
                if issued < len(steps):
                    pending.append(self._prefetch(steps[issued], n, pending[-1], lock) if ahead > 1
                                   else self._load(steps[issued], n, lock=lock))
                    issued += 1
                if pending:
                    load = pending.popleft()
            # later inner steps' tiles, and state re-read from this block's own earlier stores, stream in beside
            # the step's compute (the re-reads last: their share that missed L2 sets the block's wait on them)
            stream = self._access(step.streams, n, write=False) if step.streams else None
            reload = self._access(step.reloads, n, write=False) if step.reloads else None
            wait_s = 0.0
            if step.serial_reloads:
                # each inner step waits on its own re-read once: a memory latency its compute does not cover alone,
                # HBM's for the re-reads that missed L2 and L2's for the rest (the dirty lines they evict are
                # written back behind them, never waited on)
                lat = self.hw.l2_latency_ns + self._last_miss * (self.hw.hbm_latency_ns - self.hw.l2_latency_ns)
                wait_s = step.serial_reloads / n * lat * 1e-9
            dt = self._compute_s(step, n, sms, wait_s)
            if cold and step.masked_tiles:
                dt, cold = dt + self.cold_code_s, False
            waits = [env.timeout(dt)] if dt > 0 else []
            waits += [ev for ev in (stream, reload) if ev is not None]
            if len(waits) == 1:
                yield waits[0]
            elif waits:
                yield simpy.AllOf(env, waits)
            if step.local_bytes and self.l2 is not None:
                stores.append(self._spill(step.local_bytes, n))
            if step.stores:
                stores.append(self._store(step, n))
                if self.k.traits.store_issue_bytes_per_s:   # the block issues them before it moves on or retires
                    yield env.timeout(step.store_bytes() / n / self.k.traits.store_issue_bytes_per_s)
            if nxt is not None and not self.k.double_buffered:
                load = self._load(nxt, n, lock=lock)
        # a block retires once its stores are issued; the kernel, not the block, waits for them to drain
        self.pending_stores += stores
        if self.timeline is not None:
            self.timeline.blocks += [(int(sm), self.k.name, start, env.now, int(b)) for sm, b in zip(sms, blocks)]
        np.add.at(self.per_sm, sms, -1)
        np.add.at(self.taken, sms, -1)
        self.n_free += n
        self.active -= 1
        self._dispatch()

    def _compute_s(self, s: Step, n: int, sms: np.ndarray, wait_s: float = 0.0) -> float:
        r = self.r
        r.mma_flops += s.mma_flops
        r.exp_ops += s.exp_ops
        r.other_flops += s.other_flops
        r.sram_bytes += s.sram_bytes
        self.pipe_cycles += s.pipe_cycles
        # one block's part of the step at the whole SM's rates (the rates are per slot)
        mma = max(s.mma_flops / self.rate_mma, s.sram_bytes / self.rate_smem) / (n * self.bps)
        if s.pipe_cycles:
            # the build's counted pipe cycles: measured at the pipes' own rates, so no efficiency scales them
            softmax = s.pipe_cycles / self.rate_cycles / (n * self.bps)
        else:
            softmax = (s.exp_ops / self.rate_exp + s.other_flops / self.rate_fp32) / (n * self.bps)
        if s.issue:
            softmax = max(softmax, s.issue / self.rate_issue / (n * self.bps))
        mma, softmax = mma * s.compute_scale, softmax * s.compute_scale
        # register-direct global accesses: their warps issue them between the matmuls, each line an L1 lookup
        l1 = s.l1_lines / self.rate_l1 / (n * self.bps) if s.l1_lines and self.rate_l1 else 0.0
        # A block runs its matmul and its softmax one after the other (FlashAttention-2: the same warps issue both;
        # a kernel that overlaps them itself, FlashAttention-3's ping-pong, declares so), at most at `solo` of the
        # SM's rates (default: its share at full occupancy). Blocks resident together share the SM's units but
        # overlap one's softmax with another's matmul: k blocks take k times the busier unit's time. A block's L1
        # lookups are in its chain, and its SM's L1 serves them for all k at its one rate. So is its wait on its own
        # re-reads: co-resident blocks do not cover it (three flash1 blocks an SM run at 1.2 times a lone block's
        # rate: 4.2 us an inner step in B32 H16 N512's first wave, 1.68 alone in B1 H1 N1024;
        # experiments/block_placement/block_trace_h200_2026-12-01; a wait they covered would give nearly 3)
        chain = (max(mma, softmax) if self.overlap_softmax else mma + softmax) + l1 + wait_s
        k = max(1, int(self.per_sm[sms].max()))
        if self.latency_rows is not None:
            # the SM runs its k blocks' chains in turn, at the rate the rows in flight sustain
            busy = k * chain
            if self.block_overlap and not self.overlap_softmax:
                busy -= (k - 1) * self.block_overlap * min(mma, softmax)
            return busy / -np.expm1(-k * self.k.rows_per_block / self.latency_rows)
        solo = self.solo_share if self.solo_share is not None else 1.0 / self.bps
        return max((chain - l1 - wait_s) / solo + l1 + wait_s, k * mma, k * softmax, k * (l1 + wait_s))

    def _load(self, s: Step, n: int, waited_s: float = 0.0, lock: bool = False) -> simpy.Event:
        return self._access(s.loads, n, write=False, waited_s=waited_s, lock=lock)

    def _prefetch(self, s: Step, n: int, before: simpy.Event, lock: bool = False) -> simpy.Event:
        """A deep pipeline's load, issued now: its requests' latency runs from now, but its bytes follow those of
        the loads issued before it (a block's requests are served in order, not all at a share at once)."""
        issued = self.env.now

        def go():
            if not before.triggered:
                yield before
            yield self._load(s, n, self.env.now - issued, lock)
        return self.env.process(go())

    def _latency_bound(self, nbytes: int, hbm_bytes: int, n: int) -> float:
        """Least time one member's loads take when it keeps only `bytes_in_flight` in flight: a memory latency
        (HBM's if any byte comes from there, else L2's) for every such chunk of every real block it stands for."""
        flight, launches = self.k.traits.bytes_in_flight, self.k.launches_per_block
        if not flight or nbytes <= 0:
            return 0.0
        latency_ns = self.hw.hbm_latency_ns if hbm_bytes else self.hw.l2_latency_ns
        return launches * -(-nbytes // (n * launches * flight)) * latency_ns * 1e-9

    def _spill(self, nbytes: int, n: int) -> simpy.Event:
        """Register spills written through L1: L2 writes (crossing partitions as other writes do) that stay in L2,
        their few MB of scratch rewritten in place. Not with L2 off: the paper's two-level model counts data."""
        r = self.r
        r.l2_write_bytes += nbytes
        r.l2_local_bytes += nbytes
        r.l2_fabric_bytes += round(self.far_share * nbytes)
        return self.l2.transfer(nbytes, n)

    def _store(self, s: Step, n: int) -> simpy.Event:
        ev = self._access(s.stores, n, write=True)
        if self.epilogue is None:
            return ev
        return simpy.AllOf(self.env, [ev, self.epilogue.transfer(s.store_bytes(), n)])

    def _access(self, accesses: list, n: int, write: bool, waited_s: float = 0.0, lock: bool = False) -> simpy.Event:
        """Account and time one step's loads or stores. Without L2 every byte goes to HBM; with it, every request
        costs L2 bandwidth, a read miss costs HBM too, and whatever dirty data the access evicts is written back."""
        r, hbm_bytes, l2_bytes, missed = self.r, 0, 0, 0
        for a in accesses:
            size = a.nbytes * a.count
            if self.cache is None:
                (r.hbm_write if write else r.hbm_read)[a.tensor] += size
                hbm_bytes += size
                continue
            hit, miss, wb = self.cache.access(a.tensor, a.lo, a.hi, write=write)
            l2_bytes += size
            if write and a.tensor in self.k.partial_writes:   # requests writing part of a sector: for the counters
                r.partial_writes.append((size, self.k.partial_writes[a.tensor]))
            if self.far_share:
                r.l2_fabric_bytes += round(self.far_share * (size if write else miss))
            if write:
                r.l2_write_bytes += size
            else:
                r.l2_hit_bytes += hit + a.nbytes * (a.count - 1)   # the other requesters find it there
                r.l2_miss_bytes += miss
                r.l2_read_bytes += size
                if lock and self.merge:
                    r.l2_repeat_bytes += self._repeats(a, size)
                if miss:
                    r.hbm_read[a.tensor] += miss
                    hbm_bytes += miss
                    missed += miss
            if wb:
                r.hbm_write.update(wb)
                hbm_bytes += sum(wb.values())
        if not write:
            self._last_miss = 1.0 if self.cache is None else missed / l2_bytes if l2_bytes else 0.0
        least = 0.0 if write else self._latency_bound(l2_bytes if self.cache is not None else hbm_bytes, hbm_bytes, n)
        self._least = least
        # waited_s: how long ago a prefetch's requests went out
        return self._move(hbm_bytes, l2_bytes, n, least, waited_s)

    def _repeats(self, a: Access, size: int) -> int:
        """Bytes of a first-wave read that repeat others' requests: the lines the wave read within an L2 latency
        before, and every request of the cohort's members past the first."""
        ivs = self.lock_reads.get(a.tensor, [])   # sorted disjoint [lo, hi, time]
        now, lo, hi = self.env.now, a.lo, a.hi
        window = self.hw.l2_latency_ns * 1e-9
        seen, out = 0, []
        for iv in ivs:
            b0, b1, t = iv
            if now - t > window:   # too old to be repeated ever again (time only moves on): dropped
                continue
            if b1 <= lo or b0 >= hi:
                out.append(iv)
                continue
            seen += min(b1, hi) - max(b0, lo)
            if b0 < lo:
                out.append([b0, lo, t])
            if b1 > hi:
                out.append([hi, b1, t])
        out.append([lo, hi, now])
        out.sort()
        self.lock_reads[a.tensor] = out
        return size - (a.nbytes - seen)

    def _move(self, hbm_bytes: int, l2_bytes: int, n: int, least_s: float = 0.0,
              waited_s: float = 0.0) -> simpy.Event:
        evs = [self.hbm.transfer(hbm_bytes, n, waited_s)]
        if self.l2 is not None:
            evs.append(self.l2.transfer(l2_bytes, n, waited_s))
        if least_s > 0:
            evs.append(self.env.timeout(least_s))
        return evs[0] if len(evs) == 1 else simpy.AllOf(self.env, evs)


def run_plan(plan: Plan, hw: HardwareProfile, dtype: str, l2: bool, max_steps: int, timeline: bool,
             cold_l2: bool = False):
    """Simulate every kernel of `plan`; returns (kernel results, write-back outside kernels, events, timeline).
    cold_l2: write back and empty L2 before each kernel, as Nsight Compute's default --cache-control all does."""
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
        for i, k in enumerate(plan.kernels):
            if cold_l2 and cache is not None:
                outside.update(cache.flush())
                cache.clear()
            yield env.timeout(hw.kernel_launch_us * 1e-6)
            kr = KernelRun(env, k, hw, dtype, hbm, l2_tier, cache, max_steps, tl, i)
            yield from kr.run()
            results.append(kr.r)

    env.process(main())
    env.run()
    if cache is not None:
        outside.update(cache.flush())
    if tl is not None:
        tl.tiers = {"hbm": hbm.intervals or []} | ({"l2": l2_tier.intervals or []} if l2_tier else {})
    return results, outside, env.events, tl
