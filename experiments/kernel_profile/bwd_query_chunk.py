"""Our flash2 backward at head_dim 128 with query chunks of 16, 32 (shipped) and 64 rows: correct, and how fast?

    python experiments/kernel_profile/bwd_query_chunk.py [--out DIR]   (on the GPU machine)

A warp holds its 16 keys' dK and dV (128 fp32 registers a thread at d 128) for the whole block and goes through
each query block in chunks of QC rows (the chunk's S and dP beside them: QC / 2 registers each). The chunk is
internal to the kernel: the blocks, bytes and plan are the same whatever it is. For each QC: gradients of a few
shapes against float64, judged as tests/test_gpu_backward.py judges them (max error at most twice PyTorch's own
low-precision error plus 1e-4); then the backward alone (autograd, CUDA events, median of 20 queued calls) at
the FlashAttention-2 paper's shapes (batch * N = 16k, heads * d = 2048) beside SDPA's flash backward, in one run.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from gpu_kernels import build, ops  # noqa: E402
from gpu_kernels.ops import attention  # noqa: E402
from gpu_kernels.timing import event_times  # noqa: E402

CHUNKS = (16, 32, 64)
SHAPES = [(2, 4, 1024, 1024), (1, 4, 1000, 1000), (2, 2, 257, 513), (1, 2, 513, 257), (1, 2, 77, 300)]


def eager(q, k, v, causal):
    """PyTorch's standard attention in q's dtype, bottom-right causal; grouped heads' K and V repeated."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    nq, nk = q.shape[2], k.shape[2]
    if causal:
        mask = torch.arange(nk, device=q.device)[None] <= torch.arange(nq, device=q.device)[:, None] + (nk - nq)
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s.float(), -1).nan_to_num(0.0).to(q.dtype) @ v


def grads(fn, q, k, v, do, dtype=None):
    xs = [x.detach().to(dtype or x.dtype).requires_grad_() for x in (q, k, v)]
    fn(*xs).backward(do.to(dtype or do.dtype))
    return [x.grad for x in xs]


def error_ratio(ours_fn, q, k, v, do, causal) -> float:
    """The largest (our error) / (2 x PyTorch's error + 1e-4) of dq, dk, dv against float64 (inf on a NaN): <= 1
    passes."""
    ours = grads(ours_fn, q, k, v, do)
    lowp = grads(lambda *x: eager(*x, causal), q, k, v, do)
    ref = grads(lambda *x: eager(*x, causal), q, k, v, do, torch.float64)
    worst = 0.0
    for a, p, r in zip(ours, lowp, ref):
        if torch.isnan(a).any():
            return float("inf")
        err, err_pt = (a.double() - r).abs().max().item(), (p.double() - r).abs().max().item()
        worst = max(worst, err / (2 * err_pt + 1e-4))
    return worst


def worst_ratio(dtype, causal) -> float:
    """`error_ratio`'s largest over SHAPES."""
    worst = 0.0
    for b, h, nq, nk in SHAPES:
        q, k, v, do = (torch.randn(b, h, n, 128, device="cuda", dtype=dtype) for n in (nq, nk, nk, nq))
        worst = max(worst, error_ratio(lambda *x: attention(*x, "flash2", causal=causal), q, k, v, do, causal))
    return worst


def bwd_ms(fn, q, k, v, do, causal) -> float:
    o = fn(q, k, v, causal)
    return statistics.median(event_times(lambda: o.backward(do, retain_graph=True), 20, 3, queued=True)) * 1e3


def sdpa(q, k, v, causal):
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    ops.POISON = True   # every launcher buffer starts as NaN
    rows, checks = [], {}
    for qc in CHUNKS:
        build.QUERY_CHUNK[128] = qc
        build.precompile([build.bwd_name("flash2", 128, 64, 128, 8, bf) for bf in (False, True)])
        for dtype in (torch.float16, torch.bfloat16):
            for causal in (False, True):
                checks[f"qc{qc} {str(dtype)[6:]} {'causal' if causal else 'full'}"] = worst_ratio(dtype, causal)
    ops.POISON = False
    for dtype in (torch.float16, torch.bfloat16):
        for causal in (False, True):
            for n in (2048, 4096, 8192, 16384):
                b, h = 16384 // n, 16
                q, k, v, do = (torch.randn(b, h, n, 128, device="cuda", dtype=dtype) for _ in range(4))
                for x in (q, k, v):
                    x.requires_grad_()
                row = {"dtype": str(dtype)[6:], "causal": causal, "N": n, "batch": b, "heads": h,
                       "sdpa_flash_ms": bwd_ms(sdpa, q, k, v, do, causal)}
                for qc in CHUNKS:
                    build.QUERY_CHUNK[128] = qc
                    row[f"qc{qc}_ms"] = bwd_ms(lambda *x: attention(*x[:3], "flash2", causal=x[3]), q, k, v, do,
                                               causal)
                rows.append(row)
                print(f"{row['dtype']:<9}{'causal' if causal else 'full':<7}N {n:<6}" + "  ".join(
                    f"qc{qc} {row['sdpa_flash_ms'] / row[f'qc{qc}_ms']:.3f}x" for qc in CHUNKS), flush=True)
    print("\ncorrectness, worst error / allowed (<= 1 passes):")
    for key, r in checks.items():
        print(f"  {key:<22}{r:.3f}")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip()
        git = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parent).stdout.strip()
        import cupy
        prov = {"gpu": torch.cuda.get_device_name(), "driver": smi, "torch": torch.__version__,
                "cuda": torch.version.cuda, "cupy": cupy.__version__, "commit": git or "unknown",
                "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "method": "experiments/kernel_profile/bwd_query_chunk.py: autograd backward, CUDA events, median of "
                          "20 queued calls after 3 warm-up, ours and SDPA flash in one run"}
        (Path(args.out) / "bwd_query_chunk.json").write_text(json.dumps(
            {"provenance": prov, "checks": checks, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
