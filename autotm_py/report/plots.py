"""Figures of one plan: memory per tier over time, tensor x kernel residency, bytes moved.

matplotlib is imported inside the functions (DESIGN: only `report/` needs it, and only when a
figure is drawn). Figures are `matplotlib.figure.Figure` objects made without pyplot, so no
global state or GUI backend is involved; `save_figure` writes PNG and SVG atomically.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from autotm_py.fileio import atomic_write_bytes
from autotm_py.report.residency import PlanView, Residency

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from autotm_py.report.timeline import Timeline

# One colour per tier everywhere (colour-blind safe pair from the Okabe-Ito palette).
TIER_COLOURS = {"fast": "#0072B2", "slow": "#E69F00", "both": "#CC79A7", "absent": "#FFFFFF"}
MOVE_COLOURS = {"fast": "#009E73", "slow": "#D55E00"}  # destination tier of a copy
BUDGET_COLOUR = "#D00000"
MOVE_LABELS = {"fast": "slow → fast (prefetch)", "slow": "fast → slow (evict)"}


def new_figure(width: float, height: float, **subplots: Any) -> tuple[Figure, Any]:
    """A pyplot-free figure with subplots (`subplots` goes to `Figure.subplots`)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.subplots(**subplots)


def save_figure(fig: Figure, out_dir: str | os.PathLike[str], stem: str,
                formats: Sequence[str] = ("png", "svg")) -> list[Path]:
    """Write `out_dir/stem.<fmt>` for each format, each atomically."""
    paths = []
    for fmt in formats:
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt, dpi=150)
        paths.append(atomic_write_bytes(Path(out_dir) / f"{stem}.{fmt}", buf.getvalue()))
    return paths


def byte_scale(max_bytes: float) -> tuple[float, str]:
    """A divisor and unit name so that the largest value reads well (IEC units)."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if max_bytes >= scale:
            return float(scale), unit
    return 1.0, "B"


def time_axis(tl: Timeline) -> tuple[float, str]:
    """A factor for the timeline's times and the axis label (s, ms or µs as they read best)."""
    if tl.unit == "step":
        return 1.0, "plan step (kernels and sync moves, in order)"
    for factor, unit in ((1.0, "s"), (1e3, "ms")):
        if tl.total * factor >= 1.0:
            return factor, f"time ({unit})"
    return 1e6, "time (µs)"


# ---- memory timeline -----------------------------------------------------------------------
RESERVE_COLOUR = "#999999"
TOP_MARGIN = 1.08  # room above the highest line, so that the budget line is never on the frame


def _fast_top(tl: Timeline) -> float:
    """The highest value the fast-tier panel shows: the curve on the reserve, the budget, the
    measured peak."""
    return max(float(tl.memory_fast.max(initial=0)) + tl.reserve_bytes,
               float(tl.budget_bytes or 0), float(tl.measured_peak_fast_bytes or 0))


def plot_memory(predicted: Timeline, measured: Timeline | None = None) -> Figure:
    """Bytes in each tier over the iteration, with the user's budget and, below the plan's
    bytes, the runtime's reserve; one column per timeline."""
    timelines = [predicted] + ([measured] if measured is not None else [])
    top = max([_fast_top(tl) for tl in timelines]
              + [float(tl.memory_slow.max(initial=0)) for tl in timelines])
    scale, unit = byte_scale(top)
    fig, axes = new_figure(6.5 * len(timelines), 5.5, nrows=2, ncols=len(timelines),
                           sharex="col", squeeze=False)
    for col, tl in enumerate(timelines):
        _memory_column(axes[0][col], axes[1][col], tl, scale, unit)
    fig.suptitle("Memory in use per tier")
    return fig


