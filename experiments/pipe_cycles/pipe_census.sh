#!/usr/bin/env bash
# Each attention build's pipe cycles per key tile under Nsight Compute (experiments/pipe_cycles/pipe_census.py says what).
#   source .whl/prelude.sh && bash experiments/pipe_cycles/pipe_census.sh
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
HERE=$(cd "$(dirname "$0")" && pwd)
python3 -c "import sys; sys.path.insert(0, '$HERE/..'); from gpu_kernels.build import precompile; precompile()"
# the metrics this ncu knows, of those the script asks for (by base name: a newer ncu may rename a pipe)
ncu --query-metrics > "$OUT/known.txt" 2>&1
METRICS=$(python3 - "$OUT/known.txt" "$HERE" <<'PY'
import sys
sys.path.insert(0, sys.argv[2])
import pipe_census as s
known = {ln.split()[0] for ln in open(sys.argv[1]) if ln.strip()}
print(",".join(m for m in s.METRICS if m.split(".")[0] in known))
PY
)
if [ -z "$METRICS" ]; then   # the query failed: ask for all of them
  METRICS=$(python3 -c "import sys; sys.path.insert(0, '$HERE'); import pipe_census as s; print(','.join(s.METRICS))")
fi
echo "metrics: $METRICS"
ncu --clock-control none -k regex:"flash" --csv --metrics "$METRICS" \
    python3 "$HERE/pipe_census.py" > "$OUT/census.csv" 2> "$OUT/census.log" || tail -5 "$OUT/census.log"
python3 "$HERE/pipe_census.py" --json "$OUT/census.csv" "$OUT/census.json"
python3 "$HERE/pipe_census.py" --table "$OUT/census.csv" | tee "$OUT/census.txt"
