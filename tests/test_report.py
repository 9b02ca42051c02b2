"""The report: figure functions, and the pages built from stored data, opened in headless Chromium."""
import shutil
import subprocess

import plotly.graph_objects as go
import pytest

from iosim.plan import build_plan

from iosim.engine import simulate
from iosim.hardware import load_profile
from iosim.report import explain, figures as F, pages
from iosim.workload import AttentionConfig

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def test_figures_are_plotly_figures_with_what_they_promise():
    h200, a100 = load_profile("h200_sxm"), load_profile("a100_40gb")
    cfg = AttentionConfig(batch=2, heads=4, seqlen_q=512)
    roof = F.roofline(h200, cfg)
    assert isinstance(roof, go.Figure)
    names = {t.name for t in roof.data}
    assert {"naive_qk (predicted)", "flash2_fwd (predicted)"} <= names and any(n.startswith("HBM") for n in names)
    traffic = F.traffic_vs_seqlen(a100, batch=1, heads=2, ns=(256, 512, 1024))
    naive_hbm = next(t for t in traffic.data if t.name == "naive HBM").y
    assert naive_hbm[2] / naive_hbm[1] > 3          # ~N^2: doubling N quadruples naive traffic
    blocks = F.block_size_sweep([a100], AttentionConfig(batch=2, heads=4, seqlen_q=1024))
    acc = blocks.data[0].y
    assert list(acc) == sorted(acc, reverse=True)   # bigger blocks, fewer HBM accesses
    tl = F.timeline(simulate(cfg, "flash2", h200, timeline=True))
    assert any(t.name == "hbm busy" for t in tl.data)
    with pytest.raises(ValueError):
        F.timeline(simulate(cfg, "flash2", h200))


def test_explain_says_where_the_bytes_go():
    text = explain.explain(AttentionConfig(batch=4, heads=8, seqlen_q=1024), load_profile("h200_sxm"))
    assert "naive_softmax" in text and "flash2_fwd" in text and "bound:" in text and "What would change" in text


def _generations(text: str) -> dict[str, float]:
    return {line.split()[0]: float(line.split("µs")[1].split()[0]) for line in text.splitlines()
            if line.startswith("  flash") and "TFLOP/s  bound" in line}


def test_hopper_pages_show_three_generations_and_why_the_asynchronous_one_wins():
    cfg = AttentionConfig(batch=8, heads=16, seqlen_q=2048)
    h100, a100 = load_profile("h100_sxm"), load_profile("a100_40gb")
    names = {t.name for t in F.roofline(h100, cfg).data}
    assert "flash3_fwd (predicted)" in names and any(n.startswith("matmul then exp, in series") for n in names)
    assert not any("flash3" in t.name or "wgmma" in t.name for t in F.roofline(a100, cfg).data)
    gens = _generations(explain.explain(cfg, h100))
    assert list(gens) == ["flash1", "flash2", "flash3"] and gens["flash3"] > gens["flash2"]   # TFLOP/s
    # on a grid too small for flash3's 192-row blocks at d 64 (B2 H8: 176 work tiles, two rounds on 132 SMs, as 256
    # of 128 rows take) each round would be 1.5 times as long: flash3 runs 128-row tiles there, and still wins
    # (measured, 192 rows against 128 on B1 H8 N4096: 117 against 91 us, experiments/flash3_model/README.md)
    small_cfg = AttentionConfig(batch=2, heads=8, seqlen_q=2048)
    small = _generations(explain.explain(small_cfg, h100))
    assert build_plan(small_cfg, "flash3", h100).tiling.block_q == 128 and small["flash3"] > small["flash2"]
    # at d 64 the exps alone cap the matmuls near wgmma's rate: in series the two add, beside each other they don't
    assert explain.exp_roof(cfg, h100) == pytest.approx(h100.exp_per_s * 256)
    assert "in series" not in explain.explain(cfg, a100) and "Three generations" not in explain.explain(cfg, a100)
    assert "Three generations" not in explain.explain(cfg.with_pass("forward+backward"), h100)