def _memory_column(ax_fast: Any, ax_slow: Any, tl: Timeline, scale: float, unit: str) -> None:
    factor, label = time_axis(tl)
    t = factor * (np.append(tl.memory_t, tl.total) if len(tl.memory_t) else
                  np.array([0.0, tl.total]))
    reserve = tl.reserve_bytes / scale
    for ax, values, tier in ((ax_fast, tl.memory_fast, "fast"), (ax_slow, tl.memory_slow, "slow")):
        y = np.append(values, values[-1]) / scale if len(values) else np.zeros(2)
        base = reserve if tier == "fast" else 0.0
        curve = "modelled" if tl.source != "measured" else "plan bytes on measured times"
        if base:
            curve += ", above the reserve"
        ax.step(t, y + base, where="post", color=TIER_COLOURS[tier], label=curve, linewidth=1.4)
        ax.fill_between(t, y + base, base, step="post", color=TIER_COLOURS[tier], alpha=0.2)
        ax.set_ylabel(f"{tier} tier ({unit})")
        ax.grid(alpha=0.3)
    if reserve:
        ax_fast.axhspan(0, reserve, color=RESERVE_COLOUR, alpha=0.35, linewidth=0,
                        label=f"runtime reserve {reserve:.3g} {unit}")
    _budget_lines(ax_fast, tl, scale, unit)
    if tl.measured_peak_fast_bytes is not None:
        ax_fast.axhline(tl.measured_peak_fast_bytes / scale, color="black", linestyle=":",
                        label=f"measured peak {tl.measured_peak_fast_bytes / scale:.3g} {unit}")
    ax_fast.set_ylim(0, max(_fast_top(tl) / scale, 1e-9) * TOP_MARGIN)
    ax_slow.set_ylim(0, max(float(tl.memory_slow.max(initial=0)) / scale, 1e-9) * TOP_MARGIN)
    ax_fast.set_title(f"{tl.source} timeline")
    ax_fast.legend(loc="lower right", fontsize="small")
    ax_slow.set_xlabel(label)


def _budget_lines(ax: Any, tl: Timeline, scale: float, unit: str) -> None:
    """The user's budget and, with --headroom, the line the plan's bytes stay under."""
    if not tl.budget_bytes:
        return
    budget = tl.budget_bytes / scale
    ax.axhline(budget, color=BUDGET_COLOUR, linestyle="--", label=f"budget {budget:.3g} {unit}")
    if tl.headroom_bytes:
        limit = (tl.budget_bytes - tl.headroom_bytes) / scale
        ax.axhline(limit, color=BUDGET_COLOUR, linestyle=":", linewidth=1.0,
                   label=f"budget less headroom {limit:.3g} {unit}")


# ---- residency heatmap ---------------------------------------------------------------------
def heatmap_rows(view: PlanView, res: Residency, max_tensors: int) -> list[int]:
    """Tensors to show: every moved tensor first, then the largest, in order of first use."""
    moved = res.moved_tensors()
    present = [t for t in range(view.n_tensors) if res.changes[t]]
    ranked = sorted(present, key=lambda t: (t not in moved, -view.tensor_bytes[t], t))
    chosen = ranked[:max_tensors]
    first = {t: res.changes[t][0][0] for t in chosen}
    return sorted(chosen, key=lambda t: (first[t], t))


