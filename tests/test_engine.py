"""The engine's invariants, over random configurations and tilings (hypothesis), and its anchors."""
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from iosim import counters
from iosim.counters import NsightCounters
from iosim.analytic import analyze
from iosim.engine import simulate
from iosim.plan import Tiling, Traits
from iosim.plan.kernel import fragment_writes
from iosim.workload import AttentionConfig

configs = st.builds(
    lambda b, h, g, nq, nk, d, causal, dt: AttentionConfig(batch=b, heads=h * g, kv_heads=h, seqlen_q=nq,
                                                           seqlen_k=nk, head_dim=d, causal=causal, dtype=dt),
    st.integers(1, 4), st.integers(1, 4), st.sampled_from([1, 2, 4]), st.integers(1, 1500),
    st.integers(1, 1500), st.sampled_from([32, 64, 128]), st.booleans(), st.sampled_from(["fp16", "bf16", "fp32"]))
tilings = st.builds(
    lambda bq, bkv, order, stages, grid, q_order, splits: Tiling(
        block_q=bq, block_kv=bkv, loop_order=order, stages=stages, grid_order=grid, q_order=q_order,
        kv_splits=splits if order == "flash2" else 1),
    st.sampled_from([32, 64, 128]), st.sampled_from([32, 64, 128]), st.sampled_from(["flash1", "flash2"]),
    st.sampled_from([1, 2]), st.sampled_from(["q_fastest", "bh_fastest"]), st.sampled_from(["ascending", "descending"]),
    st.sampled_from([1, 1, 2, 3, 5]))
settings.register_profile("engine", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture])


def compulsory(cfg, algorithm):
    """Each input byte that must be read once, each output byte written once."""
    tb = cfg.tensor_bytes()
    kv_seen = cfg.keys_seen(cfg.seqlen_q - 1) / cfg.seqlen_k      # the last row sees the most keys
    rows_seen = sum(1 for r in range(cfg.seqlen_q) if cfg.keys_seen(r)) / cfg.seqlen_q
    if algorithm == "naive":  # the GEMMs read all of Q, K and V whatever the mask
        return tb["Q"] + tb["K"] + tb["V"], tb["O"]
    reads = int(tb["Q"] * rows_seen) + 2 * int(tb["K"] * kv_seen) - 2 * cfg.head_dim  # tile-rounding slack
    return reads, tb["O"] + tb["L"]


@settings(settings.get_profile("engine"))
@given(cfg=configs, tiling=tilings)
def test_l2_off_equals_analytic_exactly_and_l2_on_stays_between_compulsory_and_l2_off(h200, cfg, tiling):
    assume(tiling.smem_bytes(cfg) <= h200.smem_per_block_bytes)
    for algorithm, til in (("naive", None), (tiling.loop_order, tiling)):
        a = analyze(cfg, algorithm, h200, til)
        off = simulate(cfg, algorithm, h200, til, l2=False, max_steps=4)
        assert off.per_tensor() == {t: rw for t, rw in a.per_tensor().items() if rw != (0, 0)}
        for ka, ks in zip(a.kernels, off.kernels):   # per kernel too
            assert (ks.hbm_read, ks.hbm_write) == (+ka.hbm_read, +ka.hbm_write)
            assert (ks.mma_flops, ks.exp_ops, ks.other_flops) == (ka.mma_flops, ka.exp_ops, ka.other_flops)
        on = simulate(cfg, algorithm, h200, til, l2=True, max_steps=4)
        assert on.hbm_read_bytes <= off.hbm_read_bytes and on.hbm_write_bytes <= off.hbm_write_bytes
        need_r, need_w = compulsory(cfg, algorithm)
        assert on.hbm_read_bytes >= need_r and on.hbm_write_bytes >= need_w
        assert on.l2_bytes == off.hbm_bytes          # every request goes through L2 when it is on
        assert on.mma_flops == off.mma_flops


def roofline_s(r, hw, dtype):
    """A lower bound from the run's own counts: per kernel, the busiest resource at full rate."""
    total = 0.0
    for k in r.kernels:
        total += max((k.hbm_read_bytes + k.hbm_write_bytes) / hw.hbm_bytes_per_s,
                     (k.l2_read_bytes + k.l2_write_bytes) / hw.l2_bytes_per_s,
                     k.mma_flops / hw.tensor_flops_per_s(dtype), k.exp_ops / hw.exp_per_s,
                     k.other_flops / hw.fp32_flops_per_s, k.sram_bytes / hw.smem_bytes_per_s)
    return total


@settings(settings.get_profile("engine"))
@given(cfg=configs, tiling=tilings, l2=st.booleans())
def test_time_is_never_below_the_roofline_and_runs_are_deterministic(h200, cfg, tiling, l2):
    assume(tiling.smem_bytes(cfg) <= h200.smem_per_block_bytes)
    for algorithm, til in (("naive", None), (tiling.loop_order, tiling)):
        r = simulate(cfg, algorithm, h200, til, l2=l2, max_steps=4)
        assert r.time_s >= roofline_s(r, h200, cfg.dtype) * (1 - 1e-9)
        if not l2:
            assert r.time_s >= analyze(cfg, algorithm, h200, til).time_bound_s * (1 - 1e-9)
        assert simulate(cfg, algorithm, h200, til, l2=l2, max_steps=4).as_dict() == r.as_dict()


def ideal(hw, **changes):
    return hw.replace(hbm_latency_ns=0, l2_latency_ns=0, kernel_launch_us=0, **changes)


def test_unlimited_bandwidth_approaches_the_compute_bound(h200):
    hw = ideal(h200, hbm_bandwidth_gb_s=1e6, l2_bandwidth_gb_s=1e6, smem_bandwidth_bytes_per_clk_per_sm=4096)
    cfg = AttentionConfig(batch=33, heads=16, seqlen_q=2048, head_dim=128)   # 33*16*16 blocks: whole waves
    r = simulate(cfg, "flash2", hw, traits=Traits(overlap_softmax=True))
    compute = r.mma_flops / hw.tensor_flops_per_s("fp16")
    assert r.time_s == pytest.approx(compute, rel=0.02)
    assert r.bound == "compute"


def test_unlimited_compute_approaches_the_memory_bound(h200, monkeypatch):
    from iosim.kernels import cublas
    # qk's epilogue is SM work too, which this chip makes free
    monkeypatch.setitem(cublas.RULES, "sm_90", cublas.CublasRule("sm_90", True, 1.0, "what-if"))
    hw = ideal(h200, tensor_fp16_tflops=1e5, fp32_tflops=1e5, sfu_ops_per_clk_per_sm=4096,
               smem_bandwidth_bytes_per_clk_per_sm=4096)
    cfg = AttentionConfig(batch=8, heads=16, seqlen_q=2048, head_dim=64)
    for algorithm in ("naive", "flash1", "flash2"):
        r = simulate(cfg, algorithm, hw, l2=False)
        assert r.time_s == pytest.approx(r.hbm_bytes / hw.hbm_bytes_per_s, rel=0.03), algorithm
        assert r.bound == "hbm"


