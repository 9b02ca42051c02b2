"""Microbenchmarks that turn a datasheet profile into a calibrated one: how a user adds a GPU.

    python -m gpu_kernels.calibrate --profile h200_sxm --out hw_profiles/h200_sxm.calibrated.toml
    (or `iosim calibrate`, which calls this)

Each number is the median of repeated CUDA-event timings after warm-up; each goes into the profile with its
method and date. What is measured, and which profile field it sets:
  copy above L2        hbm_bandwidth_gb_s                 device-to-device copy of 4 GiB, read + write bytes
  copy below L2        (reported)                         the same on 16 MiB, resident in L2
  HBM write, read      (reported)                         16-byte stores filling 4 GiB (no reads), cudaMemset
                                                          of the same, and 16-byte loads reading it once
  L2 read              l2_bandwidth_gb_s                  every SM re-reading a 24 MiB buffer with 16-byte
                                                          loads (L1 serves part: the rate the engine's L2 tier
                                                          charges every request at; `run` says why)
  L2 alone             (reported)                         the same with L2-only loads (ld.global.cg), L2-only
                                                          stores, and a copy between two resident halves
  shared memory        smem_bandwidth_bytes_per_clk_per_sm  ldmatrix.x4 (what the tiled kernels read tiles
                                                          with) from a conflict-free swizzled tile, at the SM clock;
                                                          16-byte LDS loads reported beside it
  mma.sync             tensor_fp16_tflops, _bf16_         m16n8k16 on registers, 8 independent chains per warp
  wgmma (sm_90 only)   wgmma_fp16_tflops, _bf16_          m64n256k16 from shared memory, two warpgroups a block,
                                                          a block an SM, 8 in flight per warpgroup (`wgmma_rates`)
  ex2                  sfu_ops_per_clk_per_sm             ex2.approx on registers, 8 chains per thread
  launch gap           kernel_launch_us                   back-to-back empty kernels launched from Python
  HBM latency          hbm_latency_ns                     one thread chasing pointers through 512 MiB
  L2 latency           l2_latency_ns                      the same through 8 MiB resident in L2
"""
from __future__ import annotations

import statistics
import sys
from datetime import date
from pathlib import Path

import numpy as np

from iosim.errors import IosimError
from iosim.hardware import HardwareProfile, load_profile, profiles_dir

from .timing import event_times

