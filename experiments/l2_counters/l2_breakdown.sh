#!/usr/bin/env bash
# lts__t_bytes taken apart (experiments/l2_counters/l2_breakdown.py says why), one ncu pass; $OUT/l2_breakdown.csv and a table.
#   source .whl/prelude.sh && bash experiments/l2_counters/l2_breakdown.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
HERE=$(cd "$(dirname "$0")" && pwd)
M=lts__t_bytes.sum,lts__t_sectors_srcunit_tex.sum,lts__t_sectors_srcunit_ltcfabric.sum,lts__t_sectors_op_read.sum
M=$M,lts__t_sectors_op_write.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum
M=$M,lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum,dram__bytes_read.sum,dram__bytes_write.sum
M=$M,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum
ncu --clock-control none -k regex:"flash" --csv --print-units base --metrics $M python3 "$HERE/l2_breakdown.py" \
    > "$OUT/l2_breakdown.csv" 2> "$OUT/l2_breakdown.err" || { tail -5 "$OUT/l2_breakdown.err"; exit 1; }
python3 "$HERE/l2_breakdown.py" --print "$OUT/l2_breakdown.csv" | tee "$OUT/l2_breakdown.txt"
