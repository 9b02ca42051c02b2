"""The stored findings of experiments/: each probe's data, read back by its own script, says what the profile
field or trait it supports says. CPU only: the data were measured on the H200."""
import importlib.util
import statistics
from pathlib import Path

import pytest

from gpu_kernels import measure
from iosim import counters

ROOT = Path(__file__).resolve().parent.parent


def _bench(name: str):
    """An experiment's script, imported from its folder (experiments/<question>/<name>.py)."""
    path = next(ROOT.glob(f"experiments/*/{name}.py"))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_stored_l2_probe_shows_the_holding_capacity_the_engine_uses():
    # experiments/l2_capacity/l2_probe_h200_2026-12-01 (experiments/l2_capacity/l2_probe.sh): DRAM reads per probe, in MiB
    from iosim.hardware import load_profile
    l2_probe = _bench("l2_probe")
    csv = ROOT / "experiments/l2_capacity/l2_probe_h200_2026-12-01/l2_probe.csv"
    ks = measure.ncu_kernels(csv.read_text())
    names = [n for n, _ in l2_probe.labels()]
    assert len(ks) == len(names)
    read = {n: float(k["raw"]["dram__bytes_read.sum"][0]) / 2**20 for n, k in zip(names, ks)}
    # data private to an SM, read and rewritten 4 times: held whole up to 32 MiB, mostly lost from 48 MiB
    assert all(read[f"rw {w} MiB x4"] < 1.05 * w for w in (8, 16, 24, 28, 32))
    assert read["rw 48 MiB x4"] > 3 * 48 and read["rw 96 MiB x4"] > 3.9 * 96
    # data every SM reads: held to 28 MiB, about half of the 60 (a copy in each partition)
    assert read["ro 28 MiB x2 by 132"] < 1.05 * 28 < 1.9 * 32 < read["ro 32 MiB x2 by 132"]
    holding = load_profile("h200_sxm").l2_holding_bytes / 2**20
    assert 32 < holding < 48


def test_stored_l2_dirty_gives_the_profiles_dirty_capacity():
    # experiments/l2_capacity/l2_dirty_h200_2026-12-01 (experiments/l2_capacity/l2_dirty.sh): written MiB minus what reached HBM
    # while the kernel ran is what L2 still held dirty when it ended
    from iosim.hardware import load_profile
    cases = _bench("l2_dirty").CASES
    csv = ROOT / "experiments/l2_capacity/l2_dirty_h200_2026-12-01/l2_dirty.csv"
    ks = measure.ncu_kernels(csv.read_text())
    assert len(ks) == len(cases)
    held = {c: mib - float(k["raw"]["dram__bytes_write.sum"][0]) / 2**20 for c, k in zip(cases, ks)
            for mib in [c[1]]}
    assert held[("fill", 16)] > 15.9 and held[("fill", 24)] > 23.9          # all of it, below the capacity
    fills = [held[("fill", m)] for m in (48, 64, 128, 256, 1024)]
    assert 28 < min(fills) and max(fills) < 29                                # a capacity, whatever was written
    assert 20 < held[("copy", 1024)] < 22                                     # clean lines compete for the rest
    assert load_profile("h200_sxm.calibrated").l2_dirty_mib == round(held[("fill", 1024)], 1)


def test_stored_pipe_shares_show_a_lone_blocks_pipes_in_turn_and_co_resident_blocks_overlapping():
    # experiments/pipe_cycles/pipe_overlap_h200_2026-12-02 (experiments/pipe_cycles/pipe_overlap.sh): tensor, XU, FMA and ALU busy
    # shares of our flash2 builds, a block an SM (B1 H1) and several (B4 H16), each run twice
    bench = _bench("pipe_overlap")
    folder = ROOT / "experiments/pipe_cycles/pipe_overlap_h200_2026-12-02"
    shares = bench.pipe_shares(str(folder / "pipes.csv"))
    assert len(shares) == len(bench.RUNS) == 8
    lone = {r[3:]: s for r, s in shares.items() if r[0] == 1}
    busy = {r[3:]: s for r, s in shares.items() if r[0] == 4}
    for tiles, (tensor, total) in lone.items():
        assert 0.6 < total < 1.05, tiles            # in turn: never much past the time itself
        assert total < busy[tiles][1] and tensor < busy[tiles][0]   # company fills the gaps
    assert lone[64, 128, 128][1] > 0.95 and lone[128, 128, 64][1] > 0.85   # 128-row blocks leave few gaps
    assert max(s[1] for s in busy.values()) > 1.2


