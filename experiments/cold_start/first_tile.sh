#!/usr/bin/env bash
# Stall reasons of our flash2 on grids that start on every SM at once against lone heads (experiments/cold_start/first_tile.py
# says why); one ncu pass.   source .whl/prelude.sh && bash experiments/cold_start/first_tile.sh
# SET=flash1: the same for our flash1 (written as first_tile_flash1.*)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
HERE=$(cd "$(dirname "$0")" && pwd)
ncu --query-metrics --chip gh100 > /tmp/ncu_query.txt 2>&1
M=$(python3 "$HERE/first_tile.py" --metrics /tmp/ncu_query.txt)
echo "metrics: $M"
SET=${SET:-flash2}
F="$OUT/first_tile$([ "$SET" = flash2 ] || echo "_$SET")"
ncu --clock-control none --cache-control all -k regex:${SET}_fwd --csv --print-units base --metrics "$M" \
    python3 "$HERE/first_tile.py" "$SET" > "$F.csv" 2> "$F.err" || { tail -5 "$F.err"; exit 1; }
python3 "$HERE/first_tile.py" --print "$F.csv" "$SET" | tee "$F.txt"
