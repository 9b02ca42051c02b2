"""flash3: the Hopper forward pass of gpu_kernels/hopper.cu, FlashAttention-3's design, planned as flash2's loop
(a work tile per batch, head and 64 query rows a consumer warpgroup, K/V tiles in turn; `geometry`) with what
Hopper's asynchronous units change. The kernel is persistent (one block an SM taking work tiles in turn); it is
planned as a block a work tile, dealt to the SM free first, which is what its causal claims do and, its tiles all
alike, what its fixed non-causal deal comes to.

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

import heapq
from dataclasses import replace

import numpy as np

from ..errors import IosimError
from ..hardware import HardwareProfile
from ..workload import AttentionConfig
from .behaviour import PersistentLoop
from .flash import Flash2Kernel
from .tiling import Tiling
from .traits import Traits

# the algorithms planned at flash3's design: ours, and SDPA's cuDNN forward (`CudnnFwdKernel`)
ALGORITHMS = ("flash3", "torch_cudnn")
STAGES = 2
# (consumer warpgroups, key-tile width) each head_dim is built at: each consumer owns 64 query rows, and a producer
# warpgroup issues the copies, so a block is 64 x consumers rows and 128 x (consumers + 1) threads. The first is
# the default; `geometry` picks among them by the time each takes on the chip's SMs.
GEOMETRIES = {64: ((3, 128), (2, 128)), 128: ((2, 128),)}
# cuDNN's work tile at every head_dim, as planned: 128 rows by two consumers, 384 threads (Nsight Compute on the H100)
CUDNN_BLOCKS = (2, 128)
# dense fp16/bf16 wgmma an SM does a cycle on sm_90: 989.4 TFLOP/s over 132 SMs at 1,830 MHz (H100 SXM datasheet)
WGMMA_FLOPS_PER_SM_CYCLE = 4096


def geometry(cfg: AttentionConfig, algorithm: str = "flash3", sm_count: int | None = None) -> tuple[int, int]:
    """(consumer warpgroups, key-tile width) of `algorithm`'s block at `cfg`: cuDNN's work tile for torch_cudnn;
    for flash3 the built geometry whose work tiles, dealt round `sm_count` SMs as the persistent grid deals them,
    end first (`makespan`), the default where `sm_count` is not given. The launcher and the plan both ask here."""
    options = built(cfg, algorithm)
    if sm_count is None or len(options) == 1:
        return options[0]
    return min(options, key=lambda g: makespan(cfg, g, sm_count))


def built(cfg: AttentionConfig, algorithm: str = "flash3") -> tuple[tuple[int, int], ...]:
    """The blocks `algorithm` is built at for `cfg`'s head_dim (cuDNN: its one work tile)."""
    return (CUDNN_BLOCKS,) if algorithm == "torch_cudnn" else GEOMETRIES.get(cfg.head_dim, ((2, 128),))


def makespan(cfg: AttentionConfig, blocks: tuple[int, int], sm_count: int) -> float:
    """Cycles until the busiest SM of the persistent grid is done: its work tiles (a head's adjacent, longest first
    if causal) dealt as the kernel deals them, SM i taking tiles i, i + sm_count, ... (all equal: non-causal) or
    each free SM the next unclaimed one (causal); a tile's key tiles at their tensor cycles (wgmma's rate) plus the
    build's measured non-tensor cycles, a diagonal tile's extra, and a work tile's own
    (iosim/kernels/pipes_sm90.json). Inf for a build that was never counted."""
    from ..kernels.builds import key, pipe_entry
    consumers, bkv = blocks
    rows = 64 * consumers
    e = pipe_entry(key("flash3", cfg.head_dim, rows, bkv, 4 * (consumers + 1), STAGES, cfg.dtype == "bf16"))
    if e is None:
        return float("inf")
    tile = 4 * rows * bkv * cfg.head_dim / WGMMA_FLOPS_PER_SM_CYCLE + e["tile"]
    nqb, nk, off = -(-cfg.seqlen_q // rows), cfg.seqlen_k, cfg.seqlen_k - cfg.seqlen_q
    heads = cfg.batch * cfg.heads
    if not cfg.causal:
        nt = -(-nk // bkv)
        return -(-heads * nqb // sm_count) * (nt * tile + e["block"])
    q0 = np.arange(nqb)[::-1] * rows
    nt = -(-np.clip(np.minimum(cfg.seqlen_q, q0 + rows) + off, 0, nk) // bkv)
    whole = np.minimum(np.clip(q0 + off + 1, 0, nk) // bkv, nt)     # key tiles every row of the block sees whole
    head = nt * tile + (nt - whole) * e.get("masked", 0.0) + e["block"]
    free = [0.0] * min(sm_count, heads * nqb)
    for c in np.tile(head, heads).tolist():   # the SM free first claims the next tile
        heapq.heapreplace(free, free[0] + c)
    return max(free)


def launch_registers(threads: int) -> int:
    """Registers a thread of a one-block-an-SM build (`__launch_bounds__(threads, 1)`): ptxas shares the SM's 65,536
    out in steps of 8, 168 at 384 threads and 128 at 512 (setmaxnreg then moves the producer's to the consumers)."""
    return 65536 // threads // 8 * 8


def tiling(cfg: AttentionConfig, algorithm: str = "flash3", sm_count: int | None = None,
           blocks: tuple[int, int] | None = None) -> Tiling:
    """The tiling `algorithm` runs at `cfg` on `sm_count` SMs (`geometry`'s block, or `blocks`: a record's, two K/V
    stages); a causal head's longest query blocks first, as the kernel takes them."""
    consumers, block_kv = blocks or geometry(cfg, algorithm, sm_count)
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
    need = smem_bytes(cfg, geometry(cfg, algorithm, hw.sm_count))
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
    """As hopper.cu's Flash3Smem: two Q buffers (a work tile's and the next one's), the K and V ring, the mbarriers,
    the two buffers' tile numbers and 1 KiB to align the base by hand, at `blocks` (consumers, key-tile width;
    default `geometry`'s)."""
    consumers, block_kv = blocks or geometry(cfg)
    tiles = (2 * 64 * consumers + 2 * STAGES * block_kv) * cfg.head_dim * cfg.elem_bytes
    return tiles + 8 * (4 + 4 * STAGES) + 8 + 1024


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
        self.loop = PersistentLoop()


class CudnnFwdKernel(Flash3Kernel):
    """cuDNN's sm_90 forward (PyTorch's SDPA cuDNN backend): the same design as flash3 (wgmma, TMA, a producer and
    two consumer warpgroups, 384 threads), run as a persistent grid: one block an SM takes the 128-row work tiles in
    turn (Nsight Compute on the H100: grid 132, 227 KiB of shared memory; experiments/flash3_pipeline/
    h100_2026-12-06). Planned at flash3's tiles, each work tile a block: a block an SM either way, so the waves
    are the same; its build (`kernels.catalogue.CUDNN_BUILD`) is its own."""

    def __init__(self, cfg: AttentionConfig, t: Tiling, traits: Traits):
        super().__init__(cfg, t, traits)
        self.name = "cudnn_fwd"
