"""Measuring the kernels on a GPU: time (CUDA events), peak memory, and DRAM/L2 bytes (Nsight Compute).

One JSON record per (config, algorithm, tiling) under an output folder, with provenance. A run that dies keeps
every finished record and resumes where it stopped (a record on disk is not measured again). Each record carries
its set, 'calibration' or 'validation', fixed by a hash of the config before anything is fitted.

    python -m gpu_kernels.measure --out reports/measurements/h200 [--no-ncu] [--limit N]
    (or `iosim measure`, which calls this)

Nsight Compute runs in a second pass over the same records (`ncu --clock-control none`, default
`--cache-control all`: caches flushed before each kernel): a child process runs each record once between two
marker kernels, and the kernels between the markers are summed into the record.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from iosim.errors import IosimError
from iosim.plan import Tiling
from iosim.workload import AttentionConfig

from .timing import event_times

NCU_METRICS = "dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,gpu__time_duration.sum"
NCU_OPTIONS = ["--clock-control", "none", "--cache-control", "all", "--csv", "--print-units", "base", "--metrics",
               NCU_METRICS]
REPS, WARMUP = 20, 3
ALGORITHMS = ("naive", "flash1", "flash2", "flash3", "torch_naive", "torch_flash", "torch_cudnn")


# ---- what to measure ---------------------------------------------------------------------------------------

def default_sweep() -> list[dict]:
    """45 configurations: N = 256 ... 16k, d = 64 and 128, fp16 and bf16, causal and not, batch*heads from 1 to
    1,024 (S kept under 4.3 GB so naive attention fits), and the default layer (`AttentionConfig()`, whose
    measured kernels the report's roofline places); each with naive, flash1, two flash2 tilings, and PyTorch's
    naive and flash-backend attention for comparison."""
    configs = []
    for n in (256, 512, 1024, 2048, 4096, 8192, 16384):
        for d in (64, 128):
            for bh in (1, 8, 64, 1024):
                if bh * n * n * 2 > 4.3e9:
                    continue
                heads, i = min(bh, 16), len(configs)
                configs.append(dict(batch=bh // heads, heads=heads, seqlen_q=n, head_dim=d,
                                    dtype=("fp16", "bf16")[i % 2], causal=bool((i // 2) % 2)))
    configs.append(AttentionConfig().model_dump(include={"batch", "heads", "seqlen_q", "head_dim", "dtype",
                                                          "causal"}))
    other = dict(block_q=64, block_kv=64, warps=4, stages=2)
    return [{"config": cfg, "runs": [
        {"algorithm": "naive"},
        {"algorithm": "flash1", "tiling": dict(other, loop_order="flash1")},
        {"algorithm": "flash2"},                                   # practice tiling
        {"algorithm": "flash2", "tiling": dict(other, loop_order="flash2")},
        {"algorithm": "torch_naive"},
        {"algorithm": "torch_flash"},
    ]} for cfg in configs]


def own_backward_sweep() -> list[dict]:
    """iosim's own backward kernels on `backward_sweep`'s configurations: flash2 on every one (backward alone, and
    forward + backward on every other one, and the grouped-query pair); naive where S is at most 512 MB (it holds
    P, dP and dS); flash1 (one block a head) where batch*heads >= 128 and N <= 4096."""
    entries = []
    for e in backward_sweep():
        c = e["config"]
        runs = [{"algorithm": "flash2"}]
        bh, n = c["batch"] * c["heads"], c["seqlen_q"]
        if c["pass"] == "backward" and "kv_heads" not in c:
            if bh * n * n * 2 <= 2 ** 29:
                runs.append({"algorithm": "naive"})
            if bh >= 128 and n <= 4096:
                runs.append({"algorithm": "flash1"})
        entries.append({"config": c, "runs": runs})
    return entries


def backward_sweep() -> list[dict]:
    """PyTorch's eager naive attention and its flash backend, backward alone (46 configurations) and forward +
    backward (every other one): N = 256 ... 16k with odd N, d = 64 and 128, fp16 and bf16, causal and not,
    batch*heads from 1 to 1,024 (S under 8.6 GB, so that eager PyTorch's backward, which holds S, P, dP and dS,
    fits), the paper's GPT-2 medium layer; and two grouped-query configurations (flash only: eager matmuls do
    not broadcast key heads)."""
    configs = []
    for n in (256, 999, 1024, 2048, 3001, 4096, 8192, 16384):
        for d in (64, 128):
            for bh in (1, 16, 128, 1024):
                if bh * n * n * 2 > 8.6e9:
                    continue
                heads, i = min(bh, 16), len(configs)
                configs.append(dict(batch=bh // heads, heads=heads, seqlen_q=n, head_dim=d,
                                    dtype=("fp16", "bf16")[i % 2], causal=bool((i // 3) % 2)))
    gpt2 = AttentionConfig().model_dump(include={"batch", "heads", "seqlen_q", "head_dim", "dtype", "causal"})
    configs = [c for c in configs if c != gpt2] + [gpt2]
    both = [{"algorithm": "torch_naive"}, {"algorithm": "torch_flash"}]
    entries = [{"config": c | {"pass": "backward"}, "runs": both} for c in configs]
    entries += [{"config": c | {"pass": "forward+backward"}, "runs": both} for c in configs[::2]]
    for causal in (False, True):
        gqa = dict(batch=4, heads=32, kv_heads=8, seqlen_q=4096, head_dim=128, dtype="bf16", causal=causal)
        entries += [{"config": gqa | {"pass": p}, "runs": [{"algorithm": "torch_flash"}]}
                    for p in ("backward", "forward+backward")]
    return entries


def load_sweep(path: Path) -> list[dict]:
    """A sweep file: JSON, a list of {"config": {AttentionConfig fields}, "runs": [{"algorithm": ..., "tiling":
    {Tiling fields}}, ...]} as `default_sweep` returns, each entry optionally with "set" ("calibration" or
    "validation": its records' set, decided before they are measured; absent: `split_of`); checked whole before
    anything runs."""
    try:
        entries = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise IosimError(f"sweep file {path}: {e}") from None
    if not isinstance(entries, list) or not entries:
        raise IosimError(f"sweep file {path}: expected a non-empty JSON list of {{'config': ..., 'runs': [...]}}")
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or not {"config", "runs"} <= set(e) <= {"config", "runs", "set"} \
                or not isinstance(e["runs"], list):
            raise IosimError(f"sweep file {path}: entry {i} must have 'config' and 'runs' (a list), and may have "
                             f"'set'")
        if e.get("set", "calibration") not in SETS:
            raise IosimError(f"sweep file {path}: entry {i}: set must be one of {', '.join(SETS)}")
        for r in e["runs"]:
            if not isinstance(r, dict) or r.get("algorithm") not in ALGORITHMS:
                raise IosimError(f"sweep file {path}: entry {i}: algorithm must be one of {', '.join(ALGORITHMS)}")
    expand(entries)   # every config and tiling validated now: one line naming the field if not
    return entries


SETS = ("calibration", "validation")


def split_of(cfg: AttentionConfig) -> str:
    """A quarter of the configurations calibrate, the rest validate; fixed by the config alone."""
    h = int(hashlib.sha1(cfg.label().encode()).hexdigest(), 16)
    return "calibration" if h % 4 == 0 else "validation"


def record_key(cfg: AttentionConfig, algorithm: str, tiling: Tiling | None) -> str:
    text = json.dumps([cfg.model_dump(by_alias=True), algorithm, tiling.model_dump() if tiling else None],
                      sort_keys=True)
    label = cfg.label().replace(" ", "_").replace("/", "-")
    return f"{label}__{algorithm}" + (f"_{tiling.block_q}x{tiling.block_kv}_{tiling.warps}w{tiling.stages}s"
                                      if tiling else "") + "__" + hashlib.sha1(text.encode()).hexdigest()[:8]


def expand(entries: list[dict]) -> list[tuple[str, AttentionConfig, str, Tiling | None]]:
    out = []
    for e in entries:
        cfg = AttentionConfig.make(**e["config"])
        for r in e["runs"]:
            alg = r["algorithm"]
            t = None
            if alg in ("flash1", "flash2"):
                t = Tiling.make(**r["tiling"]) if "tiling" in r else Tiling.practice(cfg, alg)
            out.append((record_key(cfg, alg, t), cfg, alg, t))
    return out


# ---- running one measurement ---------------------------------------------------------------------------------

def _runner(cfg: AttentionConfig, algorithm: str, tiling: Tiling | None):
    """A call of `algorithm` on fresh random inputs, made once here: the forward; the backward of a forward made
    here, beforehand (its graph kept, so the call repeats); or a training step's forward and backward. Gradients
    come back from `torch.autograd.grad`, as a step whose parameters' grads were set to None computes them."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from .ops import attention

    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[cfg.dtype]
    grad = cfg.pass_ != "forward"
    q = torch.randn(cfg.batch, cfg.heads, cfg.seqlen_q, cfg.head_dim, device="cuda", dtype=dt, requires_grad=grad)
    k = torch.randn(cfg.batch, cfg.kv_heads, cfg.seqlen_k, cfg.head_dim, device="cuda", dtype=dt,
                    requires_grad=grad)
    v = torch.randn_like(k, requires_grad=grad)
    if algorithm == "torch_naive":
        def fwd():
            s = (q @ k.transpose(-1, -2)) * cfg.head_dim ** -0.5
            if cfg.causal:
                s = s.masked_fill(torch.ones(cfg.seqlen_q, cfg.seqlen_k, dtype=torch.bool, device="cuda")
                                  .triu(1 + cfg.causal_offset), float("-inf"))
            return torch.softmax(s, -1) @ v
    elif algorithm in ("torch_flash", "torch_cudnn"):
        backend = SDPBackend.FLASH_ATTENTION if algorithm == "torch_flash" else SDPBackend.CUDNN_ATTENTION

        def fwd():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=cfg.causal,
                                                      enable_gqa=cfg.kv_heads != cfg.heads)
    else:
        def fwd():
            return attention(q, k, v, algorithm, causal=cfg.causal, tiling=tiling)
    if cfg.pass_ == "forward":
        return fwd
    do = torch.randn(cfg.batch, cfg.heads, cfg.seqlen_q, cfg.head_dim, device="cuda", dtype=dt)
    if cfg.pass_ == "backward":
        o = fwd()

        def bwd():
            return torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
        return bwd

    def step():
        return torch.autograd.grad(fwd(), (q, k, v), do)
    return step


