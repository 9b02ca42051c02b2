"""`iosim` on the command line: profiles, compare (naive vs tiled), simulate.

Every user error, from a bad flag to a tiling that does not fit, ends in one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table

from . import __version__
from .errors import IosimError
from .hardware import HardwareProfile, list_profiles, load_profile
from .plan import Tiling
from .workload import AttentionConfig

out = Console(width=None if sys.stdout.isatty() else 140)  # piped output: room for the tables


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line and exits 2, like every other user error."""

    def error(self, message: str):
        raise IosimError(message)


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
    g.add_argument("--pass", dest="pass_", default="forward", help="forward (backward is not modelled yet)")
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


def config_from(args) -> AttentionConfig:
    return AttentionConfig.make(batch=args.batch, heads=args.heads, kv_heads=args.kv_heads, seqlen_q=args.seqlen,
                                seqlen_k=args.seqlen_k, head_dim=args.head_dim, dtype=args.dtype,
                                causal=args.causal, **{"pass": args.pass_})


def tiling_from(args, cfg: AttentionConfig, hw: HardwareProfile, algorithm: str) -> Tiling:
    if args.tiling not in ("practice", "paper"):
        raise IosimError(f"--tiling must be 'practice' or 'paper', got '{args.tiling}'")
    base = Tiling.practice(cfg, algorithm) if args.tiling == "practice" else Tiling.paper(cfg, hw, algorithm)
    changes = {k: getattr(args, k) for k in ("block_q", "block_kv", "warps", "stages", "grid_order", "q_order",
                                                        "kv_splits")
               if getattr(args, k) is not None}
    return Tiling.make(**(base.model_dump() | changes))


def _predict(args, cfg, hw, algorithm, tiling):
    """The engine's prediction (default) or the analytic model's (--analytic)."""
    if args.analytic:
        from .analytic import analyze
        return analyze(cfg, algorithm, hw, tiling)
    from .engine import simulate
    return simulate(cfg, algorithm, hw, tiling, l2=not args.no_l2, timeline=bool(getattr(args, "timeline", None)))


def _model_name(args, hw) -> str:
    if args.analytic:
        return "analytic, two-level (no L2)"
    return "engine, two-level (no L2)" if args.no_l2 or hw.l2_bytes == 0 else "engine, with L2"


def cmd_compare(args) -> None:
    hw = load_profile(args.profile)
    cfg = config_from(args)
    til = tiling_from(args, cfg, hw, args.tiled)
    flash = _predict(args, cfg, hw, args.tiled, til)   # first: a tiling that cannot fit is the error to report
    naive = _predict(args, cfg, hw, "naive", None)
    if args.json:
        print(json.dumps({"iosim": __version__, "model": _model_name(args, hw), "profile": hw.key,
                          "config": cfg.model_dump(by_alias=True), "tiling": til.model_dump(),
                          "naive": _as_dict(naive), args.tiled: _as_dict(flash),
                          "speedup": naive.time_s / flash.time_s,
                          "hbm_traffic_ratio": naive.hbm_bytes / flash.hbm_bytes}, indent=1))
        return
    t = Table("", "naive", f"tiled ({til.describe()})", "naive / tiled",
              title=f"{cfg.label()} on {hw.key}: {_model_name(args, hw)}", title_justify="left")
    for r in _compare_rows(naive, flash):
        t.add_row(*r)
    out.print(t)


def cmd_simulate(args) -> None:
    from pathlib import Path
    hw = load_profile(args.profile)
    cfg = config_from(args)
    til = tiling_from(args, cfg, hw, args.algorithm) if args.algorithm != "naive" else None
    if args.timeline and Path(args.timeline).exists() and not args.force:
        raise IosimError(f"{args.timeline} exists; pass --force to overwrite it")
    args.analytic = False
    r = _predict(args, cfg, hw, args.algorithm, til)
    if args.timeline:
        Path(args.timeline).write_text(json.dumps(r.timeline.as_dict()))
    if args.json:
        print(json.dumps({"iosim": __version__, "model": _model_name(args, hw),
                          "config": cfg.model_dump(by_alias=True),
                          "tiling": til.model_dump() if til else None} | r.as_dict(), indent=1))
        return
    name = args.algorithm + (f" ({til.describe()})" if til else "")
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


