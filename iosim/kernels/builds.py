"""What nvcc builds of each of our kernels for sm_90: registers a thread (ptxas) and bytes of machine code.

The engine's occupancy follows from the registers: flash1's 64x64 tiles take 151 registers at d 64 and 172 at
d 128, so an SM holds three and two of its blocks, not the four that `Traits`' default of 128 registers allows.
The code bytes (the kernel's .text section in the cubin) are what a kernel fetches through a cold L2 from HBM
as it starts: on the H200, our grids whose data L2 holds whole read 1.01-1.2x their code size beyond their data
(a few up to 1.8x; reports/measurements/h200: 24 KB for flash2 64x64 d64, 59 KB for 128x128). The table is
compiler output, checked against a fresh nvcc build by tests/test_kernel_sources.py; remake it with
    nvcc -std=c++17 -arch=sm_90 -cubin ALL.cu -o ALL.cubin -Xptxas -v 2> report.txt
    python -m iosim.kernels.builds report.txt ALL.cubin
(ALL.cu: `gpu_kernels.build.nvcc_source()`).
"""
from __future__ import annotations

import json
import re
import struct
import sys
from functools import cache
from pathlib import Path

TABLE = Path(__file__).with_name("builds_sm90.json")
# PyTorch's flash kernels (not built here): their code bytes as torch's CUDA library carries them for sm_90, read by
# experiments/fa2_build/fa2_code.py (experiments/fa2_build/fa2_code_h200_2026-12-02); remake with
#     python -m iosim.kernels.builds --fa2 experiments/fa2_build/fa2_code_h200_2026-12-02/fa2_code.json
FA2_TABLE = Path(__file__).with_name("torch_fa2_code_sm90.json")
# The builds' non-tensor pipe cycles a key tile and a block (each sub-partition's: its busiest pipe's or its
# instructions issued, whichever is more), from Nsight Compute on grids in no record set: measured, not compiler
# output. Shipped for flash2's builds, whose traits were refitted with them (calibration mean 3.96 -> 3.55%);
# flash1's and PyTorch's builds are left out: refitted with theirs, they scored worse on the calibration records
# (flash1 5.43 -> 6.5%, and 4.44 -> 5.20% after the twentieth session's engine changes; PyTorch's 3.241 -> 3.248%;
# experiments/fits/fit_pipe_census_2026-12-02, fit_flash1_refill_2026-12-02). Make it with
#     python -m iosim.kernels.builds --pipes experiments/pipe_cycles/pipe_census_h200_2026-12-02/census.json flash2
# Hopper's asynchronous builds (flash3, cuDNN's forward) were counted on an H100 (the same sm_90 code), both causal too:
#     python -m iosim.kernels.builds --pipes experiments/pipe_cycles/pipe_census_h100_hopper_cudnn_causal_2026-12-07/census.json torch_cudnn
#     python -m iosim.kernels.builds --pipes experiments/pipe_cycles/pipe_census_h100_hopper_persistent_2026-12-07/census.json flash3
PIPES_TABLE = Path(__file__).with_name("pipes_sm90.json")
NON_TENSOR = ("xu", "fma", "alu")
# Register spills our backward main kernels' d 128 builds (64-row query chunks; ptxas: 40-60 bytes a thread) store
# a (query block, key tile) visit, by (loop order, head_dim, causal): causal grids run another build. L1 writes
# them through to L2. Bytes: the L2 bytes these builds added over the 32-row builds, which did not spill, on the
# same calibration records of the H200 (medians; experiments/l2_counters/bwd_spill_delta_h200_2026-12-06; flash1's
# calibration records are all causal, so its figure serves both builds). The d 64 builds do not spill
BWD_SPILLS = {("flash2", 128, False): 7684, ("flash2", 128, True): 9962, ("flash1", 128, False): 5467,
              ("flash1", 128, True): 5467}
ISSUED, TENSOR_ISSUED = "smsp__inst_executed.sum", "smsp__inst_executed_pipe_tensor_op_hmma.sum"
ACTIVE = "smsp__cycles_active.sum"
# Hopper's wgmma: Nsight Compute 2025.3 counts it on the hmma pipe too (equal counts on the H100), so the larger of
# the two is the tensor instructions
WGMMA_ISSUED = "smsp__inst_executed_pipe_tensor_op_gmma.sum"


