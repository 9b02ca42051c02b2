"""What a chip is: its tiers, rates and limits, each number with the source it came from.

A profile is a TOML file under hw_profiles/ where every quantity is written as
`field = { value = …, source = "kind: where it comes from" }`. `HardwareProfile` validates it; `load_profile`
finds one by name or path; `profile.replace(...)` makes a what-if variant ("this H100 with twice the SRAM").
"""
from __future__ import annotations

import re
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .errors import IosimError, one_line

# A source says what kind of evidence a number rests on; 'measured' must carry its date.
SOURCE_KINDS = ("datasheet", "whitepaper", "guide", "paper", "measured", "estimate", "what-if")
_SOURCE_RE = re.compile(rf"^({'|'.join(SOURCE_KINDS)}):\s*\S.*$")
_DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}")


class HardwareProfile(BaseModel):
    """A GPU as the model sees it. Units are in the field names; `sources` holds one source per number."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = Field(min_length=1)
    key: str = Field(default="custom", description="short name, the file's stem")
    arch: str | None = Field(default=None, pattern=r"^sm_\d{2,3}$", description="compute architecture "
                             "(sm_80, sm_90): which libraries' measured rules apply (kernels.cublas); absent: generic")
    sources: dict[str, str] = Field(default_factory=dict, repr=False)

    sm_count: int = Field(ge=1, le=1024)
    sm_clock_mhz: float = Field(ge=100, le=5000)
    smem_per_sm_kib: float = Field(gt=0, le=4096, description="shared memory (SRAM) usable per SM")
    smem_per_block_kib: float = Field(gt=0, le=4096, description="largest shared memory one block may opt in to")
    smem_reserved_per_block_kib: float = Field(ge=0, le=64, description="taken by the system from each resident block")
    smem_bandwidth_bytes_per_clk_per_sm: float = Field(gt=0, le=4096)
    registers_per_sm: int = Field(ge=1024, le=1 << 20)
    max_threads_per_sm: int = Field(ge=32, le=1 << 14)
    max_threads_per_block: int = Field(ge=32, le=1 << 12)
    max_blocks_per_sm: int = Field(ge=1, le=256)
    l2_capacity_mib: float = Field(ge=0, le=4096, description="0 turns L2 off: the paper's two-level model")
    l2_bandwidth_gb_s: float = Field(gt=0, le=1e6)
    l2_latency_ns: float = Field(ge=0, le=1e4)
    l2_partitions: int | None = Field(default=None, ge=1, le=16, description="L2 halves with their own home "
                                      "addresses (A100/H100: 2); absent: one")
    l2_dirty_mib: float | None = Field(default=None, gt=0, le=4096, description="written bytes L2 keeps before "
                                       "it writes the oldest back to HBM; absent: as many as it holds")
    hbm_capacity_gb: float = Field(gt=0, le=1e5)
    hbm_bandwidth_gb_s: float = Field(gt=0, le=1e6)
    hbm_latency_ns: float = Field(ge=0, le=1e5)
    tensor_fp16_tflops: float = Field(gt=0, le=1e5, description="dense, fp32 accumulate")
    tensor_bf16_tflops: float = Field(gt=0, le=1e5)
    tensor_tf32_tflops: float = Field(gt=0, le=1e5)
    tensor_fp8_tflops: float | None = Field(default=None, gt=0, le=1e5, description="absent where the chip has none")
    wgmma_fp16_tflops: float | None = Field(default=None, gt=0, le=1e5, description="dense fp16 rate of Hopper's "
                                            "asynchronous warpgroup matmul (wgmma); absent where the chip has none")
    wgmma_bf16_tflops: float | None = Field(default=None, gt=0, le=1e5)
    fp32_tflops: float = Field(gt=0, le=1e5, description="non-tensor fp32 FMA rate")
    sfu_ops_per_clk_per_sm: float = Field(gt=0, le=4096, description="special-function (exp2) results per clock")
    kernel_launch_us: float = Field(ge=0, le=1e4)
    kernel_floor_us: float | None = Field(default=None, ge=0, le=1e3, description="device time of a kernel that "
                                          "does nothing (Nsight's gpu__time_duration); absent: 0")
    l1_lines_per_clk_per_sm: float | None = Field(default=None, gt=0, le=64, description="global-memory lines "
                                                  "an SM's L1 looks up per clock (a warp instruction touching 8 "
                                                  "rows takes 8); absent: not limited")
    block_dispatch_ns: float | None = Field(default=None, ge=0, le=1e3, description="the chip's time to start one "
                                            "more thread block (its block scheduler's rate); absent: 0")
    gpc_count: int | None = Field(default=None, ge=1, le=64, description="graphics processing clusters: SMs "
                                  "that share one instruction cache in front of L2; absent: one")
    code_cache_kib: float | None = Field(default=None, gt=0, le=1024, description="machine code an SM runs "
                                         "without fetching it again (its instruction caches), KiB; absent: "
                                         "no first-wave code fetch is timed")
    code_fetch_gb_s: float | None = Field(default=None, gt=0, le=1e5, description="rate at which one GPC's cache "
                                          "serves its SMs the code beyond code_cache_kib when they all start a "
                                          "kernel's masked loop body at once (GB/s); absent: not timed")

    @model_validator(mode="after")
    def _consistent(self) -> "HardwareProfile":
        if self.smem_per_block_kib > self.smem_per_sm_kib:
            raise ValueError(
                f"smem_per_block_kib ({self.smem_per_block_kib:g}) must be <= smem_per_sm_kib ({self.smem_per_sm_kib:g})")
        if self.max_threads_per_block > self.max_threads_per_sm:
            raise ValueError("max_threads_per_block must be <= max_threads_per_sm")
        if self.l2_capacity_mib > 0 and self.l2_bandwidth_gb_s < self.hbm_bandwidth_gb_s:
            raise ValueError(
                f"l2_bandwidth_gb_s ({self.l2_bandwidth_gb_s:g}) must be >= hbm_bandwidth_gb_s "
                f"({self.hbm_bandwidth_gb_s:g}): L2 sits in front of HBM")
        missing = [f for f in self.quantity_fields() if getattr(self, f) is not None and f not in self.sources]
        if missing:
            raise ValueError(f"no source given for {', '.join(missing)}")
        for f, src in self.sources.items():
            if f not in self.quantity_fields():
                raise ValueError(f"source given for unknown field '{f}'")
            if not _SOURCE_RE.match(src):
                raise ValueError(f"source of '{f}' must start with one of {', '.join(SOURCE_KINDS)} and a colon, "
                                 f"got {src!r}")
            if src.startswith("measured:") and not _DATE_RE.search(src):
                raise ValueError(f"measured source of '{f}' must carry its date (YYYY-MM-DD)")
        return self

    # ---- what the rest of iosim reads -------------------------------------------------------------
    @classmethod
    def quantity_fields(cls) -> list[str]:
        return [f for f in cls.model_fields if f not in ("name", "key", "arch", "sources")]

    @property
    def clock_hz(self) -> float:
        return self.sm_clock_mhz * 1e6

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_bandwidth_gb_s * 1e9

    @property
    def l2_bytes_per_s(self) -> float:
        return self.l2_bandwidth_gb_s * 1e9

    @property
    def l2_bytes(self) -> int:
        return int(self.l2_capacity_mib * 2**20)

    @property
    def l2_far_share(self) -> float:
        """Share of addresses homed in another L2 partition than the requesting SM's: a read miss or a write to
        one crosses the partitions' fabric once more, and Nsight's lts__t_bytes counts that crossing."""
        return 1.0 - 1.0 / (self.l2_partitions or 1)

    @property
    def l2_dirty_bytes(self) -> int | None:
        return int(self.l2_dirty_mib * 2**20) if self.l2_dirty_mib else None

    @property
    def l2_holding_bytes(self) -> int:
        """Distinct bytes L2 holds: a partition keeps the lines its own SMs read, so a line homed in the other
        partition is held twice (there and at home). With the far share f of the lines read, the capacity holds
        capacity / (1 + f) distinct bytes (two partitions: two thirds)."""
        return int(self.l2_bytes / (1.0 + self.l2_far_share))

    @property
    def smem_per_sm_bytes(self) -> int:
        return int(self.smem_per_sm_kib * 1024)

    @property
    def smem_per_block_bytes(self) -> int:
        return int(self.smem_per_block_kib * 1024)

    @property
    def smem_bytes_per_s(self) -> float:
        """Whole-chip shared-memory bandwidth."""
        return self.smem_bandwidth_bytes_per_clk_per_sm * self.sm_count * self.clock_hz

    @property
    def l1_lines_per_s(self) -> float | None:
        """Whole-chip rate of L1 line lookups by global loads and stores (None: not limited)."""
        return self.l1_lines_per_clk_per_sm * self.sm_count * self.clock_hz if self.l1_lines_per_clk_per_sm else None

    @property
    def exp_per_s(self) -> float:
        return self.sfu_ops_per_clk_per_sm * self.sm_count * self.clock_hz

    @property
    def fp32_flops_per_s(self) -> float:
        return self.fp32_tflops * 1e12

    def tensor_flops_per_s(self, dtype: str, wgmma: bool = False) -> float:
        """Dense tensor-core rate for a dtype's matmuls (fp32 inputs run as tf32 on tensor cores): mma.sync's, or
        with `wgmma` the asynchronous warpgroup matmul's (fp16 and bf16)."""
        field = {"fp16": "tensor_fp16_tflops", "bf16": "tensor_bf16_tflops", "fp32": "tensor_tf32_tflops",
                 "fp8": "tensor_fp8_tflops"}[dtype]
        if wgmma:
            if dtype not in ("fp16", "bf16"):
                raise IosimError(f"wgmma is modelled for fp16 and bf16, not {dtype}")
            field = f"wgmma_{dtype}_tflops"
        rate = getattr(self, field)
        if rate is None:
            what = "wgmma (Hopper's asynchronous matmul)" if wgmma else f"{dtype} tensor cores"
            raise IosimError(f"profile '{self.key}' has no {what} ({field} is not given)")
        return rate * 1e12

    # ---- what-if -----------------------------------------------------------------------------------
    def replace(self, note: str = "", **changes: Any) -> "HardwareProfile":
        """A copy with some quantities changed; their sources say 'what-if'. Validated like a file."""
        unknown = [k for k in changes if k not in self.quantity_fields() and k != "name"]
        if unknown:
            raise IosimError(f"unknown profile field(s): {', '.join(unknown)}")
        sources = dict(self.sources)
        for k, v in changes.items():
            if k != "name":
                old = getattr(self, k)
                sources[k] = f"what-if: {v:g} instead of {old:g}" + (f" ({note})" if note else "") \
                    if isinstance(v, (int, float)) and isinstance(old, (int, float)) else f"what-if: {note or 'changed'}"
        data = self.model_dump() | changes | {"sources": sources}
        data.setdefault("name", self.name)
        if "name" not in changes:
            data["name"] = f"{self.name} (what-if)"
        try:
            return HardwareProfile(**data)
        except ValidationError as e:
            raise IosimError(one_line(e, f"what-if on '{self.key}'")) from None

    def scaled(self, **factors: float) -> "HardwareProfile":
        """A copy with quantities multiplied: `scaled(smem_per_sm_kib=2, smem_per_block_kib=2)`."""
        changes = {}
        for k, f in factors.items():
            if k not in self.quantity_fields():
                raise IosimError(f"unknown profile field: {k}")
            v = getattr(self, k)
            changes[k] = type(v)(v * f) if isinstance(v, int) and float(v * f).is_integer() else v * f
        return self.replace(note=", ".join(f"{k} x{f:g}" for k, f in factors.items()), **changes)


