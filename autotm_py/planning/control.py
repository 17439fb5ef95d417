"""The line between a running solve and whoever started it: progress goes out, stops come in.

`SolveControl` is handed down from the caller (the CLI, or an API user) through the pipeline to
the solvers. The solvers report `Progress` through it (stage, incumbent, bound, gap) and poll it
for a stop request:

- ``request_stop()`` (level 1, the first Ctrl-C): stop searching and keep the best plan found
  so far; CBC gets a SIGINT (it then writes its incumbent), HiGHS is interrupted from its
  callbacks. The planner builds no further model of the static -> sync -> async chain and the
  pipeline skips the baselines.
- ``request_stop(now=True)`` (level 2, the second Ctrl-C): stop now: CBC is killed, HiGHS is
  no longer waited for; the best plan the planner already holds (an earlier strategy's) is
  returned.

`handle_signals` maps SIGINT to these two levels (a third raises KeyboardInterrupt) and SIGTERM
to `Terminated`, which unwinds through the solvers' cleanup (child killed, temp files removed).
Nothing here is installed unless a caller asks: the library alone never touches signal handlers.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

STOP_GRACEFUL = 1
STOP_NOW = 2


class Terminated(BaseException):
    """SIGTERM arrived while `handle_signals` was active. A BaseException, like
    KeyboardInterrupt, so that no `except Exception` swallows it on its way out."""


@dataclass(frozen=True)
class Progress:
    """What a solve is doing now. Objective values are in the ILP's units (milliseconds per
    iteration): an incumbent is the objective of the best plan so far, the ILP's estimate of
    its iteration, not its prediction (the decoded plan simulated, which `optimize` prints as
    `predicted`: with `--read-pricing step` at most the objective, lower where the simulated
    copies overlap more than the ILP counts)."""

    stage: str = "starting"  # building | solving | stopping | verifying | baselines | ...
    strategy: str | None = None
    solver: str | None = None
    incumbent: float | None = None
    bound: float | None = None
    started: float = 0.0  # time.monotonic() when the control was made
    time_limit_s: float | None = None

    @property
    def gap(self) -> float | None:
        if self.incumbent is None or self.bound is None or self.incumbent <= 0:
            return None
        return max(self.incumbent - self.bound, 0.0) / self.incumbent

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def describe(self) -> str:
        """One line: ``solving the async model (highs), objective 52.410 ms, gap 3.1%, 12 s,
        time limit 300 s`` (the best plan's objective, which `optimize`'s summary prints on its
        solver line; elapsed since the control was made; the limit counts the search)."""
        what = self.stage
        if self.strategy and self.stage in ("building", "solving", "stopping"):
            what = f"{self.stage} the {self.strategy} model"
            if self.solver and self.stage != "building":
                what += f" ({self.solver})"
        parts = [what]
        if self.incumbent is not None and self.stage in ("solving", "stopping"):
            parts.append(f"objective {self.incumbent:.3f} ms")
            if self.gap is not None:
                parts.append(f"gap {self.gap * 100:.1f}%")
        parts.append(f"{self.elapsed_s:.0f} s")
        if self.time_limit_s is not None and self.stage in ("building", "solving"):
            parts.append(f"time limit {self.time_limit_s:g} s")
        return ", ".join(parts)


class SolveControl:
    """Progress reports out (`on_progress`, called from the solving thread or the main one),
    stop requests in (`request_stop`, from a signal handler or another thread)."""

    def __init__(self, on_progress: Callable[[Progress], None] | None = None, *,
                 time_limit_s: float | None = None) -> None:
        self.on_progress = on_progress
        self.stop_level = 0
        self._lock = threading.RLock()
        self._progress = Progress(started=time.monotonic(), time_limit_s=time_limit_s)

    @property
    def progress(self) -> Progress:
        return self._progress

    @property
    def stop_requested(self) -> bool:
        return self.stop_level >= STOP_GRACEFUL

    def request_stop(self, *, now: bool = False) -> None:
        self.stop_level = max(self.stop_level, STOP_NOW if now else STOP_GRACEFUL)
        if self._progress.stage == "solving":  # no callback: this may run in a signal handler
            self._progress = replace(self._progress, stage="stopping")

    def report(self, **changes: Any) -> None:
        """Update the progress (`Progress` fields) and tell `on_progress`."""
        with self._lock:
            if changes.get("stage") in ("building", "solving"):  # a new model: new numbers
                changes = {"incumbent": None, "bound": None, **changes}
            self._progress = replace(self._progress, **changes)
            progress = self._progress
        if self.on_progress is not None:
            self.on_progress(progress)


@contextlib.contextmanager
def handle_signals(control: SolveControl) -> Iterator[SolveControl]:
    """While active (main thread only; elsewhere a no-op): the first SIGINT asks for a
    graceful stop, the second for an immediate one, a third raises KeyboardInterrupt; SIGTERM
    raises `Terminated`. The previous handlers come back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield control
        return

    def on_sigint(_signum: int, _frame: Any) -> None:
        if control.stop_level >= STOP_NOW:
            raise KeyboardInterrupt
        control.request_stop(now=control.stop_requested)

    def on_sigterm(_signum: int, _frame: Any) -> None:
        control.request_stop(now=True)
        raise Terminated

    previous = {sig: signal.signal(sig, handler)
                for sig, handler in ((signal.SIGINT, on_sigint), (signal.SIGTERM, on_sigterm))}
    try:
        yield control
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
