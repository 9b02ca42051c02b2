"""Why flash2 is slower or faster than PyTorch's flash kernel: both under Nsight Compute at the same configurations,
side by side (where the warps wait, which pipes are busy, registers, local-memory traffic).

    bash experiments/kernel_profile/stall_profile.sh            # on the GPU machine; writes $OUT/stalls.csv, prints a table

This script is what ncu runs: each configuration once per kernel (after one warm-up call each, so NVRTC
compilation and cuBLAS/FA2 set-up fall outside), with `--print` it reads ncu's CSV and prints the comparison.
"""
from __future__ import annotations

import sys
from pathlib import Path

# (batch, heads, N, d, causal): where flash2 is short of PyTorch (d 128, causal) and where it is level (d 64)
CONFIGS = [(4, 16, 4096, 128, True), (8, 16, 2048, 128, False), (4, 32, 4096, 64, False), (4, 32, 4096, 64, True)]

# metric -> column name in the table (stall reasons: warp cycles per issued instruction spent waiting on each)
METRICS = {
    "gpu__time_duration.sum": "time_us",
    "launch__registers_per_thread": "regs",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy_%",
    "sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active": "tensor_pipe_%",
    "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active": "fma_pipe_%",
    "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active": "xu_pipe_%",
    "sm__issue_active.avg.pct_of_peak_sustained_active": "issue_%",
    "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio": "stall_long_sb",
    "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio": "stall_short_sb",
    "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio": "stall_barrier",
    "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio": "stall_math",
    "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio": "stall_mio",
    "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio": "stall_wait",
    "smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio": "stall_not_sel",
    "smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio": "stall_dispatch",
    "smsp__inst_executed.sum": "instructions",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum": "local_ld_B",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum": "local_st_B",
}


def run() -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from gpu_kernels.ops import attention
    from iosim.plan import Tiling

    for b, h, n, d, causal in CONFIGS:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
        t = Tiling(block_q=128, block_kv=128 if d <= 64 else 64, warps=4, stages=2)   # FA2's forward tiling
        for _ in range(2):   # the first call compiles; ncu profiles the second (-s skips the first)
            attention(q, k, v, "flash2", causal=causal, tiling=t)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            for _ in range(2):
                F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.cuda.synchronize()


def table(path: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from gpu_kernels.measure import ncu_kernels
    kern = {(k["id"], k["name"]): {METRICS[m]: float(v) for m, (v, _) in k["raw"].items() if m in METRICS}
            for k in ncu_kernels(Path(path).read_text())}
    names = list(METRICS.values())
    print("kernel (launch order: per configuration ours x2, then PyTorch flash x2; ncu profiles the second of each)")
    print(f"{'id':>3} {'kernel':<28}" + "".join(f"{c:>15}" for c in names))
    for (i, name), m in sorted(kern.items()):
        short = "ours " + name.split("<")[1][:18] if "flash2_fwd" in name else "torch " + name[:22]
        print(f"{i:>3} {short:<28}" + "".join(f"{m.get(c, float('nan')):>15.4g}" for c in names))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--print":
        table(sys.argv[2])
    else:
        run()
