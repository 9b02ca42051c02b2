"""Experiment: flash2 kernel variants (old source vs new, min-blocks launch bound, tilings) vs torch flash."""
import json, math, os, statistics, sys, time
import numpy as np, cupy as cp, torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
sys.path.insert(0, os.getcwd())
from gpu_kernels import build
from gpu_kernels.timing import event_times
OUT = os.environ.get("OUT", "/tmp/out")
NEW = open("gpu_kernels/attention.cu").read()
OLD = open(".device/attention_mid.cu").read()
LOG2E = 1.4426950408889634

def compile_(src, names, minb):
    opts = ("-std=c++17", "-arch=sm_90") + ((f"-DFLASH_MIN_BLOCKS={minb}",) if minb else ())
    m = cp.RawModule(code=src, options=opts, name_expressions=names); m.compile(); return m

def run(fn, q, k, v, o, lse, bq, warps, stages, bkv, causal, d):
    b, h, n, _ = q.shape
    smem = (bq + stages * 2 * bkv) * d * 2
    fn.max_dynamic_shared_size_bytes = smem
    args = tuple(np.uint64(x.data_ptr()) for x in (q, k, v, o, lse)) + tuple(np.int32(x) for x in (b, h, h, n, n)) + (
        np.float32(LOG2E / math.sqrt(d)), np.int32(causal), np.int32(0))
    grid = (b * h * -(-n // bq),)
    st = cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    with st:
        return lambda: fn(grid, (warps * 32,), args, shared_mem=smem)

T = {64: [(128, 128, 4, 2), (64, 64, 4, 2)], 128: [(128, 64, 4, 2), (64, 64, 4, 1)]}
plan = {d: [(src, 0, t) for src in ("mid", "new") for t in ts] for d, ts in T.items()}
rows = []
torch.manual_seed(0)
for d in (64, 128):
    mods = {}
    for src, mb, t in plan[d]:
        mods.setdefault((src, mb), []).append(build.flash_name("flash2", d, *t, False))
    t0 = time.time()
    comp = {key: compile_(NEW if key[0] == "new" else OLD, names, key[1]) for key, names in mods.items()}
    print(f"d={d} compiled {sum(map(len, mods.values()))} instances in {time.time()-t0:.0f}s", flush=True)
    for n in (1024, 2048, 8192):
        for causal in (False, True):
            b, h = 16384 // n, 2048 // d
            q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
            flops = 4 * b * h * n * n * d / (2 if causal else 1)
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                tf = statistics.median(event_times(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)))
            row = {"d": d, "N": n, "causal": causal, "torch_flash": flops / tf / 1e12}
            for src, mb, t in plan[d]:
                fn = comp[(src, mb)].get_function(build.flash_name("flash2", d, *t, False))
                o = torch.full_like(q, float("nan")); lse = torch.empty(b, h, n, device="cuda")
                call = run(fn, q, k, v, o, lse, t[0], t[2], t[3], t[1], causal, d)
                call(); torch.cuda.synchronize()
                err = ((o.float() - ref.float()).norm() / ref.float().norm()).item()
                tt = statistics.median(event_times(call))
                key = f"{src}{'' if not mb else '_mb%d' % mb}_{t[0]}x{t[1]}_{t[2]}w{t[3]}s"
                row[key] = flops / tt / 1e12
                row[key + "_err"] = err
                row[key + "_regs"] = fn.num_regs
                row[key + "_local"] = fn.local_size_bytes
            rows.append(row)
            print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
json.dump(rows, open(f"{OUT}/variants.json", "w"), indent=1)
print("\nTFLOP/s (ratio to torch flash), err, regs")
for row in rows:
    print(f"d={row['d']} N={row['N']} causal={row['causal']} torch_flash={row['torch_flash']:.0f}")
    for key in sorted(k for k in row if k.startswith(("old", "new")) and not k.endswith(("_err", "_regs", "_local"))):
        print(f"   {key:28s} {row[key]:6.0f} {row[key]/row['torch_flash']:5.2f}  err {row[key+'_err']:.1e} regs {row[key+'_regs']} local {row[key+'_local']}")
