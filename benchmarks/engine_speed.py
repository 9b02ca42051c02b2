"""How fast the engine simulates, on one core: the figures issue #3 asks for.

    python benchmarks/engine_speed.py            # prints a table; --json for the raw figures

1. the paper's GPT-2 medium layer (B 64, H 16, N 1024, d 64, fp16) on the A100 profile, each algorithm;
2. the paper's long-sequence sweep (batch 16, 8 heads, d 64, N = 128 ... 65,536), naive, flash1 and flash2, causal
   or not (each prediction within the engine's budget: docs/model.md, "Bounded cost");
3. events per second of the engine against SimPy's own raw timeout rate, measured in the same run.
"""
from __future__ import annotations

import argparse
import json
import platform
import time

import simpy

from iosim.engine import simulate
from iosim.hardware import load_profile
from iosim.workload import AttentionConfig


def raw_simpy_rate(n: int = 200_000) -> float:
    """Timeouts per second of a bare SimPy process: the ceiling for any SimPy model."""
    env = simpy.Environment()

    def proc(env):
        for _ in range(n):
            yield env.timeout(1)

    env.process(proc(env))
    t = time.perf_counter()
    env.run()
    return n / (time.perf_counter() - t)


def timed(cfg, algorithm, hw):
    t = time.perf_counter()
    r = simulate(cfg, algorithm, hw)
    return time.perf_counter() - t, r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    hw = load_profile("a100_40gb")
    rows, events, seconds = [], 0, 0.0
    raw = raw_simpy_rate()
    for algorithm in ("naive", "flash1", "flash2"):
        dt, r = timed(AttentionConfig(), algorithm, hw)
        rows.append({"case": "GPT-2 medium layer", "algorithm": algorithm, "seconds": dt, "events": r.events,
                     "predicted_ms": r.time_s * 1e3})
    sweep = 0.0
    for causal in (False, True):
        for k in range(7, 17):
            cfg = AttentionConfig(batch=16, heads=8, seqlen_q=2 ** k, head_dim=64, causal=causal)
            for algorithm in ("naive", "flash1", "flash2"):
                dt, r = timed(cfg, algorithm, hw)
                sweep += dt
                rows.append({"case": f"sweep N={2 ** k}{' causal' if causal else ''}", "algorithm": algorithm,
                             "seconds": dt, "events": r.events, "predicted_ms": r.time_s * 1e3})
    for r in rows:
        events += r["events"]
        seconds += r["seconds"]
    rate = events / seconds
    summary = {"python": platform.python_version(), "simpy": simpy.__version__, "sweep_seconds": sweep,
               "engine_events_per_s": rate, "raw_simpy_timeouts_per_s": raw, "raw_over_engine": raw / rate}
    if args.json:
        print(json.dumps({"rows": rows, "summary": summary}, indent=1))
        return
    print(f"{'case':<28}{'algorithm':<10}{'seconds':>9}{'events':>9}{'predicted ms':>14}")
    for r in rows:
        print(f"{r['case']:<28}{r['algorithm']:<10}{r['seconds']:>9.3f}{r['events']:>9}{r['predicted_ms']:>14.3f}")
    slowest = max((r for r in rows if r["case"].startswith("sweep")), key=lambda r: r["seconds"])
    print(f"\nlong-sequence sweep, naive + flash1 + flash2, causal or not, N = 128 ... 65,536: {sweep:.2f} s; "
          f"slowest point {slowest['algorithm']} {slowest['case']}: {slowest['seconds']:.2f} s")
    print(f"engine events/s: {rate:,.0f}; SimPy raw timeouts/s in this run: {raw:,.0f}; "
          f"ratio {raw / rate:.1f}x (target <= 2x)")


if __name__ == "__main__":
    main()
