"""Which V-descriptor offsets does wgmma read a 128-byte-swizzled, N-major V tile with? flash3 with (leading,
stride) = (block_kv * 128, 1024), then (with --swapped) the two exchanged. Prints the relative error of each against
a float64 reference; run on a Hopper GPU:
    python experiments/flash3_layout/probe.py [--swapped]
Found on an H100 (2026-12-06): (block_kv * 128, 1024) gives 2.8e-4 at d 64 (fp16); swapped, the kernel reads out of
bounds (an illegal address, which ends the process's CUDA context: hence the flag, run alone)."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from gpu_kernels.hopper import flash3_attention  # noqa: E402
from test_gpu_kernels import inputs, reference, rel_err  # noqa: E402

for d in (64, 128):
    for causal in (False, True):
        q, k, v = inputs(1, 2, 2, 300, 300, d, torch.float16)
        ref = reference(q, k, v, causal)[0]
        for offs in ([(1024, 128 * 128)] if "--swapped" in sys.argv else [(128 * 128, 1024)]):
            for pp in (True, False):
                try:
                    o = flash3_attention(q, k, v, causal=causal, v_offsets=offs, pingpong=pp)
                    torch.cuda.synchronize()
                    err = ((o.double() - ref).norm() / ref.norm()).item()
                except Exception as e:
                    err = f"{type(e).__name__}: {str(e)[:200]}"
                print(f"d{d} causal={causal} v_offsets={offs} pingpong={pp}: rel err {err}", flush=True)