SRC = r"""
extern "C" __global__ void read_sum(const uint4* __restrict__ p, unsigned long long n16, int reps, unsigned* out) {
    unsigned acc = 0;
    for (int r = 0; r < reps; ++r)
        for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n16; i += (unsigned long long)gridDim.x * blockDim.x) {
            uint4 v = p[i];
            acc ^= v.x ^ v.y ^ v.z ^ v.w;
        }
    if (acc == 0x12345678u) out[0] = acc;   // keeps the loads alive
}
// the same through L2 only (__ldcg: ld.global.cg): plain loads are cached in L1 too, and each SM's share of the
// re-read 24 MiB buffer (about 190 KB) fits there
extern "C" __global__ void read_sum_l2(const uint4* __restrict__ p, unsigned long long n16, int reps, unsigned* out) {
    unsigned acc = 0;
    for (int r = 0; r < reps; ++r)
        for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n16; i += (unsigned long long)gridDim.x * blockDim.x) {
            uint4 v = __ldcg(p + i);
            acc ^= v.x ^ v.y ^ v.z ^ v.w;
        }
    if (acc == 0x12345678u) out[0] = acc;
}
// L2's write side, and both sides at once: 16-byte L2-only stores (st.global.cg) re-writing a buffer resident in
// L2 (write-back: no HBM traffic until eviction), and a copy between two resident halves
extern "C" __global__ void write_l2(uint4* __restrict__ p, unsigned long long n16, int reps, unsigned v) {
    for (int r = 0; r < reps; ++r)
        for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n16; i += (unsigned long long)gridDim.x * blockDim.x)
            __stcg(p + i, make_uint4(v, (unsigned)r, (unsigned)i, v));
}
extern "C" __global__ void copy_l2(const uint4* __restrict__ a, uint4* __restrict__ b, unsigned long long n16, int reps) {
    for (int r = 0; r < reps; ++r)
        for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n16; i += (unsigned long long)gridDim.x * blockDim.x)
            __stcg(b + i, __ldcg(a + i));
}
extern "C" __global__ void write_fill(uint4* __restrict__ p, unsigned long long n16, unsigned v) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n16; i += (unsigned long long)gridDim.x * blockDim.x)
        p[i] = make_uint4(v, v ^ (unsigned)i, v, v);
}
extern "C" __global__ void smem_read(int iters, unsigned* out) {
    __shared__ uint4 buf[1024];
    for (int i = threadIdx.x; i < 1024; i += blockDim.x) buf[i] = make_uint4(i, i + 1, i + 2, i + 3);
    __syncthreads();
    unsigned acc = 0;
    int idx = threadIdx.x;
    for (int it = 0; it < iters; ++it) {
        uint4 v = buf[(idx + it) & 1023];
        acc ^= v.x + v.w;
    }
    if (acc == 0x12345678u) out[0] = acc;
}
// every warp reads a swizzled 64x64 fp16 tile with ldmatrix.x4 (512 B an instruction), as the tiled kernels do.
// zero (a run-time 0) makes each address depend on the previous loads, so ptxas cannot merge the loads of
// unrolled iterations (without it, the same addresses in consecutive iterations read as 4x the bandwidth)
extern "C" __global__ void smem_ldmatrix(int iters, unsigned zero, unsigned* out) {
    __shared__ __align__(1024) unsigned short tile[64 * 64];
    for (int i = threadIdx.x; i < 64 * 64; i += blockDim.x) tile[i] = (unsigned short)i;
    __syncthreads();
    const int lane = threadIdx.x & 31, row = (lane & 7) + ((lane >> 3) & 1) * 8 + ((threadIdx.x >> 5) & 3) * 16;
    const unsigned base = (unsigned)__cvta_generic_to_shared(tile) + row * 128 + ((((lane >> 4) ^ (row & 7))) << 4);
    unsigned acc = 0;
    for (int it = 0; it < iters; ++it) {
        const unsigned off = acc & zero;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            unsigned r0, r1, r2, r3;
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                         : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"((base ^ (k << 5)) ^ off));
            acc ^= r0 ^ r1 ^ r2 ^ r3;
        }
    }
    if (acc == 0x12345678u) out[0] = acc;
}
template <bool BF16> __device__ __forceinline__ void mma(float* c, const unsigned* a, const unsigned* b) {
    if (BF16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <bool BF16> __global__ void mma_loop(int iters, float* out) {
    unsigned a[4] = {0x3c003c00u ^ threadIdx.x, 0x3c003c00u, 0x3c003c00u, 0x3c003c00u}, b[2] = {0x3c003c00u, 0x3c003c00u};
    float c[8][4] = {};
    for (int it = 0; it < iters; ++it)
#pragma unroll
        for (int k = 0; k < 8; ++k) mma<BF16>(c[k], a, b);
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < 8; ++k) s += c[k][0] + c[k][1] + c[k][2] + c[k][3];
    if (s == 1234.5f) out[0] = s;
}
extern "C" __global__ void ex2_loop(int iters, float* out) {
    float x[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) x[k] = -1e-3f * (threadIdx.x + k);
    for (int it = 0; it < iters; ++it)
#pragma unroll
        for (int k = 0; k < 8; ++k) asm volatile("ex2.approx.ftz.f32 %0, %0;\n" : "+f"(x[k]));
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < 8; ++k) s += x[k];
    if (s == 1234.5f) out[0] = s;
}
// one thread following a random cycle of 128-byte lines: each load's address is the previous load's value, so
// the time per step is the latency of one load (L1 bypassed: __ldcg caches in L2 only)
extern "C" __global__ void chase(const unsigned* __restrict__ next, unsigned start, int steps, unsigned* out) {
    unsigned j = start;
    for (int i = 0; i < steps; ++i) j = __ldcg(next + j);
    out[0] = j;
}
extern "C" __global__ void empty_kernel() {}
"""