def test_h200_flash2_reads_the_compulsory_bytes_as_nsight_measured(h200):
    # ../shared/anchors/h200_ncu_2026-11-30.md: PyTorch's FlashAttention-2 kernel at B16 H16 N1024 d64 fp16
    # read 100.7 MB from DRAM (Q, K, V once) and moved 704 MB through L2.
    cfg = AttentionConfig(batch=16, heads=16, seqlen_q=1024, head_dim=64)
    r = simulate(cfg, "flash2", h200)
    assert r.hbm_read_bytes == pytest.approx(100.7e6, rel=0.01)
    assert 0.5 < r.l2_bytes / 704e6 < 1.5
    off = simulate(cfg, "flash2", h200, l2=False)        # the paper's two-level traffic
    assert off.hbm_read_bytes == analyze(cfg, "flash2", h200).hbm_read_bytes
    assert off.hbm_read_bytes > 5 * r.hbm_read_bytes


def test_l2_holds_s_for_the_softmax_when_s_is_small(h200):
    small = AttentionConfig(batch=1, heads=4, seqlen_q=1024, head_dim=64)     # S is 8 MB: fits in 60 MB
    r = simulate(small, "naive", h200)
    softmax = r.kernels[1]
    assert softmax.hbm_read.get("S", 0) == 0 and softmax.l2_hit_bytes == softmax.l2_read_bytes
    big = AttentionConfig(batch=16, heads=16, seqlen_q=1024, head_dim=64)     # S is 537 MB
    r = simulate(big, "naive", h200)
    assert r.kernels[1].hbm_read["S"] > 0.8 * big.tensor_bytes()["S"]
    no_l2 = h200.replace(l2_capacity_mib=0)
    assert simulate(small, "naive", no_l2).kernels[1].hbm_read["S"] == small.tensor_bytes()["S"]


def test_waves_and_occupancy(h200):
    cfg = AttentionConfig(batch=16, heads=16, seqlen_q=1024, head_dim=64)
    k = simulate(cfg, "flash2", h200).kernels[0]
    # 128x128 d64 two stages: 80 KiB (+1 reserved) per block, so 2 per SM on 228 KiB; 2048 blocks over 264
    assert k.blocks_per_sm == 2 and k.waves == pytest.approx(2048 / 264)


def test_longest_causal_blocks_first_shortens_the_last_wave(h200):
    # 24 heads of 16 query blocks seeing 1..16 key tiles, 1.5 waves; ascending, the last heads' longest blocks
    # start last and run on alone; descending, their shortest ones fill the gaps at the end
    cfg = AttentionConfig(batch=1, heads=24, seqlen_q=2048, head_dim=64, causal=True)
    asc, desc = (simulate(cfg, "flash2", h200, Tiling(q_order=o), exact=True).time_s
                 for o in ("ascending", "descending"))   # (coarse dispatch, past the budget, blurs the tail)
    assert desc < 0.98 * asc
    full = cfg.model_copy(update={"causal": False})
    assert simulate(full, "flash2", h200, Tiling(q_order="descending")).hbm_bytes == \
        simulate(full, "flash2", h200, Tiling()).hbm_bytes


def test_blocks_take_the_chips_slots_in_launch_order_whatever_their_cohort(h200):
    # 16 heads x 8 causal query blocks (8 signatures), 4 blocks an SM: the chip's scheduler places block b on
    # SM b % 132 in the first wave, so an SM holds query blocks q and q + 4 twice; grouped into cohorts first, the
    # engine had spread each query block over the SMs and balanced work the chip does not balance
    cfg = AttentionConfig(batch=4, heads=16, seqlen_q=512, head_dim=64, causal=True)
    r = simulate(cfg, "flash2", h200, Tiling(block_q=64, block_kv=64), max_steps=3, timeline=True)
    assert r.kernels[0].blocks_per_sm == 4
    t0 = min(b[2] for b in r.timeline.blocks)
    first = {b[4]: b[0] for b in r.timeline.blocks if b[2] == t0}
    assert len(first) == 512 and all(sm == b % h200.sm_count for b, sm in first.items())
    # the busiest SM holds query blocks 3, 7, 3, 7: 4 + 8 + 4 + 8 key tiles
    tiles = np.zeros(h200.sm_count, dtype=int)
    np.add.at(tiles, list(first.values()), [b % 8 + 1 for b in first])
    assert tiles.max() == 24


def test_flash1s_partial_last_wave_refills_whole_sms_and_flash2s_spreads(h200):
    # flash1 B34 H16 N512: 544 blocks, 4 an SM on this profile: the first wave takes the 528 slots, one block an SM
    # before any takes a second; the 16 later blocks go into the slots that freed, an SM's at once (4 SMs of 4), not
    # one an SM (the device's block trace: flash1's last 116 blocks of B32 H16 N512 on 56 SMs, 25 of them 3 an SM)
    def later_per_sm(cfg, alg, t):
        r = simulate(cfg, alg, h200, t, max_steps=3, timeline=True)
        t0 = min(b[2] for b in r.timeline.blocks)
        return r.kernels[0].blocks_per_sm, sorted(Counter(b[0] for b in r.timeline.blocks if b[2] > t0).values())
    cfg = AttentionConfig(batch=34, heads=16, seqlen_q=512, head_dim=64)
    assert later_per_sm(cfg, "flash1", Tiling(block_q=64, block_kv=64, loop_order="flash1")) == (4, [4, 4, 4, 4])
    # flash2's SMs keep pace (an SM's first-wave blocks end as far apart as the SMs do): 16 later blocks, one an SM
    # (B17 H8 N256 64x64: 544 blocks, 4 an SM)
    cfg = AttentionConfig(batch=17, heads=8, seqlen_q=256, head_dim=64)
    assert later_per_sm(cfg, "flash2", Tiling(block_q=64, block_kv=64)) == (4, [1] * 16)


def test_flash2_reads_its_q_tile_from_shared_memory_at_every_key_tile(h200):
    # B1 H1 N256, 64x64 d64: K and V (2 x 256 x 64 x 2 bytes) written once and read by each of 4 warps; Q (64 x 64
    # x 2) written once and read at each of the 4 key tiles (the A fragments of Q K^T come from shared memory)
    cfg = AttentionConfig(batch=1, heads=1, seqlen_q=256, head_dim=64)
    t = Tiling(block_q=64, block_kv=64)
    per_block = 5 * 65536 + 8192 + 4 * 8192
    for steps in (3, 64):
        assert simulate(cfg, "flash2", h200, t, max_steps=steps).sram_bytes == 4 * per_block


def test_timeline_records_blocks_per_sm_and_tier_busy_spans(h200):
    cfg = AttentionConfig(batch=2, heads=4, seqlen_q=512)
    r = simulate(cfg, "flash2", h200, timeline=True)
    blocks = r.timeline.blocks
    assert sum(1 for b in blocks) == 2 * 4 * 4                         # one record per block slot used
    assert {b[0] for b in blocks} <= set(range(h200.sm_count))
    assert all(0 <= b[2] < b[3] <= r.time_s for b in blocks)
    spans = r.timeline.tiers["hbm"]
    assert spans and all(a < b for a, b in spans)
    assert simulate(cfg, "flash2", h200).timeline is None


