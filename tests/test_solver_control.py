"""Stop requests, progress, private temp folders and child processes of the solvers
(`planning/control.py`, `planning/solver_process.py`, `planning/solvers.py`), in-process.
The whole command under real signals is in tests/test_cli_interrupts.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from autotm_py import pipeline
from autotm_py.config import DEFAULT_SOLVER, DEFAULT_TIME_LIMIT_S, PlanConfig
from autotm_py.planning import formulation, solver_process, solvers
from autotm_py.planning.control import Progress, SolveControl, Terminated, handle_signals
from autotm_py.planning.solvers import CbcProgress, run_solver
from autotm_py.units import parse_ratio
from tests.fixtures.waiting import wait_for
from tests.graphs import costs_for, layered_net, small_training

REPO = Path(__file__).resolve().parents[1]
LINUX = sys.platform.startswith("linux")


@pytest.fixture()
def temp_root(tmp_path, monkeypatch):
    """The system temp folder, as the solvers see it, is an empty folder of this test."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def _config(**kw) -> PlanConfig:
    base = {"strategy": "sync", "device": "cpu", "gap": 0.01, "ratio": parse_ratio("1:3")}
    return PlanConfig(**{**base, **kw})


def test_defaults_are_highs_with_a_time_limit():
    config = PlanConfig()
    assert DEFAULT_SOLVER == "highs" and config.solver == "highs"
    assert config.time_limit_s == DEFAULT_TIME_LIMIT_S == 300.0


# ---- temp folders -----------------------------------------------------------------------------
def test_private_tempdir_goes_away_on_return_and_on_error(temp_root):
    with solver_process.private_tempdir() as folder:
        (folder / "model.mps").write_text("x")
        assert folder.parent == temp_root and folder.name.startswith(f"autotm-solve-{os.getpid()}-")
    with pytest.raises(KeyboardInterrupt), solver_process.private_tempdir() as folder:
        (folder / "model.sol").write_text("x")
        raise KeyboardInterrupt
    assert list(temp_root.iterdir()) == []


def test_folders_of_dead_owners_are_swept(temp_root):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan = temp_root / f"autotm-solve-{dead.pid}-abcd"
    orphan.mkdir()
    (orphan / "model.mps").write_bytes(b"x" * 1000)
    mine = temp_root / f"autotm-solve-{os.getpid()}-live"
    mine.mkdir()
    other = temp_root / "unrelated-folder"
    other.mkdir()
    with solver_process.private_tempdir():
        pass
    assert not orphan.exists() and mine.exists() and other.exists()


@pytest.mark.parametrize("solver", ["cbc", "highs"])
def test_a_solve_leaves_no_files(temp_root, solver):
    g = small_training(kib=256)
    machine = pipeline.machine_for(g, _config(), costs_for(g, "cpu"))
    f = formulation.build(machine, "sync", 15)
    out = run_solver(f.prob, solver, gap=0.0, time_limit=60)
    assert out.status == "optimal" and out.has_solution
    out = run_solver(f.prob, solver, gap=0.0, time_limit=60, warm_start=True)  # a .mst too
    assert out.status == "optimal"
    assert list(temp_root.iterdir()) == []


# ---- stop requests ----------------------------------------------------------------------------
def test_a_stop_before_the_search_returns_no_plan():
    g = small_training(kib=256)
    control = SolveControl()
    control.request_stop()
    res = pipeline.optimize(g, _config(), costs=costs_for(g, "cpu"), control=control,
                            baselines=True)
    assert res.status == "interrupted" and res.plan is None and not res.baselines
    assert "interrupted before any plan was found" in res.message


@pytest.mark.parametrize("solver", ["cbc", "highs"])
def test_a_stop_during_the_async_search_keeps_the_best_plan(temp_root, solver):
    """The first incumbent of the async model (its warm start, the sync plan) is reported;
    a stop then ends the search with a plan at least that good, marked as interrupted."""
    g = layered_net(10, width=4, kib=256)
    costs = costs_for(g, "cpu")
    seen = []

    def on_progress(p: Progress) -> None:
        seen.append(p)
        if p.strategy == "async" and p.stage == "solving" and p.incumbent is not None:
            control.request_stop()

    control = SolveControl(on_progress)
    res = pipeline.optimize(g, _config(strategy="async", gap=0.0, solver=solver), costs=costs,
                            control=control, baselines=True)
    assert res.status in ("interrupted", "optimal"), res.message
    assert res.plan is not None and not res.baselines
    first = next(p.incumbent for p in seen if p.strategy == "async" and p.incumbent)
    assert res.objective_s * 1e3 <= first * (1 + 1e-6)
    if res.status == "interrupted":
        assert res.stats.status == "interrupted" and not res.stats.hit_time_limit
        assert any(n.startswith("interrupted") for n in res.plan.header.notes)
    pipeline.simulate(g, res.plan, costs=costs)
    assert {"building", "solving"} <= {p.stage for p in seen}
    assert list(temp_root.iterdir()) == []


def test_an_immediate_stop_returns_the_earlier_plan():
    """Stop now during the async search: the solver is abandoned, the sync plan returned."""
    g = layered_net(10, width=4, kib=256)

    def on_progress(p: Progress) -> None:
        if p.strategy == "async" and p.stage == "solving":
            control.request_stop(now=True)

    control = SolveControl(on_progress)
    res = pipeline.optimize(g, _config(strategy="async", gap=0.0, solver="cbc"),
                            costs=costs_for(g, "cpu"), control=control)
    assert res.status == "interrupted" and res.plan is not None
    assert res.plan.header.strategy == "sync"  # what was found; the config asked for async
    assert any("this is the sync plan" in n for n in res.plan.header.notes)


