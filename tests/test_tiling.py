import pytest

from iosim.errors import IosimError
from iosim.plan import Tiling, build_plan
from iosim.workload import AttentionConfig


def test_practice_block_sizes_are_flashattention2s():
    assert Tiling.practice(AttentionConfig(head_dim=64)).model_dump() | {} == Tiling(
        block_q=128, block_kv=128).model_dump()
    t = Tiling.practice(AttentionConfig(head_dim=128))
    assert (t.block_q, t.block_kv, t.warps) == (128, 64, 4)


def test_paper_block_sizes_from_sram(a100):
    # M = 163 KiB / 2 B = 83,456 fp16 elements; Bc = ceil(M / 4d) = 326, Br = min(Bc, d) = 64
    t = Tiling.paper(AttentionConfig(head_dim=64), a100)
    assert (t.block_kv, t.block_q, t.loop_order) == (326, 64, "flash1")
    t = Tiling.paper(AttentionConfig(head_dim=64, dtype="fp32"), a100)
    assert (t.block_kv, t.block_q) == (163, 64)


def test_shared_memory_of_a_tiling():
    cfg = AttentionConfig(head_dim=128)
    assert Tiling(block_q=128, block_kv=64, stages=2).smem_bytes(cfg) == (128 + 2 * 2 * 64) * 128 * 2


def test_a_tiling_that_cannot_fit_is_refused_with_the_numbers(a100, h200):
    cfg = AttentionConfig(head_dim=256)
    t = Tiling(block_q=128, block_kv=128, stages=2)
    with pytest.raises(IosimError) as e:
        build_plan(cfg, "flash2", a100, t)
    assert "320.0 KiB" in str(e.value) and "163 KiB" in str(e.value) and "a100_40gb" in str(e.value)
    with pytest.raises(IosimError, match="227 KiB"):
        build_plan(cfg, "flash2", h200, t)
    build_plan(cfg, "flash2", h200, Tiling(block_q=64, block_kv=64, stages=2))   # 160 KiB fits


def test_bad_tiling_values():
    with pytest.raises(IosimError, match="block_q"):
        Tiling.make(block_q=0)
    with pytest.raises(IosimError, match="loop_order"):
        Tiling.make(loop_order="flash3")
