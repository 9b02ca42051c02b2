"""cuBLAS's GEMMs where the rows of their N x N operand are not 16-byte aligned (N not a multiple of 8 at fp16/bf16).

There cuBLAS cannot use its own kernels (TMA needs 16-byte strides) and runs CUTLASS's alignment-1 kernels: on the
H200, every GEMM of the stored records at N 999 and 3001 was `cutlass_75_tensorop_..._s1688gemm_..._align1`
(experiments/cublas_alignment). Such a kernel moves the N x N operand (S or dP written by `qk`; P or dS read by `pv`)
an element at a time, and its time is a sum: the matmul at a fraction of the tensor rate, then the operand's bytes at
a rate an SM sustains a clock (`Fitted.operand_bytes_per_cycle`), the one not hidden under the other. The two shapes
differ (writing the operand vs reading it) and are fitted apart, as families `cublas_align1_qk` and
`cublas_align1_pv`.

Planned as `NaiveKernel`'s GEMMs are, with what differs: no thread-block clusters (an sm_75 kernel has none, each
tile loads its operands: `Cublas.tiles`), no epilogue rate limit of cuBLAS's own kernels (the element-wise stores
are timed by the operand's rate), and each step's operand bytes as SM cycles after its matmul (`Step.pipe_cycles`:
the engine runs a step's matmul and its pipe cycles one after the other). A pv GEMM of few tiles (`Cublas.splits`)
is split over its keys as cuBLAS splits it: each of `splits` parts of the key loop writes its fp32 partial of the
output, and a row kernel after it (`Align1Gemm.reduce`: cuBLAS's `splitKreduce_kernel`) sums them; never
split in one kernel (stream-K) as cuBLAS's own kernels are. Approximated: the blocks are persistent as nvjet's are
(CUTLASS's are one a tile: the same work an SM over a grid of many tiles).
"""
from __future__ import annotations

from typing import Callable, Literal

import numpy as np

from ..kernels.cublas import Cublas, GemmTile, rows_aligned
from ..workload import AttentionConfig
from .kernel import KernelPlan, Step, Traits, fold, merged
from .naive import GEMM_MIN_STEPS, NaiveKernel
from .rows import RowIO, RowKernel

# by the GEMM's shape and CUTLASS's layout in its kernel's name: qk GEMMs run `tn` kernels; pv GEMMs `nn` or `nt`
# kernels, other compiled code, `nn` 15-32% slower on the same shape in the calibration records (B8 H16 N999: 246
# and 248 us against 188-214), whichever GEMM of the program each serves (`cublas_gemm`'s `layout`)
FAMILIES = {"qk": "cublas_align1_qk", "pv": "cublas_align1_pv", "pv_nt": "cublas_align1_pv_nt"}


REDUCE_FAMILY = "cublas_splitk_reduce"
# splitKreduce_kernel<32, 16, ...>: its template's 32 and 16 taken for a block of 32 x 16 threads, an output
# element each (not read off a launch)
REDUCE_THREADS = 512


