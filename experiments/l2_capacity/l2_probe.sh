#!/usr/bin/env bash
# L2 holding capacity, request counting and empty-kernel cost (experiments/l2_capacity/l2_probe.py says how), one ncu pass;
# $OUT/l2_probe.csv and a table.   source .whl/prelude.sh && bash experiments/l2_capacity/l2_probe.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
HERE=$(cd "$(dirname "$0")" && pwd)
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum
M=$M,lts__t_sectors_srcunit_tex.sum,lts__t_sectors_srcunit_ltcfabric.sum
ncu --clock-control none -k regex:"^(empty|rw|ro|tiles)$" --csv --print-units base --metrics $M \
    python3 "$HERE/l2_probe.py" > "$OUT/l2_probe.csv" 2> "$OUT/l2_probe.err" || { tail -5 "$OUT/l2_probe.err"; exit 1; }
python3 "$HERE/l2_probe.py" --print "$OUT/l2_probe.csv" | tee "$OUT/l2_probe.txt"
