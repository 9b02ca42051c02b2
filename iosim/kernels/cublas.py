"""cuBLAS's GEMMs as naive attention runs them: which output tile cuBLAS picks on a chip, whether tiles of a cluster
share operand tiles, and how fast its Q K^T epilogue writes S.

The rules are keyed by the chip's architecture (`HardwareProfile.arch`). Measured on the H200 (sm_90), from the
stored records' kernel names: `HOPPER`. A chip without measured rules (the A100, a profile without `arch`) takes
`GENERIC`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Literal

from ..errors import IosimError
from ..workload import AttentionConfig

PV_KEYS = 64           # pv: keys of a P/V slice staged per pipeline stage


@dataclass(frozen=True)
class GemmTile:
    """A cuBLAS GEMM's output tile m x n (column-major: m the output's rows) and its cluster of cm x cn tiles.
    Tiles of one cluster with the same m-index share their A operand tile, those with the same n-index their B
    operand tile: each shared tile is loaded once for the cluster (multicast)."""
    m: int
    n: int
    cm: int = 1
    cn: int = 1
    # pipeline stages: 64-deep operand slices a block keeps in flight (cuBLAS's `_64x<stages>_`); the engine
    # issues a block's loads that many slices, less one, ahead of its matmul
    stages: int = 2

    def __post_init__(self) -> None:
        for f in ("m", "n", "cm", "cn"):
            v = getattr(self, f)
            if not isinstance(v, int) or not 1 <= v <= 4096:
                raise IosimError(f"GemmTile {f} must be an integer from 1 to 4096, got {v!r}")
        if not isinstance(self.stages, int) or not 1 <= self.stages <= 64:
            raise IosimError(f"GemmTile stages must be an integer from 1 to 64, got {self.stages!r}")

    def a_loads(self, cols: int) -> int:
        """Loads of one A operand tile over an output `cols` wide: one for each n-tile, once a cluster of cn."""
        return -(-(-(-cols // self.n)) // self.cn)

    def b_loads(self, rows: int) -> int:
        """Loads of one B operand tile over an output `rows` high: one for each m-tile, once a cluster of cm."""
        return -(-(-(-rows // self.m)) // self.cm)

    @classmethod
    def from_kernel_name(cls, name: str) -> "GemmTile | None":
        """The tile in a cuBLAS kernel's name: nvjet's `..._<m>x<n>_<k>x<stages>_<cm>x<cn>_...` or CUTLASS's
        `..._<m>x<n>_<k>x<stages>_...` (no cluster); None for any other name."""
        hit = re.search(r"nvjet_\w*?_(\d+)x(\d+)_\d+x(\d+)_(\d+)x(\d+)_", name)
        if hit:
            m, n, st, cm, cn = (int(x) for x in hit.groups())
            return cls(m, n, cm, cn, st)
        hit = re.search(r"cutlass_\w*?gemm_\w*?_(\d+)x(\d+)_\d+x(\d+)_", name)
        return cls(int(hit[1]), int(hit[2]), stages=int(hit[3])) if hit else None


def gemm_stages(cfg: AttentionConfig, kind: str, m: int, n: int, smem: int | None = None) -> int:
    """cuBLAS's pipeline depth for an m x n tile (the H200's records): as many stages of both operands as 200 KiB (or the
    SM's `smem` bytes, if fewer) hold, 2 to 16 (the stored records' names: 256x128 4, 64x128 8, 64x80 11, 64x8 and
    64x24 16)."""
    budget = 200 * 1024 if smem is None else min(200 * 1024, smem)
    return max(2, min(16, budget // (gemm_smem_bytes(cfg, kind, GemmTile(m, n)) // 2)))


def gemm_smem_bytes(cfg: AttentionConfig, kind: str, t: GemmTile) -> int:
    """Shared memory of a GEMM block: two pipeline stages of both operands (qk: 64-deep slices of d; pv: PV_KEYS
    keys of the n-row P strip and of V)."""
    e = cfg.elem_bytes
    if kind == "qk":
        return 2 * (t.m + t.n) * min(cfg.head_dim, 64) * e
    return 2 * (t.n + cfg.head_dim) * PV_KEYS * e


@dataclass(frozen=True)
class CublasRule:
    """What cuBLAS does on one architecture. `clusters`: thread-block clusters of two tiles that share their K (qk)
    or V (pv) tile and load it once by TMA multicast (sm_90 and later). `qk_store_rate`: the share of HBM's rate
    at which its Q K^T epilogue writes S (1: the memory, not the epilogue, sets the pace)."""
    arch: str
    clusters: bool
    qk_store_rate: float
    source: str


# torch.matmul's Q K^T writes S at 3,012-3,256 GB/s where the copy reaches 4,264 and a plain kernel writing the same
# 128x128 tiles 4,278-4,328 (experiments/hbm_rates): its epilogue's rate
HOPPER = CublasRule("sm_90", clusters=True, qk_store_rate=0.735,
                    source="measured: 2026-12-01, cuBLAS 13 kernel names of the stored H200 records; "
                           "experiments/hbm_rates for the epilogue")
# Any other chip: the same search for about one tile an SM, without clusters (thread-block clusters and TMA
# multicast are sm_90 features: each tile loads its own operands), its epilogue at the memory's pace (no measured
# limit). Deliberately plain: a chip's own rule replaces it once its cuBLAS kernels' names are on record
GENERIC = CublasRule("generic", clusters=False, qk_store_rate=1.0,
                     source="estimate: the H200's tile search without clusters; no epilogue limit")
RULES = {"sm_90": HOPPER}


@dataclass(frozen=True)
class Cublas:
    """cuBLAS on one chip: its rule, the SMs it spreads tiles over and the shared memory one GEMM block may take."""
    rule: CublasRule
    sm_count: int
    smem: int | None = None

    @property
    def enough(self) -> int:
        """Tiles that give about one an SM, as cuBLAS's tile search counts them: 15/16 of the SMs."""
        return self.sm_count * 15 // 16

    def tile(self, cfg: AttentionConfig, kind: Literal["qk", "pv"]) -> GemmTile:
        """cuBLAS's largest tile that still gives about one tile an SM (15/16 of the SMs), in clusters of two
        tiles sharing their K (qk) or V (pv) tile where the chip has clusters. Q K^T from 256 keys x 128 queries
        (128 x 128 in clusters of two key tiles for 256 queries or fewer), keys halved to 64 first, then queries
        down to 8; P V from all of d (128 at most) x 32768/d queries (512 at most), queries halved down to 8 (and
        to half the queries or fewer). Where two stages of a tile would not fit `smem`, smaller still."""
        nq, d = cfg.seqlen_q, cfg.head_dim
        smem, cl = self.smem, self.rule.clusters

        def few_or_big(m: int, n: int) -> bool:
            t = GemmTile(m, n)
            big = smem is not None and gemm_smem_bytes(cfg, kind, t) > smem
            return big or tile_count(cfg, kind, t) < self.enough
        if kind == "qk":
            m, n, cm, cn = (128, 128, 2, 1) if nq <= 256 else (256, 128, 1, 2)
            while few_or_big(m, n) and (m > 64 or n > 8):
                m, n = (m // 2, n) if m > 64 else (m, n // 2)
            return GemmTile(m, n, cm if cl else 1, cn if cl else 1, gemm_stages(cfg, kind, m, n, smem))
        m, n = min(d, 128), min(512, 32768 // d)
        while (2 * n > nq or few_or_big(m, n)) and n > 8:
            n //= 2
        return GemmTile(m, n, 1, 2 if cl else 1, gemm_stages(cfg, kind, m, n, smem))

    def tiles(self, cfg: AttentionConfig, given: dict[str, GemmTile] | None = None) -> dict[str, GemmTile]:
        """The qk and pv tiles: those given (a record's kernel names), else this chip's choice; without clusters
        where the N x N rows are misaligned (CUTLASS's alignment-1 kernels run there, sm_75 code that has none)."""
        given = given or {}
        unknown = set(given) - {"qk", "pv"}
        if unknown:
            raise IosimError(f"GEMM tiles are given for 'qk' and 'pv' only, got {', '.join(sorted(unknown))}")
        if rows_aligned(cfg):
            return {k: given.get(k) or self.tile(cfg, k) for k in ("qk", "pv")}
        return {k: replace(given[k], cm=1, cn=1) if given.get(k) else self.align1_tile(cfg, k) for k in ("qk", "pv")}

    def align1_tile(self, cfg: AttentionConfig, kind: Literal["qk", "pv"]) -> GemmTile:
        """CUTLASS's alignment-1 tile: the largest of `ALIGN1_TILES` that still gives half the SMs a tile, else the
        smallest (no clusters, two stages: sm_75 kernels)."""
        choices = ALIGN1_TILES[kind]
        if kind == "qk" and (cfg.head_dim < 128 or cfg.dtype != "bf16"):
            choices = choices[1:]
        for m, n in choices:
            if tile_count(cfg, kind, GemmTile(m, n)) >= self.sm_count // 2:
                break
        return GemmTile(m, n)

    def splits(self, cfg: AttentionConfig, kind: Literal["qk", "pv"], tiles: dict[str, GemmTile]) -> int:
        """The parts cuBLAS splits an alignment-1 GEMM's reduction into (a `splitKreduce_kernel` sums them after
        it): a pv GEMM (reduced over the keys) of fewer tiles than `enough` is split into parts enough for about two
        blocks an SM (`ALIGN1_SPLIT_WAVES`), 4 to 16; else 1. cuBLAS's own kernels (aligned rows) split inside one
        kernel (`plan.naive`: stream-K) and return 1."""
        if kind != "pv" or rows_aligned(cfg):
            return 1
        n = tile_count(cfg, kind, tiles[kind])
        if n >= self.enough:
            return 1
        want = min(ALIGN1_SPLITS[1], max(ALIGN1_SPLITS[0], round(ALIGN1_SPLIT_WAVES * self.sm_count / n)))
        return min(want, -(-cfg.seqlen_k // PV_KEYS))   # a key slice a part at least


# CUTLASS's sm75 alignment-1 tiles cuBLAS ran in the H200's calibration records, largest first (m x n as
# `GemmTile`): qk 256x128 (d 128 in bf16 only; 128x128 in fp16), 128x128 and 64x64; pv 128x128 and 64x64, the
# smaller where the larger leaves most SMs idle (B1 H1: qk 64x64 at N 999 d 128, 64 tiles of 128x128; pv 64x64 at
# N 999 and 3001, 8-24 tiles of 128x128). `experiments/cublas_alignment/splits.py`: 44 of the 50 GEMMs of the
# calibration records at the tile they ran (the others: d 64's transposed pv at 64x128, eager's dQ at 256x128)
ALIGN1_TILES = {"qk": ((256, 128), (128, 128), (64, 64)), "pv": ((128, 128), (64, 64))}
# Where and how far cuBLAS splits (`Cublas.splits`): the calibration records of two chips of 132 SMs, read back from
# the splitKreduce kernels' DRAM bytes (fp32 partials of the output, caches flushed before each kernel): on the
# H200 B1 H1 GEMMs of 16-47 tiles split in 8-16 parts, 128 tiles or more never; on an H100 (h100_align1, the same
# cuBLAS) GEMMs of 20-110 tiles split in 4-16 parts, those of 192 not; the parts about two blocks an SM (20 tiles:
# 13, 24: 11, 32: 8) down to 4-6 at 63-110 tiles
ALIGN1_SPLIT_WAVES = 2
ALIGN1_SPLITS = (4, 16)


def tile_count(cfg: AttentionConfig, kind: str, t: GemmTile) -> int:
    """Output tiles of a GEMM: qk over (keys / m) x (queries / n), pv over (d / m) x (queries / n), every head."""
    across = cfg.seqlen_k if kind == "qk" else cfg.head_dim
    return cfg.bh * -(-across // t.m) * -(-cfg.seqlen_q // t.n)


def rows_aligned(cfg: AttentionConfig) -> bool:
    """Whether the rows of the N x N matrices (S, P and their gradients) start on 16-byte boundaries, as cuBLAS's
    own kernels need. Where they do not, cuBLAS runs CUTLASS's alignment-1 kernels (an element a load): on the H200
    at N 999 and 3001 every GEMM, 3x slower by median than cuBLAS's own (experiments/cublas_alignment); iosim plans
    them as `plan.align1.Align1Gemm`, timed by their fitted traits where a profile has them."""
    return cfg.seqlen_q * cfg.elem_bytes % 16 == 0 and cfg.seqlen_k * cfg.elem_bytes % 16 == 0


def meets_align1(algorithm: str, cfg: AttentionConfig) -> bool:
    """Whether `algorithm`'s prediction at `cfg` meets cuBLAS's alignment-1 GEMMs (naive attention's and eager
    PyTorch's GEMMs are cuBLAS's), which without fitted traits run at the chip's peak rates: a fast prediction."""
    return algorithm in ("naive", "eager") and not rows_aligned(cfg)


def for_chip(hw) -> Cublas:
    """cuBLAS on `hw` (a HardwareProfile): its architecture's measured rule, else `GENERIC`; one GEMM block may
    take an SM's shared memory less what the system reserves for a block."""
    smem = hw.smem_per_sm_bytes - int(hw.smem_reserved_per_block_kib * 1024)
    return Cublas(RULES.get(hw.arch or "", GENERIC), hw.sm_count, smem)
