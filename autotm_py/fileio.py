"""Small file helpers shared by every writer (plans, profiles, results)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write to a temporary file beside `path`, then rename: readers never see half a file,
    and an interrupted write leaves the old file as it was."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        # mkstemp creates 0600 files; give the file the mode a plain open() would.
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    return atomic_write_bytes(path, text.encode())


def write_problem(path: str | os.PathLike[str], *, directory: bool = False) -> str | None:
    """Why `path` cannot be written (as a file, or as a folder to write into), or None.

    Checked before long work starts, so that a bad `-o` fails in a second, not after the solve:
    the nearest existing ancestor must be a folder in which a file can be created (tried, then
    removed), and an existing `path` must be a file (a folder with `directory`)."""
    target = Path(path)
    if target.exists():
        if target.is_dir() != directory:
            return "it is a folder" if not directory else "it is a file, not a folder"
        probe_dir = target if directory else target.parent
    else:
        probe_dir = target.parent
        while not probe_dir.exists() and probe_dir != probe_dir.parent:
            probe_dir = probe_dir.parent
        if not probe_dir.is_dir():
            return f"{probe_dir} is a file, not a folder"
    try:
        fd, tmp = tempfile.mkstemp(prefix=".autotm-probe.", dir=probe_dir)
    except OSError as exc:
        return f"cannot create files in {probe_dir or '.'}: {exc.strerror or exc}"
    os.close(fd)
    Path(tmp).unlink(missing_ok=True)
    return None
