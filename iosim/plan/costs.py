"""What one unit of work costs in operations: the single place where iosim defines what it counts.

Tiled attention, per visited (query tile of rq rows, key tile of rk keys) pair, whole tiles (a diagonal tile
that causality half masks is computed whole, as the kernels do):
  - matmul FLOPs: 2*rq*rk*d for S = Q K^T and 2*rq*rk*d for P V;
  - exp: rq*rk for P = exp(S - m), plus rq for the correction factor exp(m_old - m_new);
  - other fp32 work: 4 per score (scale, running max, subtract, running sum) and rq*d to rescale the output.
  Finishing a query tile: rq logarithms (the log-sum-exp; counted with exp on the special-function unit) and
  rq*d to normalise O.
Naive attention: each GEMM 2*rows*keys*d; softmax on every visible score: 1 exp and 4 other (max, subtract,
sum, normalise); masked scores are written as zero without work, and their loads are predicated off.
The backward: `bwd_tile_work`.
"""
from __future__ import annotations

OTHER_PER_SCORE = 4


def tile_work(rq, rk, d, n_tiles=1):
    """(mma, exp, other) for `n_tiles` visited tiles covering rk keys in all, for rq query rows."""
    return 4 * rq * rk * d, rq * rk + rq * n_tiles, OTHER_PER_SCORE * rq * rk + rq * d * n_tiles


# the backward's fp32 work a score: scale and subtract L before the exp, subtract D, multiply by P, scale dS
BWD_OTHER_PER_SCORE = 4


def bwd_tile_work(rq, rk, d):
    """(mma, exp, other) of backward visits of rq query rows to a key tile of rk keys: five GEMMs (S recomputed,
    dP, dV, dK, dQ: 10 rq rk d FLOPs, 2 rq rk d of them the recomputed S), P = exp(S - L) again, and
    BWD_OTHER_PER_SCORE operations a score."""
    return 10 * rq * rk * d, rq * rk, BWD_OTHER_PER_SCORE * rq * rk


def recompute_flops(mma_bwd_flops: int) -> int:
    """The recomputed S's share of a tiled backward's matmul FLOPs: one GEMM of five."""
    return mma_bwd_flops // 5


def finish_work(rq, d):
    """(exp, other) to finish a query tile: log-sum-exp and output normalisation."""
    return rq, rq * d


def combine_work(rows, d, splits):
    """(exp, other) to combine `splits` partial outputs of `rows` rows: a weight exp(lse_s - lse) per split and
    row plus the log of their sum, and a weighted sum of the partial O."""
    return rows * (splits + 1), rows * splits * (d + 2)


def softmax_work(seen):
    """(exp, other) of naive attention's softmax over `seen` visible scores: 1 exp and OTHER_PER_SCORE other
    operations on each."""
    return seen, OTHER_PER_SCORE * seen


# Instructions softmax_rows issues a key (its PTX, per thread, the loops unrolled 4 times): the max and store
# loops visit every key of the row (loop control, shared-memory store or load, max, convert, global store: 11),
# and a visible key adds its load, convert and scale, its exp pass (shared load, subtract, ex2, store, sum) and
# its normalisation (12)
SOFTMAX_ISSUE_PER_KEY = 11
SOFTMAX_ISSUE_PER_VISIBLE = 12


def softmax_issue(keys, seen):
    """Instructions naive attention's softmax issues for rows of `keys` keys in all, `seen` of them visible: what
    holds a row-per-block kernel whose every step is a few dependent instructions, not a pipe's rate."""
    return SOFTMAX_ISSUE_PER_KEY * keys + SOFTMAX_ISSUE_PER_VISIBLE * seen


def gemm_flops(rows, keys, d):
    return 2 * rows * keys * d


# Shared-memory traffic: a tile staged in SRAM is written once and read by every warp that needs it.
GEMM_SMEM_READS = 2   # naive GEMMs: a 2x2 warp grid reads each staged operand twice
