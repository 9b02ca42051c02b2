"""What Nsight Compute's `lts__t_bytes` counts: run under experiments/l2_counters/l2_breakdown.sh, which reads its L2 counters
split by source (the SMs' requests, `srcunit_tex`, against traffic from the other L2 partition,
`srcunit_ltcfabric`), by operation and by hit or miss, for a few kernels whose `lts__t_bytes` the engine's request
count missed by the most (0.31x to 4.4x) and one it matched.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# (algorithm, batch, heads, N, d, causal, (block_q, block_kv)); fp16, 4 warps, 2 stages
CONFIGS = [("flash2", 1, 1, 8192, 64, False, (64, 64)), ("flash2", 64, 16, 1024, 64, False, (128, 128)),
           ("flash1", 4, 16, 2048, 128, False, (64, 64)), ("flash2", 1, 1, 256, 64, False, (128, 128)),
           ("flash2", 1, 8, 1024, 64, False, (64, 64)), ("flash2", 64, 16, 256, 64, True, (128, 128))]


def table(path: str) -> None:
    """MB per metric and kernel from ncu's CSV (sectors are 32 bytes)."""
    from gpu_kernels.measure import ncu_kernels
    print("MB per kernel (sectors x 32 B), launch order as in CONFIGS")
    for k in ncu_kernels(Path(path).read_text()):
        print(k["id"], {m.replace("lts__t_", "").replace(".sum", ""): round(float(v) * (1 if "bytes" in m else 32)
                                                                           / 1e6, 2) for m, (v, _) in k["raw"].items()})


def run() -> None:
    import torch
    from gpu_kernels.ops import attention
    from iosim.plan import Tiling
    for alg, b, h, n, d, c, (bq, bk) in CONFIGS:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
        t = Tiling(block_q=bq, block_kv=bk, warps=4, stages=2, loop_order=alg)
        attention(q, k, v, alg, causal=c, tiling=t)
        torch.cuda.synchronize()
        print(alg, b, h, n, d, c, bq, bk, flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--print":
        table(sys.argv[2])
    else:
        run()
