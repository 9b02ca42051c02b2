"""What a simulation returns: per-kernel and total bytes, work, time, utilisation, and an optional timeline."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..totals import Totals


@dataclass
class KernelResult:
    name: str
    start_s: float
    end_s: float
    blocks: int
    blocks_per_sm: int
    hbm_read: Counter = field(default_factory=Counter)    # bytes per tensor
    hbm_write: Counter = field(default_factory=Counter)   # written back during the kernel, per tensor
    l2_read_bytes: int = 0
    l2_write_bytes: int = 0
    l2_hit_bytes: int = 0
    l2_miss_bytes: int = 0
    l2_fabric_bytes: int = 0   # crossings between L2 partitions (read misses and writes homed in the far one)
    l2_repeat_bytes: int = 0   # launch-wave reads of lines other blocks read at the same time (see run.py)
    # what `iosim.counters` reads to count as Nsight does: the kernel's code read through L2, each partial-sector
    # write (bytes, requests a sector), a block's query rows and the share of misses and writes crossing partitions
    code_bytes: int = 0
    partial_writes: list = field(default_factory=list)
    rows_per_block: int = 1
    far_share: float = 0.0
    l2_local_bytes: int = 0    # register spills written through L1 to L2 (in l2_write_bytes too)
    l2_atomic_bytes: int = 0   # read-modify-writes performed in L2 (in l2_write_bytes too)
    sram_bytes: int = 0
    mma_flops: int = 0
    exp_ops: int = 0
    other_flops: int = 0
    utilisation: dict[str, float] = field(default_factory=dict)

    @property
    def time_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def hbm_read_bytes(self) -> int:
        return sum(self.hbm_read.values())

    @property
    def hbm_write_bytes(self) -> int:
        return sum(self.hbm_write.values())

    sm_count: int = 0

    @property
    def waves(self) -> float:
        """Blocks over the blocks the chip holds at once."""
        return self.blocks / (self.blocks_per_sm * self.sm_count) if self.blocks_per_sm and self.sm_count else 0.0

    @property
    def bound(self) -> str:
        """The busiest of HBM, L2 and the SMs' compute; 'latency' when none is even half busy (too few blocks,
        pipeline start-up, launch overhead)."""
        u = {k: v for k, v in self.utilisation.items() if k in ("hbm", "l2", "compute")}
        name = max(u, key=u.get)
        return name if u[name] >= 0.5 else "latency"

    def as_dict(self) -> dict:
        return {"name": self.name, "time_s": self.time_s, "start_s": self.start_s, "blocks": self.blocks,
                "blocks_per_sm": self.blocks_per_sm, "waves": self.waves,
                "hbm_read_bytes": self.hbm_read_bytes, "hbm_write_bytes": self.hbm_write_bytes,
                "hbm_read_per_tensor": dict(self.hbm_read), "hbm_write_per_tensor": dict(self.hbm_write),
                "l2_read_bytes": self.l2_read_bytes, "l2_write_bytes": self.l2_write_bytes,
                "l2_hit_bytes": self.l2_hit_bytes, "l2_miss_bytes": self.l2_miss_bytes,
                "l2_fabric_bytes": self.l2_fabric_bytes, "l2_repeat_bytes": self.l2_repeat_bytes,
                "l2_local_bytes": self.l2_local_bytes,
                "sram_bytes": self.sram_bytes,
                "matmul_flops": self.mma_flops, "exp_ops": self.exp_ops, "other_flops": self.other_flops,
                "utilisation": self.utilisation, "bound": self.bound}


@dataclass
class Timeline:
    """Per block: (SM, kernel, start, end, block number in launch order); per tier: busy spans."""
    blocks: list[tuple[int, str, float, float, int]] = field(default_factory=list)
    tiers: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"blocks": [dict(zip(("sm", "kernel", "start_s", "end_s", "block"), b))
                           for b in self.blocks],
                "tiers": {k: [list(x) for x in v] for k, v in self.tiers.items()}}


@dataclass
class SimResult(Totals):
    algorithm: str
    profile: str
    config_label: str
    l2_enabled: bool
    kernels: list[KernelResult]
    hbm_flush_bytes: Counter       # dirty bytes written back outside any kernel (at the end; between kernels if cold_l2)
    peak_footprint_bytes: int
    events: int
    timeline: Timeline | None = None
    # how the figures were obtained where not from every block (`engine.scale`): None for an exact simulation
    scaled: str | None = None

    @property
    def time_s(self) -> float:
        return self.kernels[-1].end_s if self.kernels else 0.0

    @property
    def hbm_read_bytes(self) -> int:
        return self._sum("hbm_read_bytes")

    @property
    def hbm_write_bytes(self) -> int:
        """Written to HBM during the run plus the final write-back of what L2 still held dirty."""
        return self._sum("hbm_write_bytes") + sum(self.hbm_flush_bytes.values())

    @property
    def l2_bytes(self) -> int:
        return self._sum("l2_read_bytes") + self._sum("l2_write_bytes")

    @property
    def l2_fabric_bytes(self) -> int:
        return self._sum("l2_fabric_bytes")

    @property
    def l2_counted_bytes(self) -> int:
        """What Nsight Compute's lts__t_bytes counts: the SMs' requests plus the crossings between L2 partitions."""
        return self.l2_bytes + self.l2_fabric_bytes

    @property
    def sram_bytes(self) -> int:
        return self._sum("sram_bytes")

    def per_tensor(self) -> dict[str, tuple[int, int]]:
        r, w = Counter(), Counter(self.hbm_flush_bytes)
        for k in self.kernels:
            r.update(k.hbm_read)
            w.update(k.hbm_write)
        return {t: (r[t], w[t]) for t in sorted(set(r) | set(w)) if r[t] or w[t]}

    @property
    def bound(self) -> str:
        """The bound of the kernel that takes most of the time."""
        return max(self.kernels, key=lambda k: k.time_s).bound if self.kernels else "-"

    def as_dict(self) -> dict:
        return {"algorithm": self.algorithm, "profile": self.profile, "config": self.config_label,
                "l2": self.l2_enabled, "time_s": self.time_s, "hbm_read_bytes": self.hbm_read_bytes,
                "hbm_write_bytes": self.hbm_write_bytes, "hbm_bytes": self.hbm_bytes, "l2_bytes": self.l2_bytes,
                "l2_fabric_bytes": self.l2_fabric_bytes, "hbm_flush_bytes": sum(self.hbm_flush_bytes.values()),
                "matmul_flops": self.mma_flops,
                "exp_ops": self.exp_ops, "other_flops": self.other_flops, "sram_bytes": self.sram_bytes,
                "intensity_flop_per_byte": self.intensity, "bound": self.bound,
                "peak_hbm_footprint_bytes": self.peak_footprint_bytes,
                "hbm_bytes_per_tensor": {t: {"read": r, "write": w} for t, (r, w) in self.per_tensor().items()},
                "kernels": [k.as_dict() for k in self.kernels], "events": self.events,
                "scaled": self.scaled}