# Hopper's asynchronous matmul (wgmma needs the sm_90a target): each warpgroup accumulates 8 m64n256k16 products
# (A 64 x 16 and B 256 x 16 from 128-byte-swizzled shared memory, as flash3 and cuBLAS read them) into one
# accumulator, then waits, `iters` times. Shared memory holds values near 1 (power depends on the data).
WGMMA_SRC = r"""
template <bool BF16> __global__ void __launch_bounds__(256) wgmma_loop(int iters, float* out) {
    extern __shared__ __align__(1024) unsigned char smem[];
    const unsigned base = ((unsigned)__cvta_generic_to_shared(smem) + 1023) & ~1023u;
    unsigned short* p = (unsigned short*)(smem + (base - (unsigned)__cvta_generic_to_shared(smem)));
    for (int i = threadIdx.x; i < (64 + 256) * 64; i += blockDim.x) p[i] = (BF16 ? 0x3f80 : 0x3c00) ^ (i & 0x3f);
    __syncthreads();
    const unsigned a = base, b = base + 64 * 128;
    float d[128];
    for (int i = 0; i < 128; ++i) d[i] = 0.f;
    for (int it = 0; it < iters; ++it) {
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const unsigned long long da = (unsigned long long)(((a + (k & 3) * 32) & 0x3FFFF) >> 4) | (1ull << 16) |
                                          (64ull << 32) | (1ull << 62);
            const unsigned long long db = (unsigned long long)(((b + (k & 3) * 32) & 0x3FFFF) >> 4) | (1ull << 16) |
                                          (64ull << 32) | (1ull << 62);
            WGMMA_N256(d, da, db)
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    }
    float s = 0.f;
    for (int i = 0; i < 128; ++i) s += d[i];
    if (s == 1234.5f) out[0] = s;
}
"""


def _wgmma_source() -> str:
    """WGMMA_SRC with its m64n256k16 instruction spelled out (128 accumulator operands), fp16 and bf16."""
    from .build import wgmma_asm
    asm = {}
    for bf16 in (False, True):
        instr, ops = wgmma_asm(256, bf16, "%128", 129, "1")
        asm[bf16] = f'asm volatile("{instr}\\n" : {ops} : "l"(da), "l"(db));'
    return "#define WGMMA_N256(d, da, db) if (BF16) { " + asm[True] + " } else { " + asm[False] + " }\n" + WGMMA_SRC


def wgmma_rates(sms: int) -> dict[str, tuple[float, str]]:
    """wgmma_fp16_tflops and wgmma_bf16_tflops on this (sm_90) GPU."""
    import cupy as cp
    mod = cp.RawModule(code=_wgmma_source(), options=("-arch=sm_90a",),
                       name_expressions=["wgmma_loop<false>", "wgmma_loop<true>"])
    out, iters, smem = cp.zeros(4, dtype=cp.float32), 2048, (64 + 256) * 64 * 2 + 1024
    res = {}
    for bf16, field in ((False, "wgmma_fp16_tflops"), (True, "wgmma_bf16_tflops")):
        k = mod.get_function(f"wgmma_loop<{'true' if bf16 else 'false'}>")
        k.max_dynamic_shared_size_bytes = smem
        t = _time_s(lambda: k((sms,), (256,), (np.int32(iters), out), shared_mem=smem))
        flops = sms * 2 * iters * 8 * 2 * 64 * 256 * 16
        res[field] = (flops / t / 1e12, f"wgmma.mma_async m64n256k16 ({'bf16' if bf16 else 'fp16'}, fp32 "
                      f"accumulate) from 128-byte-swizzled shared memory, {sms} blocks of 2 warpgroups, 8 products "
                      f"per wait")
    return res


def _time_s(fn, reps: int = 15, warmup: int = 3) -> float:
    return statistics.median(event_times(fn, reps, warmup))


