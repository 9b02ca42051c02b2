"""Output stores: how long one block of 4 warps takes to issue the stores of a finished tile, by the pattern a
kernel writes it in. The block traces (experiments/block_placement/block_trace.py --set phases) show our flash2 blocks ending with
an epilogue that grows with the output tile (0.7 us for 8 KiB, 2.8 us for 32 KiB, lone or with every SM busy):
store_output writes O straight from the mma accumulators, 4 bytes a lane, 16 bytes of each of 8 rows a warp
instruction. Patterns: `fragment` (that), `fragment_f32` (flash1's save of its fp32 O: 8 bytes a lane, 32 bytes of a
row), `vector` (16 bytes a lane, a row's 128 or 256 bytes contiguous: what a kernel that stages O through shared
memory issues). Each block times its stores with the global timer, from a barrier before the first to a barrier
after the last is issued (as the trace's epilogue ends); grids of 1 block, one an SM (132), and two and four an SM.
L2 emptied (read, clean) before each call; median of 7 calls after 2 warm-ups.
    source .whl/prelude.sh && python3 experiments/store_issue/store_issue.py --out $OUT/store_issue.json
"""
import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SRC = r"""
template <int PATTERN, int ROWS, int D>
__device__ void stores(unsigned char* out, float x) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    constexpr int MT = ROWS / 64;   // 4 warps of 16 * MT rows, as attention.cu's WarpState
    if (PATTERN == 0) {             // fragment: fp16 pairs, 4 bytes a lane
        unsigned* o = (unsigned*)out;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const int row = warp * MT * 16 + mt * 16 + g + hf * 8;
#pragma unroll
                for (int n = 0; n < D / 8; ++n) o[(row * D + n * 8 + 2 * t) / 2] = __float_as_uint(x * (n + 1));
            }
    } else if (PATTERN == 1) {      // fragment_f32: fp32 pairs, 8 bytes a lane
        float2* o = (float2*)out;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                const int row = warp * MT * 16 + mt * 16 + g + hf * 8;
#pragma unroll
                for (int n = 0; n < D / 8; ++n) {
                    float2 v;
                    v.x = x * n, v.y = x + n;
                    o[(row * D + n * 8 + 2 * t) / 2] = v;
                }
            }
    } else {                        // vector: 16 bytes a lane, the tile's bytes in order
        uint4* o = (uint4*)out;
        constexpr int N = ROWS * D * 2 / 16;
#pragma unroll 4
        for (int i = threadIdx.x; i < N; i += 128) {
            uint4 v;
            v.x = i, v.y = __float_as_uint(x), v.z = i + 1, v.w = i + 2;
            o[i] = v;
        }
    }
}

template <int PATTERN, int ROWS, int D>
__global__ void store_tile(unsigned char* out, float x, unsigned long long* trace) {
    const int bytes = ROWS * D * (PATTERN == 1 ? 4 : 2);
    unsigned long long t0, t1;
    __syncthreads();
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    stores<PATTERN, ROWS, D>(out + (size_t)blockIdx.x * bytes, x + blockIdx.x);
    __syncthreads();
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    if (threadIdx.x == 0) {
        unsigned s;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
        trace[3 * blockIdx.x] = s, trace[3 * blockIdx.x + 1] = t0, trace[3 * blockIdx.x + 2] = t1;
    }
}
"""
PATTERNS = ("fragment", "fragment_f32", "vector")
TILES = ((64, 64), (64, 128), (128, 64), (128, 128))   # rows, head_dim: the output tiles of our tilings
GRIDS = (1, 132, 264, 528)
CALLS = 7


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    import cupy as cp
    from gpu_kernels.measure import save_benchmark
    names = [f"store_tile<{p}, {r}, {d}>" for p in range(len(PATTERNS)) for r, d in TILES]
    mod = cp.RawModule(code=SRC, options=("-std=c++17",), name_expressions=names)
    out = cp.zeros(max(GRIDS) * 128 * 128 * 4, dtype=cp.uint8)
    flush = cp.ones(256 << 20, dtype=cp.uint8)
    trace = cp.zeros(3 * max(GRIDS), dtype=cp.uint64)
    rows = []
    for p, pattern in enumerate(PATTERNS):
        for r, d in TILES:
            k = mod.get_function(f"store_tile<{p}, {r}, {d}>")
            nbytes = r * d * (4 if pattern == "fragment_f32" else 2)
            for g in GRIDS:
                calls = []
                for i in range(2 + CALLS):
                    flush.sum()
                    k((g,), (128,), (out, cp.float32(1.5), trace))
                    cp.cuda.Device().synchronize()
                    if i >= 2:
                        t = trace[:3 * g].get().reshape(g, 3).tolist()
                        calls.append({"block_us": [(x[2] - x[1]) / 1e3 for x in t], "sms": len({x[0] for x in t})})
                med = statistics.median(statistics.median(c["block_us"]) for c in calls)
                rows.append({"pattern": pattern, "rows": r, "head_dim": d, "bytes": nbytes, "blocks": g,
                             "sms": calls[0]["sms"], "block_us_median": med, "gb_s_per_block": nbytes / med / 1e3,
                             "calls": calls})
    save_benchmark(args.out, "output store issue (experiments/store_issue/store_issue.py)", __doc__.strip().splitlines()[1:10],
                   rows=rows)
    print(f"{'pattern':<14}{'tile':>9}{'KiB':>5}{'blocks':>7}{'SMs':>5}{'block us':>10}{'GB/s a block':>14}")
    for x in rows:
        print(f"{x['pattern']:<14}{x['rows']:>5}x{x['head_dim']:<3}{x['bytes'] // 1024:>5}{x['blocks']:>7}{x['sms']:>5}"
              f"{x['block_us_median']:>10.2f}{x['gb_s_per_block']:>14.1f}")


if __name__ == "__main__":
    main()
