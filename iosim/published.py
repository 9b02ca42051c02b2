"""Published speeds of chips iosim cannot measure, and its predictions of them.

A published set is what a paper or a project's benchmark reports for one GPU: the source (repository, file,
commit, paper), the chip, the shapes and how the figure counts FLOPs, and one record per bar (algorithm, shape,
TFLOP/s). They live in `reports/published/*.json` and are data, not measurements of ours: nothing is fitted on
them. `score` predicts each record on the profile the set names, with the H200's fitted traits carried to it
(`iosim.transfer`; or on the datasheet's peak rates, no traits), and sets the predicted time beside the published
one, time = FLOPs / (TFLOP/s).
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .engine import simulate
from .errors import IosimError, one_line
from .hardware import load_profile
from .kernels.catalogue import planned, run_traits
from .plan.eager import FLASH_BENCHMARK, MEASURED
from .transfer import transferred
from .workload import AttentionConfig

PUBLISHED = Path(__file__).resolve().parent.parent / "reports" / "published"
# the published algorithm -> the algorithm whose plan and traits iosim predicts it with: FlashAttention-2's
# kernels at its tiling as PyTorch runs them, and PyTorch's eager attention (its GEMMs, mask, softmax and their
# backward). PyTorch's SDPA flash backend copies O and dO into FlashAttention-2's layout around the backward;
# FlashAttention-2's own benchmark calls its interface on tensors already in that layout, so those copies
# (`NOT_RUN`) are left out of the predicted time
# FlashAttention-3 is planned as iosim's flash3, its design (wgmma, TMA, warp-specialised ping-pong), and cuDNN's
# forward as PyTorch's cuDNN backend (`plan.flash3.CudnnFwdKernel`); where a plan refuses a record (d 256: flash3's
# tiles' shared memory), the record is listed unpredicted, with the reason
PLANS = {"flash2": "torch_flash", "standard": "torch_naive", "flash3": "flash3", "cudnn": "torch_cudnn"}
NOT_RUN = {"flash2": ("sdpa_copy",)}
# standard attention in both papers' figures is `attention_pytorch` of FlashAttention's benchmark scripts, under the
# PyTorch of its day: its own eager program (`plan.eager.FLASH_BENCHMARK`), not the one measured as torch_naive
PROGRAMS = {"standard": FLASH_BENCHMARK}
# the forward + backward FLOPs a figure counts, in units of the forward's 4 B H N^2 d (FlashAttention-2's
# benchmarks/benchmark_flash_attention.py: the backward 2.5 times the forward)
PASS_FLOPS = {"forward": 1.0, "backward": 2.5, "forward+backward": 3.5}


class PublishedRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")
    algorithm: Literal["flash2", "standard", "flash3", "cudnn"]
    panel: str
    batch: int = Field(ge=1, le=1 << 20)
    heads: int = Field(ge=1, le=1 << 12)
    seqlen: int = Field(ge=1, le=1 << 22)
    head_dim: int = Field(ge=8, le=512)
    causal: bool
    tflops: float = Field(gt=0, le=1e5)


class PublishedSet(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    gpu: str
    profile: str
    dtype: Literal["fp16", "bf16"]
    pass_: Literal["forward", "backward", "forward+backward"] = Field(alias="pass")
    source: dict
    records: list[PublishedRecord] = Field(min_length=1)


def load(paths: list[Path] | None = None) -> list[PublishedSet]:
    """The published sets of `paths` (files), or of every file in reports/published/."""
    files = paths if paths is not None else sorted(PUBLISHED.glob("*.json"))
    if not files:
        raise IosimError(f"no published-results files in {PUBLISHED} (they live in the source checkout); "
                         "name one")
    out = []
    for f in files:
        try:
            doc = json.loads(Path(f).read_text())
            out += [PublishedSet.model_validate(s) for s in doc["sets"]]
        except FileNotFoundError:
            raise IosimError(f"published file not found: {f}") from None
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise IosimError(f"{f}: not a published-results file ({e})") from None
        except ValidationError as e:
            raise IosimError(f"{f}: {one_line(e)}") from None
    return out


def config(s: PublishedSet, r: PublishedRecord) -> AttentionConfig:
    return AttentionConfig(batch=r.batch, heads=r.heads, seqlen_q=r.seqlen, head_dim=r.head_dim, dtype=s.dtype,
                           causal=r.causal, **{"pass": s.pass_})


def flops(s: PublishedSet, r: PublishedRecord) -> float:
    """The FLOPs the figure counts for the record: 4 B H N^2 d a forward, halved when causal."""
    fwd = 4 * r.batch * r.heads * r.seqlen ** 2 * r.head_dim / (2 if r.causal else 1)
    return PASS_FLOPS[s.pass_] * fwd


def score(sets: list[PublishedSet], progress=lambda pairs: pairs, traits: bool = True) -> list[dict]:
    """Each record's published and predicted seconds and the relative error (predicted / published - 1), with the
    H200's traits carried to each set's profile (traits=False: the datasheet's peak rates, no traits). `progress`
    wraps the (set, record) pairs as they are predicted (a progress bar). A record iosim's plan refuses keeps
    its row, predicted None, with the refusal as `not_planned`."""
    rows, profiles = [], {}
    for s, r in progress([(s, r) for s in sets for r in s.records]):
        if s.profile not in profiles:
            hw = load_profile(s.profile)
            profiles[s.profile] = transferred(hw) if traits else None, hw
        moved, hw = profiles[s.profile]
        cfg = config(s, r)
        pub = flops(s, r) / (r.tflops * 1e12)
        alg = PLANS[r.algorithm]
        family, tiling = planned(alg, cfg, None, hw.sm_count)
        if moved:
            hw = moved.profile
            kt = run_traits(alg, cfg, tiling, moved.traits, hw.clock_hz)
        else:
            kt = None
        row = {"gpu": s.gpu, "profile": s.profile, "algorithm": r.algorithm, "panel": r.panel,
               "config": cfg.label(), "published_tflops": r.tflops, "published_s": pub}
        try:
            res = simulate(cfg, family, hw, tiling, traits=kt, program=PROGRAMS.get(r.algorithm, MEASURED))
        except IosimError as e:
            rows.append(row | {"predicted_s": None, "predicted_tflops": None, "error": None, "not_planned": str(e)})
            continue
        pred = res.time_s - sum(k.time_s for k in res.kernels if k.name in NOT_RUN.get(r.algorithm, ()))
        rows.append(row | {"predicted_s": pred, "predicted_tflops": flops(s, r) / pred / 1e12, "error": pred / pub - 1})
    return rows


def summary(rows: list[dict]) -> dict[tuple[str, str], dict]:
    """Per (GPU, algorithm): how many were predicted, the median and max |relative time error|, and the median
    signed one (records not planned are left out)."""
    out = {}
    for key in sorted({(r["gpu"], r["algorithm"]) for r in rows if r["error"] is not None}):
        errs = [r["error"] for r in rows if (r["gpu"], r["algorithm"]) == key and r["error"] is not None]
        out[key] = {"n": len(errs), "time_median": statistics.median(abs(e) for e in errs),
                    "time_max": max(abs(e) for e in errs), "signed_median": statistics.median(errs)}
    return out
