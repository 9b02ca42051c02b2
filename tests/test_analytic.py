"""Exact counts against hand-computed values, the plans' step sums, and the paper's Theorem 2 asymptotics."""
import math
from collections import Counter
from pathlib import Path

import numpy as np

import pytest
from hypothesis import assume, given, settings, strategies as st

from iosim.analytic import analyze
from iosim.engine import simulate
from iosim.errors import IosimError
from iosim.hardware import load_profile
from iosim.kernels.cublas import HOPPER, Cublas, GemmTile
from iosim.plan import Tiling, build_plan
from iosim.workload import AttentionConfig

KB = 1024


def tensors(a):
    return {t: rw for t, rw in a.per_tensor().items()}


def test_naive_counts_by_hand(h200):
    # B1 H1 N256 d64 fp16: Q, K, V, O are 32 KiB each; S and P are 128 KiB. qk in cuBLAS's tiles for 256 queries
    # of a busy chip: 2x2 tiles of 128x128 in clusters of two key tiles, so each query strip is loaded once for both
    # and each key tile by both strips; pv: two 128-row strips of O in one cluster, which loads V once, split
    # stream-K into their four 64-key slices (8 blocks on 132 SMs): 3 fp32 partials of 128x64 a strip, written
    # and read back
    tiles = {"qk": GemmTile(128, 128, 2, 1), "pv": GemmTile(64, 128, 1, 2)}
    a = analyze(AttentionConfig(batch=1, heads=1, seqlen_q=256, head_dim=64), "naive", h200, gemm_tiles=tiles)
    assert tensors(a) == {"Q": (32 * KB, 0), "K": (2 * 32 * KB, 0), "S": (128 * KB, 128 * KB),
                          "P": (128 * KB, 128 * KB), "V": (32 * KB, 0), "O": (0, 32 * KB),
                          "Opart": (2 * 3 * 32 * KB, 2 * 3 * 32 * KB)}
    assert a.mma_flops == 4 * 256 * 256 * 64
    assert a.exp_ops == 256 * 256
    assert a.peak_footprint_bytes == 3 * 32 * KB + 2 * 128 * KB       # Q, K, V, S and P alive in the softmax


def test_naive_counts_follow_the_gemm_tiles(h200):
    # the same layer in other tiles: qk 64 keys x 128 queries, no cluster: Q_i by each of 4 key tiles, K_j by
    # each of 2 strips; pv 32 of d's 64 columns x 64 queries in clusters of two across d: P read once a cluster
    # (twice without), V by each of 4 strips; the stream-K split of pv's 4 strips into 16 units: 3 partials a strip
    cfg = AttentionConfig(batch=1, heads=1, seqlen_q=256, head_dim=64)
    a = analyze(cfg, "naive", h200, gemm_tiles={"qk": GemmTile(64, 128), "pv": GemmTile(32, 64, 2, 1)})
    assert tensors(a) == {"Q": (4 * 32 * KB, 0), "K": (2 * 32 * KB, 0), "S": (128 * KB, 128 * KB),
                          "P": (128 * KB, 128 * KB), "V": (4 * 32 * KB, 0), "O": (0, 32 * KB),
                          "Opart": (4 * 3 * 16 * KB, 4 * 3 * 16 * KB)}
    b = analyze(cfg, "naive", h200, gemm_tiles={"qk": GemmTile(128, 128, 2, 1), "pv": GemmTile(32, 64)})
    assert tensors(b)["P"] == (2 * 128 * KB, 128 * KB)
    assert tensors(b)["Q"] == (32 * KB, 0)
    # what the engine moves with L2 off is what the counts say, in these tiles and in cuBLAS's own
    for tiles in ({"qk": GemmTile(64, 128), "pv": GemmTile(32, 64, 2, 1)}, {"pv": GemmTile(32, 64)}, None):
        r = simulate(cfg, "naive", h200, l2=False, gemm_tiles=tiles)
        assert r.per_tensor() == analyze(cfg, "naive", h200, gemm_tiles=tiles).per_tensor()