def test_double_buffering_overlaps_loads_with_compute(h200):
    cfg = AttentionConfig(batch=4, heads=16, seqlen_q=4096, head_dim=128)
    one = simulate(cfg, "flash2", h200, Tiling(block_q=128, block_kv=64, stages=1), l2=False)
    two = simulate(cfg, "flash2", h200, Tiling(block_q=128, block_kv=64, stages=2), l2=False)
    assert two.time_s < one.time_s and two.hbm_bytes == one.hbm_bytes


def test_flash1_rereads_its_own_state_from_l2_when_it_fits(h200):
    # B1 H1 N1024 d64: the fp32 O (256 KiB) written at each outer step is read back at the next from L2; only
    # Q, K and V come from HBM (the re-read is issued after the previous step's stores, not prefetched before)
    cfg = AttentionConfig(batch=1, heads=1, seqlen_q=1024, head_dim=64)
    r = simulate(cfg, "flash1", h200, Tiling(block_q=64, block_kv=64), cold_l2=True)
    reads = r.kernels[0].hbm_read
    assert reads.get("Oacc", 0) == reads.get("m", 0) == 0
    assert reads["Q"] == reads["K"] == reads["V"] == 1024 * 64 * 2
    # with 1,024 heads the per-step state of the resident blocks (~200 MB) cannot stay: re-reads miss
    big = cfg.model_copy(update={"batch": 64, "heads": 16})
    r = simulate(big, "flash1", h200, Tiling(block_q=64, block_kv=64), cold_l2=True, max_steps=4)
    assert r.kernels[0].hbm_read["Oacc"] > 0.9 * analyze(big, "flash1", h200, Tiling(block_q=64, block_kv=64)) \
        .kernels[0].hbm_read["Oacc"]


