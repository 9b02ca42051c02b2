#!/usr/bin/env bash
# SM clock against busy SMs (experiments/sm_clock/clock_probe.py says how): the traced clocks, then the same calls under ncu;
# $OUT/clock_trace.json, $OUT/clock_ncu.csv and two tables.   bash experiments/sm_clock/clock_probe.sh (on the GPU machine)
export OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -f .whl/prelude.sh ] && source .whl/prelude.sh
python3 experiments/sm_clock/clock_probe.py --out $OUT/clock_trace.json || exit 1
ncu --clock-control none -k regex:flash1 --csv --print-units base \
    --metrics gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,sm__cycles_elapsed.max \
    python3 experiments/sm_clock/clock_probe.py --ncu-pass > $OUT/clock_ncu.csv 2> $OUT/clock_ncu.err || tail -5 $OUT/clock_ncu.err
python3 experiments/sm_clock/clock_probe.py --print-ncu "$OUT/clock_ncu.csv"
