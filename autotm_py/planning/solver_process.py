"""Solver executables as children that never outlive us, in a private temp folder per solve.

Why this shape (docs/planning.md, "Interrupts, temp files and child processes"):

- **Own session.** The child starts in a new session (``setsid``), so a terminal's Ctrl-C
  reaches only us; we forward it (CBC answers SIGINT by stopping and writing its best
  solution) and kill the child's whole process group when we give up on it.
- **Dies with us.** On Linux the child asks the kernel for ``PR_SET_PDEATHSIG = SIGKILL``
  before it executes the solver: if this process dies in any way, SIGKILL included, the kernel
  kills the solver. Elsewhere (macOS, Windows) there is no such call; the child is still
  killed on every exit that runs Python code (return, exception, KeyboardInterrupt, the CLI's
  SIGTERM handler, `atexit`), but not when this process is killed outright.
- **Live output.** The child writes into a pseudo-terminal (POSIX), so its C library
  line-buffers and progress lines arrive as they are printed; into a file elsewhere.
- **Temp files.** `private_tempdir` makes ``autotm-solve-<pid>-XXXX`` under the system temp
  folder (``TMPDIR``) for the model, start and solution files, and removes it however the
  solve ends. A process killed outright cannot clean up, so each new solve first removes the
  folders whose owning process no longer runs.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from autotm_py.planning.control import STOP_NOW, SolveControl

PREFIX = "autotm-solve-"
POSIX = os.name == "posix"
LINUX = sys.platform.startswith("linux")
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
INTERRUPT_EVERY_S = 1.0  # a SIGINT that arrives before CBC's search starts is lost: repeat it

# Resolved here, not in the forked child (a dlopen there could deadlock on a loader lock).
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if LINUX else None
_LIVE: set[subprocess.Popen[bytes]] = set()
_LIVE_LOCK = threading.Lock()


@dataclass(frozen=True)
class ChildResult:
    returncode: int | None  # None: we killed it
    output: str  # everything it printed, newlines normalized
    interrupted_by: str | None  # None, "user" (a stop request) or "deadline"


# ---- temp folders ------------------------------------------------------------------------------
@contextlib.contextmanager
def private_tempdir() -> Iterator[Path]:
    """A fresh folder for one solve's files, removed when the block ends, however it ends."""
    base = Path(tempfile.gettempdir())
    sweep_orphans(base)
    path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def sweep_orphans(base: Path) -> list[Path]:
    """Remove this user's solve folders whose owning process is gone; returns them."""
    removed = []
    for entry in base.glob(f"{PREFIX}*"):
        owner = entry.name[len(PREFIX):].split("-", 1)[0]
        if not owner.isdigit() or _alive(int(owner)) or not _ours(entry):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid() or not POSIX:  # Windows' os.kill(pid, 0) would kill it
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: someone else's live process
        return True
    return True


def _ours(path: Path) -> bool:
    try:
        return not hasattr(os, "getuid") or path.stat().st_uid == os.getuid()
    except OSError:
        return False


# ---- the child ---------------------------------------------------------------------------------
def _die_with_parent(parent: int) -> None:  # runs in the child between fork and exec
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the call: nobody would kill us
        os._exit(1)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if POSIX:
            os.killpg(proc.pid, signal.SIGKILL)  # its whole process group (its own session)
        else:
            proc.kill()


def _interrupt(proc: subprocess.Popen[bytes]) -> None:
    if not POSIX:  # no SIGINT to deliver to another console process: stop it instead
        _kill(proc)
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGINT)


@atexit.register
def _kill_live_children() -> None:
    with _LIVE_LOCK:
        for proc in list(_LIVE):
            _kill(proc)


class _Output:
    """The child's stdout and stderr: a pseudo-terminal where there is one (line-buffered,
    so progress is live), else a file in the solve's folder."""

    def __init__(self, folder: Path) -> None:
        self.master: int | None = None
        self.reader: BinaryIO | None = None
        self.pending = b""
        if POSIX:
            with contextlib.suppress(OSError):
                self.master, self.child_fd = os.openpty()
        if self.master is None:  # the child appends to the file, we read it on our own handle
            self.child_fd = os.open(folder / "solver.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            self.reader = open(folder / "solver.log", "rb")  # noqa: SIM115 (closed in close())

    def started(self) -> None:
        os.close(self.child_fd)  # the child holds its copy (pty: EIO on read once it exits)

    def read(self, timeout: float) -> bytes:
        if self.reader is not None:
            time.sleep(timeout)
            return self.reader.read()
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return b""
        try:
            return os.read(self.master, 1 << 16)
        except OSError:  # EIO: the child closed its side
            return b""

    def close(self) -> None:
        if self.master is not None:
            os.close(self.master)
        if self.reader is not None:
            self.reader.close()


def run_child(args: Sequence[str], folder: Path, *, control: SolveControl | None = None,
              on_line: Callable[[str], None] | None = None,
              deadline: float | None = None) -> ChildResult:
    """Run a solver executable in `folder` until it exits, passing each output line to
    `on_line`. A stop request (or `deadline`, a `time.monotonic()` value) sends it SIGINT,
    repeated every second until it exits; an immediate stop, or any exception here
    (KeyboardInterrupt, `Terminated`), kills it."""
    out = _Output(folder)
    preexec = functools.partial(_die_with_parent, os.getpid()) if LINUX else None
    proc = subprocess.Popen(list(args), cwd=folder, stdin=subprocess.DEVNULL,
                            stdout=out.child_fd, stderr=out.child_fd, start_new_session=POSIX,
                            preexec_fn=preexec)
    with _LIVE_LOCK:
        _LIVE.add(proc)
    out.started()
    chunks: list[bytes] = []
    why, last_sigint, killed = None, 0.0, False
    try:
        while True:
            data = out.read(0.2)
            if data:
                chunks.append(data)
                _lines(out, data, on_line)
            if proc.poll() is not None:
                while data := out.read(0.0):  # what it wrote before exiting
                    chunks.append(data)
                    _lines(out, data, on_line)
                break
            level = control.stop_level if control is not None else 0
            if level >= STOP_NOW:
                why, killed = "user", True
                break
            now = time.monotonic()
            if level or (deadline is not None and now > deadline):
                why = why or ("user" if level else "deadline")
                if now - last_sigint >= INTERRUPT_EVERY_S:
                    _interrupt(proc)
                    last_sigint = now
    finally:
        if proc.poll() is None:
            _kill(proc)
            killed = True
        proc.wait()
        with _LIVE_LOCK:
            _LIVE.discard(proc)
        out.close()
    text = b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")
    return ChildResult(None if killed else proc.returncode, text, why)


def _lines(out: _Output, data: bytes, on_line: Callable[[str], None] | None) -> None:
    out.pending += data
    *complete, out.pending = out.pending.split(b"\n")
    if on_line is not None:
        for raw in complete:
            on_line(raw.decode(errors="replace").rstrip("\r"))
