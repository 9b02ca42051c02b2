"""The error bands of predictions with transferred traits (hw_profiles/transfer_bands.json, read by
`iosim.transfer.band`): per architecture and plan family, the median and max |relative time error| of the H200's
traits carried to chips nothing was fitted on, from two kinds of evidence:

- records measured on an H100 (reports/measurements/h100_transfer), scored by
  `iosim validate --records reports/measurements/h100_transfer -p h100_sxm --transfer --json > H100.json`;
- published speeds (reports/published), scored as `iosim published` does, for the (architecture, family) pairs no
  record measured: a published figure's program is not always the one iosim plans (FlashAttention-2's benchmark
  runs its own standard attention, not eager PyTorch's).

    python experiments/transfer/bands.py H100.json [MORE.json ...] --out hw_profiles/transfer_bands.json

(the bands shipped: experiments/transfer/h100_2026-12-06/validate_transfer.json and
experiments/flash3_model/validate_h100_flash3.json, flash3's and cuDNN's forward records on the same H100)
"""
from __future__ import annotations

import argparse
import json
import statistics
from datetime import date
from pathlib import Path

from iosim import published as pub
from iosim.hardware import load_profile

# measured or published algorithm -> the plan family `iosim simulate/compare` name it by
FAMILY = {"torch_naive": "eager", "standard": "eager", "flash2_published": "torch_flash"}
# published algorithms iosim names no plan family by (cuDNN's forward is predicted with flash3's plan, a stand-in)
NO_FAMILY = {"cudnn"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("h100", type=Path, nargs="+", help="iosim validate --json of H100 records with --transfer")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    errs: dict[tuple[str, str], list[float]] = {}
    whence: dict[tuple[str, str], set[str]] = {}
    for path in args.h100:
        v = json.loads(path.read_text())
        arch = load_profile(v["profile"]).arch
        for r in v["rows"]:
            fam = FAMILY.get(r["algorithm"].split()[0], r["algorithm"].split()[0])
            errs.setdefault((arch, fam), []).append(r["time_err"])
            whence.setdefault((arch, fam), set()).add(f"measured on an H100 ({Path(v['records'][0]).name})")
    measured = set(errs)
    for r in pub.score(pub.load()):
        a = load_profile(r["profile"]).arch
        fam = FAMILY.get(r["algorithm"] + "_published" if r["algorithm"] == "flash2" else r["algorithm"], r["algorithm"])
        if (a, fam) in measured or r["algorithm"] in NO_FAMILY or r["error"] is None:
            continue
        errs.setdefault((a, fam), []).append(r["error"])
        whence.setdefault((a, fam), set()).add(f"published on the {r['gpu']}")
    bands: dict[str, dict] = {}
    for (a, fam), e in sorted(errs.items()):
        bands.setdefault(a, {})[fam] = {
            "median": statistics.median(abs(x) for x in e), "max": max(abs(x) for x in e),
            "signed_median": statistics.median(e), "n": len(e), "from": "; ".join(sorted(whence[(a, fam)]))}
    args.out.write_text(json.dumps({
        "what": "median and max |relative time error| of predictions with traits carried from h200_sxm.calibrated "
                "(iosim.transfer), per architecture and plan family; made by experiments/transfer/bands.py",
        "date": date.today().isoformat(), "bands": bands}, indent=1) + "\n")
    for a, fams in bands.items():
        for fam, b in fams.items():
            print(f"{a} {fam:12} n {b['n']:3}  median {b['median']:.1%}  max {b['max']:.1%}  signed {b['signed_median']:+.1%}"
                  f"  ({b['from']})")


if __name__ == "__main__":
    main()
