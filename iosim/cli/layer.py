"""The commands about one layer on one chip: profiles, compare, simulate, explain; the layer and tiling flags."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.table import Table

from .. import __version__
from ..errors import IosimError
from ..files import check_writable, write_text
from ..hardware import HardwareProfile, list_profiles, load_profile
from ..kernels.cublas import meets_align1
from ..plan import Tiling
from ..workload import PASS_NAMES, AttentionConfig
from .console import SLOW_BLOCKS, note, out


def cmd_profiles(args) -> None:
    if args.name:
        return _profile_show(args.name)
    t = Table("profile", "name", "SMs", "SRAM/SM KiB", "L2 MiB", "HBM GB/s", "fp16 TFLOP/s")
    for key in list_profiles():
        p = load_profile(key)
        t.add_row(key, p.name, str(p.sm_count), f"{p.smem_per_sm_kib:g}", f"{p.l2_capacity_mib:g}",
                  f"{p.hbm_bandwidth_gb_s:g}", f"{p.tensor_fp16_tflops:g}")
    out.print(t)


def _profile_show(name: str) -> None:
    p = load_profile(name)
    t = Table("field", "value", "source", title=f"{p.name} ({p.key})", title_justify="left")
    for f in HardwareProfile.quantity_fields():
        v = getattr(p, f)
        t.add_row(f, "-" if v is None else f"{v:g}", p.sources.get(f, "not on this chip"))
    out.print(t)


# ---- config and tiling flags, shared by the commands ------------------------------------------------------


def add_config_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("layer (default: the paper's GPT-2 medium layer)")
    g.add_argument("--profile", "-p", default="a100_40gb", help="profile name or .toml path (default a100_40gb)")
    g.add_argument("--batch", type=int, default=64)
    g.add_argument("--heads", type=int, default=16, help="query heads")
    g.add_argument("--kv-heads", type=int, default=None, help="key/value heads (grouped-query); default = heads")
    g.add_argument("--seqlen", "-n", type=int, default=1024, help="query sequence length N")
    g.add_argument("--seqlen-k", type=int, default=None, help="key sequence length; default = --seqlen")
    g.add_argument("--head-dim", "-d", type=int, default=64)
    g.add_argument("--dtype", default="fp16", help="fp32, fp16, bf16 or fp8")
    g.add_argument("--causal", action="store_true", help="causal mask, bottom-right aligned")
    g.add_argument("--pass", dest="pass_", default="forward",
                   help="forward, backward, or train (forward then backward: a training step)")
    t = p.add_argument_group("tiling of the tiled kernel")
    t.add_argument("--tiling", default="practice", help="preset: practice (FlashAttention-2's sizes) or paper")
    t.add_argument("--block-q", type=int, default=None, help="query block Br (overrides the preset)")
    t.add_argument("--block-kv", type=int, default=None, help="key/value block Bc (overrides the preset)")
    t.add_argument("--warps", type=int, default=None)
    t.add_argument("--stages", type=int, default=None, help="K/V buffers; 2 = double buffering")
    t.add_argument("--grid-order", default=None, help="q_fastest or bh_fastest")
    t.add_argument("--q-order", default=None, help="ascending or descending (a causal head's longest blocks first)")
    t.add_argument("--kv-splits", type=int, default=None,
                   help="flash2: split each query block's keys over this many blocks, then combine (split-KV)")


TILING_FLAGS = ("block_q", "block_kv", "warps", "stages", "grid_order", "q_order", "kv_splits")


def config_from(args) -> AttentionConfig:
    if args.pass_ not in PASS_NAMES and args.pass_ not in PASS_NAMES.values():
        raise IosimError(f"--pass must be forward, backward or train (forward+backward), got '{args.pass_}'")
    return AttentionConfig.make(batch=args.batch, heads=args.heads, kv_heads=args.kv_heads, seqlen_q=args.seqlen,
                                seqlen_k=args.seqlen_k, head_dim=args.head_dim, dtype=args.dtype,
                                causal=args.causal, **{"pass": PASS_NAMES.get(args.pass_, args.pass_)})


def tiling_from(args, cfg: AttentionConfig, hw: HardwareProfile, algorithm: str) -> Tiling:
    if args.tiling not in ("practice", "paper"):
        raise IosimError(f"--tiling must be 'practice' or 'paper', got '{args.tiling}'")
    if algorithm == "flash3":
        from ..plan.flash3 import tiling
        given = [f"--{k.replace('_', '-')}" for k in TILING_FLAGS if getattr(args, k) is not None]
        if given or args.tiling != "practice":
            raise IosimError(f"flash3 runs one tiling ({tiling(cfg).describe()}); drop "
                             f"{', '.join(given) or '--tiling'}")
        return tiling(cfg)
    base = Tiling.practice(cfg, algorithm) if args.tiling == "practice" else Tiling.paper(cfg, hw, algorithm)
    changes = {k: getattr(args, k) for k in TILING_FLAGS if getattr(args, k) is not None}
    til = Tiling.make(**(base.model_dump() | changes))
    if args.tiling == "practice" and not {"block_q", "block_kv", "warps", "stages"} & set(changes):
        fit = til.shrunk_to_fit(cfg, hw)   # the default shrinks to a tiling that fits, and says so
        if fit != til:
            note(f"{til.describe()} needs {til.smem_bytes(cfg) / 1024:.1f} KiB of shared memory a block "
                 f"on {hw.key} ({hw.smem_per_block_kib:g} allowed); using {fit.describe()}")
        til = fit
    return til


def _predict(args, cfg, hw, algorithm, tiling):
    """The engine's prediction (default) or the analytic model's (--analytic)."""
    if args.analytic:
        from ..analytic import analyze
        return analyze(cfg, algorithm, hw, tiling)
    from ..engine import simulate
    exact = getattr(args, "exact", False)
    if exact:
        from ..plan import build_plan
        blocks = sum(k.n_blocks for k in build_plan(cfg, algorithm, hw, tiling).kernels)
        if blocks > SLOW_BLOCKS:
            # said before the run, not after: it may take minutes
            print(f"iosim: note: {algorithm} runs {blocks:,} thread blocks here; with --exact the engine may take "
                  f"minutes (without it, a large grid is scaled down)", file=sys.stderr)
    traits = None
    if getattr(args, "traits_mode", "peak") == "measured":
        from ..transfer import for_prediction
        hw, traits, band = for_prediction(cfg, hw, algorithm, tiling)
        args.bands = getattr(args, "bands", {}) | {algorithm: band}
        note(f"{algorithm}: {band['text']}")
    r = simulate(cfg, algorithm, hw, tiling, l2=not args.no_l2, timeline=bool(getattr(args, "timeline", None)),
                 exact=exact, traits=traits)
    if r.scaled:
        note(f"{algorithm}: {r.scaled} (docs/model.md, bounded cost; --exact simulates every block)")
    if meets_align1(algorithm, cfg) and traits is None:
        note(f"{algorithm}: at {cfg.seqlen_q} x {cfg.seqlen_k} {cfg.dtype} the score matrices' rows are not "
             f"16-byte aligned; cuBLAS then runs alignment-1 GEMMs, 3x slower than its own on the H200, which "
             f"this prediction runs at the chip's peak rates (no fitted traits), so it is fast "
             f"(experiments/cublas_alignment)")
    return r


def _model_name(args, hw) -> str:
    if args.analytic:
        return "analytic, two-level (no L2)"
    return "engine, two-level (no L2)" if args.no_l2 or hw.l2_bytes == 0 else "engine, with L2"


def cmd_compare(args) -> None:
    hw = load_profile(args.profile)
    cfg = config_from(args)
    til = tiling_from(args, cfg, hw, args.tiled)
    flash = _predict(args, cfg, hw, args.tiled, til)   # first: a tiling that cannot fit is the error to report
    naive = _predict(args, cfg, hw, args.naive, None)
    if args.json:
        print(json.dumps({"iosim": __version__, "model": _model_name(args, hw), "profile": hw.key,
                          "config": cfg.model_dump(by_alias=True), "tiling": til.model_dump(),
                          args.naive: _as_dict(naive), args.tiled: _as_dict(flash),
                          "speedup": naive.time_s / flash.time_s, "error_bands": getattr(args, "bands", None),
                          "hbm_traffic_ratio": naive.hbm_bytes / flash.hbm_bytes}, indent=1))
        return
    t = Table("", args.naive, f"tiled ({til.describe()})", "naive / tiled",
              title=f"{cfg.label()} on {hw.key}: {_model_name(args, hw)}", title_justify="left")
    rows = _compare_rows(naive, flash)
    if "backward" in cfg.passes:   # what the tiled backward recomputes instead of storing P
        from ..analytic import analyze
        rec = analyze(cfg, args.tiled, hw, til).recompute_flops
        rows.insert(1, ("  of which recomputed", "0.0 G", f"{rec / 1e9:,.1f} G", "-"))
    for r in rows:
        t.add_row(*r)
    out.print(t)


def _tilings(cfg: AttentionConfig, til: Tiling, bwd: Tiling | None) -> str:
    """The blocks each pass runs (`bwd`: the backward's, where one runs)."""
    if bwd is None:
        return til.describe()
    return bwd.describe() if cfg.pass_ == "backward" else f"forward {til.describe()}, backward {bwd.describe()}"


def cmd_simulate(args) -> None:
    hw = load_profile(args.profile)
    cfg = config_from(args)
    til = tiling_from(args, cfg, hw, args.algorithm) if args.algorithm.startswith("flash") else None
    # the backward runs FlashAttention-2's blocks (`Tiling.backward`), whatever the forward's tiling
    bwd = Tiling.backward(cfg, til.loop_order) if til and "backward" in cfg.passes else None
    if args.timeline:
        check_writable(Path(args.timeline), "--timeline", args.force)
    args.analytic = False
    r = _predict(args, cfg, hw, args.algorithm, til)
    if args.timeline:
        write_text(Path(args.timeline), json.dumps(r.timeline.as_dict()), "--timeline")
    if args.json:
        print(json.dumps({"iosim": __version__, "model": _model_name(args, hw),
                          "config": cfg.model_dump(by_alias=True),
                          "tiling": til.model_dump() if til else None,
                          "backward_tiling": bwd.model_dump() if bwd else None,
                          "error_band": getattr(args, "bands", {}).get(args.algorithm)} | r.as_dict(), indent=1))
        return
    name = args.algorithm + (f" ({_tilings(cfg, til, bwd)})" if til else "")
    t = Table("kernel", "blocks", "per SM", "waves", "time", "HBM read", "HBM write", "L2 traffic", "L2 hits",
              "TFLOP/s", "HBM GB/s", "bound",
              title=f"{name}, {cfg.label()} on {hw.key}: {_model_name(args, hw)}", title_justify="left")
    for k in r.kernels:
        l2 = k.l2_read_bytes + k.l2_write_bytes
        hits = k.l2_hit_bytes / k.l2_read_bytes if k.l2_read_bytes else 0.0
        t.add_row(k.name, f"{k.blocks:,}", str(k.blocks_per_sm), f"{k.waves:.2f}", f"{k.time_s * 1e6:,.1f} us",
                  _fmt_bytes(k.hbm_read_bytes), _fmt_bytes(k.hbm_write_bytes), _fmt_bytes(l2) if l2 else "-",
                  f"{hits:.0%}" if l2 else "-", f"{k.mma_flops / k.time_s / 1e12:,.1f}",
                  f"{(k.hbm_read_bytes + k.hbm_write_bytes) / k.time_s / 1e9:,.0f}", k.bound)
    flush = sum(r.hbm_flush_bytes.values())
    t.add_row("total", "", "", "", f"{r.time_s * 1e6:,.1f} us", _fmt_bytes(r.hbm_read_bytes),
              _fmt_bytes(r.hbm_write_bytes), _fmt_bytes(r.l2_bytes) if r.l2_bytes else "-", "",
              f"{r.mma_flops / r.time_s / 1e12:,.1f}", "", r.bound)
    out.print(t)
    if flush:
        out.print(f"HBM write includes {_fmt_bytes(flush)} still dirty in L2 at the end, written back after it.")
    if args.timeline:
        out.print(f"timeline written to {args.timeline}")


def cmd_explain(args) -> None:
    from ..report.explain import explain
    hw = load_profile(args.profile)
    cfg = config_from(args)
    print(explain(cfg, hw, tiling_from(args, cfg, hw, "flash2")))


def _as_dict(a) -> dict:
    d = {"matmul_flops": a.mma_flops, "exp_ops": a.exp_ops, "other_flops": a.other_flops,
         **({"recomputed_matmul_flops": a.recompute_flops} if hasattr(a, "recompute_flops") else {}),
         "hbm_read_bytes": a.hbm_read_bytes, "hbm_write_bytes": a.hbm_write_bytes, "hbm_bytes": a.hbm_bytes,
         "hbm_bytes_per_tensor": {t: {"read": r, "write": w} for t, (r, w) in a.per_tensor().items()},
         "intensity_flop_per_byte": a.intensity, "bound": a.bound, "time_s": a.time_s,
         "peak_hbm_footprint_bytes": a.peak_footprint_bytes}
    if hasattr(a, "l2_bytes"):
        d["l2_bytes"] = a.l2_bytes
        d["kernels"] = [k.as_dict() for k in a.kernels]
    else:
        d["kernels"] = [{"name": k.name, "hbm_bytes": k.hbm_bytes, "roofline_s": r}
                        for k, r in zip(a.kernels, a.roofline_by_kernel())]
    return d


def _fmt_bytes(b: float) -> str:
    for unit, s in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if b >= s:
            return f"{b / s:,.2f} {unit}"
    return f"{b:,.0f} B"


def _compare_rows(n, f) -> list[tuple[str, str, str, str]]:
    def row(label, a, b, fmt):
        return label, fmt(a), fmt(b), f"{a / b:.2f}x" if b else "-"
    g = lambda x: f"{x / 1e9:,.1f} G"  # noqa: E731
    rows = [
        row("matmul FLOPs", n.mma_flops, f.mma_flops, g),
        row("exp ops", n.exp_ops, f.exp_ops, g),
        row("HBM read", n.hbm_read_bytes, f.hbm_read_bytes, _fmt_bytes),
        row("HBM write", n.hbm_write_bytes, f.hbm_write_bytes, _fmt_bytes),
        row("HBM total", n.hbm_bytes, f.hbm_bytes, _fmt_bytes),
    ]
    if getattr(n, "l2_bytes", 0):
        rows.append(row("L2 traffic", n.l2_bytes, f.l2_bytes, _fmt_bytes))
    return rows + [
        row("intensity (FLOP/B)", n.intensity, f.intensity, lambda x: f"{x:,.1f}"),
        ("bound", n.bound, f.bound, ""),
        row("predicted time", n.time_s, f.time_s, lambda x: f"{x * 1e3:,.3f} ms"),
        row("peak HBM footprint", n.peak_footprint_bytes, f.peak_footprint_bytes, _fmt_bytes),
    ]
