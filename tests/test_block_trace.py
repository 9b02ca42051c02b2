"""The stored block traces (benchmarks/block_trace.py, measured on the H200) against the engine's block placement:
how many SMs a grid occupies and how many of its blocks an SM holds at once."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TRACES = sorted((ROOT / "reports/measurements").glob("block_trace_h200_*/*.json.gz"))
spec = importlib.util.spec_from_file_location("block_trace", ROOT / "benchmarks/block_trace.py")
block_trace = importlib.util.module_from_spec(spec)
spec.loader.exec_module(block_trace)


def test_traces_are_stored_with_provenance():
    assert TRACES
    for path in TRACES:
        data = block_trace.load(path)
        assert data["provenance"]["gpu"] == "NVIDIA H200" and data["provenance"]["commit"]
        assert len(data["traces"]) >= 20 and all(len(t["runs"]) == 5 for t in data["traces"])


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_the_engine_places_blocks_as_the_device_did(path):
    sms = 132
    for rec in block_trace.load(path)["traces"]:
        _, engine, per_sm, engine_sms = block_trace.engine_blocks(rec)
        grid = len(engine)
        assert engine_sms == min(grid, sms), block_trace.label(rec)
        for call in rec["runs"]:
            s = block_trace.summarise(call)
            assert s["blocks"] == grid, block_trace.label(rec)
            # one block an SM before any SM takes a second (the engine fills slots SM by SM)
            assert s["sms"] == min(grid, sms), block_trace.label(rec)
            # never more at once than the engine's occupancy; exactly that many once the grid outgrows the chip
            assert s["most_per_sm"] <= per_sm, block_trace.label(rec)
            if grid >= per_sm * sms:
                assert s["most_per_sm"] == per_sm, block_trace.label(rec)


def test_the_stored_clock_probe_shows_a_lone_d64_flash1_block_on_a_slower_clock():
    # benchmarks/clock_probe.py, twice on the H200: the finding its README states, read from the data
    import gzip
    import json
    paths = sorted((ROOT / "reports/measurements").glob("clock_probe_h200_*/clock_trace_*.json.gz"))
    assert len(paths) == 2
    for path in paths:
        data = json.loads(gzip.open(path, "rt").read())
        assert data["provenance"]["gpu"] == "NVIDIA H200"
        by = {(t["config"]["heads"], t["config"]["seqlen_q"], t["config"]["head_dim"], t["config"]["dtype"]): t
              for t in data["traces"]}
        for n, dtype in ((1024, "fp16"), (1024, "bf16"), (4096, "fp16")):
            one, eight = by[(1, n, 64, dtype)], by[(8, n, 64, dtype)]
            assert one["sm_ghz_median"] < 0.92 * eight["sm_ghz_median"]
            assert one["block_us_median"] > 1.08 * eight["block_us_median"]
        one, eight = by[(1, 1024, 128, "fp16")], by[(8, 1024, 128, "fp16")]   # not at d 128
        assert abs(one["block_us_median"] / eight["block_us_median"] - 1) < 0.03


def test_the_stored_clock_probe_ncu_pass_reads_back_through_the_measure_helper(capsys):
    # the ncu half, read as benchmarks/clock_probe.py --print-ncu reads it (gpu_kernels.measure.ncu_kernels):
    # one kernel a configuration, and the lone d-64 block's step under Nsight too
    spec = importlib.util.spec_from_file_location("clock_probe", ROOT / "benchmarks/clock_probe.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    for path in sorted((ROOT / "reports/measurements").glob("clock_probe_h200_*/clock_ncu_*.csv")):
        probe.print_ncu(path)
        rows = capsys.readouterr().out.splitlines()[1:]
        assert len(rows) == len(probe.CONFIGS)
        us = {r[:30].strip(): float(r[30:40]) for r in rows}
        assert us["B1 H1 N1024 d64 fp16"] > 1.08 * us["B1 H8 N1024 d64 fp16"]
        assert us["B1 H1 N4096 d64 fp16"] > 1.08 * us["B1 H8 N4096 d64 fp16"]