def plot_residency(view: PlanView, res: Residency, *, max_tensors: int = 300) -> Figure:
    """Tensors (rows) x kernels in plan order (columns), coloured by tier, with move markers."""
    from matplotlib.colors import ListedColormap
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    rows = heatmap_rows(view, res, max_tensors)
    grid = res.state_matrix(rows)
    colours = [TIER_COLOURS["absent"], TIER_COLOURS["fast"], TIER_COLOURS["slow"],
               TIER_COLOURS["both"]]
    height = float(np.clip(2.5 + 0.12 * len(rows), 4.0, 14.0))
    fig, ax = new_figure(11.0, height)
    ax.imshow(grid, aspect="auto", interpolation="nearest", cmap=ListedColormap(colours),
              vmin=0, vmax=3, extent=(-0.5, grid.shape[1] - 0.5, len(rows) - 0.5, -0.5))
    _move_markers(ax, res, {t: r for r, t in enumerate(rows)})
    _label_rows(ax, view, rows)
    ax.set_xlabel("kernel (plan order)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    present = sum(1 for c in res.changes if c)
    shown = f"all {present} tensors" if len(rows) == present else \
        f"{len(rows)} of {present} tensors: the moved ones, then the largest"
    ax.set_title(f"Where each tensor lives while each kernel runs ({shown})")
    handles = [Patch(color=TIER_COLOURS["fast"], label="fast"),
               Patch(color=TIER_COLOURS["slow"], label="slow"),
               Patch(color=TIER_COLOURS["both"], label="fast + slow copy"),
               Line2D([], [], marker="^", linestyle="", color=MOVE_COLOURS["fast"],
                      label=MOVE_LABELS["fast"]),
               Line2D([], [], marker="v", linestyle="", color=MOVE_COLOURS["slow"],
                      label=MOVE_LABELS["slow"])]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    return fig


def _move_markers(ax: Any, res: Residency, row_of: dict[int, int]) -> None:
    for to, marker in (("fast", "^"), ("slow", "v")):
        pts = [(m.position - 0.5, row_of[m.tensor]) for m in res.moves
               if m.to == to and m.tensor in row_of]
        if pts:
            x, y = zip(*pts, strict=True)
            ax.scatter(x, y, marker=marker, s=18, color=MOVE_COLOURS[to], edgecolors="black",
                       linewidths=0.3, zorder=3)


def _label_rows(ax: Any, view: PlanView, rows: list[int]) -> None:
    if len(rows) <= 60:
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([_short(view.tensor_names[t]) for t in rows], fontsize=7)
        return
    step = max(1, len(rows) // 30)
    ticks = list(range(0, len(rows), step))
    ax.set_yticks(ticks)
    ax.set_yticklabels([_short(view.tensor_names[rows[i]]) for i in ticks], fontsize=7)
    ax.set_ylabel("tensor")


def _short(name: str, width: int = 32) -> str:
    return name if len(name) <= width else "…" + name[-(width - 1):]


# ---- bytes moved ---------------------------------------------------------------------------
def plot_moves(tl: Timeline, *, bins: int = 60) -> Figure:
    """Bytes copied per direction over time (mirrored bars) and cumulatively."""
    fig, (ax_bins, ax_cum) = new_figure(10.0, 6.0, nrows=2, sharex=True)
    factor, label = time_axis(tl)
    total = max(tl.total * factor, 1e-12)
    edges = np.linspace(0.0, total, bins + 1)
    moved = {to: [m for m in tl.moves if m.to == to] for to in ("fast", "slow")}
    top = max([sum(m.nbytes for m in ms) for ms in moved.values()] + [1])
    scale, unit = byte_scale(top)
    width = edges[1] - edges[0]
    for to, sign in (("fast", 1.0), ("slow", -1.0)):
        starts = np.array([m.start * factor for m in moved[to]], dtype=float)
        sizes = np.array([m.nbytes for m in moved[to]], dtype=float) / scale
        hist, _ = np.histogram(starts, bins=edges, weights=sizes)
        ax_bins.bar(edges[:-1], sign * hist, width=width, align="edge",
                    color=MOVE_COLOURS[to], label=MOVE_LABELS[to])
        order = np.argsort(starts, kind="stable")
        cum = np.concatenate([[0.0], np.cumsum(sizes[order])])
        cum = np.append(cum, cum[-1])
        ax_cum.step(np.concatenate([[0.0], starts[order], [total]]), cum, where="post",
                    color=MOVE_COLOURS[to], label=f"{MOVE_LABELS[to]}: {cum[-1]:.3g} {unit}")
    ax_bins.axhline(0, color="black", linewidth=0.6)
    ax_bins.set_ylabel(f"{unit} per bin (evictions below 0)")
    ax_bins.set_title(f"Bytes copied between tiers ({tl.source})")
    ax_bins.legend(fontsize="small")
    ax_cum.set_ylabel(f"cumulative ({unit})")
    ax_cum.set_xlabel(label)
    ax_cum.legend(fontsize="small", loc="upper left")
    for ax in (ax_bins, ax_cum):
        ax.grid(alpha=0.3)
    return fig