def time_one(cfg, algorithm, tiling) -> dict:
    import torch
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    times = event_times(_runner(cfg, algorithm, tiling), REPS, WARMUP)
    return {"median_s": statistics.median(times), "min_s": times[0], "max_s": times[-1],
            "p10_s": times[len(times) // 10], "p90_s": times[(9 * len(times)) // 10], "runs": len(times),
            "peak_memory_bytes": torch.cuda.max_memory_allocated()}


def machine_provenance() -> dict:
    """GPU, driver, library versions, commit and date, without the records' timing and Nsight method (for
    microbenchmarks that say their own method)."""
    return {k: v for k, v in provenance().items() if k not in ("timing", "ncu", "ncu_options")}


def save_benchmark(path, what: str, method: list[str], **fields) -> dict:
    """Write a microbenchmark's record (what, method, date, provenance, then its own fields) as JSON to `path`."""
    from pathlib import Path
    record = {"what": what, "method": method, "date": datetime.now(timezone.utc).isoformat(),
              "provenance": machine_provenance(), **fields}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(record))
    return record


def provenance() -> dict:
    import cupy
    import torch
    drv = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    commit = os.environ.get("IOSIM_COMMIT") or subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() or "unknown"
    ncu = shutil.which("ncu")
    ncu_ver = subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1] \
        if ncu else None
    return {"gpu": torch.cuda.get_device_name(), "driver": drv, "cuda": torch.version.cuda,
            "torch": torch.__version__, "cupy": cupy.__version__, "python": platform.python_version(),
            "commit": commit, "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "timing": f"CUDA events around one call, median of {REPS} after {WARMUP} warm-ups, torch.randn inputs",
            "ncu": ncu_ver, "ncu_options": " ".join(NCU_OPTIONS)}


