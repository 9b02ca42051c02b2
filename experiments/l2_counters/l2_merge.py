"""Do simultaneous requests for one line merge before L2 counts them, and only while the line is missing?

Our flash2 kernel on lone grids (one block an SM, every block of a head reading the same K/V tile at about the
same time) reaches L2 with 30-80% of the K/V bytes its blocks request (`lts__t_sectors_srcunit_tex_op_read`),
where busy grids of several waves reach it with about all of them. Each configuration here runs twice back to
back; under `--cache-control all` both launches start with an empty L2, under `--cache-control none` the second
finds K, V and Q resident (the first just read them; a 256 MiB write empties L2 before the first). If the
requests merge only onto a pending miss, the warm launch's reads reach L2 whole; if they merge whenever they
meet, the warm launch shows the same shortfall.

    source .whl/prelude.sh && bash experiments/l2_counters/l2_merge.sh          # ncu passes, $OUT/l2_merge_*.csv, a table
    python3 experiments/l2_counters/l2_merge.py --print DIR                      # the table from stored CSVs
    SET=load bash experiments/l2_counters/l2_merge.sh                            # --set load: the same readers on 1-8 heads' SMs
"""
from __future__ import annotations

import sys
from pathlib import Path

# (algorithm, batch, heads, N, d, block_q, block_kv): flash2 fp16 non-causal; "torch" is PyTorch's SDPA flash
CONFIGS = [("flash2", 1, 1, 8192, 64, 64, 64), ("flash2", 1, 8, 1024, 64, 64, 64),
           ("flash2", 1, 1, 1024, 64, 64, 64), ("flash2", 1, 2, 8192, 64, 64, 64),
           ("flash2", 1, 1, 16384, 64, 64, 64), ("flash2", 1, 1, 8192, 64, 128, 128),
           ("flash2", 4, 16, 4096, 64, 64, 64), ("torch", 4, 16, 4096, 64, 128, 128)]
# --set load: one block an SM, the same readers of a tile (a head's query blocks) on 1, 2, 4, 8 heads' SMs
LOAD = [("flash2", 1, h, n, 64, 64, 64) for n in (1024, 2048, 4096) for h in (1, 2, 4, 8) if h * n // 64 <= 132] + \
       [("flash2", 1, h, 2048, 64, 128, 128) for h in (1, 2, 4, 8)] + \
       [("flash2", 1, h, 2048, 128, 128, 64) for h in (1, 8)]
SETS = {"main": CONFIGS, "load": LOAD}
LAUNCHES = 2


def requested_mb(alg: str, b: int, h: int, n: int, d: int, bq: int, bk: int) -> float:
    """K/V bytes the blocks request (each query block reads its head's K and V) plus Q, in MB."""
    tensor = b * h * n * d * 2
    return (-(-n // bq) * 2 * tensor + tensor) / 1e6


def reads(folder: str | Path, name: str = "main", mode: str = "all") -> list[tuple[float, float]]:
    """(read MB, missed MB) that L2 counted for each configuration of set `name`, in its last launch of a pass
    (`mode`: all, cold; none, warm), from the stored CSV."""
    from gpu_kernels.measure import ncu_kernels
    tag = "" if name == "main" else "_" + name
    ks = ncu_kernels((Path(folder) / f"l2_merge{tag}_{mode}.csv").read_text())
    if len(ks) != LAUNCHES * len(SETS[name]):
        raise ValueError(f"{len(ks)} kernels in the {mode} pass, {LAUNCHES * len(SETS[name])} expected")

    def mb(k, m):
        return float(k["raw"][f"lts__t_sectors_srcunit_tex_op_read{m}.sum"][0]) * 32 / 1e6
    return [(mb(k, ""), mb(k, "_lookup_miss")) for k in ks[LAUNCHES - 1::LAUNCHES]]


def table(folder: str, name: str = "main") -> None:
    print(f"{'config':34} {'requested':>9} | {'cold: read':>10} {'miss':>6} {'share':>6} | "
          f"{'warm: read':>10} {'miss':>6} {'share':>6}   (MB of K, V, Q read requests L2 counted)")
    for cfg, (c, cm), (w, wm) in zip(SETS[name], reads(folder, name, "all"), reads(folder, name, "none")):
        req = requested_mb(*cfg)
        label = "{} B{} H{} N{} d{} {}x{}".format(*cfg)
        print(f"{label:34} {req:9.1f} | {c:10.1f} {cm:6.1f} {c / req:6.2f} | {w:10.1f} {wm:6.1f} {w / req:6.2f}")


def run(name: str = "main") -> None:
    import torch
    from gpu_kernels.ops import attention
    from iosim.plan import Tiling
    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    for alg, b, h, n, d, bq, bk in SETS[name]:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
        flush.fill_(1)
        for _ in range(LAUNCHES):
            if alg == "torch":
                with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
                    torch.nn.functional.scaled_dot_product_attention(q, k, v)
            else:
                attention(q, k, v, alg, tiling=Tiling(block_q=bq, block_kv=bk, warps=4, stages=2, loop_order=alg))
        torch.cuda.synchronize()
        print(alg, b, h, n, d, bq, bk, flush=True)


if __name__ == "__main__":
    which = sys.argv[sys.argv.index("--set") + 1] if "--set" in sys.argv else "main"
    if len(sys.argv) > 2 and sys.argv[1] == "--print":
        table(sys.argv[2], which)
    else:
        run(which)
