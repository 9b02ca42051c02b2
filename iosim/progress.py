"""Progress for long work: a rich progress bar on stderr, so that piped output (--json) stays clean."""
from __future__ import annotations

from typing import Iterable, Iterator, TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

T = TypeVar("T")


def track(items: Iterable[T], what: str, total: int | None = None) -> Iterator[T]:
    """Yield `items`, showing how many of them are done on stderr (nothing when stderr is not a terminal)."""
    items = list(items) if total is None else items
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(what, total=total if total is not None else len(items))
        for x in items:
            yield x
            bar.advance(task)
