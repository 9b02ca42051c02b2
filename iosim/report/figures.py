"""The report's figures, each a function returning a plotly Figure (usable in a notebook as well)."""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..analytic import analyze
from ..engine import SimResult, simulate
from ..hardware import HardwareProfile, list_profiles, load_profile
from ..kernels.catalogue import planned
from ..plan import Tiling, flash3
from ..workload import AttentionConfig
from .explain import exp_roof

COLORS = {"naive": "#d62728", "flash1": "#ff7f0e", "flash2": "#1f77b4", "flash3": "#9467bd", "torch_flash": "#2ca02c"}


def roofline(hw: HardwareProfile, cfg: AttentionConfig, measured: list | None = None) -> go.Figure:
    """Ceilings of a profile (HBM, L2, SRAM bandwidth; tensor and fp32 peaks), with every kernel of naive and
    tiled attention placed by its arithmetic intensity (matmul FLOPs per HBM byte) and its predicted FLOP/s;
    measured points where records exist."""
    fig = go.Figure()
    xs = [10 ** (i / 20) for i in range(-20, 101)]   # 0.1 ... 1e5 FLOP/B
    peak = hw.tensor_flops_per_s(cfg.dtype if cfg.dtype != "fp32" else "fp32")
    for name, bw, dash in (("HBM", hw.hbm_bytes_per_s, "solid"), ("L2", hw.l2_bytes_per_s, "dash"),
                           ("SRAM", hw.smem_bytes_per_s, "dot")):
        fig.add_trace(go.Scatter(x=xs, y=[min(peak, bw * x) / 1e12 for x in xs], mode="lines",
                                 name=f"{name} {bw / 1e12:.1f} TB/s", line=dict(dash=dash, color="gray")))
    fig.add_trace(go.Scatter(x=xs, y=[hw.fp32_flops_per_s / 1e12] * len(xs), mode="lines",
                             name=f"fp32 peak {hw.fp32_tflops:g} TFLOP/s", line=dict(dash="dashdot", color="gray")))
    three = flash3.runs_on(cfg, hw)
    if three:   # the asynchronous generation's roofs: wgmma's rate, and matmul and exp one after the other
        wg, roof = hw.tensor_flops_per_s(cfg.dtype, wgmma=True), exp_roof(cfg, hw)
        for name, y, dash in ((f"wgmma peak {wg / 1e12:,.0f} TFLOP/s", wg, "longdash"),
                              (f"matmul then exp, in series (d {cfg.head_dim}): {1 / (1 / wg + 1 / roof) / 1e12:,.0f}"
                               " TFLOP/s", 1 / (1 / wg + 1 / roof), "longdashdot")):
            fig.add_trace(go.Scatter(x=xs, y=[y / 1e12] * len(xs), mode="lines", name=name,
                                     line=dict(dash=dash, color=COLORS["flash3"])))
    for alg in ("naive", "flash1", "flash2") + (("flash3",) if three else ()):
        r = simulate(cfg, alg, hw)
        for k in r.kernels:
            if not k.mma_flops:
                continue
            inten = k.mma_flops / max(1, k.hbm_read_bytes + k.hbm_write_bytes)
            fig.add_trace(go.Scatter(x=[inten], y=[k.mma_flops / k.time_s / 1e12], mode="markers+text",
                                     text=[k.name], textposition="top center", name=f"{k.name} (predicted)",
                                     marker=dict(size=12, color=COLORS[alg], symbol="circle")))
    for m in measured or []:
        fig.add_trace(go.Scatter(x=[m["intensity"]], y=[m["tflops"]], mode="markers", name=m["name"],
                                 marker=dict(size=12, color=COLORS.get(m["algorithm"], "black"),
                                             symbol="x")))
    fig.update_layout(title=f"Roofline of {hw.name}: {cfg.label()}", xaxis_type="log", yaxis_type="log",
                      xaxis_title="arithmetic intensity (matmul FLOP per HBM byte)", yaxis_title="TFLOP/s")
    return fig


