"""`autotm optimize`'s solver options and the live status line, in-process on a synthetic
model (the loader is patched); real signals are in tests/test_cli_interrupts.py."""

from __future__ import annotations

import io
import json
import time

import pytest

from autotm_py.cli import main, status
from autotm_py.cli import optimize as optimize_cli
from autotm_py.planning.control import SolveControl


@pytest.mark.parametrize(("given", "limit"), [(None, 300.0), ("none", None), ("0", None),
                                              ("12.5", 12.5)])
def test_time_limit_defaults_to_300_s_and_none_or_0_lift_it(net, capsys, given, limit):
    args = ["optimize", "net", "--fast-mem", "900KiB", "--no-baselines", "--json",
            "--recompute", "off"]
    assert main(args + (["--time-limit", given] if given else [])) == 0
    solver = json.loads(capsys.readouterr().out)["solver"]
    assert solver["solver"] == "highs" and solver["time_limit_s"] == limit


def test_a_recomputing_search_keeps_its_own_limit_when_none_is_given(net, capsys):
    """The joint model may never prove its optimum: without a limit it keeps 180 s."""
    assert main(["optimize", "net", "--fast-mem", "900KiB", "--no-baselines", "--json",
                 "--time-limit", "none"]) == 0
    assert json.loads(capsys.readouterr().out)["solver"]["time_limit_s"] == 180.0


@pytest.mark.parametrize("bad", ["-1", "soon"])
def test_bad_time_limits_are_one_line_errors(net, capsys, bad):
    assert main(["optimize", "net", "--fast-mem", "900KiB", "--time-limit", bad]) == 2
    assert capsys.readouterr().err.startswith(f"error: --time-limit '{bad}'")


def test_interrupted_before_any_plan_exits_130_and_writes_nothing(net, tmp_path, capsys,
                                                                  monkeypatch):
    class StoppedAtOnce(SolveControl):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.request_stop()

    monkeypatch.setattr(optimize_cli, "SolveControl", StoppedAtOnce)
    plan = tmp_path / "plan.json"
    assert main(["optimize", "net", "--fast-mem", "900KiB", "-o", str(plan)]) == 130
    captured = capsys.readouterr()
    assert "interrupted before any plan was found" in captured.out
    assert "nothing written" in captured.err and not plan.exists()


def test_no_status_line_off_a_terminal_or_with_json(net, capsys):
    assert not status.wanted(as_json=True)
    assert not status.wanted(as_json=False)  # pytest's captured streams are not terminals
    assert main(["optimize", "net", "--fast-mem", "900KiB", "--no-baselines"]) == 0
    assert "autotm:" not in capsys.readouterr().err


def test_the_status_line_redraws_in_place_and_erases_itself(monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")
    control = SolveControl(time_limit_s=300.0)
    stream = io.StringIO()
    with status.StatusLine(control, True, stream=stream, every_s=0.01):
        control.report(stage="solving", strategy="async", solver="cbc", incumbent=52.4,
                       bound=50.0)
        time.sleep(0.1)
    text = stream.getvalue()
    assert "\rautotm: solving the async model (cbc), objective 52.400 ms, gap 4.6%" in text
    assert "Ctrl-C keeps the best plan" in text and text.endswith("\r\x1b[K")
    monkeypatch.setenv("COLUMNS", "60")  # narrow: the hint goes, the numbers stay
    narrow = status.StatusLine(control, True).text()
    assert len(narrow) <= 59 and "objective 52.400 ms" in narrow and "Ctrl-C" not in narrow
    quiet = io.StringIO()
    with status.StatusLine(control, False, stream=quiet):
        time.sleep(0.02)
    assert quiet.getvalue() == ""


def test_scratch_windows_without_an_arena_is_a_one_line_error(net, tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["optimize", "net", "--fast-mem", "900KiB", "--device", "cuda", "--no-arena",
                 "--scratch", "windows", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --scratch windows needs --arena") and err.count("\n") == 1
    assert not out.exists()


@pytest.mark.parametrize("flags, want", [([], "windows"), (["--scratch", "windows"], "windows"),
                                         (["--scratch", "region"], "region"),
                                         (["--no-placed"], "region")])
def test_optimize_records_where_the_scratch_lives_in_the_plan(net, tmp_path, capsys, flags,
                                                               want):
    # windows by default for arena plans run with the placed allocator, else the region
    out = tmp_path / "plan.json"
    assert main(["optimize", "net", "--fast-mem", "8MiB", "--device", "cuda", "--arena",
                 *flags, "--no-baselines", "--recompute", "off", "-o", str(out)]) == 0
    plan = json.loads(out.read_text())
    assert plan["header"]["run"]["scratch"] == want


def test_a_stopped_search_no_better_than_its_start_says_which_plan_it_returns():
    """A time-limited async search that returns the sync plan it started from says so (the
    plan carries the async name; issue 47: it was silent)."""
    from types import SimpleNamespace

    from autotm_py.config import PlanConfig
    from autotm_py.planning.solve import _Search
    from autotm_py.planning.solvers import SolveOutcome

    config = PlanConfig(strategy="async", recompute="on", ratio="1:3")
    search = _Search(machine=None, config=config, small=frozenset(), control=None, limit=20.0,
                     specs={}, outcome=None, start=("sync+recompute", 101.9))
    model = SimpleNamespace(name=config.plan_name)
    search._note_unimproved(model, SolveOutcome("time_limit", 101.9, None, None, 20.0))
    assert search.notes == [
        "async+recompute search reached its time limit without improving on the "
        "sync+recompute plan it started from: this plan is that one, under the async+recompute "
        "name; a longer --time-limit may find a faster one"]
    search.notes.clear()
    search._note_unimproved(model, SolveOutcome("time_limit", 95.0, None, None, 20.0))
    search._note_unimproved(model, SolveOutcome("optimal", 101.9, None, None, 20.0))
    assert search.notes == []
