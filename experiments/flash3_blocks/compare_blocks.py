"""flash3 at other block shapes, side by side with PyTorch's SDPA flash and cuDNN forwards, in one run.

    python experiments/flash3_blocks/compare_blocks.py [--out results.json]

A block shape is (consumer warpgroups, key-tile width): 64 query rows a consumer, so (2, 128) is 128 x 128 and
(3, 128) 192 x 128, FlashAttention-3's d-64 choice (hopper/tile_size.h of Dao-AILab/flash-attention: 192 rows,
three consumers at 160 registers). Each shape is first checked against a float64 reference (the GPU tests'
shapes: odd N, Nq != Nk, GQA, N = 1; causal or not; fp16 and bf16), then timed at FlashAttention-3's benchmark
shapes (16k tokens, hidden 2048), fp16 and bf16, causal or not, N 2k, 8k and 16k: TFLOP/s of useful FLOPs from
CUDA events, the median of 20 queued calls, fresh random inputs per method.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from benchmarks.kernels import BACKENDS, _sdpa, time_ms  # noqa: E402
from gpu_kernels import build, hopper  # noqa: E402
from iosim.plan.flash3 import STAGES  # noqa: E402
from test_gpu_kernels import SHAPES, TOL, inputs, reference, rel_err  # noqa: E402

# (head_dim, (consumers, key-tile width), ping-pong); the first is flash3 as shipped, what the others are divided by
VARIANTS = [(64, (2, 128), True), (64, (2, 128), False), (64, (2, 192), True), (64, (3, 128), True),
            (64, (3, 128), False)]


def check(d: int, blocks, pingpong: bool) -> float:
    """The largest error against float64 over the test shapes, or raises on a failure."""
    worst = 0.0
    for dtype in (torch.float16, torch.bfloat16):
        for causal in (False, True):
            for shape in SHAPES + [(1, 2, 2, 4096 + 3, 4096 + 3)]:
                q, k, v = inputs(*shape, d, dtype)
                out = torch.full_like(q, float("nan"))
                o = hopper.flash3_attention(q, k, v, causal=causal, out=out, pingpong=pingpong, blocks=blocks)
                err = rel_err(o, reference(q, k, v, causal)[0])
                if not err < TOL[dtype]:
                    raise AssertionError(f"blocks {blocks} pingpong {pingpong} {dtype} causal {causal} {shape}: {err}")
                worst = max(worst, err / TOL[dtype])
    return worst


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    variants = VARIANTS
    names = [build.flash3_name(d, bl[1], STAGES, bl[0], pp, bf) for d, bl, pp in variants for bf in (False, True)]
    build_names = build.flash3_names
    build.flash3_names = lambda: sorted(set(build_names()) | set(names))   # one NVRTC compile for every variant
    label = {v: f"d{v[0]} {64 * v[1][0]}x{v[1][1]}{'' if v[2] else ' nopp'}" for v in variants}
    checked = {}
    for v in variants:
        try:
            checked[label[v]] = check(*v)
        except Exception as e:
            checked[label[v]] = f"FAIL {type(e).__name__}: {str(e)[:160]}"
        print(f"check {label[v]}: {checked[label[v]]}", flush=True)
    rows = []
    for dtype in (torch.float16, torch.bfloat16):
        for d in sorted({v[0] for v in variants}):
            for causal in (False, True):
                for n in (2048, 8192, 16384):
                    b, h = 16384 // n, 2048 // d
                    flops = 4 * b * h * n * n * d / (2 if causal else 1)
                    row = {"dtype": str(dtype)[6:], "d": d, "causal": causal, "N": n, "batch": b, "heads": h}
                    fns = {label[v]: (lambda q, k, v_, v=v: hopper.flash3_attention(q, k, v_, causal=causal,
                                      pingpong=v[2], blocks=v[1]))
                           for v in variants if v[0] == d and isinstance(checked[label[v]], float)}
                    fns["torch_flash"] = lambda q, k, v_: _sdpa(q, k, v_, causal, BACKENDS["torch_flash"])
                    fns["torch_cudnn"] = lambda q, k, v_: _sdpa(q, k, v_, causal, BACKENDS["torch_cudnn"])
                    for name, fn in fns.items():
                        q, k, v_ = (torch.randn(b, h, n, d, device="cuda", dtype=dtype) for _ in range(3))
                        row[name] = flops / (time_ms(lambda: fn(q, k, v_)) * 1e-3) / 1e12
                    rows.append(row)
                    base = row[label[variants[0]]]
                    print(f"{row['dtype']:>8} d{d} {'causal' if causal else '      '} N{n:<6} " + "  ".join(
                        f"{k} {x:5.0f} ({x / base:4.2f})" for k, x in row.items() if isinstance(x, float)), flush=True)
    if args.out:
        from gpu_kernels.measure import save_benchmark
        save_benchmark(args.out, "TFLOP/s of flash3 at other block shapes and of PyTorch's forwards, one run",
                       ["python3 experiments/flash3_blocks/compare_blocks.py " + " ".join(sys.argv[1:]),
                        __doc__.split("\n\n")[1]], checked=checked, rows=rows)


if __name__ == "__main__":
    main()
