"""Published speeds of chips not measured here (reports/published): the stored sets, how a figure's TFLOP/s
become seconds, their predictions, and bad files."""
from __future__ import annotations

import json

import pytest

from iosim import published as pub
from iosim.cli import main
from iosim.errors import IosimError
from iosim.hardware import load_profile


@pytest.fixture(scope="module")
def sets():
    return pub.load()


def test_stored_sets_name_their_source_chip_and_profile(sets):
    assert {s.gpu for s in sets} == {"A100 80GB SXM4", "H100 80GB SXM5"}
    for s in sets:
        load_profile(s.profile)                               # a profile iosim has
        assert s.source["repository"] and s.source["commit"] and s.source["path"].endswith(".png")
        assert s.pass_ in ("forward", "forward+backward") and s.dtype == "fp16"
        for r in s.records:                                   # the figures' shapes: 16k tokens, hidden 2048
            assert r.batch * r.seqlen == 16384 and r.heads * r.head_dim == 2048
        # one bar per (algorithm, head_dim, causal, seqlen)
        keys = [(r.algorithm, r.head_dim, r.causal, r.seqlen) for r in s.records]
        assert len(keys) == len(set(keys))


def test_tflops_become_the_figures_seconds(sets):
    s = sets[0]
    r = s.records[0].model_copy(update={"batch": 2, "heads": 3, "seqlen": 100, "head_dim": 64, "causal": False})
    assert pub.flops(s, r) == 3.5 * 4 * 2 * 3 * 100 ** 2 * 64
    assert pub.flops(s, r.model_copy(update={"causal": True})) == pub.flops(s, r) / 2


def test_a_prediction_sets_predicted_against_published_seconds(sets):
    s = next(x for x in sets if x.gpu.startswith("H100"))
    r = next(x for x in s.records if x.algorithm == "flash2" and x.seqlen == 2048 and not x.causal)
    [row] = pub.score([s.model_copy(update={"records": [r]})])
    assert row["published_s"] == pytest.approx(pub.flops(s, r) / (r.tflops * 1e12))
    assert row["error"] == pytest.approx(row["predicted_s"] / row["published_s"] - 1)
    assert row["predicted_tflops"] * row["predicted_s"] == pytest.approx(pub.flops(s, r) / 1e12)
    summ = pub.summary([row, dict(row, error=-row["error"] / 2)])
    assert summ[(s.gpu, "flash2")]["time_max"] == pytest.approx(abs(row["error"]))


def test_records_the_plan_refuses_are_listed_not_scored(sets):
    s = next(x for x in sets if x.pass_ == "forward")
    ok = next(r for r in s.records if r.algorithm == "flash3" and r.head_dim == 128 and r.seqlen == 4096)
    big = next(r for r in s.records if r.algorithm == "flash3" and r.head_dim == 256)
    rows = pub.score([s.model_copy(update={"records": [ok, big]})], traits=False)
    assert rows[0]["error"] is not None and rows[1]["error"] is None
    assert "shared memory" in rows[1]["not_planned"]
    # a forward figure's FLOPs are the forward's alone
    assert pub.flops(s, ok) == 4 * ok.batch * ok.heads * ok.seqlen ** 2 * ok.head_dim
    assert pub.summary(rows)[(s.gpu, "flash3")]["n"] == 1


def test_bad_published_files_are_one_line_errors(tmp_path, capsys):
    good = json.loads((pub.PUBLISHED / "fa2_fwd_bwd_2023.json").read_text())
    good["sets"] = good["sets"][:1]
    good["sets"][0]["records"] = good["sets"][0]["records"][:1]
    bad = json.loads(json.dumps(good))
    bad["sets"][0]["records"][0]["tflops"] = -3
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(IosimError, match="tflops"):
        pub.load([tmp_path / "bad.json"])
    with pytest.raises(SystemExit) as e:
        main(["published", str(tmp_path / "missing.json")])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
    (tmp_path / "one.json").write_text(json.dumps(good))
    main(["published", str(tmp_path / "one.json"), "--json", "--traits", "peak"])
    out = json.loads(capsys.readouterr().out)
    assert len(out["rows"]) == 1 and out["summary"][0]["n"] == 1