def check_gpu() -> None:
    """A clear message, not a traceback, where there is no GPU, CuPy or torch."""
    try:
        import cupy  # noqa: F401
        import torch
    except ImportError as e:
        raise IosimError(f"measuring needs CuPy and torch on a CUDA machine (pip install 'iosim[gpu]'): {e}")
    if not torch.cuda.is_available():
        raise IosimError("measuring needs a CUDA GPU; torch sees none")


def measure(out: Path, entries: list[dict], ncu: bool = True, limit: int | None = None) -> int:
    """Time every record not yet on disk, then fill in Nsight Compute bytes where missing. Returns records done."""
    check_gpu()
    if ncu and shutil.which("ncu") is None:
        raise IosimError("ncu (Nsight Compute) is not on PATH; install it or pass --no-ncu")
    out.mkdir(parents=True, exist_ok=True)
    prov = provenance()
    todo = expand(entries)[:limit]
    if any(not alg.startswith("torch_") for _, _, alg, _ in todo):   # PyTorch's runs need none of ours
        from . import build
        build.precompile()
    fixed = {key: e["set"] for e in entries if "set" in e for key, *_ in expand([e])}   # sets the sweep decides
    from iosim.progress import track
    done = 0
    for key, cfg, alg, t in track(todo, "timing"):
        f = out / f"{key}.json"
        if f.exists():
            continue
        try:
            timing = time_one(cfg, alg, t)
            err = None
        except Exception as e:   # a config a method refuses (memory, shape) is recorded, not fatal
            timing, err = None, f"{type(e).__name__}: {str(e)[:200]}"
        rec = {"key": key, "set": fixed.get(key) or split_of(cfg), "config": cfg.model_dump(by_alias=True),
               "algorithm": alg, "tiling": t.model_dump() if t else None, "time": timing, "error": err, "ncu": None,
               "provenance": prov}
        _write(f, rec)
        done += 1
    if ncu:
        _ncu_pass(out, [k for k, *_ in todo], prov)
    return done


