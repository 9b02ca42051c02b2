"""Memory-bound kernels over rows: each block reads its rows of some tensors and writes its rows of others.

They are the small kernels around the attention kernels: FlashAttention-2's D = rowsum(dO * O) and its dQ
conversion, the sum of grouped-query gradients, and eager PyTorch's elementwise passes and row softmaxes over S.
A tensor is addressed row-major, `bytes_per_row` a row; one broadcast over the batch and heads (eager PyTorch's
causal mask) repeats every `period` rows.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Iterator

import numpy as np

from .kernel import KernelPlan, Step, Traits, merged

MAX_BLOCKS = 65536   # a grid simulated with more blocks than this lets one modelled block stand for several


@dataclass(frozen=True)
class RowIO:
    tensor: str
    bytes_per_row: int
    times: int = 1             # passes over each row (a row softmax that re-reads a row its SM cannot hold)
    period: int | None = None  # rows after which the tensor repeats (broadcast over batch and heads)
    offset: int = 0            # bytes of the tensor before its first row (one of several parts of a tensor)


class RowKernel(KernelPlan):
    """`rows` rows in blocks of `rows_per_block` (the last may be short): one step a block that loads its rows of
    `loads`, does `exp_per_row` and `other_per_row` operations a row, and stores its rows of `stores`."""

    double_buffered = False

    def __init__(self, name: str, rows: int, loads: list[RowIO], stores: list[RowIO], traits: Traits,
                 rows_per_block: int, threads: int = 256, exp_per_row: int = 0, other_per_row: int = 0,
                 smem_bytes: int = 0, first_row: int = 0, max_blocks: int = MAX_BLOCKS):
        self.name, self.rows, self.traits = name, rows, traits
        self.loads, self.stores = loads, stores
        self.exp_per_row, self.other_per_row = exp_per_row, other_per_row
        self.first_row = first_row
        real = -(-rows // rows_per_block)
        # a grid of more than MAX_BLOCKS blocks is simulated in blocks of several real ones (bytes unchanged)
        self.launches_per_block = max(1, -(-real // max_blocks))
        self.block_rows = rows_per_block * self.launches_per_block
        self.n_blocks = -(-rows // self.block_rows)
        self.rows_per_block = rows_per_block
        self.threads, self.smem_bytes = threads, smem_bytes

    def coarsened(self, max_blocks: int) -> "RowKernel":
        """This kernel with at most `max_blocks` modelled blocks (the engine's coarse runs; bytes unchanged)."""
        k = RowKernel(self.name, self.rows, self.loads, self.stores, self.traits, self.rows_per_block, self.threads,
                      self.exp_per_row, self.other_per_row, self.smem_bytes, self.first_row, max_blocks)
        k.loop, k.placement = self.loop, self.placement
        return k

    def repeat_key(self) -> Hashable:
        # parts of one pass over rows: the same but for `first_row` (and so for the rows of a broadcast tensor)
        return (type(self).__name__, self.name, self.rows, self.block_rows, tuple(self.loads), tuple(self.stores),
                self.exp_per_row, self.other_per_row, self.threads, self.smem_bytes, self.traits)

    def runs(self) -> Iterator[tuple[int, int, Hashable]]:
        last = self.rows - (self.n_blocks - 1) * self.block_rows
        if last == self.block_rows:
            yield 0, self.n_blocks, last
            return
        if self.n_blocks > 1:
            yield 0, self.n_blocks - 1, self.block_rows
        yield self.n_blocks - 1, 1, last

    def cohort(self, blocks: np.ndarray, max_steps: int) -> list[Step]:
        r0 = np.asarray(blocks, dtype=np.int64) * self.block_rows
        r1 = np.minimum(r0 + self.block_rows, self.rows)
        r0, r1 = r0 + self.first_row, r1 + self.first_row
        n = int((r1 - r0).sum())

        def io(items: list[RowIO]) -> list:
            out = []
            for x in items:
                lo = r0 % x.period if x.period else r0
                out += merged(x.tensor, x.offset + lo * x.bytes_per_row, x.offset + (lo + r1 - r0) * x.bytes_per_row,
                              x.times)
            return out
        return [Step(loads=io(self.loads), stores=io(self.stores), exp_ops=self.exp_per_row * n,
                     other_flops=self.other_per_row * n)]

    def bytes_read(self) -> dict[str, int]:
        """Bytes each tensor is read in all (the closed form the engine's counts must meet with L2 off)."""
        out: dict[str, int] = {}
        for x in self.loads:
            out[x.tensor] = out.get(x.tensor, 0) + self.rows * x.bytes_per_row * x.times
        return out

    def bytes_written(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for x in self.stores:
            out[x.tensor] = out.get(x.tensor, 0) + self.rows * x.bytes_per_row * x.times
        return out