def _measured_of(records: list[dict], cfg: AttentionConfig, sm_count: int = 132):
    """(record, modelled algorithm, tiling) of each stored measurement of `cfg` with Nsight data; PyTorch's flash
    kernel is modelled as flash2 with FlashAttention-2's tiling."""
    want = cfg.model_dump(by_alias=True)
    for r in records:
        if r.get("config") != want or not r.get("ncu") or r["algorithm"] not in ("naive", "flash1", "flash2",
                                                                                  "torch_flash"):
            continue
        yield r, *planned(r["algorithm"], cfg, Tiling(**r["tiling"]) if r.get("tiling") else None, sm_count)


def measured_points(records: list[dict], cfg: AttentionConfig, hw: HardwareProfile) -> list[dict]:
    """Roofline points of the stored measurements of `cfg`: per kernel with matmul FLOPs (the counts' FLOPs over
    Nsight's DRAM bytes and kernel duration), matched to the planned kernels in launch order. A record whose
    kernels do not match its plan one for one (PyTorch's) is placed whole: all FLOPs over all bytes and time."""
    pts = []
    for r, alg, tiling in _measured_of(records, cfg, hw.sm_count):
        planned = analyze(cfg, alg, hw, tiling).kernels
        got = r["ncu"]["kernels"]
        tag = r["algorithm"] + (f" {tiling.block_q}x{tiling.block_kv}" if tiling and r["algorithm"] != "torch_flash"
                                else "")
        if len(got) == len(planned):
            pairs = [(p.name, p.mma_flops, k) for p, k in zip(planned, got)]
        else:
            whole = {"dram__bytes_read.sum": r["ncu"]["dram_read_bytes"], "dram__bytes_write.sum":
                     r["ncu"]["dram_write_bytes"], "gpu__time_duration.sum": r["ncu"]["duration_s"]}
            pairs = [("all kernels", sum(p.mma_flops for p in planned), whole)]
        for name, flops, k in pairs:
            dram = k["dram__bytes_read.sum"] + k["dram__bytes_write.sum"]
            if flops and dram and k["gpu__time_duration.sum"]:
                pts.append({"name": f"{tag}: {name} (measured)", "algorithm": r["algorithm"],
                            "intensity": flops / dram, "tflops": flops / k["gpu__time_duration.sum"] / 1e12})
    return pts


