"""The bounded engine against the exact engine's references (exact_refs.py), at the shipped settings or others.

    PYTHONPATH=. python experiments/bounded_engine/compare.py REFS.json [NAME=VALUE ...]

NAME is one of engine.run's or engine.scale's constants (COARSE_SPLIT, COARSE_STEPS, BUDGET, ...), set for this
run only. Prints each grid's prediction cost, events and its time, HBM and L2 bytes relative to the exact engine's,
then the median and max |time error| and the events and L2 look-ups in all (the two figures of a prediction's cost
that do not move with the machine's speed).
"""
from __future__ import annotations

import json
import statistics
import sys
import time

from iosim.engine import run, scale, simulate
from iosim.engine.l2 import L2Cache
from iosim.hardware import load_profile
from iosim.workload import AttentionConfig


def count_lookups() -> dict:
    """Counts L2Cache.access calls from now on, in the returned dict's "n"."""
    seen, access = {"n": 0}, L2Cache.access

    def counted(self, *args, **kw):
        seen["n"] += 1
        return access(self, *args, **kw)
    L2Cache.access = counted
    return seen


def main() -> None:
    lookups = count_lookups()
    refs = json.load(open(sys.argv[1]))["refs"]
    for arg in sys.argv[2:]:
        name, value = arg.split("=")
        setattr(scale if hasattr(scale, name) else run, name, int(value))
    errs, hbm, events, looks = [], [], 0, 0
    for e in refs:
        cfg, hw = AttentionConfig(**e["kw"]), load_profile(e["p"])
        t, n0 = time.perf_counter(), lookups["n"]
        r = simulate(cfg, e["a"], hw)
        secs = time.perf_counter() - t
        errs.append(r.time_s / e["time"] - 1)
        hbm.append(r.hbm_bytes / e["hbm"] - 1)
        events += r.events
        looks_now = lookups["n"] - n0
        looks += looks_now
        print(f"{e['a']:<12}{e['p']:<21}{cfg.label():<40}{secs:6.2f} s {r.events:7d} ev {looks_now:7d} lk  time {errs[-1]:+7.2%}  "
              f"HBM {hbm[-1]:+7.2%}  L2 {r.l2_bytes / e['l2'] - 1:+7.2%}{'  scaled' if r.scaled else ''}", flush=True)
    print(f"{' '.join(sys.argv[2:]) or 'shipped settings'}: {len(refs)} grids, |time error| median "
          f"{statistics.median(map(abs, errs)):.2%} max {max(map(abs, errs)):.2%}; |HBM error| max "
          f"{max(map(abs, hbm)):.2%}; events {events:,}; L2 look-ups {looks:,}")


if __name__ == "__main__":
    main()
