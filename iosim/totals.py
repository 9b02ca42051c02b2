"""Totals over a result's kernels, shared by the analytic model's `Analysis` and the engine's `SimResult`."""
from __future__ import annotations


class Totals:
    """Needs `kernels`, each with mma_flops, exp_ops, other_flops; and the owner's hbm_read/write_bytes."""

    kernels: list

    def _sum(self, attr: str) -> int:
        return sum(getattr(k, attr) for k in self.kernels)

    @property
    def mma_flops(self) -> int:
        return self._sum("mma_flops")

    @property
    def exp_ops(self) -> int:
        return self._sum("exp_ops")

    @property
    def other_flops(self) -> int:
        return self._sum("other_flops")

    @property
    def hbm_bytes(self) -> int:
        return self.hbm_read_bytes + self.hbm_write_bytes

    @property
    def intensity(self) -> float:
        """Matmul FLOPs per HBM byte."""
        return self.mma_flops / self.hbm_bytes if self.hbm_bytes else float("inf")
