"""Cold-start loads: how long a grid of blocks takes to bring its first tiles in when every block starts at once
and L2 holds none of it (Nsight Compute's default cache control, the stored measurements' condition). Each block
copies its own `kib` KiB into shared memory with cp.async (16 bytes a thread at a time, 128 threads), waits, and
records its SM and start and end on the global timer. Grids of 1 to 2 blocks an SM; L2 emptied before each call
by reading (clean) or writing (dirty) a 256 MiB buffer, or left warm; median of 7 calls after 2 warm-ups.
    source .whl/prelude.sh && python3 experiments/cold_start/cold_burst.py --out $OUT/cold_burst.json
"""
import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SRC = r"""
extern "C" __global__ void burst(const uint4* __restrict__ src, int per_block, unsigned long long* trace,
                                 unsigned* sink) {
    extern __shared__ __align__(16) uint4 buf[];
    unsigned long long t0, t1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    const uint4* mine = src + (size_t)blockIdx.x * per_block;
    for (int i = threadIdx.x; i < per_block; i += blockDim.x) {
        unsigned dst = (unsigned)__cvta_generic_to_shared(buf + i);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(mine + i));
    }
    asm volatile("cp.async.commit_group;\n" ::);
    asm volatile("cp.async.wait_group 0;\n" ::);
    __syncthreads();
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    if (threadIdx.x == 0) {
        unsigned s;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
        trace[3 * blockIdx.x] = s, trace[3 * blockIdx.x + 1] = t0, trace[3 * blockIdx.x + 2] = t1;
    }
    if (buf[threadIdx.x].x == 0x9e3779b9u && buf[threadIdx.x].y == 0x7f4a7c15u) sink[0] = 1;
}
"""
GRIDS = (1, 16, 66, 132, 264)
KIB = (16, 48, 96)
FLUSH = ("read", "write", "warm")
CALLS = 7


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    import cupy as cp
    from gpu_kernels.measure import save_benchmark
    k = cp.RawModule(code=SRC).get_function("burst")
    k.max_dynamic_shared_size_bytes = max(KIB) * 1024
    src = cp.random.randint(0, 2**31, size=(max(GRIDS) * max(KIB) * 1024) // 4, dtype=cp.int32)
    flush = cp.ones(256 << 20, dtype=cp.uint8)
    sink = cp.zeros(4, dtype=cp.uint32)
    trace = cp.zeros(3 * max(GRIDS), dtype=cp.uint64)
    rows = []
    for mode in FLUSH:
        for kib in KIB:
            for g in GRIDS:
                calls = []
                for i in range(2 + CALLS):
                    if mode == "read":
                        flush.sum()
                    elif mode == "write":
                        flush.fill(i & 1)
                    k((g,), (128,), (src, cp.int32(kib * 64), trace, sink), shared_mem=kib * 1024)
                    cp.cuda.Device().synchronize()
                    if i >= 2:
                        t = trace[:3 * g].get().reshape(g, 3).tolist()
                        t0 = min(r[1] for r in t)
                        calls.append({"span_us": (max(r[2] for r in t) - t0) / 1e3,
                                      "block_us": [(r[2] - r[1]) / 1e3 for r in t],
                                      "start_us": [(r[1] - t0) / 1e3 for r in t],
                                      "sms": len({r[0] for r in t})})
                span = statistics.median(c["span_us"] for c in calls)
                rows.append({"flush": mode, "kib": kib, "blocks": g, "span_us": span,
                             "block_us_median": statistics.median(statistics.median(c["block_us"]) for c in calls),
                             "sms": calls[0]["sms"], "gb_s": g * kib * 1024 / span / 1e3, "calls": calls})
    save_benchmark(args.out, "cold-start loads (experiments/cold_start/cold_burst.py)", __doc__.strip().splitlines()[1:6],
                   rows=rows)
    print(f"{'flush':<7}{'KiB':>5}{'blocks':>8}{'SMs':>5}{'span us':>9}{'block us':>10}{'GB/s':>8}")
    for r in rows:
        print(f"{r['flush']:<7}{r['kib']:>5}{r['blocks']:>8}{r['sms']:>5}{r['span_us']:>9.2f}{r['block_us_median']:>10.2f}"
              f"{r['gb_s']:>8.0f}")


if __name__ == "__main__":
    main()
