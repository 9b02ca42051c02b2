"""Exact counts against hand-computed values, the plans' step sums, and the paper's Theorem 2 asymptotics."""
import math
from collections import Counter

import numpy as np

import pytest
from hypothesis import assume, given, settings, strategies as st

from iosim.analytic import analyze
from iosim.plan import Tiling, build_plan
from iosim.workload import AttentionConfig

KB = 1024


def tensors(a):
    return {t: rw for t, rw in a.per_tensor().items()}


def test_naive_counts_by_hand(h200):
    # B1 H1 N256 d64 fp16: Q, K, V, O are 32 KiB each; S and P are 128 KiB. qk: 2x2 tiles of 128x128, each
    # reading its query strip and key tile; pv: four 64-row strips of O, each reading all of V, split stream-K
    # into its four 64-key slices (16 blocks on 132 SMs): 3 fp32 partials of 64x64 a strip, written and read back
    a = analyze(AttentionConfig(batch=1, heads=1, seqlen_q=256, head_dim=64), "naive", h200)
    assert tensors(a) == {"Q": (2 * 32 * KB, 0), "K": (2 * 32 * KB, 0), "S": (128 * KB, 128 * KB),
                          "P": (128 * KB, 128 * KB), "V": (4 * 32 * KB, 0), "O": (0, 32 * KB),
                          "Opart": (4 * 3 * 16 * KB, 4 * 3 * 16 * KB)}
    assert a.mma_flops == 4 * 256 * 256 * 64
    assert a.exp_ops == 256 * 256
    assert a.peak_footprint_bytes == 3 * 32 * KB + 2 * 128 * KB       # Q, K, V, S and P alive in the softmax


def test_flash2_counts_by_hand(h200):
    t = Tiling(block_q=128, block_kv=128)
    a = analyze(AttentionConfig(batch=1, heads=1, seqlen_q=256, head_dim=64), "flash2", h200, t)
    # each of the 2 query blocks reads Q_i once and both K/V tiles
    assert tensors(a) == {"Q": (32 * KB, 0), "K": (64 * KB, 0), "V": (64 * KB, 0), "O": (0, 32 * KB),
                          "L": (0, 256 * 4)}
    assert a.mma_flops == 4 * 256 * 256 * 64
    # exp: every score, one correction per (row, tile), one log per row
    assert a.exp_ops == 256 * 256 + 256 * 2 + 256
    assert a.peak_footprint_bytes == 4 * 32 * KB + 256 * 4


def test_flash2_causal_skips_masked_tiles(h200):
    t = Tiling(block_q=128, block_kv=128)
    a = analyze(AttentionConfig(batch=1, heads=1, seqlen_q=256, head_dim=64, causal=True), "flash2", h200, t)
    # query block 0 visits tile 0; block 1 visits tiles 0 and 1: 3 tiles of 128 keys
    assert tensors(a)["K"] == (3 * 16 * KB, 0)
    assert a.mma_flops == 4 * 64 * 128 * (128 + 256)
    full = analyze(AttentionConfig(batch=1, heads=1, seqlen_q=256, head_dim=64), "flash2", h200, t)
    assert a.mma_flops == full.mma_flops * 3 // 4


def test_flash1_counts_by_hand(h200):
    t = Tiling(block_q=128, block_kv=128, loop_order="flash1")
    a = analyze(AttentionConfig(batch=1, heads=1, seqlen_q=256, head_dim=64), "flash1", h200, t)
    # K, V once; Q at each of Tc = 2 outer steps; O (fp32), m, l re-read and re-written once (after tile 0)
    assert tensors(a) == {"K": (32 * KB, 0), "V": (32 * KB, 0), "Q": (64 * KB, 0),
                          "Oacc": (256 * 64 * 4, 256 * 64 * 4), "m": (1 * KB, 1 * KB), "l": (1 * KB, 1 * KB),
                          "O": (0, 32 * KB), "L": (0, 1 * KB)}


def test_gqa_reads_shared_kv_heads_per_query_head(h200):
    mha = analyze(AttentionConfig(batch=2, heads=8, seqlen_q=512), "flash2", h200)
    gqa = analyze(AttentionConfig(batch=2, heads=8, kv_heads=2, seqlen_q=512), "flash2", h200)
    assert tensors(gqa)["K"] == tensors(mha)["K"]            # every query block still loads its tiles
    assert gqa.peak_footprint_bytes < mha.peak_footprint_bytes   # but K and V are 4x smaller in HBM


def test_roofline_names_the_bound(a100, h200):
    naive = analyze(AttentionConfig(), "naive", a100)
    assert naive.bound == "hbm"
    assert naive.time_bound_s == pytest.approx(naive.hbm_bytes / 1555e9, rel=0.02)
    big_d = analyze(AttentionConfig(batch=4, heads=8, seqlen_q=8192, head_dim=128), "flash2",
                    h200.replace(hbm_bandwidth_gb_s=48000, l2_bandwidth_gb_s=96000))
    assert big_d.bound == "tensor"
    assert big_d.time_bound_s == pytest.approx(big_d.mma_flops / 989.4e12)


def plan_sums(cfg, algorithm, hw, tiling=None):
    reads, writes, work = Counter(), Counter(), [0, 0, 0]
    for k in build_plan(cfg, algorithm, hw, tiling).kernels:
        for first, count, _ in k.runs():
            for s in k.cohort(np.arange(first, first + count), max_steps=5):
                for a in s.loads + s.reloads:
                    reads[a.tensor] += a.nbytes * a.count
                for a in s.stores:
                    writes[a.tensor] += a.nbytes * a.count
                work = [work[0] + s.mma_flops, work[1] + s.exp_ops, work[2] + s.other_flops]
    return +reads, +writes, work


