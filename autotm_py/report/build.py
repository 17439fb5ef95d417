"""`make_report`: every figure, the Markdown summary and optionally the trace of one plan.

Inputs are JSON-shaped so that the CLI, notebooks and saved files share one path:
- the plan (`Plan`);
- the predicted timeline: a simulation (`SimulationResult.to_dict()`), or none, in which case
  the report shows plan order (steps) instead of time;
- a measured run (`RunResult.to_dict()`), optional;
- the graph, optional (the plan's own names tables suffice).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotm_py.errors import ConfigError
from autotm_py.fileio import atomic_write_text
from autotm_py.plan import Plan
from autotm_py.report.metrics import plan_metrics
from autotm_py.report.plots import plot_memory, plot_moves, plot_residency, save_figure
from autotm_py.report.residency import PlanView, Residency, walk
from autotm_py.report.summary import markdown_summary, overview
from autotm_py.report.timeline import (
    Timeline,
    measured_timeline,
    plan_order_timeline,
    simulated_timeline,
)
from autotm_py.report.trace import chrome_trace

if TYPE_CHECKING:
    from autotm_py.ir.graph import TensorGraph

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReportResult:
    """What `make_report` wrote, and the headline numbers."""

    files: tuple[Path, ...]
    overview: Mapping[str, Any]
    metrics: Mapping[str, Any]
    notes: tuple[str, ...] = field(default_factory=tuple)


def timelines(plan: Plan, *, graph: TensorGraph | None = None,
              simulation: Mapping[str, Any] | None = None,
              measured: Mapping[str, Any] | None = None,
              origin: Mapping[str, Any] | None = None
              ) -> tuple[PlanView, Residency, Timeline, Timeline | None]:
    """(view, residency, predicted timeline, measured timeline or None). `origin` names the
    files the simulation and the run came from, for error messages."""
    where = {"timeline": "simulation", "measured": "measured run", **(origin or {})}
    view = PlanView.from_plan(plan, graph)
    res = walk(plan, view)
    predicted = simulated_timeline(simulation, plan, res, origin=str(where["timeline"])) \
        if simulation is not None else plan_order_timeline(plan, res)
    measured_tl = measured_timeline(measured, plan, res, origin=str(where["measured"])) \
        if measured is not None else None
    return view, res, predicted, measured_tl


def make_report(plan: Plan, out_dir: str | os.PathLike[str], *,
                graph: TensorGraph | None = None,
                simulation: Mapping[str, Any] | None = None,
                measured: Mapping[str, Any] | None = None,
                trace_path: str | os.PathLike[str] | None = None,
                formats: Sequence[str] = ("png", "svg"),
                max_tensors: int = 300,
                origin: Mapping[str, Any] | None = None) -> ReportResult:
    """Write memory.*, residency.*, moves.*, summary.md, report.json (and the trace)."""

    _check_formats(formats)
    out = Path(out_dir)
    view, res, predicted, measured_tl = timelines(plan, graph=graph, simulation=simulation,
                                                  measured=measured, origin=origin)
    metrics = plan_metrics(plan, view)
    files: list[Path] = []
    figures = (("memory", lambda: plot_memory(predicted, measured_tl)),
               ("residency", lambda: plot_residency(view, res, max_tensors=max_tensors)),
               ("moves", lambda: plot_moves(predicted)))
    for stem, draw in figures:
        files += save_figure(draw(), out, stem, formats)
    names = [p.name for p in files]
    text = markdown_summary(plan, view, res, metrics, predicted, measured_tl, measured, names)
    files.append(atomic_write_text(out / "summary.md", text))
    info = overview(plan, res, predicted, measured_tl, measured)
    doc = {"overview": info, "metrics": metrics.to_dict(), "files": [*names, "summary.md"]}
    files.append(atomic_write_text(out / "report.json", json.dumps(doc, indent=2, default=str)))
    if trace_path is not None:
        files.append(write_trace(view, predicted, measured_tl, trace_path, plan))
    log.info("report of %s: %d files in %s", plan.header.model_name, len(files), out)
    notes = predicted.notes + (measured_tl.notes if measured_tl is not None else ())
    return ReportResult(tuple(files), info, metrics.to_dict(), notes)


def write_trace(view: PlanView, predicted: Timeline, measured: Timeline | None,
                path: str | os.PathLike[str], plan: Plan) -> Path:
    meta = {"strategy": plan.header.strategy, "budget_bytes": plan.header.budget_bytes,
            "memory_system": plan.header.memory_system.get("name")}
    doc = chrome_trace(view, predicted, measured, meta=meta)
    return atomic_write_text(path, json.dumps(doc, separators=(",", ":")))


def _check_formats(formats: Sequence[str]) -> None:
    from matplotlib.backend_bases import FigureCanvasBase

    known = FigureCanvasBase.get_supported_filetypes()
    bad = [f for f in formats if f not in known]
    if bad or not formats:
        raise ConfigError(f"--format {','.join(formats)}: unknown figure format "
                          f"{bad[0] if bad else '(none)'}; choose from {', '.join(sorted(known))}")