def cmd_measure(args) -> None:
    """GPU side: the only command that imports gpu_kernels (and through it CuPy and torch)."""
    from pathlib import Path
    try:
        from gpu_kernels import measure
    except ImportError as e:
        raise IosimError(f"iosim measure needs the GPU extras (pip install 'iosim[gpu]'): {e}")
    sweep = measure.load_sweep(Path(args.sweep)) if args.sweep else measure.default_sweep()
    n = measure.measure(Path(args.out), sweep, ncu=not args.no_ncu, limit=args.limit)
    out.print(f"{n} new records in {args.out}")


def cmd_calibrate(args) -> None:
    """GPU side: microbenchmarks into a calibrated profile (imports gpu_kernels, and through it CuPy)."""
    from pathlib import Path
    try:
        from gpu_kernels import calibrate
    except ImportError as e:
        raise IosimError(f"iosim calibrate needs the GPU extras (pip install 'iosim[gpu]'): {e}")
    calibrate.calibrate(args.profile, Path(args.out) if args.out else None, args.force)


def cmd_report(args) -> None:
    from pathlib import Path
    from .report import pages
    out_dir = Path(args.out)
    if out_dir.exists() and any(out_dir.glob("*.html")) and not args.force:
        raise IosimError(f"{out_dir} already holds pages; pass --force to overwrite them")
    from .records import default_folders
    records = default_folders() if args.records is None else [Path(r) for r in args.records if r]
    for folder in records:
        if not folder.is_dir():
            raise IosimError(f"--records: no measurement folder at {folder}")
    from .progress import track
    progress = lambda xs: track(xs, "figures")  # noqa: E731
    cfg = AttentionConfig.make(batch=args.batch, heads=args.heads, seqlen_q=args.seqlen, head_dim=args.head_dim,
                               dtype=args.dtype, causal=args.causal)
    load_profile(args.profile)   # a bad name is reported before any page is written
    for f in pages.build(out_dir, records, progress, cfg=cfg, profile=args.profile):
        out.print(f"written: {f}")


def cmd_explain(args) -> None:
    from .report.explain import explain
    hw = load_profile(args.profile)
    cfg = config_from(args)
    print(explain(cfg, hw, tiling_from(args, cfg, hw, "flash2")))


def cmd_fit(args) -> None:
    from pathlib import Path
    from . import fit, records as records_mod
    hw = load_profile(args.profile)
    path = Path(args.out) if args.out else fit.traits_path(hw)
    if path.exists() and not args.force:
        raise IosimError(f"{path} exists; pass --force to overwrite it")
    names = [t[0] for t in fit.TARGETS]
    if args.only:
        bad = [n for n in args.only if n not in names]
        if bad:
            raise IosimError(f"--only: unknown target {bad[0]!r}; choose from {', '.join(names)}")
        if not path.exists():
            raise IosimError(f"--only updates {path}, which does not exist yet: run iosim fit without --only")
    folders = [Path(r) for r in args.records] if args.records else records_mod.default_folders()
    records = records_mod.load_all(folders)
    if args.last_stage_only:
        if not path.exists():
            raise IosimError(f"--last-stage-only refines {path}, which does not exist yet: run iosim fit first")
        fitted = fit.last_stage(records, hw, fit.load(hw, path), progress=out.print, only=args.only)
    else:
        # refitting some targets: the traits they have compete with the grid's choice
        fitted = fit.fit(records, hw, progress=out.print, only=args.only,
                         incumbent=fit.load(hw, path) if args.only else None)
    if args.only or args.last_stage_only:   # the other targets' entries stay as they were fitted
        kept = json.loads(path.read_text())["kernels"]
        fitted = {n: fitted.get(n, kept.get(n)) for n in names if n in fitted or n in kept}
    fit.save(fitted, hw, " ".join(str(f) for f in folders), path)
    out.print(f"written: {path}")


