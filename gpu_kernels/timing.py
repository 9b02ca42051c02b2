"""Timing on the GPU: CUDA events around each call, after warm-up. Used by the benchmark, the measurement
harness and calibration, so they all time the same way."""
from __future__ import annotations


def event_times(fn, reps: int = 20, warmup: int = 3, queued: bool = False) -> list[float]:
    """Seconds of each of `reps` calls of `fn`, sorted. Events are recorded on CuPy's current stream, which is
    the legacy default stream that torch also uses unless told otherwise.

    queued=False: the GPU is idle before each call, so a call's time includes the host work of launching it (what
    one call costs a program that waits for it). queued=True: the calls are issued back to back and synchronised
    once, so the host runs ahead and each interval is the GPU's time for the call (the kernels' speed, as
    benchmarks compare it), unless the host work per call is longer than the kernels."""
    import cupy as cp
    for _ in range(warmup):
        fn()
    events = []
    for _ in range(reps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        fn()
        b.record()
        if not queued:
            b.synchronize()
        events.append((a, b))
    events[-1][1].synchronize()
    return sorted(cp.cuda.get_elapsed_time(a, b) * 1e-3 for a, b in events)
