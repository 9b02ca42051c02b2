#!/usr/bin/env bash
# Our flash2 builds' pipe and issue use under Nsight Compute (experiments/pipe_cycles/pipe_overlap.py says what).
#   source .whl/prelude.sh && bash experiments/pipe_cycles/pipe_overlap.sh
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
HERE=$(cd "$(dirname "$0")" && pwd)
python3 -c "import sys; sys.path.insert(0, '$HERE/..'); from gpu_kernels.build import precompile; precompile()"
METRICS=$(python3 -c "import sys; sys.path.insert(0, '$HERE'); import pipe_overlap as s; print(','.join(s.METRICS))")
if ! ncu --clock-control none -k regex:"flash2_fwd" --csv --metrics "$METRICS" \
    python3 "$HERE/pipe_overlap.py" > "$OUT/pipes.csv" 2> "$OUT/pipes.log"; then
  tail -5 "$OUT/pipes.log"   # a metric this ncu does not know: again with those every ncu since 2023 has
  METRICS=$(echo "$METRICS" | tr ',' '\n' | grep -v -e tensor_op_hmma_cycles -e pipe_alu | paste -sd,)
  ncu --clock-control none -k regex:"flash2_fwd" --csv --metrics "$METRICS" \
      python3 "$HERE/pipe_overlap.py" > "$OUT/pipes.csv" 2>> "$OUT/pipes.log" || tail -5 "$OUT/pipes.log"
fi
python3 "$HERE/pipe_overlap.py" --print "$OUT/pipes.csv" | tee "$OUT/pipes.txt"
