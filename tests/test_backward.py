"""The backward pass and the training step: exact counts, the engine's agreement with them, recomputation and
the memory it saves."""
from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from iosim.analytic import analyze
from iosim.engine import simulate
from iosim.errors import IosimError
from iosim.plan import Tiling, build_plan
from iosim.workload import AttentionConfig

from test_analytic import plan_sums

GPT2 = dict(batch=64, heads=16, seqlen_q=1024, head_dim=64)


def cfg_of(p="backward", **kw):
    return AttentionConfig(**(GPT2 | kw), **{"pass": p})


configs = st.builds(
    lambda b, h, g, nq, nk, d, causal, dt, p: AttentionConfig(batch=b, heads=h * g, kv_heads=h, seqlen_q=nq,
                                                              seqlen_k=nk, head_dim=d, causal=causal, dtype=dt,
                                                              **{"pass": p}),
    st.integers(1, 3), st.integers(1, 2), st.sampled_from([1, 2]), st.integers(1, 600), st.integers(1, 600),
    st.sampled_from([32, 64, 128]), st.booleans(), st.sampled_from(["fp16", "bf16"]),
    st.sampled_from(["backward", "forward+backward"]))


@settings(max_examples=60, deadline=None)
@given(cfg=configs, alg=st.sampled_from(["naive", "eager", "flash1", "flash2", "torch_flash"]),
       bq=st.sampled_from([16, 64, 128]), bkv=st.sampled_from([16, 64, 128]))
def test_backward_closed_forms_equal_the_plans_step_sums(h200, cfg, alg, bq, bkv):
    assume(alg in ("naive", "flash2", "torch_flash") or cfg.group == 1)
    til = Tiling(block_q=bq, block_kv=bkv, loop_order="flash1" if alg == "flash1" else "flash2") \
        if alg != "naive" and alg != "eager" else None
    assume(til is None or til.smem_bytes(cfg) <= h200.smem_per_block_bytes)
    try:
        a = analyze(cfg, alg, h200, til)
    except IosimError as e:   # a tiling whose backward needs more shared memory than a block may take
        assert "KiB of shared memory" in str(e)
        return
    reads, writes, work = plan_sums(cfg, alg, h200, til)
    pt = a.per_tensor()
    assert reads == +Counter({t: r for t, (r, _) in pt.items()})
    assert writes == +Counter({t: w for t, (_, w) in pt.items()})
    assert work == [a.mma_flops, a.exp_ops, a.other_flops]


@pytest.mark.parametrize("alg", ["naive", "eager", "flash1", "flash2", "torch_flash"])
@pytest.mark.parametrize("causal", [False, True])
def test_engine_without_l2_counts_what_the_closed_form_does_per_kernel(h200, alg, causal):
    cfg = AttentionConfig(batch=2, heads=3, seqlen_q=333, seqlen_k=517, head_dim=64, causal=causal,
                          **{"pass": "forward+backward"})
    a, r = analyze(cfg, alg, h200), simulate(cfg, alg, h200, l2=False)
    assert [k.name for k in a.kernels] == [k.name for k in r.kernels]
    for x, y in zip(a.kernels, r.kernels):
        assert +x.hbm_read == +y.hbm_read and +x.hbm_write == +y.hbm_write, x.name
        assert (x.mma_flops, x.exp_ops, x.other_flops) == (y.mma_flops, y.exp_ops, y.other_flops), x.name


def test_flash2_backward_by_hand(h200):
    """FlashAttention-2's backward on the paper's layer: 128 x 128 blocks at d 64, 8 key tiles a head; each key
    tile's block reads Q and dO of all 8 query blocks and adds into dQ's fp32 accumulator each time."""
    cfg = cfg_of()
    a = analyze(cfg, "flash2", h200)
    assert [k.name for k in a.kernels] == ["flash2_bwd_dot", "flash2_bwd", "flash2_bwd_convert"]
    x = cfg.bh * 1024 * 64 * 2                                   # one Q-sized fp16 tensor
    dot, main, conv = a.kernels
    assert dot.hbm_read == Counter(dO=x, O=x) and dot.hbm_write == Counter(D=cfg.bh * 1024 * 4, dQacc=2 * x)
    assert main.hbm_read["K"] == main.hbm_read["V"] == x
    assert main.hbm_read["Q"] == main.hbm_read["dO"] == 8 * x
    assert main.hbm_read["dQacc"] == main.hbm_write["dQacc"] == 8 * 2 * x
    assert main.hbm_write == Counter(dQacc=16 * x, dK=x, dV=x)
    assert conv.hbm_read == Counter(dQacc=2 * x) and conv.hbm_write == Counter(dQ=x)
    assert main.mma_flops == 10 * cfg.bh * 1024 * 1024 * 64 and main.recompute_flops == main.mma_flops // 5


