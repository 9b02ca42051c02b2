"""numpy references: exact attention in float64, and the tiled algorithms step for step.

`tiled_attention` runs the same blocks, the same online softmax (running max m and sum l, in base 2 with the
scale folded in, as the CUDA kernels do) and either loop order, so that the kernels' logic can be checked on any
machine. Layout (batch, heads, seq, head_dim); grouped-query heads; causal masks aligned bottom-right.
"""
from __future__ import annotations

import math

import numpy as np

LOG2E = 1.4426950408889634


def causal_mask(nq: int, nk: int) -> np.ndarray:
    """True where query row i may see key j: j <= i + (nk - nq)."""
    return np.arange(nk)[None, :] <= np.arange(nq)[:, None] + (nk - nq)


def reference_attention(q, k, v, causal: bool = False, scale: float | None = None):
    """softmax(scale * Q K^T) V in float64, and the log-sum-exp L of each row (-inf where a row sees nothing)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    b, h, nq, d = q.shape
    group = h // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scale = 1 / math.sqrt(d) if scale is None else scale
    s = scale * np.einsum("bhqd,bhkd->bhqk", q, k)
    if causal:
        s = np.where(causal_mask(nq, k.shape[2]), s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m_safe)
    lsum = p.sum(axis=-1, keepdims=True)
    o = np.einsum("bhqk,bhkd->bhqd", p, v) / np.where(lsum > 0, lsum, 1.0)
    lse = np.where(lsum[..., 0] > 0, m_safe[..., 0] + np.log(np.where(lsum[..., 0] > 0, lsum[..., 0], 1.0)),
                   -np.inf)
    return o, lse


def _tile_update(qi, kj, vj, rows, cols, nk, off, causal, scale_log2, acc, m, l):
    """One (query tile, key tile) step of the online softmax, in place: the kernels' inner loop."""
    s2 = (qi @ kj.T) * scale_log2
    valid = cols[None, :] < nk
    if causal:
        valid = valid & (cols[None, :] <= rows[:, None] + off)
    s2 = np.where(valid, s2, -np.inf)
    m_new = np.maximum(m, s2.max(axis=1))
    m_use = np.where(np.isfinite(m_new), m_new, 0.0)    # a row with nothing seen yet: keep exp2 finite
    corr = np.exp2(m - m_use)
    p = np.exp2(s2 - m_use[:, None])
    l[:] = l * corr + p.sum(axis=1)
    acc[:] = acc * corr[:, None] + p @ vj
    m[:] = m_new


def _finish(acc, m, l):
    o = np.where(l[:, None] > 0, acc / np.where(l > 0, l, 1.0)[:, None], 0.0)
    lse = np.where(l > 0, (m + np.log2(np.where(l > 0, l, 1.0))) / LOG2E, -np.inf)
    return o, lse


def tiled_attention(q, k, v, block_q: int, block_kv: int, loop_order: str = "flash2", causal: bool = False,
                    scale: float | None = None):
    """The tiled forward pass, block by block, in float64. Returns (O, L)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    b, h, nq, d = q.shape
    nk, group = k.shape[2], h // k.shape[1]
    off = nk - nq
    scale_log2 = (1 / math.sqrt(d) if scale is None else scale) * LOG2E
    o = np.zeros_like(q)
    lse = np.full((b, h, nq), -np.inf)
    nqb, nkb = -(-nq // block_q), -(-nk // block_kv)

    def visible_tiles(i):   # K/V tiles query block i visits: those left of its last row's diagonal
        if not causal:
            return nkb
        last = min(nq, (i + 1) * block_q) - 1
        return -(-max(0, min(nk, last + off + 1)) // block_kv)

    for bi in range(b):
        for hi in range(h):
            kh, vh, qh = k[bi, hi // group], v[bi, hi // group], q[bi, hi]
            state = {}
            blocks = [(i, range(visible_tiles(i))) for i in range(nqb)]
            if loop_order == "flash2":
                order = [(i, j) for i, tiles in blocks for j in tiles]
            else:   # flash1: outer loop over K/V tiles, inner over the query blocks that see them
                order = [(i, j) for j in range(nkb) for i, tiles in blocks if j in tiles]
            for i, j in order:
                r0, r1 = i * block_q, min(nq, (i + 1) * block_q)
                c0, c1 = j * block_kv, min(nk, (j + 1) * block_kv)
                if i not in state:
                    state[i] = (np.zeros((r1 - r0, d)), np.full(r1 - r0, -np.inf), np.zeros(r1 - r0))
                acc, m, l = state[i]
                _tile_update(qh[r0:r1], kh[c0:c1], vh[c0:c1], np.arange(r0, r1), np.arange(c0, c1), nk, off,
                             causal, scale_log2, acc, m, l)
            for i in range(nqb):
                r0, r1 = i * block_q, min(nq, (i + 1) * block_q)
                if i in state:
                    o[bi, hi, r0:r1], lse[bi, hi, r0:r1] = _finish(*state[i])
    return o, lse
