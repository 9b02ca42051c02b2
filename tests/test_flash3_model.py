"""flash3's plan (iosim/plan/flash3.py): flash2's traffic at its own tiling, wgmma's rate, the softmax in series
with the matmuls as its build measured, and clear refusals."""
from dataclasses import replace

import pytest

from iosim.engine import simulate
from iosim.errors import IosimError
from iosim.hardware import load_profile
from iosim.kernels.builds import key, pipe_cycles
from iosim.kernels.catalogue import FLASH3_BUILD, planned, run_traits
from iosim.plan import build_plan
from iosim.plan.flash3 import smem_bytes, tiling
from iosim.plan.traits import Build, Traits
from iosim.workload import AttentionConfig

H200 = load_profile("h200_sxm")


def cfg(**kw):
    base = dict(batch=2, heads=8, seqlen_q=4096, head_dim=128, dtype="fp16", causal=False)
    return AttentionConfig.make(**(base | kw))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_flash3_moves_the_bytes_flash2_does_at_the_same_blocks(causal, d):
    c = cfg(causal=causal, head_dim=d)
    t = tiling(c, "flash3", H200.sm_count)
    no_l2 = H200.replace(l2_capacity_mib=0)     # the paper's two levels: the counts alone, no cache timing
    f3 = simulate(c, "flash3", no_l2, traits=Traits.join(None, FLASH3_BUILD))
    f2 = simulate(c, "flash2", no_l2, t.model_copy(update={"warps": 4}))
    assert f3.hbm_read_bytes == f2.hbm_read_bytes
    assert sum(k.hbm_write_bytes for k in f3.kernels) == sum(k.hbm_write_bytes for k in f2.kernels)


def test_flash3_plan_is_the_kernels_layout():
    c = cfg()
    k = build_plan(c, "flash3", H200, traits=Traits.join(None, FLASH3_BUILD)).kernels[0]
    assert (k.name, k.threads, k.rows_per_block, k.smem_bytes) == ("flash3_fwd", 384, 128, smem_bytes(c))
    assert tiling(c).warps == 12 and tiling(c, "torch_cudnn").block_q == 128
    # two Q buffers, 2 K and 2 V stages, 12 mbarriers, two tile numbers, align
    assert smem_bytes(c) == (2 * 128 + 4 * 128) * 128 * 2 + 96 + 8 + 1024
    assert k.blocks_per_sm(H200) == 1
    assert planned("flash3", c, None, 132) == ("flash3", tiling(c))
    assert planned("flash3", cfg(causal=True), None, 132)[1].q_order == "descending"
    # its build as counted: the pipe census's cycles a key tile, in cycles of the clock asked for
    tr = run_traits("flash3", c, tiling(c), {}, 1.98e9)
    tile, block = pipe_cycles(key("flash3", 128, 128, 128, 12, 2, False), 1.98e9)
    assert (tr.tile_pipe_cycles, tr.block_pipe_cycles) == (tile, block)
    assert k.traits.registers_per_thread == 168         # ptxas's at 384 threads; 128 at d 64's 512
    assert build_plan(cfg(head_dim=64), "flash3", H200).kernels[0].traits.registers_per_thread == 128
    assert tile > 0 and not tr.overlap_softmax


