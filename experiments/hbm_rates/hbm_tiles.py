"""HBM's rate when a kernel writes (or reads) a row-major matrix tile by tile, as cuBLAS's qk writes S: each
128-row tile is 128 short segments (256 B for 128 fp16 columns) one matrix row apart, against the same bytes
written in one sequential stream. Timed with CUDA events (median of 15 after 3 warm-ups), 4 GiB each, far beyond
L2. Also times torch's matmul Q K^T of naive attention's shapes, whose S-write rate the tile rows explain or not.
    source .whl/prelude.sh && python3 experiments/hbm_rates/hbm_tiles.py --out $OUT/hbm_tiles.json
"""
import argparse
import json
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SRC = r"""
// tiles of `rows` x `cols` fp16 of a row-major matrix `width` columns wide, the column tile fastest; each block
// takes tiles b, b + grid, ...; 16-byte accesses, a row's segment by consecutive threads
extern "C" __global__ void tiles(uint4* __restrict__ m, unsigned long long n_tiles, int width, int rows, int cols,
                                 int write, unsigned* sink) {
    const int per_row = cols / 8, tiles_across = width / cols;
    unsigned acc = 0;
    for (unsigned long long t = blockIdx.x; t < n_tiles; t += gridDim.x) {
        const unsigned long long tr = t / tiles_across, tc = t % tiles_across;
        for (int i = threadIdx.x; i < rows * per_row; i += blockDim.x) {
            const unsigned long long at = ((tr * rows + i / per_row) * width + tc * cols) / 8 + i % per_row;
            if (write) m[at] = make_uint4(acc, (unsigned)t, 0u, (unsigned)i);
            else { uint4 v = m[at]; acc ^= v.x ^ v.w; }
        }
    }
    if (!write && acc == 0x12345678u) sink[0] = acc;
}
"""
BYTES = 4 << 30
TILES = ((128, 128), (128, 64), (64, 64))
WIDTHS = (128, 1024, 4096, 16384)
GRIDS = (1, 8)      # blocks per SM


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    import cupy as cp
    import torch
    from gpu_kernels.measure import machine_provenance
    from gpu_kernels.timing import event_times
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    k = cp.RawModule(code=SRC).get_function("tiles")
    m = cp.zeros(BYTES // 2, dtype=cp.uint16)
    sink = cp.zeros(1, dtype=cp.uint32)
    rows = []
    for write in (1, 0):
        for r, c in TILES:
            for w in WIDTHS:
                if w < c:
                    continue
                n_tiles = BYTES // (2 * r * c)
                for g in GRIDS:
                    t = statistics.median(event_times(lambda: k((sms * g,), (256,), (
                        m, cp.uint64(n_tiles), cp.int32(w), cp.int32(r), cp.int32(c), cp.int32(write), sink)), 15, 3))
                    rows.append({"write": bool(write), "tile": [r, c], "width": w, "blocks_per_sm": g,
                                 "bytes": BYTES, "seconds": t})
    del m
    gemms = []
    for bh, n, d in ((8, 16384, 64), (8, 16384, 128), (16, 4096, 64)):
        q = torch.randn(bh, n, d, device="cuda", dtype=torch.float16)
        kk = torch.randn(bh, n, d, device="cuda", dtype=torch.float16)
        s = torch.empty(bh, n, n, device="cuda", dtype=torch.float16)
        t = statistics.median(event_times(lambda: torch.matmul(q, kk.transpose(1, 2), out=s), 15, 3, queued=True))
        gemms.append({"bh": bh, "n": n, "d": d, "s_bytes": s.numel() * 2, "seconds": t})
        del q, kk, s
    prov = machine_provenance()
    rec = {"what": "HBM rate of tile-by-tile writes and reads of a row-major fp16 matrix (experiments/hbm_rates/hbm_tiles.py)",
           "timing": "CUDA events around each call, median of 15 after 3 warm-ups (the matmuls queued)",
           "provenance": prov, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "rows": rows, "matmuls": gemms}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rec, indent=1))
    table(rec)


def table(rec: dict) -> None:
    print(f"{'':6}{'tile':>9}{'width':>7}" + "".join(f"{f'{g}/SM GB/s':>13}" for g in GRIDS))
    rows = rec["rows"]
    for key in dict.fromkeys((r["write"], tuple(r["tile"]), r["width"]) for r in rows):
        sel = {r["blocks_per_sm"]: r for r in rows if (r["write"], tuple(r["tile"]), r["width"]) == key}
        print(f"{'write' if key[0] else 'read':<6}{'x'.join(map(str, key[1])):>9}{key[2]:>7}"
              + "".join(f"{sel[g]['bytes'] / sel[g]['seconds'] / 1e9:13.0f}" for g in GRIDS if g in sel))
    for g in rec["matmuls"]:
        print(f"torch.matmul Q K^T  BH{g['bh']} N{g['n']} d{g['d']}: {g['seconds'] * 1e6:8.1f} us, S written at "
              f"{g['s_bytes'] / g['seconds'] / 1e9:.0f} GB/s")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--print":
        table(json.loads(Path(sys.argv[2]).read_text()))
    else:
        main()
