"""How many steps a flash3 block is folded into changes its predicted time: a folded step's loads come before its
compute, and with one block an SM nothing else runs meanwhile. B2 H16 N8192 d128 bf16 (a calibration record of
reports/measurements/h100_flash3), h100_sxm with the H200's behaviour carried, flash3's fitted traits, with
`Flash3Kernel.least_steps` (16, chosen from this) set aside:

    python experiments/flash3_model/steps.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from iosim.engine import simulate  # noqa: E402
from iosim.hardware import load_profile  # noqa: E402
from iosim.kernels.catalogue import planned, run_traits  # noqa: E402
from iosim.plan.flash3 import Flash3Kernel  # noqa: E402
from iosim.transfer import transferred  # noqa: E402
from iosim.workload import AttentionConfig  # noqa: E402


def main() -> None:
    moved = transferred(load_profile("h100_sxm"))
    hw = moved.profile
    cfg = AttentionConfig.make(batch=2, heads=16, seqlen_q=8192, head_dim=128, dtype="bf16")
    family, tiling = planned("flash3", cfg, None, hw.sm_count)
    traits = run_traits("flash3", cfg, tiling, moved.traits, hw.clock_hz)
    Flash3Kernel.least_steps = 0
    times = {n: simulate(cfg, family, hw, tiling, traits=traits, cold_l2=True, max_steps=n).time_s for n in (4, 16, 64)}
    for n, t in times.items():
        print(f"max_steps {n:3}: {t * 1e6:8.1f} us  ({t / times[16]:.3f}x the 16-step time)")


if __name__ == "__main__":
    main()