configs = st.builds(
    lambda b, h, g, nq, nk, d, causal, dt: AttentionConfig(batch=b, heads=h * g, kv_heads=h, seqlen_q=nq,
                                                           seqlen_k=nk, head_dim=d, causal=causal, dtype=dt),
    st.integers(1, 3), st.integers(1, 3), st.sampled_from([1, 2]), st.integers(1, 700), st.integers(1, 700),
    st.sampled_from([32, 64, 96, 128]), st.booleans(), st.sampled_from(["fp16", "bf16", "fp32"]))
tilings = st.builds(lambda bq, bkv, order, stages, splits: Tiling(block_q=bq, block_kv=bkv, loop_order=order,
                                                                  stages=stages,
                                                                  kv_splits=splits if order == "flash2" else 1),
                    st.sampled_from([16, 64, 128]), st.sampled_from([16, 32, 64, 128]),
                    st.sampled_from(["flash1", "flash2"]), st.sampled_from([1, 2]), st.sampled_from([1, 1, 2, 3]))


@settings(max_examples=120, deadline=None)
@given(cfg=configs, tiling=tilings)
def test_closed_forms_equal_the_plans_step_sums(h200, cfg, tiling):
    assume(tiling.smem_bytes(cfg) <= h200.smem_per_block_bytes)
    for algorithm, til in (("naive", None), (tiling.loop_order, tiling)):
        a = analyze(cfg, algorithm, h200, til)
        reads, writes, work = plan_sums(cfg, algorithm, h200, til)
        pt = a.per_tensor()
        assert reads == +Counter({t: r for t, (r, _) in pt.items()})
        assert writes == +Counter({t: w for t, (_, w) in pt.items()})
        assert work == [a.mma_flops, a.exp_ops, a.other_flops]


# ---- Theorem 2: standard attention Θ(Nd + N²) HBM accesses, FlashAttention Θ(N² d² / M) -------------------

def test_theorem2_asymptotics(a100):
    ratios_flash, ratios_std = [], []
    for n in (1024, 2048, 4096, 8192, 16384):
        for d in (32, 64, 128):
            for m_kib in (64, 96, 163, 227):
                hw = a100.replace(smem_per_block_kib=m_kib, smem_per_sm_kib=max(m_kib, 164))
                cfg = AttentionConfig(batch=1, heads=1, seqlen_q=n, head_dim=d)
                tiling = Tiling.paper(cfg, hw)
                if tiling.smem_bytes(cfg) > hw.smem_per_block_bytes:
                    continue   # the paper's sizes assume d small against M; they do not fit every pair
                m = hw.smem_per_block_bytes // 2                                     # SRAM in elements
                flash = analyze(cfg, "flash1", hw, tiling).hbm_bytes / 2
                std = analyze(cfg, "naive", hw).hbm_bytes / 2
                ratios_flash.append(flash / (n * n * d * d / m))
                ratios_std.append(std / (n * d + n * n))
    # bounded above and below by constants over a 16x range of N, 4x of d and 3.5x of M
    assert len(ratios_flash) >= 40
    assert max(ratios_flash) / min(ratios_flash) < 4
    assert max(ratios_std) / min(ratios_std) < 2
    # and it is the SRAM size that buys it: doubling M roughly halves the tiled traffic at long N
    cfg = AttentionConfig(batch=1, heads=1, seqlen_q=16384, head_dim=64)
    small, large = (a100.replace(smem_per_block_kib=k) for k in (64, 128))  # M and 2M
    t_small = analyze(cfg, "flash1", small, Tiling.paper(cfg, small)).hbm_bytes
    t_large = analyze(cfg, "flash1", large, Tiling.paper(cfg, large)).hbm_bytes
    assert t_small / t_large == pytest.approx(2, rel=0.1)


def test_tiled_moves_far_less_than_naive_on_the_paper_layer(a100):
    naive = analyze(AttentionConfig(), "naive", a100)
    flash = analyze(AttentionConfig(), "flash2", a100)
    assert flash.mma_flops == naive.mma_flops == 4 * 64 * 16 * 1024 ** 2 * 64
    assert naive.hbm_bytes / flash.hbm_bytes > 4
    assert naive.peak_footprint_bytes > 8 * flash.peak_footprint_bytes
    assert math.isclose(naive.intensity * naive.hbm_bytes, naive.mma_flops)


@settings(max_examples=80, deadline=None)
@given(cfg=configs, tiling=tilings, grid=st.sampled_from(["q_fastest", "bh_fastest"]),
       q_order=st.sampled_from(["ascending", "descending"]), splits=st.sampled_from([1, 2, 3]), data=st.data())
def test_flash2_one_block_fast_path_equals_the_general_path(h200, cfg, tiling, grid, q_order, splits, data):
    t = tiling.model_copy(update={"loop_order": "flash2", "grid_order": grid, "q_order": q_order,
                                  "kv_splits": splits})
    assume(t.smem_bytes(cfg) <= h200.smem_per_block_bytes)
    k = build_plan(cfg, "flash2", h200, t).kernels[0]
    b = data.draw(st.integers(0, k.n_blocks - 1))
    assert k._single(b, 5) == k._many(np.array([b]), 5)
