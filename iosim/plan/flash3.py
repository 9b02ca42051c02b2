"""flash3: the Hopper forward pass of gpu_kernels/hopper.cu, FlashAttention-3's design, planned as flash2's loop
(one block per batch, head and 64 query rows a consumer warpgroup, K/V tiles in turn; `geometry`) with what
Hopper's asynchronous units change:

- the matmuls run on wgmma, at the chip's wgmma rate (`Build.wgmma`), not mma.sync's;
- TMA copies K and V into a ring of `stages` buffers without holding a warp: the loads overlap the compute as
  flash2's double buffering does, and the producer's warps take no registers (setmaxnreg);
- wgmma reads each operand out of shared memory once per consumer warpgroup (two or three readers, not every warp).

The design also runs one consumer warpgroup's softmax under the others' matmuls (ping-pong). Measured, a key tile
of this build and of cuDNN's takes its tensor cycles plus its non-tensor issue cycles, not the larger of the two
(experiments/flash3_model, docs/decisions.md 2026-12-07): their builds say `overlap_softmax=False`, and so the
engine plans the two in series, as for flash2.
"""
from __future__ import annotations

from dataclasses import replace

from ..errors import IosimError
from ..hardware import HardwareProfile
from ..workload import AttentionConfig
from .flash import Flash2Kernel
from .tiling import Tiling
from .traits import Traits

# the algorithms planned at flash3's design: ours, and SDPA's cuDNN forward (`CudnnFwdKernel`)
ALGORITHMS = ("flash3", "torch_cudnn")
STAGES = 2
# (consumer warpgroups, key-tile width) a head_dim's block: each consumer owns 64 query rows, and a producer
# warpgroup issues the copies, so a block is 64 x consumers rows and 128 x (consumers + 1) threads
GEOMETRY = {64: (3, 128), 128: (2, 128)}
# cuDNN's work tile at every head_dim, as planned: 128 rows by two consumers, 384 threads (Nsight Compute on the H100)
CUDNN_BLOCKS = (2, 128)


def geometry(head_dim: int, algorithm: str = "flash3") -> tuple[int, int]:
    """(consumer warpgroups, key-tile width) of `algorithm`'s block at `head_dim`: what gpu_kernels/hopper.py
    launches for flash3, cuDNN's work tile for torch_cudnn."""
    if algorithm == "torch_cudnn":
        return CUDNN_BLOCKS
    return GEOMETRY.get(head_dim, (2, 128))


def launch_registers(threads: int) -> int:
    """Registers a thread of a one-block-an-SM build (`__launch_bounds__(threads, 1)`): ptxas shares the SM's 65,536
    out in steps of 8, 168 at 384 threads and 128 at 512 (setmaxnreg then moves the producer's to the consumers)."""
    return 65536 // threads // 8 * 8


def tiling(cfg: AttentionConfig, algorithm: str = "flash3") -> Tiling:
    """The one tiling `algorithm` runs at `cfg` (`geometry`'s block, two K/V stages); a causal head's longest
    query blocks launched first, as the kernel does."""
    consumers, block_kv = geometry(cfg.head_dim, algorithm)
    return Tiling(block_q=64 * consumers, block_kv=block_kv, loop_order="flash2", warps=4 * (consumers + 1),
                  stages=STAGES, q_order="descending" if cfg.causal else "ascending")


def check_chip(cfg: AttentionConfig, hw: HardwareProfile, algorithm: str = "flash3") -> None:
    """flash3 is built of wgmma, fp16 and bf16 only, at its own shared memory: a profile without wgmma's rate or
    that room per block is refused in one line (`algorithm`: the name the refusal gives, flash3 or a kernel
    planned at its tiles)."""
    if cfg.dtype not in ("fp16", "bf16"):
        raise IosimError(f"dtype {cfg.dtype}: {algorithm} is built for fp16 and bf16")
    if getattr(hw, f"wgmma_{cfg.dtype}_tflops") is None:
        raise IosimError(f"{algorithm} runs on wgmma (Hopper's asynchronous matmul); profile '{hw.key}' has no "
                         f"wgmma_{cfg.dtype}_tflops: choose a Hopper profile (h100_sxm, h200_sxm) or give that rate")
    need = smem_bytes(cfg, geometry(cfg.head_dim, algorithm))
    if need > hw.smem_per_block_bytes:
        who = "flash3 needs" if algorithm == "flash3" else f"{algorithm} is planned at flash3's tiles, which need"
        raise IosimError(f"{who} {need / 1024:.1f} KiB of shared memory per block at head_dim="
                         f"{cfg.head_dim}; {hw.key} allows {hw.smem_per_block_kib:g} KiB per block")


def runs_on(cfg: AttentionConfig, hw: HardwareProfile) -> bool:
    """flash3 can be planned for `cfg` on `hw`: a forward pass that `check_chip` lets through."""
    if cfg.pass_ != "forward":
        return False
    try:
        check_chip(cfg, hw)
    except IosimError:
        return False
    return True


def smem_bytes(cfg: AttentionConfig, blocks: tuple[int, int] | None = None) -> int:
    """As hopper.cu's Flash3Smem: Q, the K and V ring, the mbarriers, and 1 KiB to align the base by hand, at
    `blocks` (consumers, key-tile width; default `geometry`'s)."""
    consumers, block_kv = blocks or geometry(cfg.head_dim)
    return (64 * consumers + 2 * STAGES * block_kv) * cfg.head_dim * cfg.elem_bytes + 8 * (1 + 4 * STAGES) + 1024


class Flash3Kernel(Flash2Kernel):
    # one block an SM: nothing runs beside a folded step's loads, so coarse folding adds its load time to the block's
    # (experiments/flash3_model/steps.py: at 4 steps, B2 H16 N8192 d128 comes out 11% slower than at 16; 16 and 64
    # agree)
    least_steps = 16

    def __init__(self, cfg: AttentionConfig, t: Tiling, traits: Traits):
        # what the kernel is, not a fitted value: even at the chip's peak rates its matmuls are wgmma's
        super().__init__(cfg, t, replace(traits, wgmma=True, registers_per_thread=launch_registers(32 * t.warps)))
        self.name = "flash3_fwd"
        self.smem_bytes = smem_bytes(cfg, (t.block_q // 64, t.block_kv)) if traits.smem_bytes is None else \
            traits.smem_bytes
        self.smem_readers = t.block_q // 64   # wgmma reads each operand once per consumer warpgroup


class CudnnFwdKernel(Flash3Kernel):
    """cuDNN's sm_90 forward (PyTorch's SDPA cuDNN backend): the same design as flash3 (wgmma, TMA, a producer and
    two consumer warpgroups, 384 threads), run as a persistent grid: one block an SM takes the 128-row work tiles in
    turn (Nsight Compute on the H100: grid 132, 227 KiB of shared memory; experiments/flash3_pipeline/
    h100_2026-12-06). Planned at flash3's tiles, each work tile a block: a block an SM either way, so the waves
    are the same; its build (`kernels.catalogue.CUDNN_BUILD`) is its own."""

    def __init__(self, cfg: AttentionConfig, t: Tiling, traits: Traits):
        super().__init__(cfg, t, traits)
        self.name = "cudnn_fwd"