def test_a_kernel_with_few_bytes_in_flight_is_held_by_latency(h200):
    # naive softmax rows of 16k keys: 32 KiB a row, 2 KiB in flight a block, so 16 latencies a row
    cfg = AttentionConfig(batch=1, heads=8, seqlen_q=16384, head_dim=64)
    softmax = {t: simulate(cfg, "naive", h200, traits={"naive_softmax": Traits(bytes_in_flight=t)},
                           cold_l2=True).kernels[1].time_s for t in (1 << 30, 2048, 512)}
    assert softmax[1 << 30] < softmax[2048] < softmax[512]
    rows_per_slot = cfg.bh * cfg.seqlen_q / (h200.sm_count * 3)        # 64 KiB fp32 rows: 3 blocks an SM
    assert softmax[512] >= rows_per_slot * (32768 // 512) * h200.hbm_latency_ns * 1e-9


def test_naive_gemms_are_persistent_one_block_per_sm(h200):
    from iosim.plan import build_plan
    from iosim.plan import GemmTile
    big = build_plan(AttentionConfig(batch=4, heads=16, seqlen_q=2048), "naive", h200)
    tiles = {"qk": GemmTile(128, 128), "pv": GemmTile(64, 64)}
    small = build_plan(AttentionConfig(batch=1, heads=1, seqlen_q=256), "naive", h200, gemm_tiles=tiles)
    assert [k.n_blocks for k in big.kernels] == [h200.sm_count, 65536, h200.sm_count]
    assert big.kernels[1].n_blocks * big.kernels[1].launches_per_block == 4 * 16 * 2048   # a row a real block
    # 2x2 S tiles; pv's four 64-row O strips of four 64-key slices each, split stream-K over 16 blocks
    assert [k.n_blocks for k in small.kernels] == [4, 256, 16]


def test_naive_qk_stores_at_its_epilogue_rate(h200, monkeypatch):
    # d 64: qk writes as many bytes as it reads; its stores at 0.735 of the tiers' rates slow it, bytes unchanged
    cfg = AttentionConfig(batch=4, heads=16, seqlen_q=2048, head_dim=64)
    slow = simulate(cfg, "naive", h200, cold_l2=True).kernels[0]
    from iosim.kernels import cublas
    monkeypatch.setitem(cublas.RULES, "sm_90", cublas.CublasRule("sm_90", True, 1.0, "what-if"))
    fast = simulate(cfg, "naive", h200, cold_l2=True).kernels[0]
    assert slow.time_s > 1.1 * fast.time_s
    assert (slow.hbm_read, slow.hbm_write) == (fast.hbm_read, fast.hbm_write)


def test_naive_qk_epilogue_holds_s_when_l2_keeps_it(h200):
    # the epilogue, not the memory, holds its stores: S of 16 MiB, which L2 keeps whole, goes out no faster than
    # 0.735 of HBM's rate either (the stored records: 1.7-2.0 TB/s, kernel start and end included)
    held = AttentionConfig(batch=1, heads=8, seqlen_q=1024, head_dim=64)
    qk = simulate(held, "naive", h200, cold_l2=True).kernels[0]
    s_bytes = 8 * 1024 * 1024 * 2
    assert qk.hbm_write_bytes < s_bytes / 2 and qk.time_s >= s_bytes / (0.735 * h200.hbm_bytes_per_s)


def test_a_deep_gemm_pipeline_keeps_its_loads_in_flight(h200):
    # a lone head's P V in cuBLAS's 64 x 8 tiles: 128 strips of 16 key slices, split over the chip. With 16
    # stages (the name's _64x16_) a block's slices are all requested at once, their latencies overlapping and their
    # bytes served in order; with 2 it waits a latency a slice. Bytes and work are the same
    from iosim.plan import GemmTile
    cfg = AttentionConfig(batch=1, heads=1, seqlen_q=1024, head_dim=64)
    runs = {st: simulate(cfg, "naive", h200, cold_l2=True,
                         gemm_tiles={"qk": GemmTile(128, 64, 1, 2, 4), "pv": GemmTile(64, 8, 1, 2, st)})
            for st in (2, 16)}
    assert runs[16].kernels[2].time_s < 0.8 * runs[2].kernels[2].time_s
    assert runs[16].per_tensor() == runs[2].per_tensor() and runs[16].mma_flops == runs[2].mma_flops


def test_a_short_pv_splits_its_key_loop_over_the_chip_stream_k(h200):
    # B1 H1 N2048: 32 O strips of 32 slices; 8 slices a block fill 128 SMs, each strip's 4 parts leave 3 fp32
    # partials that its finisher reads back from L2
    # (in 64-row strips; cuBLAS itself takes narrower tiles there, `Cublas.tile`)
    from iosim.plan import GemmTile
    cfg = AttentionConfig(batch=1, heads=1, seqlen_q=2048, head_dim=64)
    tiles = {"pv": GemmTile(64, 64)}
    r = simulate(cfg, "naive", h200, cold_l2=True, gemm_tiles=tiles)
    pv = r.kernels[2]
    assert pv.blocks == 128
    part = 32 * 3 * 64 * 64 * 4
    off = simulate(cfg, "naive", h200, l2=False, gemm_tiles=tiles).kernels[2]
    assert off.hbm_write["Opart"] == off.hbm_read["Opart"] == part
    assert pv.hbm_read.get("Opart", 0) == 0                          # the partials stay in L2
    wide = simulate(AttentionConfig(batch=1, heads=8, seqlen_q=2048, head_dim=64), "naive", h200, cold_l2=True,
                    gemm_tiles=tiles)
    assert wide.kernels[2].blocks == h200.sm_count and "Opart" not in wide.kernels[2].hbm_write   # 256 strips


def test_split_kv_fills_the_chip_and_adds_a_combine_kernel(h200):
    cfg = AttentionConfig(batch=1, heads=1, seqlen_q=4096, head_dim=64)
    one = simulate(cfg, "flash2", h200, Tiling(block_q=64, block_kv=256), cold_l2=True)
    four = simulate(cfg, "flash2", h200, Tiling(block_q=64, block_kv=256, kv_splits=4), cold_l2=True)
    assert [k.name for k in four.kernels] == ["flash2_fwd_split", "flash2_combine"]
    assert four.kernels[0].blocks == 4 * one.kernels[0].blocks
    assert four.time_s < one.time_s                                   # 64 blocks on 132 SMs -> 256
    assert four.mma_flops == one.mma_flops
    acc = 4 * 4096 * 64 * 4
    assert four.kernels[0].hbm_write.get("Oacc", 0) + four.kernels[1].hbm_read.get("Oacc", 0) <= 2 * acc


def test_l2_partition_crossings_are_half_the_read_misses_and_writes_of_lsu_kernels(h200):
    # flash1 B4 H16 N2048 d128: Nsight counted 5,402 MB of requests and 2,703 MB from the other partition, half of
    # its read misses plus writes (experiments/l2_counters/l2_breakdown_h200_2026-11-30)
    cfg = AttentionConfig(batch=1, heads=8, seqlen_q=2048, head_dim=128)
    k = simulate(cfg, "flash1", h200, Tiling(block_q=64, block_kv=64), cold_l2=True, max_steps=4).kernels[0]
    assert k.l2_fabric_bytes == pytest.approx(0.5 * (k.l2_miss_bytes + k.l2_write_bytes), rel=1e-6)
    assert k.l2_fabric_bytes > 0
    # one partition: no crossings; cuBLAS's TMA GEMMs cross like the rest
    one = h200.replace(l2_partitions=1)
    assert simulate(cfg, "flash1", one, Tiling(block_q=64, block_kv=64), cold_l2=True).l2_fabric_bytes == 0
    for k in simulate(cfg, "naive", h200, cold_l2=True).kernels:
        assert k.l2_fabric_bytes == pytest.approx(0.5 * (k.l2_miss_bytes + k.l2_write_bytes), rel=1e-6)


def test_naive_gemms_in_cublas_tiles_count_what_nsight_counted(h200):
    # naive B4 H16 N4096 d128 bf16 causal as recorded (reports/measurements/h200): cuBLAS ran Q K^T in 256 x 128
    # tiles and P V in 128 x 256, both in clusters of two sharing a K or V tile (the kernels' names). Planned in
    # those tiles, with their multicasts and the partitions' crossings, each GEMM's L2 bytes are within 5% of
    # Nsight's lts__t_bytes; in the 128 x 128 and 64-row strips planned before, P V was 64% over
    from iosim.plan import GemmTile
    from iosim.validate import load_records, recorded_gemm_tiles
    rec = next(r for r in load_records(Path(__file__).parent.parent / "reports/measurements/h200")
               if r["key"].startswith("B4_H16_N4096_d128_bf16_causal__naive__"))
    tiles = recorded_gemm_tiles(rec["ncu"])
    assert tiles == {"qk": GemmTile(256, 128, 1, 2, 4), "pv": GemmTile(128, 256, 1, 2, 4)}
    cfg = AttentionConfig.make(**rec["config"])
    qk, _, pv = simulate(cfg, "naive", h200, cold_l2=True, max_steps=4, gemm_tiles=tiles).kernels
    measured = [k["lts__t_bytes.sum"] for k in rec["ncu"]["kernels"]]
    for k, m in zip((qk, pv), (measured[0], measured[-1])):
        assert (k.l2_read_bytes + k.l2_write_bytes + k.l2_fabric_bytes) / m == pytest.approx(1, abs=0.05)
    old = simulate(cfg, "naive", h200, cold_l2=True, max_steps=4,
                   gemm_tiles={"qk": GemmTile(128, 128), "pv": GemmTile(128, 64)}).kernels[2]
    assert (old.l2_read_bytes + old.l2_write_bytes + old.l2_fabric_bytes) / measured[-1] > 1.5


def test_block_overlap_hides_co_resident_blocks_softmax_and_is_bounded(h200):
    from iosim.errors import IosimError
    cfg = AttentionConfig(batch=16, heads=16, seqlen_q=2048, head_dim=64)     # full occupancy: 2 blocks an SM
    t = Tiling(block_q=128, block_kv=128, warps=4, stages=2)
    times = [simulate(cfg, "flash2", h200, t, traits=Traits(latency_rows=32.0, block_overlap=o),
                      max_steps=4).time_s for o in (0.0, 0.5, 1.0)]
    assert times[0] > times[1] > times[2]
    # one block per SM (B1 H1: 16 blocks) has nothing to overlap with
    one = AttentionConfig(batch=1, heads=1, seqlen_q=2048, head_dim=64)
    alone = [simulate(one, "flash2", h200, t, traits=Traits(latency_rows=32.0, block_overlap=o)).time_s
             for o in (0.0, 1.0)]
    assert alone[0] == pytest.approx(alone[1])
    with pytest.raises(IosimError, match="block_overlap"):
        Traits(block_overlap=1.5)


def test_l2_writes_back_the_oldest_dirty_bytes_beyond_its_dirty_capacity():
    # experiments/l2_capacity/l2_dirty.sh: a kernel writing 1 GiB leaves 28.5 MiB dirty in the H200's L2 (60 MiB), a copy of
    # 1 GiB 21.1 MiB; the cache with a 40 MiB holding and a 28.5 MiB dirty capacity does the same
    from iosim.engine.l2 import L2Cache
    mib, tile = 2**20, 64 * 1024
    cap = int(28.5 * mib)
    fill, plain = L2Cache(40 * mib, cap), L2Cache(40 * mib)
    during = {id(fill): 0, id(plain): 0}
    for lo in range(0, 256 * mib, tile):
        for c in (fill, plain):
            wb = c.access("buf", lo, lo + tile, write=True)[2]
            during[id(c)] += sum(wb.values()) if wb else 0
    assert during[id(fill)] == 256 * mib - cap and fill.dirty == cap
    assert during[id(plain)] == 216 * mib                                  # without: all it holds stays dirty
    assert sum(fill.flush().values()) == cap and fill.dirty == 0            # they stay cached, now clean
    assert fill.used == 40 * mib
    copy = L2Cache(40 * mib, cap)
    for lo in range(0, 256 * mib, tile):
        copy.access("src", lo, lo + tile, write=False)
        copy.access("dst", lo, lo + tile, write=True)
    assert copy.dirty == 20 * mib                                           # half of what it holds: under the cap
    # the same tile written again stays one dirty interval
    again = L2Cache(40 * mib, cap)
    for _ in range(3):
        again.access("x", 0, tile, write=True)
    assert again.dirty == tile and sum(again.flush().values()) == tile


def test_l2_holds_a_third_less_with_two_partitions(h200):
    # a partition keeps the lines its own SMs read, so a line homed in the other one is held twice: 60 MiB hold
    # 40 MiB of distinct data (experiments/l2_capacity/l2_probe_h200_2026-12-01: an SM's private data starts missing
    # between 32 and 48 MiB)
    assert h200.l2_holding_bytes == 40 * 2**20
    assert h200.replace(l2_partitions=1).l2_holding_bytes == h200.l2_bytes
    # flash1 B1 H8 N8192 d64 re-reads ~24 MB of Q and O state each outer step: held either way; at d128 (~48 MB)
    # only by one 60 MiB partition
    t = Tiling(block_q=64, block_kv=64)
    for d, two_holds in ((64, True), (128, False)):
        cfg = AttentionConfig(batch=1, heads=8, seqlen_q=8192, head_dim=d)
        miss = {p: simulate(cfg, "flash1", h200.replace(l2_partitions=p), t, cold_l2=True).kernels[0]
                .hbm_read.get("Oacc", 0) for p in (1, 2)}
        assert miss[1] == 0 and (miss[2] == 0) == two_holds


def test_causal_softmax_reads_only_the_scores_it_sees_and_writes_whole_rows(h200):
    # softmax_rows predicates off the loads of masked scores (Nsight: B4 H16 N256 causal read 4.73 MB of S's 8.4)
    cfg = AttentionConfig(batch=1, heads=2, seqlen_q=1024, head_dim=64, causal=True)
    soft = simulate(cfg, "naive", h200, l2=False).kernels[1]
    assert soft.hbm_read["S"] == 2 * (1024 * 1025 // 2) * 2
    assert soft.hbm_write["P"] == cfg.tensor_bytes()["S"]


def test_kernel_floor_and_block_dispatch_add_time(h200):
    cfg = AttentionConfig(batch=1, heads=1, seqlen_q=1024, head_dim=64)
    t = Tiling(block_q=64, block_kv=64)
    base = simulate(cfg, "flash2", h200, t).kernels[0].time_s
    floor = simulate(cfg, "flash2", h200.replace(kernel_floor_us=2.0), t).kernels[0].time_s
    assert floor == pytest.approx(base + 2e-6)
    # the softmax of 65,536 rows is 65,536 blocks: at 10 ns each the scheduler alone needs 655 us
    big = AttentionConfig(batch=4, heads=16, seqlen_q=1024, head_dim=64)
    slow = simulate(big, "naive", h200.replace(block_dispatch_ns=10.0), max_steps=4).kernels[1].time_s
    assert slow >= 65536 * 10e-9 > simulate(big, "naive", h200, max_steps=4).kernels[1].time_s



def test_the_softmax_rows_are_held_by_the_instructions_they_issue(h200):
    # softmax_rows issues about 23 instructions a visible key and 11 a masked one; at one a lane a clock, a long
    # row's issue outlasts its exps (16 a clock an SM) and fp32 work, so the issue is what bounds its compute
    from iosim.plan.costs import softmax_issue, softmax_work
    cfg = AttentionConfig(batch=1, heads=8, seqlen_q=4096, head_dim=64)
    k = simulate(cfg, "naive", h200, l2=False, traits={"naive_softmax": Traits(bytes_in_flight=1 << 20)}).kernels[1]
    keys = 8 * 4096 * 4096
    issue_s = softmax_issue(keys, keys) / (h200.fp32_flops_per_s / 2)
    exp, other = softmax_work(keys)
    assert exp / h200.exp_per_s + other / h200.fp32_flops_per_s < issue_s <= k.time_s
    # a causal softmax issues less (masked keys skip their loads, exps and normalisation) but not half as much
    causal = simulate(cfg.model_copy(update={"causal": True}), "naive", h200, l2=False,
                      traits={"naive_softmax": Traits(bytes_in_flight=1 << 20)}).kernels[1]
    assert 0.5 * k.time_s < causal.time_s < k.time_s


def test_out_of_phase_softmax_rows_overlap_one_blocks_loads_with_anothers_compute(h200):
    # in lockstep every block loads, then every block computes: HBM idles half the time. Out of phase (the plan's
    # declaration for the softmax) a row takes its latency chain and compute, or its share of bandwidth if longer
    from iosim.engine.run import run_plan
    from iosim.plan import build_plan
    from iosim.plan.behaviour import OutOfPhase, StepLoop
    cfg = AttentionConfig(batch=4, heads=16, seqlen_q=2048, head_dim=64)
    times = {}
    for phased in (True, False):
        plan = build_plan(cfg, "naive", h200)
        plan.kernels = [plan.kernels[1]]
        assert isinstance(plan.kernels[0].loop, OutOfPhase)
        plan.kernels[0].loop = OutOfPhase() if phased else StepLoop()
        times[phased] = run_plan(plan, h200, cfg.dtype, True, 4, False, True)[0][0].time_s
    moved = 2 * cfg.tensor_bytes()["S"]   # S read, P written
    assert moved / h200.hbm_bytes_per_s < times[True] < 0.9 * times[False]


def test_diagonal_tiles_cost_time_not_work(h200):
    from iosim.errors import IosimError
    # a tile crossing the causal diagonal (or the sequence's end) runs the kernel's masked loop body: slower, the
    # same counted FLOPs and bytes; a full mask over whole tiles has no such tile
    t = Tiling(block_q=128, block_kv=128)

    def run(cost, **kw):
        cfg = AttentionConfig(batch=4, heads=16, seqlen_q=kw.pop("n", 256), head_dim=64, **kw)
        return simulate(cfg, "flash2", h200, t, traits=Traits(diagonal_tile_cost=cost), max_steps=4)
    for kw, slower in (({"causal": True}, True), ({"n": 1000}, True), ({}, False)):
        base, masked = run(1.0, **dict(kw)), run(2.0, **dict(kw))
        assert (masked.time_s > 1.05 * base.time_s) == slower, kw
        assert masked.mma_flops == base.mma_flops and masked.hbm_bytes == base.hbm_bytes
    # flash1's inner steps on diagonal tiles alike
    cfg = AttentionConfig(batch=4, heads=16, seqlen_q=256, head_dim=64, causal=True)
    t1 = Tiling(block_q=64, block_kv=64, loop_order="flash1")
    one, two = (simulate(cfg, "flash1", h200, t1, traits=Traits(diagonal_tile_cost=c)) for c in (1.0, 2.0))
    assert two.time_s > 1.05 * one.time_s and two.mma_flops == one.mma_flops and two.hbm_bytes == one.hbm_bytes
    with pytest.raises(IosimError, match="diagonal_tile_cost must be between 1 and 10"):
        Traits(diagonal_tile_cost=0.5)


def test_a_block_holds_its_slot_while_it_issues_its_stores(h200):
    from iosim.errors import IosimError
    # one lone flash2 block (one query tile): issuing its O and log-sum-exp at a rate adds their bytes over that
    # rate to its time, less the memory's own time for them, which it no longer waits for at the end; counts stay
    cfg = AttentionConfig(batch=1, heads=1, seqlen_q=64, head_dim=64)
    t = Tiling(block_q=64, block_kv=64)
    at_once, slow = (simulate(cfg, "flash2", h200, t, traits=Traits(store_issue_bytes_per_s=r)) for r in (None, 1e9))
    out = 64 * 64 * 2 + 64 * 4
    hold = out / 1e9
    assert hold - h200.hbm_latency_ns * 1e-9 - 1e-7 < slow.time_s - at_once.time_s <= hold
    assert slow.hbm_bytes == at_once.hbm_bytes and slow.mma_flops == at_once.mma_flops
    # many blocks an SM: each holds its own slot, so the grid slows by about one hold a wave
    big = AttentionConfig(batch=8, heads=16, seqlen_q=1024, head_dim=64)
    fast_big, slow_big = (simulate(big, "flash2", h200, t, traits=Traits(store_issue_bytes_per_s=r), max_steps=4)
                          for r in (None, 1e9))
    assert slow_big.time_s > fast_big.time_s + hold
    with pytest.raises(IosimError, match="store_issue_bytes_per_s must be above 0"):
        Traits(store_issue_bytes_per_s=0.0)


def test_a_kernels_code_is_read_through_a_cold_l2_once_and_not_with_l2_off(h200):
    from iosim.errors import IosimError
    # instructions are data too: each kernel of a plan reads its own code from HBM as it starts (a cold L2 holds
    # none of it); with L2 off, the paper's two-level model, only the data counts, as in the analytic model
    cfg = AttentionConfig(batch=2, heads=4, seqlen_q=512, head_dim=64)
    code = 24_448
    plain, fetched = (simulate(cfg, "flash2", h200, traits=Traits(code_bytes=c), cold_l2=True) for c in (0, code))
    assert fetched.hbm_read_bytes - plain.hbm_read_bytes == code
    assert fetched.kernels[0].hbm_read["code"] == code and "code" not in plain.kernels[0].hbm_read
    assert fetched.l2_bytes - plain.l2_bytes == code
    assert fetched.time_s == pytest.approx(plain.time_s, rel=1e-3)   # counted, not timed
    # Nsight counts each of the GPCs' caches fetching it from L2 (the H200: 8); the engine records it once
    eight = NsightCounters(code_readers=8)
    assert fetched.kernels[0].code_bytes == code and plain.kernels[0].code_bytes == 0
    assert counters.l2_bytes(fetched, eight) - counters.l2_bytes(plain, eight) == 8 * code + code // 2
    assert counters.l2_bytes(fetched, NsightCounters()) == fetched.l2_bytes + fetched.l2_fabric_bytes
    # naive's three kernels each fetch their own code, even with L2 kept warm between them
    each = {k: Traits(code_bytes=code) for k in ("naive_qk", "naive_softmax", "naive_pv")}
    n0, n1 = (simulate(cfg, "naive", h200, traits=t) for t in (None, each))
    assert [k.hbm_read["code"] for k in n1.kernels] == [code] * 3
    assert n1.hbm_read_bytes - n0.hbm_read_bytes == 3 * code
    off = simulate(cfg, "flash2", h200, traits=Traits(code_bytes=code), l2=False)
    assert off.hbm_read_bytes == analyze(cfg, "flash2", h200).hbm_read_bytes
    with pytest.raises(IosimError, match="code_bytes must be between 0"):
        Traits(code_bytes=-1)


def test_flash1_issues_its_state_line_by_line_through_the_sms_l1(h200):
    from iosim.errors import IosimError
    from iosim.plan import build_plan
    # B1 H1 N256 d64, 64x64: 4 query blocks x 4 key tiles. 12 inner steps re-read and 12 write back the fp32 O
    # (16 KiB) with m and l (256 B each), a line lookup for each 32 bytes (a warp instruction's 8 rows x 32 B);
    # the 4 last ones write O in fp16 (8 KiB: 16 bytes of a row an instruction) and L
    cfg = AttentionConfig(batch=1, heads=1, seqlen_q=256, head_dim=64)
    t = Tiling(block_q=64, block_kv=64, loop_order="flash1")
    steps = build_plan(cfg, "flash1", h200, t).kernels[0].cohort(np.arange(1), 4)
    state = 64 * 64 * 4 + 2 * 64 * 4
    assert sum(s.l1_lines for s in steps) == 2 * 12 * state // 32 + 4 * (64 * 64 * 2 // 16 + 64 * 4 // 32)
    assert sum(s.serial_reloads for s in steps) == 12
    # a lone block issues them between its matmuls, at the SM's L1 rate; the datasheet profile does not limit it
    fast = h200.scaled(hbm_bandwidth_gb_s=50, l2_bandwidth_gb_s=50)    # the memory tiers out of the way
    l1 = fast.replace(l1_lines_per_clk_per_sm=1.0)
    lines_s = sum(s.l1_lines for s in steps) / l1.clock_hz
    solo = Traits(solo_sm_share=1.0)
    lone = [simulate(cfg, "flash1", p, t, traits=solo) for p in (fast, l1)]
    assert lone[1].time_s - lone[0].time_s == pytest.approx(lines_s, rel=1e-6)
    assert lone[1].hbm_bytes == lone[0].hbm_bytes and lone[1].mma_flops == lone[0].mma_flops
    # four blocks an SM share its L1: each takes at least four times its own lookups
    busy = AttentionConfig(batch=4, heads=132, seqlen_q=256, head_dim=64)
    assert build_plan(busy, "flash1", l1, t, traits=solo).kernels[0].blocks_per_sm(l1) == 4
    assert simulate(busy, "flash1", l1, t, traits=solo).kernels[0].time_s >= 4 * lines_s
    with pytest.raises(IosimError, match="l1_lines_per_clk_per_sm"):
        h200.replace(l1_lines_per_clk_per_sm=0.0)


def test_flash1_waits_a_memory_latency_for_each_inner_step_that_re_reads(h200):
    # its 12 re-reads hit L2: each waits L2's latency in its block's chain, so a lone block slows by at least 12
    # times a longer latency; blocks sharing an SM do not cover each other's waits (the device's block trace:
    # three flash1 blocks an SM run at 1.2 times a lone block's rate): 4 blocks an SM slow by 4 times as much
    cfg = AttentionConfig(batch=1, heads=1, seqlen_q=256, head_dim=64)
    t = Tiling(block_q=64, block_kv=64, loop_order="flash1")
    tr = Traits(latency_rows=16.0)
    near, far = (simulate(cfg, "flash1", h200.replace(l2_latency_ns=ns), t, traits=tr) for ns in (100.0, 2000.0))
    assert far.time_s - near.time_s >= 12 * 1900e-9
    # (HBM's latency moved with L2's: part of so many blocks' re-reads miss, and wait HBM's)
    busy = cfg.model_copy(update={"heads": 4 * h200.sm_count})
    near, far = (simulate(busy, "flash1", h200.replace(l2_latency_ns=ns, hbm_latency_ns=ns + h200.hbm_latency_ns),
                          t, traits=tr) for ns in (100.0, 2000.0))
    assert far.kernels[0].blocks_per_sm == 4 and far.time_s - near.time_s >= 4 * 12 * 1900e-9


def test_flash1_waits_for_its_first_q_tile_and_streams_the_others_beside_its_compute(h200):
    from iosim.plan import build_plan
    # B1 H1 N256 d64, 64x64: at outer step j the block waits for K_j, V_j and the Q tile of the first query block
    # that sees key tile j (j when causal); it prefetches the later ones behind the inner steps' compute
    t = Tiling(block_q=64, block_kv=64, loop_order="flash1")
    tile = 64 * 64 * 2
    for causal in (False, True):
        cfg = AttentionConfig(batch=1, heads=1, seqlen_q=256, head_dim=64, causal=causal)
        steps = build_plan(cfg, "flash1", h200, t).kernels[0].cohort(np.arange(1), 4)
        for j, s in enumerate(steps):
            first = j if causal else 0
            assert [(a.tensor, a.lo, a.nbytes * a.count) for a in s.loads if a.tensor == "Q"] == \
                [("Q", first * tile, tile)]
            assert sum(a.nbytes * a.count for a in s.streams) == (3 - first) * tile
            assert all(a.tensor == "Q" for a in s.streams)


def test_first_wave_repeats_count_at_the_merge_share_and_later_waves_in_full(h200):
    # one head, 64x64 tiles: every query block reads all of K and V (2 MiB at N 8192 d 64)
    kv = 2 * 8192 * 64 * 2
    cfg = AttentionConfig(batch=1, heads=1, seqlen_q=8192, head_dim=64)
    t = Tiling(block_q=64, block_kv=64)
    half = NsightCounters(merge_share=0.5)
    k = simulate(cfg, "flash2", h200, t, cold_l2=True, max_steps=4).kernels[0]
    # 128 blocks, one an SM, started together: each K/V line is asked for 128 times, 127 of them repeats; Nsight
    # misses half at the reference (every SM streaming), a little less with 128 of the 132. The engine's own
    # count is every request
    assert k.blocks == 128 and k.l2_repeat_bytes == 127 * kv and k.l2_read_bytes == 128 * kv + 8192 * 64 * 2
    assert counters.kernel_l2_bytes(k, NsightCounters()) - counters.kernel_l2_bytes(k, half) == \
        round(127 * kv * 0.5 * (128 / 144) / (132 / 148))
    # 128-row query blocks: fewer blocks, and so fewer SMs streaming, but the same share of their repeats merges
    # on as many SMs (the probe counted 64x64 and 128x128 tiles alike)
    k = simulate(cfg, "flash2", h200, Tiling(block_q=128, block_kv=64), cold_l2=True, max_steps=4).kernels[0]
    assert k.blocks == 64 and k.l2_repeat_bytes == 63 * kv
    assert counters.merged_share(k, half) == pytest.approx(0.5 * (64 / 80) / (132 / 148))
    # 1,024 blocks, four an SM: the first wave's 528 repeat 527 times, 1/4 of their shortfall stays; the later
    # blocks start as others end, out of step, and count in full
    cfg = AttentionConfig(batch=1, heads=1, seqlen_q=65536, head_dim=64)
    kv = 2 * 65536 * 64 * 2
    k = simulate(cfg, "flash2", h200, t, cold_l2=True, max_steps=4).kernels[0]
    assert k.blocks_per_sm == 4 and k.l2_repeat_bytes == 527 * kv
    assert counters.merged_share(k, half) == pytest.approx(0.5 / 4)
    # flash1 (one block a head) and naive's cuBLAS GEMMs (which multicast shared tiles) repeat nothing
    cfg = AttentionConfig(batch=1, heads=8, seqlen_q=2048, head_dim=64)
    for alg, til in (("flash1", t), ("naive", None)):
        assert all(k.l2_repeat_bytes == 0 for k in simulate(cfg, alg, h200, til, cold_l2=True).kernels)


def test_causal_first_wave_blocks_repeat_each_others_lines_across_cohorts(h200):
    # causal query blocks are cohorts of their own, yet start together and read K/V tile j at about the same time
    cfg = AttentionConfig(batch=1, heads=1, seqlen_q=4096, head_dim=64, causal=True)
    k = simulate(cfg, "flash2", h200, Tiling(block_q=64, block_kv=64), cold_l2=True, max_steps=64,
                 exact=True).kernels[0]   # (every block: coarse cohorts would merge the repeats)
    tile = 2 * 64 * 64 * 2                      # a K and a V tile
    requested, distinct = 64 * 65 // 2 * tile, 64 * tile
    assert k.l2_repeat_bytes == requested - distinct


def test_o_from_mma_fragments_is_written_in_two_requests_a_sector(h200):
    # our kernels store 16 bytes of a row of O a request: L1 issued exactly 2 x O in sectors
    # (experiments/l2_counters/l2_writes_h200_2026-12-02); Nsight counts the second request at the chip's share
    cfg = AttentionConfig(batch=64, heads=16, seqlen_q=256, head_dim=128, causal=True)
    t = Tiling(block_q=128, block_kv=64)
    o, lse = 64 * 16 * 256 * 128 * 2, 64 * 16 * 256 * 4
    k = simulate(cfg, "flash2", h200, t, cold_l2=True, max_steps=4).kernels[0]
    assert k.l2_write_bytes == o + lse                         # the engine: the bytes requested
    assert sum(s for s, n in k.partial_writes) == o and {n for _, n in k.partial_writes} == {2}
    plain = counters.kernel_l2_bytes(k, NsightCounters())
    # the counted second requests, and their crossings (half of them)
    assert counters.kernel_l2_bytes(k, NsightCounters(partial_write_share=0.5)) - plain == \
        pytest.approx(0.5 * o * 1.5, abs=len(k.partial_writes))
    # a kernel's own share where its traffic merges more of them
    own = NsightCounters(partial_write_share=0.5, kernel_partial_write_share={"flash2_fwd": 0.0})
    assert counters.kernel_l2_bytes(k, own) == plain
    # fp32 rows fill whole sectors; FlashAttention-2 stages O through shared memory into whole sectors
    assert fragment_writes(Traits(), 4) == {} and fragment_writes(Traits(o_fragment_stores=False), 2) == {}
    assert fragment_writes(Traits(), 2) == {"O": 2}


def test_register_spills_are_written_through_to_l2_per_key_tile(h200):
    # PyTorch's kernel stores its spills to local memory at every key tile and L1 writes them through to L2
    # (experiments/l2_counters/l2_writes_h200_2026-12-02, SET=torch and torch_waves)
    cfg = AttentionConfig(batch=4, heads=16, seqlen_q=1024, head_dim=64, causal=True)
    t = Tiling(block_q=128, block_kv=128)
    spilled = Traits(spill_bytes_per_tile=1000, spill_bytes_per_diagonal_tile=3000)
    plain = simulate(cfg, "flash2", h200, t, cold_l2=True, max_steps=4).kernels[0]
    k = simulate(cfg, "flash2", h200, t, traits=spilled, cold_l2=True, max_steps=4).kernels[0]
    # query block i of each of the 64 heads visits i interior key tiles and one diagonal one
    local = 64 * sum(1000 * i + 3000 for i in range(8))
    assert k.l2_local_bytes == local and plain.l2_local_bytes == 0
    assert k.l2_write_bytes - plain.l2_write_bytes == local and k.l2_read_bytes == plain.l2_read_bytes
    assert k.l2_fabric_bytes - plain.l2_fabric_bytes == round(h200.l2_far_share * local)
    assert k.hbm_read_bytes == plain.hbm_read_bytes and k.hbm_write_bytes == plain.hbm_write_bytes
    # folding steps does not change the count; the paper's two-level model counts data only
    assert simulate(cfg, "flash2", h200, t, traits=spilled, max_steps=64).kernels[0].l2_local_bytes == local
    off = simulate(cfg, "flash2", h200, t, traits=spilled, l2=False)
    assert off.per_tensor() == analyze(cfg, "flash2", h200, t).per_tensor()
    with pytest.raises(Exception, match="spill_bytes_per_tile"):
        Traits(spill_bytes_per_tile=-1)


def test_a_first_wave_fetches_code_beyond_an_sms_caches_at_its_first_masked_tile(h200):
    # experiments/cold_start/first_tile.py: on a causal grid starting on every SM, the warps of a kernel whose code outgrows
    # the SM's instruction caches wait about a microsecond for instructions that a lone head does not wait for
    hw = h200.replace(code_cache_kib=32.0, code_fetch_gb_s=400.0, gpc_count=8)
    t = Tiling(block_q=128, block_kv=128)
    big, small = Traits(code_bytes=32 * 1024 + 20000), Traits(code_bytes=30000)

    def time(alg, batch, heads, causal, traits, profile):
        cfg = AttentionConfig(batch=batch, heads=heads, seqlen_q=256, head_dim=64, causal=causal)
        tiling = t if alg == "flash2" else Tiling(block_q=64, block_kv=64)
        return simulate(cfg, alg, profile, tiling, traits=traits, cold_l2=True, max_steps=4).kernels[0].time_s

    wait = 20000 * 16 / 400e9   # the bytes beyond the cache, for 16 SMs of a GPC (128 blocks over 8 GPCs)
    assert time("flash2", 4, 16, True, big, hw) - time("flash2", 4, 16, True, big, h200) == \
        pytest.approx(wait, rel=0.05)
    # a lone head's 2 SMs share their GPCs with no one starting with them: a quarter of an SM's share each
    lone = time("flash2", 1, 1, True, big, hw) - time("flash2", 1, 1, True, big, h200)
    assert lone == pytest.approx(20000 * 2 / 8 / 400e9, rel=0.05)
    # flash1's 64 blocks (one a head) on 64 SMs: 8 a GPC
    assert time("flash1", 4, 16, True, big, hw) - time("flash1", 4, 16, True, big, h200) == \
        pytest.approx(20000 * 8 / 400e9, rel=0.05)
    # no masked tile (non-causal, whole tiles) or code the SM holds: nothing to wait for
    assert time("flash2", 4, 16, False, big, hw) == time("flash2", 4, 16, False, big, h200)
    assert time("flash2", 4, 16, True, small, hw) == time("flash2", 4, 16, True, small, h200)
    # only the first wave waits: 2,048 blocks (16 waves) pay it about once, not once a wave
    many = time("flash2", 64, 16, True, big, hw) - time("flash2", 64, 16, True, big, h200)
    assert 0 < many < 2 * wait


def test_a_builds_counted_pipe_cycles_time_its_softmax_not_its_counts(h200):
    from iosim.errors import IosimError
    # lone blocks (32 query blocks of 128 rows on 132 SMs), 32 key tiles each: a build's measured non-tensor pipe
    # cycles stand for the counted exp and fp32 work's time, a tile's at the SM's clock (a lone block using its whole
    # SM); the counts stay
    cfg = AttentionConfig(batch=1, heads=1, seqlen_q=4096, head_dim=64)
    t = Tiling(block_q=128, block_kv=128)

    def run(**kw):
        return simulate(cfg, "flash2", h200, t, traits=Traits(solo_sm_share=1.0, **kw), max_steps=4)
    base, one, two = run(), run(tile_pipe_cycles=20_000.0), run(tile_pipe_cycles=40_000.0)
    assert two.time_s - one.time_s == pytest.approx(32 * 20_000 / h200.clock_hz, rel=0.02)
    assert one.exp_ops == base.exp_ops and one.other_flops == base.other_flops and one.hbm_bytes == base.hbm_bytes
    # a block's prologue and epilogue once a block, only with its tiles counted
    blk = run(tile_pipe_cycles=20_000.0, block_pipe_cycles=50_000.0)
    assert blk.time_s - one.time_s == pytest.approx(50_000 / h200.clock_hz, rel=0.02)
    assert run(block_pipe_cycles=50_000.0).time_s == base.time_s
    # flash1: a key tile each inner step
    t1 = Tiling(block_q=64, block_kv=64, loop_order="flash1")
    c1 = AttentionConfig(batch=1, heads=4, seqlen_q=512, head_dim=64)
    f1, f2 = (simulate(c1, "flash1", h200, t1, traits=Traits(solo_sm_share=1.0, tile_pipe_cycles=c))
              for c in (20_000.0, 40_000.0))
    assert f2.time_s - f1.time_s == pytest.approx(64 * 20_000 / h200.clock_hz, rel=0.02)
    with pytest.raises(IosimError, match="tile_pipe_cycles must be between 0 and 1e9"):
        Traits(tile_pipe_cycles=-1.0)


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from("AB"), st.integers(0, 300), st.sampled_from([1, 2, 5, 16, 64, 200]),
                              st.booleans()), min_size=1, max_size=60),
       capacity=st.sampled_from([64, 300]))
def test_l2_keeps_bytes_as_a_byte_by_byte_lru_would(ops, capacity):
    # the cache's intervals are an implementation: hits, misses, write-backs, what it holds and what is dirty are
    # those of a cache of single bytes, least recently used first out (the lowest address first among equals),
    # dirty bytes written back as they go
    from iosim.engine.l2 import L2Cache
    cache, ref, clock = L2Cache(capacity), {}, 0   # ref: (tensor, byte) -> [last use, dirty]
    for tensor, lo, size, write in ops:
        clock += 1
        hit, miss, wb = cache.access(tensor, lo, lo + size, write)
        keys = [(tensor, x) for x in range(lo, lo + size)]
        assert hit == sum(k in ref for k in keys) and miss == size - hit
        for k in keys:
            ref[k] = [clock, write or (k in ref and ref[k][1])]
        out: Counter = Counter()
        for k in sorted(ref, key=lambda k: (ref[k][0], k))[:max(0, len(ref) - capacity)]:
            if ref.pop(k)[1]:
                out[k[0]] += 1
        assert Counter(wb or {}) == out
        assert cache.used == len(ref) and cache.dirty == sum(v[1] for v in ref.values())
