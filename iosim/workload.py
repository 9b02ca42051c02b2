"""What is computed: one attention layer's shapes, dtype, masking and pass.

Layout everywhere is (batch, heads, seq, head_dim), row-major. Causal masking is aligned to the bottom-right
corner, FlashAttention-2's convention: query row i sees key j when j <= i + (seqlen_k - seqlen_q). With
seqlen_q == seqlen_k that is the usual lower triangle; with seqlen_q > seqlen_k the first rows see no key at all
and their output is zero.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .errors import IosimError, one_line

Dtype = Literal["fp32", "fp16", "bf16", "fp8"]
Pass = Literal["forward", "backward", "forward+backward"]
PASS_NAMES = {"fwd": "forward", "bwd": "backward", "train": "forward+backward"}   # short names the CLI accepts

DTYPE_BYTES: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
STAT_BYTES = 4  # row statistics (m, l, log-sum-exp) are kept in fp32


class AttentionConfig(BaseModel):
    """One attention layer. `kv_heads` < `heads` is grouped-query attention (heads must be a multiple)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    batch: int = Field(default=64, ge=1, le=1 << 20)
    heads: int = Field(default=16, ge=1, le=1 << 12)
    kv_heads: int | None = Field(default=None, ge=1, le=1 << 12)
    seqlen_q: int = Field(default=1024, ge=1, le=1 << 24)
    seqlen_k: int | None = Field(default=None, ge=1, le=1 << 24)
    head_dim: int = Field(default=64, ge=1, le=1024)
    dtype: Dtype = "fp16"
    causal: bool = False
    pass_: Pass = Field(default="forward", alias="pass")

    @model_validator(mode="after")
    def _fill_defaults(self) -> "AttentionConfig":
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.seqlen_k is None:
            object.__setattr__(self, "seqlen_k", self.seqlen_q)
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        return self

    @classmethod
    def make(cls, **kw) -> "AttentionConfig":
        """Build from user input, turning validation errors into one-line IosimErrors."""
        try:
            return cls(**kw)
        except ValidationError as e:
            raise IosimError(one_line(e, "config")) from None

    # ---- derived sizes ---------------------------------------------------------------------------
    @property
    def elem_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def bh(self) -> int:
        """Number of (batch, query-head) pairs."""
        return self.batch * self.heads

    @property
    def group(self) -> int:
        """Query heads per key/value head."""
        return self.heads // self.kv_heads

    @property
    def causal_offset(self) -> int:
        return self.seqlen_k - self.seqlen_q

    def keys_seen(self, row: int) -> int:
        """How many keys query row `row` attends to."""
        if not self.causal:
            return self.seqlen_k
        return max(0, min(self.seqlen_k, row + self.causal_offset + 1))

    def tensor_bytes(self) -> dict[str, int]:
        """Bytes of each HBM tensor of the forward pass."""
        e, d = self.elem_bytes, self.head_dim
        return {
            "Q": self.bh * self.seqlen_q * d * e,
            "K": self.batch * self.kv_heads * self.seqlen_k * d * e,
            "V": self.batch * self.kv_heads * self.seqlen_k * d * e,
            "O": self.bh * self.seqlen_q * d * e,
            "S": self.bh * self.seqlen_q * self.seqlen_k * e,
            "P": self.bh * self.seqlen_q * self.seqlen_k * e,
            "L": self.bh * self.seqlen_q * STAT_BYTES,
        }

    def label(self) -> str:
        s = f"B{self.batch} H{self.heads}"
        if self.kv_heads != self.heads:
            s += f"/{self.kv_heads}kv"
        s += f" N{self.seqlen_q}" + (f"x{self.seqlen_k}" if self.seqlen_k != self.seqlen_q else "")
        s += f" d{self.head_dim} {self.dtype}" + (" causal" if self.causal else "")
        return s + {"forward": "", "backward": " bwd", "forward+backward": " fwd+bwd"}[self.pass_]

    @property
    def passes(self) -> tuple[str, ...]:
        """The passes that run, in order: a training step is the forward, then the backward."""
        return ("forward", "backward") if self.pass_ == "forward+backward" else (self.pass_,)

    def with_pass(self, p: str) -> "AttentionConfig":
        return self.model_copy(update={"pass_": p})


def sum_keys_seen(cfg: AttentionConfig, row_lo: int = 0, row_hi: int | None = None) -> int:
    """Sum over query rows [row_lo, row_hi) of the keys each sees, in closed form."""
    row_hi = cfg.seqlen_q if row_hi is None else row_hi
    if row_hi <= row_lo:
        return 0
    if not cfg.causal:
        return (row_hi - row_lo) * cfg.seqlen_k
    nk, off = cfg.seqlen_k, cfg.causal_offset
    # keys_seen(r) = clamp(r + off + 1, 0, nk): zero below r0, linear in between, nk from r1 on.
    r0 = max(row_lo, min(row_hi, -off))           # first row that sees a key
    r1 = max(r0, min(row_hi, nk - off - 1))       # first row that sees all keys
    lin = (r1 - r0) * (r0 + r1 - 1) // 2 + (r1 - r0) * (off + 1) if r1 > r0 else 0
    return lin + (row_hi - r1) * nk
