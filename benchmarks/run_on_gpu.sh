#!/usr/bin/env bash
# One call on the GPU machine: provenance, GPU tests, SASS census, kernel benchmark. Results under $OUT.
#   source .whl/prelude.sh && bash benchmarks/run_on_gpu.sh [quick]
# The SASS census reads .device/sass.cubin if present: build it beforehand where nvcc is, e.g.
#   python -c "from gpu_kernels.build import nvcc_source; open('.device/all.cu','w').write(nvcc_source())"
#   nvcc -std=c++17 -arch=sm_90 -cubin .device/all.cu -o .device/sass.cubin
# and carry .device; .device/commit, if present, names the commit measured (the copy there has no .git).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv
  python3 -c "import torch, cupy, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cupy', cupy.__version__, 'cuda', torch.version.cuda)"
  nvcc --version | tail -1; echo "commit $(cat .device/commit 2>/dev/null || git rev-parse HEAD)"; date -u +%FT%TZ; } | tee "$OUT/provenance.txt"
if [ -f .device/sass.cubin ]; then
  cuobjdump -sass .device/sass.cubin > "$OUT/sass.txt" 2>&1
  python3 - "$OUT/sass.txt" <<'PY' | tee "$OUT/sass_census.txt"
import re, sys, collections
fn, c = None, collections.defaultdict(collections.Counter)
for line in open(sys.argv[1]):
    m = re.search(r"Function : (\S+)", line)
    if m: fn = m.group(1); continue
    m = re.search(r"/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(\.[A-Z0-9_.]+)?", line)
    if fn and m: c[fn][m.group(1)] += 1
for fn, k in c.items():
    print(fn[:70], {x: k[x] for x in ("HMMA", "LDSM", "LDGSTS", "MUFU", "LDL", "STL", "BAR")})
PY
fi
timeout 330 python3 -m pytest -q -m gpu tests/test_gpu_kernels.py -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | tail -25
timeout 260 python3 benchmarks/kernels.py ${1:+--quick} --out "$OUT/kernels.json" 2>&1 | tee "$OUT/bench.log"
