"""Eager attention as other code writes it (`plan.eager.EagerProgram`): the kernels FlashAttention's benchmark
scripts launch under the PyTorch of its papers, against those of the program measured as torch_naive."""
from __future__ import annotations

import pytest

from iosim import published
from iosim.engine import simulate
from iosim.errors import IosimError
from iosim.plan import build_plan
from iosim.plan.eager import FLASH_BENCHMARK, MEASURED, softmax_passes
from iosim.workload import AttentionConfig


def names(cfg, program, hw):
    return [k.name for k in build_plan(cfg, "eager", hw, program=program).kernels]


def cfg_of(n=1024, causal=False, pass_="forward", **kw):
    return AttentionConfig.make(batch=2, heads=4, seqlen_q=n, head_dim=64, dtype="fp16", causal=causal,
                                **{"pass": pass_}, **kw)


@pytest.mark.parametrize("n, measured, benchmark", [(1024, "softmax_warp", "softmax_warp"),
                                                    (2048, "softmax_warp", "softmax_smem"),
                                                    (4096, "softmax_reg", "softmax_smem"),
                                                    (16384, "softmax_smem", "softmax_smem")])
def test_softmax_kernel_follows_the_pytorch_the_program_ran_under(n, measured, benchmark):
    cfg = cfg_of(n)
    assert softmax_passes(cfg, MEASURED)[0] == measured
    assert softmax_passes(cfg, FLASH_BENCHMARK)[0] == benchmark


def test_benchmark_forward_scales_in_the_gemm_copies_packed_qkv_and_adds_an_fp32_mask(h200):
    full, causal = names(cfg_of(), FLASH_BENCHMARK, h200), names(cfg_of(causal=True), FLASH_BENCHMARK, h200)
    assert "eager_scale" not in full and full.count("eager_layout_copy") == 3
    assert full.index("eager_layout_copy") < full.index("eager_qk") and full[-2] == "eager_layout_copy"
    for k in ("eager_mask_full", "eager_mask_triu", "eager_mask_cast", "eager_mask_add"):
        assert k in causal and k not in full
    assert not any("masked_fill" in k for k in causal)
    measured = names(cfg_of(causal=True), MEASURED, h200)
    assert "eager_scale" in measured and "eager_masked_fill" in measured and "eager_layout_copy" not in measured


def test_benchmark_backward_has_no_s_wide_scale_or_mask_pass(h200):
    bwd = names(cfg_of(causal=True, pass_="backward"), FLASH_BENCHMARK, h200)
    assert not any("scale_bwd" in k or "masked_fill" in k for k in bwd)
    assert bwd[0] == "eager_layout_copy" and bwd[-1] == "eager_stack" and bwd.count("eager_alpha_bwd") == 2
    measured = names(cfg_of(causal=True, pass_="backward"), MEASURED, h200)
    assert "eager_scale_bwd" in measured and "eager_stack" not in measured


def test_benchmark_moves_the_bytes_its_kernels_add_and_drop(h200):
    """With L2 off, the benchmark's forward moves what the measured program does less the scale pass over S (read
    and written) plus the three layout copies of q, k, v (each read and written)."""
    cfg = cfg_of(2048)
    a = simulate(cfg, "eager", h200, l2=False, exact=True, program=MEASURED)
    b = simulate(cfg, "eager", h200, l2=False, exact=True, program=FLASH_BENCHMARK)
    tb = cfg.tensor_bytes()
    assert b.hbm_bytes - a.hbm_bytes == 2 * (tb["Q"] + tb["K"] + tb["V"]) - 2 * tb["S"]


def test_packed_qkv_needs_one_shape_for_q_k_v(h200):
    with pytest.raises(IosimError, match="packed qkv needs seqlen_q == seqlen_k"):
        build_plan(cfg_of(1024, seqlen_k=512), "eager", h200, program=FLASH_BENCHMARK)


def test_published_standard_attention_is_planned_as_the_benchmark_program():
    assert published.PROGRAMS["standard"] is FLASH_BENCHMARK
    assert all(published.PROGRAMS.get(a, MEASURED) is MEASURED for a in ("flash2", "flash3", "cudnn"))
