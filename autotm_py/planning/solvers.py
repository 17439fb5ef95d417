"""The MILP solvers behind one small interface: HiGHS (default, highspy, in-process), CBC
(PuLP's bundled executable, a child process), and Gurobi or CPLEX when PuLP finds them.

`run_solver` solves a built `pulp.LpProblem` with a relative gap and an optional time limit
and says how it ended: ``optimal`` (proven within the gap), ``time_limit`` (stopped by the
limit with a plan: the best found, marked as such), ``interrupted`` (stopped on request, see
`control.SolveControl`, with or without a plan), ``no_solution`` (stopped before finding one)
or ``infeasible``. It also reports the best bound and the final gap where the solver tells them
(CBC through its log, HiGHS through its info), and, while it runs, the incumbent and bound
through the `SolveControl` it is given (CBC: its log lines as printed; HiGHS: its callbacks).

Every solver writes its files into a private folder that is removed however the solve ends,
and CBC runs as a child that dies with this process (`solver_process`).

HiGHS is loaded in bulk (one `addCols`/`addRows` call with numpy arrays) instead of PuLP's
per-variable calls, which dominate the time on models with 10^5 variables.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pulp

from autotm_py.errors import ConfigError, MissingDependencyError, SolverError
from autotm_py.planning.control import STOP_NOW, SolveControl
from autotm_py.planning.solver_process import private_tempdir, run_child

log = logging.getLogger(__name__)

SOLVERS = ("highs", "cbc", "gurobi", "cplex")
# CBC checks its -sec limit only once its search has started; past the limit plus this grace
# it gets a SIGINT (it then writes its best solution), so that no solve hangs on.
CBC_DEADLINE_GRACE_S = 10.0


@dataclass(frozen=True)
class SolveOutcome:
    status: str  # optimal | time_limit | interrupted | no_solution | infeasible
    objective: float | None  # objective units, from the solution's variable values
    bound: float | None
    gap: float | None
    seconds: float
    has_values: bool = True  # False: no solution (infeasible, none found, stopped before one)

    @property
    def has_solution(self) -> bool:
        return self.has_values and self.status in ("optimal", "time_limit", "interrupted")


def run_solver(prob: pulp.LpProblem, name: str, *, gap: float, time_limit: float | None,
               threads: int | None = None, warm_start: bool = False,
               control: SolveControl | None = None) -> SolveOutcome:
    """Solve `prob` in place (variable values are set on its variables). `warm_start`: the
    variables' current values are a feasible solution to start from (CBC and HiGHS).
    `control`: where progress goes and stop requests come from."""
    if name not in SOLVERS:
        raise ConfigError(f"--solver {name!r}: choose one of {', '.join(SOLVERS)}")
    control = control or SolveControl()
    started = time.perf_counter()
    if name == "cbc":
        ended = _solve_cbc(prob, gap, time_limit, threads, warm_start, control)
    elif name == "highs":
        ended = _solve_highs(prob, gap, time_limit, threads, warm_start, control)
    else:
        ended = _solve_other(prob, name, gap, time_limit, threads)
    seconds = time.perf_counter() - started
    objective = pulp.value(prob.objective) if ended.has_values else None
    log.info("%s: %s in %.2f s, objective %s, gap %s", name, ended.status, seconds, objective,
             ended.gap)
    return SolveOutcome(ended.status, objective, ended.bound, ended.gap, seconds,
                        ended.has_values)


@dataclass(frozen=True)
class _Ended:
    """How one solver run ended (`run_solver` adds the objective and the seconds)."""

    status: str
    bound: float | None = None
    gap: float | None = None
    solution: bool | None = None  # None: as the status says

    @property
    def has_values(self) -> bool:
        if self.solution is not None:
            return self.solution
        return self.status in ("optimal", "time_limit", "interrupted")


# ---- CBC ---------------------------------------------------------------------------------
def cbc_path() -> str:
    """A CBC executable: `cbc` on PATH, else the one bundled with PuLP."""
    found = shutil.which("cbc")
    if found:
        return found
    from pulp.apis import coin_api

    path = os.path.normpath(coin_api.pulp_cbc_path)
    if not os.path.exists(path):
        raise SolverError("no CBC executable: install CBC (`pip install pulp` bundles one) or "
                          "use --solver highs")
    return path


class WatchedCBC(pulp.COIN_CMD):  # type: ignore[misc]
    """PuLP's CBC interface with the executable run by `solver_process.run_child`: in a
    private folder, in its own session, dying with us, its log read line by line as it is
    printed (progress for `control`), stopped by SIGINT on request or past the deadline."""

    def __init__(self, *args: Any, control: SolveControl, folder: Path, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.control, self.folder = control, folder
        self.log_text = ""
        self.interrupted_by: str | None = None
        self.crashed_at_limit = False

    def solve_CBC(self, lp: pulp.LpProblem, use_mps: bool = True) -> int:  # PuLP's name
        files = {ext: str(self.folder / f"model.{ext}") for ext in ("mps", "mst", "sol")}
        vs, var_names, con_names, _ = lp.writeMPS(files["mps"], rename=1)
        args = [self.path, files["mps"]] + (["-max"] if lp.sense == pulp.LpMaximize else [])
        if self.optionsDict.get("warmStart"):
            self.writesol(files["mst"], lp, vs, var_names, con_names)
            args += ["-mips", files["mst"]]
        if self.timeLimit is not None:
            args += ["-sec", str(self.timeLimit)]
        args += [a for option in self.getOptions() for a in f"-{option}".split()]
        args += ["-solve", "-printingOptions", "all", "-solution", files["sol"]]
        deadline = None if self.timeLimit is None else \
            time.monotonic() + self.timeLimit + CBC_DEADLINE_GRACE_S
        started = time.monotonic()
        child = run_child(args, self.folder, control=self.control,
                          on_line=CbcProgress(self.control).line, deadline=deadline)
        self.log_text, self.interrupted_by = child.output, child.interrupted_by
        if child.returncode is None or not os.path.exists(files["sol"]):
            self.crashed_at_limit = self._crashed_at_limit(child.returncode, child.output,
                                                           time.monotonic() - started)
            if child.interrupted_by or self.crashed_at_limit:
                lp.assignStatus(pulp.LpStatusNotSolved, pulp.LpSolutionNoSolutionFound)
                return pulp.LpStatusNotSolved
            tail = " / ".join(child.output.strip().splitlines()[-3:])
            raise SolverError(f"CBC failed (exit code {child.returncode}): {tail}; try "
                              "--solver highs")
        status, values, _, _, _, sol_status = self.readsol_MPS(files["sol"], lp, vs,
                                                               var_names, con_names)
        lp.assignVarsVals(values)
        lp.assignStatus(status, sol_status)
        return status


    def _crashed_at_limit(self, returncode: int | None, output: str, seconds: float) -> bool:
        """CBC 2.10 (PuLP's bundled build) sometimes dies of a segmentation fault right after
        it stops on its time limit, mostly when the limit ends the search at the root with a
        MIP start, before it writes its solution."""
        if returncode is None or returncode >= 0 or self.timeLimit is None:
            return False
        return "Exiting on maximum time" in output or seconds >= self.timeLimit


class CbcProgress:
    """Incumbent and bound from CBC's log lines, as CBC prints them."""

    INCUMBENT = re.compile(r"(?:Integer solution of|solution with cost|best objective) "
                           r"(-?[\d.eE+-]+)")
    NODES = re.compile(r"(-?[\d.eE+-]+) best solution, best possible (-?[\d.eE+-]+)")
    BOUND = re.compile(r"(?:Continuous objective value is|changed objective from \S+ to) "
                       r"(-?[\d.eE+-]+)")

    def __init__(self, control: SolveControl) -> None:
        self.control = control

    def line(self, text: str) -> None:
        log.debug("cbc: %s", text)
        if m := self.NODES.search(text):
            self._report(incumbent=m.group(1), bound=m.group(2))
        elif m := self.INCUMBENT.search(text):
            self._report(incumbent=m.group(1))
        elif m := self.BOUND.search(text):
            self._report(bound=m.group(1))

    def _report(self, **values: str) -> None:
        with contextlib.suppress(ValueError):
            self.control.report(**{k: float(v) for k, v in values.items()})


def _solve_cbc(prob: pulp.LpProblem, gap: float, time_limit: float | None,
               threads: int | None, warm_start: bool, control: SolveControl) -> _Ended:
    with private_tempdir() as folder:
        solver = WatchedCBC(path=cbc_path(), msg=False, gapRel=gap, timeLimit=time_limit,
                            threads=threads, warmStart=warm_start, timeMode="elapsed",
                            control=control, folder=folder)
        solver.tmpDir = str(folder)
        try:
            prob.solve(solver)
        except pulp.PulpSolverError as exc:
            raise SolverError(f"CBC failed: {exc}; try --solver highs") from None
    if solver.crashed_at_limit:
        # The variables still hold the MIP start (CBC's solution was never read): with a warm
        # start that is a feasible plan, the best one known, as the search started from it.
        bounds = re.findall(r"best possible (-?[\d.eE+-]+)", solver.log_text)
        bound = float(bounds[-1]) if bounds else None
        log.warning("CBC crashed after stopping on its time limit; %s", "keeping its MIP start"
                    if warm_start else "no plan from it")
        if warm_start:
            start = pulp.value(prob.objective)
            gap = None if bound is None or not start else max(start - bound, 0.0) / abs(start)
            return _Ended("time_limit", bound, gap, solution=True)
        return _Ended("no_solution", bound, solution=False)
    status, bound, final_gap = parse_cbc_log(solver.log_text, prob.status, prob.sol_status)
    if solver.interrupted_by == "user" and status in ("time_limit", "no_solution"):
        return _Ended("interrupted", bound, final_gap, solution=status == "time_limit")
    return _Ended(status, bound, final_gap)


def parse_cbc_log(text: str, status: int, sol_status: int) -> tuple[str, float | None,
                                                                      float | None]:
    """Status, best bound and gap from CBC's log (PuLP keeps only a coarse status)."""
    result = re.search(r"Result - (.+)", text)
    verdict = result.group(1).lower() if result else ""
    bound = _number(text, r"Lower bound:\s*(\S+)")
    gap = _number(text, r"Gap:\s*(\S+)")  # printed with two decimals: recompute it
    objective = _number(text, r"Objective value:\s*(\S+)")
    if objective is not None and bound is not None:
        gap = max(objective - bound, 0.0) / max(abs(objective), 1e-12)
    if "infeasible" in verdict or status == pulp.LpStatusInfeasible:
        return "infeasible", None, None
    has = sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    if "optimal" in verdict and has:
        return "optimal", bound, gap if gap is not None else 0.0
    if has:
        return "time_limit", bound, gap
    return "no_solution", bound, None


def _number(text: str, pattern: str) -> float | None:
    m = re.search(pattern, text)
    try:
        return float(m.group(1)) if m else None
    except ValueError:
        return None


# ---- HiGHS -------------------------------------------------------------------------------
@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    """Silence C-level stdout: highspy prints a banner when a solver object is created,
    which would corrupt `--json` output."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


class Abandoned(Exception):
    """An immediate stop while HiGHS was still running: its result is not waited for."""


def _run_highs(h: Any, done: threading.Event) -> None:
    """`h.run()` off the main thread, then the thread's HiGHS task scheduler shut down (its
    worker threads joined), as highspy's own `startSolve` does; `done` is set at the end."""
    try:
        h.run()
    finally:
        try:
            reset = getattr(h, "resetThreadScheduler", None)
            if reset is not None:
                reset(True)
        finally:
            done.set()


