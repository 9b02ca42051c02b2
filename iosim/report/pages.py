"""Writes the report: one HTML page per figure and an index, opening offline (plotly.js placed once beside the
pages, no CDN). Each page names the profile, the configuration and the iosim version it was made with."""
from __future__ import annotations

import hashlib
import html
from pathlib import Path

import plotly.io as pio
from plotly.offline import get_plotlyjs

from .. import __version__
from ..fit import load as load_traits
from ..errors import IosimError
from ..files import write_text
from ..hardware import load_profile
from ..records import records_dir
from ..validate import bias, load_records, summary, validate
from ..workload import AttentionConfig
from . import figures as F

PLOTLY_JS = "plotly.min.js"

TEXT = {
    "roofline": "A kernel sits under the lower of two roofs: the memory slope (bytes per second times FLOPs per "
                "byte) and the flat compute peak. Naive attention's kernels sit far left, at a few FLOPs per HBM "
                "byte, so HBM bandwidth sets their speed. The tiled kernel does the same matmul FLOPs but reads Q, K "
                "and V from HBM about once, so it moves right, under the compute roof: it is faster because it "
                "moves less, not because it computes less. On a Hopper profile the third generation, flash3, "
                "sits higher under the same roof: its matmuls run on wgmma, Hopper's faster matmul. Its design would also "
                "run the softmax's exps under the matmuls; measured, its key tiles and cuDNN's still pay the two "
                "largely one after the other, as flash1 and flash2 do (the purple dash-dot line).",
    "traffic": "Naive attention writes and reads the N×N matrices S and P, so its HBM traffic and its memory grow "
               "with N²; past some N it no longer fits in any GPU's HBM (the dotted lines). Tiled attention's HBM "
               "traffic grows far more slowly (here L2 catches most re-reads of K and V), and its footprint grows "
               "with N only: the paper's Theorem 2 and its long-sequence result.",
    "blocks": "The paper's Figure 2 (middle): with its loop order, K/V blocks of Bc columns mean the query blocks "
              "are re-read N/Bc times, so HBM accesses fall as blocks grow, until the blocks no longer fit in SRAM. "
              "The runtime follows the accesses while the kernel is memory-bound.",
    "validation": "Each point is one measurement on the H200: what the engine predicted against what Nsight Compute "
                  "measured. On the line means exact; the dotted lines are ±20%. Hollow points are the calibration "
                  "records, on which the kernels' efficiencies were fitted; filled points were never used for "
                  "fitting. The first table gives the median and largest relative error per set and algorithm; "
                  "the second the signed time error of each build, which shows a build predicted slow or fast as a "
                  "whole.",
    "paper": "The paper's Figure 2: one training step (forward and backward) of the GPT-2 medium layer, as the "
             "paper published it on the A100, as iosim predicts it on the A100 and H200 profiles (PyTorch's eager "
             "attention as standard, FlashAttention-2's forward and backward as tiled), and as PyTorch ran it on "
             "the H200. The tiled step does more matmul FLOPs (it recomputes S and P in the backward instead of "
             "storing P) and moves an order of magnitude fewer HBM bytes. The paper's FLOP counts follow a "
             "convention it does not state, about a twelfth of iosim's (2 per multiply-add, every GEMM of both "
             "passes); what compares is the ratio, the paper's 1.13x against iosim's 1.17x (five backward GEMMs "
             "of the tiled step against four).",
    "timeline": "The simulated run, block by block on the first SMs, and when each memory tier was busy. Waves "
                "show as columns of blocks; the last wave's tail as SMs idling at the end; in naive attention, "
                "HBM busy through all three kernels.",
    "transfer": "Predictions for a chip nothing was fitted on: the H200's measured shares of peak and its fitted "
                "kernel traits carried to the H100's datasheet profile (iosim.transfer), against what an H100 "
                "measured (reports/measurements/h100_transfer; every point a record never fitted on). The table "
                "gives the error band each prediction with carried traits prints, per architecture and algorithm "
                "(hw_profiles/transfer_bands.json: the H100's records for sm_90, published A100 speeds for sm_80).",
    "whatif": "How the advantage of tiling moves with the chip: more SRAM allows bigger tiles and fewer re-reads; "
              "more HBM bandwidth helps naive attention most, so the speed-up shrinks; more L2 lets naive "
              "attention keep more of S in cache.",
}