def _write(f: Path, rec: dict) -> None:
    """A record is whole or absent: written beside, then renamed over."""
    tmp = f.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec, indent=1))
    tmp.replace(f)


# ---- Nsight Compute ---------------------------------------------------------------------------------------------

def _marker():
    import cupy as cp
    return cp.RawKernel(r'extern "C" __global__ void iosim_marker(int i) {}', "iosim_marker")


def replay(out: Path, keys: list[str]) -> None:
    """Child of ncu: each record once, between two marker launches (inputs are made before the first)."""
    import numpy as np
    import torch
    mark = _marker()
    by_key = {k: (c, a, t) for k, c, a, t in expand(_entries_of(out, keys))}
    if any(not a.startswith("torch_") for _, a, _ in by_key.values()):
        from . import build
        build.precompile()
    for i, key in enumerate(keys):
        cfg, alg, t = by_key[key]
        fn = _runner(cfg, alg, t)
        torch.cuda.synchronize()
        mark((1,), (1,), (np.int32(i),))
        try:
            fn()
        except Exception:
            pass
        torch.cuda.synchronize()
        mark((1,), (1,), (np.int32(i),))
        torch.cuda.synchronize()


def _entries_of(out: Path, keys: list[str]) -> list[dict]:
    entries = []
    for k in keys:
        r = json.loads((out / f"{k}.json").read_text())
        run = {"algorithm": r["algorithm"]} | ({"tiling": r["tiling"]} if r["tiling"] else {})
        entries.append({"config": r["config"], "runs": [run]})
    return entries


def _ncu_pass(out: Path, keys: list[str], prov: dict) -> None:
    recs = {}
    for k in keys:
        f = out / f"{k}.json"
        if f.exists():
            r = json.loads(f.read_text())
            if r["ncu"] is None and r["error"] is None:
                recs[k] = r
    if not recs:
        return
    # a child process a chunk of records, each chunk's bytes written before the next starts: a run stopped
    # midway keeps what Nsight had counted
    from iosim.progress import track
    keys = list(recs)
    chunks = [keys[i:i + NCU_CHUNK] for i in range(0, len(keys), NCU_CHUNK)]
    for chunk in track(chunks, "Nsight Compute"):
        _ncu_chunk(out, chunk, {k: recs[k] for k in chunk}, prov)


NCU_CHUNK = 12