def test_a_cbc_crash_at_its_time_limit_keeps_the_mip_start(temp_root, tmp_path, monkeypatch):
    """PuLP's CBC 2.10 sometimes dies of SIGSEGV right after stopping on its time limit, before
    it writes a solution. A fake CBC does that whenever it is given a MIP start: the first
    model of the chain is solved for real, each later one keeps its start (the earlier plan),
    marked time_limit; nothing is left behind."""
    real = solvers.cbc_path()
    fake = tmp_path / "cbc"
    fake.write_text("#!/bin/sh\n"
                    'case " $* " in *" -mips "*) echo "Cbc0010I After 0 nodes, 0 on tree, 1e+50 '
                    'best solution, best possible 12.5 (0.50 seconds)"\n'
                    '  echo "Cbc0020I Exiting on maximum time"; kill -SEGV $$;; esac\n'
                    f'exec {real} "$@"\n')
    fake.chmod(0o755)
    monkeypatch.setattr(solvers, "cbc_path", lambda: str(fake))
    g = layered_net(4, width=3, kib=256)
    costs = costs_for(g, "cpu")
    res = pipeline.optimize(g, _config(strategy="async", solver="cbc"), costs=costs)
    assert res.status == "time_limit" and res.plan is not None, res.message
    assert res.stats.hit_time_limit and res.plan.header.strategy == "async"
    static = pipeline.optimize(g, _config(strategy="static", solver="highs"), costs=costs)
    assert res.objective_s == pytest.approx(static.objective_s, rel=1e-6)  # the start kept
    pipeline.simulate(g, res.plan, costs=costs)
    assert list(temp_root.iterdir()) == []


def test_signals_map_to_stop_levels_and_are_restored():
    control = SolveControl()
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with handle_signals(control):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        assert control.stop_level == 1
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        assert control.stop_level == 2
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        with pytest.raises(Terminated):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


# ---- progress ---------------------------------------------------------------------------------
def test_cbc_log_lines_give_incumbent_and_bound():
    control = SolveControl()
    watch = CbcProgress(control)
    watch.line("Continuous objective value is 40.283 - 0.34 seconds")
    assert control.progress.bound == pytest.approx(40.283)
    watch.line("Cbc0012I Integer solution of 52.604767 found by Reduced search after 0 "
               "iterations and 0 nodes (1.90 seconds)")
    assert control.progress.incumbent == pytest.approx(52.604767)
    watch.line("Cbc0010I After 100 nodes, 59 on tree, 52.398808 best solution, best possible "
               "42.640729 (57.09 seconds)")
    p = control.progress
    assert (p.incumbent, p.bound) == pytest.approx((52.398808, 42.640729))
    assert p.gap == pytest.approx((52.398808 - 42.640729) / 52.398808)


def test_progress_describes_itself_in_one_line():
    p = Progress(stage="solving", strategy="async", solver="highs", incumbent=52.41,
                 bound=50.0, started=time.monotonic() - 12.2, time_limit_s=300.0)
    assert p.describe() == ("solving the async model (highs), objective 52.410 ms, gap 4.6%, "
                            "12 s, time limit 300 s")
    assert Progress(stage="verifying the plan", started=time.monotonic()).describe() == \
        "verifying the plan, 0 s"


# ---- child processes --------------------------------------------------------------------------
@pytest.mark.skipif(not LINUX, reason="PR_SET_PDEATHSIG is Linux only")
def test_the_solver_child_dies_with_its_parent_even_on_sigkill(tmp_path):
    """A parent killed outright (no Python cleanup at all) still takes its solver child
    along: the kernel sends the child SIGKILL (PR_SET_PDEATHSIG)."""
    script = textwrap.dedent(f"""
        import pathlib, sys
        sys.path.insert(0, {str(REPO)!r})
        from autotm_py.planning.solver_process import run_child
        run_child(["sleep", "120"], pathlib.Path({str(tmp_path)!r}))
    """)
    parent = subprocess.Popen([sys.executable, "-c", script])
    child = wait_for(lambda: _children_of(parent.pid), 20)
    assert child, "the solver child did not start"
    parent.kill()
    parent.wait()
    assert wait_for(lambda: not _alive(child[0]), 5), "the child outlived its parent"


def test_a_stopped_child_gets_sigint_and_a_dead_one_is_reported(tmp_path):
    """The child's handler only notes the signal; its main code says so and exits. (A print in
    the handler, which runs wherever the main code was, even inside the print of "ready",
    failed now and then: "reentrant call inside <_io.BufferedWriter name='<stdout>'>".) It then
    ignores SIGINT: `run_child` repeats it every second until the child is gone, and one that
    came after the interpreter's exit put back the default handler would kill it."""
    script = textwrap.dedent("""
        import signal, sys, time
        got = []
        signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
        print("ready", flush=True)
        deadline = time.monotonic() + 60
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print("got SIGINT" if got else "no SIGINT", flush=True)
        sys.exit(0 if got else 3)
    """)
    control = SolveControl()
    lines = []

    def on_line(text: str) -> None:
        lines.append(text)
        if text == "ready":
            control.request_stop()

    started = time.monotonic()
    out = solver_process.run_child([sys.executable, "-c", script], tmp_path, control=control,
                                   on_line=on_line)
    assert out.returncode == 0 and out.interrupted_by == "user" and "got SIGINT" in lines
    assert time.monotonic() - started < 30


def _children_of(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
