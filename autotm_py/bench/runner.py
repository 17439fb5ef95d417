"""`autotm bench`: sweeps of models x budgets x strategies x solvers, one row per plan.

Each row holds the plan's solver statistics, its predicted time (the simulator), the all-fast
reference and the baselines at the same budget, bytes moved each way, the share of kernel IO
bytes in fast memory, and, with ``execute=True`` (GPU), the measured times of the plan and of the
baselines. Rows are keyed by `ROW_KEY`; a sweep skips keys already in its output, so an
interrupted sweep resumes where it stopped. After every row the CSV and the JSON document (same
stem) are rewritten atomically.

The sweep uses the public API (`autotm_py.api`), so notebooks and scripts get what the CLI gets.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotm_py.bench import env
from autotm_py.bench.cells import ModelRunner
from autotm_py.bench.rows import key_of, output_paths, read_rows, write_results
from autotm_py.bench.spec import BenchSpec


@dataclass
class BenchResult:
    rows: list[dict[str, Any]]
    ran: int = 0
    skipped: int = 0
    failed: int = 0
    paths: tuple[Path, ...] = ()


Progress = Callable[[int, int, str], None]  # (done, total, label of the next cell)


def run_bench(spec: BenchSpec, output: str | os.PathLike[str], *,
              progress: Progress | None = None) -> BenchResult:
    """Run every cell of `spec` not already in `output` (CSV; a .json beside it)."""
    csv_path, json_path = output_paths(output)
    rows = read_rows(csv_path, json_path)
    done = {key_of(r) for r in rows if not r.get("error")}  # failed rows are retried
    todo = [c for c in spec.cells() if spec.row_key(*c) not in done]
    result = BenchResult(rows, skipped=sum(1 for _ in spec.cells()) - len(todo),
                         paths=(csv_path, json_path))
    made_on = env.environment(spec.device)
    runner: ModelRunner | None = None
    for i, (model, ratio, strategy, solver) in enumerate(todo):
        if progress:
            progress(i, len(todo), f"{model} {ratio} {strategy} {solver}")
        if runner is None or runner.model != model:
            runner = ModelRunner(spec, model)
        row = runner.row(ratio, strategy, solver)
        row.update(made_on)
        result.failed += bool(row.get("error"))
        rows[:] = [r for r in rows if key_of(r) != key_of(row)]
        rows.append(row)
        result.ran += 1
        write_results(rows, csv_path, json_path, spec)
    if progress:
        progress(len(todo), len(todo), "done")
    if not todo:
        write_results(rows, csv_path, json_path, spec)
    return result


