"""What Nsight Compute's `lts__t_bytes` counts: run under benchmarks/l2_breakdown.sh, which reads its L2 counters
split by source (the SMs' requests, `srcunit_tex`, against traffic from the other L2 partition,
`srcunit_ltcfabric`), by operation and by hit or miss, for a few kernels whose `lts__t_bytes` the engine's request
count missed by the most (0.31x to 4.4x) and one it matched.
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gpu_kernels.ops import attention  # noqa: E402
from iosim.plan import Tiling  # noqa: E402

# (algorithm, batch, heads, N, d, causal, (block_q, block_kv)); fp16, 4 warps, 2 stages
CONFIGS = [("flash2", 1, 1, 8192, 64, False, (64, 64)), ("flash2", 64, 16, 1024, 64, False, (128, 128)),
           ("flash1", 4, 16, 2048, 128, False, (64, 64)), ("flash2", 1, 1, 256, 64, False, (128, 128)),
           ("flash2", 1, 8, 1024, 64, False, (64, 64)), ("flash2", 64, 16, 256, 64, True, (128, 128))]

if __name__ == "__main__":
    for alg, b, h, n, d, c, (bq, bk) in CONFIGS:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
        t = Tiling(block_q=bq, block_kv=bk, warps=4, stages=2, loop_order=alg)
        attention(q, k, v, alg, causal=c, tiling=t)
        torch.cuda.synchronize()
        print(alg, b, h, n, d, c, bq, bk, flush=True)
