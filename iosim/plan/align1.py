"""cuBLAS's GEMMs where the rows of their N x N operand are not 16-byte aligned (N not a multiple of 8 at fp16/bf16).

There cuBLAS cannot use its own kernels (TMA needs 16-byte strides) and runs CUTLASS's alignment-1 kernels: on the
H200, every GEMM of the stored records at N 999 and 3001 was `cutlass_75_tensorop_..._s1688gemm_..._align1`
(experiments/cublas_alignment). Such a kernel moves the N x N operand (S or dP written by `qk`; P or dS read by `pv`)
an element at a time, and its time is a sum: the matmul at a fraction of the tensor rate, then the operand's bytes at
a rate an SM sustains a clock (`Fitted.operand_bytes_per_cycle`), the one not hidden under the other. The two shapes
differ (writing the operand vs reading it) and are fitted apart, as families `cublas_align1_qk` and
`cublas_align1_pv`.

Planned as `NaiveKernel`'s GEMMs are, with what differs: no thread-block clusters (an sm_75 kernel has none, each
tile loads its operands: `Cublas.tiles`), no epilogue rate limit of cuBLAS's own kernels (the element-wise stores
are timed by the operand's rate), and each step's operand bytes as SM cycles after its matmul (`Step.pipe_cycles`:
the engine runs a step's matmul and its pipe cycles one after the other). Approximated: the blocks are persistent
as nvjet's are (CUTLASS's are one a tile: the same work an SM over a grid of many tiles), and a short, deep GEMM is
split in one kernel (stream-K) where cuBLAS adds a split-K reduce kernel after it (B1 H1).
"""
from __future__ import annotations

from typing import Callable, Literal

import numpy as np

from ..kernels.cublas import Cublas, GemmTile, rows_aligned
from ..workload import AttentionConfig
from .kernel import KernelPlan, Step, Traits
from .naive import NaiveKernel

FAMILIES = {"qk": "cublas_align1_qk", "pv": "cublas_align1_pv"}


class Align1Gemm(NaiveKernel):
    def __init__(self, cfg: AttentionConfig, kind: Literal["qk", "pv"], traits: Traits, cublas: Cublas,
                 tiles: dict[str, GemmTile] | None = None, names: dict[str, str] | None = None,
                 name: str | None = None):
        super().__init__(cfg, kind, traits, cublas, tiles, names, name)
        self.family = FAMILIES[kind]
        self.store_rate = 1.0
        # the operand's tensor: what qk writes, what pv reads
        self.operand = self._n("S") if kind == "qk" else self._n("P")

    def cohort(self, blocks: np.ndarray, max_steps: int) -> list[Step]:
        steps = super().cohort(blocks, max_steps)
        rate = self.traits.operand_bytes_per_cycle
        if rate:
            for s in steps:
                moved = s.stores if self.kind == "qk" else s.loads
                s.pipe_cycles += sum(a.requested for a in moved if a.tensor == self.operand) / rate
        return steps


def cublas_gemm(cfg: AttentionConfig, kind: Literal["qk", "pv"], traits: Traits,
                traits_of: Callable[[str], Traits], cublas: Cublas, tiles: dict[str, GemmTile] | None = None,
                names: dict[str, str] | None = None, name: str | None = None) -> KernelPlan:
    """The GEMM cuBLAS runs for `kind` in the shape `cfg` (attention's, or the key-major shape of a backward GEMM,
    whose N x N operand is read transposed): its own kernel with `traits` where the operand's rows are 16-byte
    aligned, else an alignment-1 kernel with its family's traits (`traits_of`)."""
    if rows_aligned(cfg):
        return NaiveKernel(cfg, kind, traits, cublas, tiles, names, name)
    return Align1Gemm(cfg, kind, traits_of(FAMILIES[kind]), cublas, tiles, names, name)
