"""Progress reporting for long measurements: a callback type and a rich progress bar."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

ProgressCallback = Callable[[int, int, str], None]
"""Called as `callback(done, total, what)` before each item and once at the end."""


def _silent(done: int, total: int, what: str) -> None:
    return None


@contextlib.contextmanager
def progress_reporter(progress: bool | ProgressCallback, label: str) -> Iterator[
        ProgressCallback]:
    """The caller's callback, a rich bar on stderr (`progress=True`), or nothing (False)."""
    if callable(progress):
        yield progress
        return
    if not progress:
        yield _silent
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[what]}"))
    with Progress(*columns, console=Console(file=sys.stderr)) as bar:
        task = bar.add_task(label, total=None, what="")

        def update(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total, what=what)

        yield update
