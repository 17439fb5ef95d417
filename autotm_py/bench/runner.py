"""`autotm bench`: sweeps of models x budgets x strategies x solvers, one row per plan.

Each row holds the plan's solver statistics, its predicted time (the simulator), the all-fast
reference and the baselines at the same budget, bytes moved each way, the share of kernel IO
bytes in fast memory, and, with ``execute=True`` (GPU), the measured times of the plan and of the
baselines. Rows are keyed by `ROW_KEY`; a sweep skips keys already in its output, so an
interrupted sweep resumes where it stopped. After every row the CSV and the JSON document (same
stem) are rewritten atomically.

The sweep uses the public API (`autotm_py.api`), so notebooks and scripts get what the CLI gets.

Where cells run is the engine's business (`bench/engines.py`: this process, worker processes on
this machine, or a Ray cluster); this driver splits the cells into tasks (`bench/tasks.py`),
merges what comes back into rows and alone writes the files, a whole row at a time.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotm_py.bench.engines import open_engine
from autotm_py.bench.rows import key_of, output_paths, read_rows, write_results
from autotm_py.bench.ship import PlanBox
from autotm_py.bench.spec import BenchSpec
from autotm_py.bench.tasks import Merger, Task, TaskFn, plan_names, run_task, split


@dataclass
class BenchResult:
    rows: list[dict[str, Any]]
    ran: int = 0
    skipped: int = 0
    failed: int = 0
    paths: tuple[Path, ...] = ()


Progress = Callable[[int, int, str], None]  # (rows done, rows to do, what just finished)


def run_bench(spec: BenchSpec, output: str | os.PathLike[str], *,
              progress: Progress | None = None, engine: str = "local",
              workers: int | None = None, address: str | None = None,
              task_fn: TaskFn = run_task) -> BenchResult:
    """Run every cell of `spec` not already in `output` (CSV; a .json beside it).

    `engine` "local" (default) runs cells in `workers` processes on this machine (default:
    one per CPU, or one per GPU with ``execute`` on cuda; ``workers=1``: in this process);
    "ray" submits them to the Ray cluster at `address` (None: a Ray instance started here;
    "auto": the one `ray start` started). The rows are the same either way."""
    csv_path, json_path = output_paths(output)
    rows = read_rows(csv_path, json_path)
    done = {key_of(r) for r in rows if not r.get("error")}  # failed rows are retried
    todo = [c for c in spec.cells() if spec.row_key(*c) not in done]
    result = BenchResult(rows, skipped=sum(1 for _ in spec.cells()) - len(todo),
                         paths=(csv_path, json_path))
    if progress:
        progress(0, len(todo), "starting")
    if todo:
        tasks = split(spec, todo, sweep=uuid.uuid4().hex)
        runner = open_engine(engine, spec, len(tasks), workers=workers, address=address,
                             task_fn=task_fn)
        try:
            _drive(spec, runner.run(spec, tasks, lambda t: _plans_for(spec, t)), result,
                   len(todo), progress)
        finally:
            runner.close()
    if progress:
        progress(len(todo), len(todo), "done")
    if not todo:
        write_results(rows, csv_path, json_path, spec)
    return result


def _drive(spec: BenchSpec, outcomes: Any, result: BenchResult, total: int,
           progress: Progress | None) -> None:
    """Merge outcomes as they come; write the files after every whole row (atomically)."""
    merger = Merger(spec)
    csv_path, json_path = result.paths
    order = {spec.row_key(*c): i for i, c in enumerate(spec.cells())}
    for task, outcome in outcomes:
        PlanBox.save(getattr(outcome, "plans", {}), spec.plans_dir)  # before the rows
        for row in merger.add(task, outcome):
            result.failed += bool(row.get("error"))
            result.rows[:] = [r for r in result.rows if key_of(r) != key_of(row)]
            result.rows.append(row)
            result.rows[:] = _in_order(result.rows, order)
            result.ran += 1
            write_results(result.rows, csv_path, json_path, spec)
        if progress:
            progress(result.ran, total, task.label)


def _in_order(rows: list[dict[str, Any]], order: dict[tuple[str, ...], int]
              ) -> list[dict[str, Any]]:
    """The sweep's rows in the order of its cells, whatever order they finished in, where its
    first row stands; rows of other sweeps in the same file keep their places."""
    ours = sorted((r for r in rows if key_of(r) in order), key=lambda r: order[key_of(r)])
    first = next((i for i, r in enumerate(rows) if key_of(r) in order), len(rows))
    return rows[:first] + ours + [r for r in rows[first:] if key_of(r) not in order]


def _plans_for(spec: BenchSpec, task: Task) -> PlanBox:
    if spec.plans_dir is None:
        return PlanBox()
    return PlanBox.read([Path(spec.plans_dir) / name for name in plan_names(spec, task)])
