"""Score the records of the sweep of effects issue 32 names with the shipped model, effect by effect: how far each
missing effect puts the prediction today.

    python experiments/effects/score.py [--records DIR] [--profile P] [--transfer] [--json FILE]

The sweep ran on an H100 (the device gave no H200): reports/measurements/h100_effects, scored on h100_sxm with the
H200's traits carried (`--transfer`, the default for that folder), as every prediction for that chip is made.

Each configuration of reports/measurements/sweeps/effects_h200.json belongs to one effect (EFFECT below); a row
prints the signed errors (predicted / measured - 1) of time, DRAM bytes and L2 bytes.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from iosim import fit, validate  # noqa: E402
from iosim.hardware import load_profile  # noqa: E402
from iosim.transfer import transferred  # noqa: E402

FOLDER = ROOT / "reports/measurements/h100_effects"


SWEEP = ROOT / "reports/measurements/sweeps/effects_h200.json"
# the sweep's entries in order, as many of each effect (the sweep file's order)
EFFECTS = (["K/V beyond L2"] * 6 + ["long softmax rows"] * 3 + ["rows not a multiple of 8"] * 5
           + ["small grids"] * 8 + ["long-row backward"] * 2)


def effects_by_label() -> dict[str, str]:
    """config label -> the effect its sweep entry was chosen to stress."""
    from iosim.workload import AttentionConfig
    entries = json.loads(SWEEP.read_text())
    assert len(entries) == len(EFFECTS), "the sweep changed: say which effect each entry stresses"
    return {AttentionConfig.make(**e["config"]).label(): eff for e, eff in zip(entries, EFFECTS)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=Path, default=FOLDER, help="a folder of the sweep's records")
    ap.add_argument("--profile", default="h100_sxm", help="profile to predict with")
    ap.add_argument("--transfer", action=argparse.BooleanOptionalAction, default=True,
                    help="the H200's traits carried to --profile (iosim.transfer); --no-transfer: its own fit")
    ap.add_argument("--json", type=Path, help="every row as JSON here")
    args = ap.parse_args()
    hw = load_profile(args.profile)
    if args.transfer:
        moved = transferred(hw)
        hw, traits = moved.profile, moved.traits
    else:
        traits = fit.load(hw)
    records = validate.load_records(args.records)
    effect = effects_by_label()
    rows = validate.validate(records, hw, "all", traits)
    out = []
    for r in rows:
        out.append({"effect": effect[r.label], "run": r.run, "label": r.label, "time_err": r.time_err,
                    "dram_err": r.dram_err, "l2_err": r.l2_err, "pred_s": r.pred_time_s, "meas_s": r.meas_time_s})
    out.sort(key=lambda x: (x["effect"], x["run"], x["label"]))

    def pct(v):
        return "   n/a" if v is None else f"{100 * v:+6.1f}%"
    print(f"{len(out)} records of {len(records)} scored ({hw.key}, "
          f"{'traits carried from the H200' if args.transfer else 'its own traits'})")
    print(f"{'effect':26s} {'run':24s} {'config':42s}   time    DRAM      L2")
    for x in out:
        print(f"{x['effect']:26s} {x['run']:24s} {x['label']:42s} {pct(x['time_err'])} {pct(x['dram_err'])} "
              f"{pct(x['l2_err'])}")
    print("\nby effect, |error| median | max:")
    for e in sorted({x["effect"] for x in out}):
        xs = [x for x in out if x["effect"] == e]
        cols = []
        for f in ("time_err", "dram_err", "l2_err"):
            v = [abs(x[f]) for x in xs if x[f] is not None]
            cols.append(f"{100 * statistics.median(v):5.1f} | {100 * max(v):5.1f}%" if v else "n/a")
        print(f"  {e:26s} n={len(xs):2d}  time {cols[0]}  DRAM {cols[1]}  L2 {cols[2]}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
