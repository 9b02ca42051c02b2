"""Every failure a user can cause is one line naming the file, field or path and the rule, exit status 2; nothing
is written half-way; an accepted input is honoured, never ignored; bad data never passes validation."""
import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from iosim.cli import main
from iosim.errors import IosimError

ROOT = Path(__file__).resolve().parent.parent
RECORD = next((ROOT / "reports/measurements/h200").glob("B1_H1_N256_d64_fp16__flash2_64x64_*.json"))


def run(capsys, *argv):
    """(exit status, stdout, stderr) of `iosim argv`; anything but SystemExit is a traceback and fails here."""
    code = 0
    try:
        main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    c = capsys.readouterr()
    return code, c.out, c.err


def one_line_error(capsys, *argv, says: str = "") -> str:
    code, _, err = run(capsys, *argv)
    assert code == 2 and err.startswith("iosim: error: ") and err.count("\n") == 1, (argv, code, err)
    assert says in err, (argv, err)
    return err


# ---- the file system --------------------------------------------------------------------------------------

def test_timeline_paths_that_cannot_be_written(capsys, tmp_path):
    small = ["simulate", "--batch", "1", "--heads", "1", "--seqlen", "256"]
    one_line_error(capsys, *small, "--timeline", tmp_path / "no" / "t.json", says="no directory")
    one_line_error(capsys, *small, "--timeline", tmp_path, says="is a directory")
    one_line_error(capsys, *small, "--timeline", "/proc/iosim_timeline.json", says="cannot write")
    (tmp_path / "t.json").write_text("mine")
    one_line_error(capsys, *small, "--timeline", tmp_path / "t.json", says="--force")
    assert (tmp_path / "t.json").read_text() == "mine"   # not overwritten without asking
    assert run(capsys, *small, "--timeline", tmp_path / "t.json", "--force")[0] == 0
    assert json.loads((tmp_path / "t.json").read_text())["blocks"]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]   # written whole, by a rename


def test_report_out_that_cannot_take_pages(capsys, tmp_path):
    (tmp_path / "file").write_text("x")
    one_line_error(capsys, "report", "--out", tmp_path / "file", "--records", "", says="is a file")
    one_line_error(capsys, "report", "--out", "/proc/iosim_site", "--records", "", says="cannot")
    one_line_error(capsys, "report", "--check", "--out", tmp_path / "empty", says="no pages")


# ---- stored records ---------------------------------------------------------------------------------------

def _bad_record(tmp_path, change) -> Path:
    rec = json.loads(RECORD.read_text())
    text = change(rec)
    folder = tmp_path / "records"
    folder.mkdir(exist_ok=True)
    (folder / "r.json").write_text(text if isinstance(text, str) else json.dumps(rec))
    return folder


@pytest.mark.parametrize("change, says", [
    (lambda r: "{not json", "not valid JSON"),
    (lambda r: "[1, 2]", "not a measurement record"),
    (lambda r: r.pop("config"), "field 'config'"),
    (lambda r: r["ncu"].update(duration_s="fast"), "field 'ncu.duration_s'"),
    (lambda r: r["ncu"].update(duration_s=0.0), "time in seconds"),
    (lambda r: r["ncu"].update(duration_s=r["ncu"]["duration_s"] * 1e6), "must be seconds"),
    (lambda r: [r[k].update({f: r[k][f] * 1e6}) for k, f in (("ncu", "duration_s"), ("time", "median_s"))],
     "microseconds read as seconds"),
    (lambda r: r["time"].update(median_s=float("nan")), "field 'time.median_s'"),
    (lambda r: r["ncu"].update(l2_bytes=0), "field 'ncu.l2_bytes'"),
    (lambda r: r["ncu"].update(dram_read_bytes=0, dram_write_bytes=0), "no measurement"),
    (lambda r: r.update(set="training"), "field 'set'"),
    (lambda r: r.pop("time"), "field 'time' is missing"),
])
def test_validate_refuses_a_bad_record_naming_it(capsys, tmp_path, change, says):
    folder = _bad_record(tmp_path, change)
    err = one_line_error(capsys, "validate", "--records", folder, "--set", "all", says=says)
    assert "r.json" in err


