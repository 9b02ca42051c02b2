"""Why a grid's first key tile costs more when every SM starts at once (block traces: +0.4-1.2 us for a causal
grid's first tile, +0.1-0.3 us for a non-causal one; reports/measurements/block_trace_h200_2026-12-01): is it the
SMs waiting for instructions (each SM's first pass through the loop body, the masked copy of it under a causal mask,
fetched through its GPC's cache from a cold L2)? Our flash2, fp16, 4 warps, 2 stages, one ncu pass: grids of one
block an SM on every SM against the same tiling alone, causal and not; stall reasons per issued instruction, the
GPCs' requests to L2 and the kernel time. Run under benchmarks/first_tile.sh.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# (batch, heads, N, d, causal, (block_q, block_kv)): lone heads, then about one block an SM on every SM
CONFIGS = [(1, 1, 256, 64, True, (128, 128)), (4, 16, 256, 64, True, (128, 128)),
           (1, 1, 256, 64, False, (128, 128)), (1, 66, 256, 64, False, (128, 128)),
           (1, 1, 256, 128, True, (128, 64)), (4, 16, 256, 128, True, (128, 64)),
           (1, 1, 256, 128, False, (128, 64)), (1, 66, 256, 128, False, (128, 64)),
           (1, 1, 256, 64, True, (64, 64)), (4, 16, 256, 64, True, (64, 64))]
WANTED = ["gpu__time_duration", "smsp__average_warps_issue_stalled_no_instruction_per_issue_active",
          "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active",
          "smsp__average_warps_issue_stalled_barrier_per_issue_active",
          "smsp__average_warps_issue_stalled_branch_resolving_per_issue_active",
          "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active",
          "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active",
          "smsp__average_warps_issue_stalled_wait_per_issue_active",
          "smsp__inst_executed", "smsp__cycles_active", "lts__t_sectors_srcunit_gcc", "dram__bytes_read"]


def metrics(query: str) -> str:
    """The wanted metrics that `ncu --query-metrics` lists: ratios as .ratio, counters as .sum."""
    have = {line.split()[0] for line in Path(query).read_text().splitlines() if line.strip()}
    return ",".join(f"{m}.ratio" if "per_issue" in m else f"{m}.sum" for m in WANTED if m in have)


def run() -> None:
    import torch
    from gpu_kernels.ops import attention
    from iosim.plan import Tiling
    for b, h, n, d, c, (bq, bk) in CONFIGS:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
        attention(q, k, v, "flash2", causal=c, tiling=Tiling(block_q=bq, block_kv=bk, warps=4, stages=2))
        torch.cuda.synchronize()


def table(path: str) -> None:
    from gpu_kernels.measure import ncu_kernels
    ks = ncu_kernels(Path(path).read_text())
    print("one ncu pass each (L2 emptied before each kernel); stalls in warp-cycles per issued instruction")
    for (b, h, n, d, c, (bq, bk)), k in zip(CONFIGS, ks):
        raw = {m.rsplit(".", 1)[0]: float(v) for m, (v, _) in k["raw"].items()}
        cells = [f"{m.replace('smsp__average_warps_issue_stalled_', 'stall_').replace('_per_issue_active', '')}"
                 f"={v:.4g}" for m, v in raw.items()]
        print(f"B{b} H{h} N{n} d{d}{' causal' if c else ''} {bq}x{bk}: " + " ".join(cells))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--print":
        table(sys.argv[2])
    elif len(sys.argv) > 2 and sys.argv[1] == "--metrics":
        print(metrics(sys.argv[2]))
    else:
        run()
