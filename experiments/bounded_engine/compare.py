"""The bounded engine against the exact engine's references (exact_refs.py), at the shipped settings or others.

    PYTHONPATH=. python experiments/bounded_engine/compare.py REFS.json [NAME=VALUE ...]

NAME is one of engine.run's or engine.scale's constants (COARSE_SPLIT, COARSE_STEPS, BUDGET, ...), set for this
run only. Prints each grid's prediction cost, events and its time, HBM and L2 bytes relative to the exact engine's,
then the median and max |time error| and the events in all.
"""
from __future__ import annotations

import json
import statistics
import sys
import time

from iosim.engine import run, scale, simulate
from iosim.hardware import load_profile
from iosim.workload import AttentionConfig


def main() -> None:
    refs = json.load(open(sys.argv[1]))["refs"]
    for arg in sys.argv[2:]:
        name, value = arg.split("=")
        setattr(scale if hasattr(scale, name) else run, name, int(value))
    errs, hbm, events = [], [], 0
    for e in refs:
        cfg, hw = AttentionConfig(**e["kw"]), load_profile(e["p"])
        t = time.perf_counter()
        r = simulate(cfg, e["a"], hw)
        secs = time.perf_counter() - t
        errs.append(r.time_s / e["time"] - 1)
        hbm.append(r.hbm_bytes / e["hbm"] - 1)
        events += r.events
        print(f"{e['a']:<12}{e['p']:<21}{cfg.label():<40}{secs:6.2f} s {r.events:7d} ev  time {errs[-1]:+7.2%}  "
              f"HBM {hbm[-1]:+7.2%}  L2 {r.l2_bytes / e['l2'] - 1:+7.2%}{'  scaled' if r.scaled else ''}", flush=True)
    print(f"{' '.join(sys.argv[2:]) or 'shipped settings'}: {len(refs)} grids, |time error| median "
          f"{statistics.median(map(abs, errs)):.2%} max {max(map(abs, errs)):.2%}; |HBM error| max "
          f"{max(map(abs, hbm)):.2%}; events {events:,}")


if __name__ == "__main__":
    main()