def test_a_missing_or_corrupt_traits_file_is_refused_not_ignored(capsys, tmp_path):
    folder = _bad_record(tmp_path, lambda r: None)   # one good record
    one_line_error(capsys, "validate", "--records", folder, "--traits", tmp_path / "none.json",
                   says="no fitted traits file")
    (tmp_path / "bad.json").write_text('{"kernels": 3}')
    one_line_error(capsys, "validate", "--records", folder, "--traits", tmp_path / "bad.json",
                   says="not a fitted traits file")
    assert run(capsys, "validate", "--records", folder, "--set", "all")[0] == 0


def test_an_error_that_cannot_be_computed_never_passes_a_threshold():
    from iosim.validate import over_thresholds
    assert over_thresholds({("validation", "flash2"): {"time_median": math.nan}}, {"time_median": 0.05})
    assert not over_thresholds({("validation", "flash2"): {"time_median": 0.01}}, {"time_median": 0.05})


# ---- inputs honoured or refused ---------------------------------------------------------------------------

def test_kv_splits_with_flash1_is_refused(capsys):
    one_line_error(capsys, "compare", "--tiled", "flash1", "--kv-splits", "4", says="kv_splits")


def test_max_steps_below_three_and_fp8_without_fp8_cores_are_refused_at_once(a100):
    from iosim.analytic import analyze
    from iosim.engine import simulate
    from iosim.workload import AttentionConfig
    for steps in (0, -1, 2):
        with pytest.raises(IosimError, match="max_steps"):
            simulate(AttentionConfig(batch=1, heads=1, seqlen_q=256), "flash2", a100, max_steps=steps)
    with pytest.raises(IosimError, match="no fp8 tensor cores"):
        analyze(AttentionConfig(dtype="fp8"), "flash2", a100)   # at the call, not when .time_s is read


def test_the_default_tiling_shrinks_to_one_that_fits_and_says_so(capsys, a100):
    from iosim.analytic import analyze
    from iosim.workload import AttentionConfig
    code, out, err = run(capsys, "compare", "--analytic", "--dtype", "fp32", "--head-dim", "128", "--json")
    assert code == 0 and "iosim: note: flash2 128x64" in err and "using flash2" in err
    used = json.loads(out)["tiling"]
    assert used["block_q"] * used["block_kv"] < 128 * 64
    # the API does the same with no tiling given; a tiling given that does not fit is still refused
    cfg = AttentionConfig(dtype="fp32", head_dim=128)
    assert analyze(cfg, "flash2", a100).tiling.smem_bytes(cfg) <= a100.smem_per_block_bytes
    one_line_error(capsys, "compare", "--dtype", "fp32", "--head-dim", "128", "--block-kv", "64",
                   says="KiB of shared memory")


def test_a_nan_in_a_profile_is_named_as_not_finite(capsys, tmp_path):
    text = (ROOT / "hw_profiles/a100_40gb.toml").read_text().replace("value = 1555", "value = nan", 1)
    (tmp_path / "p.toml").write_text(text)
    one_line_error(capsys, "compare", "--profile", tmp_path / "p.toml", says="finite number")


def test_a_huge_exact_grid_is_announced_before_it_runs_and_a_scaled_one_says_so(capsys, monkeypatch):
    from iosim.cli import console, layer
    monkeypatch.setattr(layer, "SLOW_BLOCKS", 100)
    assert console.SLOW_BLOCKS == 2_000_000
    code, _, err = run(capsys, "simulate", "--batch", "4", "--heads", "16", "--seqlen", "512", "--exact")
    assert code == 0 and "iosim: note: flash2 runs" in err and "thread blocks" in err
    code, _, err = run(capsys, "simulate", "--batch", "2048", "--heads", "16", "--seqlen", "1024")
    assert code == 0 and "extrapolated from runs of" in err and "--exact" in err


# ---- a hundred bad command lines, and random ones ---------------------------------------------------------

BAD_VALUES = {
    "--batch": ["0", "-3", "x", "1.5", "99999999999"], "--heads": ["0", "-1", "a"], "--kv-heads": ["0", "5", "z"],
    "--seqlen": ["0", "-8", "1e3", "99999999999"], "--seqlen-k": ["0", "q"], "--head-dim": ["0", "-64", "100000"],
    "--dtype": ["fp64", "int8", ""], "--profile": ["nope", "/no/such.toml", "h200"], "--tiling": ["best", ""],
    "--block-q": ["0", "-64", "x"], "--block-kv": ["0", "x", "100000"], "--warps": ["0", "-4", "x"],
    "--stages": ["0", "-1", "x"], "--grid-order": ["diagonal"], "--q-order": ["random"],
    "--kv-splits": ["0", "-2", "x"], "--pass": ["sideways"],
}