def non_tensor_issued(metrics: dict) -> float:
    """A census run's instructions issued other than the tensor pipe's (mma.sync's or wgmma's)."""
    return metrics[ISSUED] - max(metrics[TENSOR_ISSUED], metrics.get(WGMMA_ISSUED, 0.0))
_FA2 = re.compile(r"pytorch_flash::(\w+)<Flash_fwd_kernel_traits<((?:\d+, ){6})cutlass::(\w+), "
                  r"Flash_kernel_traits<[^>]*>>, ([\d, ]*)>\(")
_FLASH = r"_Z10(flash[12])_fwdILi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELb([01])E\w*"
_SOFTMAX = r"_Z12softmax_rowsILi\d+ELb([01])E\w*"
_BWD = r"_Z10(flash[12])_bwdILi(\d+)ELi(\d+)ELi\d+ELi(\d+)ELb([01])E\w*"   # d, block_q, query chunk, warps
_SPLIT = r"_Z16flash2_bwd_splitILi(\d+)ELi(\d+)ELi(\d+)ELb([01])E\w*"   # d, block_q, warps: FA2's warp layout
_ROWS = r"_Z\d+(bwd_dot|bwd_convert|softmax_bwd_rows)I(?:Li(\d+)E)?(?:Li\d+E)?Lb([01])E\w*"
_ENTRY = re.compile(rf"Compiling entry function '({_FLASH}|{_SOFTMAX}|{_BWD}|{_SPLIT}|{_ROWS})' for 'sm_90'")


def key(loop_order: str, head_dim: int, block_q: int, block_kv: int, warps: int, stages: int, bf16: bool) -> str:
    return f"{loop_order} d{head_dim} {block_q}x{block_kv} {warps}w {stages}st {'bf16' if bf16 else 'fp16'}"


def softmax_key(bf16: bool) -> str:
    return f"softmax {'bf16' if bf16 else 'fp16'}"


def bwd_key(loop_order: str, head_dim: int, block_q: int, warps: int, bf16: bool, split: bool = False) -> str:
    """A backward main kernel's key (block_kv is 16 a warp); `split`: flash2's FlashAttention-2 warp layout."""
    kind = f"{loop_order}_bwd{'_split' if split else ''}"
    return f"{kind} d{head_dim} {block_q}x{16 * warps} {warps}w {'bf16' if bf16 else 'fp16'}"


def row_key(kind: str, head_dim: int, bf16: bool) -> str:
    """A backward row kernel's key (bwd_dot is built per head_dim, the others once a dtype)."""
    return f"{kind}{f' d{head_dim}' if kind == 'bwd_dot' else ''} {'bf16' if bf16 else 'fp16'}"


def _key_of(symbol: str) -> str | None:
    m = re.fullmatch(_FLASH, symbol)
    if m:
        order, *sizes, bf = m.groups()
        return key(order, *map(int, sizes), bf == "1")
    m = re.fullmatch(_BWD, symbol)
    if m:
        order, d, bq, w, bf = m.groups()
        return bwd_key(order, int(d), int(bq), int(w), bf == "1")
    m = re.fullmatch(_SPLIT, symbol)
    if m:
        d, bq, w, bf = m.groups()
        return bwd_key("flash2", int(d), int(bq), int(w), bf == "1", split=True)
    m = re.fullmatch(_ROWS, symbol)
    if m:
        kind, d, bf = m.groups()
        return row_key(kind, int(d) if d else 0, bf == "1")
    m = re.fullmatch(_SOFTMAX, symbol)
    return softmax_key(m.group(1) == "1") if m else None


def ncu_spelling(demangled: str) -> str:
    """A demangled kernel name as Nsight Compute spells it: bool template arguments as 0 and 1, '>>' unspaced."""
    n = re.sub(r"\b(false|true)\b", lambda m: "1" if m.group(1) == "true" else "0", demangled)
    return re.sub(r">\s+(?=>)", ">", n)


def fa2_key(name: str) -> str | None:
    """A PyTorch flash kernel's name, as Nsight Compute prints it or a demangler does, -> its key in the table:
    kernel, Flash_fwd_kernel_traits' numbers, element type, the kernel's flags; None for any other kernel."""
    m = _FA2.search(ncu_spelling(re.sub(r"\((?:int|bool)\)", "", name)))
    return f"{m.group(1)} <{m.group(2)[:-2]}> {m.group(3)} <{m.group(4)}>" if m else None