def test_cublas_tiles_shrink_to_fit_a_small_shared_memory():
    # P V's 64 x 512 tile takes 147 KiB in two stages: a chip with 96 KiB an SM (V100's) gets narrower tiles, and
    # naive attention still plans, with the engine's counts equal to the analytic ones
    h200 = load_profile("h200_sxm")
    small = h200.replace(smem_per_sm_kib=96, smem_per_block_kib=96)
    cfg = AttentionConfig(batch=4, heads=16, seqlen_q=4096, head_dim=64)
    assert build_plan(cfg, "naive", h200).kernels[2].tiles["pv"] == GemmTile(64, 512, 1, 2)
    plan = build_plan(cfg, "naive", small)
    assert plan.kernels[2].tiles["pv"] == GemmTile(64, 256, 1, 2)
    assert all(k.blocks_per_sm(small) >= 1 for k in plan.kernels)
    assert simulate(cfg, "naive", small, l2=False, max_steps=4).per_tensor() == \
        analyze(cfg, "naive", small).per_tensor()


def test_gemm_tiles_from_cublas_names_and_bad_tiles():
    assert GemmTile.from_kernel_name("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT") == GemmTile(256, 128, 1, 2, 4)
    assert GemmTile.from_kernel_name("nvjet_sm90_hsh_64x512_64x2_1x2_h_bz_coopB_NNT") == GemmTile(64, 512, 1, 2)
    assert GemmTile.from_kernel_name("nvjet_sm90_hsh_64x8_64x16_1x4_h_bz_NNT") == GemmTile(64, 8, 1, 4, 16)
    assert GemmTile.from_kernel_name(
        "void cutlass::Kernel2<cutlass_80_tensorop_f16_s16816gemm_f16_256x128_32x3_tn_align2>(T1::Params)") == \
        GemmTile(256, 128, stages=3)
    assert GemmTile.from_kernel_name("void flash2_fwd<64, 64, 64, 4, 2, 1>(...)") is None
    with pytest.raises(IosimError, match="GemmTile cn must be an integer from 1 to 4096, got 0"):
        GemmTile(128, 128, 1, 0)
    with pytest.raises(IosimError, match="GemmTile stages must be an integer from 1 to 64, got 0"):
        GemmTile(128, 128, stages=0)
    with pytest.raises(IosimError, match="GEMM tiles are given for 'qk' and 'pv' only, got softmax"):
        analyze(AttentionConfig(batch=1, heads=1, seqlen_q=256, head_dim=64), "naive", load_profile("h200_sxm"),
                gemm_tiles={"softmax": GemmTile(64, 64)})


def test_cublas_tiles_are_those_the_records_ran_on_most_shapes():
    # the stored naive records name the tiles cuBLAS ran; Cublas.tile, which the engine takes where no
    # name is given, picks the same on most (60 and 50 of the 71 records on 2026-12-01), and on every record of
    # batch x heads >= 64 at N >= 1024 (the busy grids: 256 x 128 and 64 x 512 / 128 x 256, clusters of two)
    from iosim.validate import load_records
    root = Path(__file__).parent.parent / "reports/measurements"
    same, n = {"qk": 0, "pv": 0}, 0
    for folder in ("h200", "h200_calibration2", "h200_holdout"):
        for rec in load_records(root / folder):
            if rec["algorithm"] != "naive" or not rec.get("ncu"):
                continue
            cfg = AttentionConfig.make(**rec["config"])
            names = [k["name"] for k in rec["ncu"]["kernels"]]
            n += 1
            for kind, name in (("qk", names[0]), ("pv", names[-1])):
                ran, ours = GemmTile.from_kernel_name(name), Cublas(HOPPER, 132).tile(cfg, kind)
                hit = ran is not None and (ran.m, ran.n) == (ours.m, ours.n)
                same[kind] += hit
                if cfg.bh >= 64 and cfg.seqlen_q >= 1024 and cfg.seqlen_q % 512 == 0:
                    assert ran == ours, (rec["key"], kind, ran, ours)
    assert n >= 70 and same["qk"] >= 0.8 * n and same["pv"] >= 0.65 * n


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
                for a in s.loads + s.streams + s.reloads:
                    reads[a.tensor] += a.nbytes * a.count
                for a in s.stores + s.atomics:
                    writes[a.tensor] += a.nbytes * a.count
                for a in s.atomics:
                    reads[a.tensor] += a.nbytes * a.count
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
                # in fixed tiles: cuBLAS's own narrow as a lone head's grid shrinks (`Cublas.tile`)
                std = analyze(cfg, "naive", hw, gemm_tiles={"qk": GemmTile(128, 128),
                                                            "pv": GemmTile(128, 128)}).hbm_bytes / 2
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
