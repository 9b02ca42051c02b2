"""The measurement harness's CPU-side parts: the sweep, the split, record keys, parsing Nsight Compute's CSV,
and the clear refusal where there is no GPU."""
from pathlib import Path

import pytest

from gpu_kernels import measure
from iosim.cli import main
from iosim.errors import IosimError
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
    assert cal.arch == hw.arch == "sm_90"
    # calibrating again keeps what the calibration it replaces had and calibrate does not measure
    shipped = load_profile("h200_sxm.calibrated")
    again = parse_profile(calibrate.write_profile(hw, res, path, keep=shipped), str(path), key=path.stem)
    kept = [f for f in type(hw).quantity_fields() if getattr(shipped, f) is not None and f not in res]
    assert {"gpc_count", "l2_dirty_mib", "code_cache_kib", "l1_lines_per_clk_per_sm"} <= set(kept)
    for f in kept:
        assert getattr(again, f) == getattr(shipped, f) and again.sources[f] == shipped.sources[f], f
    assert again.hbm_bandwidth_gb_s == 4265.417 and "Test GPU" in again.sources["hbm_bandwidth_gb_s"]


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

def test_a_microbenchmark_record_carries_its_method_and_provenance(monkeypatch, tmp_path):
    import json
    monkeypatch.setattr(measure, "machine_provenance", lambda: {"gpu": "NVIDIA H200", "commit": "abc"})
    path = tmp_path / "new" / "bench.json"
    rec = measure.save_benchmark(path, "a benchmark", ["how it ran"], rows=[{"x": 1}], flush="read")
    assert json.loads(path.read_text()) == rec
    assert list(rec) == ["what", "method", "date", "provenance", "rows", "flush"]
    assert rec["provenance"]["gpu"] == "NVIDIA H200" and rec["method"] == ["how it ran"] and rec["rows"] == [{"x": 1}]


def test_backward_sweep_covers_what_the_backward_model_is_held_to():
    from gpu_kernels.measure import backward_sweep, expand
    runs = expand(backward_sweep())
    bwd = [(c, a) for _, c, a, _ in runs if c.pass_ == "backward"]
    assert len({c for c, _ in bwd}) >= 40
    assert {a for _, a in bwd} == {"torch_naive", "torch_flash"}
    assert any(c.pass_ == "forward+backward" for _, c, _, _ in runs)
    ns = {c.seqlen_q for c, _ in bwd}
    assert min(ns) <= 256 and max(ns) >= 16384 and any(n % 8 for n in ns)
    assert {c.head_dim for c, _ in bwd} == {64, 128} and {c.dtype for c, _ in bwd} == {"fp16", "bf16"}
    assert {c.causal for c, _ in bwd} == {False, True}
    assert min(c.bh for c, _ in bwd) == 1 and max(c.bh for c, _ in bwd) >= 1024
    assert all(c.bh * c.seqlen_q * c.seqlen_k * 2 <= 8.6e9 for c, a in bwd if a == "torch_naive")


def test_own_backward_sweep_runs_our_kernels_on_the_backward_configurations():
    from gpu_kernels.measure import backward_sweep, expand, own_backward_sweep
    runs = expand(own_backward_sweep())
    assert {a for _, _, a, _ in runs} == {"naive", "flash1", "flash2"}
    torch_cfgs = {c for _, c, _, _ in expand(backward_sweep())}
    assert {c for _, c, a, _ in runs if a == "flash2"} == torch_cfgs   # flash2 wherever PyTorch was measured
    assert all(c.bh >= 128 and c.seqlen_q <= 4096 and c.group == 1 for _, c, a, _ in runs if a == "flash1")
    assert all(c.bh * c.seqlen_q * c.seqlen_k * 2 <= 2 ** 29 for _, c, a, _ in runs if a == "naive")
    assert any(c.group > 1 for _, c, a, _ in runs if a == "flash2")