@cache
def _fa2_table() -> dict[str, int]:
    return json.loads(FA2_TABLE.read_text())


def fa2_code_bytes(kernel_name: str) -> int | None:
    """The machine code of the PyTorch flash kernel so named (as Nsight Compute prints it), or None if unknown."""
    k = fa2_key(kernel_name)
    return _fa2_table().get(k) if k else None


def fa2_table(measured: dict) -> dict[str, int]:
    """{key: code bytes} from experiments/fa2_build/fa2_code.py's JSON (the demangled names it stored)."""
    out = {}
    for k in measured["kernels"]:
        key = fa2_key(k.get("name", ""))
        if key:
            out[key] = k["bytes"]
    return dict(sorted(out.items()))


def fa2_build(head_dim: int, tiling, dtype: str) -> str:
    """PyTorch's flash kernel for a head size and its tiling (`validate.fa2_tiling`), as the pipe table names it."""
    split = "split " if tiling.kv_splits > 1 else ""
    return f"fa2 d{head_dim} {tiling.block_q}x{tiling.block_kv} {tiling.warps}w {split}{dtype}"


def per_tile_and_block(r1: dict, r2: dict, c1: float, c2: float) -> tuple[float, float]:
    """A count C taken at two runs of one build (c1, c2) solved as C = a x blocks + c x tiles: (c, a), each /4, what
    a 4-warp block holds each SM sub-partition busy (one warp on each)."""
    det = r1["blocks"] * r2["tiles"] - r2["blocks"] * r1["tiles"]
    return (r1["blocks"] * c2 - r2["blocks"] * c1) / det / 4, (r2["tiles"] * c1 - r1["tiles"] * c2) / det / 4


def diagonal_tiles(run: dict) -> int:
    """A causal census run's tiles crossing a diagonal; a census of square blocks stored none: one a block."""
    return run.get("diagonal_tiles") or run["blocks"]


def diagonal_extra(causal_runs: list[dict], base_runs: list[dict], count) -> float:
    """What a diagonal (masked) tile adds to `count` (a run -> its sum over the SM sub-partitions), per sub-partition:
    a causal run's count less what the non-causal build's two runs solve for its blocks and tiles, over its diagonal
    tiles, the mean of the causal runs."""
    c, a = per_tile_and_block(*base_runs, *(count(r) for r in base_runs))
    xs = [(count(r) / 4 - a * r["blocks"] - c * r["tiles"]) / diagonal_tiles(r) for r in causal_runs]
    return sum(xs) / len(xs)


def one_block_an_sm(runs: list[dict]) -> bool:
    """Runs of a Hopper asynchronous build (they issue wgmma): flash3's and cuDNN's forward hold one block an SM
    (227 KiB of shared memory a block), so the census's active cycles are the blocks' own time."""
    return all(r["metrics"].get(WGMMA_ISSUED, 0.0) > 0 and ACTIVE in r["metrics"] for r in runs)


def measured_tiles(record: dict) -> dict[str, dict[str, float]]:
    """{build: {"tile", "masked"?}} of the one-block-an-SM builds (`one_block_an_sm`), from their measured time: a key
    tile's active cycles less its tensor pipe's, and a diagonal tile's extra active cycles (at least 0). On these
    builds the counted rule adds up what the ping-pong of two consumer warpgroups partly hides (d 128: 15-19% more
    than measured) and misses what a diagonal tile waits on (cuDNN's: 778 and 2,952 cycles measured where 90 and 749
    are issued; experiments/flash3_model/measured_tile.py, docs/decisions.md)."""
    out = {}
    for build, e in record["census"].items():
        runs = e.get("runs", [])
        if build.endswith(" causal") or len(runs) != 2 or not one_block_an_sm(runs):
            continue
        active, _ = per_tile_and_block(*runs, *(r["metrics"][ACTIVE] for r in runs))
        tensor, _ = per_tile_and_block(*runs, *(r["busy_cycles"]["tensor"] for r in runs))
        out[build] = {"tile": active - tensor}
        causal = record["census"].get(build + " causal", {}).get("runs")
        if causal and all(ACTIVE in r["metrics"] for r in causal):
            out[build]["masked"] = max(0.0, diagonal_extra(causal, runs, lambda r: r["metrics"][ACTIVE]))
    return out


