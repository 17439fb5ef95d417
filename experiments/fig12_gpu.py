"""Fig. 12: measured GPU speedup of AutoTM (sync, async) and the other baselines over a
reference baseline (default: LRU on-demand swap), with two bounds: all fast measured without a
budget, and the oracle, the sum of every kernel's profiled time (as the paper's oracle).

Reads results/gpu_*.json (`autotm bench --device cuda --execute`, `run_experiments.py gpu`).
"""

from __future__ import annotations

import math
from pathlib import Path

from fig11_error import groups
from figlib import (
    FIGURES,
    LABELS,
    RESULTS,
    executed,
    grouped_bars,
    model_label,
    new_figure,
    number,
    require,
    run_figure,
    save_figure,
    unique,
)

STRATEGIES = ("sync", "async", "static")
OTHERS = ("first_touch", "lru", "offload")


def speedups(rows: list[dict], reference: str) -> tuple[list[str], dict[str, list[float]]]:
    keys = groups(rows)
    labels = [f"{model_label({'model': m, 'batch': b})}\n{r}" for m, b, r in keys]
    series: dict[str, list[float]] = {}
    names = [*STRATEGIES, *(b for b in OTHERS if b != reference), "all_fast", "oracle"]
    for name in names:
        values = [_speedup(rows, name, reference, key) for key in keys]
        if not all(math.isnan(v) for v in values):
            series[name] = values
    return labels, series


def _speedup(rows: list[dict], name: str, reference: str, key: tuple[str, str, str]) -> float:
    model, batch, ratio = key
    match = [r for r in rows if r["model"] == model and str(r.get("batch")) == batch
             and r["ratio"] == ratio]
    if name in STRATEGIES:
        match = [r for r in match if r["strategy"] == name]
    if not match:
        return math.nan
    row = match[-1]
    ref = number(row.get(f"measured_{reference}_s"))
    if name in STRATEGIES:
        t = number(row.get("measured_s"))
    elif name == "oracle":
        t = number(row.get("oracle_s"))
    elif name == "all_fast":
        t = number(row.get("measured_all_fast_s"))
    else:
        t = number(row.get(f"measured_{name}_s"))
    return ref / t if t > 0 else math.nan


def make(results: Path = RESULTS, figures: Path = FIGURES, reference: str = "lru") -> list[Path]:
    rows = executed(require(results, "gpu_*.json", "run `python experiments/run_experiments.py "
                                                   "gpu` on a GPU machine first"))
    labels, series = speedups(rows, reference)
    fig, ax = new_figure(max(7.0, 1.4 * len(labels)), 4.5)
    grouped_bars(ax, labels, series)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylabel(f"speedup over {LABELS.get(reference, reference)} (measured)")
    devices = ", ".join(str(d) for d in unique(rows, "device_name"))
    ax.set_title(f"Fig. 12: GPU training iteration speedup ({devices})")
    ax.legend(fontsize="small")
    return save_figure(fig, figures, "fig12_gpu")


if __name__ == "__main__":
    run_figure(make, __doc__, [("--reference", {"default": "lru", "choices": OTHERS})])
