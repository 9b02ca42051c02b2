"""What a kernel declares about itself for the engine, in two parts: what `iosim fit` chooses for a kernel family
on the calibration records (`Fitted`), and what a compiled build is (`Build`: registers, code, shared memory,
spills, pipe cycles; from `iosim.kernels`). The engine reads them joined (`Traits`)."""
from __future__ import annotations

from dataclasses import dataclass, fields

from ..errors import IosimError


@dataclass(frozen=True)
class Fitted:
    """A kernel family's fitted values: efficiencies against the chip's peak rates (1.0 ideal), how its blocks share
    an SM, and its fixed costs. Stored in `<profile>.kernels.json`."""
    mma_efficiency: float = 1.0
    exp_efficiency: float = 1.0
    fp32_efficiency: float = 1.0
    # share of an SM's units one block can use when it is alone there; None: what it gets at full occupancy
    # (a kernel sized for several blocks per SM does not speed up alone, a persistent GEMM does)
    solo_sm_share: float | None = None
    # Latency hiding (None: not modelled, the solo share above applies): an SM's units run at 1 - exp(-R / this)
    # of their rate, R the query rows of all blocks resident on it (rows are the kernels' independent matmul and
    # softmax chains: few rows in flight leave the pipelines waiting on dependent instructions), and a block's
    # matmul and softmax run one after the other (the same warps issue both), co-resident blocks each in turn
    latency_rows: float | None = None
    # With latency hiding: the share of the shorter of a block's matmul and softmax that co-resident blocks hide
    # behind the longer (their warps share the SM's schedulers, so one's exp can issue beside another's mma).
    # 0: the SM runs its blocks' chains strictly in turn; 1: only one block's shorter part shows
    block_overlap: float = 0.0
    # Memory-level parallelism (None: not limited): the bytes one block keeps in flight. A load of B bytes then
    # takes at least ceil(B / this) memory latencies (Little's law): a kernel whose threads wait on a few small
    # loads each is held by latency, not bandwidth
    bytes_in_flight: int | None = None
    # time a block holds its slot before its first load without using any shared unit: launch, index set-up, and
    # the prologue and epilogue latencies its steps do not count (grids of many short blocks pay it often)
    block_overhead_s: float = 0.0
    # what a key tile that crosses a query block's causal diagonal (or the sequence's end) costs, in interior
    # tiles: the kernel masks its scores in another copy of its loop body (the tiled plans: flash1, flash2, and
    # PyTorch's kernel planned as flash2).
    # Time only: the counted FLOPs stay a whole tile's
    diagonal_tile_cost: float = 1.0
    # the rate (bytes/s) one block issues its stores at (None: at once, the memory tiers alone time them); the
    # block holds its slot until they are issued. Our kernels write O straight from their mma accumulators, 4 bytes
    # a lane and 16 of a row a warp instruction: a lone block issues 8-32 KiB in 0.3-1.3 us
    # (experiments/store_issue/store_issue.py), and its trace ends with an epilogue of 0.7-2.8 us (block_trace.py --set phases)
    store_issue_bytes_per_s: float | None = None
    # a GEMM that moves its N x N operand an element at a time (CUTLASS's alignment-1 kernels, where that operand's
    # rows are not 16-byte aligned): the operand's bytes an SM moves a clock, in turn with its matmul, not beside it
    # (experiments/cublas_alignment). None: the operand moves in whole vectors, at the memory tiers' pace
    operand_bytes_per_cycle: float | None = None

    def __post_init__(self) -> None:
        if self.operand_bytes_per_cycle is not None and not 0.01 <= self.operand_bytes_per_cycle <= 1024:
            raise IosimError(f"Traits operand_bytes_per_cycle must be between 0.01 and 1024 (or None), got "
                             f"{self.operand_bytes_per_cycle}")
        if not 0.0 <= self.block_overlap <= 1.0:
            raise IosimError(f"Traits block_overlap must be between 0 and 1, got {self.block_overlap}")
        if not 1.0 <= self.diagonal_tile_cost <= 10.0:
            raise IosimError(f"Traits diagonal_tile_cost must be between 1 and 10, got {self.diagonal_tile_cost}")
        if self.store_issue_bytes_per_s is not None and not self.store_issue_bytes_per_s > 0:
            raise IosimError(f"Traits store_issue_bytes_per_s must be above 0 (or None), got "
                             f"{self.store_issue_bytes_per_s}")