def test_measured_roofline_points_come_from_the_records_of_that_layer():
    from pathlib import Path
    from iosim.validate import load_records
    recs = load_records(Path(__file__).resolve().parent.parent / "reports" / "measurements" / "h200")
    h200 = load_profile("h200_sxm")
    pts = F.measured_points(recs, AttentionConfig(), h200)
    by = {p["name"]: p for p in pts}
    assert {"naive: naive_qk (measured)", "naive: naive_pv (measured)", "flash2 128x128: flash2_fwd (measured)",
            "flash1 64x64: flash1_fwd (measured)", "torch_flash: flash2_fwd (measured)"} <= set(by)
    # the IO argument, measured: the tiled kernel does far more matmul FLOPs per DRAM byte than naive's GEMMs
    assert by["flash2 128x128: flash2_fwd (measured)"]["intensity"] > 5 * by["naive: naive_qk (measured)"]["intensity"]
    assert all(0 < p["tflops"] < h200.tensor_flops_per_s("fp16") / 1e12 for p in pts)
    assert F.measured_points(recs, AttentionConfig(batch=3), h200) == []      # no record of that layer
    fig = F.roofline(h200, AttentionConfig(), pts)
    assert sum(1 for t in fig.data if t.name.endswith("(measured)")) == len(pts)


def test_report_refuses_a_bad_layer_in_one_line(tmp_path, capsys):
    from iosim.cli import main
    with pytest.raises(SystemExit) as e:
        main(["report", "--out", str(tmp_path / "site"), "--seqlen", "0"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "seqlen" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "site").exists()


def test_report_names_a_missing_records_folder_in_one_line(tmp_path, capsys):
    from iosim.cli import main
    with pytest.raises(SystemExit) as e:
        main(["report", "--out", str(tmp_path / "site"), "--records", "reports/measurements/h200",
              str(tmp_path / "nowhere")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--records" in err and "nowhere" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "site").exists()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    from pathlib import Path
    out = tmp_path_factory.mktemp("site")
    stored = Path(__file__).resolve().parent.parent / "reports" / "measurements"
    return out, pages.build(out, [stored / "h200", stored / "h200_calibration2"], quick=True)


@pytest.mark.slow
def test_report_builds_from_stored_data(site):
    out, written = site
    names = {p.name for p in written}
    assert names == {"roofline.html", "traffic.html", "blocks.html", "paper.html", "timeline.html",
                     "whatif.html", "validation.html", "transfer.html", "index.html"}
    # both folders' records are on the validation page (the second sweep's B32 H16 N512 is calibration only)
    assert "B32 H16 N512 d64 bf16" in (out / "validation.html").read_text()
    assert "<td>flash2 128x128 4w 2st</td>" in (out / "validation.html").read_text()   # the signed error by run
    assert (out / pages.PLOTLY_JS).stat().st_size > 1_000_000          # plotly.js beside the pages, no CDN
    for p in written:
        text = p.read_text()
        assert "cdn" not in text.lower() and "iosim 0." in text and "layer B64 H16 N1024 d64" in text
    assert "(measured)" in (out / "roofline.html").read_text()
    transfer = (out / "transfer.html").read_text()   # the H100's records, and the bands every carried prediction prints
    assert "<td>sm_90</td><td>flash2</td>" in transfer and "measured on an H100" in transfer


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/run installs it)")
def test_every_figure_renders_in_headless_chromium_without_console_messages(site, tmp_path):
    out, written = site
    for page in written:
        res = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                              "--no-first-run", "--disable-background-networking", "--disable-component-update",
                              "--disable-sync", f"--user-data-dir={tmp_path / page.stem}", "--enable-logging=stderr",
                              "--v=0", "--virtual-time-budget=10000", "--dump-dom", page.as_uri()],
                             capture_output=True, text=True, timeout=120)
        figures = page.read_text().count('class="plotly-graph-div"')
        rendered = res.stdout.count('class="main-svg"')
        assert rendered >= figures, (page.name, figures, rendered)   # each figure draws at least one svg
        console = [ln for ln in res.stderr.splitlines() if "CONSOLE" in ln]
        assert not console, (page.name, console[:3])


@pytest.mark.slow
def test_the_sample_pages_are_what_this_iosim_makes(capsys):
    # reports/site was made by `iosim report --out reports/site --force` with every default; regenerate it so
    # whenever a change moves a figure (the div ids come from the figures, so an unchanged page is byte-equal)
    from pathlib import Path
    from iosim.cli import main
    site = Path(__file__).resolve().parent.parent / "reports" / "site"
    main(["report", "--check", "--out", str(site)])
    assert "pages in" in capsys.readouterr().out
