#!/usr/bin/env bash
# SM clock against busy SMs (benchmarks/clock_probe.py says how): the traced clocks, then the same calls under ncu;
# $OUT/clock_trace.json, $OUT/clock_ncu.csv and two tables.   bash benchmarks/clock_probe.sh (on the GPU machine)
export OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -f .whl/prelude.sh ] && source .whl/prelude.sh
python3 benchmarks/clock_probe.py --out $OUT/clock_trace.json || exit 1
ncu --clock-control none -k regex:flash1 --csv --print-units base \
    --metrics gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,sm__cycles_elapsed.max \
    python3 benchmarks/clock_probe.py --ncu-pass > $OUT/clock_ncu.csv 2> $OUT/clock_ncu.err || tail -5 $OUT/clock_ncu.err
python3 - <<'PY'
import csv, os, sys
sys.path.insert(0, "benchmarks")
from clock_probe import CONFIGS
rows = [r for r in csv.reader(open(os.environ["OUT"] + "/clock_ncu.csv")) if len(r) > 10]
hdr = rows[0]; rows = rows[1:]
i_id, i_m, i_v = hdr.index("ID"), hdr.index("Metric Name"), hdr.index("Metric Value")
by = {}
for r in rows:
    by.setdefault(int(r[i_id]), {})[r[i_m]] = float(r[i_v].replace(",", ""))
print(f"{'ncu: config':<30}{'time us':>10}{'SM GHz':>8}")
for (h, n, d, dt), k in zip(CONFIGS, sorted(by)):
    m = by[k]
    print(f"{'B1 H%d N%d d%d %s' % (h, n, d, dt):<30}{m['gpu__time_duration.sum'] * 1e-3:>10.1f}"
          f"{m['sm__cycles_elapsed.avg.per_second'] / 1e9:>8.2f}")
PY
