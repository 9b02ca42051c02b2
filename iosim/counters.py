"""How Nsight Compute counts L2 bytes (`lts__t_bytes`), apart from what the chip does.

The engine times and counts the requests a plan makes; a profiler's counter sees some requests less and some more
than that. None of it is a fact of the chip, and none of it changes a prediction's time: it is applied only where
a prediction is held against Nsight Compute (`iosim.validate`), from what the engine recorded of each kernel:
- a grid's first wave asks for the same K/V lines from many SMs at once, and L2 merges part of those requests
  before it counts them (`merge_share` of the repeats it sees, one block an SM on every SM; scaled by the blocks an
  SM and the SMs streaming: `merged_share`);
- our kernels write O from their mma fragments, two requests a 32-byte sector, and L2 counts only a share of the
  second (`partial_write_share`, or a kernel's own where its traffic merges more of them);
- each GPC's instruction cache fetches a kernel's code from L2 again (`code_readers`).
With `NsightCounters()` (a chip nobody measured) L2 counts the bytes requested.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from .engine.result import KernelResult, SimResult


class NsightCounters(BaseModel):
    """How Nsight Compute's L2 counter sees one chip's requests; each value with its source."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    merge_share: float | None = Field(default=None, gt=0, le=1, description="share of a first wave's repeated "
                                      "reads that L2 counts, one block an SM on every SM; None: all")
    partial_write_share: float | None = Field(default=None, ge=0, le=1, description="share of the later requests "
                                              "writing parts of one sector that L2 counts; None: L2 counts bytes")
    kernel_partial_write_share: dict[str, float] = Field(default_factory=dict, description="a kernel's own share "
                                                         "where its traffic merges more of them (kernel name ->)")
    code_readers: int = Field(default=1, ge=1, le=64, description="caches that each fetch a kernel's code from L2")
    sources: dict[str, str] = Field(default_factory=dict)


H200 = NsightCounters(
    merge_share=0.3, partial_write_share=0.63, kernel_partial_write_share={"flash1_fwd": 0.26}, code_readers=8,
    sources={
        "merge_share": "estimate: fitted 2026-12-08 on the calibration records' L2 bytes (flash2 and PyTorch's "
                       "flash kernel, 87 records; validation set not read): least mean absolute error (9.8%; 27.0% "
                       "counting every request) over shares 0.05-1 (experiments/l2_counters/fit_l2_merge.py)",
        "partial_write_share": "measured: 2026-12-02, our flash2 writing O from its mma fragments: L2 counted 0.37-0.89 "
                               "of the second requests over 6 grids without register spills, median 0.63 "
                               "(lts__t_sectors_srcunit_tex_op_write; experiments/l2_counters/l2_writes.sh)",
        "kernel_partial_write_share": "measured: 2026-12-02, flash1 amid its own fp32 O, m and l traffic: 0.01-0.34 "
                                      "over six grids, median 0.26 (experiments/l2_counters/l2_writes.sh SET=flash1)",
        "code_readers": "measured: 2026-12-02, L2 requests from the GPCs' caches (lts__t_sectors_srcunit_gcc) 8 x the "
                        "kernel's .text plus 18-19 KB on grids of 2 to 8,192 blocks (experiments/l2_counters/"
                        "l2_writes.sh SET=sources); GH100's 8 GPCs",
    })

# Nsight Compute 2025.3.1 on these chips, by profile key (a calibrated profile shares its chip's)
# the H100 SXM is the same GH100 die (two L2 partitions, 8 GPCs): its counters are taken as the H200's, not measured
BY_CHIP = {"h200_sxm": H200, "h100_sxm": H200}


def for_profile(key: str) -> NsightCounters:
    """The counters measured on the chip of profile `key` ('h200_sxm', 'h200_sxm.calibrated'); else plain bytes."""
    return BY_CHIP.get(key.split(".")[0], NsightCounters())


def merged_share(k: KernelResult, c: NsightCounters) -> float:
    """Share of a kernel's first-wave repeated reads that L2's counters do not see. Repeats merge while they queue
    for L2, so more merge the faster each stream asks for lines and the more SMs stream
    (experiments/l2_counters/l2_merge_h200_2026-12-01): the share is counted for the reference, one block an SM on
    every SM; k blocks an SM split their SM's rate, and S SMs streaming queue S / (S + 16) of what all do (half on 16
    SMs, from the same measurements). The tile does not enter: tiles of 64x64 and 128x128 at d 64 and 128x64 at
    d 128, each read by 16 blocks one an SM on 128 SMs, were counted at 0.28, 0.29 and 0.29 (its `load` set)."""
    if c.merge_share is None or not k.l2_repeat_bytes:
        return 0.0
    per_sm = min(k.blocks_per_sm, -(-k.blocks // k.sm_count))   # the first wave fills each SM's k slots in turn
    sms = min(k.sm_count, k.blocks)
    load = sms / (sms + 16) / (k.sm_count / (k.sm_count + 16))
    return min(1.0, (1.0 - c.merge_share) * load / per_sm)


def kernel_l2_bytes(k: KernelResult, c: NsightCounters) -> int:
    """`lts__t_bytes` of one kernel: its requests, less the first wave's merged repeats, plus the partial-sector
    writes' second requests L2 counts and the code each other GPC fetches, plus the crossings between L2's
    partitions of all of it."""
    n = k.l2_read_bytes + k.l2_write_bytes + k.l2_fabric_bytes
    n -= round(k.l2_repeat_bytes * merged_share(k, c))
    n += k.code_bytes * (c.code_readers - 1)
    share = c.kernel_partial_write_share.get(k.name, c.partial_write_share)
    if share is not None:
        for size, requests in k.partial_writes:   # n requests a sector: the first counts whole
            counted = round(size * (1 + (requests - 1) * share))
            n += counted - size + round(k.far_share * counted) - round(k.far_share * size)
    return n


def l2_bytes(r: SimResult, c: NsightCounters) -> int:
    """What Nsight Compute's `lts__t_bytes` would count for a simulated run, summed over its kernels."""
    return sum(kernel_l2_bytes(k, c) for k in r.kernels)
