"""SM clock against the number of busy SMs: flash1 (one block a head) at 1 to 132 heads, each head's block alone on
its SM, measured two ways. The stored records of flash1 at d 64 ran 10% faster at B1 H8 than at B1 H1 (376 against
416 us at N 1024) and the block trace of B1 H1 counted 1.60 SM clocks a ns where busy grids count 1.74-1.80.
    bash experiments/sm_clock/clock_probe.sh    (both passes; or each:)
    source .whl/prelude.sh && python3 experiments/sm_clock/clock_probe.py --out $OUT/clock_trace.json
        attention.cu built with IOSIM_TRACE: every block's SM clocks over its global-timer span, 2 warm-ups then 5
        calls each after L2 is emptied by a write; CUDA-event time of the plain build beside it (median of 5)
    ncu --clock-control none -k regex:flash1 --csv --metrics gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second \
        python3 experiments/sm_clock/clock_probe.py --ncu-pass > $OUT/clock_ncu.csv
        the plain build, one call a configuration in this order, as `iosim measure` takes its records (its
        default cache control empties L2 before each kernel)
    python experiments/sm_clock/clock_probe.py --print-ncu clock_ncu.csv      (its table, on any machine)
"""
import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# (heads, seqlen, head_dim, dtype): B1, flash1 64x64 4 warps 2 stages, non-causal
CONFIGS = ([(h, 1024, 64, "fp16") for h in (1, 2, 3, 4, 8, 16, 33, 66, 132)]
           + [(h, 1024, 128, "fp16") for h in (1, 2, 4, 8, 66)]
           + [(1, 1024, 64, "bf16"), (8, 1024, 64, "bf16"), (1, 4096, 64, "fp16"), (8, 4096, 64, "fp16")])


def inputs(h, n, d, dtype):
    import cupy as cp
    if dtype == "bf16":   # CuPy has no bf16 dtype; ops takes torch tensors for it
        import torch
        return [torch.randn((1, h, n, d), device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    return [cp.random.standard_normal((1, h, n, d), dtype=cp.float32).astype(cp.float16) for _ in range(3)]


def print_ncu(path: Path) -> None:
    """The ncu pass's kernels, one a configuration in CONFIGS' order: Nsight's time and its average SM clock."""
    from gpu_kernels.measure import ncu_kernels
    print(f"{'ncu: config':<30}{'time us':>10}{'SM GHz':>8}")
    for (h, n, d, dtype), k in zip(CONFIGS, ncu_kernels(path.read_text())):
        (t, t_unit), (hz, hz_unit) = k["raw"]["gpu__time_duration.sum"], k["raw"]["sm__cycles_elapsed.avg.per_second"]
        assert t_unit == "ns" and hz_unit == "hz", (t_unit, hz_unit)
        print(f"{'B1 H%d N%d d%d %s' % (h, n, d, dtype):<30}{float(t) / 1e3:>10.1f}{float(hz) / 1e9:>8.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--ncu-pass", action="store_true", help="one plain call a configuration, for ncu")
    ap.add_argument("--print-ncu", type=Path, help="the ncu pass's CSV: print its table (no GPU)")
    args = ap.parse_args()
    if args.print_ncu:
        return print_ncu(args.print_ncu)
    import cupy as cp
    from gpu_kernels import build, ops
    from iosim.plan.tiling import Tiling
    t = Tiling.make(block_q=64, block_kv=64, warps=4, stages=2, loop_order="flash1")
    if args.ncu_pass:
        for h, n, d, dtype in CONFIGS:
            q, k, v = inputs(h, n, d, dtype)
            ops.flash_attention(q, k, v, tiling=t)
            cp.cuda.Device().synchronize()
        return
    from gpu_kernels.measure import save_benchmark
    # the plain build's CUDA-event times first, then the traced build's clocks
    events = {}
    for h, n, d, dtype in CONFIGS:
        q, k, v = inputs(h, n, d, dtype)
        for _ in range(2):
            ops.flash_attention(q, k, v, tiling=t)
        ts = []
        for _ in range(5):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record()
            ops.flash_attention(q, k, v, tiling=t)
            b.record()
            b.synchronize()
            ts.append(cp.cuda.get_elapsed_time(a, b) * 1e-3)
        events[(h, n, d, dtype)] = statistics.median(ts)
    build.trace(4096)
    flush = cp.empty(256 << 20, dtype=cp.uint8)
    out = []
    for h, n, d, dtype in CONFIGS:
        q, k, v = inputs(h, n, d, dtype)
        name = build.flash_name("flash1", d, 64, 64, 4, 2, dtype == "bf16")
        for _ in range(2):
            ops.flash_attention(q, k, v, tiling=t)
        runs = []
        for _ in range(5):
            flush.fill(1)
            ops.flash_attention(q, k, v, tiling=t)
            cp.cuda.Device().synchronize()
            runs.append(build.trace_buffer(name).get()[:h].tolist())
        ghz = [r[3] / (r[2] - r[1]) for run in runs for r in run]
        us = [(r[2] - r[1]) / 1e3 for run in runs for r in run]
        out.append({"config": {"batch": 1, "heads": h, "seqlen_q": n, "head_dim": d, "dtype": dtype, "causal": False},
                    "algorithm": "flash1", "tiling": {"block_q": 64, "block_kv": 64, "warps": 4, "stages": 2},
                    "event_s_median": events[(h, n, d, dtype)], "runs": runs,
                    "sm_ghz_median": statistics.median(ghz), "block_us_median": statistics.median(us)})
    save_benchmark(args.out, "SM clock against busy SMs, flash1 one block a head (experiments/sm_clock/clock_probe.py)",
                   __doc__.strip().splitlines()[1:9], traces=out)
    print(f"{'config':<30}{'event us':>10}{'block us':>10}{'SM GHz':>8}")
    for r in out:
        c = r["config"]
        print(f"{'B1 H%d N%d d%d %s' % (c['heads'], c['seqlen_q'], c['head_dim'], c['dtype']):<30}"
              f"{r['event_s_median'] * 1e6:>10.1f}{r['block_us_median']:>10.1f}{r['sm_ghz_median']:>8.2f}")


if __name__ == "__main__":
    main()
