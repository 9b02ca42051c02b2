"""The exact engine's predictions of grids the bounded engine runs coarse or scaled down: references for compare.py.

    PYTHONPATH=. python experiments/bounded_engine/exact_refs.py OUT.json [--seconds 45]

Ten grids named here (tests/test_engine_scale.py's six, four of the slowest bounded draws), then the 60 slowest
draws of benchmarks/results/prediction_cost_2026-12-04b.json, each simulated with exact=True; a draw whose exact
run takes longer than --seconds is skipped.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import random
import signal
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

from iosim.engine import simulate
from iosim.hardware import load_profile
from iosim.workload import AttentionConfig

ROOT = Path(__file__).resolve().parents[2]
NAMED = [
    ("h200_sxm", "flash2", dict(batch=16, heads=8, seqlen_q=4096, head_dim=64, causal=True)),
    ("h200_sxm", "torch_flash", dict(batch=16, heads=8, seqlen_q=2048, head_dim=64, causal=True, **{"pass": "backward"})),
    ("h200_sxm", "flash2", dict(batch=16, heads=8, seqlen_q=2048, head_dim=128, causal=True, **{"pass": "backward"})),
    ("h200_sxm", "flash2", dict(batch=16, heads=8, seqlen_q=16384, head_dim=64)),
    ("h200_sxm", "flash1", dict(batch=16, heads=8, seqlen_q=16384, head_dim=64, causal=True)),
    ("h200_sxm", "flash1", dict(batch=4, heads=16, seqlen_q=8192, head_dim=128, causal=True, **{"pass": "backward"})),
    ("h200_sxm", "torch_flash", dict(batch=292, heads=2, seqlen_q=454, head_dim=128, dtype="fp16", causal=True,
                                     **{"pass": "forward+backward"})),
    ("h100_pcie", "flash2", dict(batch=74, heads=32, seqlen_q=396, head_dim=64, dtype="fp16", causal=True,
                                 **{"pass": "backward"})),
    ("h200_sxm", "torch_flash", dict(batch=645, heads=4, seqlen_q=885, head_dim=64, dtype="bf16", causal=True,
                                     **{"pass": "forward+backward"})),
    ("h200_sxm.calibrated", "flash2", dict(batch=31, heads=64, seqlen_q=529, head_dim=64, dtype="bf16", causal=True,
                                           **{"pass": "backward"})),
]


def slowest_draws(k: int) -> list[tuple[str, str, AttentionConfig]]:
    """The k slowest draws of prediction_cost_2026-12-04b.json, redrawn as that benchmark drew them (seed 0)."""
    spec = importlib.util.spec_from_file_location("prediction_cost", ROOT / "benchmarks/prediction_cost.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = json.loads((ROOT / "benchmarks/results/prediction_cost_2026-12-04b.json").read_text())["rows"]
    want = {(r["profile"], r["algorithm"], r["config"]): i
            for i, r in enumerate(sorted(rows, key=lambda r: -r["seconds"])[:k])}
    found: dict = {}
    rng = random.Random(0)
    for _ in range(10 * len(rows)):
        key, alg, cfg = bench.draw(rng)
        if (key, alg, cfg.label()) in want:
            found[want[(key, alg, cfg.label())]] = (key, alg, cfg)
    return [found[i] for i in sorted(found)]


class TooLong(Exception):
    pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seconds", type=int, default=45)
    args = ap.parse_args()
    todo = [(p, a, AttentionConfig(**kw)) for p, a, kw in NAMED] + slowest_draws(60)
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TooLong()))
    refs, seen = [], set()
    for p, a, cfg in todo:
        if (p, a, cfg.label()) in seen:
            continue
        seen.add((p, a, cfg.label()))
        signal.alarm(args.seconds)
        try:
            t = time.perf_counter()
            r = simulate(cfg, a, load_profile(p), exact=True)
            secs = time.perf_counter() - t
        except TooLong:
            print(f"over {args.seconds} s, skipped: {p} {a} {cfg.label()}", flush=True)
            continue
        finally:
            signal.alarm(0)
        refs.append(dict(p=p, a=a, label=cfg.label(), kw=cfg.model_dump(by_alias=True), time=r.time_s,
                         hbm=r.hbm_bytes, l2=r.l2_bytes, events=r.events, secs=secs))
        print(f"{secs:6.1f} s  {p} {a} {cfg.label()}", flush=True)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    Path(args.out).write_text(json.dumps({"provenance": {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": commit,
        "method": f"experiments/bounded_engine/exact_refs.py --seconds {args.seconds}"}, "refs": refs}, indent=0))


if __name__ == "__main__":
    main()
