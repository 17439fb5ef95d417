"""The unit of work of a sweep (`Task`), what a worker does with one (`run_task`), and how the
driver turns what comes back into whole rows (`Merger`).

Granularity. What a row shares with others decides it:

- Without ``execute`` a task is one cell (model, ratio, strategy, solver). Its cost is the ILP
  (seconds to minutes); loading the model and simulating the baselines of its ratio take a
  second or two (DenseNet-264 b32 training: 0.6 s to load and price, 1.6 s for the baselines)
  and are deterministic, so a worker that meets a second ratio or model just computes them:
  a worker keeps its last models loaded (`_runner`), and the rows equal the serial ones.
- With ``execute`` the shared work is GPU time and its results are measurements, so it is done
  once, as in a serial sweep: one task per (model, ratio) holds all the rows of that ratio
  (the ratio's baselines run once, on that task's GPU), and one task per model measures what
  is the same at every ratio (all-fast without a cap, torch.autograd). The driver adds the
  model's columns to its rows when both have come back, so the two kinds of task run at once
  on different GPUs.

A task returns partial rows, the plans it solved and where it ran; the driver alone writes.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from autotm_py.bench import env
from autotm_py.bench.cells import ModelRunner
from autotm_py.bench.ship import Inputs, PlanBox
from autotm_py.bench.spec import BenchSpec

log = logging.getLogger(__name__)

Cell = tuple[str, str, str, str]  # (model, ratio, strategy, solver)
MAX_ATTEMPTS = 3  # a task whose worker dies is run again, twice at most, on a fresh worker


def cpus_per_task(spec: BenchSpec) -> int:
    """CPUs a task asks for: the solver's threads (1 unless `BenchSpec.threads`)."""
    return spec.threads or 1


def uses_gpus(spec: BenchSpec) -> bool:
    """Whether a task runs on a GPU (then it takes one GPU, never shared)."""
    return spec.execute and spec.device == "cuda"


@dataclass(frozen=True)
class Task:
    """The rows (strategy, solver) of one model at one ratio; with `ratio` None, the model's
    own measurements (`ModelRunner.model_columns`)."""

    model: str
    ratio: str | None = None
    cells: tuple[tuple[str, str], ...] = ()
    sweep: str = ""  # the run of `run_bench` it belongs to: a worker's cache is per sweep

    @property
    def label(self) -> str:
        what = " ".join(f"{s} {v}" for s, v in self.cells) if self.ratio else "reference runs"
        return f"{self.model} {self.ratio or ''} {what}".replace("  ", " ")

    def row_cells(self) -> list[Cell]:
        return [(self.model, self.ratio, s, v) for s, v in self.cells] if self.ratio else []


def split(spec: BenchSpec, todo: Iterable[Cell], sweep: str = "") -> list[Task]:
    """The tasks of the cells to run (module docstring: granularity)."""
    todo = list(todo)
    if not spec.execute:
        return [Task(m, r, ((s, v),), sweep) for m, r, s, v in todo]
    groups: dict[tuple[str, str], list[tuple[str, str]]] = defaultdict(list)
    for m, r, s, v in todo:
        groups[m, r].append((s, v))
    tasks: list[Task] = []
    for model in dict.fromkeys(m for m, *_ in todo):
        tasks.append(Task(model, sweep=sweep))  # first: it holds every row of the model back
        tasks.extend(Task(m, r, tuple(c), sweep) for (m, r), c in groups.items() if m == model)
    return tasks


@dataclass
class TaskResult:
    rows: list[dict[str, Any]] = field(default_factory=list)
    model_columns: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # the model's measurements that failed
    plans: dict[str, bytes] = field(default_factory=dict)  # solved, by file name
    made_on: dict[str, Any] = field(default_factory=dict)  # env.environment of the worker


@dataclass(frozen=True)
class Failure:
    """A task that could not finish: its worker died on every attempt (or the engine lost it)."""

    message: str


TaskFn = Callable[[BenchSpec, Task, Inputs, PlanBox], TaskResult]


def plan_names(spec: BenchSpec, task: Task) -> list[str]:
    """The plan files a task may read: each of its cells at each headroom it may try."""
    names = []
    for cell in task.row_cells():
        for headroom in spec.headrooms():
            path = spec.plan_path(*cell, headroom)
            if path is not None:
                names.append(path.name)
    return names