def test_stored_l2_merge_shows_requests_merging_warm_as_cold():
    # experiments/l2_counters/l2_merge_h200_2026-12-01 (experiments/l2_counters/l2_merge.sh): the share of the K, V and Q read
    # requests that L2 counted, with L2 emptied before the kernel and with the data already resident
    bench = _bench("l2_merge")
    folder = ROOT / "experiments/l2_counters/l2_merge_h200_2026-12-01"

    def share(name: str, mode: str) -> dict:
        return {cfg: read / bench.requested_mb(*cfg)
                for cfg, (read, _) in zip(bench.SETS[name], bench.reads(folder / ("load" if name == "load" else ""),
                                                                          name, mode))}
    cold, warm = share("main", "all"), share("main", "none")
    lone = [("flash2", 1, 1, 8192, 64, 64, 64), ("flash2", 1, 8, 1024, 64, 64, 64),
            ("flash2", 1, 1, 1024, 64, 64, 64)]
    for c in lone:   # one block an SM: a third to two thirds counted, and as much warm as cold
        assert 0.25 < cold[c] < 0.7 and abs(cold[c] - warm[c]) < 0.05
    assert cold["flash2", 4, 16, 4096, 64, 64, 64] > 0.9 and cold["torch", 4, 16, 4096, 64, 128, 128] > 0.9
    # the load set: one block an SM, the share follows the SMs streaming (16 -> 128), not a tile's readers
    load = {(h * n // bq, n, d, bq): v for (_, _, h, n, d, bq, _), v in share("load", "all").items()}
    assert load[16, 1024, 64, 64] > 0.6 and load[16, 2048, 64, 128] > 0.6 and load[16, 2048, 128, 128] > 0.6
    assert len(load) == len(bench.LOAD) and all(v < 0.35 for (sms, *_), v in load.items() if sms == 128)
    assert abs(load[128, 1024, 64, 64] - load[128, 4096, 64, 64]) < 0.06  # 16 or 64 readers of a tile


def test_stored_l2_writes_show_two_requests_a_sector_of_o_and_give_the_profiles_share():
    # experiments/l2_counters/l2_writes_h200_2026-12-02 (experiments/l2_counters/l2_writes.sh): our flash2 stores 16 bytes of a
    # row of O a request, so L1 sends two requests a sector; L2 counts part of the second ones
    from iosim.hardware import load_profile
    bench = _bench("l2_writes")
    rows = bench.shares(ROOT
                        / "experiments/l2_counters/l2_writes_h200_2026-12-02/l2_writes.csv")
    assert len(rows) == len(bench.CONFIGS) == 9
    assert all(l1 == pytest.approx(1.0, abs=1e-4) for _, l1, _, _ in rows)
    clean = [s for _, _, s, spill in rows if not spill]
    assert len(clean) == 6 and all(0.3 < s < 0.95 for s in clean)
    assert counters.H200.partial_write_share == round(statistics.median(clean), 2)
    # flash1 stores O the same way, amid its own fp32 O, m, l traffic: L2 merges most second requests
    rows = bench.shares(ROOT
                        / "experiments/l2_counters/l2_writes_h200_2026-12-02/l2_writes_flash1.csv", "flash1")
    assert len(rows) == len(bench.FLASH1) == 6 and all(l1 == pytest.approx(1.0, abs=1e-4) for _, l1, _, _ in rows)
    assert counters.H200.kernel_partial_write_share["flash1_fwd"] == round(statistics.median(s for _, _, s, _ in rows), 2) < 0.5
    # SET=sources: the GPCs' caches read 8 x the kernel's machine code (plus 18-19 KB) whatever the grid
    from gpu_kernels.measure import ncu_kernels
    from iosim.kernels.builds import code_bytes
    from iosim.plan import Tiling
    csv = (ROOT
           / "experiments/l2_counters/l2_writes_h200_2026-12-02/l2_writes_sources.csv").read_text()
    for (b, h, n, d, c, (bq, bk)), k in zip(bench.SOURCES, ncu_kernels(csv)):
        code = code_bytes("flash2", d, Tiling(block_q=bq, block_kv=bk), "fp16")
        gcc = float(k["raw"]["lts__t_sectors_srcunit_gcc.sum"][0]) * 32
        assert 0 < gcc - 8 * code < 20_000
    assert counters.H200.code_readers == 8 == load_profile("h200_sxm.calibrated").gpc_count


def test_stored_torch_spills_reach_l2_and_give_the_validated_spill_bytes():
    # SET=torch: PyTorch's kernel's local stores per key tile (interior and diagonal, solved from the grids) are
    # the figures iosim.validate predicts it with; SET=torch_waves: L1 sends L2 every byte of them, in one-wave grids
    # (one or two blocks an SM) as in grids of several waves
    from gpu_kernels.measure import ncu_kernels
    from iosim.kernels import torch_fa2
    bench = _bench("l2_writes")
    folder = ROOT / "experiments/l2_counters/l2_writes_h200_2026-12-02"
    assert bench.fa2_spills(folder / "l2_writes_torch.csv") == torch_fa2.SPILL_BYTES
    for name in ("torch", "torch_waves"):
        kernels = ncu_kernels((folder / f"l2_writes_{name}.csv").read_text())
        assert len(kernels) == len(bench.SETS[name][1]) >= 5
        for k in kernels:
            local, through = bench.local_stores(k)
            assert local > 1e6 and through == pytest.approx(local, rel=0.005)


def test_stored_first_tile_stalls_show_causal_grids_waiting_for_instructions_on_every_sm():
    # experiments/cold_start/first_tile_h200_2026-12-02 (experiments/cold_start/first_tile.sh): pairs of a lone head and a grid
    # of one block on about every SM; the causal ones stall for instructions, the non-causal ones do not, and the
    # GPCs' caches ask L2 for the code once each either way
    from gpu_kernels.measure import ncu_kernels
    bench = _bench("first_tile")
    path = ROOT / "experiments/cold_start/first_tile_h200_2026-12-02/first_tile.csv"
    ks = ncu_kernels(path.read_text())
    assert len(ks) == len(bench.CONFIGS) == 10
    raw = [{m.rsplit(".", 1)[0]: float(v) for m, (v, _) in k["raw"].items()} for k in ks]
    stall = "smsp__average_warps_issue_stalled_no_instruction_per_issue_active"
    for i in range(0, 10, 2):
        (b, h, *_, causal, _), lone, wide = bench.CONFIGS[i], raw[i], raw[i + 1]
        assert b * h == 1 and bench.CONFIGS[i + 1][:2] != (1, 1) and bench.CONFIGS[i + 1][4] == causal
        assert lone["lts__t_sectors_srcunit_gcc"] == wide["lts__t_sectors_srcunit_gcc"]
        if causal:
            assert wide[stall] - lone[stall] > 0.2
        else:
            assert abs(wide[stall] - lone[stall]) < 0.05




def test_stored_first_tile_passes_give_the_profiles_code_cache_and_fetch_rate():
    # experiments/cold_start/first_tile_h200_2026-12-02: two passes of flash2's pairs and one of flash1's; the
    # calibrated profile's code_cache_kib and code_fetch_gb_s are what experiments/cold_start/first_tile.py derives from them
    from iosim.hardware import load_profile
    bench = _bench("first_tile")
    folder = ROOT / "experiments/cold_start/first_tile_h200_2026-12-02"
    rows = bench.stored_waits(folder)
    assert len(rows) == 3 + 3 + 3
    held, rate = bench.cold_code_fit(rows)
    hw = load_profile("h200_sxm.calibrated")
    assert hw.code_cache_kib * 1024 == held == 38144 and hw.code_fetch_gb_s == pytest.approx(rate, abs=0.005)
    # flash1 (28 and 37 KiB of code) waited no longer on every SM than alone; flash2's 128-row kernels (56-58 KiB)
    # waited 0.78-1.28 us a warp longer in both passes
    assert all(r[5] <= 0 for r in rows if r[0] == "flash1")
    assert all(0.7 < r[5] < 1.3 for r in rows if r[0] == "flash2" and r[2] == 128)


def test_cublas_runs_cutlass_align1_gemms_exactly_where_rows_are_misaligned():
    # experiments/cublas_alignment: in the calibration records, every GEMM at an odd N is CUTLASS's sm75 align1
    # kernel and every GEMM at N a multiple of 8 is nvjet (the kernel type iosim plans)
    from iosim.records import load_all
    variant = _bench("survey").variant
    seen = {}
    for rec in load_all():
        if rec.get("set") != "calibration" or rec["algorithm"] not in ("naive", "torch_naive") or not rec.get("ncu"):
            continue
        nk = rec["config"].get("seqlen_k") or rec["config"]["seqlen_q"]
        for k in rec["ncu"]["kernels"]:
            v = variant(k["name"])
            if v:
                seen.setdefault(nk % 8 == 0, set()).add(v)
    assert seen == {True: {"nvjet"}, False: {"sm75 align1"}}


def test_stored_effects_show_pytorchs_fa2_reading_kv_again_where_our_flash2_does_not():
    # experiments/effects (H100 records): on every causal forward grid whose K/V outgrow L2, PyTorch's
    # FlashAttention-2 (last-to-first K/V walk) reads at least 1.5x the DRAM bytes iosim's flash2 reads; every record
    # belongs to one effect of the sweep
    from iosim.records import load_records
    from iosim.workload import AttentionConfig
    effect = _bench("score").effects_by_label()
    read: dict = {}
    for rec in load_records(ROOT / "reports/measurements/h100_effects"):
        cfg = AttentionConfig.make(**rec["config"])
        assert cfg.label() in effect, rec["key"]
        if effect[cfg.label()] == "K/V beyond L2" and cfg.causal and rec["algorithm"] in ("flash2", "torch_flash"):
            read.setdefault(cfg.label(), {})[rec["algorithm"]] = rec["ncu"]["dram_read_bytes"]
    assert len(read) == 4
    for label, r in read.items():
        assert r["torch_flash"] >= 1.5 * r["flash2"], label
