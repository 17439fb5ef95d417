"""ILP size, build time and solve time per model and strategy (median over the budgets run).

Reads every bench result in results/ (host_*.json, gpu_*.json): any row solved by an ILP.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from figlib import (
    FIGURES,
    RESULTS,
    MissingResults,
    grouped_bars,
    load_rows,
    new_figure,
    number,
    run_figure,
    save_figure,
)

STRATEGIES = ("static", "sync", "async")


def medians(rows: list[dict], key: str) -> tuple[list[str], dict[str, list[float]]]:
    models = sorted({f"{r['model']} ({r.get('batch')})" for r in rows})
    out = {}
    for s in STRATEGIES:
        values = []
        for m in models:
            xs = [number(r[key]) for r in rows if r["strategy"] == s
                  and f"{r['model']} ({r.get('batch')})" == m]
            values.append(statistics.median(xs) if xs else float("nan"))
        if any(v == v for v in values):
            out[s] = values
    return models, out


def make(results: Path = RESULTS, figures: Path = FIGURES) -> list[Path]:
    paths = sorted(Path(results).glob("host_*.json")) + sorted(Path(results).glob("gpu_*.json"))
    rows = [r for r in load_rows(paths, skip_others=True) if number(r.get("variables")) > 0]
    if not rows:
        raise MissingResults(f"no ILP rows in {results}/host_*.json or gpu_*.json; run "
                             "`python experiments/run_experiments.py host` first")
    fig, axes = new_figure(9.0, 9.0, nrows=3, sharex=True)
    for ax, key, label in zip(axes, ("variables", "build_s", "solve_s"),
                              ("variables", "build time (s)", "solve time (s)"), strict=True):
        models, series = medians(rows, key)
        grouped_bars(ax, [m.replace(" (", "\n(") for m in models], series)
        ax.set_yscale("log")
        ax.set_ylabel(label)
    axes[0].legend(fontsize="small")
    axes[0].set_title("ILP size and time per model (median over budgets)")
    return save_figure(fig, figures, "fig_ilp_times")


if __name__ == "__main__":
    run_figure(make, __doc__)
