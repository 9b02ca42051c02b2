"""What a chip is and what its native matmul path sustains: the facts the transfer of fitted traits needs from a
chip beside its datasheet (iosim/transfer.py). Run on a GPU machine; writes JSON to --out.

    python experiments/transfer/chip_probe.py --out DIR

- nvidia-smi's name, driver, clocks (max and current), power limit, memory;
- cuBLAS's dense matrix product through torch (8192^3, fp16 and bf16, fp32 accumulate), median of 20 CUDA-event
  times after 5 warm-ups: on sm_90 it runs wgmma, the rate the datasheet's dense figure is for.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
from pathlib import Path

FIELDS = ("name,driver_version,clocks.max.sm,clocks.max.mem,clocks.sm,power.limit,power.max_limit,memory.total,"
          "pcie.link.gen.max")


def smi() -> dict:
    out = subprocess.run(["nvidia-smi", f"--query-gpu={FIELDS}", "--format=csv,noheader"], capture_output=True,
                         text=True).stdout.strip().splitlines()[0]
    return dict(zip(FIELDS.split(","), (v.strip() for v in out.split(","))))


def gemm_tflops(dtype, n: int = 8192, reps: int = 20, warmup: int = 5) -> float:
    import torch
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    times = []
    for i in range(warmup + reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        a @ b
        e.record()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(s.elapsed_time(e) / 1e3)
    return 2 * n ** 3 / statistics.median(times) / 1e12


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    out = ap.parse_args().out
    import torch
    res = {"smi": smi(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "sm_count": torch.cuda.get_device_properties(0).multi_processor_count,
           "l2_bytes": torch.cuda.get_device_properties(0).L2_cache_size,
           "gemm_8192_tflops": {"fp16": gemm_tflops(torch.float16), "bf16": gemm_tflops(torch.bfloat16)},
           "smi_after": smi()}
    out.mkdir(parents=True, exist_ok=True)
    (out / "chip_probe.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res))


if __name__ == "__main__":
    main()