# A worker keeps the models it loaded last in a sweep: a sweep's tasks come model by model.
_RUNNERS: OrderedDict[tuple[str, ...], ModelRunner] = OrderedDict()
_KEEP = 2


def forget() -> None:
    """Drop the models this process keeps (the end of a sweep run in this process)."""
    _RUNNERS.clear()


def _runner(spec: BenchSpec, task: Task, inputs: Inputs) -> ModelRunner:
    model = task.model
    key = (task.sweep, json.dumps(spec.__dict__, sort_keys=True, default=str), model,
           inputs.digest)
    if key not in _RUNNERS:
        worker_spec, sources, shipped_dir = inputs.resolve(spec)
        _RUNNERS[key] = ModelRunner(worker_spec, model, source=sources.get(model),
                                    shipped_dir=shipped_dir, names=spec)
        while len(_RUNNERS) > _KEEP:
            _RUNNERS.popitem(last=False)
    _RUNNERS.move_to_end(key)
    return _RUNNERS[key]


def run_task(spec: BenchSpec, task: Task, inputs: Inputs, plans: PlanBox) -> TaskResult:
    """What a worker does with a task (in the driver's process for a serial sweep)."""
    runner = _runner(spec, task, inputs)
    runner.plans = plans
    plans.solved = {}
    made_on = {**inputs.made_on, "date": env.now()} if inputs.made_on else \
        env.environment(spec.device)
    result = TaskResult(made_on=made_on)
    if task.ratio is None:
        result.model_columns, result.notes = runner.model_columns()
    else:
        for _, ratio, strategy, solver in task.row_cells():
            result.rows.append(runner.row(ratio, strategy, solver))
    result.plans = dict(plans.solved)
    return result


def guarded(task_fn: TaskFn, spec: BenchSpec, task: Task, inputs: Inputs,
            plans: PlanBox) -> TaskResult | Failure:
    """`task_fn` with an unexpected exception turned into a `Failure` (rows with the error,
    retried by the next sweep) instead of the end of the sweep; the traceback is logged."""
    try:
        return task_fn(spec, task, inputs, plans)
    except Exception as exc:
        log.exception("bench: %s failed", task.label)
        text = str(exc).splitlines()[0] if str(exc) else ""
        return Failure(f"{type(exc).__name__}: {text}".rstrip(": "))


class Merger:
    """The driver's side: partial rows and the model's columns in, whole rows out."""

    def __init__(self, spec: BenchSpec) -> None:
        self.spec = spec
        self._model: dict[str, tuple[dict[str, Any], list[str]]] = {}
        self._waiting: dict[str, list[dict[str, Any]]] = defaultdict(list)

    def add(self, task: Task, outcome: TaskResult | Failure) -> list[dict[str, Any]]:
        """The rows that are whole now."""
        if task.ratio is None:
            if isinstance(outcome, Failure):
                self._model[task.model] = ({}, [f"measuring {task.model} itself failed: "
                                                f"{outcome.message}"])
            else:
                self._model[task.model] = (outcome.model_columns, outcome.notes)
            return [self._whole(r) for r in self._waiting.pop(task.model, [])]
        if isinstance(outcome, Failure):
            return [{**self.spec.key_values(*cell), "status": "error",
                     "error": outcome.message} for cell in task.row_cells()]
        out = []
        for cell, row in zip(task.row_cells(), outcome.rows, strict=True):
            # the key as the driver names it (a worker reads copies of its files)
            row = {**row, **self.spec.key_values(*cell), **outcome.made_on}
            if row.get("error") or not self.spec.execute or task.model in self._model:
                out.append(self._whole(row))
            else:
                self._waiting[task.model].append(row)
        return out

    def _whole(self, row: dict[str, Any]) -> dict[str, Any]:
        if row.get("error") or not self.spec.execute:
            return row
        columns, notes = self._model[row["model"]]
        made_on = {k: row.pop(k) for k in ("machine", "device_name", "versions", "date")
                   if k in row}
        notes = ([row["notes"]] if row.get("notes") else []) + notes
        return {**row, **columns, "notes": "; ".join(notes) or None, **made_on}

    @property
    def pending(self) -> int:
        return sum(len(rows) for rows in self._waiting.values())

