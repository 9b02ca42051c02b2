"""The commands about stored measurements: measure and calibrate (on a GPU), fit, validate, report."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.table import Table

from .. import __version__
from ..errors import IosimError
from ..files import check_out_dir
from ..hardware import load_profile
from ..plan import Traits
from ..workload import AttentionConfig
from .console import out


def cmd_measure(args) -> None:
    """GPU side: the only command that imports gpu_kernels (and through it CuPy and torch)."""
    from pathlib import Path
    try:
        from gpu_kernels import measure
    except ImportError as e:
        raise IosimError(f"iosim measure needs the GPU extras (pip install 'iosim[gpu]'): {e}")
    sweep = measure.load_sweep(Path(args.sweep)) if args.sweep else \
        measure.backward_sweep() if args.backward else \
        measure.own_backward_sweep() if args.backward_ours else measure.default_sweep()
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
    out_dir = Path(args.out)
    if args.check:
        return _report_check(args, out_dir)
    check_out_dir(out_dir, "--out")
    if out_dir.is_dir() and any(out_dir.glob("*.html")) and not args.force:
        raise IosimError(f"{out_dir} already holds pages; pass --force to overwrite them")
    for f in _build_pages(args, out_dir):
        out.print(f"written: {f}")


def _build_pages(args, out_dir: Path) -> list[Path]:
    """The report's pages for the command's flags, written under `out_dir`; bad flags fail before any page."""
    from ..progress import track
    from ..records import default_folders
    from ..report import pages
    records = default_folders() if args.records is None else [Path(r) for r in args.records if r]
    for folder in records:
        if not folder.is_dir():
            raise IosimError(f"--records: no measurement folder at {folder}")
    cfg = AttentionConfig.make(batch=args.batch, heads=args.heads, seqlen_q=args.seqlen, head_dim=args.head_dim,
                               dtype=args.dtype, causal=args.causal)
    load_profile(args.profile)
    return pages.build(out_dir, records, lambda xs: track(xs, "figures"), cfg=cfg, profile=args.profile)


def _report_check(args, stored: Path) -> None:
    """--check: build the pages afresh and compare them with those stored in --out; exit 1 where they differ."""
    import tempfile
    if not stored.is_dir() or not any(stored.glob("*.html")):
        raise IosimError(f"--check: no pages in {stored} to check")
    with tempfile.TemporaryDirectory() as tmp:
        fresh = {f.name: f.read_text() for f in _build_pages(args, Path(tmp))}
    old = {f.name: f.read_text() for f in stored.glob("*.html")}
    stale = sorted(n for n in fresh.keys() | old.keys() if fresh.get(n) != old.get(n))
    if stale:
        print(f"iosim: stale pages in {stored}: {', '.join(stale)} (regenerate: iosim report --out {stored} --force)",
              file=sys.stderr)
        sys.exit(1)
    out.print(f"{len(fresh)} pages in {stored} are what this iosim makes")


def cmd_fit(args) -> None:
    from pathlib import Path
    from .. import fit, records as records_mod
    hw = load_profile(args.profile)
    path = Path(args.out) if args.out else fit.traits_path(hw)
    if path.exists() and not args.force:
        raise IosimError(f"{path} exists; pass --force to overwrite it")
    names = [t[0] for t in fit.TARGETS]
    if args.only and args.kernels_only:
        from ..fit_kernels import FAMILIES
        bad = [n for n in args.only if n not in FAMILIES]
        if bad:
            raise IosimError(f"--only with --kernels-only: unknown family {bad[0]!r}; choose from {', '.join(FAMILIES)}")
    elif args.only:
        bad = [n for n in args.only if n not in names]
        if bad:
            raise IosimError(f"--only: unknown target {bad[0]!r}; choose from {', '.join(names)}")
        if not path.exists():
            raise IosimError(f"--only updates {path}, which does not exist yet: run iosim fit without --only")
    folders = [Path(r) for r in args.records] if args.records else records_mod.default_folders()
    records = records_mod.load_all(folders)
    if args.kernels_only:   # one family at a time on its own kernel times: quick, in this process
        return _fit(args, hw, path, names, folders, records, None)
    from ..sweep import Workers
    with Workers(args.scheduler, args.workers) as w:
        _fit(args, hw, path, names, folders, records, w)


def _fit(args, hw, path, names, folders, records, workers) -> None:
    from .. import fit
    from ..fit_kernels import fit_kernels
    if args.kernels_only:
        if not path.exists():
            raise IosimError(f"--kernels-only adds to {path}, which does not exist yet: run iosim fit first")
        kept = json.loads(path.read_text())["kernels"]
        fitted = kept | fit_kernels(records, hw, fit.load(hw, path), progress=out.print, only=args.only)
        fit.save(fitted, hw, " ".join(str(f) for f in folders), path)
        out.print(f"written: {path}")
        return
    if args.last_stage_only:
        if not path.exists():
            raise IosimError(f"--last-stage-only refines {path}, which does not exist yet: run iosim fit first")
        fitted = fit.last_stage(records, hw, fit.load(hw, path), progress=out.print, only=args.only, workers=workers)
    else:
        # refitting some targets: the traits they have compete with the grid's choice
        fitted = fit.fit(records, hw, progress=out.print, only=args.only,
                         incumbent=fit.load(hw, path) if args.only else None, workers=workers)
    if args.only or args.last_stage_only:   # the other entries stay as they were fitted
        kept = json.loads(path.read_text())["kernels"]
        fitted = kept | {n: fitted[n] for n in names if n in fitted}
    else:   # the kernels fitted one at a time start from the families fitted above
        fitted |= fit_kernels(records, hw, {n: Traits(**v["traits"]) for n, v in fitted.items()}, progress=out.print)
        # entries no target here fits (flash3's, fitted on another chip's records by its own script) stay
        other = {n: v for n, v in json.loads(path.read_text())["kernels"].items() if n not in fitted} \
            if path.exists() else {}
        if other:
            out.print(f"kept as they were (no target of iosim fit): {', '.join(sorted(other))}")
        fitted = other | fitted
    fit.save(fitted, hw, " ".join(str(f) for f in folders), path)
    out.print(f"written: {path}")


def cmd_validate(args) -> None:
    from pathlib import Path
    from .. import fit, records, validate as v
    from ..progress import track
    hw = load_profile(args.profile)
    folders = [Path(r) for r in args.records] if args.records else records.default_folders()
    recs = records.load_all(folders)
    if args.transfer and (args.no_fit or args.traits):
        raise IosimError("--transfer carries the H200's fitted traits; it takes neither --no-fit nor --traits")
    if args.transfer:
        from ..transfer import transferred
        moved = transferred(hw)
        hw, traits = moved.profile, moved.traits
    else:
        traits = None if args.no_fit else fit.load(hw, Path(args.traits) if args.traits else None)
    rows = v.validate(recs, hw, args.set, traits, progress=lambda xs: track(xs, "predicting"))
    summ = v.summary(rows)
    where = ", ".join(f.name for f in folders)
    fitted = ("traits carried from " + moved.source if args.transfer else
              "with fitted kernel traits" if traits else "kernel traits at 1.0 (no fit)")
    if args.json:
        print(json.dumps({"profile": hw.key, "set": args.set, "records": [str(f) for f in folders],
                          "fitted_traits": bool(traits), "rows": v.rows_as_json(rows),
                          "summary": [{"set": s, "algorithm": a} | x for (s, a), x in summ.items()],
                          "by_run": [{"set": s, "run": r} | x for (s, r), x in v.bias(rows).items()]}, indent=1))
    elif args.markdown:
        print(v.markdown(summ, f"# Accuracy\n\nMade by `iosim validate --set {args.set} --markdown` (iosim "
                               f"{__version__}); not edited by hand. Predicted ({hw.key}, {fitted}) against "
                               f"measured ({where}): median and max of the |relative error|; time against Nsight "
                               "Compute's kernel durations, L2 bytes as Nsight counts them (`iosim.counters`)."))
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


def cmd_published(args) -> None:
    from pathlib import Path
    from .. import published as pub
    from ..progress import track
    sets = pub.load([Path(f) for f in args.files] if args.files else None)
    carried = args.traits_mode == "measured"
    rows = pub.score(sets, progress=lambda xs: track(xs, "predicting"), traits=carried)
    summ = pub.summary(rows)
    if args.json:
        print(json.dumps({"rows": rows, "summary": [{"gpu": g, "algorithm": a} | x for (g, a), x in summ.items()]},
                         indent=1))
        return
    if args.rows:
        t = Table("GPU", "algorithm", "config", "published TFLOP/s", "predicted", "time error",
                  title="each published record (+: predicted slower)", title_justify="left")
        for r in rows:
            planned = r["error"] is not None
            t.add_row(r["gpu"], r["algorithm"], r["config"], f"{r['published_tflops']:.0f}",
                      f"{r['predicted_tflops']:.0f}" if planned else "-",
                      f"{r['error']:+.1%}" if planned else "not planned")
        out.print(t)
    skipped = [r for r in rows if r["error"] is None]
    if skipped:
        out.print(f"{len(skipped)} records not planned: " + "; ".join(sorted({r["not_planned"] for r in skipped})))
    t = Table("GPU", "profile", "algorithm", "n", "time median", "time max", "signed median",
              title=f"predicted ({'traits carried from the H200, iosim.transfer' if carried else 'peak rates, no traits'}) "
                    "vs published: |relative time error|",
              title_justify="left")
    for (gpu, alg), s in summ.items():
        prof = next(r["profile"] for r in rows if (r["gpu"], r["algorithm"]) == (gpu, alg))
        t.add_row(gpu, prof, alg, str(s["n"]), f"{s['time_median']:.1%}", f"{s['time_max']:.1%}",
                  f"{s['signed_median']:+.1%}")
    out.print(t)
