"""Why a grid's first key tile costs more when every SM starts at once (block traces: +0.4-1.2 us for a causal
grid's first tile, +0.1-0.3 us for a non-causal one; experiments/block_placement/block_trace_h200_2026-12-01): is it the
SMs waiting for instructions (each SM's first pass through the loop body, the masked copy of it under a causal mask,
fetched through its GPC's cache from a cold L2)? Our flash2, fp16, 4 warps, 2 stages, one ncu pass: grids of one
block an SM on every SM against the same tiling alone, causal and not; stall reasons per issued instruction, the
GPCs' requests to L2 and the kernel time. Run under experiments/cold_start/first_tile.sh (SET=flash1: our flash1 the same).
`cold_code_fit` turns stored passes into the profile's `code_cache_kib` and `code_fetch_gb_s` (no GPU):
    python experiments/cold_start/first_tile.py --fit experiments/cold_start/first_tile_h200_2026-12-02
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# (batch, heads, N, d, causal, (block_q, block_kv)): lone heads, then about one block an SM on every SM
CONFIGS = [(1, 1, 256, 64, True, (128, 128)), (4, 16, 256, 64, True, (128, 128)),
           (1, 1, 256, 64, False, (128, 128)), (1, 66, 256, 64, False, (128, 128)),
           (1, 1, 256, 128, True, (128, 64)), (4, 16, 256, 128, True, (128, 64)),
           (1, 1, 256, 128, False, (128, 64)), (1, 66, 256, 128, False, (128, 64)),
           (1, 1, 256, 64, True, (64, 64)), (4, 16, 256, 64, True, (64, 64))]
# `first_tile.sh` with SET=flash1: our flash1 (64x64, one block a head), lone heads against 128 heads (one block an
# SM on 128 SMs) and 1,024 (three an SM, the first wave on every SM)
FLASH1_CONFIGS = [(1, 1, 256, 64, True, (64, 64)), (8, 16, 256, 64, True, (64, 64)),
                  (1, 1, 256, 64, False, (64, 64)), (8, 16, 256, 64, False, (64, 64)),
                  (1, 1, 256, 128, True, (64, 64)), (8, 16, 256, 128, True, (64, 64)),
                  (1, 1, 256, 64, True, (64, 64)), (64, 16, 256, 64, True, (64, 64))]
SETS = {"flash2": CONFIGS, "flash1": FLASH1_CONFIGS}
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


def run(which: str = "flash2") -> None:
    import torch
    from gpu_kernels.ops import attention
    from iosim.plan import Tiling
    for b, h, n, d, c, (bq, bk) in SETS[which]:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
        attention(q, k, v, which, causal=c, tiling=Tiling(block_q=bq, block_kv=bk, warps=4, stages=2))
        torch.cuda.synchronize()


def table(path: str, which: str = "flash2") -> None:
    from gpu_kernels.measure import ncu_kernels
    ks = ncu_kernels(Path(path).read_text())
    print(f"{which}: one ncu pass each (L2 emptied before each kernel); stalls in warp-cycles per issued instruction")
    for (b, h, n, d, c, (bq, bk)), k in zip(SETS[which], ks):
        raw = {m.rsplit(".", 1)[0]: float(v) for m, (v, _) in k["raw"].items()}
        cells = [f"{m.replace('smsp__average_warps_issue_stalled_', 'stall_').replace('_per_issue_active', '')}"
                 f"={v:.4g}" for m, v in raw.items()]
        print(f"B{b} H{h} N{n} d{d}{' causal' if c else ''} {bq}x{bk}: " + " ".join(cells))


# the SM clock during such kernels: 1,760-1,830 MHz by clock64 over the global timer (block traces,
# experiments/block_placement/block_trace_h200_2026-12-01)
CLOCK_GHZ = 1.8


def cold_code_us(path: str, which: str = "flash2") -> list[tuple]:
    """Per causal pair of a stored pass, (kernel, head dim, block_q, block_kv, blocks of the wide grid, wait): the
    time a warp of the grid starting on (about) every SM waits for instructions beyond what it waits alone, the
    rise in no-instruction stalls (warp-cycles an issued instruction) times the instructions a warp issues, at the
    SM's clock (us)."""
    from gpu_kernels.measure import ncu_kernels
    stall = "smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio"
    configs, out = SETS[which], []
    for i, (lone, wide) in enumerate(zip(*[iter(ncu_kernels(Path(path).read_text()))] * 2)):
        (_, _, n, d, causal, (bq, bk)), (b, h, *_) = configs[2 * i], configs[2 * i + 1]
        q_blocks = -(-n // bq) if which == "flash2" else 1   # flash1: one block a head
        per_warp = [float(k["raw"][stall][0]) * float(k["raw"]["smsp__inst_executed.sum"][0]) / (heads * q_blocks * 4)
                    for k, heads in ((lone, 1), (wide, b * h))]
        if causal:
            out.append((which, d, bq, bk, b * h * q_blocks, (per_warp[1] - per_warp[0]) / (CLOCK_GHZ * 1e3)))
    return out


def stored_waits(folder: Path) -> list[tuple]:
    """`cold_code_us` of the stored passes: flash2's two and flash1's one."""
    return cold_code_us(folder / "first_tile.csv") + cold_code_us(folder / "first_tile_repeat.csv") + \
        cold_code_us(folder / "first_tile_flash1.csv", "flash1")


def cold_code_fit(rows: list[tuple], sms: int = 132, gpcs: int = 8) -> tuple[int, float]:
    """(code an SM holds, bytes; a GPC cache's rate, GB/s) from `cold_code_us` rows: the largest kernel that
    waited no longer than alone bounds the first; the rate is the least squares of wait = (code bytes - that)
    x the wide grid's SMs a GPC / rate over the kernels with more code (compiled code sizes)."""
    from iosim.plan import Tiling
    from iosim.kernels.builds import code_bytes
    code = {r: code_bytes(r[0], r[1], Tiling(block_q=r[2], block_kv=r[3], warps=4, stages=2), "fp16") for r in rows}
    held = max(code[r] for r in rows if r[5] <= 0)
    xs, ys = [], []
    for r in rows:
        if code[r] > held:
            xs.append((code[r] - held) * min(r[4], sms) / gpcs)
            ys.append(r[5] * 1e-6)
    return held, sum(x * x for x in xs) / sum(x * y for x, y in zip(xs, ys)) / 1e9


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--print":
        table(sys.argv[2], *sys.argv[3:4])
    elif len(sys.argv) > 2 and sys.argv[1] == "--fit":
        rows = stored_waits(Path(sys.argv[2]))
        for r in rows:
            print(f"{r[0]} d{r[1]} {r[2]}x{r[3]} causal, {r[4]} blocks: waits {r[5]:+.2f} us a warp beyond a lone head")
        held, rate = cold_code_fit(rows)
        print(f"code_cache_kib = {held / 1024:g}   code_fetch_gb_s = {rate:.2f}")
    elif len(sys.argv) > 2 and sys.argv[1] == "--metrics":
        print(metrics(sys.argv[2]))
    else:
        run(*sys.argv[1:2])
