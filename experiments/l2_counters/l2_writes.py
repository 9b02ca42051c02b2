"""What L2's counters see of a kernel's writes and where its other requests come from: run under
experiments/l2_counters/l2_writes.sh (SET=flash2, the default; flash1; sources; torch: the lists below say what each asks).

The engine under-counted `lts__t_bytes` of busy grids of 128-row query blocks by 8-18% (B64 H16 N256 causal:
-18% at d 128, 128x64) and not those of 64-row blocks (-1%). Two candidates: O's stores (each warp instruction
writes 16 bytes of 8 rows, half a sector each: does L2 count whole sectors?) and register spills (ptxas spills
16-104 bytes a thread in the 128-row kernels, none in the 64-row ones: does local memory reach L2?). Each
configuration runs once under ncu with the SMs' L2 reads and writes apart, the L1's global-store and local
traffic, and the requests behind them; the metrics the chip lacks are left out (`ncu --query-metrics`).
"""
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# (batch, heads, N, d, causal, (block_q, block_kv)); fp16, 4 warps, 2 stages; flash2, and with SET=flash1 flash1
# (which also writes its fp32 O, m and l back at each key tile, in whole sectors, and stores O as flash2 does)
CONFIGS = [(64, 16, 256, 128, True, (128, 64)), (64, 16, 256, 128, True, (64, 64)),
           (64, 16, 256, 64, True, (128, 128)), (64, 16, 256, 64, True, (64, 64)),
           (32, 16, 512, 128, False, (128, 64)), (32, 16, 512, 128, False, (64, 64)),
           (4, 16, 512, 64, True, (64, 64)), (1, 1, 8192, 64, False, (64, 64)),
           (1, 1, 8192, 64, False, (128, 128))]
FLASH1 = [(4, 16, 256, 64, True, (64, 64)), (64, 16, 256, 64, True, (64, 64)), (1, 8, 256, 64, False, (64, 64)),
          (8, 16, 1024, 64, False, (64, 64)), (4, 16, 512, 64, True, (64, 64)), (1, 1, 8192, 64, False, (64, 64))]
# SET=sources: where lts__t_bytes beyond the SMs' requests and the crossings comes from on the smallest grids
# (about 0.55 MB a kernel in experiments/l2_counters/l2_breakdown_h200_2026-11-30): instruction and constant fetches
# (srcunit_gcc)?
SOURCES = [(1, 1, 256, 64, False, (128, 128)), (1, 1, 256, 64, False, (64, 64)), (1, 8, 256, 64, False, (64, 64)),
           (1, 1, 8192, 64, False, (64, 64)), (1, 8, 1024, 64, False, (64, 64)), (64, 16, 1024, 64, False, (128, 128))]
# SET=torch: PyTorch's SDPA flash kernel, whose causal grids L2 counts at 1.2-1.4 x the engine's requests: reads
# or writes?
TORCH = [(64, 16, 1024, 128, True, (128, 64)), (64, 16, 1024, 128, False, (128, 64)),
         (64, 16, 1024, 64, True, (128, 128)), (64, 16, 1024, 64, False, (128, 128)),
         (4, 16, 2048, 128, True, (128, 64))]
# SET=torch_waves: do its spills reach L2 in a grid's first wave? One-wave grids (one or two blocks an SM) and
# grids of two to four waves, both kernels (the causal one is another build)
TORCH_WAVES = [(1, 2, 8192, 128, False, (128, 64)), (1, 8, 2048, 128, False, (128, 64)),
               (1, 1, 16384, 64, False, (128, 128)), (1, 33, 1024, 128, False, (128, 64)),
               (1, 8, 8192, 64, False, (128, 128)), (1, 16, 4096, 128, False, (128, 64)),
               (1, 4, 16384, 64, False, (128, 128)), (1, 8, 4096, 128, True, (128, 64)),
               (4, 16, 512, 64, True, (128, 128)), (1, 33, 2048, 128, True, (128, 64))]
SETS = {"flash2": ("flash2", CONFIGS), "flash1": ("flash1", FLASH1), "sources": ("flash2", SOURCES),
        "torch": ("torch", TORCH), "torch_waves": ("torch", TORCH_WAVES)}
WANTED = ["lts__t_bytes", "lts__t_sectors_srcunit_tex_op_read", "lts__t_sectors_srcunit_tex_op_write",
          "lts__t_requests_srcunit_tex_op_write", "lts__t_sectors_srcunit_ltcfabric", "dram__bytes_read",
          "dram__bytes_write", "lts__t_sectors_srcunit_gcc", "lts__t_sectors_srcunit_l1",
          "l1tex__t_sectors_pipe_lsu_mem_global_op_st", "l1tex__t_requests_pipe_lsu_mem_global_op_st",
          "l1tex__t_bytes_pipe_lsu_mem_local_op_ld", "l1tex__t_bytes_pipe_lsu_mem_local_op_st",
          "l1tex__t_sectors_pipe_lsu_mem_local_op_ld_lookup_miss", "l1tex__m_l1tex2xbar_write_bytes",
          "l1tex__m_xbar2l1tex_read_bytes", "smsp__inst_executed_op_local_ld", "smsp__inst_executed_op_local_st"]


