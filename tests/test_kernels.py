"""The kernel catalogue: cuBLAS's rules keyed by chip, FlashAttention-2's tiling defined once."""
from iosim.analytic import analyze
from iosim.engine import simulate
from iosim.kernels import cublas, torch_fa2
from iosim.plan import Tiling, build_plan
from iosim.workload import AttentionConfig


def test_cublas_rules_are_the_chips_own_else_the_generic_one(a100, h200):
    assert cublas.for_chip(h200).rule is cublas.HOPPER and h200.arch == "sm_90"
    assert cublas.for_chip(a100).rule is cublas.GENERIC and a100.arch == "sm_80"
    assert cublas.for_chip(h200.replace(name="no arch").model_copy(update={"arch": None})).rule is cublas.GENERIC
    cfg = AttentionConfig()   # the paper's GPT-2 layer: 256x128 tiles of S on both chips
    hop, gen = cublas.for_chip(h200).tile(cfg, "qk"), cublas.for_chip(a100).tile(cfg, "qk")
    assert (hop.m, hop.n, hop.cm, hop.cn) == (256, 128, 1, 2) and (gen.m, gen.n, gen.cm, gen.cn) == (256, 128, 1, 1)
    # without clusters each query strip's tile loads its own K tile: twice the K reads in the two-level count
    nq, nk, d, e, bh = 1024, 1024, 64, 2, 64 * 16
    counts = analyze(cfg, "naive", a100).kernels[0].hbm_read
    assert counts["K"] == bh * (nq // 128) * nk * d * e and counts["Q"] == bh * (nk // 256) * nq * d * e
    assert analyze(cfg, "naive", h200).kernels[0].hbm_read["K"] == counts["K"] // 2
    # the epilogue's measured rate is the H200's cuBLAS's; elsewhere the memory sets the pace
    qk = {hw.key: build_plan(cfg, "naive", hw).kernels[0].store_rate for hw in (a100, h200)}
    assert qk == {"a100_40gb": 1.0, "h200_sxm": 0.735}
    assert simulate(cfg, "naive", a100, l2=False).hbm_bytes == analyze(cfg, "naive", a100).hbm_bytes


def test_flashattention2s_tiling_is_defined_once():
    for d, want in ((64, (128, 128, 4)), (128, (128, 64, 4)), (256, (128, 64, 8))):
        t = torch_fa2.tiling(AttentionConfig(batch=64, heads=16, seqlen_q=2048, head_dim=d), 132)
        assert (t.block_q, t.block_kv, t.warps, t.kv_splits) == (*want, 1)
    # few heads: its split-KV path, 64-row blocks
    t = torch_fa2.tiling(AttentionConfig(batch=1, heads=1, seqlen_q=4096, head_dim=64), 132)
    assert t.block_q == 64 and t.kv_splits > 1
    # our practice preset keeps FlashAttention-2's sizes where our 4-warp build fits them
    assert Tiling.practice(AttentionConfig(head_dim=64)).block_kv == 128