# ---- files -----------------------------------------------------------------------------------------

def profiles_dir() -> Path:
    """hw_profiles/ inside an installed wheel, else the one at the top of the source tree."""
    packaged = resources.files("iosim") / "hw_profiles"
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parent.parent / "hw_profiles"


def list_profiles() -> list[str]:
    return sorted(p.stem for p in profiles_dir().glob("*.toml"))


def parse_profile(text: str, where: str, key: str = "custom") -> HardwareProfile:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise IosimError(f"{where}: not valid TOML: {e}") from None
    data: dict[str, Any] = {"key": key, "sources": {}}
    for k, v in raw.items():
        if isinstance(v, dict):
            extra = set(v) - {"value", "source"}
            if "value" not in v or "source" not in v or extra:
                raise IosimError(f"{where}: field '{k}' must be {{ value = ..., source = \"kind: ...\" }}")
            data[k] = v["value"]
            data["sources"][k] = v["source"]
        else:
            data[k] = v
    try:
        return HardwareProfile(**data)
    except ValidationError as e:
        raise IosimError(one_line(e, where)) from None


def load_profile(name_or_path: str | Path) -> HardwareProfile:
    """A built-in profile by name ('h200_sxm') or any profile file by path."""
    p = Path(name_or_path)
    if p.suffix == ".toml" or p.exists():
        if not p.is_file():
            raise IosimError(f"profile file not found: {p}")
        return parse_profile(p.read_text(), str(p), key=p.stem)
    f = profiles_dir() / f"{name_or_path}.toml"
    if not f.is_file():
        raise IosimError(f"unknown profile '{name_or_path}'; known: {', '.join(list_profiles())} (or give a .toml path)")
    return parse_profile(f.read_text(), f"hw_profiles/{f.name}", key=f.stem)
