#!/usr/bin/env bash
# flash2 and PyTorch's flash kernel under Nsight Compute, side by side (experiments/kernel_profile/stall_profile.py says what).
#   source .whl/prelude.sh && bash experiments/kernel_profile/stall_profile.sh
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
HERE=$(cd "$(dirname "$0")" && pwd)
METRICS=$(python3 -c "import sys; sys.path.insert(0, '$HERE'); import stall_profile as s; print(','.join(s.METRICS))")
# every second launch of each kernel: ours and FA2's (the first of each pair is the warm-up)
ncu --clock-control none -k regex:"flash2_fwd|flash_fwd" --launch-skip 0 --csv --metrics "$METRICS" \
    python3 "$HERE/stall_profile.py" > "$OUT/stalls.csv" 2> "$OUT/stalls.log" && ok=1 || ok=0
if [ $ok = 1 ]; then
  python3 "$HERE/stall_profile.py" --print "$OUT/stalls.csv" | tee "$OUT/stalls_table.txt"
else   # a metric name this ncu does not know: fall back to its standard sections
  tail -5 "$OUT/stalls.log"
  ncu --clock-control none -k regex:"flash2_fwd|flash_fwd" --csv --section SpeedOfLight --section WarpStateStats \
      --section ComputeWorkloadAnalysis --section LaunchStats --section Occupancy \
      python3 "$HERE/stall_profile.py" > "$OUT/stalls_sections.csv" 2>> "$OUT/stalls.log"
  grep -E "Duration|Registers|Stall|Issue|Pipe|Achieved Occupancy" "$OUT/stalls_sections.csv" | cut -c1-220 | head -150
fi
