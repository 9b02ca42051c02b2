"""Kernel speed on the GPU: our naive, flash1 and flash2 against PyTorch's attention, in one run.

    python benchmarks/kernels.py [--out results.json] [--quick]

For fp16 and bf16, d = 64 and 128, N = 1k ... 16k (batch * N = 16k tokens, heads * d = 2048), causal and not:
TFLOP/s (useful FLOPs, 4 B H N^2 d, halved by a causal mask) of each, from CUDA events, median of 20 runs after
warm-up, fresh random inputs, calls queued back to back (the GPU's time; ours at FA2's tiling and PyTorch's
flash backend are also timed as lone calls, the host's launch work included: `_lone_call`). Also prints ratios
measured in this run: ours/flash-backend and ours/peak; ours at FA2's tiling is run twice, query blocks
ascending (FA2's launch order) and descending (a causal head's longest blocks first).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gpu_kernels import build  # noqa: E402
from gpu_kernels.ops import attention  # noqa: E402
from gpu_kernels.timing import event_times  # noqa: E402
from iosim.plan import Tiling  # noqa: E402

BACKENDS = {"torch_flash": SDPBackend.FLASH_ATTENTION, "torch_efficient": SDPBackend.EFFICIENT_ATTENTION,
            "torch_cudnn": SDPBackend.CUDNN_ATTENTION}


def time_ms(fn, reps=20, warmup=3, queued=True) -> float:
    # queued: calls back to back, the host running ahead, so the figure is the kernels' GPU time for everyone
    # (a launcher's Python work is not the kernel's speed); queued=False gives a lone call's time, host work in
    return statistics.median(event_times(fn, reps, warmup, queued=queued)) * 1e3


def torch_naive(q, k, v, causal):
    s = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(q.shape[-1]))
    if causal:
        n = q.shape[2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def methods(d: int):
    # FlashAttention-2's tiling first, then the two fastest others of a sweep over every built tiling
    best = {64: [(128, 128, 4, 2), (128, 64, 4, 2), (64, 64, 4, 2)],
            128: [(128, 64, 4, 2), (128, 32, 4, 2), (64, 64, 4, 1)]}[d]
    out = {"ours_naive": lambda q, k, v, c: attention(q, k, v, "naive", causal=c),
           "ours_flash1": lambda q, k, v, c: attention(q, k, v, "flash1", causal=c,
                                                       tiling=Tiling(block_q=64, block_kv=64))}
    for bq, bkv, w, st in best:
        t = Tiling(block_q=bq, block_kv=bkv, warps=w, stages=st)
        out[f"ours_flash2_{bq}x{bkv}_{w}w"] = (lambda t: lambda q, k, v, c: attention(q, k, v, "flash2", causal=c,
                                                                                      tiling=t))(t)
    # FA2's tiling again with a causal head's longest query blocks launched first (Tiling.q_order)
    t = Tiling(block_q=best[0][0], block_kv=best[0][1], warps=best[0][2], stages=best[0][3], q_order="descending")
    out[f"ours_flash2_{t.block_q}x{t.block_kv}_{t.warps}w_desc"] = \
        lambda q, k, v, c: attention(q, k, v, "flash2", causal=c, tiling=t)
    out["torch_naive"] = torch_naive
    for name, be in BACKENDS.items():
        out[name] = (lambda be: lambda q, k, v, c: _sdpa(q, k, v, c, be))(be)
    return out


def _sdpa(q, k, v, causal, backend):
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def host_us() -> dict[str, float]:
    """Microseconds of host time per call on a problem too small for the GPU to be the limit."""
    import time
    q, k, v = (torch.randn(1, 1, 128, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    out = {}
    for name in ("ours_flash2_128x128_4w", "torch_flash"):
        fn = methods(64)[name]
        fn(q, k, v, False)
        reps = []
        for _ in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(200):
                fn(q, k, v, False)
            reps.append((time.perf_counter() - t0) / 200 * 1e6)
        torch.cuda.synchronize()
        out[name] = statistics.median(reps)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="fewer sizes")
    args = ap.parse_args()
    peak = 989.4  # dense fp16/bf16 TFLOP/s, datasheet
    build.precompile()
    host = host_us()
    print("host work per call (B1 H1 N128 d64, calls queued, median of 5 x 200): "
          + ", ".join(f"{k} {v:.1f} us" for k, v in host.items()), flush=True)
    rows = []
    ns = [2048, 8192] if args.quick else [1024, 2048, 4096, 8192, 16384]
    for dtype in (torch.float16, torch.bfloat16):
        for d in (64, 128):
            for causal in (False, True):
                for n in ns:
                    b, h = max(1, 16384 // n), 2048 // d
                    flops = 4 * b * h * n * n * d / (2 if causal else 1)
                    row = {"dtype": str(dtype).split(".")[-1], "d": d, "causal": causal, "N": n, "batch": b,
                           "heads": h}
                    first = next(kk for kk in methods(d) if kk.startswith("ours_flash2"))   # FA2's own tiling
                    for name, fn in methods(d).items():
                        if name == "ours_flash1" and n > 8192:
                            continue  # B*H blocks only: minutes per run at 16k, and the point is made by 8k
                        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=dtype) for _ in range(3))
                        try:
                            ms = time_ms(lambda: fn(q, k, v, causal), reps=10 if "flash1" in name else 20)
                            row[name] = flops / (ms * 1e-3) / 1e12
                            if name in (first, "torch_flash"):   # a lone call, launch host work included
                                ms = time_ms(lambda: fn(q, k, v, causal), queued=False)
                                row[name + "_lone_call"] = flops / (ms * 1e-3) / 1e12
                        except Exception as e:  # a backend that refuses a config is recorded as such
                            row[name] = f"ERR {type(e).__name__}: {str(e)[:80]}"
                        del q, k, v
                    rows.append(row)
                    fa2 = row[first]
                    desc = row[next(kk for kk in row if kk.endswith("_desc"))]
                    ours = max(v for kk, v in row.items() if kk.startswith("ours_flash2") and isinstance(v, float)
                               and not kk.endswith("_lone_call"))
                    fl = row.get("torch_flash")
                    ratio = (lambda x: x / fl if isinstance(fl, float) and isinstance(x, float) else float("nan"))
                    lone = (lambda kk: f"{row.get(kk + '_lone_call', 0) / row.get('torch_flash_lone_call', 1):.2f}")
                    print(f"{row['dtype']:>8} d{d:<4}{'causal' if causal else '      '} N{n:<6} flash2 FA2-tiling "
                          f"{fa2 if isinstance(fa2, str) else f'{fa2:6.1f}'} best {ours:6.1f} TFLOP/s  torch flash "
                          f"{fl if isinstance(fl, str) else f'{fl:6.1f}'}  ratio FA2-tiling {ratio(fa2):.2f} best "
                          f"{ratio(ours):.2f} FA2-tiling descending {ratio(desc):.2f}  best of peak "
                          f"{ours / peak:.2f}  lone calls: ratio FA2-tiling {lone(first)} ", flush=True)
    if args.out:
        from gpu_kernels.measure import provenance
        Path(args.out).write_text(json.dumps({
            "what": "TFLOP/s of iosim's kernels and PyTorch's attention, forward, one run", "command":
            " ".join(["python3", "benchmarks/kernels.py", *sys.argv[1:]]), "provenance": provenance(),
            "device": torch.cuda.get_device_name(), "torch": torch.__version__, "peak_tflops_datasheet": peak,
            "host_us_per_call": host, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
