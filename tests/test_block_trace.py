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
