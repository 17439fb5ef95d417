"""The Markdown summary of a plan report: what was planned, and why the plan is fast."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from autotm_py.plan import Plan
from autotm_py.report.metrics import PlanMetrics
from autotm_py.report.residency import PlanView, Residency
from autotm_py.report.timeline import Timeline
from autotm_py.units import format_bytes


def _pct(x: float) -> str:
    return f"{100.0 * x:.1f}%"


def _gap(x: float | None) -> str:
    return "-" if x is None else f"{100.0 * x:.2f}%"


def _seconds(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x * 1e3:.3f} ms" if x < 1 else f"{x:.3f} s"


def overview(plan: Plan, res: Residency, predicted: Timeline,
             measured: Timeline | None, measured_run: Mapping[str, Any] | None) -> dict[str, Any]:
    """The headline numbers, as a dict (also printed by `autotm report --json`)."""
    h = plan.header
    out: dict[str, Any] = {
        "model": h.model_name, "strategy": h.strategy,
        "memory_system": h.memory_system.get("name"), "mode": h.memory_system.get("mode"),
        "budget_bytes": h.budget_bytes, "reserve_bytes": h.reserve_bytes,
        "headroom_bytes": h.headroom_bytes, "predicted_time_s": h.predicted_time_s,
        "solver": h.solver.solver, "status": h.solver.status, "gap": h.solver.gap,
        "variables": h.solver.variables, "constraints": h.solver.constraints,
        "build_s": h.solver.build_s, "solve_s": h.solver.solve_s,
        "timeline": predicted.source, "peak_fast_bytes": predicted.peak_fast_bytes,
        "kernels": len(res.order), "records": len(plan.records),
    }
    if predicted.unit == "s":
        busy = sum(k.end - k.start for k in predicted.kernels)
        out["timeline_total_s"] = predicted.total
        out["compute_busy_s"] = busy
        out["copy_wait_s"] = max(predicted.total - busy, 0.0)
    if measured_run is not None:
        median = measured_run.get("median_s")
        out["measured_median_s"] = median
        out["measured_peak_fast_bytes"] = measured_run.get("peak_fast_bytes")
        ref = h.predicted_time_s or (predicted.total if predicted.unit == "s" else None)
        if median and ref:
            out["prediction_error"] = (ref - median) / median
    return out


def markdown_summary(plan: Plan, view: PlanView, res: Residency, metrics: PlanMetrics,
                     predicted: Timeline, measured: Timeline | None = None,
                     measured_run: Mapping[str, Any] | None = None,
                     figures: Sequence[str] = ()) -> str:
    """A Markdown page: a headline table, the reasons, the largest moves, the figures."""
    info = overview(plan, res, predicted, measured, measured_run)
    lines = [f"# Plan report: {info['model']}", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in _headline_rows(plan, info)]
    lines += ["", "## Why this plan", "", *_reasons(info, metrics, predicted)]
    lines += ["", "## Largest copies", "", *_largest_moves(view, res)]
    lines += ["", "## Tensors never in fast memory", "", *_slow_only(view, res)]
    if figures:
        lines += ["", "## Figures", ""] + [f"![{f}]({f})" for f in figures if f.endswith(".svg")]
    notes = list(plan.header.notes) + list(predicted.notes) + \
        (list(measured.notes) if measured is not None else [])
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def _headline_rows(plan: Plan, info: Mapping[str, Any]) -> list[tuple[str, str]]:
    budget = info["budget_bytes"]
    ratio = plan.header.config.get("ratio") if plan.header.config else None
    reserve, headroom = plan.header.reserve_bytes, plan.header.headroom_bytes
    tensors = None if budget is None else max(budget - reserve - headroom, 0)
    rows = [
        ("strategy", str(info["strategy"])),
        ("memory system", f"{info['memory_system']} ({info['mode']} mode)"),
        ("fast budget", "unlimited" if budget is None else
         format_bytes(budget) + (f" (ratio fast:slow {ratio})" if ratio else "")
         + f" = {format_bytes(reserve)} runtime reserve + {format_bytes(headroom)} headroom + "
           f"{format_bytes(tensors or 0)} for the plan's tensors"),
        ("solver", f"{info['solver']}, {info['status']}, gap {_gap(info['gap'])}, "
                   f"{info['variables']} variables, {info['constraints']} constraints, "
                   f"build {info['build_s']:.2f} s, solve {info['solve_s']:.2f} s"),
        ("predicted iteration", _seconds(info["predicted_time_s"])),
        ("timeline", info["timeline"]),
        ("peak fast-tier bytes of the plan's tensors (modelled)",
         format_bytes(info["peak_fast_bytes"])
         + (f" ({_pct(info['peak_fast_bytes'] / tensors)} of the "
            f"{format_bytes(tensors)} they may use)" if tensors else "")),
    ]
    if "measured_median_s" in info:
        rows.append(("measured iteration (median)", _seconds(info["measured_median_s"])))
        peak = info.get("measured_peak_fast_bytes")
        rows.append(("measured fast-tier peak", "n/a" if peak is None else format_bytes(peak)))
    if "prediction_error" in info:
        rows.append(("prediction error (predicted - measured) / measured",
                     _pct(info["prediction_error"])))
    return rows


def _reasons(info: Mapping[str, Any], m: PlanMetrics, tl: Timeline) -> list[str]:
    out = [
        f"- Kernel inputs read from fast memory: {_pct(m.input_fast_fraction)} of "
        f"{format_bytes(m.input_bytes)}; outputs written there: {_pct(m.output_fast_fraction)} "
        f"of {format_bytes(m.output_bytes)}.",
        f"- {m.moves_to_fast} copies slow → fast ({format_bytes(m.bytes_to_fast)}; "
        f"{format_bytes(m.async_bytes_to_fast)} of it overlapped with compute) and "
        f"{m.moves_to_slow} copies fast → slow ({format_bytes(m.bytes_to_slow)}; "
        f"{format_bytes(m.async_bytes_to_slow)} overlapped).",
    ]
    if "compute_busy_s" in info and tl.total > 0:
        out.append(f"- Compute is busy {_seconds(info['compute_busy_s'])} of the "
                   f"{_seconds(tl.total)} iteration ({_pct(info['compute_busy_s'] / tl.total)}); "
                   f"the rest ({_seconds(info['copy_wait_s'])}) waits on copies.")
    return out


def _largest_moves(view: PlanView, res: Residency, top: int = 10) -> list[str]:
    if not res.moves:
        return ["No copies: every tensor stays where it is created."]
    lines = ["| tensor | bytes | direction | mode | before kernel | first reader |",
             "|---|---|---|---|---|---|"]
    for m in sorted(res.moves, key=lambda m: (-m.nbytes, m.record))[:top]:
        before = view.kernel_names[res.order[m.position]] if m.position < len(res.order) \
            else "(end)"
        reader = view.kernel_names[m.consumer] if m.consumer is not None else \
            "- (an eviction)" if m.to == "slow" else "- (none later in the iteration)"
        lines.append(f"| {view.tensor_names[m.tensor]} | {format_bytes(m.nbytes)} | "
                     f"→ {m.to} | {m.mode} | {before} | {reader} |")
    return lines


def _slow_only(view: PlanView, res: Residency) -> list[str]:
    slow_only = [t for t, changes in enumerate(res.changes)
                 if changes and all(mask & 1 == 0 for _, mask in changes)
                 and any(mask for _, mask in changes)]
    if not slow_only:
        return ["Every tensor is in fast memory at some point."]
    total = sum(view.tensor_bytes[t] for t in slow_only)
    biggest = sorted(slow_only, key=lambda t: -view.tensor_bytes[t])[:5]
    names = ", ".join(f"{view.tensor_names[t]} ({format_bytes(view.tensor_bytes[t])})"
                      for t in biggest)
    return [f"{len(slow_only)} tensors ({format_bytes(total)}) live only in slow memory; "
            f"largest: {names}."]