def pipes_table(record: dict, kernels: list[str] | None = None,
                measured: bool = True) -> dict[str, dict[str, float]]:
    """{build: {"tile": cycles, "block": cycles, "clock_mhz": the SMs' clock then}} from experiments/pipe_cycles/pipe_census.py's
    record. A run's non-tensor cycles are the larger of its non-tensor instructions (a sub-partition's scheduler
    issues one a cycle) and its busiest non-tensor pipe's cycles: the pipes run beside each other, so their sum
    (2.1-2.5x as much) would time each build's softmax as if XU, FMA and ALU took turns. Solved as C = a x blocks
    + c x tiles over the build's two lengths (`per_tile_and_block`); a block's at least 0. A record without
    instruction counts (experiments/pipe_cycles/pipe_overlap.py's, from busy shares) gives its busiest pipe. `kernels`: only the
    builds of those (flash1, flash2, fa2), where given. The one-block-an-SM builds' tiles are their measured time
    (`measured_tiles`) unless `measured` is False (the counted rule, for comparison); a block's cycles stay counted:
    their measured time holds the first loads, which the plan times itself."""
    out = {}
    for build, e in record["census"].items():
        if (kernels and build.split()[0] not in kernels) or build.endswith(" causal"):
            continue
        runs = e.get("runs", [])
        if len(runs) == 2 and all(ISSUED in r["metrics"] and TENSOR_ISSUED in r["metrics"]
                                  and all(p in r["busy_cycles"] for p in NON_TENSOR) for r in runs):
            c1, c2 = (max(non_tensor_issued(r["metrics"]), *(r["busy_cycles"][p] for p in NON_TENSOR)) for r in runs)
            tile, block = per_tile_and_block(*runs, c1, c2)
        elif all(p in e.get("per_tile", {}) for p in NON_TENSOR):
            tile = max(e["per_tile"][p] for p in NON_TENSOR)
            block = max(e.get("per_block", {}).get(p, 0.0) for p in NON_TENSOR)
        else:
            continue
        if e.get("clock_hz"):
            out[build] = {"tile": round(tile, 1), "block": round(max(0.0, block), 1),
                          "clock_mhz": round(e["clock_hz"] / 1e6, 1)}
    # a causal census's diagonal tiles, by the same rule as an interior one (the larger of the instructions issued and
    # the busiest pipe's cycles), less the interior tile's
    for build, e in record["census"].items():
        base = build.removesuffix(" causal")
        x, b = e.get("masked_extra"), record["census"].get(base, {})
        if build.endswith(" causal") and base in out and x and "issue" in x and len(b.get("runs", [])) == 2:
            issue, _ = per_tile_and_block(*b["runs"], *(non_tensor_issued(r["metrics"]) for r in b["runs"]))
            diagonal = max(issue + x["issue"], *(b["per_tile"][p] + x.get(p, 0.0) for p in NON_TENSOR))
            out[base]["masked"] = round(max(0.0, diagonal - out[base]["tile"]), 1)
    for build, m in (measured_tiles(record) if measured else {}).items():
        if build in out:
            out[build].update({k: round(x, 1) for k, x in m.items()})
    # a bf16 build counts as its fp16 twin (the same instructions; equal tiles in every census), where only fp16 ran causal
    for build, e in out.items():
        twin = out.get(build.removesuffix("bf16") + "fp16") if build.endswith("bf16") else None
        if twin and "masked" in twin and "masked" not in e:
            e["masked"] = twin["masked"]
    return dict(sorted(out.items()))


@cache
def _pipes() -> dict[str, dict[str, float]]:
    return json.loads(PIPES_TABLE.read_text()) if PIPES_TABLE.exists() else {}


def pipe_entry(build: str) -> dict[str, float] | None:
    """The build so keyed's counted cycles as stored: "tile", "block", "masked" (where counted), at "clock_mhz"."""
    return _pipes().get(build)


def masked_pipe_cycles(build: str, clock_hz: float) -> float:
    """What a diagonal (masked) key tile of the build so keyed adds to its `pipe_cycles` tile, in cycles of
    `clock_hz` as there; 0 where no causal census counted it."""
    e = _pipes().get(build)
    return e.get("masked", 0.0) * clock_hz / (e["clock_mhz"] * 1e6) if e else 0.0


