import json

import pytest

from iosim.cli import main


def run(capsys, *argv):
    code = 0
    try:
        main(list(argv))
    except SystemExit as e:
        code = e.code
    c = capsys.readouterr()
    return code, c.out, c.err


def test_compare_default_is_the_paper_layer_on_a100(capsys):
    code, out, _ = run(capsys, "compare")
    assert code == 0
    assert "B64 H16 N1024 d64 fp16 on a100_40gb" in out
    for row in ("matmul FLOPs", "HBM total", "intensity", "bound", "predicted time", "peak HBM footprint"):
        assert row in out
    # the README shows exactly what it prints
    from pathlib import Path
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    shown = readme.split("What the first prints:\n\n```\n", 1)[1].split("```", 1)[0]
    assert [line.rstrip() for line in shown.splitlines()] == [line.rstrip() for line in out.splitlines()]


def test_compare_json_and_flags(capsys):
    code, out, _ = run(capsys, "compare", "--profile", "h200_sxm", "--batch", "2", "--seqlen", "4096",
                       "--head-dim", "128", "--causal", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["config"]["seqlen_q"] == 4096 and d["config"]["causal"] is True
    assert d["tiling"]["block_kv"] == 64
    assert d["naive"]["hbm_bytes"] > d["flash2"]["hbm_bytes"] and d["speedup"] > 1


@pytest.mark.parametrize("argv, words", [
    (["compare", "--batch", "-1"], "batch"),
    (["compare", "--profile", "nope"], "unknown profile"),
    (["compare", "--head-dim", "512", "--block-q", "64", "--block-kv", "64"], "KiB of shared memory"),
    (["compare", "--seqlen", "abc"], "invalid int value"),
    (["compare", "--heads", "16", "--kv-heads", "3"], "multiple of kv_heads"),
    (["compare", "--tiling", "best"], "--tiling"),
    (["profiles", "show", "nope"], "unknown profile"),
    (["frobnicate"], "invalid choice"),
    (["simulate", "-a", "flash3"], "no wgmma_fp16_tflops"),               # the default profile is an A100
    (["simulate", "-a", "flash3", "-p", "h100_sxm", "--block-q", "64"], "drop --block-q"),
    (["simulate", "-a", "flash3", "-p", "h100_sxm", "--pass", "train"], "forward pass only"),
    (["compare", "--tiled", "flash3", "-p", "h100_sxm", "--dtype", "fp32"], "fp16 and bf16"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, words):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert err.count("\n") == 1 and words in err and "Traceback" not in err


def test_profiles_list_and_show(capsys):
    code, out, _ = run(capsys, "profiles")
    assert code == 0 and "h200_sxm" in out and "a100_40gb" in out
    code, out, _ = run(capsys, "profiles", "show", "h200_sxm")
    assert code == 0 and "measured: 2026-11-30" in out.replace("\n", " ").replace("│", " ").replace("  ", " ")


def test_compare_uses_the_engine_by_default_and_the_analytic_model_on_request(capsys):
    _, out, _ = run(capsys, "compare", "--json", "--batch", "2")
    engine = json.loads(out)
    _, out, _ = run(capsys, "compare", "--json", "--batch", "2", "--analytic")
    analytic = json.loads(out)
    assert engine["model"] == "engine, with L2" and analytic["model"].startswith("analytic")
    assert "l2_bytes" in engine["flash2"] and "l2_bytes" not in analytic["flash2"]
    _, out, _ = run(capsys, "compare", "--json", "--batch", "2", "--no-l2")
    assert json.loads(out)["naive"]["hbm_bytes"] == analytic["naive"]["hbm_bytes"]


def test_simulate_prints_kernels_and_writes_a_timeline_without_overwriting(capsys, tmp_path):
    code, out, _ = run(capsys, "simulate", "-a", "naive", "--batch", "2", "-p", "h200_sxm")
    assert code == 0 and "naive_qk" in out and "naive_softmax" in out and "naive_pv" in out
    f = tmp_path / "tl.json"
    code, out, _ = run(capsys, "simulate", "--batch", "2", "--timeline", str(f))
    assert code == 0 and json.loads(f.read_text())["blocks"]
    f.write_text("mine")
    code, _, err = run(capsys, "simulate", "--batch", "2", "--timeline", str(f))
    assert code == 2 and "--force" in err and f.read_text() == "mine"
    code, _, _ = run(capsys, "simulate", "--batch", "2", "--timeline", str(f), "--force")
    assert code == 0 and f.read_text() != "mine"
    code, out, _ = run(capsys, "simulate", "--batch", "2", "--json")
    d = json.loads(out)
    assert d["algorithm"] == "flash2" and d["kernels"][0]["name"] == "flash2_fwd"


def test_simulate_names_the_blocks_each_pass_runs(capsys):
    # the backward runs FlashAttention-2's blocks (8 warps at d 64), not the forward's tiling
    code, out, _ = run(capsys, "simulate", "--batch", "1", "--heads", "2", "--seqlen", "256", "--pass", "train")
    assert code == 0 and "forward flash2 128x128 4w 2st, backward flash2 128x128 8w 2st" in out
    code, out, _ = run(capsys, "simulate", "--batch", "1", "--heads", "2", "--seqlen", "256", "--pass", "backward",
                       "--json")
    d = json.loads(out)
    assert code == 0 and d["backward_tiling"]["warps"] == 8 and d["tiling"]["warps"] == 4
    code, out, _ = run(capsys, "simulate", "--batch", "1", "--heads", "2", "--seqlen", "256", "--json")
    assert json.loads(out)["backward_tiling"] is None


def test_naive_at_misaligned_rows_says_its_prediction_is_fast(capsys):
    # at N 999 cuBLAS runs alignment-1 GEMMs, which without fitted traits run at peak rates
    args = ("compare", "--profile", "h200_sxm", "--batch", "1", "--heads", "2", "--head-dim", "64")
    _, _, err = run(capsys, *args, "--seqlen", "999")
    assert "alignment-1" in err and "999 x 999" in err
    _, _, err = run(capsys, *args, "--seqlen", "1000")   # 2000-byte rows: 16-byte aligned
    assert "alignment-1" not in err
    _, _, err = run(capsys, *args, "--seqlen", "1000", "--dtype", "fp32")
    assert "alignment-1" not in err
    _, _, err = run(capsys, *args, "--seqlen", "999", "--naive", "eager")   # PyTorch's eager GEMMs are cuBLAS's too
    assert "eager: at 999 x 999" in err


def test_flash3_is_predicted_on_hopper_at_wgmmas_rate(capsys):
    args = ("--profile", "h100_sxm", "--batch", "2", "--heads", "16", "--seqlen", "4096", "--head-dim", "128", "--json")
    code, out, _ = run(capsys, "simulate", "-a", "flash3", *args)
    f3 = json.loads(out)
    assert code == 0 and f3["kernels"][0]["name"] == "flash3_fwd" and f3["tiling"]["warps"] == 12
    code, out, _ = run(capsys, "simulate", "-a", "flash2", *args)
    f2 = json.loads(out)
    # at the chip's peak rates both are compute-bound; flash3's larger tiles and wgmma's operands read from shared
    # memory once per warpgroup make it the faster, on about the same DRAM reads
    assert f3["time_s"] < f2["time_s"]
    assert f3["hbm_read_bytes"] == pytest.approx(f2["hbm_read_bytes"], rel=0.05)   # other blocks, other L2 hits
    code, out, _ = run(capsys, "compare", "--tiled", "flash3", *args)
    assert code == 0 and json.loads(out)["speedup"] > 1
