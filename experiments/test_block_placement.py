"""The stored block traces (experiments/block_placement/block_trace.py, measured on the H200) against the engine's block placement:
how many SMs a grid occupies and how many of its blocks an SM holds at once."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TRACES = sorted((ROOT / "experiments/block_placement").glob("block_trace_h200_*/*.json.gz"))
spec = importlib.util.spec_from_file_location("block_trace", ROOT / "experiments/block_placement/block_trace.py")
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


def test_the_engine_loads_the_busiest_sm_as_the_device_did():
    # causal grids: which query blocks share an SM decides the span; the device places blocks in launch order
    # (block b on about SM b % 132), and so must the engine (it had grouped blocks by cohort first: B16 H16 N256
    # d64 64x64's busiest SM 10 key tiles in the engine against 16 on the device)
    from collections import Counter
    from iosim.engine import simulate
    from iosim.hardware import load_profile
    from iosim.plan.tiling import Tiling
    from iosim.workload import AttentionConfig
    hw = load_profile("h200_sxm.calibrated")
    path = ROOT / "experiments/block_placement/block_trace_h200_2026-12-01/diagonal_read_flush.json.gz"
    for rec in block_trace.load(path)["traces"]:
        c, t = rec["config"], rec["tiling"]
        n_q, per_q = -(-c["seqlen_q"] // t["block_q"]), t["block_q"] // t["block_kv"]

        def busiest(blocks):   # (SM, start, block): key tiles of the first wave's blocks on the busiest SM
            t0 = min(b[1] for b in blocks)
            work = Counter()
            for sm, start, b in blocks:
                if start - t0 < 0.5:
                    work[sm] += (b % n_q + 1) * per_q
            return max(work.values())
        device = [busiest([(x[0], x[1] / 1e3, i) for i, x in enumerate(call)]) for call in rec["runs"]]
        cfg = AttentionConfig.make(**c)
        r = simulate(cfg, "flash2", hw, Tiling.make(**t, loop_order="flash2"), max_steps=3, timeline=True)
        engine = busiest([(b[0], b[2] * 1e6, b[4]) for b in r.timeline.blocks])
        assert 0.85 * min(device) <= engine <= max(device), (block_trace.label(rec), device, engine)


def test_the_stored_clock_probe_shows_a_lone_d64_flash1_block_on_a_slower_clock():
    # experiments/sm_clock/clock_probe.py, twice on the H200: the finding its README states, read from the data
    import gzip
    import json
    paths = sorted((ROOT / "experiments/sm_clock").glob("clock_probe_h200_*/clock_trace_*.json.gz"))
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
    # the ncu half, read as experiments/sm_clock/clock_probe.py --print-ncu reads it (gpu_kernels.measure.ncu_kernels):
    # one kernel a configuration, and the lone d-64 block's step under Nsight too
    spec = importlib.util.spec_from_file_location("clock_probe", ROOT / "experiments/sm_clock/clock_probe.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    for path in sorted((ROOT / "experiments/sm_clock").glob("clock_probe_h200_*/clock_ncu_*.csv")):
        probe.print_ncu(path)
        rows = capsys.readouterr().out.splitlines()[1:]
        assert len(rows) == len(probe.CONFIGS)
        us = {r[:30].strip(): float(r[30:40]) for r in rows}
        assert us["B1 H1 N1024 d64 fp16"] > 1.08 * us["B1 H8 N1024 d64 fp16"]
        assert us["B1 H1 N4096 d64 fp16"] > 1.08 * us["B1 H8 N4096 d64 fp16"]


def test_the_stored_diagonal_traces_back_what_the_readme_says_of_the_diagonal_tile():
    # --set diagonal: a lone head's diagonal tile costs 0.9-1.4 interior ones; a grid starting on every SM at once
    # pays more on its first tile (B4 H16 N256 128x128 d64, one block an SM: 4.0 us against 2.8 alone)
    data = block_trace.load(ROOT / "experiments/block_placement/block_trace_h200_2026-12-01/diagonal_read_flush.json.gz")
    by = {block_trace.label(r): block_trace.steps_by_query_block(r) for r in data["traces"]}
    ratios = []
    for tiling, d, diagonal in (("64x64", 64, 1), ("128x128", 64, 1), ("64x64", 128, 1), ("128x64", 128, 2)):
        s = by[f"flash2 B1 H1 N1024 d{d} fp16 causal {tiling}"]
        interior = (s[max(s)] - s[0]) / max(s) / (2 if tiling == "128x64" else 1)
        ratios.append(s[0] / diagonal / interior)
    assert all(0.9 <= r <= 1.45 for r in ratios) and ratios[1] == max(ratios), ratios
    lone, start = by["flash2 B1 H1 N1024 d64 fp16 causal 128x128"], by["flash2 B4 H16 N256 d64 fp16 causal 128x128"]
    # the first tile 1.2 us dearer; the next, interior, one no dearer than a lone head's interior tile on average
    assert start[0] > lone[0] + 1.0 and start[1] - start[0] < (lone[max(lone)] - lone[0]) / max(lone)


def test_the_stored_traces_back_which_kernels_refill_whole_sms():
    from iosim.plan.behaviour import FillWholeSMs
    # plan.behaviour.FillWholeSMs: flash1's SMs run at their memory paths' pace, so an SM's first-wave blocks end
    # together and the SMs far apart, and its later blocks fill whole SMs (B32 H16 N512: 25 SMs took 3); flash2's
    # SMs keep pace on its non-causal grids. The engine's choice per kernel, read from the data
    from iosim.hardware import load_profile
    from iosim.plan import build_plan
    from iosim.plan.tiling import Tiling
    from iosim.workload import AttentionConfig
    hw = load_profile("h200_sxm.calibrated")
    seen = set()
    folder = ROOT / "experiments/block_placement/block_trace_h200_2026-12-01"
    for name in ("block_trace_read_flush", "phases_read_flush"):
        for rec in block_trace.load(folder / f"{name}.json.gz")["traces"]:
            call = block_trace.median_call(rec)
            if rec["config"]["causal"] or len(call) <= len({x[0] for x in call}):
                continue
            r = block_trace.refills(call)
            alg = rec["algorithm"]
            kernel = build_plan(AttentionConfig.make(**rec["config"]), alg, hw,
                                Tiling.make(**rec["tiling"], loop_order=alg)).kernels[0]
            whole = isinstance(kernel.placement, FillWholeSMs)
            if whole:
                assert r["across_sms_us"] > 4 * r["within_sm_us"] and r["later_per_sm"].get(3, 0) >= 20, r
            else:
                assert r["across_sms_us"] < 3.0 and r["within_sm_us"] < 4.0, (block_trace.label(rec), r)
            seen.add(whole)
    assert seen == {True, False}