def cmd_validate(args) -> None:
    from pathlib import Path
    from . import fit, records, validate as v
    from .progress import track
    hw = load_profile(args.profile)
    folders = [Path(r) for r in args.records] if args.records else records.default_folders()
    recs = records.load_all(folders)
    traits = None if args.no_fit else fit.load(hw, Path(args.traits) if args.traits else None)
    rows = v.validate(recs, hw, args.set, traits, progress=lambda xs: track(xs, "predicting"))
    summ = v.summary(rows)
    where = ", ".join(f.name for f in folders)
    fitted = "with fitted kernel traits" if traits else "kernel traits at 1.0 (no fit)"
    if args.json:
        print(json.dumps({"profile": hw.key, "set": args.set, "records": [str(f) for f in folders],
                          "fitted_traits": bool(traits), "rows": v.rows_as_json(rows),
                          "summary": [{"set": s, "algorithm": a} | x for (s, a), x in summ.items()],
                          "by_run": [{"set": s, "run": r} | x for (s, r), x in v.bias(rows).items()]}, indent=1))
    elif args.markdown:
        print(v.markdown(summ, f"Predicted ({hw.key}, {fitted}) against measured ({where}), {args.set} set: "
                               f"|relative error|; time against Nsight Compute's kernel durations."))
    else:
        t = Table("set", "algorithm", "n", "time median", "time max", "DRAM median", "DRAM max", "L2 median",
                  "L2 max", title=f"predicted ({hw.key}, {fitted}) vs measured ({where}): |relative error|",
                  title_justify="left")
        for (st, alg), s in summ.items():
            t.add_row(st, alg, str(s["n"]), *(f"{s[k]:.1%}" for k in ("time_median", "time_max", "dram_median",
                                                                      "dram_max", "l2_median", "l2_max")))
        out.print(t)
        if args.by_run:
            t = Table("set", "run", "n", "time mean", "time median",
                      title="signed relative time error by run (+: predicted slower than measured)",
                      title_justify="left")
            for (st, run), s in v.bias(rows).items():
                t.add_row(st, run, str(s["n"]), f"{s['time_mean']:+.1%}", f"{s['time_median']:+.1%}")
            out.print(t)
    bad = v.over_thresholds(summ, {"time_median": args.max_time_median, "time_max": args.max_time_max,
                                   "dram_median": args.max_dram_median, "l2_median": args.max_l2_median})
    if bad:
        for b in bad:
            print(f"iosim: beyond threshold: {b}", file=sys.stderr)
        sys.exit(1)