def traffic_vs_seqlen(hw: HardwareProfile, batch: int = 16, heads: int = 8, head_dim: int = 64,
                      ns: tuple[int, ...] = tuple(2 ** k for k in range(7, 17)), progress=None) -> go.Figure:
    """HBM and L2 traffic against N for naive and tiled attention (log-log), with the slopes of O(N^2) and of
    O(N^2 d^2 / M); and peak HBM footprint against N with each profile's HBM capacity."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("traffic (engine, with L2)", "peak HBM footprint"))
    data = {a: {"hbm": [], "l2": [], "peak": []} for a in ("naive", "flash2")}
    for n in (progress(ns) if progress else ns):
        cfg = AttentionConfig(batch=batch, heads=heads, seqlen_q=n, head_dim=head_dim)
        for a in data:
            r = simulate(cfg, a, hw, max_steps=4)
            data[a]["hbm"].append(r.hbm_bytes / 1e9)
            data[a]["l2"].append(r.l2_bytes / 1e9)
            data[a]["peak"].append(r.peak_footprint_bytes / 1e9)
    for a, d in data.items():
        fig.add_trace(go.Scatter(x=list(ns), y=d["hbm"], name=f"{a} HBM", line=dict(color=COLORS[a])), 1, 1)
        fig.add_trace(go.Scatter(x=list(ns), y=d["l2"], name=f"{a} L2", line=dict(color=COLORS[a], dash="dot")),
                      1, 1)
        fig.add_trace(go.Scatter(x=list(ns), y=d["peak"], name=f"{a} footprint", line=dict(color=COLORS[a])), 1, 2)
    # reference slopes through the naive curve's last point: N^2 (naive) and N^2 d^2 / M (tiled, two-level)
    n0, y0 = ns[-1], data["naive"]["hbm"][-1]
    fig.add_trace(go.Scatter(x=list(ns), y=[y0 * (n / n0) ** 2 for n in ns], name="slope N^2",
                             line=dict(color="black", dash="dash")), 1, 1)
    y1 = data["flash2"]["l2"][-1]
    fig.add_trace(go.Scatter(x=list(ns), y=[y1 * (n / n0) ** 2 for n in ns], name="slope N^2 d^2/M (fixed d, M)",
                             line=dict(color="gray", dash="dash")), 1, 1)
    for key in list_profiles():
        if "." in key:   # a calibrated variant: same chip, same capacity
            continue
        p = load_profile(key)
        fig.add_trace(go.Scatter(x=[ns[0], ns[-1]], y=[p.hbm_capacity_gb] * 2, mode="lines", name=f"{key} HBM",
                                 line=dict(dash="dot", width=1)), 1, 2)
    fig.update_xaxes(type="log", title_text="sequence length N")
    fig.update_yaxes(type="log", title_text="GB")
    fig.update_layout(title=f"Traffic and memory against N on {hw.name} (batch {batch}, {heads} heads, d {head_dim})")
    return fig


def block_size_sweep(profiles: list[HardwareProfile], cfg: AttentionConfig | None = None,
                     blocks: tuple[int, ...] = (16, 32, 64, 128, 256)) -> go.Figure:
    """The paper's Figure 2 (middle): HBM accesses and runtime of tiled attention against block size, with the
    paper's loop order (flash1, Br = min(Bc, d)), on each profile. Larger blocks: fewer HBM accesses, faster,
    until the SRAM no longer holds them."""
    cfg = cfg or AttentionConfig()
    fig = make_subplots(rows=1, cols=2, subplot_titles=("HBM accesses (two-level)", "predicted runtime"))
    for hw in profiles:
        xs, acc, rt = [], [], []
        for bc in blocks:
            t = Tiling(block_q=min(bc, cfg.head_dim), block_kv=bc, loop_order="flash1", stages=1)
            if t.smem_bytes(cfg) > hw.smem_per_block_bytes:
                continue
            xs.append(bc)
            acc.append(analyze(cfg, "flash1", hw, t).hbm_bytes / 1e9)
            rt.append(simulate(cfg, "flash1", hw, t, max_steps=4).time_s * 1e3)
        fig.add_trace(go.Scatter(x=xs, y=acc, name=f"{hw.key} HBM GB", mode="lines+markers"), 1, 1)
        fig.add_trace(go.Scatter(x=xs, y=rt, name=f"{hw.key} ms", mode="lines+markers"), 1, 2)
    fig.update_xaxes(type="log", title_text="block size Bc", tickvals=list(blocks))
    fig.update_yaxes(title_text="GB", row=1, col=1)
    fig.update_yaxes(title_text="ms", row=1, col=2)
    fig.update_layout(title=f"Block size against HBM accesses and runtime: {cfg.label()} (flash1, the paper's order)")
    return fig


def predicted_vs_measured(rows: list, summary: dict) -> go.Figure:
    """One point per record, predicted against measured, for time, DRAM bytes and L2 bytes; y = x and +-20%
    bands; coloured by algorithm; calibration records hollow."""
    fig = make_subplots(rows=1, cols=3, subplot_titles=("time (s)", "DRAM bytes", "L2 bytes"))
    for col, (p, m) in enumerate((("pred_time_s", "meas_time_s"), ("pred_dram_bytes", "meas_dram_bytes"),
                                  ("pred_l2_bytes", "meas_l2_bytes")), start=1):
        vals = [getattr(r, m) for r in rows] + [getattr(r, p) for r in rows]
        lo, hi = min(v for v in vals if v > 0), max(vals)
        for f, dash in ((1.0, "solid"), (1.2, "dot"), (1 / 1.2, "dot")):
            fig.add_trace(go.Scatter(x=[lo, hi], y=[lo * f, hi * f], mode="lines", showlegend=col == 1 and f == 1,
                                     name="y = x (dotted: ±20%)", line=dict(color="gray", dash=dash)), 1, col)
        for alg in sorted({r.algorithm for r in rows}):
            for st in ("validation", "calibration"):
                sel = [r for r in rows if r.algorithm == alg and r.set == st]
                if not sel:
                    continue
                fig.add_trace(go.Scatter(
                    x=[getattr(r, m) for r in sel], y=[getattr(r, p) for r in sel], mode="markers",
                    name=f"{alg} ({st})", legendgroup=f"{alg}{st}", showlegend=col == 1, text=[r.label for r in sel],
                    marker=dict(color=COLORS.get(alg, "black"), symbol="circle" if st == "validation" else
                                "circle-open", size=8)), 1, col)
        fig.update_xaxes(type="log", title_text="measured", row=1, col=col)
        fig.update_yaxes(type="log", title_text="predicted", row=1, col=col)
    fig.update_layout(title="Predicted against measured on the H200")
    return fig


PAPER_FIG2 = {  # FlashAttention paper, Figure 2 (left): GPT-2 medium attention, forward + backward, A100
    "standard": {"gflops": 66.6, "hbm_gb": 40.3, "runtime_ms": 41.7},
    "flashattention": {"gflops": 75.2, "hbm_gb": 4.4, "runtime_ms": 7.3},
}
# PyTorch on the H200, B64 H16 N1024 d64 fp16, forward + backward (shared/anchors/bwd_h200_2026-12-03): CUDA-event
# time and Nsight's DRAM bytes of eager attention and of SDPA's flash backend (FlashAttention-2), where no record
# of this layer's training step is stored
ANCHOR_H200_STEP = {"eager": {"hbm_gb": 40.3, "runtime_ms": 11.13}, "flash2": {"hbm_gb": 3.3, "runtime_ms": 4.08}}


def paper_figure2(a100: HardwareProfile, h200: HardwareProfile, records: list[dict] | None = None) -> go.Figure:
    """The paper's published training-step numbers (forward + backward) next to iosim's prediction of the same
    step on the A100 and H200 profiles, and the step measured on the H200: PyTorch's eager attention and its flash
    backend (FlashAttention-2), Nsight's DRAM bytes and kernel time where `records` hold this layer's step, else
    the anchors' figures; FLOPs counted by iosim."""
    cfg = AttentionConfig(**{"pass": "forward+backward"})
    algs = {"eager": ("standard", "torch_naive"), "flash2": ("flashattention", "torch_flash")}
    pred = {hw.key: {a: simulate(cfg, a, hw) for a in algs} for hw in (a100, h200)}
    flops = {a: analyze(cfg, a, h200).mma_flops / 1e9 for a in algs}
    want = cfg.model_dump(by_alias=True)
    meas = {a: ANCHOR_H200_STEP[a] for a in algs}
    for r in records or []:
        hit = [a for a, (_, torch_alg) in algs.items() if r["algorithm"] == torch_alg]
        if hit and r.get("config") == want and r.get("ncu"):
            n = r["ncu"]
            meas[hit[0]] = {"hbm_gb": (n["dram_read_bytes"] + n["dram_write_bytes"]) / 1e9,
                            "runtime_ms": n["duration_s"] * 1e3}
    fig = make_subplots(rows=1, cols=3, subplot_titles=("GFLOPs", "HBM GB", "runtime ms"))
    groups = ["paper A100", f"iosim {a100.key}", f"iosim {h200.key}", "PyTorch measured H200"]
    for alg, (paper_key, _) in algs.items():
        p, m = PAPER_FIG2[paper_key], meas[alg]
        g = [p["gflops"], pred[a100.key][alg].mma_flops / 1e9, pred[h200.key][alg].mma_flops / 1e9, flops[alg]]
        h = [p["hbm_gb"], pred[a100.key][alg].hbm_bytes / 1e9, pred[h200.key][alg].hbm_bytes / 1e9, m["hbm_gb"]]
        t = [p["runtime_ms"], pred[a100.key][alg].time_s * 1e3, pred[h200.key][alg].time_s * 1e3, m["runtime_ms"]]
        label = "standard" if alg == "eager" else "tiled (recomputing)"
        for col, ys in enumerate((g, h, t), start=1):
            fig.add_trace(go.Bar(x=groups, y=ys, name=label, marker_color=COLORS["naive" if alg == "eager" else alg],
                                 showlegend=col == 1, legendgroup=label), 1, col)
    fig.update_layout(barmode="group", title="GPT-2 medium attention (B 64, H 16, N 1024, d 64), one training step "
                                             "(forward + backward): paper and iosim")
    return fig


