"""How many written bytes does L2 keep before it writes them back to HBM?

A kernel writing B bytes (PyTorch's fill_, or a multiply by 1 reading B and writing B) under Nsight Compute (`--cache-control
all`, L2 empty and clean before it): `dram__bytes_write.sum` counts what went out to HBM while the kernel ran; the
rest, B minus that, was still dirty in L2 when it ended. Where B is far above L2, that rest is the dirty bytes L2
holds (`HardwareProfile.l2_dirty_mib`). The l2 probe (experiments/l2_capacity/l2_probe_h200_2026-12-01) saw dirty
lines leave from 24-28 MiB of written data on; the naive records' Q K^T, writing 1-2 GB of S, leave 29 MB.

    source .whl/prelude.sh && bash experiments/l2_capacity/l2_dirty.sh          # one ncu pass, $OUT/l2_dirty.csv, a table
    python3 experiments/l2_capacity/l2_dirty.py --print FILE.csv                 # the table from a stored CSV
"""
from __future__ import annotations

import sys
from pathlib import Path

# (what, MiB): fill writes MiB; copy reads MiB and writes MiB
CASES = [("fill", 16), ("fill", 24), ("fill", 32), ("fill", 48), ("fill", 64), ("fill", 128), ("fill", 256),
         ("fill", 1024), ("copy", 256), ("copy", 1024)]


def table(path: str) -> None:
    from gpu_kernels.measure import ncu_kernels
    ks = ncu_kernels(Path(path).read_text())
    print(f"{'case':12} {'written MiB':>11} {'to HBM MiB':>10} {'held dirty MiB':>14} {'us':>8}")
    for (what, mib), k in zip(CASES, ks):
        w = float(k["raw"]["dram__bytes_write.sum"][0]) / 2**20
        t = float(k["raw"]["gpu__time_duration.sum"][0]) / 1e3
        print(f"{what} {mib:<7} {mib:11.0f} {w:10.1f} {mib - w:14.1f} {t:8.1f}")


def run() -> None:
    import torch
    bufs = {m: torch.empty(m * 2**20, dtype=torch.uint8, device="cuda") for m in sorted({m for _, m in CASES})}
    # no kernel before the cases: torch.empty launches none (the copies read whatever the buffers hold)
    src = {m: torch.empty(m * 2**20, dtype=torch.uint8, device="cuda") for w, m in CASES if w == "copy"}
    torch.cuda.synchronize()
    for what, mib in CASES:
        if what == "fill":
            bufs[mib].fill_(7)
        else:
            torch.mul(src[mib], 1, out=bufs[mib])   # a kernel (copy_ would be a copy engine's memcpy)
        torch.cuda.synchronize()
        print(what, mib, flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--print":
        table(sys.argv[2])
    else:
        run()