def _page(title: str, body: str, meta: str) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<script src='{PLOTLY_JS}'></script><style>body{{font-family:sans-serif;max-width:1200px;margin:auto;"
            f"padding:1em}} p{{max-width:800px;line-height:1.4}} table{{border-collapse:collapse}} td,th{{border:1px "
            f"solid #ccc;padding:2px 8px}} .meta{{color:#666;font-size:90%}}</style></head><body>"
            f"<p><a href='index.html'>iosim report</a></p><h1>{html.escape(title)}</h1>{body}"
            f"<p class='meta'>{html.escape(meta)}</p></body></html>")


def _fig(fig, text: str) -> str:
    # the div's id from the figure itself: the same figure gives the same page, so stored pages can be checked
    div = "fig-" + hashlib.sha1(fig.to_json().encode()).hexdigest()[:12]
    return f"<p>{html.escape(text)}</p>" + pio.to_html(fig, include_plotlyjs=False, full_html=False, div_id=div)


def build(out: Path, records: Path | list[Path] | None = None, progress=None, quick: bool = False,
          cfg: AttentionConfig | None = None, profile: str = "h200_sxm") -> list[Path]:
    """Write the report pages under `out`; `records`: folders (or one) of measurement records for the measured
    parts.
    cfg: the layer the roofline, block-size, timeline and what-if pages show (default: the paper's GPT-2 medium
    layer); profile: the chip they show it on (the paper's page keeps the A100 and the H200).
    quick: shorter sweeps and only the records with N <= 1024 (for tests); the pages say so."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise IosimError(f"--out: cannot make {out}: {e.strerror or e}") from None
    write_text(out / PLOTLY_JS, get_plotlyjs(), "--out")
    a100, h200, hw = load_profile("a100_40gb"), load_profile("h200_sxm"), load_profile(profile)
    cfg = cfg or AttentionConfig()
    folders = [records] if isinstance(records, (str, Path)) else list(records or [])
    recs = [r for f in folders for r in load_records(f)]
    meta = f"iosim {__version__}; layer {cfg.label()}; profile {hw.key}" + ("; QUICK build (short sweeps)" if quick
                                                                           else "")
    ns = tuple(2 ** k for k in range(7, 14 if quick else 17))
    pages: list[tuple[str, str, str]] = []
    steps = ["roofline", "traffic", "blocks", "paper", "timeline", "whatif"] + (["validation"] if folders else []) + \
        (["transfer"] if (records_dir() / TRANSFER_RECORDS).is_dir() else [])
    for step in (progress(steps) if progress else steps):
        if step == "roofline":
            measured = F.measured_points(recs, cfg, hw) if "h200" in hw.key else []
            note = (" Crosses are the same kernels measured on the H200 (Nsight Compute: DRAM bytes and kernel "
                    "time of the stored records of this layer)." if measured else
                    " No stored measurement of this layer on this chip, so no measured points.")
            other = a100 if hw.key != a100.key else h200
            pages.append(("roofline", "Roofline", _fig(F.roofline(hw, cfg, measured), TEXT["roofline"] + note) +
                          _fig(F.roofline(other, cfg), f"The same layer on the {other.key} profile.")))
        elif step == "traffic":
            pages.append(("traffic", "Traffic and memory against N",
                          _fig(F.traffic_vs_seqlen(hw, head_dim=cfg.head_dim, ns=ns), TEXT["traffic"])))
        elif step == "blocks":
            pages.append(("blocks", "Block size", _fig(F.block_size_sweep([a100, h200] if hw.key in (
                a100.key, h200.key) else [a100, h200, hw], cfg), TEXT["blocks"])))
        elif step == "paper":
            pages.append(("paper", "The paper's Figure 2, a training step", _fig(F.paper_figure2(a100, h200, recs), TEXT["paper"])))
        elif step == "timeline":
            from ..engine import simulate
            small = cfg.model_copy(update={"batch": min(cfg.batch, 8)})   # a few waves draw faster than many
            body = "".join(_fig(F.timeline(simulate(small, a, hw, timeline=True)), TEXT["timeline"] if a == "naive"
                                else "The tiled kernel of the same layer.") for a in ("naive", "flash2"))
            pages.append(("timeline", "Simulated timeline", body))
        elif step == "whatif":
            pages.append(("whatif", "What if", _fig(F.what_if(hw, cfg), TEXT["whatif"])))
        elif step == "validation":
            cal = load_profile("h200_sxm.calibrated")
            chosen = [r for r in recs if not quick or r["config"]["seqlen_q"] <= 1024]
            rows = validate(chosen, cal, "all", load_traits(cal))
            summ = summary(rows)
            table = "<table><tr><th>set</th><th>algorithm</th><th>n</th><th>time median</th><th>time max</th>" \
                    "<th>DRAM median</th><th>L2 median</th></tr>" + "".join(
                        f"<tr><td>{s}</td><td>{a}</td><td>{x['n']}</td><td>{x['time_median']:.1%}</td>"
                        f"<td>{x['time_max']:.1%}</td><td>{x['dram_median']:.1%}</td><td>{x['l2_median']:.1%}</td></tr>"
                        for (s, a), x in summ.items()) + "</table>"
            table += "<p>Signed time error by run (an algorithm and its tiling: one build of a kernel; + means " \
                     "predicted slower than measured):</p><table><tr><th>set</th><th>run</th><th>n</th>" \
                     "<th>mean</th><th>median</th></tr>" + "".join(
                         f"<tr><td>{s}</td><td>{html.escape(run)}</td><td>{x['n']}</td><td>{x['time_mean']:+.1%}</td>"
                         f"<td>{x['time_median']:+.1%}</td></tr>" for (s, run), x in bias(rows).items()) + "</table>"
            pages.append(("validation", "Predicted against measured",
                          _fig(F.predicted_vs_measured(rows, summ), TEXT["validation"]) + table))
        elif step == "transfer":
            pages.append(("transfer", "Chips nothing was fitted on", _transfer_page(quick)))
    written = []
    for name, title, body in pages:
        f = out / f"{name}.html"
        write_text(f, _page(title, body, meta + f"; profile(s) named in each figure; page '{name}'"), "--out")
        written.append(f)
    index = "<ul>" + "".join(f"<li><a href='{n}.html'>{html.escape(t)}</a></li>" for n, t, _ in pages) + "</ul>"
    write_text(out / "index.html", _page("iosim report", "<p>Why FlashAttention is fast, predicted and measured."
                                         "</p>" + index, meta), "--out")
    return written + [out / "index.html"]


TRANSFER_RECORDS = "h100_transfer"


def _transfer_page(quick: bool) -> str:
    """The H100's records predicted with traits carried from the H200, and the error bands."""
    from ..transfer import band_table, transferred
    recs = [r for r in load_records(records_dir() / TRANSFER_RECORDS)
            if not quick or r["config"]["seqlen_q"] <= 1024 and r["config"].get("pass", "forward") == "forward"]
    moved = transferred(load_profile("h100_sxm"))
    rows = validate(recs, moved.profile, "all", moved.traits)
    summ = summary(rows)
    table = "<table><tr><th>algorithm</th><th>n</th><th>time median</th><th>time max</th><th>DRAM median</th>" \
            "<th>L2 median</th></tr>" + "".join(
                f"<tr><td>{a}</td><td>{x['n']}</td><td>{x['time_median']:.1%}</td><td>{x['time_max']:.1%}</td>"
                f"<td>{x['dram_median']:.1%}</td><td>{x['l2_median']:.1%}</td></tr>" for (_, a), x in summ.items())
    table += "</table><p>Error bands of predictions with carried traits:</p><table><tr><th>architecture</th>" \
             "<th>algorithm</th><th>n</th><th>time median</th><th>time max</th><th>from</th></tr>" + "".join(
                 f"<tr><td>{arch}</td><td>{alg}</td><td>{b['n']}</td><td>{b['median']:.1%}</td><td>{b['max']:.1%}"
                 f"</td><td>{html.escape(b['from'])}</td></tr>" for arch, alg, b in band_table()) + "</table>"
    return _fig(F.predicted_vs_measured(rows, summ), TEXT["transfer"]) + table
