"""How a kernel's blocks behave where kernels differ, as small strategy objects a plan sets (SimPy's style: a
subclass with one method). The engine calls them; they use only what the engine passes them.

- `Placement`: which SM a block after the first wave goes to.
- `StepLoop`: how a cohort's steps overlap their loads, compute and stores.
"""
from __future__ import annotations

from collections import deque

import simpy


class Placement:
    """The first wave one block an SM before any SM takes a second (block b on SM b % SMs), as the device does;
    a later block on the SM running fewest. SMs are kept in a heap by a key; `key` gives an SM's key once it has
    taken one more block (`taken` its blocks now, `key_before` its key before)."""

    def key(self, key_before: int, taken: int, launching: bool) -> int:
        return taken


class FillWholeSMs(Placement):
    """Blocks after the first wave take the slots that freed an SM at a time: where an SM's pace is its memory
    path's (flash1's blocks wait on their own HBM re-reads), the blocks on an SM end together and the SMs tens of us
    apart, so the first SMs to free take the later blocks whole (the block trace of flash1 B32 H16 N512: first-wave
    ends within an SM 8.6 us apart, across SMs over 40 us; its 116 later blocks went 3 an SM to 25 SMs, 2 to 10 and
    1 to 21; `experiments/block_placement`). flash2's SMs keep pace (within an SM 0.6-3.6 us, across 1.0-2.5): it
    spreads."""

    def key(self, key_before: int, taken: int, launching: bool) -> int:
        return taken if launching else key_before


class StepLoop:
    """Steps in order: a step waits for its loads, computes, then issues its stores; with two or more stages the
    next steps' loads are in flight during this step's compute (a deeper pipeline, cuBLAS's, keeps more)."""

    starts_loaded = False   # a block after the first wave finds its first loads in (`PersistentLoop`)

    def run(self, kr, steps: list, n: int, sms, lock: bool, stores: list, credit: float = 0.0):
        """The cohort's steps as a SimPy process body; `kr` is the engine's kernel run, `stores` collects the
        store events the kernel (not the block) waits for, `credit` is compute time the cohort has already had
        (the engine's coarse dispatch: the time its slots stood free before it started)."""
        env, k, t = kr.env, kr.k, kr.tallies
        ahead = k.lookahead(len(steps)) if k.double_buffered else 0
        pending = deque([t.load(steps[0], n, lock=lock)])
        for s in steps[1:ahead]:
            pending.append(t.prefetch(s, n, pending[-1], lock))
        issued = len(pending)
        load = pending.popleft()
        cold = lock and kr.cold_code_s > 0
        for i, step in enumerate(steps):
            if i or lock or not self.starts_loaded:
                yield load
            nxt = steps[i + 1] if i + 1 < len(steps) else None
            if k.double_buffered:
                if issued < len(steps):
                    pending.append(t.prefetch(steps[issued], n, pending[-1], lock) if ahead > 1
                                   else t.load(steps[issued], n, lock=lock))
                    issued += 1
                if pending:
                    load = pending.popleft()
            # later inner steps' tiles, and state re-read from this block's own earlier stores, stream in beside
            # the step's compute (the re-reads last: their share that missed L2 sets the block's wait on them)
            stream = t.access(step.streams, n, write=False, far=step.far_streams) \
                if step.streams or step.far_streams else None
            reload = t.access(step.reloads, n, write=False, far=step.far_reloads) \
                if step.reloads or step.far_reloads else None
            wait_s = 0.0
            if step.serial_reloads:
                # each inner step waits on its own re-read once: a memory latency its compute does not cover alone,
                # HBM's for the re-reads that missed L2 and L2's for the rest (the dirty lines they evict are
                # written back behind them, never waited on)
                hw = kr.hw
                lat = hw.l2_latency_ns + t.last_miss * (hw.hbm_latency_ns - hw.l2_latency_ns)
                wait_s = step.serial_reloads / n * lat * 1e-9
            dt = kr.compute_s(step, n, sms, wait_s)
            if credit:
                dt, credit = max(0.0, dt - credit), max(0.0, credit - dt)
            if cold and step.masked_tiles:
                dt, cold = dt + kr.cold_code_s, False
            waits = [env.timeout(dt)] if dt > 0 else []
            waits += [ev for ev in (stream, reload) if ev is not None]
            if len(waits) == 1:
                yield waits[0]
            elif waits:
                yield simpy.AllOf(env, waits)
            if step.local_bytes and kr.l2 is not None:
                stores.append(t.spill(step.local_bytes, n))
            if step.atomics:
                stores.append(t.atomic(step, n))
            if step.stores or step.far_writes:
                stores.append(t.store(step, n))
                if k.traits.store_issue_bytes_per_s:   # the block issues them before it moves on or retires
                    yield env.timeout(step.store_bytes() / n / k.traits.store_issue_bytes_per_s)
            if nxt is not None and not k.double_buffered:
                load = t.load(nxt, n, lock=lock)


class PersistentLoop(StepLoop):
    """A persistent grid's work tiles, each planned as a block: one after the first on its SM finds its first loads
    already in, since the producer issued them under the tile before (their bytes still move, beside its compute)."""

    starts_loaded = True


class OutOfPhase(StepLoop):
    """Many short single-step blocks an SM whose phases drift apart (naive's softmax rows): one block's loads stream
    while another computes, where a cohort in lockstep would load all at once and then compute with HBM idle. A
    step takes its latency chain and compute, or its share of bandwidth if longer."""

    def run(self, kr, steps: list, n: int, sms, lock: bool, stores: list, credit: float = 0.0):
        env, t = kr.env, kr.tallies
        load = t.load(steps[0], n, lock=lock)
        for i, step in enumerate(steps):
            dt = kr.compute_s(step, n, sms)
            if credit:
                dt, credit = max(0.0, dt - credit), max(0.0, credit - dt)
            waits = [load, env.timeout(t.least + dt)]
            if step.streams:
                waits.append(t.access(step.streams, n, write=False))
            if step.reloads:
                waits.append(t.access(step.reloads, n, write=False))
            yield simpy.AllOf(env, waits)
            if step.atomics:
                stores.append(t.atomic(step, n))
            if step.stores:
                stores.append(t.store(step, n))
            if i + 1 < len(steps):
                load = t.load(steps[i + 1], n, lock=lock)