def test_wgmma_and_an_overlapped_softmax_each_shorten_a_compute_bound_grid():
    c = cfg(batch=4, heads=16)
    tr = run_traits("flash3", c, tiling(c), {}, H200.clock_hz)
    built = simulate(c, "flash3", H200, traits=tr).time_s
    overlapped = simulate(c, "flash3", H200, traits=replace(tr, overlap_softmax=True)).time_s
    slow_wgmma = simulate(c, "flash3", H200.replace(wgmma_fp16_tflops=500.0), traits=tr).time_s
    assert overlapped < built < slow_wgmma
    # in series, a tile's compute is its matmul at wgmma's rate plus its counted cycles at the clock
    per_sm_tiles = c.bh * (4096 // 128) ** 2 / H200.sm_count
    floor = per_sm_tiles * (4 * 128 ** 3 / (H200.tensor_flops_per_s("fp16", wgmma=True) / H200.sm_count)
                            + tr.tile_pipe_cycles / H200.clock_hz)
    assert built >= 0.95 * floor


def test_flash3_is_wgmma_whatever_traits_it_is_given():
    """wgmma is what the kernel is: at the chip's peak rates (no traits) it is planned on it; whether its softmax
    hides under the matmuls is its build's (`overlap_softmax`)."""
    k = build_plan(cfg(), "flash3", H200).kernels[0]
    assert k.traits.wgmma and not k.traits.overlap_softmax
    assert simulate(cfg(), "flash3", H200).time_s == simulate(cfg(), "flash3", H200, traits=Traits.join(
        None, Build(wgmma=True))).time_s
    assert build_plan(cfg(), "flash3", H200, traits=Traits.join(None, Build(overlap_softmax=True))
                      ).kernels[0].traits.overlap_softmax


def test_flash3_refusals_are_one_line():
    with pytest.raises(IosimError, match="forward pass only"):
        build_plan(cfg().with_pass("forward+backward"), "flash3", H200)
    with pytest.raises(IosimError, match="no wgmma"):
        simulate(cfg(), "flash3", load_profile("a100_80gb"), traits=Traits.join(None, FLASH3_BUILD))
    with pytest.raises(IosimError, match="flash3 runs its own tiling"):
        build_plan(cfg(), "flash3", H200, tiling(cfg()).model_copy(update={"block_kv": 64}))


def test_cudnn_forward_is_flash3s_design_at_its_own_build():
    """SDPA's cuDNN forward on sm_90: flash3's tiles and traffic, its own kernel name and shared memory (one block
    an SM, as its persistent grid has), refused where flash3's tiles cannot fit."""
    from iosim.kernels.catalogue import CUDNN_BUILD
    c = cfg()
    assert planned("torch_cudnn", c, None, 132) == ("torch_cudnn", tiling(c, "torch_cudnn"))
    tr = run_traits("torch_cudnn", c, tiling(c, "torch_cudnn"), {}, 1.98e9)
    assert tr.smem_bytes == CUDNN_BUILD.smem_bytes == 227 * 1024
    k = build_plan(c, "torch_cudnn", H200, traits=tr).kernels[0]
    assert (k.name, k.threads, k.blocks_per_sm(H200)) == ("cudnn_fwd", 384, 1)
    assert k.traits.wgmma and tr.tile_pipe_cycles > 0
    no_l2 = H200.replace(l2_capacity_mib=0)
    assert simulate(c, "torch_cudnn", no_l2, traits=tr).hbm_read_bytes == \
        simulate(c, "flash3", no_l2, traits=Traits.join(None, FLASH3_BUILD)).hbm_read_bytes
    with pytest.raises(IosimError, match="torch_cudnn is planned at flash3's tiles"):
        build_plan(cfg(head_dim=256), "torch_cudnn", H200)
    with pytest.raises(IosimError, match="torch_cudnn has a forward pass only"):
        build_plan(c.with_pass("forward+backward"), "torch_cudnn", H200)


def test_diagonal_tiles_pay_their_measured_masked_cycles():
    """`Build.masked_tile_pipe_cycles`: a causal grid's diagonal tiles run the masked softmax; cuDNN's wait longer
    than an interior tile, so a causal grid's time moves with them, and a non-causal grid of aligned N has none.
    flash3's 128-row causal blocks (d 128) measured no more than their tiles, so its diagonal tiles add nothing
    there; its 192-row blocks (d 64) cross two key tiles' diagonals and measured more."""
    for alg, d, pays in (("flash3", 128, False), ("flash3", 64, True), ("torch_cudnn", 64, True),
                         ("torch_cudnn", 128, True)):
        c = cfg(batch=4, heads=16, seqlen_q=2048, head_dim=d, causal=True)
        assert (run_traits(alg, c, tiling(c, alg), {}, H200.clock_hz).masked_tile_pipe_cycles > 0) == pays
    for causal, moves in ((True, True), (False, False)):
        c = cfg(batch=4, heads=16, seqlen_q=2048, head_dim=64, causal=causal)
        tr = run_traits("torch_cudnn", c, tiling(c, "torch_cudnn"), {}, H200.clock_hz)
        assert tr.masked_tile_pipe_cycles > 0
        with_mask = simulate(c, "torch_cudnn", H200, traits=tr, exact=True).time_s
        without = simulate(c, "torch_cudnn", H200, traits=replace(tr, masked_tile_pipe_cycles=0.0), exact=True).time_s
        assert (with_mask > without) == moves and with_mask >= without


def test_flash3_folds_into_no_fewer_than_its_least_steps():
    """One block an SM: nothing hides a folded step's loads, so its kernels fold into at least 16 steps whatever the
    engine is asked (`KernelPlan.least_steps`); flash2's fold as asked."""
    c = cfg(batch=2, heads=16, seqlen_q=4096, head_dim=128, causal=False)
    for alg in ("flash3", "torch_cudnn"):
        assert simulate(c, alg, H200, exact=True, max_steps=4).time_s == simulate(c, alg, H200, exact=True).time_s
    f2 = {n: simulate(c, "flash2", H200, exact=True, max_steps=n).time_s for n in (4, 16)}
    assert f2[4] != f2[16]


def test_flash3_picks_the_geometry_whose_work_tiles_end_first():
    """d 64 is built at 192 x 128 and 128 x 128: the persistent grid deals work tiles round the SMs, and the launcher
    and the plan take the geometry whose busiest SM ends first, from the builds' counted cycles."""
    from iosim.plan.flash3 import GEOMETRIES, geometry, makespan
    assert GEOMETRIES[64][0] == (3, 128) and geometry(cfg(head_dim=64)) == (3, 128)   # no SM count: the default
    big = cfg(batch=2, heads=32, seqlen_q=8192, head_dim=64)
    assert geometry(big, "flash3", 132) == (3, 128)           # 21 rounds of 192 rows against 32 of 128
    # B1 H8 N4096: two rounds either way, each a third shorter at 128 rows (measured 91 against 117 us on the H100)
    small = cfg(batch=1, heads=8, seqlen_q=4096, head_dim=64)
    assert geometry(small, "flash3", 132) == (2, 128)
    assert makespan(small, (2, 128), 132) < 0.85 * makespan(small, (3, 128), 132)
    # more SMs than tiles: one round, the longest tile's
    one = cfg(batch=1, heads=1, seqlen_q=8192, head_dim=64)
    assert makespan(one, (3, 128), 132) == makespan(one, (3, 128), 1000)
    # non-causal: rounds x a tile's cost
    r = makespan(big, (3, 128), 132) / makespan(big, (3, 128), 10_000)
    assert r == pytest.approx(-(-(2 * 32 * 43) // 132))
    # causal: each free SM claims the next tile: never below the even share, never above it by more than one tile
    c = cfg(batch=2, heads=32, seqlen_q=8192, head_dim=64, causal=True)
    total = makespan(c, (3, 128), 1)
    assert total / 132 <= makespan(c, (3, 128), 132) <= total / 132 + makespan(c, (3, 128), 10_000)
    assert geometry(cfg(head_dim=128), "flash3", 132) == (2, 128) == geometry(small, "torch_cudnn", 132)
    # the plan runs the launcher's choice, and takes a record's other built geometry when given it
    assert build_plan(small, "flash3", H200).tiling.block_q == 128
    assert build_plan(big, "flash3", H200).tiling.block_q == 192
    other = tiling(big, "flash3", blocks=(2, 128))
    assert build_plan(big, "flash3", H200, other).tiling.block_q == 128
    assert planned("flash3", big, None, 132, blocks=(2, 128)) == ("flash3", other)


def test_a_persistent_grids_later_work_tiles_find_their_first_loads_in(monkeypatch):
    """flash3 and cuDNN are persistent: a work tile after its SM's first does not wait for its Q and first K/V,
    which the producer loaded under the tile before; the bytes move all the same. Short tiles gain most."""
    from iosim.plan import behaviour
    short = cfg(batch=64, heads=16, seqlen_q=256, head_dim=64)   # 16 rounds of 2 key tiles
    long = cfg(batch=2, heads=16, seqlen_q=8192)
    assert all(build_plan(short, alg, H200).kernels[0].loop.starts_loaded for alg in ("flash3", "torch_cudnn"))
    for alg in ("flash3", "torch_cudnn"):
        got = {}
        for on in (True, False):
            monkeypatch.setattr(behaviour.PersistentLoop, "starts_loaded", on)
            got[on] = {c.label(): simulate(c, alg, H200, max_steps=4) for c in (short, long)}
        for label, r in got[True].items():
            assert r.hbm_read_bytes == got[False][label].hbm_read_bytes
        gain = {k: got[False][k].time_s / got[True][k].time_s for k in got[True]}
        assert gain[short.label()] > 1.05 and gain[short.label()] > gain[long.label()] >= 1.0
    assert not build_plan(short, "flash2", H200).kernels[0].loop.starts_loaded
