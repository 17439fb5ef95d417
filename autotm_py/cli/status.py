"""The live status line of long commands: one line on stderr, redrawn in place while a solve
runs (stage, the best plan's objective: the ILP's estimate that `optimize` prints on its
solver line, gap, elapsed seconds), erased when it ends.

Drawn only when both stdout and stderr are terminals and no `--json` was asked for, so logs,
pipes and machine-readable output never see it. A thread redraws it four times a second from
`SolveControl.progress`, so the elapsed time moves even while a model is being built.
"""

from __future__ import annotations

import shutil
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from autotm_py.planning import SolveControl

HINTS = {"solving": "Ctrl-C keeps the best plan", "stopping": "Ctrl-C again: stop now"}
# A step shorter than this draws no line (`busy`): a line only for work a user waits on
BUSY_DELAY_S = 1.0


@contextmanager
def busy(stage: str, as_json: bool, *, stream: TextIO | None = None) -> Iterator[SolveControl]:
    """``with busy("loading the model", as_json) as control:`` a status line with the stage
    (`control.report(stage=...)` changes it) and the seconds elapsed, for multi-second work
    that is no solve (inspect, simulate, report, run's setup); drawn after `BUSY_DELAY_S`."""
    control = SolveControl()
    control.report(stage=stage)
    with StatusLine(control, wanted(as_json), stream=stream, delay_s=BUSY_DELAY_S):
        yield control


def wanted(as_json: bool) -> bool:
    """Whether a status line belongs on this terminal."""
    return not as_json and sys.stdout.isatty() and sys.stderr.isatty()


class StatusLine:
    """``with StatusLine(control, enabled):`` draws ``control.progress`` until the block ends."""

    def __init__(self, control: SolveControl, enabled: bool, *, stream: TextIO | None = None,
                 every_s: float = 0.25, delay_s: float = 0.0) -> None:
        self.control, self.enabled, self.every_s = control, enabled, every_s
        self.delay_s = delay_s
        self.stream = stream or sys.stderr
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> StatusLine:
        if self.enabled:
            self._thread = threading.Thread(target=self._run, name="autotm-status", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._thread is None:
            return
        self._done.set()
        self._thread.join()
        self.stream.write("\r\x1b[K")
        self.stream.flush()

    def _run(self) -> None:
        if self._done.wait(self.delay_s):
            return
        while not self._done.is_set():
            self.stream.write("\r" + self.text() + "\x1b[K")
            self.stream.flush()
            self._done.wait(self.every_s)

    def text(self) -> str:
        """The line for the terminal's width; when it is narrow the Ctrl-C hint goes first,
        then whole parts from the end (the objective stays before the seconds)."""
        progress = self.control.progress
        line = f"autotm: {progress.describe()}"
        width = shutil.get_terminal_size((100, 20)).columns - 1
        hint = HINTS.get(progress.stage)
        if hint and len(line) + len(hint) + 3 <= width:
            line += f" ({hint})"
        if len(line) <= width:
            return line
        cut = line.rfind(", ", 0, width + 1)
        return line[:cut] if cut > 0 else line[:max(width - 3, 0)] + "..."
