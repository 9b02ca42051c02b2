"""How long a cohort's step computes: its work at the SM's rates, shared with the blocks resident beside it.

A block runs its matmul and its softmax one after the other (FlashAttention-2: the same warps issue both; a kernel
that overlaps them itself, FlashAttention-3's ping-pong, declares `overlap_softmax`). How co-resident blocks share
the SM is one of two shapes, chosen per kernel family by the fit (`Fitted.latency_rows`): `SoloShare` or
`LatencyHiding`. A block's L1 lookups and its wait on its own re-reads are in its chain, which co-resident blocks
do not cover (three flash1 blocks an SM run at 1.2 times a lone block's rate: 4.2 us an inner step in B32 H16
N512's first wave, 1.68 alone in B1 H1 N1024; experiments/block_placement; a wait they covered would give nearly 3).
"""
from __future__ import annotations

import numpy as np

from ..hardware import HardwareProfile
from ..plan.kernel import KernelPlan, Step


class SMShare:
    """A kernel's per-slot rates: each resident block gets an equal share of its SM's units."""

    def __init__(self, kernel: KernelPlan, hw: HardwareProfile, dtype: str, slots: int):
        tr = kernel.traits
        self.k, self.bps = kernel, kernel.blocks_per_sm(hw)
        self.rate_mma = hw.tensor_flops_per_s(dtype, tr.wgmma) * tr.mma_efficiency / slots
        self.rate_exp = hw.exp_per_s * tr.exp_efficiency / slots
        self.rate_fp32 = hw.fp32_flops_per_s * tr.fp32_efficiency / slots
        self.rate_smem = hw.smem_bytes_per_s / slots
        self.rate_issue = hw.fp32_flops_per_s / 2 * tr.fp32_efficiency / slots   # a lane's FMA (2 flops) a clock
        self.rate_l1 = hw.l1_lines_per_s / slots if hw.l1_lines_per_s else None
        self.rate_cycles = hw.clock_hz * hw.sm_count / slots   # an SM's clocks, each sub-partition's pipes in step
        self.overlap_softmax = tr.overlap_softmax

    def parts(self, s: Step, n: int) -> tuple[float, float, float]:
        """One block's matmul (or shared-memory reads, whichever is longer), softmax and L1 lookups of the step at
        the whole SM's rates (the rates are per slot)."""
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
        return mma, softmax, l1

    def chain(self, mma: float, softmax: float, l1: float, wait_s: float) -> float:
        return (max(mma, softmax) if self.overlap_softmax else mma + softmax) + l1 + wait_s

    def step_s(self, s: Step, n: int, k: int, wait_s: float = 0.0) -> float:
        """The step's time for one of `k` blocks resident on the busiest of the cohort's SMs."""
        raise NotImplementedError


class SoloShare(SMShare):
    """A lone block uses at most `solo_sm_share` of its SM (default: its share at full occupancy); blocks resident
    together overlap one's softmax with another's matmul: k blocks take k times the busier unit's time."""

    def step_s(self, s: Step, n: int, k: int, wait_s: float = 0.0) -> float:
        mma, softmax, l1 = self.parts(s, n)
        chain = self.chain(mma, softmax, l1, wait_s)
        tr = self.k.traits
        solo = tr.solo_sm_share if tr.solo_sm_share is not None else 1.0 / self.bps
        return max((chain - l1 - wait_s) / solo + l1 + wait_s, k * mma, k * softmax, k * (l1 + wait_s))


class LatencyHiding(SMShare):
    """An SM runs at 1 - exp(-R / latency_rows) of its rates, R the query rows of all blocks resident on it, each
    block's chain in turn; `block_overlap` hides that share of co-resident blocks' shorter part, matmul or softmax,
    behind the longer (their warps share the SM's schedulers)."""

    def step_s(self, s: Step, n: int, k: int, wait_s: float = 0.0) -> float:
        mma, softmax, l1 = self.parts(s, n)
        tr = self.k.traits
        busy = k * self.chain(mma, softmax, l1, wait_s)
        if tr.block_overlap and not self.overlap_softmax:
            busy -= (k - 1) * tr.block_overlap * min(mma, softmax)
        return busy / -np.expm1(-k * self.k.rows_per_block / tr.latency_rows)


def sharing_for(kernel: KernelPlan, hw: HardwareProfile, dtype: str, slots: int) -> SMShare:
    cls = LatencyHiding if kernel.traits.latency_rows is not None else SoloShare
    return cls(kernel, hw, dtype, slots)