def timeline(r: SimResult, sm_limit: int = 24) -> go.Figure:
    """Per-SM block occupancy (first SMs) and per-tier busy spans of one simulated run: waves, overlap, tails."""
    tl = r.timeline
    if tl is None:
        raise ValueError("simulate(..., timeline=True) first")
    fig = go.Figure()
    kernels = sorted({b[1] for b in tl.blocks}, key=lambda k: min(b[2] for b in tl.blocks if b[1] == k))
    palette = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    for i, k in enumerate(kernels):
        sel = [b for b in tl.blocks if b[1] == k and b[0] < sm_limit]
        fig.add_trace(go.Bar(base=[b[2] * 1e6 for b in sel], x=[(b[3] - b[2]) * 1e6 for b in sel],
                             y=[f"SM {b[0]}" for b in sel], orientation="h", name=k, opacity=0.6,
                             marker_color=palette[i % len(palette)]))
    for tier, spans in tl.tiers.items():
        fig.add_trace(go.Bar(base=[a * 1e6 for a, _ in spans], x=[(b - a) * 1e6 for a, b in spans],
                             y=[f"{tier} busy"] * len(spans), orientation="h", name=f"{tier} busy",
                             marker_color="black", opacity=0.5))
    fig.update_layout(barmode="overlay", title=f"Timeline: {r.algorithm}, {r.config_label} on {r.profile}",
                      xaxis_title="µs", height=300 + 18 * sm_limit)
    return fig


