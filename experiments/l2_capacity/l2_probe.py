"""How much the H200's L2 holds, how requests for one line from many SMs are counted, and what an empty kernel
costs: microbenchmarks run under Nsight Compute by experiments/l2_capacity/l2_probe.sh (one ncu pass, cold L2 before each
kernel as in the measurement records).

- `rw`: each of 264 blocks reads and rewrites its own slice of a W-byte buffer, 4 passes (flash1's per-block
  O/m/l state). DRAM reads beyond W are the passes' misses: where they start tells the capacity that holds
  data private to one SM.
- `ro`: every one of 132 blocks reads the whole W-byte buffer, 2 passes, each block starting at its own offset
  (K/V tiles read by SMs of both partitions).
- `lockstep` / `staggered`: every block reads the same 64 KiB tiles of an 8 MiB buffer in order, starting
  together or each at its own tile: lts__t_bytes against the bytes requested tells whether simultaneous requests
  for one line are counted once.
- `empty`: a kernel that does nothing, on grids of 1 to 131,072 blocks: the fixed cost of a kernel and of a
  block, as gpu__time_duration sees them.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SRC = r"""
extern "C" __global__ void empty() {}

// each block reads and rewrites its own slice, `passes` times (float4: 16 B a thread a step)
extern "C" __global__ void rw(float4* buf, long long per_block, int passes) {
    float4* s = buf + blockIdx.x * per_block;
    for (int p = 0; p < passes; ++p) {
        for (long long i = threadIdx.x; i < per_block; i += blockDim.x) {
            float4 v = __ldcg(s + i);
            v.x += 1.f;
            __stcg(s + i, v);
        }
        __syncthreads();
    }
}

// every block reads the whole buffer `passes` times, from its own starting offset
extern "C" __global__ void ro(const float4* buf, long long n, int passes, float* sink) {
    const long long start = (n / gridDim.x) * blockIdx.x;
    float acc = 0.f;
    for (int p = 0; p < passes; ++p)
        for (long long i = threadIdx.x; i < n; i += blockDim.x) {
            float4 v = __ldcg(buf + (start + i) % n);
            acc += v.x;
        }
    if (acc == 12345.f) sink[blockIdx.x] = acc;
}

// every block reads tiles 0..tiles-1 of `tile` float4 each, from tile (b * shift) % tiles on
extern "C" __global__ void tiles(const float4* buf, int tile, int n_tiles, int shift, float* sink) {
    float acc = 0.f;
    for (int t = 0; t < n_tiles; ++t) {
        const float4* s = buf + (long long)((t + blockIdx.x * shift) % n_tiles) * tile;
        for (int i = threadIdx.x; i < tile; i += blockDim.x) acc += __ldcg(s + i).x;
        __syncthreads();
    }
    if (acc == 12345.f) sink[blockIdx.x] = acc;
}
"""

MIB = 1 << 20
RW_SIZES_MIB = (8, 16, 24, 28, 32, 36, 40, 44, 48, 56, 64, 80, 96)
RO_SIZES_MIB = (8, 16, 20, 24, 28, 32, 36, 40, 48, 64)
EMPTY_GRIDS = ((1, 32), (132, 128), (1056, 256), (16384, 256), (131072, 256))


def run() -> None:
    import cupy as cp
    mod = cp.RawModule(code=SRC)
    k = {n: mod.get_function(n) for n in ("empty", "rw", "ro", "tiles")}
    sink = cp.zeros(1 << 17, dtype=cp.float32)
    buf = cp.zeros(max(RW_SIZES_MIB) * MIB // 4, dtype=cp.float32)
    for g, t in EMPTY_GRIDS:                 # launch order = the order of the table in --print
        k["empty"]((g,), (t,), ())
    blocks = 264
    for w in RW_SIZES_MIB:
        per = w * MIB // 16 // blocks
        k["rw"]((blocks,), (512,), (buf, cp.int64(per), cp.int32(4)))
    for w in RO_SIZES_MIB:
        k["ro"]((132,), (512,), (buf, cp.int64(w * MIB // 16), cp.int32(2), sink))
    tile, n_tiles = 64 * 1024 // 16, 128        # 64 KiB tiles, 8 MiB
    for shift in (0, 1):
        k["tiles"]((132,), (256,), (buf, cp.int32(tile), cp.int32(n_tiles), cp.int32(shift), sink))
    cp.cuda.runtime.deviceSynchronize()
    print("launched", flush=True)


def labels() -> list[tuple[str, float]]:
    """(probe, MiB requested) per kernel, in launch order."""
    out = [(f"empty {g}x{t}", 0.0) for g, t in EMPTY_GRIDS]
    out += [(f"rw {w} MiB x4", 8.0 * w) for w in RW_SIZES_MIB]   # 4 passes of a read and a write
    out += [(f"ro {w} MiB x2 by 132", 2.0 * 132 * w) for w in RO_SIZES_MIB]
    out += [(f"tiles {s} 8 MiB by 132", 132 * 8.0) for s in ("lockstep", "staggered")]
    return out


def table(path: str) -> None:
    from gpu_kernels.measure import _UNITS, ncu_kernels
    # per kernel: bytes, seconds and sectors (ncu's base units; sectors have none in _UNITS)
    ms = [{key: float(v) * _UNITS.get(u, 1.0) for key, (v, u) in kr["raw"].items()}
          for kr in ncu_kernels(Path(path).read_text())]
    print(f"{'probe':<26}{'us':>9}{'DRAM rd MiB':>13}{'DRAM wr MiB':>13}{'requested':>11}{'lts MiB':>10}"
          f"{'tex MiB':>10}{'fabric MiB':>11}")
    for (name, req), m in zip(labels(), ms):
        print(f"{name:<26}{m['gpu__time_duration.sum'] * 1e6:9.2f}{m['dram__bytes_read.sum'] / MIB:13.1f}"
              f"{m['dram__bytes_write.sum'] / MIB:13.1f}{req:11.0f}{m['lts__t_bytes.sum'] / MIB:10.1f}"
              f"{m['lts__t_sectors_srcunit_tex.sum'] * 32 / MIB:10.1f}"
              f"{m['lts__t_sectors_srcunit_ltcfabric.sum'] * 32 / MIB:11.1f}")
    (g0, _), (g1, _) = EMPTY_GRIDS[-2:]
    t = [m["gpu__time_duration.sum"] for m in ms[:len(EMPTY_GRIDS)]]
    print(f"empty kernel of one block: {t[0] * 1e6:.2f} us (kernel_floor_us); each block more: "
          f"{(t[-1] - t[-2]) / (g1 - g0) * 1e9:.3f} ns (block_dispatch_ns, {g0:,} to {g1:,} blocks)")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--print":
        table(sys.argv[2])
    else:
        run()
