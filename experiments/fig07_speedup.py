"""Fig. 7: speedup over all-slow at fast:slow 1:8, 1:4, 1:1 (the paper's PMM:DRAM 8:1, 4:1, 1:1),
host mode (DRAM + Optane model), one panel per model.

Bars: first-touch NUMA, AutoTM static, sync (and async when present); the dashed line is the
all-fast speedup, the best any plan can do. Speedup = t(all slow) / t(plan), predicted.
Reads results/host_conventional.json (`run_experiments.py host`).
"""

from __future__ import annotations

import math
from pathlib import Path

from figlib import (
    FIGURES,
    RESULTS,
    grouped_bars,
    model_label,
    new_figure,
    number,
    one,
    ratio_label,
    require,
    run_figure,
    save_figure,
    select,
    unique,
    zoom_if_flat,
)

RATIOS = ("1:8", "1:4", "1:1")
SERIES = ("first_touch", "static", "sync", "async")


def speedups(rows: list[dict], model: str) -> dict[str, list[float]]:
    """Series name -> speedup over all-slow at each ratio of RATIOS (NaN where missing)."""
    out: dict[str, list[float]] = {}
    for name in SERIES:
        values = []
        for ratio in RATIOS:
            strategy = "sync" if name == "first_touch" else name
            row = one(rows, model=model, ratio=ratio, strategy=strategy)
            if row is None:
                values.append(math.nan)
                continue
            t = number(row["first_touch_s"] if name == "first_touch" else row["predicted_s"])
            values.append(number(row["all_slow_s"]) / t)
        if not all(math.isnan(v) for v in values):
            out[name] = values
    return out


def make(results: Path = RESULTS, figures: Path = FIGURES) -> list[Path]:
    rows = require(results, "host_conventional.json",
                   "run `python experiments/run_experiments.py host` first")
    models = unique(rows, "model")
    cols = 2 if len(models) > 1 else 1
    nrows = math.ceil(len(models) / cols)
    fig, axes = new_figure(5.5 * cols, 3.6 * nrows, nrows=nrows, ncols=cols, squeeze=False)
    for ax, model in zip([a for row in axes for a in row], models, strict=False):
        series = speedups(rows, model)
        grouped_bars(ax, [ratio_label(r) for r in RATIOS], series, values="{:.3f}")
        ref = select(rows, model=model)[0]
        best = number(ref["all_slow_s"]) / number(ref["all_fast_s"])
        ax.axhline(best, color="#D00000", linestyle="--", label="all fast")
        zoomed = zoom_if_flat(ax, series, reference=best)
        ax.set_title(model_label(ref) + (" (y axis zoomed)" if zoomed else ""))
        ax.set_ylabel("speedup over all slow")
        ax.set_xlabel("fast:slow capacity")
    for ax in [a for row in axes for a in row][len(models):]:
        ax.set_visible(False)
    axes[0][0].legend(fontsize="small")
    fig.suptitle("Fig. 7: speedup over all-slow memory (host mode, predicted)")
    return save_figure(fig, figures, "fig07_speedup")


if __name__ == "__main__":
    run_figure(make, __doc__)