@dataclass(frozen=True)
class Build:
    """Facts of one compiled build of a kernel (its defaults: an unknown build of 128 registers a thread)."""
    registers_per_thread: int = 128
    overlap_softmax: bool = False   # softmax overlapped with the matmuls (FlashAttention-3), not after them
    # its matmuls run on wgmma (Hopper's asynchronous warpgroup matmul, sm_90a), at the chip's wgmma rate
    # (`HardwareProfile.wgmma_fp16_tflops`), not mma.sync's
    wgmma: bool = False
    # the kernel's machine code (its .text in the cubin, `kernels.builds`), read through L2 as its blocks start:
    # instructions are data too, and a cold L2 (Nsight's default) holds none of them. Counted, not timed (an
    # empty kernel's measured floor and the blocks' measured prologues hold the fetch's latency); 0: not counted
    code_bytes: int = 0
    # the shared memory one block holds as built, where it is not the tiling's formula (None: the formula):
    # PyTorch's FlashAttention-2 keeps one K and one V buffer and loads the next tile into the one just used
    smem_bytes: int | None = None
    # O leaves straight from the mma fragments, 4 lanes x 2 values of a row a store instruction (our kernels: 16
    # bytes of a row, half a sector, at fp16/bf16); False: staged through shared memory into whole sectors
    # (FlashAttention-2)
    o_fragment_stores: bool = True
    # register spills a block stores to local memory at each key tile it visits, interior or crossing the causal
    # diagonal (bytes; PyTorch's FlashAttention-2 kernel, from Nsight Compute): L1 writes local stores through to
    # L2 and serves the loads itself. 0: none reach L2 (our kernels' spills stay in L1)
    spill_bytes_per_tile: int = 0
    spill_bytes_per_diagonal_tile: int = 0
    # the build's own instruction mix: the cycles its XU, FMA and ALU pipes are busy for one key tile, each of the
    # SM's sub-partitions (a 4-warp block puts a warp on each), and for a block's prologue and epilogue, as Nsight
    # Compute counted them on grids in no record set (experiments/pipe_cycles/pipe_census.py, `kernels.builds.pipe_cycles`).
    # A lone block runs them one after another with its matmuls (experiments/pipe_cycles/pipe_overlap.py). 0: unknown build,
    # its counted exp and fp32 work at the pipes' rates and the efficiencies instead
    tile_pipe_cycles: float = 0.0
    block_pipe_cycles: float = 0.0
    # what a key tile that runs the masked loop body (on the causal diagonal) adds to `tile_pipe_cycles`, counted the
    # same way on causal grids (experiments/pipe_cycles/pipe_census.py, `masked_extra`); 0: not counted
    masked_tile_pipe_cycles: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.code_bytes <= 1 << 30:
            raise IosimError(f"Traits code_bytes must be between 0 and 2**30, got {self.code_bytes}")
        for f in ("spill_bytes_per_tile", "spill_bytes_per_diagonal_tile"):
            if not 0 <= getattr(self, f) <= 1 << 20:
                raise IosimError(f"Traits {f} must be between 0 and 2**20, got {getattr(self, f)}")
        for f in ("tile_pipe_cycles", "block_pipe_cycles", "masked_tile_pipe_cycles"):
            if not 0.0 <= getattr(self, f) <= 1e9:
                raise IosimError(f"Traits {f} must be between 0 and 1e9, got {getattr(self, f)}")
        if self.smem_bytes is not None and not 0 <= self.smem_bytes <= 1 << 30:
            raise IosimError(f"Traits smem_bytes must be between 0 and 2**30 (or None), got {self.smem_bytes}")


@dataclass(frozen=True)
class Traits(Fitted, Build):
    """A kernel's fitted values joined to its build's facts: what the engine and the plans read."""

    def __post_init__(self) -> None:
        Fitted.__post_init__(self)
        Build.__post_init__(self)

    @classmethod
    def join(cls, fitted: Fitted | None = None, build: Build | None = None) -> "Traits":
        return cls(**{f.name: getattr(fitted, f.name) for f in fields(Fitted)} if fitted else {},
                   **{f.name: getattr(build, f.name) for f in fields(Build)} if build else {})

    @property
    def fitted(self) -> Fitted:
        return Fitted(**{f.name: getattr(self, f.name) for f in fields(Fitted)})

    @property
    def build(self) -> Build:
        return Build(**{f.name: getattr(self, f.name) for f in fields(Build)})