# HiGHS solves still running (abandoned by an immediate stop), and their end events: the
# interpreter must not exit under one (HiGHS's threads abort the process), so `atexit`
# interrupts them and waits.
_RUNNING_HIGHS: dict[int, tuple[BulkHiGHS, threading.Event]] = {}


@atexit.register
def _stop_running_highs() -> None:
    for solver, done in list(_RUNNING_HIGHS.values()):
        solver.abort = True
        _wait_uninterrupted(done, BulkHiGHS.JOIN_AFTER_STOP_S)


def _wait_uninterrupted(done: threading.Event, seconds: float) -> bool:
    """`done.wait(seconds)`, carrying on through further signal-handler exceptions (a second
    Ctrl-C while HiGHS winds down); True if `done` was set."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return done.wait(max(deadline - time.monotonic(), 0.0))
        except BaseException:  # a further signal: the first exception is on its way out
            if time.monotonic() >= deadline:
                return done.is_set()


# HiGHS gets the objective in microseconds (the formulation's milliseconds x 1000), and every
# objective value it reports is divided back. In milliseconds, the costs that tell two plans
# of a small model apart are 1e-4 to 1e-3 units, where HiGHS's presolve loses them: on a random
# 8-kernel DAG (static strategy, 2.147 ms per iteration; tests/test_planning_properties.py)
# it called a plan 0.65 us slower than first-touch, a point of its own space, optimal at gap
# 0, where CBC, HiGHS without presolve, or the objective scaled up all found first-touch's.
HIGHS_OBJECTIVE_SCALE = 1e3


def objective_constant(lp: pulp.LpProblem) -> float:
    """The objective's constant, which HiGHS never sees (it is added to what HiGHS reports)."""
    return lp.objective.constant if lp.objective else 0.0