def _as_dict(a) -> dict:
    d = {"matmul_flops": a.mma_flops, "exp_ops": a.exp_ops, "other_flops": a.other_flops,
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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="iosim", description="Predict and explain the HBM traffic and runtime of naive and "
                     "tiled (FlashAttention) attention on a GPU's memory hierarchy.")
    parser.add_argument("--version", action="version", version=f"iosim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = sub.add_parser("profiles", help="list the hardware profiles, or show one with its sources")
    p.add_argument("action", nargs="?", choices=["show"], help="show one profile")
    p.add_argument("name", nargs="?", help="profile name or .toml path")
    p.set_defaults(func=cmd_profiles)
    p = sub.add_parser("compare", help="naive against tiled attention for one layer on one profile")
    add_config_flags(p)
    p.add_argument("--tiled", default="flash2", choices=["flash1", "flash2"], help="tiled loop order")
    p.add_argument("--analytic", action="store_true", help="closed-form counts and roofline instead of the engine")
    p.add_argument("--no-l2", action="store_true", help="engine without L2: the paper's two-level model")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_compare)
    p = sub.add_parser("simulate", help="simulate one algorithm and show each kernel")
    add_config_flags(p)
    p.add_argument("--algorithm", "-a", default="flash2", choices=["naive", "flash1", "flash2"])
    p.add_argument("--no-l2", action="store_true", help="without L2: the paper's two-level model")
    p.add_argument("--timeline", metavar="FILE", help="write the timeline (per SM blocks, per tier busy) as JSON")
    p.add_argument("--force", action="store_true", help="overwrite the --timeline file if it exists")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_simulate)
    p = sub.add_parser("measure", help="on a GPU machine: time the kernels and count their bytes (Nsight Compute)")
    p.add_argument("--out", required=True, help="folder of JSON records (resumes there); reports/measurements/"
                   "<set> of a source checkout is where fit and validate look")
    p.add_argument("--no-ncu", action="store_true", help="time only; no Nsight Compute pass")
    p.add_argument("--limit", type=int, default=None, help="only the first N records of the sweep")
    p.add_argument("--sweep", default=None, help="sweep file (JSON, as gpu_kernels.measure.load_sweep reads; "
                   "default: the built-in sweep)")
    p.set_defaults(func=cmd_measure)
    p = sub.add_parser("calibrate", help="on a GPU machine: microbenchmarks into a calibrated profile")
    p.add_argument("--profile", "-p", default="h200_sxm", help="the datasheet profile to start from")
    p.add_argument("--out", default=None, help="default: hw_profiles/<profile>.calibrated.toml")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.set_defaults(func=cmd_calibrate)
    p = sub.add_parser("validate", help="predicted against measured for stored records; exit 1 beyond thresholds")
    p.add_argument("--records", nargs="+", default=None, metavar="FOLDER",
                   help="folders of measurement records (default: every record set, reports/measurements/*)")
    p.add_argument("--profile", "-p", default="h200_sxm.calibrated", help="profile to predict with "
                   "(default h200_sxm.calibrated, the chip the records were measured on)")
    p.add_argument("--set", default="validation", help="validation (default), calibration, holdout or all")
    for name in ("time-median", "time-max", "dram-median", "l2-median"):
        p.add_argument(f"--max-{name}", type=float, default=None, metavar="FRACTION",
                       help=f"fail when the {name.replace('-', ' ')} |relative error| of any algorithm is above")
    p.add_argument("--traits", default=None, help="fitted kernel traits (default: <profile>.kernels.json if any)")
    p.add_argument("--no-fit", action="store_true", help="ignore fitted traits: efficiencies 1.0")
    p.add_argument("--by-run", action="store_true",
                   help="also the signed time error by run (algorithm and tiling): which builds are slow or fast")
    p.add_argument("--json", action="store_true", help="every row and the summary as JSON")
    p.add_argument("--markdown", action="store_true", help="the summary as a Markdown table (docs/accuracy.md)")
    p.set_defaults(func=cmd_validate)
    p = sub.add_parser("report", help="write the HTML report pages (plotly, offline)")
    p.add_argument("--out", default="reports/site", help="folder for the pages")
    p.add_argument("--records", nargs="+", default=None, metavar="FOLDER",
                   help="folders of measurement records for the measured parts ('' for none; default: every "
                        "record set)")
    p.add_argument("--force", action="store_true", help="overwrite pages already there")
    g = p.add_argument_group("the layer and chip the pages show (default: GPT-2 medium's layer on the H200)")
    g.add_argument("--profile", "-p", default="h200_sxm", help="profile name or .toml path")
    g.add_argument("--batch", type=int, default=64)
    g.add_argument("--heads", type=int, default=16)
    g.add_argument("--seqlen", "-n", type=int, default=1024)
    g.add_argument("--head-dim", "-d", type=int, default=64)
    g.add_argument("--dtype", default="fp16", help="fp32, fp16, bf16 or fp8")
    g.add_argument("--causal", action="store_true")
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("explain", help="where the bytes go and what bounds each kernel, in words")
    add_config_flags(p)
    p.set_defaults(func=cmd_explain)
    p = sub.add_parser("fit", help="fit kernel efficiencies on the calibration set of stored records")
    p.add_argument("--records", nargs="+", default=None, metavar="FOLDER",
                   help="record folders; only their calibration records are read (default: every record set)")
    p.add_argument("--profile", "-p", default="h200_sxm.calibrated")
    p.add_argument("--out", default=None, help="default: hw_profiles/<profile>.kernels.json")
    p.add_argument("--only", nargs="+", default=None, metavar="TARGET",
                   help="refit these targets (naive, naive_softmax, flash1, flash2, torch_flash), keep the others")
    p.add_argument("--last-stage-only", action="store_true",
                   help="start from the fitted traits and run only the last stages (our kernels' store-issue rate with "
                        "the block overhead, the latency shape refined, the tiled kernels' diagonal tile cost)")
    p.add_argument("--force", action="store_true")
    p.set_defaults(func=cmd_fit)
    return parser


def main(argv: list[str] | None = None) -> None:
    """Entry point: user errors are one line on stderr and exit status 2, never a traceback."""
    try:
        args = build_parser().parse_args(argv)
        if args.command == "profiles" and args.action == "show" and not args.name:
            raise IosimError("profiles show needs a profile name or path")
        args.func(args)
    except IosimError as e:
        print(f"iosim: error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