def metrics(query: str) -> str:
    """The wanted metrics that `ncu --query-metrics` lists, as .sum."""
    have = {line.split()[0] for line in Path(query).read_text().splitlines() if line.strip()}
    return ",".join(f"{m}.sum" for m in WANTED if m in have)


def shares(path: str, name: str = "flash2") -> list[tuple[tuple, float, float, bool]]:
    """Per configuration: (config, L1's global-store sectors over the bytes written plus one more request a sector
    of O, the share of O's second requests L2 counted, whether registers spilled to local memory). The bytes
    written (O, L, and flash1's fp32 O, m, l) are the engine's count, whole sectors but O."""
    from gpu_kernels.measure import ncu_kernels
    from iosim.engine import simulate
    from iosim.hardware import load_profile
    from iosim.plan import Tiling
    from iosim.workload import AttentionConfig
    hw = load_profile("h200_sxm")
    out = []
    alg, configs = SETS[name]
    for cfg, k in zip(configs, ncu_kernels(Path(path).read_text())):
        b, h, n, d, c, (bq, bk) = cfg
        raw = {m.replace(".sum", ""): float(v) for m, (v, _) in k["raw"].items()}
        att = AttentionConfig(batch=b, heads=h, seqlen_q=n, head_dim=d, causal=c)
        written = simulate(att, alg, hw, Tiling(block_q=bq, block_kv=bk), cold_l2=True).kernels[0].l2_write_bytes
        o = b * h * n * d * 2                               # fp16 O, two 16-byte requests a sector
        l1 = raw["l1tex__t_sectors_pipe_lsu_mem_global_op_st"] * 32 / (written + o)
        l2 = (raw["lts__t_sectors_srcunit_tex_op_write"] * 32 - written) / o
        out.append((cfg, l1, l2, raw.get("l1tex__t_bytes_pipe_lsu_mem_local_op_st", 0) > 0))
    return out


def table(path: str, name: str = "flash2") -> None:
    from gpu_kernels.measure import ncu_kernels
    print("MB per kernel (sectors x 32 B; requests and instructions as counts), launch order as in CONFIGS")
    for (b, h, n, d, c, (bq, bk)), k in zip(SETS[name][1], ncu_kernels(Path(path).read_text())):
        cells = []
        for m, (v, _) in k["raw"].items():
            metric = m.replace(".sum", "")
            v = float(v)
            if "sectors" in metric:
                v = v * 32 / 1e6
            elif "bytes" in metric:
                v = v / 1e6
            cells.append(f"{metric.split('__', 1)[1]}={v:.4g}")
        print(f"B{b} H{h} N{n} d{d}{' causal' if c else ''} {bq}x{bk}: " + " ".join(cells))
    if SETS[name][0] == "torch":
        return torch_table(path, SETS[name][1])
    print("\nO's stores: L1 sectors / (bytes written + O), and the share of O's second requests L2 counted")
    rows = shares(path, name)
    for (b, h, n, d, c, (bq, bk)), l1, l2, spill in rows:
        print(f"B{b} H{h} N{n} d{d}{' causal' if c else ''} {bq}x{bk}: L1 {l1:.4f}  L2 second requests {l2:.3f}"
              + ("  (registers spill: evicted local lines may reach L2 as well)" if spill else ""))
    clean = sorted(s for *_, s, spill in rows if not spill)
    print(f"median without spills: {statistics.median(clean):.2f}")


def torch_table(path: str, configs: list = TORCH) -> None:
    """PyTorch's kernel: the SMs' L2 reads and writes against the requests of its tiling as the engine plans them
    (flash2's plan, FlashAttention-2's tiles; bytes, no merging)."""
    from gpu_kernels.measure import ncu_kernels
    from iosim.engine import simulate
    from iosim.hardware import load_profile
    from iosim.kernels.torch_fa2 import tiling as fa2_tiling
    from iosim.workload import AttentionConfig
    hw = load_profile("h200_sxm")
    print("\nmeasured / planned: the SMs' L2 reads, writes; and the partition crossings over misses + writes")
    for (b, h, n, d, c, _), k in zip(configs, ncu_kernels(Path(path).read_text())):
        raw = {m.replace(".sum", ""): float(v) for m, (v, _) in k["raw"].items()}
        att = AttentionConfig(batch=b, heads=h, seqlen_q=n, head_dim=d, causal=c)
        plan = simulate(att, "flash2", hw, fa2_tiling(att, 132), cold_l2=True).kernels[0]
        rd, wr = (raw[f"lts__t_sectors_srcunit_tex_op_{op}"] * 32 for op in ("read", "write"))
        fab = raw["lts__t_sectors_srcunit_ltcfabric"] * 32
        local, extra = local_stores(k)
        print(f"B{b} H{h} N{n} d{d}{' causal' if c else ''}: reads {rd / plan.l2_read_bytes:.3f} "
              f"writes {wr / plan.l2_write_bytes:.3f}  crossings / (DRAM reads + writes) "
              f"{fab / (raw['dram__bytes_read'] + wr):.3f}  blocks {plan.blocks} ({plan.blocks_per_sm} an SM)  "
              f"local stores {local / 1e6:.1f} MB, of them to L2 {extra / max(local, 1):.3f}")


