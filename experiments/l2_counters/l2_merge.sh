#!/usr/bin/env bash
# Merged L2 requests, cold and warm (experiments/l2_counters/l2_merge.py says why): two ncu passes and a table.
#   source .whl/prelude.sh && bash experiments/l2_counters/l2_merge.sh      (SET=load: experiments/l2_counters/l2_merge.py's LOAD set)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
HERE=$(cd "$(dirname "$0")" && pwd)
M=lts__t_bytes.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum
M=$M,lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum,dram__bytes_read.sum,gpu__time_duration.sum
SET=${SET:-main}; TAG=$([ "$SET" = main ] && echo "" || echo "_$SET")
for mode in all none; do
  ncu --clock-control none --cache-control $mode -k regex:"flash" --csv --print-units base --metrics $M \
      python3 "$HERE/l2_merge.py" --set $SET > "$OUT/l2_merge${TAG}_$mode.csv" 2> "$OUT/l2_merge${TAG}_$mode.err" \
      || { tail -5 "$OUT/l2_merge${TAG}_$mode.err"; exit 1; }
done
python3 "$HERE/l2_merge.py" --print "$OUT" --set $SET | tee "$OUT/l2_merge$TAG.txt"