def test_causal_backward_visits_only_what_it_sees(h200):
    full, causal = analyze(cfg_of(), "flash2", h200), analyze(cfg_of(causal=True), "flash2", h200)
    # 8 key tiles of 128 over 8 query blocks: 36 of 64 (query block, key tile) pairs are visited
    assert causal.kernels[1].mma_flops * 64 == full.kernels[1].mma_flops * 36
    assert causal.kernels[1].hbm_read["K"] == full.kernels[1].hbm_read["K"]


def test_training_step_recomputes_but_moves_far_fewer_bytes(a100):
    """The paper's Figure 2 argument: FlashAttention's training step does more FLOPs (the recomputed S) and moves
    an order of magnitude fewer HBM bytes than standard attention."""
    naive, flash = analyze(cfg_of("forward+backward"), "eager", a100), \
        analyze(cfg_of("forward+backward"), "flash2", a100)
    assert flash.recompute_flops > 0 and naive.recompute_flops == 0
    assert 1.05 < flash.mma_flops / naive.mma_flops < 1.25
    assert naive.hbm_bytes / flash.hbm_bytes > 4    # two-level: every atomic add into dQ goes to HBM
    step = cfg_of("forward+backward")
    assert simulate(step, "eager", a100).hbm_bytes / simulate(step, "flash2", a100).hbm_bytes > 10


def test_peak_footprint_quadratic_for_naive_linear_for_flash(h200):
    def peak(alg, n):
        return build_plan(AttentionConfig(batch=1, heads=8, seqlen_q=n, head_dim=64, **{"pass": "forward+backward"}),
                          alg, h200).peak_footprint_bytes()
    assert peak("eager", 8192) / peak("eager", 4096) > 3.5
    assert peak("flash2", 8192) / peak("flash2", 4096) == pytest.approx(2, rel=0.01)


def test_atomic_adds_land_in_l2(h200):
    """dQ's accumulator of a small grid stays in L2 between the atomic adds: HBM sees it once, L2 every add."""
    cfg = AttentionConfig(batch=1, heads=4, seqlen_q=2048, head_dim=64, **{"pass": "backward"})
    r = simulate(cfg, "flash2", h200)
    main = r.kernels[1]
    acc = cfg.bh * 2048 * 64 * 4
    assert main.l2_atomic_bytes == 16 * acc                    # 16 key tiles each add into every query row
    assert main.hbm_read["dQacc"] <= acc


def test_backward_refusals_name_the_reason(h200):
    gqa = AttentionConfig(batch=1, heads=4, kv_heads=2, seqlen_q=64, head_dim=64, **{"pass": "backward"})
    with pytest.raises(IosimError, match="flash1's backward does not take grouped-query"):
        build_plan(gqa, "flash1", h200)
    big = AttentionConfig(batch=1, heads=1, seqlen_q=64, head_dim=256, **{"pass": "backward"})
    with pytest.raises(IosimError, match="KiB of shared memory"):
        build_plan(big, "flash1", h200, Tiling(block_q=128, block_kv=128))


def test_gqa_backward_sums_each_group(h200):
    cfg = AttentionConfig(batch=2, heads=8, kv_heads=2, seqlen_q=256, head_dim=64, **{"pass": "backward"})
    a = analyze(cfg, "flash2", h200)
    dk, dv = a.kernels[-2:]
    assert dk.name == dv.name == "gqa_sum"
    kv = cfg.batch * cfg.kv_heads * 256 * 64 * 2
    assert dk.hbm_read == Counter(dKexp=4 * kv) and dk.hbm_write == Counter(dK=kv)
    assert dv.hbm_read == Counter(dVexp=4 * kv) and dv.hbm_write == Counter(dV=kv)


