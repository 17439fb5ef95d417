"""Two processes writing one profile cache file at once keep every entry (issue 17 item 2).

`profiling.cache.write_entries` re-reads the file under an exclusive lock (`fcntl.flock`),
merges, and replaces it atomically; without the lock one writer's read-merge-write would
overwrite the other's entries.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from autotm_py.profiling.cache import ProfileEntry, read_profile_file, write_entries
from autotm_py.profiling.fingerprint import Fingerprint

WRITES = 25
FINGERPRINT = Fingerprint("cpu", "Test CPU", "2.0", threads=2)


def _writer(path: str, name: str, start: multiprocessing.synchronize.Event) -> None:
    start.wait(30)
    for i in range(WRITES):
        entry = ProfileEntry(1e-3 * (i + 1), 1e-3, 2e-3, 5, op=name)
        write_entries(path, FINGERPRINT, {f"{name}-{i}": {"FF": entry}})


def test_two_concurrent_writers_keep_every_entry(tmp_path: Path) -> None:
    path = tmp_path / "cpu-test.json"
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    procs = [ctx.Process(target=_writer, args=(str(path), name, start)) for name in "ab"]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    entries = read_profile_file(path)[FINGERPRINT.id].entries
    assert set(entries) == {f"{name}-{i}" for name in "ab" for i in range(WRITES)}
    assert not list(tmp_path.glob(".*.tmp"))  # no temp file left beside the cache
