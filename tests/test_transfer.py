"""Fitted traits carried to chips they were not fitted on (iosim.transfer): the shares and per-clock rates carried,
the traits made to fit, against what an H100 measured (experiments/transfer/h100_2026-12-06)."""
from __future__ import annotations

from pathlib import Path

import pytest

from iosim import fit
from iosim.cli import main
from iosim.errors import IosimError
from iosim.hardware import load_profile
from iosim.transfer import FULL_RATE_INSTRUCTION_SHARE, SOURCE, carried_profile, transferred

ROOT = Path(__file__).resolve().parent.parent
CARRIED = ("tensor_fp16_tflops", "tensor_bf16_tflops", "hbm_bandwidth_gb_s", "l2_bandwidth_gb_s", "l2_latency_ns",
           "sfu_ops_per_clk_per_sm", "smem_bandwidth_bytes_per_clk_per_sm", "kernel_launch_us", "l2_dirty_mib")


def test_carried_to_its_own_datasheet_the_source_is_itself():
    cal = load_profile(SOURCE)
    prof, how = carried_profile(load_profile("h200_sxm"))
    for f in CARRIED + ("kernel_floor_us", "code_cache_kib", "code_fetch_gb_s", "hbm_latency_ns"):
        assert getattr(prof, f) == pytest.approx(getattr(cal, f), rel=1e-9), f
        assert f in how and prof.sources[f].startswith("estimate:")


def test_an_h100_is_predicted_from_the_h200s_shares_close_to_what_it_measured():
    # what `iosim calibrate` measured on an H100 80GB HBM3, 2026-12-06, never used by the transfer
    measured = load_profile(ROOT / "experiments/transfer/h100_2026-12-06/h100_sxm.calibrated.toml")
    prof, _ = carried_profile(load_profile("h100_sxm"))
    assert prof.tensor_fp16_tflops == pytest.approx(measured.tensor_fp16_tflops, rel=0.02)   # mma.sync: 625 vs 619
    assert prof.hbm_bandwidth_gb_s == pytest.approx(measured.hbm_bandwidth_gb_s, rel=0.02)   # copy: 2977 vs 3022
    assert prof.l2_latency_ns == pytest.approx(measured.l2_latency_ns, rel=0.05)
    assert prof.hbm_bandwidth_gb_s < load_profile("h100_sxm").hbm_bandwidth_gb_s             # a share, not the peak


def test_on_sm80_mma_sync_is_the_full_rate_path_and_cublas_efficiencies_follow():
    a100 = load_profile("a100_80gb")
    moved = transferred(a100)
    sheet = load_profile("h200_sxm")
    # mma.sync on sm_80 runs as wgmma alone does on an H100 (976 of 989 TFLOP/s), not as cuBLAS's GEMM does
    assert moved.profile.tensor_fp16_tflops == pytest.approx(a100.tensor_fp16_tflops * FULL_RATE_INSTRUCTION_SHARE)
    assert 0.98 < FULL_RATE_INSTRUCTION_SHARE < 1.0
    fitted = fit.load(load_profile(SOURCE))
    cal = load_profile(SOURCE)
    # cuBLAS's GEMMs keep the share of the dense rate they reached on the H200, our kernels their mma.sync share
    gemm_share = fitted["naive"].mma_efficiency * cal.tensor_fp16_tflops / sheet.tensor_fp16_tflops
    assert moved.traits["naive"].mma_efficiency * moved.profile.tensor_fp16_tflops / a100.tensor_fp16_tflops \
        == pytest.approx(gemm_share)
    assert moved.traits["flash2"].mma_efficiency == fitted["flash2"].mma_efficiency
    # CUTLASS's alignment-1 GEMMs are sm_75 mma.sync code, not cuBLAS's wgmma kernels: their share is mma.sync's
    for fam in ("cublas_align1_qk", "cublas_align1_pv", "cublas_align1_pv_nt"):
        assert moved.traits[fam].mma_efficiency == fitted[fam].mma_efficiency
        assert moved.traits[fam].operand_bytes_per_cycle == fitted[fam].operand_bytes_per_cycle
    # fixed costs are clocks: slower clock, longer overhead
    assert moved.traits["flash2"].block_overhead_s == pytest.approx(
        fitted["flash2"].block_overhead_s * cal.sm_clock_mhz / a100.sm_clock_mhz)


def test_validate_with_transferred_traits_runs_and_refuses_mixed_flags(capsys):
    with pytest.raises(SystemExit) as e:
        main(["validate", "--records", str(ROOT / "reports/measurements/h100_transfer"), "-p", "h100_sxm",
              "--transfer", "--no-fit"])
    assert e.value.code == 2 and "--transfer" in capsys.readouterr().err


def _simulate_json(capsys, *flags):
    import json
    main(["simulate", "--batch", "8", "--heads", "16", "-n", "2048", "-d", "64", "--json", *flags])
    cap = capsys.readouterr()
    return json.loads(cap.out), cap.err


def test_predictions_with_measured_traits_carry_their_error_band(capsys):
    peak, _ = _simulate_json(capsys, "-p", "h100_sxm")
    moved, err = _simulate_json(capsys, "-p", "h100_sxm", "--traits", "measured")
    assert peak["error_band"] is None
    band = moved["error_band"]
    assert band["source"] == "h200_sxm.calibrated" and 0 < band["median"] <= band["max"] and band["n"] > 0
    assert "traits carried from h200_sxm.calibrated" in err and "median |time error|" in err
    assert moved["time_s"] > 1.1 * peak["time_s"]        # a full grid: the kernels' measured shares of peak
    # the calibrated H200 runs its own fitted traits; a family the study has no figure for says so
    own, err = _simulate_json(capsys, "-p", "h200_sxm.calibrated", "--traits", "measured")
    assert own["error_band"]["source"] == "h200_sxm.calibrated" and "fitted on this chip" in err
    _, err = _simulate_json(capsys, "-p", "a100_80gb", "-a", "flash1", "--traits", "measured")
    assert "no measured error band" in err


def test_a_measured_profile_is_not_carried_onto(capsys):
    # the calibrated H200's rates are measured: carrying the shares onto them would count them twice (30-50% slow)
    with pytest.raises(IosimError, match="holds measured rates"):
        carried_profile(load_profile("h200_sxm.calibrated"))
    with pytest.raises(SystemExit) as e:
        main(["validate", "--records", str(ROOT / "reports/measurements/h200_holdout"), "-p", "h200_sxm.calibrated",
              "--transfer"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("iosim: error:") and "h200_sxm" in err and len(err.splitlines()) == 1
