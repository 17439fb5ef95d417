"""The MILP solvers behind one small interface: CBC (default, bundled with PuLP), HiGHS
(highspy), and Gurobi or CPLEX when PuLP finds them.

`run_solver` solves a built `pulp.LpProblem` with a relative gap and an optional time limit
and says how it ended: ``optimal`` (proven within the gap), ``time_limit`` (stopped by the
limit with a plan: the best found, marked as such), ``no_solution`` (stopped before finding
one) or ``infeasible``. It also reports the best bound and the final gap where the solver
tells them (CBC through its log, HiGHS through its info).

HiGHS is loaded in bulk (one `addCols`/`addRows` call with numpy arrays) instead of PuLP's
per-variable calls, which dominate the time on models with 10^5 variables.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pulp

from autotm_py.errors import ConfigError, SolverError

log = logging.getLogger(__name__)

SOLVERS = ("cbc", "highs", "gurobi", "cplex")


@dataclass(frozen=True)
class SolveOutcome:
    status: str  # optimal | time_limit | no_solution | infeasible
    objective: float | None  # objective units, from the solution's variable values
    bound: float | None
    gap: float | None
    seconds: float

    @property
    def has_solution(self) -> bool:
        return self.status in ("optimal", "time_limit")


def run_solver(prob: pulp.LpProblem, name: str, *, gap: float, time_limit: float | None,
               threads: int | None = None, warm_start: bool = False) -> SolveOutcome:
    """Solve `prob` in place (variable values are set on its variables). `warm_start`: the
    variables' current values are a feasible solution to start from (CBC and HiGHS)."""
    if name not in SOLVERS:
        raise ConfigError(f"--solver {name!r}: choose one of {', '.join(SOLVERS)}")
    started = time.perf_counter()
    if name == "cbc":
        status, bound, final_gap = _solve_cbc(prob, gap, time_limit, threads, warm_start)
    elif name == "highs":
        status, bound, final_gap = _solve_highs(prob, gap, time_limit, threads, warm_start)
    else:
        status, bound, final_gap = _solve_other(prob, name, gap, time_limit, threads)
    seconds = time.perf_counter() - started
    objective = pulp.value(prob.objective) if status in ("optimal", "time_limit") else None
    log.info("%s: %s in %.2f s, objective %s, gap %s", name, status, seconds, objective,
             final_gap)
    return SolveOutcome(status, objective, bound, final_gap, seconds)


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


def _solve_cbc(prob: pulp.LpProblem, gap: float, time_limit: float | None,
               threads: int | None, warm_start: bool) -> tuple[str, float | None, float | None]:
    with tempfile.TemporaryDirectory(prefix="autotm-cbc-") as tmp:
        log_path = Path(tmp) / "cbc.log"
        solver = pulp.COIN_CMD(path=cbc_path(), msg=False, gapRel=gap, timeLimit=time_limit,
                               threads=threads, logPath=str(log_path), keepFiles=False,
                               warmStart=warm_start, timeMode="elapsed")
        try:
            prob.solve(solver)
        except pulp.PulpSolverError as exc:
            raise SolverError(f"CBC failed: {exc}; try --solver highs") from None
        text = log_path.read_text(errors="replace") if log_path.exists() else ""
    return parse_cbc_log(text, prob.status, prob.sol_status)


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


class BulkHiGHS(pulp.HiGHS):  # type: ignore[misc]
    """PuLP's HiGHS interface with the model passed in bulk from numpy arrays, and a MIP start
    from the variables' current values when `warm_start`."""

    def __init__(self, *args: object, warm_start: bool = False, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.warm_start = warm_start

    def createAndConfigureSolver(self, lp: pulp.LpProblem) -> None:  # PuLP's method name
        with _quiet_stdout():
            super().createAndConfigureSolver(lp)

    def buildSolverModel(self, lp: pulp.LpProblem) -> None:  # PuLP's method name
        import highspy

        inf = highspy.kHighsInf
        variables = lp.variables()
        for i, v in enumerate(variables):
            v.index = i
        objective = lp.objective or {}
        lower = np.array([-inf if v.lowBound is None else v.lowBound for v in variables])
        upper = np.array([inf if v.upBound is None else v.upBound for v in variables])
        cost = np.array([objective.get(v, 0.0) for v in variables], dtype=float)
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
                 threads: int | None, warm_start: bool) -> tuple[str, float | None,
                                                              float | None]:
    import highspy

    solver = BulkHiGHS(msg=False, gapRel=gap, timeLimit=time_limit, threads=threads,
                       warm_start=warm_start, mip_feasibility_tolerance=HIGHS_INTEGRALITY_TOL)
    prob.solve(solver)
    h = prob.solverModel
    model_status = h.getModelStatus()
    info = h.getInfo()
    has = info.primal_solution_status == 2  # kSolutionStatusFeasible
    bound = info.mip_dual_bound + (prob.objective.constant if prob.objective else 0.0)
    if model_status == highspy.HighsModelStatus.kInfeasible:
        return "infeasible", None, None
    if model_status == highspy.HighsModelStatus.kOptimal and has:
        return "optimal", bound, max(info.mip_gap, 0.0)
    if has:
        return "time_limit", bound, info.mip_gap
    return "no_solution", bound, None


# ---- others ------------------------------------------------------------------------------
def _solve_other(prob: pulp.LpProblem, name: str, gap: float, time_limit: float | None,
                 threads: int | None) -> tuple[str, float | None, float | None]:
    cls = {"gurobi": pulp.GUROBI_CMD, "cplex": pulp.CPLEX_CMD}[name]
    solver = cls(msg=False, gapRel=gap, timeLimit=time_limit, threads=threads)
    if not solver.available():
        raise ConfigError(f"--solver {name}: not installed or not licensed here; use cbc or "
                          "highs")
    prob.solve(solver)
    if prob.status == pulp.LpStatusInfeasible:
        return "infeasible", None, None
    if prob.sol_status == pulp.LpSolutionOptimal:
        return "optimal", None, None
    if prob.sol_status == pulp.LpSolutionIntegerFeasible:
        return "time_limit", None, None
    return "no_solution", None, None