def pipe_cycles(build: str, clock_hz: float) -> tuple[float, float] | None:
    """(cycles a key tile, cycles a block) of the build so keyed (`key`, `fa2_build`), or None where not counted:
    in cycles of `clock_hz` (the profile's clock, its maximum) for the busy time they took at the clock the SMs ran
    at when counted (about 1,800 MHz on the H200 under load)."""
    e = _pipes().get(build)
    if not e:
        return None
    scale = clock_hz / (e["clock_mhz"] * 1e6)
    return e["tile"] * scale, e["block"] * scale


def parse_ptxas(report: str) -> dict[str, int]:
    """{key: registers} for every instance ptxas compiled for sm_90 in `report` (its -v output)."""
    out, cur = {}, None
    for line in report.splitlines():
        m = _ENTRY.search(line)
        if m:
            cur = _key_of(m.group(1))
            continue
        r = re.search(r"Used (\d+) registers", line)
        if r and cur:
            out[cur] = int(r.group(1))
            cur = None
    return out


def text_sections(cubin: bytes) -> dict[str, int]:
    """{mangled function name: bytes of its .text section} in a cubin (a 64-bit little-endian ELF)."""
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    entsize, count, names = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", cubin, shoff + i * entsize) for i in range(count)]
    strtab = headers[names][4]
    out = {}
    for name_at, _, _, _, _, size in headers:
        name = cubin[strtab + name_at:cubin.index(b"\0", strtab + name_at)].decode()
        if name.startswith(".text."):
            out[name[len(".text."):]] = size
    return out


def code_sizes(cubin: bytes) -> dict[str, int]:
    """{key: bytes of its .text section} for every instance of our kernels in a cubin."""
    return {k: size for name, size in text_sections(cubin).items() if (k := _key_of(name))}


def table(report: str, cubin: bytes) -> dict[str, dict[str, int]]:
    regs, code = parse_ptxas(report), code_sizes(cubin)
    return {k: {"registers": regs[k], "code_bytes": code[k]} for k in sorted(regs)}


@cache
def _table() -> dict[str, dict[str, int]]:
    return json.loads(TABLE.read_text())


def _entry(loop_order: str, head_dim: int, tiling, dtype: str) -> dict[str, int]:
    return _table().get(key(loop_order, head_dim, tiling.block_q, tiling.block_kv, tiling.warps, tiling.stages,
                            dtype == "bf16"), {})


def registers(loop_order: str, head_dim: int, tiling, dtype: str) -> int | None:
    """ptxas's count for this flash kernel instance, or None where no such kernel is built."""
    return _entry(loop_order, head_dim, tiling, dtype).get("registers")


def code_bytes(loop_order: str, head_dim: int, tiling, dtype: str) -> int | None:
    """This flash kernel instance's machine code in bytes, or None where no such kernel is built."""
    return _entry(loop_order, head_dim, tiling, dtype).get("code_bytes")


def row_build(kernel: str, head_dim: int, dtype: str) -> dict[str, int]:
    """ptxas's registers and the code bytes of our backward's row kernel planned as `kernel` (gpu_kernels'
    bwd_dot, bwd_convert, softmax_bwd_rows); {} for any other kernel or an instance not built."""
    kind = {"flash2_bwd_dot": "bwd_dot", "flash2_bwd_convert": "bwd_convert", "flash1_bwd_convert": "bwd_convert",
            "naive_softmax_bwd": "softmax_bwd_rows"}.get(kernel)
    if kind is None:
        return {}
    return _table().get(row_key(kind, head_dim, dtype == "bf16"), {})


def softmax_code_bytes(dtype: str) -> int | None:
    """naive's softmax kernel's machine code in bytes (fp16 and bf16 are built; None otherwise)."""
    return _table().get(softmax_key(dtype == "bf16"), {}).get("code_bytes")


def _write(path: Path, entries: dict) -> None:
    path.write_text("{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in entries.items()) + "\n}\n")


if __name__ == "__main__":
    if sys.argv[1] == "--pipes":   # --pipes RECORD [KERNEL ...]: the builds of those kernels it counted, the rest kept
        counted = pipes_table(json.loads(Path(sys.argv[2]).read_text()), sys.argv[3:])
        kept = {k: v for k, v in _pipes().items() if k not in counted}
        _write(PIPES_TABLE, dict(sorted((kept | counted).items())))
    elif sys.argv[1] == "--fa2":
        _write(FA2_TABLE, fa2_table(json.loads(Path(sys.argv[2]).read_text())))
    else:
        _write(TABLE, table(Path(sys.argv[1]).read_text(), Path(sys.argv[2]).read_bytes()))