def local_stores(kernel: dict) -> tuple[float, float]:
    """(bytes of local-memory (spill) stores, bytes L1 sent L2 beyond its global stores) of one kernel of ncu's
    CSV (`gpu_kernels.measure.ncu_kernels`): equal where every spill is written through to L2."""
    raw = {m.replace(".sum", ""): float(v) for m, (v, _) in kernel["raw"].items()}
    return (raw["l1tex__t_bytes_pipe_lsu_mem_local_op_st"],
            raw["l1tex__m_l1tex2xbar_write_bytes"] - raw["l1tex__t_sectors_pipe_lsu_mem_global_op_st"] * 32)


def torch_spills(path: str, configs: list = TORCH) -> list[tuple[tuple, int, int, float]]:
    """PyTorch's kernel, per configuration: (config, interior key tiles and diagonal ones its blocks visit, as the
    engine plans them; the bytes of local-memory stores L1 counted, which it writes through to L2)."""
    import numpy as np
    from gpu_kernels.measure import ncu_kernels
    from iosim.plan import Traits
    from iosim.plan.flash import Flash2Kernel
    from iosim.kernels.torch_fa2 import tiling as fa2_tiling
    from iosim.workload import AttentionConfig
    out = []
    for cfg, k in zip(configs, ncu_kernels(Path(path).read_text())):
        b, h, n, d, c, _ = cfg
        att = AttentionConfig(batch=b, heads=h, seqlen_q=n, head_dim=d, causal=c)
        plan = Flash2Kernel(att, fa2_tiling(att, 132), Traits())
        _, qi, sp = plan.block_ids(np.arange(plan.n_blocks))
        spans = [plan.tile_range(int(q), int(s)) for q, s in zip(qi, sp)]   # (first tile, tiles) of each block
        tiles = sum(n for _, n in spans)
        diag = int(sum(plan.g.diagonal_tiles(int(plan.g.interior[q]), f, f + n) for q, (f, n) in zip(qi, spans)))
        out.append((cfg, tiles - diag, diag, float(k["raw"]["l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum"][0])))
    return out


def fa2_spills(path: str) -> dict[tuple[int, bool], tuple[int, int]]:
    """Spill bytes a block stores per interior and per diagonal key tile, per (head_dim, causal) kernel: a
    non-causal kernel's per tile; a causal one's from two grids whose shares of diagonal tiles differ (solved
    exactly), or with one grid its mean over the tiles for both."""
    import numpy as np
    rows: dict = {}
    for (b, h, n, d, c, _), interior, diag, local in torch_spills(path):
        rows.setdefault((d, c), []).append((interior, diag, local))
    out = {}
    for key, r in rows.items():
        if len(r) >= 2 and any(x[1] for x in r):
            per, diag = np.linalg.lstsq(np.array([x[:2] for x in r], float), np.array([x[2] for x in r]),
                                        rcond=None)[0]
            out[key] = (round(per), round(diag))
        else:
            mean = sum(x[2] for x in r) / sum(x[0] + x[1] for x in r)
            out[key] = (round(mean), round(mean))
    return out


def run(name: str) -> None:
    import torch
    from gpu_kernels.ops import attention
    from iosim.plan import Tiling
    alg, configs = SETS[name]
    for b, h, n, d, c, (bq, bk) in configs:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
        if alg == "torch":
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
                torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=c)
            torch.cuda.synchronize()
            continue
        attention(q, k, v, alg, causal=c, tiling=Tiling(block_q=bq, block_kv=bk, warps=4, stages=2, loop_order=alg))
        torch.cuda.synchronize()


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--print":
        table(sys.argv[2], *sys.argv[3:4])
    elif len(sys.argv) > 2 and sys.argv[1] == "--alg":
        print(SETS[sys.argv[2]][0])
    elif len(sys.argv) > 2 and sys.argv[1] == "--metrics":
        print(metrics(sys.argv[2]))
    else:
        run(sys.argv[1] if len(sys.argv) > 1 else "flash2")
