"""The measurement harness's CPU-side parts: the sweep, the split, record keys, parsing Nsight Compute's CSV,
and the clear refusal where there is no GPU."""
import statistics
from pathlib import Path

import pytest

from gpu_kernels import measure
from iosim.cli import main
from iosim.workload import AttentionConfig


def test_default_sweep_covers_what_the_issue_asks():
    entries = measure.default_sweep()
    cfgs = [AttentionConfig.make(**e["config"]) for e in entries]
    assert len(cfgs) >= 40
    assert {c.seqlen_q for c in cfgs} >= {256, 16384} and {c.head_dim for c in cfgs} == {64, 128}
    assert {c.dtype for c in cfgs} == {"fp16", "bf16"} and {c.causal for c in cfgs} == {False, True}
    assert min(c.bh for c in cfgs) == 1 and max(c.bh for c in cfgs) == 1024
    algs = {r["algorithm"] for e in entries for r in e["runs"]}
    assert algs >= {"naive", "flash1", "flash2", "torch_flash"}
    assert all(sum(r["algorithm"] == "flash2" for r in e["runs"]) >= 2 for e in entries)  # two tilings
    sets = [measure.split_of(c) for c in cfgs]
    assert 0.1 < sets.count("calibration") / len(sets) < 0.5      # both sets are there, split by config
    keys = [k for k, *_ in measure.expand(entries)]
    assert len(keys) == len(set(keys))                           # one record per measurement


def test_ncu_csv_is_split_by_marker_kernels():
    rows = ['"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
            '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"']

    def k(i, name, vals):
        for metric, v in vals.items():
            rows.append(f'"{i}","1","python","h","{name}","1","7","(1, 1, 1)","(1, 1, 1)","0","9.0","s",'
                        f'"{metric}","{"ns" if "time" in metric else "byte"}","{v}"')
    zero = {m: 0 for m in measure.NCU_METRICS.split(",")}
    k(0, "randn_kernel", zero)
    k(1, "iosim_marker", zero)
    k(2, "flash2_fwd<64>", {"dram__bytes_read.sum": "1,000", "dram__bytes_write.sum": 10,
                            "lts__t_bytes.sum": 5000, "gpu__time_duration.sum": 0.001})
    k(3, "iosim_marker", zero)
    k(4, "randn_kernel", zero)
    k(5, "iosim_marker", zero)
    k(6, "gemm", {"dram__bytes_read.sum": 7, "dram__bytes_write.sum": 8, "lts__t_bytes.sum": 9,
                  "gpu__time_duration.sum": 0.5})
    k(7, "softmax_rows", {"dram__bytes_read.sum": 1, "dram__bytes_write.sum": 1, "lts__t_bytes.sum": 1,
                          "gpu__time_duration.sum": 0.25})
    k(8, "iosim_marker", zero)
    segs = measure._segments("==PROF== noise\n" + "\n".join(rows))
    assert [[x["name"] for x in s] for s in segs] == [["flash2_fwd<64>"], ["gemm", "softmax_rows"]]
    assert segs[0][0]["dram__bytes_read.sum"] == 1000
    assert segs[1][0]["gpu__time_duration.sum"] == pytest.approx(0.5e-9)      # ns -> s
    assert segs[1][0]["raw"]["gpu__time_duration.sum"] == ["0.5", "ns"]        # as printed, kept
    with pytest.raises(ValueError, match="unknown ncu unit"):
        measure._segments("\n".join(rows).replace('"ns"', '"fortnight"'))


