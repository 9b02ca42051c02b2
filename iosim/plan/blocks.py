"""Geometry of row blocks shared by every planned kernel: rows per query block, K/V tiles each one visits."""
from __future__ import annotations

import math

import numpy as np

from ..workload import AttentionConfig


class RowBlocks:
    """Query rows cut into blocks of `block_q`, keys into tiles of `block_kv` (ragged last ones allowed)."""

    def __init__(self, cfg: AttentionConfig, block_q: int, block_kv: int):
        self.cfg, self.block_q, self.block_kv = cfg, block_q, block_kv
        nq, nk = cfg.seqlen_q, cfg.seqlen_k
        self.n_q = math.ceil(nq / block_q)
        self.n_kv = math.ceil(nk / block_kv)
        starts = np.arange(self.n_q, dtype=np.int64) * block_q
        self.rows = np.minimum(block_q, nq - starts)                      # rows present in each query block
        self.rows_before = np.concatenate(([0], np.cumsum(self.rows)))    # rows of query blocks [0, i)
        last_row = starts + self.rows - 1
        if cfg.causal:
            kmax = np.clip(last_row + cfg.causal_offset + 1, 0, nk)       # keys the block's last row sees
        else:
            kmax = np.full(self.n_q, nk, dtype=np.int64)
        self.nvis = -(-kmax // block_kv)                                  # K/V tiles each query block visits
        # leading tiles every row of the block sees whole: the kernels skip the mask there; the rest cross its
        # causal diagonal or the sequence's end (the first row sees the fewest keys)
        first_keys = np.clip(starts + cfg.causal_offset + 1, 0, nk) if cfg.causal else np.full(self.n_q, nk)
        self.interior = np.minimum(first_keys // block_kv, self.nvis)
        self.keys_in = np.minimum(self.nvis * block_kv, nk)               # keys covered by those tiles

    def diagonal_tiles(self, interior, j0, j1):
        """How many of tiles [j0, j1) lie past `interior` (a block's interior tiles): the ones its kernel masks."""
        return np.clip(j1 - np.maximum(j0, interior), 0, None)

    def kv_rows(self, j0: int, j1: int) -> tuple[int, int]:
        """Key rows covered by tiles [j0, j1)."""
        nk = self.cfg.seqlen_k
        return min(j0 * self.block_kv, nk), min(j1 * self.block_kv, nk)

    def kv_head(self, bh: np.ndarray) -> np.ndarray:
        """The key/value head each (batch, query head) reads."""
        cfg = self.cfg
        return (bh // cfg.heads) * cfg.kv_heads + (bh % cfg.heads) // cfg.group
