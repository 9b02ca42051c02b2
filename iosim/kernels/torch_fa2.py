"""PyTorch's FlashAttention-2 forward (SDPA's flash backend) as it runs: the tiling its heuristic picks, and what
its build is (registers, shared memory, register spills, machine code), from FlashAttention-2's sources and
Nsight Compute on the H200 (experiments/fa2_build, experiments/l2_counters)."""
from __future__ import annotations

import math

from ..plan.traits import Build, Traits
from ..plan.tiling import Tiling
from ..workload import AttentionConfig
from .builds import fa2_build, fa2_code_bytes, pipe_cycles

# PyTorch's FlashAttention-2 kernels as built, under Nsight Compute (experiments/fa2_build/fa2_launch.sh,
# experiments/fa2_build/fa2_launch_h200_2026-12-01): the main and split-KV attention kernels 246-255 registers a
# thread, the split-KV combine kernel 54; their shared memory a Q tile and one K and one V tile
REGISTERS = {"flash2_fwd": 255, "flash2_fwd_split": 255, "flash2_combine": 54}

# and its register spills: bytes a block stores to local memory per interior and per diagonal key tile, which L1
# writes through to L2 (Nsight Compute's local-store bytes over the tiles the engine plans; five busy fp16 grids,
# experiments/l2_counters/l2_writes.sh SET=torch, `l2_writes.fa2_spills`). d 64 causal from one grid: its mean for
# both. The split-KV kernel's were not measured (none counted)
SPILL_BYTES = {(64, False): (4480, 4480), (64, True): (6002, 6002),
               (128, False): (7616, 7616), (128, True): (7176, 11172)}


def tiling(cfg: AttentionConfig, sm_count: int) -> Tiling:
    """FlashAttention-2's forward tiling as PyTorch's SDPA flash backend runs it: 128x128 tiles (128x64 above
    d 64), or, where batch x heads x 64-row query blocks would not reach 80% of two blocks per SM, its split-KV
    kernel (64-row blocks; 256, 128 or 64 keys a tile) with the number of splits its heuristic picks
    (`num_splits_heuristic` in FlashAttention-2's flash_api.cpp, which PyTorch vendors). Above d 128: 128x64 with
    8 warps (`run_mha_fwd_hdim256`)."""
    d = cfg.head_dim
    n_kv_block = 256 if d <= 64 else 128 if d <= 128 else 64
    m_blocks = cfg.bh * -(-cfg.seqlen_q // 64)
    splits = _num_splits(m_blocks, 2 * sm_count, -(-cfg.seqlen_k // n_kv_block), 128)
    if splits > 1:
        return Tiling(block_q=64, block_kv=n_kv_block, warps=4, stages=2, kv_splits=splits)
    return Tiling(block_q=128, block_kv=128 if d <= 64 else 64, warps=4 if d <= 128 else 8, stages=2)


def backward_blocks(head_dim: int) -> tuple[int, int, int]:
    """(kBlockM, kBlockN, warps) of FlashAttention-2's backward as PyTorch runs it on a chip with at least 144 KiB
    of shared memory a block (`run_mha_bwd_hdim*` in PyTorch's flash_bwd_launch_template.h): 128 x 128 up to
    d 64, 64 x 128 up to d 128, 64 x 64 above; 8 warps throughout."""
    if head_dim <= 64:
        return 128, 128, 8
    if head_dim <= 128:
        return 64, 128, 8
    return 64, 64, 8


def _num_splits(work: int, slots: int, n_blocks: int, max_splits: int) -> int:
    """FlashAttention-2's choice: no split when the blocks nearly fill the slots; else the fewest splits whose
    wave efficiency is within 85% of the best, among the split counts that change the blocks per split."""
    if work >= 0.8 * slots:
        return 1
    max_splits = min(max_splits, slots, n_blocks)
    eff = {}
    for n in range(1, max_splits + 1):
        if n == 1 or -(-n_blocks // n) != -(-n_blocks // (n - 1)):
            waves = work * n / slots
            eff[n] = waves / math.ceil(waves)
    best = max(eff.values(), default=0.0)
    return next((n for n in sorted(eff) if eff[n] >= 0.85 * best), 1)


def smem_bytes(cfg: AttentionConfig, tiling: Tiling) -> int:
    """FlashAttention-2's shared memory a block (`Flash_fwd_kernel_traits::kSmemSize`, Q not sharing K's
    buffer): the Q tile and one buffer each of K and V; it loads the next K tile into the buffer its last Q K^T
    read while P V runs."""
    return (tiling.block_q + 2 * tiling.block_kv) * cfg.head_dim * cfg.elem_bytes


def recorded_code(ncu: dict) -> dict[str, int]:
    """The code bytes of the PyTorch flash kernels a record ran (torch's library, `builds.fa2_code_bytes`),
    by the engine's names for them: the main or split-KV kernel, and the combine kernel."""
    out = {}
    for k in ncu.get("kernels", []):
        if "flash_fwd" not in k["name"]:   # the backward's kernels: code not counted
            continue
        code = fa2_code_bytes(k["name"])
        if code:
            name = ("flash2_combine" if "combine" in k["name"] else
                    "flash2_fwd_split" if "splitkv" in k["name"] else "flash2_fwd")
            out[name] = code
    return out


def build_traits(cfg: AttentionConfig, tiling: Tiling, fitted: Traits | None, clock_hz: float) -> dict[str, Traits]:
    """Each kernel's traits: the fitted ones joined to its build: FlashAttention-2's registers as Nsight Compute
    read them, its shared memory, its O staged into whole sectors, its register spills written through to L2 and,
    where Nsight Compute counted the build, its non-tensor pipe cycles (its code bytes depend on the instance it
    ran: `recorded_code`)."""
    per, diag = SPILL_BYTES.get((cfg.head_dim, cfg.causal), (0, 0))
    tile, block = pipe_cycles(fa2_build(cfg.head_dim, tiling, cfg.dtype), clock_hz) or (0.0, 0.0)
    builds = {
        "flash2_fwd": Build(registers_per_thread=REGISTERS["flash2_fwd"], o_fragment_stores=False,
                            smem_bytes=smem_bytes(cfg, tiling), spill_bytes_per_tile=per,
                            spill_bytes_per_diagonal_tile=diag, tile_pipe_cycles=tile, block_pipe_cycles=block),
        "flash2_fwd_split": Build(registers_per_thread=REGISTERS["flash2_fwd_split"], o_fragment_stores=False,
                                  smem_bytes=smem_bytes(cfg, tiling), tile_pipe_cycles=tile, block_pipe_cycles=block),
        "flash2_combine": Build(registers_per_thread=REGISTERS["flash2_combine"], o_fragment_stores=False),
    }
    return {name: Traits.join(fitted.fitted if fitted else None, b) for name, b in builds.items()}
