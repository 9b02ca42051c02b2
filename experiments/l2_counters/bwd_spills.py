"""Do our backward kernels' register spills reach L2, and how many bytes a (query block, key tile) visit?

    python experiments/l2_counters/bwd_spills.py --out DIR     (on the GPU machine; runs ncu once per case)

ptxas spills 40-60 bytes a thread in the d 128 builds of gpu_kernels/backward.cu (64-row query chunks) and none at
d 64. L1 writes local stores through to L2 (experiments/l2_counters/l2_writes_h200_2026-12-02 found that for
PyTorch's FlashAttention-2 forward); if ours do too, the model should count them as it counts PyTorch's
(`Build.spill_bytes_per_tile`). Each case runs our forward and backward once through autograd, under
`ncu --clock-control none` on the main backward kernel only, on grids in no record set. Per case: the L1's local
load and store bytes, L2's bytes and the L1-sourced write sectors; the tile visits come from iosim's plan
(`analyse`, on the CPU).
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# (algorithm, batch, heads, N, d, dtype, causal)
CASES = [("flash2", 2, 8, 2048, 128, "fp16", False), ("flash2", 2, 8, 2048, 128, "fp16", True),
         ("flash2", 1, 4, 6144, 128, "bf16", False), ("flash2", 1, 4, 6144, 128, "bf16", True),
         ("flash1", 16, 8, 1536, 128, "fp16", False), ("flash1", 16, 8, 1536, 128, "fp16", True),
         ("flash2", 2, 8, 2048, 64, "fp16", False), ("flash1", 16, 8, 1536, 64, "fp16", True)]
METRICS = ["l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum", "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum",
           "lts__t_sectors_srcunit_tex_op_write.sum", "lts__t_bytes.sum", "gpu__time_duration.sum"]


def visits(cfg) -> int:
    """The (query block, key tile) visits of the backward's main kernel at its default blocks, as iosim plans them."""
    from iosim.plan import Tiling
    from iosim.plan.blocks import RowBlocks
    t = Tiling.backward(cfg)
    return cfg.bh * int(RowBlocks(cfg, t.block_q, t.block_kv).nvis.sum())


def run_case(i: int) -> None:
    import torch
    from gpu_kernels.ops import attention
    alg, b, h, n, d, dt, causal = CASES[i]
    dtype = torch.float16 if dt == "fp16" else torch.bfloat16
    q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=dtype) for _ in range(4))
    for x in (q, k, v):
        x.requires_grad_()
    attention(q, k, v, alg, causal=causal).backward(do)
    torch.cuda.synchronize()


def measure(out: Path) -> None:
    rows = []
    for i, case in enumerate(CASES):
        cmd = ["ncu", "--clock-control", "none", "--csv", "--print-units", "base", "-k", "regex:flash[12]_bwd",
               "--metrics", ",".join(METRICS), sys.executable, __file__, "--case", str(i)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        text = res.stdout[res.stdout.find('"ID"'):]
        got = {r["Metric Name"]: float(r["Metric Value"].replace(",", "")) for r in csv.DictReader(io.StringIO(text))}
        rows.append({"case": case, "metrics": got})
        print(case, {m.split("__")[1][:40]: got.get(m) for m in METRICS}, flush=True)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    ver = subprocess.run(["ncu", "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    prov = {"gpu": smi, "ncu": ver, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "method": "ncu --clock-control none (caches flushed: default) --csv --print-units base, the main backward "
                      "kernel of one autograd forward+backward, torch.randn inputs"}
    out.mkdir(parents=True, exist_ok=True)
    (out / "bwd_spills.json").write_text(json.dumps({"provenance": prov, "metrics": METRICS, "rows": rows}, indent=1))


def analyse(path: Path) -> None:
    """Local store bytes a visited (query block, key tile) pair, from iosim's backward plan of each case."""
    from iosim.workload import AttentionConfig
    data = json.loads(path.read_text())
    for row in data["rows"]:
        alg, b, h, n, d, dt, causal = row["case"]
        cfg = AttentionConfig(batch=b, heads=h, seqlen_q=n, seqlen_k=n, head_dim=d, dtype=dt, causal=causal,
                              **{"pass": "backward"})
        v = visits(cfg)
        m = row["metrics"]
        st, ld = m[METRICS[0]], m[METRICS[1]]
        print(f"{alg} B{b} H{h} N{n} d{d} {dt} {'causal' if causal else 'full':<7} visits {v:>8}  "
              f"local st {st / v:8.1f} B/visit  ld {ld / v:8.1f}  L1->L2 writes "
              f"{m[METRICS[2]] * 32 / v:8.1f} B/visit  L2 {m[METRICS[3]] / 1e6:9.1f} MB")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--case", type=int)
    ap.add_argument("--analyse", type=Path, help="a bwd_spills.json to read (on the CPU)")
    args = ap.parse_args()
    if args.case is not None:
        run_case(args.case)
    elif args.analyse:
        analyse(args.analyse)
    else:
        measure(args.out)


if __name__ == "__main__":
    main()
