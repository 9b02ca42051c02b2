"""Per-kernel fits (`iosim.fit_kernels`): samples from calibration records only, and a fit that recovers what
made the times."""
from __future__ import annotations

from dataclasses import replace

import pytest

from iosim import fit, fit_kernels as fk
from iosim.hardware import load_profile
from iosim.plan import Traits
from iosim.records import load_all


@pytest.fixture(scope="module")
def setting():
    hw = load_profile("h200_sxm.calibrated")
    recs = [r for r in load_all() if r["algorithm"] == "torch_naive" and r["config"]["pass"] == "forward"]
    return hw, recs, fit.load(hw)


def test_samples_come_from_calibration_records_whose_kernels_match(setting):
    hw, recs, fitted = setting
    samples = fk.kernel_samples(recs, hw, fitted)
    n_cal = sum(r["set"] == "calibration" for r in recs)
    assert len(samples["eager_scale"]) >= n_cal        # one a record, two where S passes 2^31 elements
    assert len(samples["eager_softmax_warp"]) > 0 and not samples["flash2_bwd"]
    bare = [dict(r, set="validation") for r in recs]
    assert all(not v for v in fk.kernel_samples(bare, hw, fitted).values())


def test_fit_recovers_the_bytes_in_flight_that_made_the_times(setting):
    hw, recs, fitted = setting
    samples = fk.kernel_samples(recs, hw, fitted)["eager_masked_fill"][:4]
    truth = Traits(bytes_in_flight=fk.FLIGHTS[9], block_overhead_s=1e-6)
    made = [(k, dt, fk.kernel_time(k, dt, hw, replace(k.traits, bytes_in_flight=truth.bytes_in_flight,
                                                         block_overhead_s=truth.block_overhead_s)))
            for k, dt, _ in samples]
    entry = fk.fit_family("eager_masked_fill", made, hw, fitted)
    assert entry["traits"]["bytes_in_flight"] == truth.bytes_in_flight
    assert entry["traits"]["block_overhead_s"] == pytest.approx(1e-6)
    assert entry["calibration_median_time_error"] < 1e-9 and entry["calibration_kernels"] == 4


def test_our_backward_kernels_are_their_own_families():
    # iosim's flash2 backward plans the same kernels as PyTorch's FlashAttention-2 but runs other builds: its
    # samples go to the iosim_* families, never to FlashAttention-2's
    hw = load_profile("h200_sxm.calibrated")
    recs = [r for r in load_all() if r["algorithm"] in ("flash2", "flash1", "naive") and r["config"]["pass"] != "forward"]
    samples = fk.kernel_samples(recs, hw, fit.load(hw))
    assert samples["iosim_flash2_bwd"] and samples["iosim_bwd_dot"] and samples["iosim_softmax_bwd"]
    assert not samples["flash2_bwd"] and not samples["flash2_bwd_dot"]
    assert all(k.name == "flash2_bwd" for k, _, _ in samples["iosim_flash2_bwd"])
