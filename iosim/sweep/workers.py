"""Where many predictions run: this process, local worker processes, or a Dask cluster (dask.distributed).

`Workers` is the one way iosim spreads work (`iosim sweep`, `iosim fit`): with one worker it runs in this process;
with more, on a `LocalCluster` of that many single-threaded processes; with a scheduler address, on that cluster
(its workers need iosim installed, at the same version). Data every task needs (`shared`) is sent to each worker
once, not with every task.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Iterable, Iterator

from ..errors import IosimError


def default_workers() -> int:
    return max(1, os.cpu_count() or 1)


class Workers:
    """with Workers(scheduler=None, workers=None) as w: for i, result in w.map(fn, items, shared): ...

    `map` yields (index, fn(item, shared)) as the tasks finish, in any order. A task that raises re-raises here.
    """

    def __init__(self, scheduler: str | None = None, workers: int | None = None):
        if workers is not None and workers < 1:
            raise IosimError(f"workers must be at least 1, got {workers}")
        self.scheduler = scheduler
        self.n = workers if workers is not None else (None if scheduler else default_workers())
        self.client = self.cluster = None

    @property
    def in_process(self) -> bool:
        return self.scheduler is None and self.n == 1

    def __enter__(self) -> "Workers":
        if self.in_process:
            return self
        import logging

        from distributed import Client, LocalCluster
        logging.getLogger("distributed").setLevel(logging.ERROR)   # its start-up chatter is not the user's
        if self.scheduler:
            try:
                self.client = Client(self.scheduler, timeout="5s")
            except (OSError, TimeoutError) as e:
                raise IosimError(f"scheduler {self.scheduler}: cannot reach a Dask scheduler there "
                                 f"({type(e).__name__})") from None
        else:
            self.cluster = LocalCluster(n_workers=self.n, threads_per_worker=1, processes=True,
                                        dashboard_address=None)
            self.client = Client(self.cluster)
        return self

    def __exit__(self, *exc) -> None:
        if self.client is not None:
            self.client.close()
        if self.cluster is not None:
            self.cluster.close()

    def map(self, fn: Callable[[Any, Any], Any], items: Iterable, shared: Any = None) -> Iterator[tuple[int, Any]]:
        items = list(items)
        if self.in_process:
            for i, x in enumerate(items):
                yield i, fn(x, shared)
            return
        from distributed import as_completed
        data = self.client.scatter(shared, broadcast=True) if shared is not None else None
        futures = [self.client.submit(fn, x, data, pure=False) for x in items]
        index = {f.key: i for i, f in enumerate(futures)}
        try:
            for f in as_completed(futures):
                yield index[f.key], f.result()
        finally:
            for f in futures:
                f.cancel()
