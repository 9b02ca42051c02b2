"""HBM's rate for streams of reads and writes mixed in different shares: which limit holds a write-heavy kernel
(naive attention's qk writes S, its softmax reads S and writes P).

Each kernel reads `a` and writes `b` 16-byte words a unit, over about 4 GiB of traffic, far beyond L2; timed
with CUDA events (median of 15 after 3 warm-ups). The table sets each measured rate beside two readings of the
pure read, pure write and copy rates measured in the same run:
  limits    (the engine's): reads + writes held to the copy's rate, writes alone to the write stream's rate
  bus time  each byte costs the time it takes in its own pure stream: t = R / read rate + W / write rate
    source .whl/prelude.sh && python3 experiments/hbm_rates/hbm_mix.py --out $OUT/hbm_mix.json
"""
import argparse
import json
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SRC = r"""
extern "C" __global__ void mix(const uint4* __restrict__ src, uint4* __restrict__ dst, unsigned long long units,
                               int a, int b, unsigned* sink) {
    for (unsigned long long u = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; u < units;
         u += (unsigned long long)gridDim.x * blockDim.x) {
        unsigned acc = (unsigned)u;
        for (int k = 0; k < a; ++k) {   // unit u's words are a apart: each warp's loads stay coalesced
            uint4 v = src[u + k * units];
            acc ^= v.x ^ v.y ^ v.z ^ v.w;
        }
        for (int k = 0; k < b; ++k) dst[u + k * units] = make_uint4(acc, acc + k, acc, acc);
        if (b == 0 && acc == 0x12345678u) sink[0] = acc;   // keeps a read-only kernel's loads alive
    }
}
"""
MIXES = ((1, 0), (4, 1), (2, 1), (1, 1), (1, 2), (1, 4), (0, 1))
TRAFFIC = 4 << 30


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    import cupy as cp
    from gpu_kernels.measure import machine_provenance
    from gpu_kernels.timing import event_times
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    mix = cp.RawModule(code=SRC).get_function("mix")
    src = cp.random.randint(0, 2**31, size=TRAFFIC // 4, dtype=cp.int32)
    dst = cp.empty(TRAFFIC // 4, dtype=cp.int32)
    sink = cp.zeros(1, dtype=cp.uint32)
    dst2 = cp.empty_like(dst)
    rows = []
    for a, b in MIXES:
        units = TRAFFIC // (16 * (a + b))
        t = statistics.median(event_times(
            lambda: mix((sms * 16,), (512,), (src, dst, cp.uint64(units), cp.int32(a), cp.int32(b), sink)), 15, 3))
        rows.append({"reads_per_unit": a, "writes_per_unit": b, "read_bytes": 16 * a * units,
                     "write_bytes": 16 * b * units, "seconds": t})
    copy_s = statistics.median(event_times(lambda: dst2.data.copy_from_device(src.data, src.nbytes), 15, 3))
    prov = machine_provenance()
    rec = {"what": "HBM rate of mixed read/write streams (experiments/hbm_rates/hbm_mix.py)", "grid": f"{sms * 16} x 512",
           "timing": "CUDA events around each call, median of 15 after 3 warm-ups", "provenance": prov,
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "copy_4gib_seconds": copy_s, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rec, indent=1))
    table(rec)


def table(rec: dict) -> None:
    rows = rec["rows"]
    rd = next(r for r in rows if r["write_bytes"] == 0)
    wr = next(r for r in rows if r["read_bytes"] == 0)
    read_rate, write_rate = rd["read_bytes"] / rd["seconds"], wr["write_bytes"] / wr["seconds"]
    copy_rate = 2 * (TRAFFIC) / rec["copy_4gib_seconds"]
    print(f"pure read {read_rate / 1e9:.0f} GB/s, pure write {write_rate / 1e9:.0f} GB/s, cudaMemcpy (read + write) "
          f"{copy_rate / 1e9:.0f} GB/s")
    print(f"{'reads:writes':>12}{'GB/s':>8}{'limits':>9}{'err':>7}{'bus time':>10}{'err':>7}")
    for r in rows:
        R, W, t = r["read_bytes"], r["write_bytes"], r["seconds"]
        limits = max((R + W) / copy_rate, W / write_rate, R / read_rate)
        bus = R / read_rate + W / write_rate
        print(f"{r['reads_per_unit']:>6}:{r['writes_per_unit']:<5}{(R + W) / t / 1e9:8.0f}{(R + W) / limits / 1e9:9.0f}"
              f"{limits / t - 1:+7.1%}{(R + W) / bus / 1e9:10.0f}{bus / t - 1:+7.1%}")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--print":
        table(json.loads(Path(sys.argv[2]).read_text()))
    else:
        main()
