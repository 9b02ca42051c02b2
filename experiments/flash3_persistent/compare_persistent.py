"""flash3 persistent (a grid of one block an SM taking work tiles in turn) against one block a work tile, and
against the kernel before it (`--before`: a hopper.cu of one block a work tile), side by side with PyTorch's SDPA
flash and cuDNN forwards, in one run.

    python experiments/flash3_persistent/compare_persistent.py [--before OLD_HOPPER_CU] [--out results.json]

Each variant is first checked against a float64 reference (the GPU tests' shapes and three with more work tiles
than SMs: GQA, odd N, Nq != Nk; causal or not; fp16 and bf16), then timed: FlashAttention-3's benchmark shapes
(16k tokens, hidden 2048) at N 1k, 2k, 8k, and small grids (B1 H8 N4096, B64 H16 N256, B2 H8 N3001 causal, B4
H16 N512x4096): microseconds from CUDA events, the median of 20 queued calls, fresh random inputs per method.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from benchmarks.kernels import BACKENDS, _sdpa, time_ms  # noqa: E402
from gpu_kernels import build, hopper  # noqa: E402
from test_gpu_kernels import SHAPES, TOL, inputs, reference, rel_err  # noqa: E402

# many work tiles a block: 384 and 176 at 192 rows, 156 x 2 Nq != Nk
BIG = [(4, 16, 4, 1003, 1003), (2, 8, 8, 4099, 4099), (3, 12, 12, 777, 2049)]
# (b, h, nq, nk, causal) beside the benchmark's shapes
SMALL = [(1, 8, 4096, 4096, False), (64, 16, 256, 256, False), (2, 8, 3001, 3001, True), (4, 16, 512, 4096, False),
         (1, 1, 8192, 8192, False), (16, 32, 1024, 1024, True)]


def variants(d: int, before: bool):
    """{label: (module, launch kwargs)}: 'before' the old kernel, 'tile' one block a work tile, 'persistent' (causal:
    tiles claimed), 'static' (every SM count-th tile)."""
    geos = [(3, 128), (2, 128)] if d == 64 else [(2, 128)]
    out = {}
    for g in geos:
        tag = f"{64 * g[0]}x{g[1]}"
        if before:
            out[f"before {tag}"] = ("before", dict(blocks=g, persistent=False))
        out[f"tile {tag}"] = ("now", dict(blocks=g, persistent=False))
        out[f"persistent {tag}"] = ("now", dict(blocks=g, persistent=True))
        out[f"static {tag}"] = ("now", dict(blocks=g, persistent=True, claims=False))
    return out


def check(module, kw, d) -> float:
    worst = 0.0
    for dtype in (torch.float16, torch.bfloat16):
        for causal in (False, True):
            for shape in SHAPES + BIG:
                q, k, v = inputs(*shape, d, dtype)
                out = torch.full_like(q, float("nan"))
                o = run(module, q, k, v, causal, out=out, **kw)
                err = rel_err(o, reference(q, k, v, causal)[0])
                if not err < TOL[dtype]:
                    raise AssertionError(f"{kw} {dtype} causal {causal} {shape}: {err}")
                worst = max(worst, err / TOL[dtype])
    return worst


MODULES = {}


def run(module, q, k, v, causal, **kw):
    hopper._module = MODULES[module]
    return hopper.flash3_attention(q, k, v, causal=causal, **kw)


def compile_modules(before: str | None):
    names = sorted({build.flash3_name(d, 128, 2, c, pp, bf) for d in (64, 128) for c in (2, 3)
                    for pp in (True, False) for bf in (False, True)})
    build_names = build.flash3_names
    build.flash3_names = lambda: sorted(set(build_names()) | set(names))
    hopper._module = None
    hopper._kernel(names[0])
    MODULES["now"] = hopper._module
    if before:
        now = build.HOPPER_SOURCE
        build.HOPPER_SOURCE = Path(before)
        hopper._module = None
        hopper._kernel(names[0])
        MODULES["before"] = hopper._module
        build.HOPPER_SOURCE = now


def ab(rounds: int = 6) -> list[dict]:
    """The kernel before against the persistent one, taking turns (ABAB...) on long grids, so that a clock that
    drops under load falls on both: the median of each's rounds (each round the median of 20 queued calls)."""
    out = []
    for d, b, h in ((128, 2, 16), (64, 2, 32)):
        for causal in (False, True):
            q, k, v = (torch.randn(b, h, 8192, d, device="cuda", dtype=torch.float16) for _ in range(3))
            ts = {"before": [], "persistent": []}
            for _ in range(rounds):
                for name, (m, kw) in (("before", ("before", dict(persistent=False))), ("persistent", ("now", {}))):
                    ts[name].append(time_ms(lambda: run(m, q, k, v, causal, **kw)) * 1e3)
            row = {"d": d, "batch": b, "heads": h, "n": 8192, "causal": causal} | \
                {n: sorted(x)[len(x) // 2] for n, x in ts.items()} | {n + "_rounds": x for n, x in ts.items()}
            out.append(row)
            print(f"ab d{d} B{b} H{h} N8192{' causal' if causal else ''}: before {row['before']:.1f} us, persistent "
                  f"{row['persistent']:.1f} us ({row['persistent'] / row['before']:.3f})", flush=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--before")
    ap.add_argument("--out")
    ap.add_argument("--ab", action="store_true", help="only the before/persistent turns (needs --before)")
    args = ap.parse_args()
    compile_modules(args.before)
    if args.ab:
        rows = ab()
        if args.out:
            from gpu_kernels.measure import save_benchmark
            save_benchmark(args.out, "microseconds of flash3 before and persistent, taking turns, one run",
                           ["python3 experiments/flash3_persistent/compare_persistent.py " + " ".join(sys.argv[1:]),
                            ab.__doc__], rows=rows)
        return
    checked, rows = {}, []
    for d in (64, 128):
        for label, (module, kw) in variants(d, bool(args.before)).items():
            try:
                checked[f"d{d} {label}"] = check(module, kw, d)
            except Exception as e:
                checked[f"d{d} {label}"] = f"FAIL {type(e).__name__}: {str(e)[:200]}"
            print(f"check d{d} {label}: {checked[f'd{d} {label}']}", flush=True)
    for dtype in (torch.float16, torch.bfloat16):
        for d in (64, 128):
            shapes = [(16384 // n, 2048 // d, n, n, c) for n in (1024, 2048, 8192) for c in (False, True)]
            shapes += SMALL if dtype == torch.float16 else []
            for b, h, nq, nk, causal in shapes:
                row = {"dtype": str(dtype)[6:], "d": d, "causal": causal, "batch": b, "heads": h, "nq": nq, "nk": nk}
                fns = {lab: (lambda q, k, v, m=m, kw=kw: run(m, q, k, v, causal, **kw))
                       for lab, (m, kw) in variants(d, bool(args.before)).items()
                       if isinstance(checked[f"d{d} {lab}"], float)}
                fns["torch_flash"] = lambda q, k, v: _sdpa(q, k, v, causal, BACKENDS["torch_flash"])
                fns["torch_cudnn"] = lambda q, k, v: _sdpa(q, k, v, causal, BACKENDS["torch_cudnn"])
                for name, fn in fns.items():
                    q = torch.randn(b, h, nq, d, device="cuda", dtype=dtype)
                    k, v = (torch.randn(b, h, nk, d, device="cuda", dtype=dtype) for _ in range(2))
                    try:
                        row[name] = time_ms(lambda: fn(q, k, v)) * 1e3
                    except Exception as e:
                        row[name] = f"{type(e).__name__}: {str(e)[:100]}"
                rows.append(row)
                print(f"{row['dtype']:>8} d{d} B{b} H{h} N{nq}x{nk}{' causal' if causal else ''}: " + "  ".join(
                    f"{k} {x:.1f}" for k, x in row.items() if isinstance(x, float)), flush=True)
    if args.out:
        from gpu_kernels.measure import save_benchmark
        save_benchmark(args.out, "microseconds of flash3 persistent and one block a work tile, and of PyTorch's "
                       "forwards, one run", ["python3 experiments/flash3_persistent/compare_persistent.py " +
                                             " ".join(sys.argv[1:]), __doc__.split("\n\n")[2]],
                       checked=checked, rows=rows)


if __name__ == "__main__":
    main()
