#!/usr/bin/env bash
# PyTorch's flash kernels' registers, shared memory and occupancy limits (experiments/fa2_build/fa2_launch.py says what).
#   source .whl/prelude.sh && bash experiments/fa2_build/fa2_launch.sh
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
HERE=$(cd "$(dirname "$0")" && pwd)
METRICS=$(python3 -c "import sys; sys.path.insert(0, '$HERE'); import fa2_launch as s; print(','.join(s.METRICS))")
ncu --clock-control none -k regex:"flash_fwd" --csv --metrics "$METRICS" \
    python3 "$HERE/fa2_launch.py" > "$OUT/fa2_launch.csv" 2> "$OUT/fa2_launch.log" || tail -5 "$OUT/fa2_launch.log"
python3 "$HERE/fa2_launch.py" --print "$OUT/fa2_launch.csv" | tee "$OUT/fa2_launch.txt"
