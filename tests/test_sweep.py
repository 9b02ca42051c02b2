"""`iosim sweep`: specs, what-ifs, resuming after a kill, and a Dask cluster giving what one process gives."""
import subprocess
import sys

import pytest

import iosim.sweep as sweep
from iosim.errors import IosimError
from iosim.sweep import Workers, parse_spec, points, run_sweep

SPEC = {
    "sweep": {"profiles": ["a100_80gb", "h100_sxm"], "algorithms": ["naive", "flash2"], "passes": ["fwd"]},
    "what_if": {"l2_capacity_mib": [20, 80], "scale": {"hbm_bandwidth_gb_s": [1, 2]}},
    "layers": [{"name": "small", "batch": 2, "heads": 4, "seqlen_q": [256, 512], "head_dim": 64,
                "causal": [False, True]},
               {"name": "too-big-tile", "batch": 1, "heads": 1, "seqlen_q": 128, "head_dim": 1024}],
}


def spec(**changes):
    raw = {k: (dict(v) if isinstance(v, dict) else list(v)) for k, v in SPEC.items()}
    for path, value in changes.items():
        table, _, key = path.partition(".")
        raw[table][key] = value
    return parse_spec(raw)


def test_a_spec_expands_to_the_product_of_its_profiles_what_ifs_layers_algorithms_and_passes():
    pts = points(spec())
    # 2 profiles x (2 x 2 what-ifs) x (4 + 1 layers) x 2 algorithms x 1 pass
    assert len(pts) == 2 * 4 * 5 * 2
    assert len({p["point_id"] for p in pts}) == len(pts)
    doubled = [p for p in pts if '"scale", 2' in p["what_if"] and p["profile"] == "h100_sxm"]
    assert doubled and all(p["hw"].hbm_bandwidth_gb_s == 2 * 3350 for p in doubled)
    assert all("what-if" in p["hw"].sources["hbm_bandwidth_gb_s"] for p in doubled)


@pytest.mark.parametrize("raw, field", [
    ({"sweep": {"profiles": ["h200_sxm"], "colour": 1}, "layers": [{}]}, "colour"),
    ({"sweep": {"profiles": ["h200_sxm"]}, "layers": [{}], "extra": {}}, "extra"),
    ({"sweep": {"profiles": ["h200_sxm"], "algorithms": ["flash4"]}, "layers": [{}]}, "flash4"),
    ({"sweep": {"profiles": ["h200_sxm"], "passes": ["sideways"]}, "layers": [{}]}, "sideways"),
    ({"sweep": {"profiles": ["h200_sxm"]}, "layers": [{"seqlen": 1024}]}, "seqlen"),
    ({"sweep": {"profiles": ["h200_sxm"]}, "what_if": {"l2_size": [1]}, "layers": [{}]}, "l2_size"),
    ({"sweep": {"profiles": ["h200_sxm"]}, "what_if": {"scale": {"warp_size": [2]}}, "layers": [{}]}, "warp_size"),
])
def test_a_bad_spec_is_one_line_naming_the_field(raw, field):
    with pytest.raises(IosimError) as e:
        points(parse_spec(raw))
    assert field in str(e.value) and "\n" not in str(e.value)


def test_an_impossible_what_if_names_the_field_and_its_range():
    with pytest.raises(IosimError) as e:
        points(spec(**{"what_if.l2_capacity_mib": [-5]}))
    assert "l2_capacity_mib" in str(e.value) and "greater than or equal to 0" in str(e.value)
    with pytest.raises(IosimError) as e:
        points(parse_spec({"sweep": {"profiles": ["h200_sxm"]}, "layers": [{"seqlen_q": 0}]}))
    assert "seqlen_q" in str(e.value)


def test_a_sweep_predicts_every_point_keeps_the_refused_with_their_reason_and_writes_its_files(tmp_path):
    df = run_sweep(spec(), tmp_path / "s", workers=1, progress=False)
    assert len(df) == 80 and list(df["point_id"]) == [p["point_id"] for p in points(spec())]
    refused = df[df["error"].notna()]
    assert set(refused["layer"]) == {"too-big-tile"} and len(refused) and refused["error"].str.contains("fit").all()
    ok = df[df["error"].isna()]
    assert (ok["time_s"] > 0).all() and (ok["hbm_bytes"] > 0).all()
    # more HBM bandwidth never makes a prediction slower
    key = ["profile", "layer", "seqlen_q", "causal", "algorithm"]
    by = ok.assign(l2=ok["what_if"].str.contains('"set", 80')).set_index(key + ["l2"])
    slow = by[by["what_if"].str.contains('"scale", 1')]["time_s"]
    fast = by[by["what_if"].str.contains('"scale", 2')]["time_s"]
    assert (fast.reindex(slow.index).to_numpy() <= slow.to_numpy() * 1.0001).all()
    for name in ("results.parquet", "results.csv", "sweep.html", "spec.json"):
        assert (tmp_path / "s" / name).stat().st_size > 0