def test_a_hundred_bad_command_lines_each_end_in_one_line(capsys):
    cases = [(cmd, flag, v) for cmd in ("compare", "simulate", "explain") for flag, vs in BAD_VALUES.items()
             for v in vs]
    cases += [("validate", "--set", "train"), ("validate", "--records", "/no/such"), ("fit", "--only", "flash3"),
              ("report", "--records", "/no/such"), ("measure", "--sweep", "/no/such.json")]
    assert len(cases) >= 100
    for case in cases:
        argv = list(case) + (["--analytic"] if case[0] == "compare" else [])
        if case[0] == "measure":
            argv += ["--out", "/tmp/iosim_never_written"]
        one_line_error(capsys, *argv)
    assert not Path("/tmp/iosim_never_written").exists()


values = st.one_of(st.integers(-10**12, 10**12).map(str), st.floats(allow_nan=True).map(str),
                   st.sampled_from(["", "x", "nan", "inf", "-0", "1e400", "fp16", "h200_sxm", "a100_40gb", "128"]))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(sorted(BAD_VALUES)), values), max_size=4))
def test_random_command_lines_never_end_in_a_traceback(capsys, flags):
    argv = ["compare", "--analytic"] + [x for flag, v in flags for x in (flag, v)]
    code, _, err = run(capsys, *argv)
    assert code in (0, 2), (argv, err)
    if code == 2:
        assert err.startswith("iosim: error: ") and err.count("\n") == 1, (argv, err)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(["batch", "heads", "kv_heads", "seqlen_q", "seqlen_k", "head_dim", "dtype",
                                        "causal", "block_q", "block_kv", "warps", "stages", "kv_splits", "unknown"]),
                       st.one_of(st.integers(-5, 1 << 20), st.floats(allow_nan=True), st.text(max_size=4),
                                 st.booleans(), st.none()), max_size=5))
def test_random_python_calls_are_valid_or_one_iosim_error(kw):
    from iosim.hardware import load_profile
    from iosim.plan import Tiling
    from iosim.workload import AttentionConfig
    cfg_keys = {"batch", "heads", "kv_heads", "seqlen_q", "seqlen_k", "head_dim", "dtype", "causal", "unknown"}
    try:
        cfg = AttentionConfig.make(**{k: v for k, v in kw.items() if k in cfg_keys})
        til = Tiling.make(**{k: v for k, v in kw.items() if k not in cfg_keys})
        til.shrunk_to_fit(cfg, load_profile("h200_sxm"))
    except IosimError as e:
        assert "\n" not in str(e)


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.one_of(st.none(), st.booleans(), st.floats(), st.integers(), st.text(max_size=5)),
                    lambda inner: st.one_of(st.lists(inner, max_size=3),
                                            st.dictionaries(st.sampled_from(
                                                ["key", "set", "algorithm", "config", "time", "ncu", "median_s",
                                                 "duration_s", "l2_bytes", "dram_read_bytes"]), inner, max_size=5)),
                    max_leaves=12))
def test_random_record_files_are_a_record_or_one_iosim_error(data):
    from iosim.records import check_record
    try:
        check_record(data, "r.json")
    except IosimError as e:
        assert "\n" not in str(e) and str(e).startswith("r.json")


def test_the_installed_commands_name_the_extras_not_a_checkout(capsys):
    try:
        import cupy  # noqa: F401
        pytest.skip("this machine has CuPy")
    except ImportError:
        pass
    err = one_line_error(capsys, "calibrate", "--out", "/tmp/iosim_never.toml")
    assert "checkout" not in err


def test_a_note_before_an_error_is_not_printed(capsys):
    # the default tiling shrinks for d 647 (a note), then naive's GEMM cannot fit: the error alone, one line
    code, _, err = run(capsys, "compare", "--analytic", "--head-dim", "647")
    assert code == 2 and err.startswith("iosim: error: ") and err.count("\n") == 1
