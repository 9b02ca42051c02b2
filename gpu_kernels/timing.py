"""Timing on the GPU: CUDA events around each call, after warm-up. Used by the benchmark, the measurement
harness and calibration, so they all time the same way."""
from __future__ import annotations


def event_times(fn, reps: int = 20, warmup: int = 3) -> list[float]:
    """Seconds of each of `reps` calls of `fn`, sorted. Events are recorded on CuPy's current stream, which is
    the legacy default stream that torch also uses unless told otherwise."""
    import cupy as cp
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b) * 1e-3)
    return sorted(times)
