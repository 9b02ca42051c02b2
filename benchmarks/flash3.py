"""flash3 (the Hopper forward) against PyTorch's attention and our flash2, in one run.

    python benchmarks/flash3.py [--out results.json] [--quick]

FlashAttention-3's benchmark shapes: batch * N = 16k tokens, heads * d = 2048, fp16 and bf16, d 64 and 128,
causal or not. TFLOP/s (useful FLOPs, 4 B H N^2 d, halved when causal) from CUDA events, the median of 20 queued
calls after warm-up, fresh random inputs. Prints ratios measured in this run: flash3 / SDPA flash (target >= 1.5),
flash3 / itself without ping-pong and launched one block a work tile (not persistent),
flash3 / cuDNN (target >= 0.9 at d 128), and flash3's fraction of the dense GEMM rate measured here (a bf16
8192^3 torch.matmul).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.kernels import _sdpa, BACKENDS, time_ms  # noqa: E402
from gpu_kernels.hopper import flash3_attention  # noqa: E402
from gpu_kernels.ops import attention  # noqa: E402
from iosim.plan import Tiling  # noqa: E402


def gemm_tflops(dtype) -> float:
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=dtype) for _ in range(2))
    return 2 * 8192 ** 3 / (time_ms(lambda: a @ b) * 1e-3) / 1e12


def methods(d: int):
    fa2 = {64: Tiling(block_q=128, block_kv=128, warps=4, stages=2), 128: Tiling(block_q=128, block_kv=64)}[d]
    return {"flash3": lambda q, k, v, c: flash3_attention(q, k, v, causal=c),
            "flash3_no_pingpong": lambda q, k, v, c: flash3_attention(q, k, v, causal=c, pingpong=False),
            "flash3_one_block_a_tile": lambda q, k, v, c: flash3_attention(q, k, v, causal=c, persistent=False),
            "ours_flash2": lambda q, k, v, c: attention(q, k, v, "flash2", causal=c, tiling=fa2),
            "torch_flash": lambda q, k, v, c: _sdpa(q, k, v, c, BACKENDS["torch_flash"]),
            "torch_cudnn": lambda q, k, v, c: _sdpa(q, k, v, c, BACKENDS["torch_cudnn"])}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="N = 2k and 8k only")
    args = ap.parse_args()
    peak = {dt: gemm_tflops(dt) for dt in (torch.float16, torch.bfloat16)}
    print("dense GEMM measured (8192^3): " + ", ".join(f"{str(k)[6:]} {v:.0f} TFLOP/s" for k, v in peak.items()))
    rows = []
    for dtype in (torch.float16, torch.bfloat16):
        for d in (64, 128):
            for causal in (False, True):
                for n in ([2048, 8192] if args.quick else [1024, 2048, 4096, 8192, 16384]):
                    b, h = max(1, 16384 // n), 2048 // d
                    flops = 4 * b * h * n * n * d / (2 if causal else 1)
                    row = {"dtype": str(dtype)[6:], "d": d, "causal": causal, "N": n, "batch": b, "heads": h}
                    for name, fn in methods(d).items():
                        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=dtype) for _ in range(3))
                        try:
                            row[name] = flops / (time_ms(lambda: fn(q, k, v, causal)) * 1e-3) / 1e12
                        except Exception as e:   # a backend that refuses a config is recorded as such
                            row[name] = f"ERR {type(e).__name__}: {str(e)[:80]}"
                    rows.append(row)
                    f3 = row["flash3"]
                    r = (lambda x: f"{f3 / x:5.2f}" if isinstance(x, float) and isinstance(f3, float) else "  n/a")
                    print(f"{row['dtype']:>8} d{d:<4}{'causal' if causal else '      '} N{n:<6} flash3 "
                          f"{f3 if isinstance(f3, str) else f'{f3:6.1f}'} TFLOP/s  / SDPA flash {r(row['torch_flash'])}"
                          f"  / cuDNN {r(row['torch_cudnn'])}  / our flash2 {r(row['ours_flash2'])}  / no pingpong "
                          f"{r(row['flash3_no_pingpong'])}  / a block a tile "
                          f"{r(row['flash3_one_block_a_tile'])}  of GEMM "
                          f"{f3 / peak[dtype] if isinstance(f3, float) else float('nan'):.2f}", flush=True)
    if args.out:
        from gpu_kernels.measure import save_benchmark
        save_benchmark(args.out, "TFLOP/s of flash3, our flash2 and PyTorch's attention, forward, one run",
                       ["python3 benchmarks/flash3.py " + " ".join(sys.argv[1:]), __doc__.split("\n\n")[1]],
                       gemm_tflops_measured={str(k)[6:]: v for k, v in peak.items()}, rows=rows)

if __name__ == "__main__":
    main()
