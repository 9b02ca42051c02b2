"""`iosim` on the command line: profiles, compare (naive vs tiled), simulate, explain; validate, fit, report;
measure and calibrate on a GPU.

Every user error, from a bad flag to a tiling that does not fit, ends in one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import sys

from .. import __version__
from ..errors import IosimError
from .data import cmd_calibrate, cmd_fit, cmd_measure, cmd_published, cmd_report, cmd_validate
from . import console
from .sweep import cmd_sweep
from .layer import add_config_flags, cmd_compare, cmd_explain, cmd_profiles, cmd_simulate


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line and exits 2, like every other user error."""

    def error(self, message: str):
        raise IosimError(message)


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
    p.add_argument("--tiled", default="flash2", choices=["flash1", "flash2", "flash3"],
                   help="the tiled kernel: flash1 or flash2's loop order, or flash3 (Hopper's wgmma and TMA, fp16/bf16)")
    p.add_argument("--naive", default="naive", choices=["naive", "eager"],
                   help="the standard attention compared: iosim's three kernels (naive) or PyTorch's eager one, "
                        "operator by operator (eager)")
    p.add_argument("--analytic", action="store_true", help="closed-form counts and roofline instead of the engine")
    p.add_argument("--no-l2", action="store_true", help="engine without L2: the paper's two-level model")
    p.add_argument("--exact", action="store_true", help="simulate every block, however long it takes "
                   "(default: a large grid is scaled down or dispatched coarse)")
    p.add_argument("--traits", dest="traits_mode", default="peak", choices=["peak", "measured"],
                   help="peak (default): the chip's peak rates, kernels ideal; measured: the kernels' fitted traits "
                        "(on a chip they were not fitted on, carried from the H200, with the error band measured for it)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_compare)
    p = sub.add_parser("simulate", help="simulate one algorithm and show each kernel")
    add_config_flags(p)
    p.add_argument("--algorithm", "-a", default="flash2", choices=["naive", "eager", "flash1", "flash2", "flash3"],
                   help="eager: PyTorch's eager naive attention, operator by operator; flash3: the Hopper forward "
                        "(wgmma, TMA, warp-specialised; its own 128 x 128 tiling)")
    p.add_argument("--no-l2", action="store_true", help="without L2: the paper's two-level model")
    p.add_argument("--exact", action="store_true", help="simulate every block, however long it takes")
    p.add_argument("--timeline", metavar="FILE", help="write the timeline (per SM blocks, per tier busy) as JSON")
    p.add_argument("--force", action="store_true", help="overwrite the --timeline file if it exists")
    p.add_argument("--traits", dest="traits_mode", default="peak", choices=["peak", "measured"],
                   help="peak (default): the chip's peak rates, kernels ideal; measured: the kernels' fitted traits "
                        "(on a chip they were not fitted on, carried from the H200, with the error band measured for it)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_simulate)
    p = sub.add_parser("measure", help="on a GPU machine: time the kernels and count their bytes (Nsight Compute)")
    p.add_argument("--out", required=True, help="folder of JSON records (resumes there); reports/measurements/"
                   "<set> of a source checkout is where fit and validate look")
    p.add_argument("--no-ncu", action="store_true", help="time only; no Nsight Compute pass")
    p.add_argument("--limit", type=int, default=None, help="only the first N records of the sweep")
    p.add_argument("--sweep", default=None, help="sweep file (JSON, as gpu_kernels.measure.load_sweep reads; "
                   "default: the built-in sweep)")
    p.add_argument("--backward", action="store_true", help="the built-in backward sweep: PyTorch's eager and flash "
                   "attention, backward and forward+backward")
    p.add_argument("--backward-ours", action="store_true", help="the built-in backward sweep of iosim's own "
                   "kernels (flash2 everywhere, naive and flash1 where they fit)")
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
    p.add_argument("--transfer", action="store_true", help="predict with the H200's measured shares and fitted "
                   "traits carried to --profile (iosim.transfer), as on a chip nobody fitted")
    p.add_argument("--by-run", action="store_true",
                   help="also the signed time error by run (algorithm and tiling): which builds are slow or fast")
    p.add_argument("--json", action="store_true", help="every row and the summary as JSON")
    p.add_argument("--markdown", action="store_true", help="the summary as a Markdown table (docs/accuracy.md)")
    p.set_defaults(func=cmd_validate)
    p = sub.add_parser("published", help="predict published speeds of chips not measured here "
                       "(reports/published: FlashAttention-2's and -3's A100 and H100 figures)")
    p.add_argument("files", nargs="*", help="published-results files (default: every file in reports/published)")
    p.add_argument("--rows", action="store_true", help="also each record's published and predicted speed")
    p.add_argument("--traits", dest="traits_mode", default="measured", choices=["peak", "measured"],
                   help="measured (default): the H200's traits carried to each chip (iosim.transfer); peak: the "
                        "datasheet's peak rates, kernels ideal")
    p.add_argument("--json", action="store_true", help="every row and the summary as JSON")
    p.set_defaults(func=cmd_published)
    p = sub.add_parser("report", help="write the HTML report pages (plotly, offline)")
    p.add_argument("--out", default="reports/site", help="folder for the pages")
    p.add_argument("--records", nargs="+", default=None, metavar="FOLDER",
                   help="folders of measurement records for the measured parts ('' for none; default: every "
                        "record set)")
    p.add_argument("--force", action="store_true", help="overwrite pages already there")
    p.add_argument("--check", action="store_true", help="build the pages afresh and exit 1 if those in --out differ")
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
    p.add_argument("--kernels-only", action="store_true",
                   help="start from the fitted traits and fit only the kernels fitted one at a time on their own "
                        "Nsight times (eager PyTorch's kernels, the backward kernels); keep the rest (with --only: "
                        "only those families)")
    p.add_argument("--force", action="store_true")
    add_worker_flags(p)
    p.set_defaults(func=cmd_fit)
    p = sub.add_parser("sweep", help="predict every point of a TOML spec (profiles, what-ifs, layers, algorithms, "
                       "passes) on local workers or a Dask cluster; resumable")
    p.add_argument("spec", help="the spec (a TOML file; `iosim sweep --example` prints one)", nargs="?")
    p.add_argument("--out", default=None, help="folder for the results (default: sweeps/<spec's name>)")
    p.add_argument("--force", action="store_true", help="start --out over where it holds another spec's sweep")
    p.add_argument("--example", action="store_true", help="print an example spec and exit")
    add_worker_flags(p)
    p.set_defaults(func=cmd_sweep)
    return parser


def add_worker_flags(p) -> None:
    p.add_argument("--workers", type=int, default=None,
                   help="local worker processes (default: one a core; 1 runs in this process)")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="run on this Dask cluster's workers instead (tcp://host:8786; iosim installed there)")


def main(argv: list[str] | None = None) -> None:
    """Entry point: user errors are one line on stderr and exit status 2, never a traceback."""
    try:
        args = build_parser().parse_args(argv)
        if args.command == "profiles" and args.action == "show" and not args.name:
            raise IosimError("profiles show needs a profile name or path")
        args.func(args)
        for line in console.NOTES:
            print(line, file=sys.stderr)
        console.NOTES.clear()
    except IosimError as e:
        console.NOTES.clear()
        print(f"iosim: error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:   # the reader went away (`iosim explain | head`): not an error of ours
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)


if __name__ == "__main__":
    main()