def _from_highs(value: float, constant: float) -> float:
    """An objective value HiGHS reports, in the formulation's units (milliseconds)."""
    return value / HIGHS_OBJECTIVE_SCALE + constant


class BulkHiGHS(pulp.HiGHS):  # type: ignore[misc]
    """PuLP's HiGHS interface with the model passed in bulk from numpy arrays, a MIP start
    from the variables' current values when `warm_start`, and the solve run in a thread while
    this one watches `control`: HiGHS reports incumbents and bounds through its callbacks and
    is interrupted from them on a stop request, or on any exception here (KeyboardInterrupt,
    `Terminated`)."""

    JOIN_AFTER_STOP_S = 5.0  # how long an exception waits for HiGHS to honour the interrupt

    def __init__(self, *args: object, warm_start: bool = False,
                 control: SolveControl | None = None, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.warm_start = warm_start
        self.control = control or SolveControl()
        self.abort = False

    def createAndConfigureSolver(self, lp: pulp.LpProblem) -> None:  # PuLP's method name
        with _quiet_stdout():
            super().createAndConfigureSolver(lp)

    def callSolver(self, lp: pulp.LpProblem) -> None:  # PuLP's method name
        self._subscribe(lp.solverModel, objective_constant(lp))
        self.run_watched(lp.solverModel)

    def load(self, lp: pulp.LpProblem) -> Any:
        """HiGHS's model of `lp`, made once and subscribed to `control`, for repeated solves
        with `run_watched` (`local_search`: only column bounds change between them)."""
        with _quiet_stdout():
            self.createAndConfigureSolver(lp)
        self.buildSolverModel(lp)
        self._subscribe(lp.solverModel, objective_constant(lp))
        return lp.solverModel

    def run_watched(self, h: Any) -> None:
        """`h.run()` in a thread while this one watches `control`; `Abandoned` on an
        immediate stop."""
        # Waited for on an Event, not with Thread.join: a signal handler that raises inside
        # join (Ctrl-C, SIGTERM) leaves CPython 3.11 believing the thread has ended while
        # HiGHS still runs, and an interpreter that exits under a running HiGHS aborts.
        done = threading.Event()
        worker = threading.Thread(target=_run_highs, args=(h, done), name="highs",
                                  daemon=True)
        _RUNNING_HIGHS[id(self)] = (self, done)
        worker.start()
        try:
            while not done.wait(0.2):
                if self.control.stop_level >= STOP_NOW:
                    raise Abandoned
        except BaseException:
            self.abort = True  # the callbacks interrupt HiGHS at their next call
            if not _wait_uninterrupted(done, self.JOIN_AFTER_STOP_S):
                log.warning("HiGHS did not stop within %.0f s of the interrupt",
                            self.JOIN_AFTER_STOP_S)
            raise
        finally:
            if done.is_set():
                _RUNNING_HIGHS.pop(id(self), None)

    def _subscribe(self, h: Any, constant: float) -> None:
        if not hasattr(h, "cbMipInterrupt"):  # a highspy without its Python callback API
            log.info("this highspy has no callback API: no HiGHS progress, and a stop "
                     "request abandons the solve instead of interrupting it")
            return
        control = self.control

        def improving(event: Any) -> None:
            control.report(incumbent=_from_highs(event.data_out.objective_function_value,
                                                 constant))

        def interrupt(event: Any) -> None:
            out = event.data_out
            if np.isfinite(out.mip_dual_bound):
                control.report(bound=_from_highs(out.mip_dual_bound, constant))
            if self.abort or control.stop_requested:
                event.interrupt()

        h.cbMipImprovingSolution.subscribe(improving)
        for callback in (h.cbMipInterrupt, h.cbSimplexInterrupt, h.cbIpmInterrupt):
            callback.subscribe(interrupt)

    def buildSolverModel(self, lp: pulp.LpProblem) -> None:  # PuLP's method name
        import highspy

        inf = highspy.kHighsInf
        variables = lp.variables()
        for i, v in enumerate(variables):
            v.index = i
        objective = lp.objective or {}
        lower = np.array([-inf if v.lowBound is None else v.lowBound for v in variables])
        upper = np.array([inf if v.upBound is None else v.upBound for v in variables])
        cost = np.array([objective.get(v, 0.0) for v in variables], dtype=float) * \
            HIGHS_OBJECTIVE_SCALE
        h = lp.solverModel
        h.addCols(len(variables), cost, lower, upper, 0, np.zeros(0, np.int32),
                  np.zeros(0, np.int32), np.zeros(0))
        ints = np.array([i for i, v in enumerate(variables) if v.cat == pulp.LpInteger],
                        dtype=np.int32)
        if len(ints) and self.mip:
            h.changeColsIntegrality(len(ints), ints,
                                    np.full(len(ints), highspy.HighsVarType.kInteger))
        self._add_rows(lp, h, inf)
        if self.warm_start:
            start = highspy.HighsSolution()
            start.col_value = [v.varValue or 0.0 for v in variables]
            start.value_valid = True
            h.setSolution(start)
    @staticmethod
    def _add_rows(lp: pulp.LpProblem, h: object, inf: float) -> None:
        constraints = list(lp._constraints.values())
        starts, index, value, lows, ups = [], [], [], [], []
        for i, c in enumerate(constraints):
            c.index = i
            starts.append(len(index))
            for v, coef in c.items():
                index.append(v.index)
                value.append(coef)
            lb, ub = c.getLb(), c.getUb()
            lows.append(-inf if lb is None else lb)
            ups.append(inf if ub is None else ub)
        h.addRows(len(constraints), np.array(lows), np.array(ups), len(index),  # type: ignore[attr-defined]
                  np.array(starts, dtype=np.int32), np.array(index, dtype=np.int32),
                  np.array(value, dtype=float))


# HiGHS accepts a binary within `mip_feasibility_tolerance` of 0 or 1 (default 1e-6), and
# decoding rounds it: 0.9999994 of VGG19's 784 MiB classifier weight is 512 bytes the ILP did
# not count, a plan over its budget (tests/test_planning_large.py found it at a budget 1 byte
# under the peak). Sizes are multiples of 512 bytes, so at 1e-9 the rounding stays below one
# alignment unit for any footprint up to hundreds of GB.
HIGHS_INTEGRALITY_TOL = 1e-9


def _solve_highs(prob: pulp.LpProblem, gap: float, time_limit: float | None,
                 threads: int | None, warm_start: bool, control: SolveControl) -> _Ended:
    started = time.perf_counter()
    ended = _solve_highs_once(prob, gap, time_limit, threads, warm_start, control)
    if not (warm_start and ended.has_values and _returned_another_solution(prob)):
        return ended
    # HiGHS 1.16, given a MIP start, now and then reports a better incumbent (its objective
    # and bound) but hands back the start's values unchanged: a random 11-kernel training
    # graph's async+recompute plan came back 0.19% worse than the move-only plan it contains
    # (tests/test_planning.py). The solve is repeated without the start; should that find
    # nothing in the time left, the start (a feasible plan) stays, not proven optimal.
    start = [v.varValue for v in prob.variables()]
    log.info("HiGHS returned its MIP start instead of the better solution it reported: "
             "solving again without the start")
    left = None if time_limit is None else \
        max(time_limit - (time.perf_counter() - started), 1.0)
    again = _solve_highs_once(prob, gap, left, threads, False, control)
    if again.has_values:
        return again
    for v, value in zip(prob.variables(), start, strict=True):
        v.varValue = value
    return replace(ended, status="interrupted" if control.stop_requested else "time_limit")


def _returned_another_solution(prob: pulp.LpProblem) -> bool:
    """Whether the values HiGHS returned (now on the variables) are not the solution whose
    objective it reports."""
    reported = _from_highs(prob.solverModel.getInfo().objective_function_value,
                           objective_constant(prob))
    returned = pulp.value(prob.objective)
    return abs(returned - reported) > 1e-9 * max(1.0, abs(reported))


def _solve_highs_once(prob: pulp.LpProblem, gap: float, time_limit: float | None,
                      threads: int | None, warm_start: bool, control: SolveControl) -> _Ended:
    try:
        import highspy
    except ModuleNotFoundError:
        raise MissingDependencyError("highspy", "--solver highs") from None

    solver = BulkHiGHS(msg=False, gapRel=gap, timeLimit=time_limit, threads=threads,
                       warm_start=warm_start, control=control,
                       mip_feasibility_tolerance=HIGHS_INTEGRALITY_TOL)
    try:
        prob.solve(solver)
    except Abandoned:
        return _Ended("interrupted", solution=False)
    h = prob.solverModel
    model_status = h.getModelStatus()
    info = h.getInfo()
    has = info.primal_solution_status == 2  # kSolutionStatusFeasible
    bound = _finite(_from_highs(info.mip_dual_bound, objective_constant(prob)))
    final_gap = _finite(max(info.mip_gap, 0.0))  # inf when stopped before any bound
    if model_status == highspy.HighsModelStatus.kInfeasible:
        return _Ended("infeasible")
    if model_status == highspy.HighsModelStatus.kOptimal and has:
        return _Ended("optimal", bound, final_gap)
    stopped = "interrupted" if model_status == highspy.HighsModelStatus.kInterrupt else \
        "time_limit"
    if has:
        return _Ended(stopped, bound, final_gap)
    return _Ended("interrupted" if stopped == "interrupted" else "no_solution", bound,
                  solution=False)


def _finite(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


# ---- others ------------------------------------------------------------------------------
def _solve_other(prob: pulp.LpProblem, name: str, gap: float, time_limit: float | None,
                 threads: int | None) -> _Ended:
    """Gurobi or CPLEX through PuLP's command interfaces: their files go to a private folder
    removed afterwards, but PuLP starts the executable, so it shares our process group and
    is not killed on SIGTERM (docs/planning.md)."""
    cls = {"gurobi": pulp.GUROBI_CMD, "cplex": pulp.CPLEX_CMD}[name]
    solver = cls(msg=False, gapRel=gap, timeLimit=time_limit, threads=threads)
    if not solver.available():
        raise ConfigError(f"--solver {name}: not installed or not licensed here; use highs or "
                          "cbc")
    with private_tempdir() as folder:
        solver.tmpDir = str(folder)
        prob.solve(solver)
    if prob.status == pulp.LpStatusInfeasible:
        return _Ended("infeasible")
    if prob.sol_status == pulp.LpSolutionOptimal:
        return _Ended("optimal")
    if prob.sol_status == pulp.LpSolutionIntegerFeasible:
        return _Ended("time_limit")
    return _Ended("no_solution")