def what_if(hw: HardwareProfile, cfg: AttentionConfig | None = None,
            factors: tuple[float, ...] = (0.25, 0.5, 1, 2, 4)) -> go.Figure:
    """Predicted speed-up of tiled over naive attention as one quantity of the profile is scaled."""
    cfg = cfg or AttentionConfig()
    fig = go.Figure()
    for label, fields in (("SRAM size", ("smem_per_sm_kib", "smem_per_block_kib")),
                          ("HBM bandwidth", ("hbm_bandwidth_gb_s",)), ("L2 size", ("l2_capacity_mib",))):
        ys = []
        for f in factors:
            changes = {k: f for k in fields}
            if label == "HBM bandwidth" and f > 1:   # L2 must stay at least as fast as HBM
                changes["l2_bandwidth_gb_s"] = max(1.0, f * hw.hbm_bandwidth_gb_s / hw.l2_bandwidth_gb_s)
            p = hw.scaled(**changes)
            try:
                ys.append(simulate(cfg, "naive", p, max_steps=4).time_s / simulate(cfg, "flash2", p, max_steps=4).time_s)
            except Exception:   # a tiling that no longer fits the scaled SRAM
                ys.append(None)
        fig.add_trace(go.Scatter(x=list(factors), y=ys, mode="lines+markers", name=label))
    fig.update_xaxes(type="log", title_text="scale factor", tickvals=list(factors))
    fig.update_yaxes(title_text="naive time / flash2 time")
    fig.update_layout(title=f"What if: {hw.name}, {cfg.label()}")
    return fig
