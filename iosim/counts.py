"""One kernel's exact counts in the two-level model: HBM bytes per tensor, and its work."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from .hardware import HardwareProfile


@dataclass
class KernelCounts:
    name: str
    hbm_read: Counter = field(default_factory=Counter)
    hbm_write: Counter = field(default_factory=Counter)
    mma_flops: int = 0
    exp_ops: int = 0
    other_flops: int = 0
    recompute_flops: int = 0   # of mma_flops, those recomputing what the forward computed (a tiled backward's S)

    @property
    def read_bytes(self) -> int:
        return sum(self.hbm_read.values())

    @property
    def write_bytes(self) -> int:
        return sum(self.hbm_write.values())

    @property
    def hbm_bytes(self) -> int:
        return self.read_bytes + self.write_bytes

    def roofline(self, hw: HardwareProfile, dtype: str) -> dict[str, float]:
        """Seconds each resource needs on its own; the largest is the bound."""
        return {"hbm": self.hbm_bytes / hw.hbm_bytes_per_s,
                "tensor": self.mma_flops / hw.tensor_flops_per_s(dtype),
                "exp": self.exp_ops / hw.exp_per_s,
                "fp32": self.other_flops / hw.fp32_flops_per_s}