def run(hw: HardwareProfile) -> dict[str, tuple[float, str]]:
    """Measure; returns field -> (value, how), plus 'copy_below_l2_gb_s' for the record."""
    import cupy as cp
    cc = cp.cuda.Device().compute_capability
    mod = cp.RawModule(code=SRC, options=(f"-arch=sm_{cc}",), name_expressions=["mma_loop<false>", "mma_loop<true>"])
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    out = cp.zeros(4, dtype=cp.uint32)
    res: dict[str, tuple[float, str]] = {}

    big = cp.empty(4 << 30, dtype=cp.uint8)
    dst = cp.empty_like(big)
    t = _time_s(lambda: dst.data.copy_from_device(big.data, big.nbytes))
    res["hbm_bandwidth_gb_s"] = (2 * big.nbytes / t / 1e9, "device-to-device copy of 4 GiB (cudaMemcpy), read + write "
                                 "bytes over CUDA-event time, median of 15")
    # writes alone and reads alone, beside the copy (on the H200 both run at about its rate: no profile field;
    # experiments/hbm_rates/hbm_mix.py measures the mixes)
    write_fill = mod.get_function("write_fill")
    read_sum = mod.get_function("read_sum")
    n16 = big.nbytes // 16
    t = _time_s(lambda: write_fill((sms * 16,), (512,), (big, np.uint64(n16), np.uint32(7))))
    res["hbm_write_gb_s"] = (big.nbytes / t / 1e9, f"{sms * 16} blocks of 512 threads filling 4 GiB with "
                                       "16-byte stores (no reads), bytes over CUDA-event time, median of 15")
    t = _time_s(lambda: big.data.memset_async(3, big.nbytes))   # cudaMemsetAsync (CuPy's fill() runs a kernel)
    res["memset_gb_s"] = (big.nbytes / t / 1e9, "cudaMemset of 4 GiB")
    t = _time_s(lambda: read_sum((sms * 16,), (512,), (big, np.uint64(n16), np.int32(1), out)))
    res["hbm_read_gb_s"] = (big.nbytes / t / 1e9, f"{sms * 16} blocks of 512 threads reading 4 GiB once with "
                            "16-byte loads (no writes)")
    del big, dst
    small = cp.empty(16 << 20, dtype=cp.uint8)
    sdst = cp.empty_like(small)

    def copies():
        for _ in range(50):
            sdst.data.copy_from_device(small.data, small.nbytes)
    t = _time_s(copies)
    res["copy_below_l2_gb_s"] = (2 * 50 * small.nbytes / t / 1e9, "50 copies of 16 MiB, read + write bytes")

    buf = cp.random.randint(0, 2**31, size=(24 << 20) // 4, dtype=cp.int32)
    n16 = buf.nbytes // 16
    reps = 20
    # The profile's L2 rate is the re-read rate with plain loads, which L1 also serves (each SM's share of the
    # buffer, about 190 KB, fits there): the engine's L2 tier charges every request a block makes, including the
    # ones an L1 or a cluster's multicast serves on the chip. L2 alone is reported beside it: with L2-only rates
    # (7.2 TB/s read, 4.2 TB/s write, as one tier or two) the refitted kernels' calibration errors rose (naive's
    # GEMMs 4.4% -> 17-27%; experiments/calibration/calibrate_h200_2026-12-01)
    t = _time_s(lambda: read_sum((sms * 8,), (512,), (buf, np.uint64(n16), np.int32(reps), out)))
    res["l2_bandwidth_gb_s"] = (reps * buf.nbytes / t / 1e9, f"{sms * 8} blocks of 512 threads re-reading a 24 MiB "
                                "buffer 20 times with 16-byte loads (after one pass brings it into L2; L1 serves "
                                "part of them)")
    read_l2 = mod.get_function("read_sum_l2")
    t = _time_s(lambda: read_l2((sms * 8,), (512,), (buf, np.uint64(n16), np.int32(reps), out)))
    res["l2_only_read_gb_s"] = (reps * buf.nbytes / t / 1e9, "the same with L2-only loads (ld.global.cg)")
    write_l2 = mod.get_function("write_l2")
    t = _time_s(lambda: write_l2((sms * 8,), (512,), (buf, np.uint64(n16), np.int32(reps), np.uint32(5))))
    res["l2_only_write_gb_s"] = (reps * buf.nbytes / t / 1e9, "the same re-writing it with L2-only stores "
                                 "(st.global.cg), resident in L2 (write-back)")
    copy_l2 = mod.get_function("copy_l2")
    half = n16 // 2
    t = _time_s(lambda: copy_l2((sms * 8,), (512,), (buf, buf[half * 4:], np.uint64(half), np.int32(reps))))
    res["l2_only_copy_gb_s"] = (2 * reps * half * 16 / t / 1e9, "one 12 MiB half copied into the other 20 times "
                                "with L2-only loads and stores, read + write bytes")

    smem = mod.get_function("smem_read")
    iters = 1 << 14
    t = _time_s(lambda: smem((sms * 4,), (512,), (np.int32(iters), out)))
    per_s = sms * 4 * 512 * iters * 16 / t
    res["smem_lds128_bytes_per_clk_per_sm"] = (per_s / (sms * hw.clock_hz), f"16-byte shared loads (LDS.128), "
                                               f"{sms * 4} blocks of 512 threads; per SM at {hw.sm_clock_mhz:g} MHz")
    ldsm = mod.get_function("smem_ldmatrix")
    iters = 1 << 13
    t = _time_s(lambda: ldsm((sms * 4,), (512,), (np.int32(iters), np.uint32(0), out)))
    per_s = sms * 4 * 16 * iters * 4 * 512 / t
    res["smem_bandwidth_bytes_per_clk_per_sm"] = (per_s / (sms * hw.clock_hz), f"ldmatrix.x4 (512 B a warp) from a "
                                                  f"swizzled, conflict-free 64x64 fp16 tile, {sms * 4} blocks of 16 "
                                                  f"warps; per SM at {hw.sm_clock_mhz:g} MHz")

    iters = 4096
    for bf16, field in ((False, "tensor_fp16_tflops"), (True, "tensor_bf16_tflops")):
        k = mod.get_function(f"mma_loop<{'true' if bf16 else 'false'}>")
        t = _time_s(lambda: k((sms * 8,), (128,), (np.int32(iters), out)))
        flops = sms * 8 * 4 * iters * 8 * 2 * 16 * 8 * 16
        res[field] = (flops / t / 1e12, f"mma.sync.m16n8k16 ({'bf16' if bf16 else 'fp16'}, fp32 accumulate) on "
                      f"registers, {sms * 8} blocks of 4 warps, 8 independent chains per warp")

    if cc == "90":
        res |= wgmma_rates(sms)

    ex2 = mod.get_function("ex2_loop")
    iters = 1 << 14
    t = _time_s(lambda: ex2((sms * 8,), (256,), (np.int32(iters), out)))
    res["sfu_ops_per_clk_per_sm"] = (sms * 8 * 256 * iters * 8 / t / (sms * hw.clock_hz),
                                     f"ex2.approx.ftz.f32, 8 independent chains per thread; per SM at "
                                     f"{hw.sm_clock_mhz:g} MHz")

    chase = mod.get_function("chase")

    def cycle(nbytes: int):
        nodes = nbytes // 128
        perm = cp.random.permutation(nodes).astype(cp.uint32)
        nxt = cp.zeros(nbytes // 4, dtype=cp.uint32)
        nxt[perm * 32] = cp.roll(perm, -1) * 32   # node perm[i] points at perm[i + 1]: one cycle through all
        return nxt, perm
    # HBM: 512 MiB, each timing from a new point of the cycle, so what earlier timings left in L2 is not met
    nxt, perm = cycle(512 << 20)
    steps, starts = 20000, iter(range(0, len(perm), len(perm) // 64))
    t = _time_s(lambda: chase((1,), (1,), (nxt, np.uint32(int(perm[next(starts)]) * 32), np.int32(steps), out)),
                reps=15, warmup=3)
    res["hbm_latency_ns"] = (t / steps * 1e9, f"one thread chasing pointers through a random cycle of 128-byte lines "
                             f"of a 512 MiB buffer (L2 bypassed by size, L1 by ld.global.cg), {steps} loads a run")
    del nxt, perm
    # L2: an 8 MiB cycle, walked once before timing so that it is resident
    nxt, perm = cycle(8 << 20)
    steps = len(perm)
    t = _time_s(lambda: chase((1,), (1,), (nxt, np.uint32(0), np.int32(steps), out)), reps=15, warmup=2)
    res["l2_latency_ns"] = (t / steps * 1e9, f"the same through an 8 MiB buffer resident in L2, {steps} loads a run")
    del nxt, perm

    empty = mod.get_function("empty_kernel")
    n = 200

    def launches():
        for _ in range(n):
            empty((1,), (32,), ())
    t = _time_s(launches)
    res["kernel_launch_us"] = (t / n * 1e6, f"{n} empty kernels launched back to back from Python through CuPy, "
                               "time per launch")
    return res


def write_profile(hw: HardwareProfile, res: dict[str, tuple[float, str]], path: Path,
                  keep: HardwareProfile | None = None) -> str:
    """The datasheet profile with the measured fields replaced, as TOML; validated before it is written. `keep`:
    the calibrated profile this one replaces, whose fields calibrate does not measure (measured by experiments,
    or by hand) are kept with their sources rather than reset to the datasheet's."""
    today = date.today().isoformat()
    gpu = _gpu_name()
    # the datasheet's fields, those the replaced calibration had, and the optional ones measured now, in order
    def known(f):
        if keep is not None and getattr(keep, f) is not None:
            return getattr(keep, f), keep.sources.get(f)
        return getattr(hw, f), hw.sources.get(f)
    fields = {f: known(f) for f in HardwareProfile.quantity_fields() if known(f)[0] is not None or f in res}
    for f, (v, how) in res.items():
        if f in fields:
            fields[f] = (round(v, 3), f"measured: {today}, {how} on {gpu} (iosim calibrate)")
    lines = [f"# {hw.name}, calibrated: the fields measured by `iosim calibrate` on {today} replace the datasheet's",
             f"# values of hw_profiles/{hw.key}.toml; the others are copied from it with their sources.",
             f"# Also measured: copy below L2 {res['copy_below_l2_gb_s'][0]:.0f} GB/s ({res['copy_below_l2_gb_s'][1]});",
             f"# shared memory through LDS.128 {res['smem_lds128_bytes_per_clk_per_sm'][0]:.1f} B/clk/SM "
             f"({res['smem_lds128_bytes_per_clk_per_sm'][1]});",
             f"# HBM write alone {res['hbm_write_gb_s'][0]:.0f} GB/s ({res['hbm_write_gb_s'][1]}); read alone "
             f"{res['hbm_read_gb_s'][0]:.0f} GB/s ({res['hbm_read_gb_s'][1]}); cudaMemset "
             f"{res['memset_gb_s'][0]:.0f} GB/s ({res['memset_gb_s'][1]}).",
             "# L2 alone (not the L2 rate below, which L1 helps; gpu_kernels/calibrate.py says why): read "
             + "; ".join(f"{res[k][0]:.0f} GB/s ({res[k][1]})" if k == "l2_only_read_gb_s" else
                         f"{k[8:-5]} {res[k][0]:.0f} GB/s ({res[k][1]})"
                         for k in ("l2_only_read_gb_s", "l2_only_write_gb_s", "l2_only_copy_gb_s")) + ".",
             f'name = "{hw.name} (calibrated)"'] + ([f'arch = "{hw.arch}"'] if hw.arch else []) + [""]
    for f, (v, src) in fields.items():
        val = int(v) if isinstance(v, int) else float(v)
        lines.append(f'{f} = {{ value = {val}, source = "{src.replace(chr(34), chr(39))}" }}')
    text = "\n".join(lines) + "\n"
    from iosim.hardware import parse_profile
    parse_profile(text, str(path), key=path.stem)   # refuses to write what would not load
    return text


def _gpu_name() -> str:
    import cupy as cp
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    return props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])


def main(argv: list[str] | None = None) -> None:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m gpu_kernels.calibrate", description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="h200_sxm", help="the datasheet profile to start from")
    ap.add_argument("--out", type=Path, default=None, help="default: hw_profiles/<profile>.calibrated.toml")
    ap.add_argument("--force", action="store_true", help="overwrite an existing file")
    args = ap.parse_args(argv)
    try:
        calibrate(args.profile, args.out, args.force)
    except IosimError as e:
        print(f"calibrate: error: {e}", file=sys.stderr)
        sys.exit(2)


def calibrate(profile: str, out: Path | None, force: bool) -> Path:
    from .measure import check_gpu
    check_gpu()
    hw = load_profile(profile)
    out = out or profiles_dir() / f"{hw.key}.calibrated.toml"
    if out.exists() and not force:
        raise IosimError(f"{out} exists; pass --force to overwrite it")
    keep = load_profile(out) if out.exists() else None   # loaded before the GPU work: a bad file fails first
    res = run(hw)
    text = write_profile(hw, res, out, keep)
    tmp = out.with_suffix(".toml.tmp")
    tmp.write_text(text)
    tmp.replace(out)
    for f, (v, how) in res.items():
        print(f"{f:<38}{v:>12.3f}   {how}")
    print(f"written: {out}")
    return out


if __name__ == "__main__":
    main()
