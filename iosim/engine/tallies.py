"""A kernel's memory traffic: each step's loads and stores accounted per tier and tensor, and timed on the shared
HBM and L2 bandwidth. Without L2 every byte goes to HBM; with it, every request costs L2 bandwidth, a read miss
costs HBM too, and whatever dirty data an access evicts is written back. What a profiler's counter sees differently
(merged repeats, partial-sector writes) is recorded for `iosim.counters`, not counted here."""
from __future__ import annotations

import simpy

from ..hardware import HardwareProfile
from ..plan.kernel import Access, KernelPlan, Step
from .bandwidth import SharedBandwidth
from .l2 import L2Cache
from .result import KernelResult


class Tallies:
    def __init__(self, env: simpy.Environment, kernel: KernelPlan, hw: HardwareProfile, r: KernelResult,
                 hbm: SharedBandwidth, l2: SharedBandwidth | None, cache: L2Cache | None):
        self.env, self.k, self.hw, self.r = env, kernel, hw, r
        self.hbm, self.l2, self.cache = hbm, l2, cache
        # a read miss or a write homed in the other L2 partition crosses the partitions' fabric, which Nsight's
        # lts__t_bytes counts: the SMs' loads and stores and cuBLAS's TMA tiles alike
        self.far_share = r.far_share
        # a kernel whose epilogue holds its stores: they pass through it at store_rate of HBM's rate, whether L2
        # or HBM takes them (the blocks go on; the kernel ends when they have drained)
        self.epilogue = SharedBandwidth(env, kernel.store_rate * hw.hbm_bytes_per_s, 0.0, "epilogue") \
            if kernel.store_rate < 1.0 else None
        self.least = 0.0       # the latency bound of the last access timed
        self.last_miss = 0.0   # the share of the last access's read bytes that missed L2 (1 without L2)
        # the first wave's blocks start together and stream the same lines in step (a head's query blocks read
        # its K/V tiles at once): recorded as repeats, which a profiler's counter sees only part of
        # (`iosim.counters`). `lock_reads`: per tensor, sorted [lo, hi, when the first wave last read it], those of
        # the last L2 latency; requests for those lines are repeats
        self.lock_reads: dict = {}
        self.merge = kernel.l2_merge and cache is not None

    def count_work(self, s: Step) -> None:
        r = self.r
        r.mma_flops += s.mma_flops
        r.exp_ops += s.exp_ops
        r.other_flops += s.other_flops
        r.sram_bytes += s.sram_bytes

    def load(self, s: Step, n: int, waited_s: float = 0.0, lock: bool = False) -> simpy.Event:
        return self.access(s.loads, n, write=False, waited_s=waited_s, lock=lock, far=s.far_reads)

    def prefetch(self, s: Step, n: int, before: simpy.Event, lock: bool = False) -> simpy.Event:
        """A deep pipeline's load, issued now: its requests' latency runs from now, but its bytes follow those of
        the loads issued before it (a block's requests are served in order, not all at a share at once)."""
        issued = self.env.now

        def go():
            if not before.triggered:
                yield before
            yield self.load(s, n, self.env.now - issued, lock)
        return self.env.process(go())

    def store(self, s: Step, n: int) -> simpy.Event:
        ev = self.access(s.stores, n, write=True, far=s.far_writes)
        if self.epilogue is None:
            return ev
        return simpy.AllOf(self.env, [ev, self.epilogue.transfer(s.store_bytes(), n)])

    def atomic(self, s: Step, n: int) -> simpy.Event:
        """Read-modify-writes, performed in L2: one request of the bytes each (counted with the writes); the lines
        L2 lacks come from HBM and stay dirty there. Without L2 (the paper's two-level model) each is an HBM read and
        an HBM write."""
        r, hbm_bytes, l2_bytes = self.r, 0, 0
        for a in s.atomics:
            size = a.requested
            if self.cache is None:
                r.hbm_read[a.tensor] += size
                r.hbm_write[a.tensor] += size
                hbm_bytes += 2 * size
                continue
            _, miss, wb = self.cache.access(a.tensor, a.lo, a.hi, write=False)
            _, _, wb2 = self.cache.access(a.tensor, a.lo, a.hi, write=True)
            l2_bytes += size
            r.l2_write_bytes += size
            r.l2_atomic_bytes += size
            if self.far_share:
                r.l2_fabric_bytes += round(self.far_share * size)
            if miss:
                r.hbm_read[a.tensor] += miss
                r.l2_miss_bytes += miss
            hbm_bytes += miss
            for w in (wb, wb2):
                if w:
                    r.hbm_write.update(w)
                    hbm_bytes += sum(w.values())
        return self._move(hbm_bytes, l2_bytes, n)

    def spill(self, nbytes: int, n: int) -> simpy.Event:
        """Register spills written through L1: L2 writes (crossing partitions as other writes do) that stay in L2,
        their few MB of scratch rewritten in place. Not with L2 off: the paper's two-level model counts data."""
        r = self.r
        r.l2_write_bytes += nbytes
        r.l2_local_bytes += nbytes
        r.l2_fabric_bytes += round(self.far_share * nbytes)
        return self.l2.transfer(nbytes, n)

    def access(self, accesses: list, n: int, write: bool, waited_s: float = 0.0, lock: bool = False,
               far: dict | None = None) -> simpy.Event:
        """Account and time one step's loads or stores (`waited_s`: how long ago a prefetch's requests went out;
        `far`: bytes by tensor of re-reads or re-writes that L2 no longer holds, `Step.far_reads`)."""
        r, hbm_bytes, l2_bytes, missed = self.r, 0, 0, 0
        for tensor, size in (far or {}).items():   # requests through L2 that miss, or write back at once
            (r.hbm_write if write else r.hbm_read)[tensor] += size
            hbm_bytes += size
            l2_bytes += size
            if self.cache is None:
                continue
            r.l2_fabric_bytes += round(self.far_share * size)
            if write:
                r.l2_write_bytes += size
            else:
                r.l2_read_bytes += size
                r.l2_miss_bytes += size
                missed += size
        if self.cache is None:
            for a in accesses:
                size = a.requested
                (r.hbm_write if write else r.hbm_read)[a.tensor] += size
                hbm_bytes += size
        elif accesses:
            # (the hottest loop of a prediction: a look-up of every range; sums kept locally, added once)
            look, partial, fs = self.cache.access, self.k.partial_writes, self.far_share
            repeats = lock and self.merge and not write
            hbm_read, hbm_write = r.hbm_read, r.hbm_write
            requested = fabric = hits = misses = 0
            for a in accesses:
                size = a.requested
                hit, miss, wb = look(a.tensor, a.lo, a.hi, write)
                requested += size
                if write:
                    if a.tensor in partial:   # requests writing part of a sector: for the counters
                        r.partial_writes.append((size, partial[a.tensor]))
                    if fs:
                        fabric += round(fs * size)
                else:
                    if fs:
                        fabric += round(fs * miss)
                    hits += hit + size - (a.hi - a.lo)   # the other requesters find it there
                    if repeats:
                        r.l2_repeat_bytes += self._repeats(a, size)
                    if miss:
                        hbm_read[a.tensor] += miss
                        misses += miss
                if wb:
                    for tensor, nbytes in wb.items():
                        hbm_write[tensor] += nbytes
                        hbm_bytes += nbytes
            l2_bytes += requested
            hbm_bytes += misses
            missed += misses
            r.l2_fabric_bytes += fabric
            if write:
                r.l2_write_bytes += requested
            else:
                r.l2_read_bytes += requested
                r.l2_hit_bytes += hits
                r.l2_miss_bytes += misses
        if not write:
            self.last_miss = 1.0 if self.cache is None else missed / l2_bytes if l2_bytes else 0.0
        least = 0.0 if write else self._latency_bound(l2_bytes if self.cache is not None else hbm_bytes, hbm_bytes, n)
        self.least = least
        return self._move(hbm_bytes, l2_bytes, n, least, waited_s)

    def _latency_bound(self, nbytes: int, hbm_bytes: int, n: int) -> float:
        """Least time one member's loads take when it keeps only `bytes_in_flight` in flight: a memory latency
        (HBM's if any byte comes from there, else L2's) for every such chunk of every real block it stands for."""
        flight, launches = self.k.traits.bytes_in_flight, self.k.launches_per_block
        if not flight or nbytes <= 0:
            return 0.0
        latency_ns = self.hw.hbm_latency_ns if hbm_bytes else self.hw.l2_latency_ns
        return launches * -(-nbytes // (n * launches * flight)) * latency_ns * 1e-9

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
