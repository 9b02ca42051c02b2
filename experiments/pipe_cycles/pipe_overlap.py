"""Does one block hide its softmax behind its matmuls? Our flash2 builds under Nsight Compute's pipe and issue
metrics, on lone heads (a block an SM) and on a busy grid (several an SM), to set beside the engine's chain, which
runs a lone block's matmul and softmax one after the other.

    source .whl/prelude.sh && bash experiments/pipe_cycles/pipe_overlap.sh      # on the GPU machine: $OUT/pipes.csv, a table
    python3 experiments/pipe_cycles/pipe_overlap.py --print CSV                 # the table, anywhere

This script is what ncu runs: each (configuration, tiling) twice, ncu profiling every launch.
"""
from __future__ import annotations

import sys
from pathlib import Path

# (batch, heads, N, d, block_q, block_kv): lone heads (64-128 blocks on 132 SMs) and a busy grid
RUNS = [(1, 1, 8192, 64, 128, 128), (1, 1, 8192, 64, 64, 64), (1, 1, 8192, 128, 128, 64), (1, 1, 8192, 128, 64, 64),
        (4, 16, 2048, 64, 128, 128), (4, 16, 2048, 64, 64, 64), (4, 16, 2048, 128, 128, 64),
        (4, 16, 2048, 128, 64, 64)]

# metric -> column: busy share of each pipe and of the issue slots over the SMs' active cycles
METRICS = {
    "gpu__time_duration.sum": "time_us",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy_%",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "tensor_cyc_%",
    "sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active": "tensor_inst_%",
    "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active": "xu_inst_%",
    "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active": "fma_cyc_%",
    "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active": "alu_cyc_%",
    "sm__issue_active.avg.pct_of_peak_sustained_active": "issue_%",
    "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio": "stall_math",
    "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio": "stall_wait",
    "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio": "stall_short_sb",
    "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio": "stall_mio",
    "smsp__inst_executed.sum": "instructions",
}


def run() -> None:
    import torch
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from gpu_kernels.ops import attention
    from iosim.plan import Tiling

    for b, h, n, d, bq, bk in RUNS:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
        t = Tiling(block_q=bq, block_kv=bk, warps=4, stages=2)
        for _ in range(2):
            attention(q, k, v, "flash2", tiling=t)
        torch.cuda.synchronize()


PIPES = ("sm__pipe_tensor_op_hmma_cycles_active", "sm__inst_executed_pipe_xu", "sm__pipe_fma_cycles_active",
         "sm__pipe_alu_cycles_active")


def _kernels(path: str) -> list[dict]:
    """ncu's CSV -> the profiled launches, in order (two a RUNS entry)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from gpu_kernels.measure import ncu_kernels
    return ncu_kernels(Path(path).read_text())


def pipe_shares(path: str) -> dict[tuple, tuple[float, float]]:
    """RUNS entry -> (its tensor pipe's busy share, the four pipes' shares summed), of its second launch."""
    out = {}
    for run, k in zip(RUNS, _kernels(path)[1::2]):
        share = {p: float(k["raw"][f"{p}.avg.pct_of_peak_sustained_active"][0]) / 100 for p in PIPES}
        out[run] = (share[PIPES[0]], sum(share.values()))
    return out


def census(path: str, profile: str = "h200_sxm.calibrated") -> dict:
    """A `experiments/pipe_cycles/pipe_census.py` record's census from the busy fp16 grids (B4 H16 N2048: in no record set):
    each build's XU, FMA and ALU busy shares against its tensor pipe's, which runs at the profile's mma.sync rate
    while busy (the lone 128x128 block: 55.6 us busy against 56.7 at that rate), give a key tile's non-tensor time;
    in cycles of the profile's clock (the record says so, so they are never scaled). A block's own
    cycles are not measured here (0). bf16 builds take their fp16 build's figures: the same source, one conversion
    instruction (F2FP) either way."""
    from iosim.hardware import load_profile
    from iosim.kernels.builds import key
    hw = load_profile(profile)
    clock_hz, tensor_flops_per_sm = hw.clock_hz, hw.tensor_flops_per_s("fp16") / hw.sm_count
    out = {}
    for (b, h, n, d, bq, bk), k in zip(RUNS, _kernels(path)[1::2]):
        if b == 1:
            continue
        share = {p: float(k["raw"][f"{p}.avg.pct_of_peak_sustained_active"][0]) / 100 for p in PIPES}
        tensor = 4 * bq * bk * d / tensor_flops_per_sm * clock_hz   # cycles the tensor pipe is busy a key tile
        per_tile = {name: tensor * share[p] / share[PIPES[0]] for name, p in zip(("tensor", "xu", "fma", "alu"), PIPES)}
        for bf16 in (False, True):
            out[key("flash2", d, bq, bk, 4, 2, bf16)] = {
                "tiling": [bq, bk, 1], "per_tile": per_tile, "per_block": {p: 0.0 for p in per_tile},
                "clock_hz": clock_hz, "from": f"B{b} H{h} N{n} d{d} fp16 {bq}x{bk}, launch 2 of 2"}
    return out


def table(path: str) -> None:
    ks = _kernels(path)
    names = list(METRICS.values())
    print(f"{'run':<26}" + "".join(f"{c:>15}" for c in names))
    for i, k in enumerate(ks):
        b, h, n, d, bq, bk = RUNS[i // 2]
        m = {METRICS[x]: float(v) for x, (v, _) in k["raw"].items() if x in METRICS}
        label = f"B{b} H{h} N{n} d{d} {bq}x{bk}"
        print(f"{label:<26}" + "".join(f"{m.get(c, float('nan')):>15.4g}" for c in names))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--print":
        table(sys.argv[2])
    elif len(sys.argv) > 3 and sys.argv[1] == "--census":   # the pipe table's record, from a stored CSV
        import json
        from datetime import datetime, timezone
        Path(sys.argv[3]).write_text(json.dumps({
            "what": "non-tensor pipe cycles of our flash2 builds a key tile, from their busy shares beside the tensor "
                    "pipe's (experiments/pipe_cycles/pipe_overlap.py census)",
            "method": [f"python3 experiments/pipe_cycles/pipe_overlap.py --census {sys.argv[2]} {sys.argv[3]}"],
            "date": datetime.now(timezone.utc).isoformat(), "source": sys.argv[2],
            "census": census(sys.argv[2])}, indent=1))
    else:
        run()
