"""A Hopper build's key tile: its counted non-tensor cycles after its matmuls, or the time the census measured?

flash3 and cuDNN's forward hold one block an SM, so a census run's active cycles (`smsp__cycles_active.sum`, every
sub-partition active while its SM's block runs) are the blocks' own time. Solved as C = a x blocks + c x tiles over
the two lengths, c is what a key tile takes, matmuls included; c less the tile's tensor cycles is what it takes
beyond its matmuls. The same for a causal run's diagonal tile (its count less the non-causal build's a x blocks +
c x tiles, over its blocks). This scores the calibration records of reports/measurements/h100_flash3 (h100_sxm
with the H200's behaviour carried) with each build's tile and diagonal tile

- counted: the larger of its non-tensor instructions and busiest pipe, after the matmuls (the shipped table);
- measured: the census's time beyond the matmuls, the diagonal tile's counted extra kept;
- measured, diagonal measured too (at least 0): `builds.pipes_table`'s rule for these builds, as shipped,

flash3's block overhead scanned (`Fitted.block_overhead_s`), and cuDNN's cost a work tile (the same field;
unfitted, '-', as shipped):

    python experiments/flash3_model/measured_tile.py CENSUS.json [--set calibration|validation]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from iosim import validate as v  # noqa: E402
from iosim.hardware import load_profile  # noqa: E402
from iosim.kernels import builds  # noqa: E402
from iosim.plan import Traits  # noqa: E402
from iosim.records import load_records  # noqa: E402
from iosim.transfer import transferred  # noqa: E402

RECORDS = ROOT / "reports" / "measurements" / "h100_flash3"
ACTIVE = builds.ACTIVE
GRID_US = [0.0, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0]
CUDNN_GRID_US = [None, 1.0, 2.0, 3.0]


def measured(census: dict) -> dict[str, dict[str, float]]:
    """{build: {"tile", "active", "tensor", "masked"}}: the measured tile and diagonal as `builds.measured_tiles`
    ships them, with a tile's active and tensor cycles beside; "masked" unclamped (below 0 where a causal block
    takes less than its tiles)."""
    out = {}
    for k, e in census["census"].items():
        if k.endswith(" causal") or len(e.get("runs", [])) != 2 or not builds.one_block_an_sm(e["runs"]):
            continue
        r1, r2 = e["runs"]
        c, _ = builds.per_tile_and_block(r1, r2, r1["metrics"][ACTIVE], r2["metrics"][ACTIVE])
        tensor, _ = builds.per_tile_and_block(r1, r2, r1["busy_cycles"]["tensor"], r2["busy_cycles"]["tensor"])
        out[k] = {"tile": c - tensor, "active": c, "tensor": tensor}
        causal = census["census"].get(k + " causal")
        if causal:
            out[k]["masked"] = builds.diagonal_extra(causal["runs"], e["runs"], lambda r: r["metrics"][ACTIVE])
    return out


def table(census: dict, rule: str) -> dict:
    """The pipe table under a rule: counted (`pipes_table(measured=False)`), measured tiles with counted diagonals,
    or measured tiles and diagonals (`pipes_table`, as shipped)."""
    counted = builds.pipes_table(census, ["flash3", "torch_cudnn"], measured=False)
    if rule == "counted":
        return counted
    shipped = builds.pipes_table(census, ["flash3", "torch_cudnn"])
    if rule == "measured+diagonal":
        return shipped
    return {k: e | {"masked": counted[k]["masked"]} if "masked" in counted[k] else e for k, e in shipped.items()}


def score(tab: dict, alg: str, overhead_us: float | None, which: str) -> list[float]:
    orig = builds._pipes
    builds._pipes = lambda: tab
    try:
        moved = transferred(load_profile("h100_sxm"))
        fitted = dict(moved.traits)
        if overhead_us is not None:
            fitted[alg] = Traits(block_overhead_s=overhead_us * 1e-6)
        recs = [r for r in load_records(RECORDS) if r["algorithm"] == alg]
        return [row.time_err for row in v.validate(recs, moved.profile, which, fitted)]
    finally:
        builds._pipes = orig


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("census", type=Path)
    ap.add_argument("--set", default="calibration")
    args = ap.parse_args()
    census = json.loads(args.census.read_text())
    meas = measured(census)
    counted = table(census, "counted")
    print(f"{'build':40} {'tensor':>7} {'counted':>8} {'measured':>9} {'diag counted':>13} {'diag measured':>14}")
    for k, m in sorted(meas.items()):
        print(f"{k:40} {m['tensor']:7.0f} {counted[k]['tile']:8.0f} {m['tile']:9.0f} "
              f"{counted[k].get('masked', float('nan')):13.0f} {m.get('masked', float('nan')):14.0f}")
    for rule in ("counted", "measured", "measured+diagonal"):
        tab = table(census, rule)
        for alg, grid in (("flash3", GRID_US), ("torch_cudnn", CUDNN_GRID_US)):
            for us in grid:
                e = score(tab, alg, us, args.set)
                print(f"{rule:18} {alg:12} overhead {'-' if us is None else us:>4} us  n {len(e):2}  time median "
                      f"{statistics.median(map(abs, e)):6.1%}  mean {statistics.fmean(map(abs, e)):6.1%}  max "
                      f"{max(map(abs, e)):6.1%}  signed median {statistics.median(e):+6.1%}", flush=True)


if __name__ == "__main__":
    main()
