"""What one prediction costs, over configurations drawn across the profiles, passes and algorithms.

    python benchmarks/prediction_cost.py [--n 1000] [--seed 0] [--json out.json]
    python benchmarks/prediction_cost.py --slowest-of earlier.json [--top 40] [--json out.json]

Draws --n configurations (seeded): every shipped profile, algorithm and pass; N from 128 to 131,072 and batch x heads
from 1 to 4,096, both log-uniform; d 64, 128 or 256; fp16 or bf16; causal or not; a quarter grouped-query. Each is
predicted once (`iosim.engine.simulate`, on this process's one core), and the seconds it took are recorded.
Prints the p50, p99 and max, the share run scaled down (`engine.scale`), and the slowest configurations, each with
its SimPy events and L2 look-ups (the two figures of its cost that do not move with the machine's speed). This
machine's speed drifts by up to 4x within a day, so a fixed pure-Python workload is timed before and after the
draws (`reference_s`): seconds of two runs compare only in units of their reference.
Configurations a plan refuses (a tiling that does not fit, flash1's backward with grouped heads) are counted apart.
--slowest-of times again only the --top slowest of an earlier run's draws (the same --n and --seed redrawn): run it
with PYTHONPATH at another checkout to time two versions of iosim on the same configurations (the JSON's provenance
names the iosim checkout timed).
"""
from __future__ import annotations

import argparse
import heapq
import json
import platform
import random
import statistics
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

import iosim
from iosim.engine import simulate
from iosim.engine.l2 import L2Cache
from iosim.errors import IosimError
from iosim.hardware import list_profiles, load_profile
from iosim.plan import ALGORITHMS
from iosim.workload import AttentionConfig


def draw(rng: random.Random) -> tuple[str, str, AttentionConfig]:
    n = int(2 ** rng.uniform(7, 17))
    bh = int(2 ** rng.uniform(0, 12))
    heads = min(rng.choice([1, 2, 4, 8, 16, 32, 64]), 1 << (bh.bit_length() - 1))
    batch = max(1, bh // heads)
    kv = heads // rng.choice([2, 4, 8]) if heads >= 8 and rng.random() < 0.25 else heads
    cfg = AttentionConfig(batch=batch, heads=heads, kv_heads=max(1, kv), seqlen_q=n,
                          head_dim=rng.choice([64, 128, 256]), dtype=rng.choice(["fp16", "bf16"]),
                          causal=rng.random() < 0.5, **{"pass": rng.choice(["forward", "backward", "forward+backward"])})
    return rng.choice(list_profiles()), rng.choice(ALGORITHMS), cfg


def reference_s() -> float:
    """Seconds this process takes, best of three, for a fixed workload shaped like the engine's (heap, dict and
    list operations on small tuples); independent of iosim's version."""
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        heap: list = []
        held: dict = {}
        for i in range(200_000):
            heapq.heappush(heap, ((i * 7919) % 100_003, i))
            held[i % 5_000] = [i, i + 1, False]
            if len(heap) > 1_000:
                _, j = heapq.heappop(heap)
                held.pop(j % 5_000, None)
        best = min(best, time.perf_counter() - t)
    return best


def count_lookups() -> list:
    """From now on, every L2Cache made is kept in the returned list: its `_stamp` counts its look-ups (no cost
    added to a look-up)."""
    caches, init = [], L2Cache.__init__

    def kept(self, *args, **kw):
        init(self, *args, **kw)
        caches.append(self)
    L2Cache.__init__ = kept
    return caches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write every timing here")
    ap.add_argument("--slowest-of", default=None, metavar="JSON", help="time only the slowest draws of this run")
    ap.add_argument("--top", type=int, default=40, help="how many of --slowest-of's draws")
    args = ap.parse_args()
    only = None
    if args.slowest_of:
        with open(args.slowest_of) as f:
            earlier = json.load(f)["rows"]
        only = set(sorted(range(len(earlier)), key=lambda i: -earlier[i]["seconds"])[:args.top])
    ref_before = reference_s()
    caches = count_lookups()
    rng = random.Random(args.seed)
    profiles: dict = {}
    rows, refused, drawn = [], 0, 0
    while drawn < args.n:
        key, alg, cfg = draw(rng)
        hw = profiles.setdefault(key, load_profile(key))
        if only is not None:   # the earlier run's rows in draw order; a draw not among them was refused there
            if drawn >= len(earlier):
                break
            e = earlier[drawn]
            if (e["profile"], e["algorithm"], e["config"]) != (key, alg, cfg.label()):
                continue
            if drawn not in only:
                drawn += 1
                continue
        caches.clear()
        t = time.perf_counter()
        try:
            r = simulate(cfg, alg, hw)
        except IosimError:
            refused += 1
            continue
        rows.append({"draw": drawn, "profile": key, "algorithm": alg, "config": cfg.label(),
                     "seconds": time.perf_counter() - t, "events": r.events,
                     "lookups": sum(c._stamp for c in caches), "scaled": r.scaled is not None})
        drawn += 1
        if rows[-1]["seconds"] > 1:
            print(f"  over 1 s: {rows[-1]['seconds']:.2f} s {key} {alg} {cfg.label()}", flush=True)
        if len(rows) % 100 == 0 and only is None:
            print(f"  {len(rows)} predictions", flush=True)
    ref_after = reference_s()
    secs = sorted(r["seconds"] for r in rows)
    p50, p99 = statistics.median(secs), secs[min(len(secs) - 1, int(0.99 * len(secs)))]
    print(f"\n{len(rows)} predictions ({refused} configurations refused by their plan), python "
          f"{platform.python_version()}, one core; reference workload {ref_before:.3f} s before, "
          f"{ref_after:.3f} s after")
    print(f"p50 {p50:.3f} s   p99 {p99:.3f} s   max {secs[-1]:.3f} s   "
          f"scaled down: {sum(r['scaled'] for r in rows)}   over 1 s: {sum(s > 1 for s in secs)}")
    print("slowest:")
    for r in sorted(rows, key=lambda r: -r["seconds"])[:8]:
        print(f"  {r['seconds']:6.3f} s {r['events']:7d} ev {r['lookups']:7d} lk  {r['profile']:<22}"
              f"{r['algorithm']:<12}{r['config']}{'  (scaled)' if r['scaled'] else ''}")
    if args.json:
        provenance = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": _commit(),
                      "python": platform.python_version(), "machine": platform.machine(),
                      "processor": platform.processor() or platform.machine(), "cores_used": 1,
                      "method": f"benchmarks/prediction_cost.py --n {args.n} --seed {args.seed}"
                                + (f" --slowest-of {args.slowest_of} --top {args.top}" if only is not None else ""),
                      "iosim": str(Path(iosim.__file__).parent),
                      "reference_s": {"before": ref_before, "after": ref_after, "workload": "reference_s()"}}
        with open(args.json, "w") as f:
            json.dump({"provenance": provenance, "p50_s": p50, "p99_s": p99, "max_s": secs[-1], "refused": refused,
                       "rows": rows}, f, indent=1)


def _commit() -> str:
    """The checkout's commit, marked dirty where it has uncommitted changes to tracked files."""
    where = Path(iosim.__file__).parent   # the checkout of the iosim timed
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=where).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, check=True, cwd=where).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


if __name__ == "__main__":
    main()
