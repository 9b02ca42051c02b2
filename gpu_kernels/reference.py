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


def visible_tiles(i: int, block_q: int, block_kv: int, nq: int, nk: int, causal: bool) -> int:
    """K/V tiles query block i visits: all, or those left of its last row's diagonal (bottom-right aligned)."""
    if not causal:
        return -(-nk // block_kv)
    last = min(nq, (i + 1) * block_q) - 1
    return -(-max(0, min(nk, last + (nk - nq) + 1)) // block_kv)


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

    for bi in range(b):
        for hi in range(h):
            kh, vh, qh = k[bi, hi // group], v[bi, hi // group], q[bi, hi]
            state = {}
            blocks = [(i, range(visible_tiles(i, block_q, block_kv, nq, nk, causal))) for i in range(nqb)]
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


def reference_attention_backward(q, k, v, do, causal: bool = False, scale: float | None = None):
    """Exact gradients (dQ, dK, dV) of softmax(scale * Q K^T) V against dO, in float64; grouped heads' dK and dV
    summed over each group; rows that see no key contribute nothing."""
    q, k, v, do = (np.asarray(x, dtype=np.float64) for x in (q, k, v, do))
    b, h, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    group = h // hkv
    ke, ve = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scale = 1 / math.sqrt(d) if scale is None else scale
    s = scale * np.einsum("bhqd,bhkd->bhqk", q, ke)
    valid = causal_mask(nq, nk) if causal else np.ones((nq, nk), dtype=bool)
    s = np.where(valid, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    p = np.where(valid, np.exp(s - np.where(np.isfinite(m), m, 0.0)), 0.0)
    lsum = p.sum(axis=-1, keepdims=True)
    p = p / np.where(lsum > 0, lsum, 1.0)
    dv = np.einsum("bhqk,bhqd->bhkd", p, do)
    dp = np.einsum("bhqd,bhkd->bhqk", do, ve)
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    dq = scale * np.einsum("bhqk,bhkd->bhqd", ds, ke)
    dk = scale * np.einsum("bhqk,bhqd->bhkd", ds, q)
    return dq, dk.reshape(b, hkv, group, nk, d).sum(2), dv.reshape(b, hkv, group, nk, d).sum(2)


def tiled_attention_backward(q, k, v, o, lse, do, block_q: int, block_kv: int, loop_order: str = "flash2",
                             causal: bool = False, scale: float | None = None):
    """The tiled backward, block by block as the CUDA kernels run it, in float64: P recomputed from Q, K and the
    forward's log-sum-exp L (base 2, scale folded in), D = rowsum(dO * O), dK and dV accumulated per key tile
    over the query blocks that see it, dQ accumulated across key tiles (flash2: by every key tile's block in
    turn, as its atomics do; flash1: key tiles outer, D recomputed at each visit). Returns (dQ, dK, dV)."""
    q, k, v, o, do = (np.asarray(x, dtype=np.float64) for x in (q, k, v, o, do))
    lse = np.asarray(lse, dtype=np.float64)
    b, h, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    group, off = h // hkv, nk - nq
    scale = 1 / math.sqrt(d) if scale is None else scale
    scale_log2 = scale * LOG2E
    nqb, nkb = -(-nq // block_q), -(-nk // block_kv)
    dq = np.zeros_like(q)
    dk_exp = np.zeros((b, h, nk, d))
    dv_exp = np.zeros((b, h, nk, d))
    dsum = (do * o).sum(-1) if loop_order == "flash2" else None   # flash2's first kernel

    for bi in range(b):
        for hi in range(h):
            qh, oh, doh, lh = q[bi, hi], o[bi, hi], do[bi, hi], lse[bi, hi]
            kh, vh = k[bi, hi // group], v[bi, hi // group]
            for j in range(nkb):
                c0, c1 = j * block_kv, min(nk, (j + 1) * block_kv)
                dkj, dvj = np.zeros((c1 - c0, d)), np.zeros((c1 - c0, d))
                for i in (i for i in range(nqb) if visible_tiles(i, block_q, block_kv, nq, nk, causal) > j):
                    r0, r1 = i * block_q, min(nq, (i + 1) * block_q)
                    rows, cols = np.arange(r0, r1), np.arange(c0, c1)
                    s2 = (qh[r0:r1] @ kh[c0:c1].T) * scale_log2
                    ok = np.ones(s2.shape, dtype=bool) if not causal else cols[None, :] <= rows[:, None] + off
                    p = np.where(ok, np.exp2(s2 - np.where(ok, lh[r0:r1, None], 0.0) * LOG2E), 0.0)
                    di = dsum[bi, hi, r0:r1] if dsum is not None else (doh[r0:r1] * oh[r0:r1]).sum(-1)
                    dp = doh[r0:r1] @ vh[c0:c1].T
                    ds = p * (dp - di[:, None])
                    dvj += p.T @ doh[r0:r1]
                    dkj += ds.T @ qh[r0:r1]
                    dq[bi, hi, r0:r1] += ds @ kh[c0:c1]
                dk_exp[bi, hi, c0:c1], dv_exp[bi, hi, c0:c1] = dkj * scale, dvj
    dk = dk_exp.reshape(b, hkv, group, nk, d).sum(2)
    dv = dv_exp.reshape(b, hkv, group, nk, d).sum(2)
    return dq * scale, dk, dv
