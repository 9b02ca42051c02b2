"""Our flash2 backward in FlashAttention-2's warp layout (`flash2_bwd_split`) beside the shipped layout: correct,
and how fast against SDPA's flash backward?

    python experiments/kernel_profile/bwd_split_layout.py [--out DIR]   (on the GPU machine)

The shipped layout gives each warp 16 keys and all of head_dim: it reads a query block's Q and dO rows once a warp
for each of S^T, dP^T, dV and dK. The split layout gives a warp 32 keys and half the queries for S^T and dP^T,
sends P^T and dS^T through shared memory, then 32 keys and half of head_dim for dV and dK (at d 128, 608 against
720 KB of shared-memory reads a 64x128 step). Both at 64x128 blocks, 8 warps (d 64: also the shipped 128x128).
Correctness as tests/test_gpu_backward.py judges it (max error at most twice PyTorch's own low-precision error
plus 1e-4, against float64), grouped heads and Nq != Nk included; then the backward alone (autograd, CUDA events,
median of 20 queued calls) at the FlashAttention-2 paper's shapes (batch * N = 16k, heads * d = 2048), in one run.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from gpu_kernels import build, ops  # noqa: E402
from gpu_kernels.ops import attention  # noqa: E402
from gpu_kernels.measure import provenance  # noqa: E402
from iosim.plan import Tiling  # noqa: E402
from iosim.plan.backward import SPLIT_LAYOUT  # noqa: E402
from bwd_query_chunk import bwd_ms, error_ratio, sdpa  # noqa: E402  (this folder's)

# (batch, heads, kv heads, Nq, Nk)
SHAPES = [(2, 4, 4, 1024, 1024), (1, 4, 4, 1000, 1000), (2, 2, 2, 257, 513), (1, 2, 2, 513, 257),
          (1, 2, 2, 77, 300), (1, 4, 2, 640, 640), (1, 2, 2, 1, 130)]
T64 = Tiling(block_q=64, block_kv=128, warps=8)


def variants(d: int) -> dict:
    """name -> (split layout on?, backward tiling)"""
    out = {"shipped_64x128": (False, T64), "split_64x128": (True, T64)}
    if d == 64:
        out["shipped_128x128"] = (False, Tiling(block_q=128, block_kv=128, warps=8))
    return out


def use(split: bool, d: int) -> None:
    SPLIT_LAYOUT.clear()
    if split:
        SPLIT_LAYOUT.add(d)


def worst_ratio(d, dtype, causal, tiling) -> float:
    """`error_ratio`'s largest over SHAPES (grouped heads, Nq != Nk, logits twice as spread): <= 1 passes."""
    worst = 0.0
    for b, h, hkv, nq, nk in SHAPES:
        q, do = (torch.randn(b, h, nq, d, device="cuda", dtype=dtype) for _ in range(2))
        k, v = (torch.randn(b, hkv, nk, d, device="cuda", dtype=dtype) * 2 for _ in range(2))
        ours = lambda *x: attention(*x, "flash2", causal=causal, bwd_tiling=tiling)  # noqa: E731
        worst = max(worst, error_ratio(ours, q, k, v, do, causal))
    return worst


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--dims", default="128,64")
    args = ap.parse_args()
    dims = [int(x) for x in args.dims.split(",")]
    names = []
    for d in dims:
        for bf in (False, True):
            names += [build.split_name(d, 64, 8, bf)] + [build.bwd_name("flash2", d, *t, bf)
                                                         for t in build.BWD_TILINGS[d]]
    build.precompile(names)
    ops.POISON = True   # every launcher buffer starts as NaN
    checks = {}
    for d in dims:
        for name, (split, t) in variants(d).items():
            use(split, d)
            for dtype in (torch.float16, torch.bfloat16):
                for causal in (False, True):
                    key = f"d{d} {name} {str(dtype)[6:]} {'causal' if causal else 'full'}"
                    checks[key] = worst_ratio(d, dtype, causal, t)
                    print(f"check {key:<40}{checks[key]:.3f}", flush=True)
    ops.POISON = False
    rows = []
    for d in dims:
        for dtype in (torch.float16, torch.bfloat16):
            for causal in (False, True):
                for n in (2048, 4096, 8192, 16384):
                    b, h = 16384 // n, 2048 // d
                    q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=dtype) for _ in range(4))
                    for x in (q, k, v):
                        x.requires_grad_()
                    row = {"d": d, "dtype": str(dtype)[6:], "causal": causal, "N": n, "batch": b, "heads": h,
                           "sdpa_flash_ms": bwd_ms(sdpa, q, k, v, do, causal)}
                    for name, (split, t) in variants(d).items():
                        use(split, d)
                        row[f"{name}_ms"] = bwd_ms(lambda *x: attention(*x[:3], "flash2", causal=x[3], bwd_tiling=t),
                                                   q, k, v, do, causal)
                    rows.append(row)
                    print(f"d{d:<4}{row['dtype']:<9}{'causal' if causal else 'full':<7}N {n:<6}" + "  ".join(
                        f"{name} {row['sdpa_flash_ms'] / row[f'{name}_ms']:.3f}x" for name in variants(d)),
                        flush=True)
    use(False, 0)
    print("\nour backward's speed / SDPA flash's (median over the rows), and the worst check (<= 1 passes):")
    for d in dims:
        for name in variants(d):
            r = [x["sdpa_flash_ms"] / x[f"{name}_ms"] for x in rows if x["d"] == d]
            c = max(v for k, v in checks.items() if k.startswith(f"d{d} {name} "))
            print(f"  d{d:<4}{name:<18} median {statistics.median(r):.3f}x  min {min(r):.3f}x  max {max(r):.3f}x  "
                  f"check {c:.3f}")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        prov = provenance() | {
            "timing": "experiments/kernel_profile/bwd_split_layout.py: autograd backward, CUDA events, median of 20 "
                      "queued calls after 3 warm-up, ours and SDPA flash in one run"}
        (Path(args.out) / "bwd_split_layout.json").write_text(json.dumps(
            {"provenance": prov, "checks": checks, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