def test_pytorch_copies_dO_and_O_into_flash_layout_when_there_are_heads(h200):
    """SDPA's flash backward on the H200: two copies of a query-sized tensor before FlashAttention-2's kernels
    wherever heads > 1 (none with one head); iosim's own flash2 has none."""
    many, one = cfg_of(), cfg_of(batch=8, heads=1)
    names = [k.name for k in build_plan(many, "torch_flash", h200).kernels]
    assert names == ["sdpa_copy", "sdpa_copy", "flash2_bwd_dot", "flash2_bwd", "flash2_bwd_convert"]
    assert [k.name for k in build_plan(one, "torch_flash", h200).kernels][0] == "flash2_bwd_dot"
    assert "sdpa_copy" not in [k.name for k in build_plan(many, "flash2", h200).kernels]


def test_our_row_kernels_run_at_their_builds_occupancy():
    # gpu_kernels' softmax_bwd_rows holds a row's P and dP in shared memory and ptxas gives it 32 registers: 8
    # blocks of 256 threads an SM at 1k keys, 3 at 16k (64 KiB each); an unknown build's 128 registers would
    # hold any row kernel to 2. bwd_dot and bwd_convert take 8 elements a thread, 256 threads a block
    from iosim import fit
    from iosim.hardware import load_profile
    from iosim.kernels.catalogue import run_traits
    hw = load_profile("h200_sxm.calibrated")
    fitted = fit.load(hw)

    def kernels(alg, n, d=64):
        cfg = AttentionConfig(batch=1, heads=2, seqlen_q=n, head_dim=d, **{"pass": "backward"})
        til = Tiling(block_q=128, block_kv=64) if alg != "naive" else None
        return {k.name: k for k in build_plan(cfg, alg, hw, til, run_traits(alg, cfg, til, fitted,
                                                                               hw.clock_hz)).kernels}
    from gpu_kernels import build
    from iosim.plan import passes
    assert (passes.ROW_THREADS, passes.SOFTMAX_BWD_SMEM_PAD) == (build.ROW_THREADS, build.SOFTMAX_BWD_SMEM_PAD)
    assert kernels("naive", 1024)["naive_softmax_bwd"].blocks_per_sm(hw) == 8
    assert kernels("naive", 16384)["naive_softmax_bwd"].blocks_per_sm(hw) == 3
    for d, rows in ((64, 32), (128, 16)):
        ours = kernels("flash2", 2048, d)
        assert ours["flash2_bwd_dot"].rows_per_block == rows and ours["flash2_bwd_dot"].threads == 256
        assert ours["flash2_bwd_convert"].rows_per_block == rows and ours["flash2_bwd_convert"].blocks_per_sm(hw) == 8
    torch = kernels("torch_flash", 2048)   # PyTorch's: a query block a block, its own traits
    assert torch["flash2_bwd_dot"].rows_per_block == 128


def test_our_d128_backward_spills_reach_l2_per_visit():
    # the d 128 builds store their spills a (query block, key tile) visit (kernels.builds.BWD_SPILLS); the d 64
    # builds spill nothing, and PyTorch's backward is not ours
    from iosim import fit
    from iosim.hardware import load_profile
    from iosim.kernels.builds import BWD_SPILLS
    from iosim.kernels.catalogue import run_traits
    hw = load_profile("h200_sxm.calibrated")
    fitted = fit.load(hw)

    def spilled(alg, d, causal):
        cfg = AttentionConfig(batch=1, heads=2, seqlen_q=1024, head_dim=d, causal=causal, **{"pass": "backward"})
        til = Tiling(block_q=128, block_kv=64)
        r = simulate(cfg, alg, hw, til, traits=run_traits(alg, cfg, til, fitted, hw.clock_hz))
        return next(k for k in r.kernels if k.name.endswith("_bwd")).l2_local_bytes

    visits = 2 * (1024 // 128) * (1024 // 64)           # 64 x 128 blocks at d 128, every pair non-causal
    assert spilled("flash2", 128, False) == BWD_SPILLS[("flash2", 128, False)] * visits > 0
    assert spilled("flash1", 128, False) == BWD_SPILLS[("flash1", 128, False)] * visits > 0
    causal = 2 * sum(i // 2 + 1 for i in range(1024 // 64))   # query block i sees key tiles 0 .. i // 2
    assert spilled("flash2", 128, True) == BWD_SPILLS[("flash2", 128, True)] * causal
    assert spilled("flash2", 64, False) == spilled("torch_flash", 128, False) == 0
