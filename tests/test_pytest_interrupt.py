"""One Ctrl-C stops a pytest run of the randomized tests (issue 47 item 6).

Hypothesis times its garbage collections with a `gc.callbacks` function. A signal that arrives
during a collection (allocation-heavy code, as the planner's model building, spends bursts of
time there) is handled by that callback, and a KeyboardInterrupt raised inside a gc callback is
printed as "Exception ignored" and lost: two Ctrl-C did not stop a run.
`tests.randomized.keep_ctrl_c` (run by tests/conftest.py) removes the callback.

The run here is a real pytest, in its own process group, given a terminal's SIGINT while its
randomized test collects garbage (tests/fixtures/ctrl_c_target.py); the test notes that the
KeyboardInterrupt reached it. Without the fix the SIGINT is lost every time: the plain run goes
on, and under xdist the controller stops but kills its worker after 10 s."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fixtures.ctrl_c_target import MARKER_ENV, RUN_FOR_S
from tests.fixtures.waiting import wait_for
from tests.randomized import is_hypothesis_callback

REPO = Path(__file__).resolve().parents[1]
TARGET = "tests/fixtures/ctrl_c_target.py"
START_S = 180.0  # pytest's start and collection, on a loaded machine (about 5 s when idle)
EXIT_S = 30.0  # from the SIGINT to its exit (about 1 s; 2-3 s with an xdist worker)
INTERRUPTED = int(pytest.ExitCode.INTERRUPTED)  # 2
# The run starts as from a terminal, SIGINT at its default and unblocked, whatever this worker's
# process has (a child inherits an ignored or blocked signal, and Python then installs no
# KeyboardInterrupt handler): the full suite's run failed here twice, 2026-12-04, its child
# still running 30 s after the SIGINT, while this file alone passed.
AS_FROM_A_TERMINAL = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                      "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
                      "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")


def test_a_randomized_test_leaves_no_hypothesis_gc_callback():
    @settings(max_examples=3, database=None)
    @given(st.integers())
    def check(n: int) -> None:
        assert isinstance(n, int)

    check()
    assert not [cb for cb in gc.callbacks if is_hypothesis_callback(cb)]


@pytest.mark.slow
@pytest.mark.skipif(os.name != "posix", reason="a process group and SIGINT: POSIX")
@pytest.mark.parametrize("workers", [[], ["-n", "1"]], ids=["in-process", "xdist"])
def test_one_ctrl_c_stops_a_randomized_pytest_run(tmp_path, workers):
    assert EXIT_S < RUN_FOR_S  # uninterrupted, the target would pass, later
    marker, log = tmp_path / "running", tmp_path / "pytest.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env[MARKER_ENV] = str(marker)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", AS_FROM_A_TERMINAL, "-m", "pytest", "-q", "-p",
             "no:cacheprovider", *workers, TARGET],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        started = wait_for(lambda: marker.exists() or proc.poll() is not None, START_S)
        assert started and proc.poll() is None, log.read_text()
        time.sleep(0.5)  # well into its allocating loop
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole group
        sent = time.monotonic()
        try:
            code = proc.wait(EXIT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {EXIT_S:.0f} s after one SIGINT (this process: SIGINT "
                        f"{signal.getsignal(signal.SIGINT)}, blocked "
                        f"{signal.pthread_sigmask(signal.SIG_BLOCK, [])}):\n{log.read_text()}")
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    assert code == INTERRUPTED, f"exit {code} after {took:.1f} s:\n{text}"
    assert marker.read_text() == "interrupted", f"the test never saw the KeyboardInterrupt:\n{text}"
    assert "Exception ignored" not in text, text
