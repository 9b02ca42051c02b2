"""PyTorch's SDPA flash kernels' launch figures under Nsight Compute: registers a thread, shared memory a block,
and which resource limits their blocks an SM, for the main kernel (128x128 d64, 128x64 d128) and the split-KV
kernel that PyTorch runs on small grids (64x256 d64, 64x128 d128): what the engine needs to hold as many of
their blocks an SM as the chip does.

    source .whl/prelude.sh && bash experiments/fa2_build/fa2_launch.sh     # on the GPU machine; $OUT/fa2_launch.csv, a table

This script is what ncu runs (each configuration twice; ncu profiles every launch); `--print CSV` prints the table.
"""
from __future__ import annotations

import sys
from pathlib import Path

# (batch, heads, N, d, causal): main kernels on busy grids, the split-KV kernel on lone heads
CONFIGS = [(4, 16, 1024, 64, False), (4, 16, 1024, 128, False), (1, 1, 4096, 64, True), (1, 1, 8192, 64, False),
           (1, 1, 8192, 128, True)]

METRICS = {
    "gpu__time_duration.sum": "time_us",
    "launch__grid_size": "grid",
    "launch__registers_per_thread": "regs",
    "launch__shared_mem_per_block_static": "smem_static",
    "launch__shared_mem_per_block_dynamic": "smem_dynamic",
    "launch__occupancy_limit_registers": "limit_regs",
    "launch__occupancy_limit_shared_mem": "limit_smem",
    "launch__occupancy_limit_warps": "limit_warps",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy_%",
}


def run() -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for b, h, n, d, causal in CONFIGS:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            for _ in range(2):
                F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.cuda.synchronize()


def table(path: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from gpu_kernels.measure import ncu_kernels
    names = list(METRICS.values())
    print(f"{'id':>3} {'kernel':<60}" + "".join(f"{c:>13}" for c in names))
    for k in ncu_kernels(Path(path).read_text()):
        m = {METRICS[x]: float(v) for x, (v, _) in k["raw"].items() if x in METRICS}
        short = k["name"].replace("void pytorch_flash::", "").split("(")[0][:60]
        print(f"{k['id']:>3} {short:<60}" + "".join(f"{m.get(c, float('nan')):>13.4g}" for c in names))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--print":
        table(sys.argv[2])
    else:
        run()
