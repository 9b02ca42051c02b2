"""Backward speed on the GPU: our flash2 (every built backward tiling), flash1 and naive against PyTorch's SDPA
flash and cuDNN backends, backward alone and the forward+backward step, in one run.

    python benchmarks/backward.py [--out results.json] [--quick]

For fp16 and bf16, d = 64 and 128, N = 1k ... 16k (batch * N = 16k tokens, heads * d = 2048: the FlashAttention-2
paper's shapes), causal and not. TFLOP/s as FlashAttention-2's benchmarks count them: the backward 2.5x the
forward's 4 B H N^2 d (10 B H N^2 d), the step 3.5x, halved by a causal mask. Each method is timed the same way,
through autograd (`o.backward(do, retain_graph=True)`; the step: forward then backward), CUDA events, median of
20 calls queued back to back after warm-up. Also measured in this run: the mma.sync.m16n8k16 rate the chip
sustains (`gpu_kernels.calibrate`'s loop), the ceiling of kernels built on it, as ours are.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gpu_kernels import build  # noqa: E402
from gpu_kernels.ops import attention  # noqa: E402
from gpu_kernels.timing import event_times  # noqa: E402
from iosim.plan import Tiling  # noqa: E402


def mma_sync_tflops(bf16: bool) -> float:
    import cupy as cp
    from gpu_kernels.calibrate import SRC
    cc = cp.cuda.Device().compute_capability
    mod = cp.RawModule(code=SRC, options=(f"-arch=sm_{cc}",), name_expressions=["mma_loop<false>", "mma_loop<true>"])
    k = mod.get_function(f"mma_loop<{'true' if bf16 else 'false'}>")
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    out = cp.zeros(1, dtype=cp.float32)
    iters = 4096
    t = statistics.median(event_times(lambda: k((sms * 8,), (128,), (np.int32(iters), out)), 15, 3))
    return sms * 8 * 4 * iters * 8 * 2 * 16 * 8 * 16 / t / 1e12


def methods(d: int, n: int):
    """name -> attention(q, k, v, causal) through autograd."""
    out = {}
    for bq, bkv, w in build.BWD_TILINGS[d]:   # the forward at its default tiling; the backward's blocks vary
        t = Tiling(block_q=bq, block_kv=bkv, warps=w)
        out[f"ours_flash2_{bq}x{bkv}_{w}w"] = (lambda t: lambda q, k, v, c: attention(q, k, v, "flash2", causal=c,
                                                                                      bwd_tiling=t))(t)
    if n <= 4096:
        out["ours_flash1"] = lambda q, k, v, c: attention(q, k, v, "flash1", causal=c)
        out["ours_naive"] = lambda q, k, v, c: attention(q, k, v, "naive", causal=c)
    for name, be in (("torch_flash", SDPBackend.FLASH_ATTENTION), ("torch_cudnn", SDPBackend.CUDNN_ATTENTION)):
        out[name] = (lambda be: lambda q, k, v, c: _sdpa(q, k, v, c, be))(be)
    return out


def _sdpa(q, k, v, causal, backend):
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def time_pair(fn, q, k, v, do, causal, reps):
    """(backward ms, forward+backward ms), each the median of `reps` queued calls."""
    o = fn(q, k, v, causal)
    bwd = statistics.median(event_times(lambda: o.backward(do, retain_graph=True), reps, 3, queued=True)) * 1e3

    def step():
        fn(q, k, v, causal).backward(do)
    step_ms = statistics.median(event_times(step, reps, 3, queued=True)) * 1e3
    return bwd, step_ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="fewer sizes")
    args = ap.parse_args()
    build.precompile(build.backward_names() + build.forward_names())
    ceiling = {dt: mma_sync_tflops(dt == "bfloat16") for dt in ("float16", "bfloat16")}
    print("mma.sync ceiling (this run): " + ", ".join(f"{k} {v:.0f} TFLOP/s" for k, v in ceiling.items()), flush=True)
    rows = []
    ns = [2048, 8192] if args.quick else [1024, 2048, 4096, 8192, 16384]
    for dtype in (torch.float16, torch.bfloat16):
        for d in (64, 128):
            for causal in (False, True):
                for n in ns:
                    b, h = max(1, 16384 // n), 2048 // d
                    fwd_flops = 4 * b * h * n * n * d / (2 if causal else 1)
                    dt = str(dtype).split(".")[-1]
                    row = {"dtype": dt, "d": d, "causal": causal, "N": n, "batch": b, "heads": h}
                    for name, fn in methods(d, n).items():
                        q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=dtype) for _ in range(4))
                        q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
                        try:
                            bwd, step = time_pair(fn, q, k, v, do, causal, 10 if name in ("ours_flash1",) else 20)
                            row[name] = {"bwd_tflops": 2.5 * fwd_flops / bwd / 1e9, "bwd_ms": bwd,
                                         "step_tflops": 3.5 * fwd_flops / step / 1e9, "step_ms": step}
                        except Exception as e:  # a backend that refuses a config is recorded as such
                            row[name] = f"ERR {type(e).__name__}: {str(e)[:100]}"
                        del q, k, v, do
                    rows.append(row)
                    ours = {kk: vv for kk, vv in row.items() if kk.startswith("ours_flash2") and isinstance(vv, dict)}
                    best = max(ours, key=lambda kk: ours[kk]["bwd_tflops"])
                    fl, cu = row.get("torch_flash"), row.get("torch_cudnn")

                    def ratio(x, y, f):
                        return f"{x[f] / y[f]:.2f}" if isinstance(x, dict) and isinstance(y, dict) else "  - "
                    dflt = ours[next(iter(ours))]
                    print(f"{dt:>8} d{d:<4}{'causal' if causal else '      '} N{n:<6} bwd TFLOP/s: default "
                          f"{dflt['bwd_tflops']:6.1f} best {ours[best]['bwd_tflops']:6.1f} ({best[12:]}) flash "
                          f"{fl['bwd_tflops'] if isinstance(fl, dict) else 0:6.1f} cudnn "
                          f"{cu['bwd_tflops'] if isinstance(cu, dict) else 0:6.1f} | ours/flash bwd: default "
                          f"{ratio(dflt, fl, 'bwd_tflops')} best {ratio(ours[best], fl, 'bwd_tflops')} step "
                          f"{ratio(dflt, fl, 'step_tflops')} | ours/cudnn bwd {ratio(dflt, cu, 'bwd_tflops')} | of "
                          f"mma.sync {dflt['bwd_tflops'] / ceiling[dt]:.2f}", flush=True)
    if args.out:
        from gpu_kernels.measure import provenance
        Path(args.out).write_text(json.dumps({
            "what": "TFLOP/s of iosim's backward kernels and PyTorch's SDPA backends, backward and fwd+bwd, one run",
            "command": " ".join(["python3", "benchmarks/backward.py", *sys.argv[1:]]), "provenance": provenance(),
            "device": torch.cuda.get_device_name(), "torch": torch.__version__, "mma_sync_tflops": ceiling,
            "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
