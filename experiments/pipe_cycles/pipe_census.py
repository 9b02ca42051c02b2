"""What each attention build spends on the SM's pipes per key tile: Nsight Compute's per-pipe busy cycles and
instruction counts of our flash1 and flash2 builds and PyTorch's FlashAttention-2 kernels, on grids that are in no
record set (B1 H12, two sequence lengths), so that the per-tile figures come from neither the calibration nor the
validation records.

    source .whl/prelude.sh && bash experiments/pipe_cycles/pipe_census.sh        # on the GPU machine: $OUT/census.{csv,json}
    python3 experiments/pipe_cycles/pipe_census.py --table CSV                   # per-tile table and fit, anywhere

Each build runs at N 4096 and 8192 (non-causal): its kernel's counts C(N) = a x blocks + c x tiles, two lengths
give c, a key tile's cost on each pipe with the block's prologue and epilogue (a) taken out.

Hopper's asynchronous builds (our flash3, PyTorch's cuDNN forward) are counted apart, on an sm_90 GPU:
    PIPE_CENSUS=hopper bash experiments/pipe_cycles/pipe_census.sh
Their matmuls are wgmma's, counted on the gmma pipe; cuDNN's persistent grid is counted per 128 x 128 work tile.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

LENGTHS = (4096, 8192)
# (head_dim, dtype, algorithm, (block_q, block_kv) or None for PyTorch's choice); B1 H12 non-causal
BUILDS = [(d, dt, alg, t) for d in (64, 128) for dt in ("fp16", "bf16")
          for alg, t in (("flash1", (64, 64)), ("flash2", (128, 128) if d == 64 else (128, 64)),
                         ("flash2", (64, 64)), ("torch_flash", None))]
HEADS = 12
# PyTorch's split-KV path (64-row blocks), on one head: B1 H1 at the same lengths
SPLIT_BUILDS = [(d, dt, "torch_flash", None) for d in (64, 128) for dt in ("fp16", "bf16")]

# PIPE_CENSUS=hopper: flash3 (its one tiling) and cuDNN's forward instead, same heads and lengths
HOPPER = os.environ.get("PIPE_CENSUS") == "hopper"
HOPPER_BUILDS = [(d, dt, alg, None) for d in (64, 128) for dt in ("fp16", "bf16") for alg in ("flash3", "torch_cudnn")]
# and both causal: their tiles on the diagonal run a masked softmax, whose extra cycles a diagonal tile are what the
# non-causal build's per-tile and per-block cycles leave over (`masked_extra`); cuDNN's counted per work tile
HOPPER_CAUSAL = [(d, "fp16", f"{alg} causal", None) for d in (64, 128) for alg in ("flash3", "torch_cudnn")]
# and flash3's other d-64 geometry, (consumers, key-tile width), non-causal and causal (the persistent kernel's
# census; the earlier ones ran the launcher's one geometry)
HOPPER_OTHER = [(64, dt, alg, (2, 128)) for dt in ("fp16", "bf16") for alg in ("flash3",)] + \
    [(64, "fp16", "flash3 causal", (2, 128))]
# the pipes whose busy cycles a lone block's chain adds up (experiments/pipe_cycles/pipe_overlap.py): tensor, and XU, FMA, ALU
CYCLES = {"tensor": "smsp__pipe_tensor_op_hmma_cycles_active.sum",
          "gmma": "smsp__pipe_tensor_op_gmma_cycles_active.sum", "fma": "smsp__pipe_fma_cycles_active.sum",
          "alu": "smsp__pipe_alu_cycles_active.sum"}
XU = "smsp__inst_executed_pipe_xu.sum"
METRICS = ["gpu__time_duration.sum", "smsp__cycles_active.sum", "sm__cycles_elapsed.avg.per_second",
           *CYCLES.values(), XU, "smsp__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
           "smsp__inst_executed_pipe_xu.avg", "smsp__cycles_active.avg", "smsp__inst_executed.sum",
           "smsp__pipe_fmaheavy_cycles_active.sum", "smsp__pipe_shared_cycles_active.sum",
           *(f"smsp__inst_executed_pipe_{p}.sum" for p in
             ("tensor_op_hmma", "tensor_op_gmma", "fma", "fmaheavy", "alu", "fp16", "lsu", "uniform", "cbu", "adu"))]


CLOCK_UNITS = {"hz": 1.0, "cycle/second": 1.0, "khz": 1e3, "mhz": 1e6, "cycle/usecond": 1e6, "ghz": 1e9,
               "cycle/nsecond": 1e9}


def runs(causal: list | None = None, other: list | None = None) -> list[tuple]:
    """(batch, heads, N, d, dtype, algorithm, tiling or None; flash3's: its blocks), in launch order; `causal`: the
    Hopper census's causal runs (default `HOPPER_CAUSAL`; the earlier Hopper censuses ran none, then flash3's
    alone), `other`: flash3's other geometry's (default `HOPPER_OTHER`; none before the persistent kernel)."""
    causal = HOPPER_CAUSAL if causal is None else causal
    other = HOPPER_OTHER if other is None else other
    out = []
    for n in LENGTHS:
        if HOPPER:
            out += [(1, HEADS, n, d, dt, alg, t) for d, dt, alg, t in HOPPER_BUILDS + causal + other]
            continue
        out += [(1, HEADS, n, d, dt, alg, t) for d, dt, alg, t in BUILDS]
        out += [(1, 1, n, d, dt, alg, t) for d, dt, alg, t in SPLIT_BUILDS]
    return out


def run() -> None:
    import torch
    from gpu_kernels.measure import _runner
    from iosim.plan import Tiling
    from iosim.workload import AttentionConfig

    for b, h, n, d, dt, alg, t in runs():
        alg, causal = alg.split()[0], alg.endswith(" causal")
        cfg = AttentionConfig.make(batch=b, heads=h, seqlen_q=n, seqlen_k=n, head_dim=d, dtype=dt, causal=causal)
        if alg == "flash3":   # at its blocks: `t`, or the default geometry (not the launcher's pick for the grid)
            from iosim.plan.flash3 import tiling as flash3_tiling
            tiling = flash3_tiling(cfg, blocks=t)
        else:
            tiling = Tiling(block_q=t[0], block_kv=t[1], warps=4, stages=2, loop_order=alg) if t else None
        fn = _runner(cfg, alg, tiling)
        fn()
        torch.cuda.synchronize()


# flash3's blocks the first Hopper censuses ran (a census's JSON names its own where they differ: "geometry")
FIRST_GEOMETRY = {64: (2, 128), 128: (2, 128)}


def tiles(b, h, n, d, dt, alg, t, geometry: dict | None = None) -> tuple[int, int, str, tuple, int]:
    """(blocks, key tiles visited, build key, tiling, diagonal tiles) as the engine plans the run (non-causal, so
    every tile and none on a diagonal; a causal Hopper run: the tiles each query block sees and those of them its
    diagonal crosses, `plan.blocks.RowBlocks`'s, its key ending in ' causal'). `geometry`: flash3's (consumers,
    key-tile width) by head_dim when the census ran (default: today's, `plan.flash3.geometry`)."""
    from iosim.plan import Tiling
    from iosim.kernels.builds import fa2_build, key
    from iosim.kernels.torch_fa2 import tiling as fa2_tiling
    from iosim.workload import AttentionConfig
    cfg = AttentionConfig.make(batch=b, heads=h, seqlen_q=n, seqlen_k=n, head_dim=d, dtype=dt)
    if alg == "torch_flash":
        tl = fa2_tiling(cfg, 132)
        k = fa2_build(d, tl, dt)
    elif alg.split()[0] in ("flash3", "torch_cudnn"):
        from iosim.plan.flash3 import tiling as flash3_tiling
        tl = flash3_tiling(cfg, alg.split()[0])
        if (geometry or t) and alg.startswith("flash3"):
            c, bkv = t or geometry[d]
            tl = tl.model_copy(update={"block_q": 64 * c, "block_kv": bkv, "warps": 4 * (c + 1)})
        k = key(alg.split()[0], d, tl.block_q, tl.block_kv, tl.warps, tl.stages, dt == "bf16")
        if alg.endswith(" causal"):
            from iosim.plan.blocks import RowBlocks
            g = RowBlocks(cfg.model_copy(update={"causal": True}), tl.block_q, tl.block_kv)
            return (b * h * g.n_q, b * h * int(g.nvis.sum()), k + " causal", (tl.block_q, tl.block_kv, 1),
                    b * h * int((g.nvis - g.interior).sum()))
    else:
        tl = Tiling(block_q=t[0], block_kv=t[1], warps=4, stages=2, loop_order=alg)
        k = key(alg, d, tl.block_q, tl.block_kv, tl.warps, tl.stages, dt == "bf16")
    n_q, n_kv = -(-n // tl.block_q), -(-n // tl.block_kv)
    # flash1: a block a head; cuDNN: per work tile (its persistent grid's blocks take them in turn)
    blocks = b * h if alg == "flash1" else b * h * n_q * tl.kv_splits
    return blocks, b * h * n_q * n_kv, k, (tl.block_q, tl.block_kv, tl.kv_splits), 0


def census(path: str, geometry: dict | None = None) -> dict:
    """ncu's CSV -> {build: per-run counts and the per-tile fit}. Each run's main kernel (PyTorch's split-KV runs
    also launch a combine kernel, left out: its work is per row, not per tile)."""
    from gpu_kernels.measure import ncu_kernels
    from iosim.kernels.builds import per_tile_and_block
    ks = [k for k in ncu_kernels(Path(path).read_text()) if "combine" not in k["name"]]
    rs = runs()
    if HOPPER:   # the run list the CSV was made with: today's, or an earlier census's
        layouts = ((HOPPER_CAUSAL, HOPPER_OTHER), (HOPPER_CAUSAL, []),
                   ([c for c in HOPPER_CAUSAL if c[2].startswith("flash3")], []), ([], []))
        rs = next((r for r in (runs(*x) for x in layouts) if len(r) == len(ks)), rs)
    if len(ks) != len(rs):
        raise SystemExit(f"{len(ks)} attention kernels profiled for {len(rs)} runs")
    out: dict = {}
    for r, k in zip(rs, ks):
        blocks, n_tiles, bkey, tl, diagonal = tiles(*r, geometry=geometry)
        m = {x: float(v) for x, (v, _) in k["raw"].items()}
        clock = k["raw"].get("sm__cycles_elapsed.avg.per_second")
        if clock:   # the SMs' clock while it ran, in Hz
            m["clock_hz"] = float(clock[0]) * CLOCK_UNITS[clock[1].lower()]
        busy = {p: m[x] for p, x in CYCLES.items() if x in m}
        # XU: instructions, at the rate Nsight holds them to (its busy share over the active cycles)
        if "smsp__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active" in m and m.get(XU):
            per_inst = (m["smsp__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active"] / 100
                        * m["smsp__cycles_active.avg"] / m["smsp__inst_executed_pipe_xu.avg"])
            busy["xu"] = m[XU] * per_inst
        e = out.setdefault(bkey, {"tiling": list(tl), "runs": []})
        e["runs"].append({"batch": r[0], "heads": r[1], "seqlen": r[2], "kernel": k["name"][:120], "blocks": blocks,
                          "tiles": n_tiles, "time_s": m["gpu__time_duration.sum"] * 1e-9
                          if "gpu__time_duration.sum" in m else None, "busy_cycles": busy, "metrics": m}
                         | ({"diagonal_tiles": diagonal} if diagonal and diagonal != blocks else {}))   # else one a block
    for e in out.values():
        if len(e["runs"]) != 2:
            continue
        r1, r2 = e["runs"]
        # C = a x blocks + c x tiles at two lengths: each pipe's cycles a key tile (c) and a block (a)
        solved = {p: per_tile_and_block(r1, r2, r1["busy_cycles"][p], r2["busy_cycles"][p])
                  for p in r1["busy_cycles"] if p in r2["busy_cycles"]}
        e["per_tile"] = {p: c for p, (c, _) in solved.items()}
        e["per_block"] = {p: a for p, (_, a) in solved.items()}
        clocks = [r["metrics"]["clock_hz"] for r in (r1, r2) if "clock_hz" in r["metrics"]]
        if clocks:
            e["clock_hz"] = sum(clocks) / len(clocks)
    for bkey, e in out.items():
        base = out.get(bkey.removesuffix(" causal"))
        if bkey.endswith(" causal") and base and "per_tile" in base:
            e["masked_extra"] = masked_extra(e["runs"], base)
    return out


def masked_extra(causal_runs: list[dict], base: dict) -> dict[str, float]:
    """Each pipe's extra cycles a diagonal (masked) tile takes over an interior one, per SM sub-partition, and the
    extra non-tensor instructions issued ('issue'): what a causal run's count leaves over the non-causal build's
    blocks and tiles, over its diagonal tiles, the mean of the runs."""
    from iosim.kernels.builds import ISSUED, diagonal_extra, diagonal_tiles, non_tensor_issued
    out = {}
    if len(base["runs"]) == 2 and all(ISSUED in r["metrics"] for r in base["runs"] + causal_runs):
        out["issue"] = diagonal_extra(causal_runs, base["runs"], lambda r: non_tensor_issued(r["metrics"]))
    for p, c in base["per_tile"].items():
        a = base["per_block"][p]
        xs = [(r["busy_cycles"][p] / 4 - a * r["blocks"] - c * r["tiles"]) / diagonal_tiles(r) for r in causal_runs
              if p in r["busy_cycles"]]
        if xs:
            out[p] = sum(xs) / len(xs)
    return out


def table(path: str) -> None:
    c = census(path)
    cols = ("tensor", "xu", "fma", "alu")
    from iosim.hardware import load_profile
    hw = load_profile("h200_sxm.calibrated")
    print(f"{'build':<34}" + "".join(f"{p + '/tile':>11}" for p in cols) + f"{'non-tensor':>11}" +
          "".join(f"{p + '/block':>11}" for p in cols) + f"{'MHz':>6}{'mma eff':>8}")
    for bkey, e in c.items():
        t, b = e.get("per_tile", {}), e.get("per_block", {})
        nt = sum(t.get(p, 0.0) for p in cols[1:])
        # the tensor pipe's rate while busy against the profile's mma.sync rate (at the clock it ran at)
        bq, bk, _ = e["tiling"]
        d = int(bkey.split(" d")[1].split()[0]) if " d" in bkey else 0
        clock = e.get("clock_hz", hw.clock_hz)
        eff = (4 * bq * bk * d / (hw.tensor_flops_per_s("fp16") / hw.sm_count)) / (t["tensor"] / clock) \
            if t.get("tensor") else float("nan")
        print(f"{bkey:<34}" + "".join(f"{t.get(p, float('nan')):>11.0f}" for p in cols) + f"{nt:>11.0f}" +
              "".join(f"{b.get(p, float('nan')):>11.0f}" for p in cols) + f"{clock / 1e6:>6.0f}{eff:>8.2f}")


if __name__ == "__main__":
    from iosim.plan.flash3 import geometry as plan_geometry
    from iosim.workload import AttentionConfig
    if len(sys.argv) > 2 and sys.argv[1] == "--table":
        table(sys.argv[2])
    elif len(sys.argv) > 3 and sys.argv[1] == "--json":   # on the GPU machine: with its provenance
        from gpu_kernels.measure import save_benchmark
        save_benchmark(sys.argv[3], "non-tensor pipe cycles of each attention build a key tile and a block",
                       ["ncu --clock-control none -k regex:flash --csv --metrics <METRICS that ncu knows> "
                        "python3 experiments/pipe_cycles/pipe_census.py", "C = a x blocks + c x tiles at N 4096 and 8192"],
                       metrics=METRICS, census=census(sys.argv[2]),
                       geometry={d: plan_geometry(AttentionConfig.make(batch=1, heads=1, seqlen_q=1, head_dim=d))
                                 for d in (64, 128)} if HOPPER else None)
    else:
        run()
