"""How the tiled kernel is cut: block sizes, loop order, grid order, warps, buffering.

One `Tiling` drives both the planner (and so the analytic model and the engine) and the CUDA launcher, so a
prediction and a measurement always describe the same kernel.
"""
from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import IosimError, one_line
from ..hardware import HardwareProfile
from ..workload import AttentionConfig

LoopOrder = Literal["flash1", "flash2"]
GridOrder = Literal["q_fastest", "bh_fastest"]
QOrder = Literal["ascending", "descending"]


class Tiling(BaseModel):
    """Block sizes and schedule of a tiled (FlashAttention) kernel.

    - flash1: the paper's Algorithm 1. One thread block per (batch, head); outer loop over K/V blocks, inner over
      query blocks; O, l and m go back to HBM after every inner step (O in fp32 so re-reading it loses nothing).
    - flash2: FlashAttention-2. One thread block per (batch, head, query block); loop over K/V blocks; O written once.
    - stages: K/V buffers in shared memory; 2 or more overlaps the next tile's load with this tile's compute.
    - grid_order (flash2): `q_fastest` launches all query blocks of a head together (their K/V re-reads meet in
      L2), as FlashAttention-2's grid (q blocks, heads, batch) does; `bh_fastest` launches one query block of every
      head first.
    - kv_splits (flash2): each query block's K/V tiles are shared out among this many blocks, each writing a
      partial O and log-sum-exp in fp32 that a second kernel combines: FlashAttention-2's split-KV path
      (Flash-Decoding), which PyTorch takes when batch x heads x query blocks cannot fill the chip. Modelled
      only: gpu_kernels has no split kernel.
    - q_order (flash2): `descending` launches a head's last query block first. Under a causal mask the last
      blocks see the most keys, so the longest blocks start first and the short ones fill the last wave
      (longest-processing-time-first); FlashAttention-2 launches `ascending`. No effect on a full mask's work.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    block_q: int = Field(default=128, ge=1, le=4096)
    block_kv: int = Field(default=128, ge=1, le=4096)
    loop_order: LoopOrder = "flash2"
    warps: int = Field(default=4, ge=1, le=32)
    stages: int = Field(default=2, ge=1, le=8)
    grid_order: GridOrder = "q_fastest"
    q_order: QOrder = "ascending"
    kv_splits: int = Field(default=1, ge=1, le=1024)

    @classmethod
    def make(cls, **kw) -> "Tiling":
        try:
            return cls(**kw)
        except ValidationError as e:
            raise IosimError(one_line(e, "tiling")) from None

    @classmethod
    def practice(cls, cfg: AttentionConfig, loop_order: LoopOrder = "flash2") -> "Tiling":
        """FlashAttention-2's block sizes on A100/H100: 128x128 for d <= 64, 128x64 for d <= 128, 64x64 above."""
        d = cfg.head_dim
        bq, bkv = (128, 128) if d <= 64 else (128, 64) if d <= 128 else (64, 64)
        return cls(block_q=bq, block_kv=bkv, loop_order=loop_order, warps=4, stages=2)

    @classmethod
    def backward(cls, cfg: AttentionConfig, loop_order: LoopOrder = "flash2") -> "Tiling":
        """The backward kernels' blocks, FlashAttention-2's (`kernels.torch_fa2.backward_blocks`): 128 queries x
        128 keys up to d 64, 64 x 128 up to d 128, 64 x 64 above; 8 warps, each owning 16 of the block's keys."""
        from ..kernels.torch_fa2 import backward_blocks
        bq, bkv, warps = backward_blocks(cfg.head_dim)
        return cls(block_q=bq, block_kv=bkv, loop_order=loop_order, warps=warps, stages=2)

    @classmethod
    def paper(cls, cfg: AttentionConfig, hw: HardwareProfile, loop_order: LoopOrder = "flash1") -> "Tiling":
        """The paper's Algorithm 1 block sizes from SRAM size M (in elements): Bc = ceil(M/4d), Br = min(Bc, d)."""
        m_elems = hw.smem_per_block_bytes // cfg.elem_bytes
        bc = math.ceil(m_elems / (4 * cfg.head_dim))
        return cls(block_q=min(bc, cfg.head_dim), block_kv=bc, loop_order=loop_order, warps=4, stages=1)

    # ---- resources ---------------------------------------------------------------------------------
    @property
    def threads(self) -> int:
        return 32 * self.warps

    def smem_bytes(self, cfg: AttentionConfig) -> int:
        """Shared memory one thread block holds.

        flash2: a Q tile, and `stages` buffers of a K and a V tile. flash1: `stages` buffers of the inner step's Q
        tile, and one K and one V tile (the outer loop's, loaded once per K/V block); its fp32 O, m and l go
        between HBM and registers directly, as the kernel in gpu_kernels does.
        """
        d, e = cfg.head_dim, cfg.elem_bytes
        if self.loop_order == "flash2":
            return (self.block_q + self.stages * 2 * self.block_kv) * d * e
        return (self.stages * self.block_q + 2 * self.block_kv) * d * e

    def check_fits(self, cfg: AttentionConfig, hw: HardwareProfile) -> None:
        """Refuse, with the numbers, a tiling whose shared memory or threads exceed the chip's per-block limit."""
        need = self.smem_bytes(cfg)
        if need > hw.smem_per_block_bytes:
            raise IosimError(
                f"tiling {self.describe()} needs {need / 1024:.1f} KiB of shared memory per block at "
                f"head_dim={cfg.head_dim} {cfg.dtype}; {hw.key} allows {hw.smem_per_block_kib:g} KiB per block "
                f"(smaller block_q/block_kv or fewer stages would fit)")
        if self.threads > hw.max_threads_per_block:
            raise IosimError(f"tiling uses {self.threads} threads per block; {hw.key} allows "
                             f"{hw.max_threads_per_block}")

    def fits(self, cfg: AttentionConfig, hw: HardwareProfile) -> bool:
        try:
            self.check_fits(cfg, hw)
        except IosimError:
            return False
        return True

    def shrunk_to_fit(self, cfg: AttentionConfig, hw: HardwareProfile) -> "Tiling":
        """This tiling if it fits `hw`, else the first that does halving block_kv, then block_q (down to 16); the
        same if none does (check_fits then says why)."""
        t = self
        while not t.fits(cfg, hw) and (t.block_kv > 16 or t.block_q > 16):
            t = t.model_copy(update={"block_kv": t.block_kv // 2} if t.block_kv >= t.block_q and t.block_kv > 16
                             else {"block_q": t.block_q // 2})
        return t if t.fits(cfg, hw) else self

    def describe(self) -> str:
        return (f"{self.loop_order} {self.block_q}x{self.block_kv} {self.warps}w {self.stages}st"
                + ("" if self.grid_order == "q_fastest" else " bh-fastest")
                + ("" if self.q_order == "ascending" else " q-descending")
                + ("" if self.kv_splits == 1 else f" {self.kv_splits} kv-splits"))
