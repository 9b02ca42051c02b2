"""Block trace: when and on which SM each thread block of our flash kernels runs, to hold the engine's timeline
(`iosim simulate --timeline`) against the device's. attention.cu built with IOSIM_TRACE records per block its SM
(%smid), its start and end on the global timer (ns; the end after the block's last store is issued) and its SM
clocks; flash2 blocks also when their first key tile is in shared memory and when their last step is done. Each configuration runs 2 warm-ups, then 5 traced calls, each after L2 is emptied (by writing a 256 MiB
buffer, or with --flush read by reading it, which leaves no dirty lines), as Nsight Compute's default cache control
does for the stored measurements; --flush none leaves L2 (and the SMs' instruction caches) warm from the last call.
    source .whl/prelude.sh && python3 experiments/block_placement/block_trace.py --out $OUT/block_trace.json
--set phases traces grids of one block an SM and less (each tiling alone, then all SMs at once) for a block's
prologue (start to first key tile loaded), steps, and epilogue (last step done to end); --set diagonal, causal
grids of each tiling from one lone head to several blocks an SM, for the diagonal tile's cost; --set kv, grids whose
K/V outgrows L2, for how far apart a head's blocks read its tiles (--drift reads that back, no GPU).
On any machine, the engine's timeline beside a stored trace (calibrated H200 profile, fitted traits):
    python experiments/block_placement/block_trace.py --compare experiments/block_placement/block_trace_h200_2026-12-01/block_trace_read_flush.json.gz
and, with --placement instead of --compare, where each grid's later blocks went as its first wave's slots freed.
"""
import argparse
from collections import Counter
import gzip
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# (batch, heads, seqlen, head_dim, dtype, causal, loop order, block_q, block_kv): grids of the stored records
# where the engine was furthest off (small grids, causal grids of about one block an SM, flash1 near L2's knee)
CONFIGS = [
    (1, 1, 256, 64, "fp16", False, "flash2", 64, 64), (1, 1, 256, 64, "fp16", False, "flash2", 128, 128),
    (1, 1, 1024, 64, "fp16", False, "flash2", 64, 64), (1, 1, 1024, 64, "fp16", False, "flash2", 128, 128),
    (1, 1, 256, 128, "fp16", False, "flash2", 64, 64), (1, 1, 256, 128, "fp16", False, "flash2", 128, 64),
    (1, 1, 1024, 128, "fp16", False, "flash2", 64, 64), (1, 1, 1024, 128, "fp16", False, "flash2", 128, 64),
    (4, 16, 256, 64, "fp16", True, "flash2", 128, 128), (4, 16, 256, 64, "fp16", True, "flash2", 64, 64),
    (4, 16, 256, 128, "fp16", True, "flash2", 128, 64), (4, 16, 512, 64, "fp16", True, "flash2", 128, 128),
    (4, 16, 512, 128, "fp16", True, "flash2", 128, 64), (64, 16, 256, 128, "bf16", True, "flash2", 128, 64),
    (1, 8, 4096, 128, "fp16", True, "flash2", 128, 64), (64, 16, 1024, 64, "fp16", False, "flash2", 128, 128),
    (64, 16, 256, 64, "bf16", True, "flash1", 64, 64), (32, 16, 512, 64, "bf16", False, "flash1", 64, 64),
    (8, 16, 1024, 64, "fp16", False, "flash1", 64, 64), (1, 1, 1024, 64, "fp16", False, "flash1", 64, 64),
]
# (the same fields) a block's prologue and epilogue by tiling: lone blocks (B1 H1) of 2 to 16 key tiles, the same
# tilings with every SM holding one block (B1 H33, or H66 for 128-row tiles) and with the chip full (B8 H33)
TILINGS = [(64, 64, 64), (128, 128, 64), (64, 64, 128), (128, 64, 128)]   # block_q, block_kv, head_dim
PHASES = ([(1, 1, n, d, "fp16", False, "flash2", bq, bkv) for bq, bkv, d in TILINGS for n in (256, 1024)]
          + [(1, 132 * bq // 256, 256, d, "fp16", False, "flash2", bq, bkv) for bq, bkv, d in TILINGS]
          + [(8, 33, 256, d, "fp16", False, "flash2", bq, bkv) for bq, bkv, d in TILINGS]
          + [(1, 1, 1024, 64, "fp16", True, "flash2", 64, 64), (1, 1, 1024, 128, "fp16", True, "flash2", 128, 64),
             (1, 1, 1024, 64, "bf16", False, "flash2", 64, 64), (1, 1, 4096, 64, "fp16", False, "flash2", 64, 64)])
# causal grids of each tiling, for the diagonal tile's cost by occupancy: lone (B1 H1 N1024), one wave of about one
# block an SM (B4 H16 N256), two or more blocks an SM (B4 H16 N512, B16 H16 N256) and B1 H8 N1024
DIAGONAL = [(b, h, n, d, "fp16", True, "flash2", bq, bkv) for bq, bkv, d in TILINGS
            for b, h, n in ((1, 1, 1024), (4, 16, 256), (4, 16, 512), (16, 16, 256), (1, 8, 1024))]
# grids whose K/V working set outgrows L2 (reports/measurements/h200_effects, issue 32), seqlen as (Nq, Nk): do a
# head's query blocks drift apart, so that the later ones read its K/V tiles after L2 has let them go?
KV = [(1, 16, (2048, 65536), 128, "fp16", False, "flash2", 128, 64),
      (1, 16, 32768, 128, "fp16", True, "flash2", 128, 64), (2, 8, 16384, 128, "fp16", True, "flash2", 128, 64), (1, 8, 65536, 64, "fp16", True, "flash2", 128, 128),
      (1, 16, 32768, 128, "bf16", False, "flash2", 128, 64)]
SETS = {"default": CONFIGS, "phases": PHASES, "diagonal": DIAGONAL, "kv": KV}
MAX_BLOCKS = 16384
RUNS = 5


def summarise(trace: list[list[int]]) -> dict:
    """Figures of one traced call: rows (SM, start ns, end ns, clocks)."""
    t0 = min(r[1] for r in trace)
    starts = sorted(r[1] - t0 for r in trace)
    dur = [r[2] - r[1] for r in trace]
    # blocks on one SM at once, at each block's start
    by_sm: dict[int, list] = {}
    for r in trace:
        by_sm.setdefault(r[0], []).append((r[1], r[2]))
    most = max(sum(1 for a, b in v if a <= s < b) for v in by_sm.values() for s, _ in v)
    out = {"blocks": len(trace), "sms": len(by_sm), "most_per_sm": most, "span_us": (max(r[2] for r in trace) - t0) / 1e3,
           "block_us_median": statistics.median(dur) / 1e3, "block_us_max": max(dur) / 1e3,
           "first_wave_start_spread_us": starts[min(len(starts), len(by_sm)) - 1] / 1e3}
    marked = [r for r in trace if len(r) >= 6 and r[4] and r[5]]   # flash2's phase marks (--set phases traces)
    if marked:
        out["prologue_us_median"] = statistics.median(r[4] - r[1] for r in marked) / 1e3
        out["steps_us_median"] = statistics.median(r[5] - r[4] for r in marked) / 1e3
        out["epilogue_us_median"] = statistics.median(r[2] - r[5] for r in marked) / 1e3
    return out


def load(path: Path) -> dict:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)


def label(rec: dict) -> str:
    c, t = rec["config"], rec["tiling"]
    return (f"{rec['algorithm']} B{c['batch']} H{c['heads']} N{c['seqlen_q']} d{c['head_dim']} {c['dtype']}"
            f"{' causal' if c['causal'] else ''} {t['block_q']}x{t['block_kv']}")


def steps_by_query_block(rec: dict) -> dict[int, float]:
    """Median us from a flash2 block's first key tile loaded to its last step done, per query block over every
    traced call (the traced grids launch a head's query blocks together: query block = block index modulo their
    number). Query block qi of a causal grid sees qi interior key tiles and its diagonal ones."""
    n_q = -(-rec["config"]["seqlen_q"] // rec["tiling"]["block_q"])
    steps: dict[int, list] = {}
    for call in rec["runs"]:
        for i, r in enumerate(call):
            steps.setdefault(i % n_q, []).append((r[5] - r[4]) / 1e3)
    return {qi: statistics.median(v) for qi, v in sorted(steps.items())}


def median_call(rec: dict) -> list[list[int]]:
    """The traced call of median span."""
    return sorted(rec["runs"], key=lambda r: max(x[2] for x in r) - min(x[1] for x in r))[len(rec["runs"]) // 2]


def engine_blocks(rec: dict, profile: str = "h200_sxm.calibrated"):
    """The engine's (kernel time less the empty-kernel floor, {block: (start, duration)} in us, blocks an SM holds,
    SMs used) for a traced configuration, as `iosim validate` predicts it (cold L2, the kernel's own registers)."""
    from iosim import fit
    from iosim.engine import simulate
    from iosim.hardware import load_profile
    from iosim.plan.tiling import Tiling
    from iosim.kernels.catalogue import run_traits
    from iosim.workload import AttentionConfig
    hw = load_profile(profile)
    cfg, alg = AttentionConfig.make(**rec["config"]), rec["algorithm"]
    t = Tiling.make(**rec["tiling"], loop_order=alg)
    kt = run_traits(alg, cfg, t, fit.load(hw), hw.clock_hz)
    r = simulate(cfg, alg, hw, t, traits=kt, cold_l2=True, max_steps=4, timeline=True)
    t0 = min(b[2] for b in r.timeline.blocks)
    return ((r.kernels[0].time_s - (hw.kernel_floor_us or 0) * 1e-6) * 1e6,
            {b[4]: ((b[2] - t0) * 1e6, (b[3] - b[2]) * 1e6) for b in r.timeline.blocks}, r.kernels[0].blocks_per_sm,
            len({b[0] for b in r.timeline.blocks}))


def compare(path: Path) -> None:
    """Measured (median call) against the engine: the blocks' span, and the median block time of each of the
    first four query blocks (flash2: blocks i, i + query blocks, ...; launched in the first wave)."""
    data = load(path)
    print(f"{'':<46}{'span us':>16}   median block us of query block 0..3, first wave (measured/engine)")
    print(f"{'':<46}{'meas':>8}{'engine':>8}")
    for rec in data["traces"]:
        call = median_call(rec)
        t0 = min(x[1] for x in call)
        meas = {i: ((x[1] - t0) / 1e3, (x[2] - x[1]) / 1e3) for i, x in enumerate(call)}
        span, eng, _, _ = engine_blocks(rec)
        n_q = -(-rec["config"]["seqlen_q"] // rec["tiling"]["block_q"]) if rec["algorithm"] == "flash2" else 1
        cells = []
        for qi in range(min(n_q, 4)):
            m = [d for i, (s, d) in meas.items() if i % n_q == qi and s < 0.5]
            e = [d for i, (s, d) in eng.items() if i % n_q == qi and s < 0.5]
            cells.append(f"{statistics.median(m):6.1f}/{statistics.median(e):<6.1f}")
        print(f"{label(rec):<46}{(max(x[2] for x in call) - t0) / 1e3:>8.1f}{span:>8.1f}   {' '.join(cells)}")


def refills(call: list[list[int]]) -> dict:
    """How one traced call's later blocks took the slots its first wave freed: the first wave (blocks started
    before any block ended) its SMs' end times, spread within an SM (mean range) and across SMs (range of the SMs'
    mean ends), in us; and {later blocks an SM took: SMs}. An SM's blocks ending together and the SMs far apart
    refill whole SMs (`plan.behaviour.FillWholeSMs`); SMs keeping pace refill one an SM."""
    first_end = min(x[2] for x in call)
    ends: dict[int, list] = {}
    later: dict[int, int] = {}
    for x in call:
        if x[1] < first_end:
            ends.setdefault(x[0], []).append(x[2] / 1e3)
        else:
            later[x[0]] = later.get(x[0], 0) + 1
    several = [v for v in ends.values() if len(v) > 1]
    means = [statistics.mean(v) for v in ends.values()]
    return {"within_sm_us": statistics.mean(max(v) - min(v) for v in several) if several else 0.0,
            "across_sms_us": max(means) - min(means),
            "later_per_sm": dict(sorted(Counter(later.values()).items()))}


def placement(path: Path) -> None:
    """`refills` of each stored grid that outgrows a wave of one block an SM (the median call)."""
    print(f"{'':<46}{'first wave ends (us)':>24}   later blocks an SM: SMs")
    print(f"{'':<46}{'within SM':>12}{'across':>12}")
    for rec in load(path)["traces"]:
        call = median_call(rec)
        if len(call) <= len({x[0] for x in call}):
            continue
        r = refills(call)
        print(f"{label(rec):<46}{r['within_sm_us']:>12.1f}{r['across_sms_us']:>12.1f}   {r['later_per_sm']}")


def drift(path: Path, holding_mib: float = 40.0) -> None:
    """For grids traced with --set kv: when each of a head's query blocks reads each K/V tile, from its first key
    tile loaded to its last step done at an even pace (our flash2 walks its tiles first to last), and from that the
    K/V bytes an LRU of `holding_mib` would read from DRAM if the chip streamed new K/V at its mean rate (all the
    grid's K/V over the span): a tile is read again from DRAM where more than the holding passed since the read
    before. Printed beside how far apart a head's blocks read its tiles (the median over tiles of the last reader
    less the first, us)."""
    print(f"{'':<46}{'lag us':>14}{'K/V read from DRAM / K/V':>28}")
    print(f"{'':<46}{'median':>7}{'max':>7}{'LRU estimate':>16}")
    for rec in load(path)["traces"]:
        if rec["algorithm"] != "flash2":
            continue
        c, t = rec["config"], rec["tiling"]
        nk = c.get("seqlen_k", c["seqlen_q"])
        n_q, n_kv = -(-c["seqlen_q"] // t["block_q"]), -(-nk // t["block_kv"])
        call = median_call(rec)
        span_ns = max(x[2] for x in call) - min(x[1] for x in call)
        kv_bytes = c["batch"] * c["heads"] * nk * c["head_dim"] * 2 * 2
        tile_bytes = t["block_kv"] * c["head_dim"] * 2 * 2
        window_ns = holding_mib * 2**20 / (kv_bytes / span_ns)
        lags, reads = [], 0
        for head in range(len(call) // n_q):
            blocks = call[head * n_q:(head + 1) * n_q]
            times: dict[int, list] = {}
            for qi, x in enumerate(blocks):
                seen = min(n_kv, -(-((qi + 1) * t["block_q"] + nk - c["seqlen_q"]) // t["block_kv"])) \
                    if c["causal"] else n_kv
                a, b = (x[4], x[5]) if len(x) >= 6 and x[4] and x[5] else (x[1], x[2])
                for j in range(seen):
                    times.setdefault(j, []).append(a + (b - a) * j / seen)
            for j, ts in times.items():
                ts.sort()
                lags.append((ts[-1] - ts[0]) / 1e3)
                reads += 1 + sum(1 for a, b in zip(ts, ts[1:]) if b - a > window_ns)
        print(f"{label(rec):<46}{statistics.median(lags):>7.1f}{max(lags):>7.1f}"
              f"{reads * tile_bytes / kv_bytes:>16.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--flush", choices=("write", "read", "none"), default="write")
    ap.add_argument("--set", choices=sorted(SETS), default="default", help="which grids (default: the 20 above)")
    ap.add_argument("--compare", type=Path, help="a stored trace: print it beside the engine's timeline (no GPU)")
    ap.add_argument("--placement", type=Path, help="a stored trace: where its later blocks went (no GPU)")
    ap.add_argument("--drift", type=Path, help="a stored --set kv trace: how far apart a head's blocks read its "
                    "K/V tiles, and what an LRU would re-read from DRAM (no GPU)")
    args = ap.parse_args()
    if args.compare:
        return compare(args.compare)
    if args.placement:
        return placement(args.placement)
    if args.drift:
        return drift(args.drift)
    if args.out is None:
        ap.error("--out or --compare is needed")
    import cupy as cp
    from gpu_kernels import build, ops
    from gpu_kernels.measure import save_benchmark
    from iosim.plan.tiling import Tiling
    build.trace(MAX_BLOCKS)
    flush = cp.empty(256 << 20, dtype=cp.uint8)
    out = []
    for b, h, n, d, dtype, causal, order, bq, bkv in SETS[args.set]:
        dt = cp.float16 if dtype == "fp16" else None
        nq, nk = n if isinstance(n, tuple) else (n, n)
        shapes = [(b, h, nq, d)] + [(b, h, nk, d)] * 2
        if dt is None:   # bf16: CuPy has no bf16 dtype; ops takes torch tensors for it
            import torch
            q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for shape in shapes)
        else:
            q, k, v = (cp.random.standard_normal(shape, dtype=cp.float32).astype(dt) for shape in shapes)
        t = Tiling.make(block_q=bq, block_kv=bkv, warps=4, stages=2, loop_order=order)
        name = build.flash_name(order, d, bq, bkv, 4, 2, dtype == "bf16")
        for _ in range(2):
            ops.flash_attention(q, k, v, causal=causal, tiling=t)
        runs = []
        for _ in range(RUNS):
            if args.flush == "read":
                flush.sum()
            elif args.flush == "write":
                flush.fill(1)
            ops.flash_attention(q, k, v, causal=causal, tiling=t)
            cp.cuda.Device().synchronize()
            tr = build.trace_buffer(name).get()
            grid = b * h * (-(-nq // bq) if order == "flash2" else 1)
            runs.append(tr[:grid].tolist())
        out.append({"config": {"batch": b, "heads": h, "seqlen_q": nq, "seqlen_k": nk, "head_dim": d,
                               "dtype": dtype, "causal": causal},
                    "algorithm": order, "tiling": {"block_q": bq, "block_kv": bkv, "warps": 4, "stages": 2},
                    "runs": runs, "summary": [summarise(r) for r in runs]})
    save_benchmark(args.out, "block trace of flash1/flash2 (experiments/block_placement/block_trace.py)",
                   __doc__.strip().splitlines()[1:6], flush=args.flush, set=args.set, traces=out)
    print(f"{'config':<44}{'blocks':>7}{'SMs':>5}{'most':>5}{'span us':>9}{'block us':>9}{'max':>8}{'start':>7}"
          f"{'prolog':>7}{'steps':>7}{'epilog':>7}")
    for rec in out:
        s = sorted(rec["summary"], key=lambda x: x["span_us"])[len(rec["summary"]) // 2]
        phases = "".join(f"{s[k]:>7.2f}" for k in ("prologue_us_median", "steps_us_median", "epilogue_us_median")
                         if k in s)
        print(f"{label(rec):<44}{s['blocks']:>7}{s['sms']:>5}{s['most_per_sm']:>5}{s['span_us']:>9.2f}"
              f"{s['block_us_median']:>9.2f}{s['block_us_max']:>8.2f}{s['first_wave_start_spread_us']:>7.2f}{phases}")


if __name__ == "__main__":
    main()
