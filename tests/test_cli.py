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


def test_compare_json_and_flags(capsys):
    code, out, _ = run(capsys, "compare", "--profile", "h200_sxm", "--seqlen", "4096", "--head-dim", "128",
                       "--causal", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["config"]["seqlen_q"] == 4096 and d["config"]["causal"] is True
    assert d["tiling"]["block_kv"] == 64
    assert d["naive"]["hbm_bytes"] > d["flash2"]["hbm_bytes"] and d["speedup"] > 1


@pytest.mark.parametrize("argv, words", [
    (["compare", "--batch", "-1"], "batch"),
    (["compare", "--profile", "nope"], "unknown profile"),
    (["compare", "--head-dim", "512"], "KiB of shared memory"),
    (["compare", "--seqlen", "abc"], "invalid int value"),
    (["compare", "--heads", "16", "--kv-heads", "3"], "multiple of kv_heads"),
    (["compare", "--tiling", "best"], "--tiling"),
    (["profiles", "show", "nope"], "unknown profile"),
    (["frobnicate"], "invalid choice"),
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
