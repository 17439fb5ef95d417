"""`autotm bench`: sweeps of models x budgets x strategies x solvers, one row per plan.

Each row holds the plan's solver statistics, its predicted time (the simulator), the all-fast
reference and the baselines at the same budget, bytes moved each way, the share of kernel IO
bytes in fast memory, and, with ``execute=True`` (GPU), the measured times of the plan and of the
baselines. Rows are keyed by `ROW_KEY`; a sweep skips keys already in its output, so an
interrupted sweep resumes where it stopped. After every row the CSV and the JSON document (same
stem) are rewritten atomically.

Only the public API is used (`autotm_py.api`), so notebooks and scripts get what the CLI gets.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotm_py.config import PlanConfig
from autotm_py.errors import ConfigError
from autotm_py.fileio import atomic_write_text
from autotm_py.memory.tiers import load_memory_system
from autotm_py.planning.solvers import SOLVERS
from autotm_py.report import bench_env
from autotm_py.units import parse_ratio

log = logging.getLogger(__name__)

BENCH_FORMAT, BENCH_VERSION = "autotm-bench", 1
ROW_KEY = ("model", "batch", "dims", "training", "device", "memory", "ratio", "strategy",
           "solver")
# baselines in the order of the columns; names as in `autotm_py.planning.baselines`
BASELINES = ("all_fast", "all_slow", "first_touch", "lru", "offload", "2lm")
FIT_STEP = 0.05
FIT_MAX = 0.25
COLUMNS = (
    *ROW_KEY, "mode", "budget_bytes", "peak_bytes", "max_working_set_bytes", "kernels",
    "status", "variables", "constraints", "build_s", "solve_s", "gap", "hit_time_limit",
    "predicted_s", "all_fast_s", "slowdown", "all_slow_s", "first_touch_s", "lru_s",
    "offload_s", "2lm_s", "oracle_s", "transfer_bound_s", "bytes_to_fast", "bytes_to_slow",
    "sync_bytes_to_fast",
    "sync_bytes_to_slow", "async_bytes_to_fast", "async_bytes_to_slow", "input_fast_fraction",
    "output_fast_fraction", "peak_fast_bytes", "estimated_kernels", "scaled_kernels",
    "measured_s",
    "measured_peak_fast_bytes", "measured_host_s", "measured_alloc_retries", "headroom",
    "measured_all_fast_s", "measured_all_slow_s",
    "measured_first_touch_s", "measured_lru_s", "measured_offload_s",
    "measured_all_fast_peak_bytes", "measured_all_slow_peak_bytes",
    "measured_first_touch_peak_bytes", "measured_lru_peak_bytes",
    "measured_offload_peak_bytes", "measured_torch_autograd_s",
    "measured_torch_autograd_peak_bytes", "measured_save_on_cpu_s",
    "measured_save_on_cpu_peak_bytes", "error", "notes",
    "machine", "device_name", "versions", "date",
)


@dataclass(frozen=True)
class BenchSpec:
    """What to sweep. Every (model, ratio, strategy, solver) makes one row."""

    models: tuple[str, ...]
    ratios: tuple[str, ...]
    strategies: tuple[str, ...] = ("static", "sync", "async")
    solvers: tuple[str, ...] = ("cbc",)
    device: str = "cpu"
    memory: str | None = None
    training: bool = False
    batch: int | None = None
    dims: Mapping[str, int] = field(default_factory=dict)
    time_limit_s: float | None = None
    gap: float = 0.01
    pin_weights: bool = False
    profiles_dir: str | None = None
    execute: bool = False  # run every plan for real (GPU) and record measured times
    iterations: int = 5
    warmup: int = 2
    # Where solved plans are kept: a cell whose plan is there is not solved again (plan on a
    # CPU machine, carry the folder, execute on the GPU machine).
    plans_dir: str | None = None
    headroom: float = 0.0  # share of each budget left free for fragmentation
    # AutoTM's defrag loop: re-plan with FIT_STEP more headroom (up to FIT_MAX) while a plan
    # runs out of memory under its cap or makes the allocator retry (when every headroom
    # retries, the fastest run is kept).
    fit: bool = False

    def __post_init__(self) -> None:
        if not self.models or not self.ratios:
            raise ConfigError("bench needs at least one model (--models) and one ratio "
                              "(--ratios), e.g. --models resnet50 --ratios 1:4")
        for r in self.ratios:
            parse_ratio(r, flag="--ratios")
        for s in self.strategies:  # validates strategy, device, gap, limit, headroom up front
            PlanConfig(strategy=s, device=self.device, gap=self.gap,
                       time_limit_s=self.time_limit_s, headroom=self.headroom)
        if self.fit and not self.execute:
            raise ConfigError("--fit needs --execute: it re-plans the plans that do not fit "
                              "when they run")
        bad = [s for s in self.solvers if s not in SOLVERS]
        if bad or not self.solvers:
            raise ConfigError(f"--solvers {','.join(self.solvers)}: unknown solver "
                              f"{bad[0] if bad else '(none)'}; choose from {', '.join(SOLVERS)}")
        load_memory_system(self.memory_name)  # a bad --memory fails before the sweep starts

    @property
    def memory_name(self) -> str:
        return PlanConfig(device=self.device, memory=self.memory).memory_name

    def key_values(self, model: str, ratio: str, strategy: str, solver: str) -> dict[str, Any]:
        """A row's key columns. Dims (e.g. "seq=512") are part of it: sweeps of one model at
        two sequence lengths into one output are two rows, and two plans in `plans_dir`."""
        return {"model": model, "batch": self.batch, "dims": self.dims_text,
                "training": self.training, "device": self.device, "memory": self.memory_name,
                "ratio": ratio, "strategy": strategy, "solver": solver}

    def row_key(self, model: str, ratio: str, strategy: str, solver: str) -> tuple[str, ...]:
        values = self.key_values(model, ratio, strategy, solver)
        return tuple(_cell(values[k]) for k in ROW_KEY)

    @property
    def dims_text(self) -> str | None:
        return ",".join(f"{k}={v}" for k, v in sorted(self.dims.items())) or None

    def plan_path(self, model: str, ratio: str, strategy: str, solver: str,
                  headroom: float = 0.0) -> Path | None:
        if self.plans_dir is None:
            return None
        key = self.row_key(model, ratio, strategy, solver)
        stem = "_".join(k.replace(":", "-").replace("/", "-").replace("=", "-").replace(",", "-")
                        for k in key if k)
        if headroom:
            stem += f"_h{headroom:.2f}"
        # compressed: a folder of plans for large models is carried to the GPU machine
        return Path(self.plans_dir) / f"{stem}.json.gz"

    def headrooms(self) -> tuple[float, ...]:
        """The headrooms a cell tries in turn: the given one, then (with `fit`) more."""
        if not self.fit:
            return (self.headroom,)
        steps = math.floor((FIT_MAX - self.headroom) / FIT_STEP + 1e-9)
        return tuple(round(self.headroom + i * FIT_STEP, 4) for i in range(max(steps, 0) + 1))

    def cells(self) -> Iterator[tuple[str, str, str, str]]:
        for model in self.models:
            for ratio in self.ratios:
                for strategy in self.strategies:
                    for solver in self.solvers:
                        yield model, ratio, strategy, solver


def _cell(value: Any) -> str:
    """How a value reads back from CSV: the key of a row compares these strings."""
    if value is None:
        return ""
    if isinstance(value, float) and math.isnan(value):
        return ""
    return str(value)


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
    from autotm_py.report.bench_cells import ModelRunner

    csv_path, json_path = output_paths(output)
    rows = read_rows(csv_path, json_path)
    done = {_key(r) for r in rows if not r.get("error")}  # failed rows are retried
    todo = [c for c in spec.cells() if spec.row_key(*c) not in done]
    result = BenchResult(rows, skipped=sum(1 for _ in spec.cells()) - len(todo),
                         paths=(csv_path, json_path))
    env = bench_env.environment(spec.device)
    runner: ModelRunner | None = None
    for i, (model, ratio, strategy, solver) in enumerate(todo):
        if progress:
            progress(i, len(todo), f"{model} {ratio} {strategy} {solver}")
        if runner is None or runner.model != model:
            runner = ModelRunner(spec, model)
        row = runner.row(ratio, strategy, solver)
        row.update(env)
        result.failed += bool(row.get("error"))
        rows[:] = [r for r in rows if _key(r) != _key(row)]
        rows.append(row)
        result.ran += 1
        write_results(rows, csv_path, json_path, spec)
    if progress:
        progress(len(todo), len(todo), "done")
    if not todo:
        write_results(rows, csv_path, json_path, spec)
    return result


def _key(row: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(_cell(row.get(k)) for k in ROW_KEY)


def output_paths(output: str | os.PathLike[str]) -> tuple[Path, Path]:
    path = Path(output)
    if path.suffix == ".json":
        return path.with_suffix(".csv"), path
    return path if path.suffix else path.with_suffix(".csv"), path.with_suffix(".json")


def read_rows(csv_path: Path, json_path: Path) -> list[dict[str, Any]]:
    """Rows already written: the JSON document (typed) when present, else the CSV."""
    if json_path.exists():
        try:
            doc = json.loads(json_path.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{json_path}: not valid JSON ({exc}); remove it to start the "
                              "sweep afresh") from None
        if doc.get("format") != BENCH_FORMAT:
            raise ConfigError(f"{json_path}: not an `autotm bench` result; choose another -o")
        return list(doc.get("rows", []))
    if csv_path.exists():
        with csv_path.open(newline="") as fh:
            return [dict(r) for r in csv.DictReader(fh)]
    return []


def write_results(rows: Sequence[Mapping[str, Any]], csv_path: Path, json_path: Path,
                  spec: BenchSpec | None = None) -> None:
    """Rewrite both files atomically (temp file + rename): never half a file."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _cell(row.get(k)) for k in COLUMNS})
    atomic_write_text(csv_path, buf.getvalue())
    doc = {"format": BENCH_FORMAT, "version": BENCH_VERSION, "columns": list(COLUMNS),
           "spec": None if spec is None else _spec_dict(spec), "rows": list(rows)}
    atomic_write_text(json_path, json.dumps(doc, indent=1, default=str) + "\n")


def _spec_dict(spec: BenchSpec) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in spec.__dict__.items()
            if k != "dims"} | {"dims": dict(spec.dims)}
