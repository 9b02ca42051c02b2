"""flash3 built from other hopper.cu sources, side by side with the current one and PyTorch's SDPA, in one run.

    python experiments/flash3_pipeline/compare.py --variant LABEL=PATH ... [--out results.json]

Each variant's source replaces gpu_kernels/hopper.cu (same kernel signature and instance names); the launcher is
the current one. Shapes as benchmarks/flash3.py (16k tokens, hidden 2048), fp16, N 2k and 8k. Each variant's
output is checked against SDPA flash's before it is timed.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.kernels import BACKENDS, _sdpa, time_ms  # noqa: E402
from gpu_kernels import build, hopper  # noqa: E402

CURRENT = build.HOPPER_SOURCE


def use(path: str | None):
    hopper._module = None
    build.HOPPER_SOURCE = CURRENT if path is None else Path(path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", action="append", default=[], help="LABEL=PATH of a hopper.cu")
    ap.add_argument("--out")
    args = ap.parse_args()
    variants = [("current", None)] + [tuple(v.split("=", 1)) for v in args.variant]
    rows = []
    for d in (64, 128):
        for causal in (False, True):
            for n in (2048, 8192):
                b, h = 16384 // n, 2048 // d
                flops = 4 * b * h * n * n * d / (2 if causal else 1)
                q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
                ref = _sdpa(q, k, v, causal, BACKENDS["torch_flash"])
                row = {"d": d, "causal": causal, "N": n}
                for name in ("torch_flash", "torch_cudnn"):
                    row[name] = flops / time_ms(lambda: _sdpa(q, k, v, causal, BACKENDS[name])) / 1e9
                for label, path in variants:
                    use(path)
                    err = (hopper.flash3_attention(q, k, v, causal=causal).float() - ref.float()).abs().max().item()
                    row[label] = flops / time_ms(lambda: hopper.flash3_attention(q, k, v, causal=causal)) / 1e9
                    row[label + "_maxerr"] = err
                rows.append(row)
                print(f"d{d:<4}{'causal' if causal else '      '} N{n:<6} SDPA flash {row['torch_flash']:6.1f} cuDNN "
                      f"{row['torch_cudnn']:6.1f} " + " ".join(f"{lab} {row[lab]:6.1f} ({row[lab] / row['torch_flash']:.2f}x,"
                                                              f" err {row[lab + '_maxerr']:.1e})" for lab, _ in variants),
                      flush=True)
    use(None)
    if args.out:
        from gpu_kernels.measure import save_benchmark
        save_benchmark(args.out, "TFLOP/s of flash3 built from several hopper.cu sources, fp16, one run",
                       ["python3 experiments/flash3_pipeline/compare.py " + " ".join(sys.argv[1:]),
                        __doc__.split("\n\n")[1]], variants=dict(variants), rows=rows)


if __name__ == "__main__":
    main()
