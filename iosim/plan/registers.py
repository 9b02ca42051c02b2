"""Registers a thread of each built flash kernel uses on sm_90, as ptxas reports them.

The engine's occupancy follows from them: flash1's 64x64 tiles take 151 registers at d 64 and 172 at d 128,
so an SM holds three and two of its blocks, not the four that `Traits`' default of 128 registers allows. The
table is compiler output, checked against a fresh nvcc build by tests/test_kernel_sources.py; remake it with
    nvcc -std=c++17 -arch=sm_90 -cubin ALL.cu -Xptxas -v 2> report.txt; python -m iosim.plan.registers report.txt
(ALL.cu: `gpu_kernels.build.nvcc_source()`).
"""
from __future__ import annotations

import json
import re
import sys
from functools import cache
from pathlib import Path

TABLE = Path(__file__).with_name("registers_sm90.json")
_ENTRY = re.compile(r"Compiling entry function '_Z10(flash[12])_fwdILi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)"
                    r"ELb([01])E\w*' for 'sm_90'")


def key(loop_order: str, head_dim: int, block_q: int, block_kv: int, warps: int, stages: int, bf16: bool) -> str:
    return f"{loop_order} d{head_dim} {block_q}x{block_kv} {warps}w {stages}st {'bf16' if bf16 else 'fp16'}"


def parse_ptxas(report: str) -> dict[str, int]:
    """{key: registers} for every flash instance ptxas compiled for sm_90 in `report` (its -v output)."""
    out, cur = {}, None
    for line in report.splitlines():
        m = _ENTRY.search(line)
        if m:
            order, *sizes, bf = m.groups()
            cur = key(order, *map(int, sizes), bf == "1")
            continue
        r = re.search(r"Used (\d+) registers", line)
        if r and cur:
            out[cur] = int(r.group(1))
            cur = None
    return out


@cache
def _table() -> dict[str, int]:
    return json.loads(TABLE.read_text())


def registers(loop_order: str, head_dim: int, tiling, dtype: str) -> int | None:
    """ptxas's count for this kernel instance, or None where no such kernel is built."""
    return _table().get(key(loop_order, head_dim, tiling.block_q, tiling.block_kv, tiling.warps, tiling.stages,
                            dtype == "bf16"))


if __name__ == "__main__":
    TABLE.write_text(json.dumps(dict(sorted(parse_ptxas(Path(sys.argv[1]).read_text()).items())), indent=0) + "\n")
