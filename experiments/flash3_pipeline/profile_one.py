"""One call of flash3 or of SDPA's cuDNN forward inside an NVTX range "prof", for Nsight Compute:

    ncu --nvtx --nvtx-include "prof/" --set full -o REPORT python experiments/flash3_pipeline/profile_one.py ...
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.kernels import BACKENDS, _sdpa  # noqa: E402
from gpu_kernels.hopper import flash3_attention  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--backend", choices=["flash3", "torch_cudnn", "torch_flash"], default="flash3")
ap.add_argument("--d", type=int, default=128)
ap.add_argument("--n", type=int, default=8192)
ap.add_argument("--causal", action="store_true")
a = ap.parse_args()
b, h = 16384 // a.n, 2048 // a.d
q, k, v = (torch.randn(b, h, a.n, a.d, device="cuda", dtype=torch.float16) for _ in range(3))
fn = (lambda: flash3_attention(q, k, v, causal=a.causal)) if a.backend == "flash3" else \
    (lambda: _sdpa(q, k, v, a.causal, BACKENDS[a.backend]))
fn()
torch.cuda.synchronize()
torch.cuda.nvtx.range_push("prof")
fn()
torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
