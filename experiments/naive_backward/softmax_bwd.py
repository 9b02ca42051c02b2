"""Naive attention's softmax gradient (gpu_kernels' softmax_bwd_rows) built from two backward.cu sources, side by
side in one run: bytes moved a second against the device-to-device copy rate measured in the same run.

    python experiments/naive_backward/softmax_bwd.py --before OLD_BACKWARD_CU [--out results.json]

Each build is first checked against a float64 numpy version of dS = scale * P * (dP - rowsum(P * dP)) on rows of
odd and even length, then timed on (rows, keys) from 256 to 16k keys: microseconds from CUDA events, the median of
20 calls after 3 warm-ups (`gpu_kernels.timing.event_times`), fresh random inputs for each build. Bytes: P and dP
read, dS written, 2 bytes an element.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import cupy as cp
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from gpu_kernels import build  # noqa: E402
from gpu_kernels.timing import event_times  # noqa: E402

SHAPES = [(65536, 256), (16384, 1024), (32768, 999), (8192, 2048), (8192, 3001), (4096, 4096), (2048, 8192),
          (1024, 16384), (16384, 16384)]


def module(backward_cu: str):
    names = [build.softmax_bwd_name(bf) for bf in (False, True)]
    src = build.SOURCE.read_text() + "\n" + backward_cu
    cc = cp.cuda.Device().compute_capability
    mod = cp.RawModule(code=src, options=("-std=c++17", f"-arch=sm_{cc}"), name_expressions=names)
    mod.compile()
    return {bf: mod.get_function(build.softmax_bwd_name(bf)) for bf in (False, True)}


def launch(fn, p, dp, ds, rows, nk, scale):
    smem = 4 * nk + build.SOFTMAX_BWD_SMEM_PAD
    fn.max_dynamic_shared_size_bytes = smem
    fn((rows,), (build.ROW_THREADS,), (p, dp, ds, np.int32(nk), np.float32(scale)), shared_mem=smem)


def check(fns) -> float:
    worst = 0.0
    for bf in (False, True):
        for rows, nk in ((7, 1), (33, 999), (17, 1000), (5, 4099)):
            rng = np.random.default_rng(rows * nk)
            pf = rng.random((rows, nk)).astype(np.float32)
            gf = rng.standard_normal((rows, nk)).astype(np.float32)
            if bf:   # bfloat16 by truncating float32's low half
                to = lambda x: cp.asarray((x.view(np.uint32) >> 16).astype(np.uint16))
                back = lambda x: (cp.asnumpy(x).astype(np.uint32) << 16).view(np.float32)
            else:
                to = lambda x: cp.asarray(x.astype(np.float16)).view(cp.uint16)
                back = lambda x: cp.asnumpy(x.view(cp.float16)).astype(np.float32)
            p, g = to(pf), to(gf)
            ds = cp.full((rows, nk), 0xFFFF, dtype=cp.uint16)   # NaN in both formats
            launch(fns[bf], p, g, ds, rows, nk, 0.125)
            pe, ge = back(p).astype(np.float64), back(g).astype(np.float64)
            ref = 0.125 * pe * (ge - (pe * ge).sum(1, keepdims=True))
            out = back(ds).astype(np.float64)
            err = np.abs(out - ref).max() / (np.abs(ref).max() + 1e-30)
            tol = 1e-2 if bf else 2e-3
            if not err < tol or np.isnan(out).any():
                raise AssertionError(f"bf16={bf} rows {rows} keys {nk}: relative error {err}")
            worst = max(worst, err / tol)
    return worst


def time_us(fn, rows, nk) -> float:
    p = cp.random.random((rows, nk), dtype=cp.float32).astype(cp.float16).view(cp.uint16)
    dp = cp.random.standard_normal((rows, nk), dtype=cp.float32).astype(cp.float16).view(cp.uint16)
    ds = cp.empty_like(p)
    return float(np.median(event_times(lambda: launch(fn, p, dp, ds, rows, nk, 0.125)))) * 1e6


def copy_rate() -> float:
    """Bytes read and written a second by a device-to-device copy of 1 GiB (as `iosim calibrate` times its 4 GiB)."""
    x = cp.empty(1 << 30, dtype=cp.uint8)
    y = cp.empty_like(x)
    return 2 * x.nbytes / float(np.median(event_times(lambda: y.data.copy_from_device(x.data, x.nbytes))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True, help="a backward.cu to compare with the current one")
    ap.add_argument("--out")
    args = ap.parse_args()
    builds = {"before": module(Path(args.before).read_text()), "now": module(build.BACKWARD_SOURCE.read_text())}
    checked = {k: check(v) for k, v in builds.items()}
    print("checked against float64, worst error / tolerance: " + ", ".join(f"{k} {v:.2f}" for k, v in checked.items()))
    rate = copy_rate()
    print(f"device-to-device copy {rate / 1e12:.2f} TB/s (read + write)")
    rows_out = []
    for rows, nk in SHAPES:
        row = {"rows": rows, "keys": nk, "bytes": 3 * 2 * rows * nk}
        for k, v in builds.items():
            row[f"{k}_us"] = time_us(v[False], rows, nk)
        rows_out.append(row)
        tb = {k: row["bytes"] / row[f"{k}_us"] / 1e6 for k in builds}
        print(f"rows {rows:>6} keys {nk:>6}: before {row['before_us']:8.1f} us ({tb['before']:5.2f} TB/s)  now "
              f"{row['now_us']:8.1f} us ({tb['now']:5.2f} TB/s)  before/now {row['before_us'] / row['now_us']:.2f}",
              flush=True)
    if args.out:
        from gpu_kernels.measure import save_benchmark
        save_benchmark(args.out, "naive backward's softmax gradient kernel, two builds, one run",
                       ["python3 experiments/naive_backward/softmax_bwd.py " + " ".join(sys.argv[1:]),
                        __doc__.split("\n\n")[2]], copy_bytes_per_s=rate, checked=checked, rows=rows_out)


if __name__ == "__main__":
    main()