class Align1Gemm(NaiveKernel):
    def __init__(self, cfg: AttentionConfig, kind: Literal["qk", "pv"], traits: Traits, cublas: Cublas,
                 tiles: dict[str, GemmTile] | None = None, names: dict[str, str] | None = None,
                 name: str | None = None, layout: str = "nn"):
        super().__init__(cfg, kind, traits, cublas, tiles, names, name)
        self.family = family_of(kind, layout)
        self.store_rate = 1.0
        # the operand's tensor: what qk writes, what pv reads
        self.operand = self._n("S") if kind == "qk" else self._n("P")
        self.splits = cublas.splits(cfg, kind, self.tiles)
        if kind == "pv":
            # items (split, strip), strips fastest (a split is the launch grid's z); split s covers key slices
            # [bounds[s], bounds[s + 1]), `split_slices` at most
            self.units_per_block = 0
            self.bounds = [s * self.g.n_kv // self.splits for s in range(self.splits + 1)]
            self.split_slices = -(-self.g.n_kv // self.splits)
            self.n_items = cfg.bh * self.g.n_q * self.splits
            self.n_blocks = min(cublas.sm_count, self.n_items)

    def lookahead(self, n_steps: int) -> int:
        if self.kind == "qk" or self.splits == 1:
            return super().lookahead(n_steps)
        slices = -(-self.n_items // self.n_blocks) * self.split_slices
        return max(1, -(-(self.tiles["pv"].stages - 1) * n_steps // max(1, slices)))

    def cohort(self, blocks: np.ndarray, max_steps: int) -> list[Step]:
        steps = self._split(blocks, max_steps) if self.kind == "pv" and self.splits > 1 else \
            super().cohort(blocks, max_steps)
        rate = self.traits.operand_bytes_per_cycle
        if rate:
            for s in steps:
                moved = s.stores if self.kind == "qk" else s.loads
                s.pipe_cycles += sum(a.requested for a in moved if a.tensor == self.operand) / rate
        return steps

    def _split(self, b: np.ndarray, max_steps: int) -> list[Step]:
        """Persistent members walk items m, m + P, ...; at its t-th item a member runs the item's key slices and
        then stores its fp32 partial, at `part_offset(split)` of the partials."""
        if len(b) != self.n_blocks or b[0] != 0:
            raise ValueError("a persistent GEMM's blocks run as one cohort")
        g, d = self.g, self.cfg.head_dim
        p, n, per, strips = self.n_blocks, self.n_items, self.split_slices, self.cfg.bh * self.g.n_q
        steps = []
        for u0, u1 in fold(-(-n // p) * per, max(max_steps, GEMM_MIN_STEPS)):
            firsts, counts, jls, jhs, done = [], [], [], [], []
            for t in range(u0 // per, (u1 - 1) // per + 1):
                lo_item, hi_item = p * t, min(p * t + p, n)
                for split in range(lo_item // strips, (hi_item - 1) // strips + 1):
                    a = max(lo_item, split * strips) - split * strips
                    z = min(hi_item, (split + 1) * strips) - split * strips
                    lo, hi = self.bounds[split], self.bounds[split + 1]
                    jl, jh = lo + max(u0 - t * per, 0), min(lo + u1 - t * per, hi)
                    if jl < jh:
                        firsts.append(a), counts.append(z - a), jls.append(jl), jhs.append(jh)
                    if u1 - t * per >= per and a < z:   # the item's last slice: its partial goes out
                        done.append((split, a, z))
            step = self._gemm_step(*(np.array(x, dtype=np.int64) for x in (firsts, counts, jls, jhs))) if firsts \
                else Step()
            step.stores = []
            for split, a, z in done:
                r0 = self._strip_row(np.arange(a, z))
                r1 = r0 + g.rows[np.arange(a, z) % g.n_q]
                off = self.part_offset(split)
                step.stores += merged(self._n("Opart"), off + r0 * d * 4, off + r1 * d * 4)
            steps.append(step)
        return steps

    def _strip_row(self, strip: np.ndarray) -> np.ndarray:
        g = self.g
        return (strip // g.n_q) * self.cfg.seqlen_q + (strip % g.n_q) * g.block_q

    def part_offset(self, split: int) -> int:
        """Where split `split`'s fp32 partial of the output starts: the partials one after another."""
        return split * self.cfg.bh * self.cfg.seqlen_q * self.cfg.head_dim * 4

    def reduce(self, traits: Traits) -> RowKernel:
        """cuBLAS's `splitKreduce_kernel` after this split GEMM: each output row reads its `splits` fp32 partials
        and writes the row in the input dtype."""
        cfg, d = self.cfg, self.cfg.head_dim
        rows = cfg.bh * cfg.seqlen_q
        k = RowKernel(f"{self.name}_reduce", rows,
                      [RowIO(self._n("Opart"), d * 4, offset=self.part_offset(s)) for s in range(self.splits)],
                      [RowIO(self._n("O"), d * cfg.elem_bytes)], traits,
                      rows_per_block=max(1, REDUCE_THREADS // d), threads=REDUCE_THREADS,
                      other_per_row=self.splits * d)
        k.family = REDUCE_FAMILY
        return k

    def partial_bytes(self) -> int:
        """Bytes of the fp32 partials (0 unsplit)."""
        return self.part_offset(self.splits) if self.splits > 1 else 0


def family_of(kind: str, layout: str = "nn") -> str:
    """The fitted family of an alignment-1 GEMM of `kind` whose kernel has CUTLASS's `layout` (pv: 'nn' or 'nt')."""
    if layout not in ("nn", "nt"):
        raise ValueError(f"layout must be 'nn' or 'nt', got {layout!r}")
    return FAMILIES["pv_nt" if kind == "pv" and layout == "nt" else kind]


def cublas_gemm(cfg: AttentionConfig, kind: Literal["qk", "pv"], traits: Traits,
                traits_of: Callable[[str], Traits], cublas: Cublas, tiles: dict[str, GemmTile] | None = None,
                names: dict[str, str] | None = None, name: str | None = None, layout: str = "nn") -> list[KernelPlan]:
    """The kernels cuBLAS runs for the GEMM `kind` in the shape `cfg` (attention's, or the key-major shape of a
    backward GEMM, whose N x N operand is read transposed): its own kernel with `traits` where the operand's rows are
    16-byte aligned, else an alignment-1 kernel with its family's traits (`traits_of`; a pv GEMM's by the `layout`
    its program's call gets), and after a split one its reduce kernel."""
    if rows_aligned(cfg):
        return [NaiveKernel(cfg, kind, traits, cublas, tiles, names, name)]
    gemm = Align1Gemm(cfg, kind, traits_of(family_of(kind, layout)), cublas, tiles, names, name, layout)
    return [gemm] + ([gemm.reduce(traits_of(REDUCE_FAMILY))] if gemm.splits > 1 else [])


def partials(kernels: list[KernelPlan]) -> dict[str, int]:
    """The fp32 partial tensors of the split GEMMs among `kernels` and their bytes."""
    return {k._n("Opart"): k.partial_bytes() for k in kernels if isinstance(k, Align1Gemm) and k.splits > 1}


def with_partials(kernels: list[KernelPlan], live: list[str]) -> list[list[str]]:
    """The tensors each of one GEMM's `kernels` holds: `live`, and a split GEMM's partials from it to its reduce."""
    return [live + list(partials(kernels))] * len(kernels)