def test_measure_without_a_gpu_says_so_in_one_line(capsys, monkeypatch, tmp_path):
    try:
        import torch
        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU")
    except ImportError:
        pass
    with pytest.raises(SystemExit) as e:
        main(["measure", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "measuring needs" in err


def test_calibrate_writes_each_measured_field_with_its_method(monkeypatch, tmp_path):
    from gpu_kernels import calibrate
    from iosim.hardware import load_profile, parse_profile
    monkeypatch.setattr(calibrate, "_gpu_name", lambda: "Test GPU")
    hw = load_profile("h200_sxm")
    res = {"hbm_bandwidth_gb_s": (4265.4171, "a copy"), "hbm_latency_ns": (354.2, "a pointer chase"),
           "l2_latency_ns": (145.6, "a chase in L2"), "copy_below_l2_gb_s": (5118.0, "copies"),
           "smem_lds128_bytes_per_clk_per_sm": (63.8, "LDS.128"), "hbm_read_gb_s": (4400.0, "reads"),
           "memset_gb_s": (213.0, "memset"), "hbm_write_gb_s": (4347.6, "a fill"),
           "kernel_floor_us": (1.634, "an empty kernel"), "l2_bandwidth_gb_s": (17593.6, "plain re-reads"),
           "l2_only_read_gb_s": (7228.2, "cg loads"), "l2_only_write_gb_s": (4183.1, "cg stores"),
           "l2_only_copy_gb_s": (6572.8, "a cg copy")}
    path = tmp_path / "test.calibrated.toml"
    assert hw.kernel_floor_us is None   # an optional field the datasheet lacks is written once measured
    text = calibrate.write_profile(hw, res, path)
    cal = parse_profile(text, str(path), key=path.stem)
    assert cal.hbm_bandwidth_gb_s == 4265.417 and cal.hbm_latency_ns == 354.2 and cal.l2_latency_ns == 145.6
    assert cal.kernel_floor_us == 1.634 and "an empty kernel on Test GPU" in cal.sources["kernel_floor_us"]
    assert "write alone 4348 GB/s (a fill)" in text   # reported in the header, not a field
    # the engine's L2 rate is the plain re-read (L1 helps); L2 alone is reported beside it
    assert cal.l2_bandwidth_gb_s == 17593.6 and "plain re-reads on Test GPU" in cal.sources["l2_bandwidth_gb_s"]
    assert "read 7228 GB/s (cg loads); write 4183 GB/s (cg stores); copy 6573 GB/s (a cg copy)" in text
    assert cal.sources["hbm_latency_ns"].startswith("measured:") and "a pointer chase on Test GPU" in \
        cal.sources["hbm_latency_ns"]
    assert cal.sm_count == hw.sm_count and cal.sources["sm_count"] == hw.sources["sm_count"]   # copied as is


def test_a_sweep_file_is_checked_whole_with_one_line_errors(tmp_path, capsys):
    sweeps = Path(__file__).resolve().parent.parent / "reports/measurements/sweeps"
    good = measure.load_sweep(sweeps / "holdout_h200.json")
    assert len(measure.expand(good)) == 50
    # the second calibration sweep decides its set before measuring: every entry says calibration
    cal2 = measure.load_sweep(sweeps / "calibration2_h200.json")
    assert len(measure.expand(cal2)) == 80 and {e["set"] for e in cal2} == {"calibration"}
    for text, says in (("[]", "non-empty"), ('[{"config": {}}]', "'config' and 'runs'"),
                       ('[{"config": {}, "runs": [{"algorithm": "fast"}]}]', "algorithm must be one of"),
                       ('[{"config": {"seqlen_q": -1}, "runs": [{"algorithm": "naive"}]}]', "seqlen_q"),
                       ('[{"config": {}, "set": "train", "runs": [{"algorithm": "naive"}]}]', "set must be one of"),
                       ("{not json", "sweep file")):
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(SystemExit) as e:
            main(["measure", "--sweep", str(bad), "--out", str(tmp_path / "out")])
        err = capsys.readouterr().err
        assert e.value.code == 2 and says in err and len(err.strip().splitlines()) == 1
        assert not (tmp_path / "out").exists()


def _bench(name: str):
    import importlib.util
    path = Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_stored_l2_probe_shows_the_holding_capacity_the_engine_uses():
    # reports/measurements/l2_probe_h200_2026-12-01 (benchmarks/l2_probe.sh): DRAM reads per probe, in MiB
    from iosim.hardware import load_profile
    l2_probe = _bench("l2_probe")
    csv = Path(__file__).resolve().parent.parent / "reports/measurements/l2_probe_h200_2026-12-01/l2_probe.csv"
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
    # reports/measurements/l2_dirty_h200_2026-12-01 (benchmarks/l2_dirty.sh): written MiB minus what reached HBM
    # while the kernel ran is what L2 still held dirty when it ended
    from iosim.hardware import load_profile
    cases = _bench("l2_dirty").CASES
    csv = Path(__file__).resolve().parent.parent / "reports/measurements/l2_dirty_h200_2026-12-01/l2_dirty.csv"
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
    # reports/measurements/pipe_overlap_h200_2026-12-02 (benchmarks/pipe_overlap.sh): tensor, XU, FMA and ALU busy
    # shares of our flash2 builds, a block an SM (B1 H1) and several (B4 H16), each run twice
    bench = _bench("pipe_overlap")
    folder = Path(__file__).resolve().parent.parent / "reports/measurements/pipe_overlap_h200_2026-12-02"
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
    # reports/measurements/l2_merge_h200_2026-12-01 (benchmarks/l2_merge.sh): the share of the K, V and Q read
    # requests that L2 counted, with L2 emptied before the kernel and with the data already resident
    bench = _bench("l2_merge")
    folder = Path(__file__).resolve().parent.parent / "reports/measurements/l2_merge_h200_2026-12-01"

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
    # reports/measurements/l2_writes_h200_2026-12-02 (benchmarks/l2_writes.sh): our flash2 stores 16 bytes of a
    # row of O a request, so L1 sends two requests a sector; L2 counts part of the second ones
    from iosim import validate
    from iosim.hardware import load_profile
    bench = _bench("l2_writes")
    rows = bench.shares(Path(__file__).resolve().parent.parent
                        / "reports/measurements/l2_writes_h200_2026-12-02/l2_writes.csv")
    assert len(rows) == len(bench.CONFIGS) == 9
    assert all(l1 == pytest.approx(1.0, abs=1e-4) for _, l1, _, _ in rows)
    clean = [s for _, _, s, spill in rows if not spill]
    assert len(clean) == 6 and all(0.3 < s < 0.95 for s in clean)
    assert load_profile("h200_sxm.calibrated").l2_partial_write_share == round(statistics.median(clean), 2)
    # flash1 stores O the same way, amid its own fp32 O, m, l traffic: L2 merges most second requests
    rows = bench.shares(Path(__file__).resolve().parent.parent
                        / "reports/measurements/l2_writes_h200_2026-12-02/l2_writes_flash1.csv", "flash1")
    assert len(rows) == len(bench.FLASH1) == 6 and all(l1 == pytest.approx(1.0, abs=1e-4) for _, l1, _, _ in rows)
    assert validate.FLASH1_PARTIAL_WRITE_SHARE == round(statistics.median(s for _, _, s, _ in rows), 2) < 0.5
    # SET=sources: the GPCs' caches read 8 x the kernel's machine code (plus 18-19 KB) whatever the grid
    from gpu_kernels.measure import ncu_kernels
    from iosim.plan.compiled import code_bytes
    from iosim.plan import Tiling
    csv = (Path(__file__).resolve().parent.parent
           / "reports/measurements/l2_writes_h200_2026-12-02/l2_writes_sources.csv").read_text()
    for (b, h, n, d, c, (bq, bk)), k in zip(bench.SOURCES, ncu_kernels(csv)):
        code = code_bytes("flash2", d, Tiling(block_q=bq, block_kv=bk), "fp16")
        gcc = float(k["raw"]["lts__t_sectors_srcunit_gcc.sum"][0]) * 32
        assert 0 < gcc - 8 * code < 20_000
    assert load_profile("h200_sxm.calibrated").l2_code_readers == 8


def test_stored_torch_spills_reach_l2_and_give_the_validated_spill_bytes():
    # SET=torch: PyTorch's kernel's local stores per key tile (interior and diagonal, solved from the grids) are
    # the figures iosim.validate predicts it with; SET=torch_waves: L1 sends L2 every byte of them, in one-wave grids
    # (one or two blocks an SM) as in grids of several waves
    from gpu_kernels.measure import ncu_kernels
    from iosim import validate
    bench = _bench("l2_writes")
    folder = Path(__file__).resolve().parent.parent / "reports/measurements/l2_writes_h200_2026-12-02"
    assert bench.fa2_spills(folder / "l2_writes_torch.csv") == validate.FA2_SPILL_BYTES
    for name in ("torch", "torch_waves"):
        kernels = ncu_kernels((folder / f"l2_writes_{name}.csv").read_text())
        assert len(kernels) == len(bench.SETS[name][1]) >= 5
        for k in kernels:
            local, through = bench.local_stores(k)
            assert local > 1e6 and through == pytest.approx(local, rel=0.005)


def test_stored_first_tile_stalls_show_causal_grids_waiting_for_instructions_on_every_sm():
    # reports/measurements/first_tile_h200_2026-12-02 (benchmarks/first_tile.sh): pairs of a lone head and a grid
    # of one block on about every SM; the causal ones stall for instructions, the non-causal ones do not, and the
    # GPCs' caches ask L2 for the code once each either way
    from gpu_kernels.measure import ncu_kernels
    bench = _bench("first_tile")
    path = Path(__file__).resolve().parent.parent / "reports/measurements/first_tile_h200_2026-12-02/first_tile.csv"
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


def test_a_microbenchmark_record_carries_its_method_and_provenance(monkeypatch, tmp_path):
    import json
    monkeypatch.setattr(measure, "machine_provenance", lambda: {"gpu": "NVIDIA H200", "commit": "abc"})
    path = tmp_path / "new" / "bench.json"
    rec = measure.save_benchmark(path, "a benchmark", ["how it ran"], rows=[{"x": 1}], flush="read")
    assert json.loads(path.read_text()) == rec
    assert list(rec) == ["what", "method", "date", "provenance", "rows", "flush"]
    assert rec["provenance"]["gpu"] == "NVIDIA H200" and rec["method"] == ["how it ran"] and rec["rows"] == [{"x": 1}]


def test_stored_first_tile_passes_give_the_profiles_code_cache_and_fetch_rate():
    # reports/measurements/first_tile_h200_2026-12-02: two passes of flash2's pairs and one of flash1's; the
    # calibrated profile's code_cache_kib and code_fetch_gb_s are what benchmarks/first_tile.py derives from them
    from iosim.hardware import load_profile
    bench = _bench("first_tile")
    folder = Path(__file__).resolve().parent.parent / "reports/measurements/first_tile_h200_2026-12-02"
    rows = bench.stored_waits(folder)
    assert len(rows) == 3 + 3 + 3
    held, rate = bench.cold_code_fit(rows)
    hw = load_profile("h200_sxm.calibrated")
    assert hw.code_cache_kib * 1024 == held == 38144 and hw.code_fetch_gb_s == pytest.approx(rate, abs=0.005)
    # flash1 (28 and 37 KiB of code) waited no longer on every SM than alone; flash2's 128-row kernels (56-58 KiB)
    # waited 0.78-1.28 us a warp longer in both passes
    assert all(r[5] <= 0 for r in rows if r[0] == "flash1")
    assert all(0.7 < r[5] < 1.3 for r in rows if r[0] == "flash2" and r[2] == 128)