def test_a_killed_sweep_keeps_what_it_finished_and_resumes_from_there(tmp_path, monkeypatch):
    out = tmp_path / "s"
    calls = []
    real = sweep._predict

    def dies_after_three(chunk, profiles):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(len(chunk))
        return real(chunk, profiles)
    monkeypatch.setattr(sweep, "FLUSH_S", 0.0)
    monkeypatch.setattr(sweep, "_predict", dies_after_three)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(spec(), out, workers=1, progress=False)
    kept = sum(calls)
    assert kept == 3 * sweep.CHUNK and len(list((out / "parts").glob("part-*.parquet"))) >= 1
    calls.clear()
    monkeypatch.setattr(sweep, "_predict", lambda chunk, profiles: calls.append(len(chunk)) or real(chunk, profiles))
    df = run_sweep(spec(), out, workers=1, progress=False)
    assert sum(calls) == 80 - kept                      # only what was left
    fresh = run_sweep(spec(), None, workers=1, progress=False)
    cols = [c for c in df.columns if c != "predict_s"]
    assert df[cols].equals(fresh[cols])


def test_a_folder_of_another_sweep_is_refused_unless_forced(tmp_path):
    out = tmp_path / "s"
    run_sweep(spec(**{"sweep.profiles": ["h200_sxm"]}), out, workers=1, progress=False, page=False)
    with pytest.raises(IosimError, match="another spec"):
        run_sweep(spec(), out, workers=1, progress=False)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(IosimError, match="not a sweep"):
        run_sweep(spec(), tmp_path / "mine", workers=1, progress=False)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    df = run_sweep(spec(), out, workers=1, progress=False, force=True, page=False)
    assert len(df) == 80


def test_a_two_worker_dask_cluster_gives_what_one_process_gives():
    s = spec(**{"sweep.profiles": ["h200_sxm"]})
    one = run_sweep(s, None, workers=1, progress=False)
    two = run_sweep(s, None, workers=2, progress=False)
    cols = [c for c in one.columns if c != "predict_s"]
    assert one[cols].equals(two[cols])


def test_an_unreachable_scheduler_is_one_line_naming_its_address():
    with pytest.raises(IosimError) as e:
        with Workers(scheduler="tcp://127.0.0.1:9"):
            pass
    assert "tcp://127.0.0.1:9" in str(e.value) and "\n" not in str(e.value)


def test_the_cli_prints_an_example_spec_that_sweeps(tmp_path):
    run = [sys.executable, "-c", "from iosim.cli import main; main()"]
    text = subprocess.run(run + ["sweep", "--example"], capture_output=True, text=True, check=True).stdout
    import tomllib
    assert len(points(parse_spec(tomllib.loads(text)))) > 100
    bad = tmp_path / "bad.toml"
    bad.write_text('[sweep]\nprofiles = ["h200_sxm"]\nalgoritms = ["naive"]\n[[layers]]\nbatch = 1\n')
    r = subprocess.run(run + ["sweep", str(bad), "--out", str(tmp_path / "o")], capture_output=True, text=True)
    assert r.returncode == 2 and "algoritms" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_naive_points_at_misaligned_rows_are_marked_and_the_page_says_so(tmp_path):
    # N 999 in fp16: 1,998-byte rows of S, where cuBLAS runs alignment-1 GEMMs (at peak rates without traits)
    raw = {"sweep": {"profiles": ["h200_sxm"], "algorithms": ["naive", "flash2"], "passes": ["fwd"]},
           "layers": [{"name": "odd", "batch": 1, "heads": 2, "seqlen_q": [999, 1000], "head_dim": 64}]}
    df = run_sweep(parse_spec(raw), tmp_path / "odd", workers=1, progress=False)
    marked = df.set_index(["algorithm", "seqlen_q"])["cublas_align1"]
    assert bool(marked[("naive", 999)]) and not marked[("naive", 1000)] and not marked[("flash2", 999)].any()
    assert "alignment-1" in (tmp_path / "odd" / "sweep.html").read_text()
