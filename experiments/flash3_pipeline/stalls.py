"""Where a kernel's warps stall, from Nsight Compute's source page (`ncu -i REPORT --page source --csv
--print-source sass`): samples per stall reason, per opcode and per instruction.

    python experiments/flash3_pipeline/stalls.py FILE.sass.csv [--top 25]
"""
from __future__ import annotations

import argparse
import csv
from collections import Counter


def read(path: str) -> list[dict]:
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"Address"'))
    return list(csv.DictReader(lines[start:]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    rows = read(a.csv)
    reasons = [c for c in rows[0] if c.startswith("stall_") and "Not Issued" not in c]
    num = lambda r, c: float((r.get(c) or "0").replace(",", "") or 0)
    total = sum(num(r, "Warp Stall Sampling (All Samples)") for r in rows)
    by_reason = Counter({c: sum(num(r, c) for r in rows) for c in reasons})
    print(f"{len(rows)} instructions, {total:,.0f} samples")
    print("by reason: " + ", ".join(f"{c[6:]} {v / total:.1%}" for c, v in by_reason.most_common(10)))
    by_op, executed = Counter(), Counter()
    for r in rows:
        words = r["Source"].split()
        op = (words[1] if words[0].startswith("@") else words[0]).split(".")[0] if words else "?"
        by_op[op] += num(r, "Warp Stall Sampling (All Samples)")
        executed[op] += num(r, "Instructions Executed")
    print("samples by opcode: " + ", ".join(f"{k} {v / total:.1%}" for k, v in by_op.most_common(14)))
    n = sum(executed.values())
    print(f"{n:,.0f} warp instructions executed: " + ", ".join(f"{k} {v / n:.1%}" for k, v in executed.most_common(14)))
    print(f"top {a.top} instructions:")
    for r in sorted(rows, key=lambda r: -num(r, "Warp Stall Sampling (All Samples)"))[:a.top]:
        s = num(r, "Warp Stall Sampling (All Samples)")
        top = sorted(((num(r, c), c[6:]) for c in reasons), reverse=True)[:3]
        print(f"  {r['Address']:>6} {s / total:6.1%}  {r['Source'][:60]:<60} " +
              " ".join(f"{c} {v / s:.0%}" for v, c in top if v))


if __name__ == "__main__":
    main()
