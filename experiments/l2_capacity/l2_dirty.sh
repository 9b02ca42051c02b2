#!/usr/bin/env bash
# Written bytes L2 holds (experiments/l2_capacity/l2_dirty.py says why): one ncu pass, $OUT/l2_dirty.csv and a table.
#   source .whl/prelude.sh && bash experiments/l2_capacity/l2_dirty.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
HERE=$(cd "$(dirname "$0")" && pwd)
M=dram__bytes_write.sum,dram__bytes_read.sum,lts__t_bytes.sum,gpu__time_duration.sum
# every kernel the script launches is one of its cases
ncu --clock-control none --cache-control all --csv --print-units base \
    --metrics $M python3 "$HERE/l2_dirty.py" > "$OUT/l2_dirty.csv" 2> "$OUT/l2_dirty.err" \
    || { tail -5 "$OUT/l2_dirty.err"; exit 1; }
python3 "$HERE/l2_dirty.py" --print "$OUT/l2_dirty.csv" | tee "$OUT/l2_dirty.txt"
