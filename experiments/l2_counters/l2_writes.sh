#!/usr/bin/env bash
# L2 writes and local memory of our flash2 kernels (experiments/l2_counters/l2_writes.py says why); one ncu pass.
#   source .whl/prelude.sh && bash experiments/l2_counters/l2_writes.sh            # flash2; SET=flash1, sources or torch
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
HERE=$(cd "$(dirname "$0")" && pwd)
ncu --query-metrics --chip gh100 > /tmp/ncu_query.txt 2>&1
grep -E "^(lts__t_|l1tex__t_|l1tex__m_|smsp__inst_executed_op_local)" /tmp/ncu_query.txt > "$OUT/query.txt"
M=$(python3 "$HERE/l2_writes.py" --metrics /tmp/ncu_query.txt)
echo "metrics: $M"
SET=${SET:-flash2}; F=l2_writes$([ "$SET" = flash2 ] || echo "_$SET")
ALG=$(python3 "$HERE/l2_writes.py" --alg "$SET")
K=$([ "$ALG" = torch ] && echo "flash_fwd" || echo "${ALG}_fwd")
ncu --clock-control none --cache-control all -k regex:"$K" --csv --print-units base --metrics "$M" \
    python3 "$HERE/l2_writes.py" "$SET" > "$OUT/$F.csv" 2> "$OUT/$F.err" || { tail -5 "$OUT/$F.err"; exit 1; }
python3 "$HERE/l2_writes.py" --print "$OUT/$F.csv" "$SET" | tee "$OUT/$F.txt"
