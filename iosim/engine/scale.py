"""Bounded cost: a prediction whose exact simulation would cost more than `BUDGET` runs on fewer heads.

Attention's grid repeats itself over its (batch, head) pairs: every pair does the same work on its own rows, so
past a few waves a kernel's time, bytes and work grow linearly with their number. A plan too costly to simulate
exactly is simulated twice, with r and 2r pairs (the same kernels, tilings and cuBLAS tiles as the full plan),
and each kernel's figures are extrapolated on the line through the two to the full count. With L2 off every byte
and FLOP count is linear in the pairs, so the extrapolation is exact; with L2 on, what L2 holds across kernels
and the first wave's and the tail's effects are those of the reduced runs, which are chosen big enough that their
tensors overflow L2 and their grids span several waves. What is left costly within one pair (a causal grid's
query blocks of as many lengths as there are blocks) is bounded by the engine's coarse dispatch (`run.py`).
"""
from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import fields, replace
from fractions import Fraction

from ..plan import Plan
from ..workload import AttentionConfig
from .result import KernelResult

# cohort steps (a few to a few tens of SimPy events each) a prediction may cost: beyond it, a plan is simulated on
# fewer pairs, and a kernel beyond its share runs coarse (`run.py`). What a prediction then takes:
# benchmarks/prediction_cost.py (docs/model.md, "Speed")
BUDGET = 3000
# the reduced runs keep at least this many times L2's bytes in their tensors and this many waves in each grid
L2_OVERFLOW = 2
MIN_WAVES = 4


def kernel_cost(k, hw, max_steps: int, cap: int) -> int:
    """Cohort steps `k` costs the engine, at most: a cohort per run of one signature (counted up to `cap`) and
    one a wave, each of up to `max_steps` steps."""
    slots = max(1, k.blocks_per_sm(hw) * hw.sm_count)
    runs = sum(1 for _ in itertools.islice(k.runs(), cap))
    waves = -(-k.n_blocks // slots)
    return min(k.n_blocks, runs + waves) * k.cost_steps(hw, max(max_steps, k.least_steps))


def kernel_costs(plan: Plan, hw, max_steps: int, cap: int = 10 * BUDGET) -> list[int]:
    """`kernel_cost` of each kernel (once for each part of an operator split in identical parts)."""
    out: list[int] = []
    prev = None
    for k, key in zip(plan.kernels, plan.repeat_keys()):
        out.append(out[-1] if key is not None and key == prev else kernel_cost(k, hw, max_steps, cap))
        prev = key
    return out


def shape(plan: Plan, hw) -> list[tuple]:
    """What must not change between the full plan and a reduced one: each kernel's name, block and occupancy."""
    return [(k.name, type(k).__name__, k.threads, k.smem_bytes, k.blocks_per_sm(hw), getattr(k, "tiles", None))
            for k in plan.kernels]


def reduced(cfg: AttentionConfig, pairs: int) -> AttentionConfig | None:
    """`cfg` with `pairs` (batch, head) pairs: fewer batches where that reaches it, else one batch of fewer heads
    (a multiple of the group, so every head keeps its key/value head's sharing); None where `pairs` cannot be cut
    that way."""
    if pairs % cfg.heads == 0 and pairs // cfg.heads < cfg.batch:
        return cfg.model_copy(update={"batch": pairs // cfg.heads})
    if pairs < cfg.heads and pairs % cfg.group == 0:
        return cfg.model_copy(update={"batch": 1, "heads": pairs, "kv_heads": pairs // cfg.group})
    return None


def pair_counts(cfg: AttentionConfig, plan: Plan, hw, max_steps: int, cost: int) -> tuple[int, int] | None:
    """(r, 2r): the pair counts of the two reduced runs, or None where no reduction leaves the full count
    unreached. r is the most pairs the budget allows, at least enough for L2 and the waves to be as they are."""
    bh = cfg.bh
    per_pair = max(1, cost // bh)
    r = max(1, BUDGET // (3 * per_pair))   # the two runs cost about 3r pairs
    if hw.l2_bytes:
        r = max(r, -(-L2_OVERFLOW * hw.l2_bytes * bh // max(1, plan.peak_footprint_bytes())))
    for k in plan.distinct():   # each kernel keeps MIN_WAVES waves of its real blocks, or all it has
        slots = max(1, k.blocks_per_sm(hw) * hw.sm_count)
        # real blocks, or a persistent GEMM's work items
        blocks = getattr(k, "n_items", None) or k.n_blocks * k.launches_per_block
        waves = min(MIN_WAVES, -(-blocks // slots))
        r = max(r, -(-waves * slots * bh // max(1, blocks)))
    # round up so that both r and 2r can be cut: whole batches, or (below one batch's heads) groups of heads
    unit = cfg.heads if 2 * r > cfg.heads else cfg.group
    r = -(-r // unit) * unit
    if 3 * r >= bh:   # the two runs would cost more than the full one
        return None
    return r, 2 * r


def lerp(a, b, t: Fraction):
    """a + t (b - a) for the figures of a result: ints stay ints (exact where the figures are linear)."""
    if isinstance(a, Counter):
        return Counter({k: lerp(a.get(k, 0), b.get(k, 0), t) for k in set(a) | set(b)})
    if isinstance(a, bool) or not isinstance(a, (int, float)):
        return b
    v = a + t * (b - a)
    return round(v) if isinstance(a, int) and isinstance(b, int) else float(v)


def extrapolate(k1: KernelResult, k2: KernelResult, t: Fraction, blocks: int) -> KernelResult:
    """The kernel's result at the full count of pairs, from its results at r and 2r (t = (full - r) / r)."""
    out = {f.name: lerp(getattr(k1, f.name), getattr(k2, f.name), t) for f in fields(KernelResult)
           if f.name not in ("name", "blocks", "blocks_per_sm", "partial_writes", "utilisation", "rows_per_block",
                             "far_share", "sm_count")}
    # partial-sector writes, (bytes, requests a sector) each: their bytes by requests grow with the pairs
    w1, w2 = Counter(), Counter()
    for size, req in k1.partial_writes:
        w1[req] += size
    for size, req in k2.partial_writes:
        w2[req] += size
    pw = [(size, req) for req, size in sorted(lerp(w1, w2, t).items())]
    return replace(k2, blocks=blocks, partial_writes=pw, utilisation=dict(k2.utilisation), **out)