def _ncu_chunk(out: Path, keys: list[str], recs: dict, prov: dict) -> None:
    listing = out / "_ncu_keys.json"
    listing.write_text(json.dumps(keys))
    cmd = ["ncu", *NCU_OPTIONS, sys.executable, "-m", "gpu_kernels.measure", "--replay", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    listing.unlink()
    (out / "_ncu_last.log").write_text(res.stderr[-20000:])
    # segments come in record order; one cut short (a replay that died) leaves the rest unfilled for a rerun
    for key, kernels in zip(keys, _segments(res.stdout)):
        if not kernels:   # the run raised inside its markers: no bytes rather than zero bytes
            continue
        rec = recs[key]
        rec["ncu"] = {"kernels": kernels,
                      "dram_read_bytes": sum(k["dram__bytes_read.sum"] for k in kernels),
                      "dram_write_bytes": sum(k["dram__bytes_write.sum"] for k in kernels),
                      "l2_bytes": sum(k["lts__t_bytes.sum"] for k in kernels),
                      "duration_s": sum(k["gpu__time_duration.sum"] for k in kernels),
                      "date": prov["date"], "commit": prov["commit"]}
        _write(out / f"{key}.json", rec)


# ncu's unit names (base units with --print-units base: 'byte' and 'ns'); anything else stops the parse rather
# than storing a number in the wrong unit
_UNITS = {"byte": 1, "B": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "ns": 1e-9, "nsecond": 1e-9,
          "us": 1e-6, "usecond": 1e-6, "ms": 1e-3, "msecond": 1e-3, "s": 1, "second": 1}


def ncu_kernels(csv_text: str) -> list[dict]:
    """ncu's --csv output -> one dict per profiled kernel, in launch order: its ID, name, and each metric as ncu
    printed it, [value without thousands separators, unit] (the benchmarks under benchmarks/ read it too)."""
    lines = [ln for ln in csv_text.splitlines() if ln.startswith('"')]
    kernels: dict[str, dict] = {}
    for r in csv.DictReader(io.StringIO("\n".join(lines))):
        k = kernels.setdefault(r["ID"], {"id": int(r["ID"]), "name": r["Kernel Name"], "raw": {}})
        k["raw"][r["Metric Name"]] = [r["Metric Value"].replace(",", ""), r["Metric Unit"]]
    return list(kernels.values())


def _segments(csv_text: str) -> list[list[dict]]:
    """ncu's CSV -> per record, the kernels launched between its two markers, with metrics in bytes/seconds."""
    segs, cur = [], None
    for k in ncu_kernels(csv_text):
        k = {"name": k["name"], "raw": k["raw"]}
        for metric, (raw, unit) in k["raw"].items():
            if unit not in _UNITS:
                raise ValueError(f"unknown ncu unit {unit!r} for {metric}")
            k[metric] = float(raw) * _UNITS[unit]    # in bytes and seconds
        if k["name"].startswith("iosim_marker"):
            if cur is None:
                cur = []
            else:
                segs.append(cur)
                cur = None
        elif cur is not None:
            cur.append(k)
    return segs


def main(argv: list[str] | None = None) -> None:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m gpu_kernels.measure", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("reports/measurements/h200"))
    ap.add_argument("--no-ncu", action="store_true")
    ap.add_argument("--limit", type=int, default=None, help="measure only the first N records of the sweep")
    ap.add_argument("--sweep", type=Path, default=None, help="sweep file (JSON; default: the built-in sweep)")
    ap.add_argument("--backward", action="store_true", help="the built-in backward sweep (backward and training "
                    "step of PyTorch's naive and flash attention) instead of the forward one")
    ap.add_argument("--backward-ours", action="store_true", help="the built-in backward sweep of iosim's own "
                    "kernels (naive, flash1, flash2)")
    ap.add_argument("--replay", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.replay:
        return replay(args.replay, json.loads((args.replay / "_ncu_keys.json").read_text()))
    try:
        sweep = load_sweep(args.sweep) if args.sweep else backward_sweep() if args.backward else \
            own_backward_sweep() if args.backward_ours else default_sweep()
        n = measure(args.out, sweep, ncu=not args.no_ncu, limit=args.limit)
    except IosimError as e:
        print(f"measure: error: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"{n} new records in {args.out}")


if __name__ == "__main__":
    main()
