#!/usr/bin/env bash
# Stall reasons of our flash2 on grids that start on every SM at once against lone heads (benchmarks/first_tile.py
# says why); one ncu pass.   source .whl/prelude.sh && bash benchmarks/first_tile.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
HERE=$(cd "$(dirname "$0")" && pwd)
ncu --query-metrics --chip gh100 > /tmp/ncu_query.txt 2>&1
M=$(python3 "$HERE/first_tile.py" --metrics /tmp/ncu_query.txt)
echo "metrics: $M"
ncu --clock-control none --cache-control all -k regex:flash2_fwd --csv --print-units base --metrics "$M" \
    python3 "$HERE/first_tile.py" > "$OUT/first_tile.csv" 2> "$OUT/first_tile.err" || { tail -5 "$OUT/first_tile.err"; exit 1; }
python3 "$HERE/first_tile.py" --print "$OUT/first_tile.csv" | tee "$OUT/first_tile.txt"
