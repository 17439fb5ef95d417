"""Fig. 9: performance and memory cost against the fast:slow ratio (host mode, AutoTM sync).

Bars (left axis): performance relative to all fast, t(all fast) / t(plan), one per model.
Markers (right axis): memory cost relative to an all-fast system of the same capacity, with
fast memory `COST_RATIO` times dearer per GB than slow (the paper's DRAM:PMM price, 2.1):
cost(F:S) = (F + S / COST_RATIO) / (F + S). All slow is 0:1.
Reads results/host_conventional.json (`run_experiments.py host`).
"""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

from figlib import (
    FIGURES,
    RESULTS,
    grouped_bars,
    new_figure,
    number,
    one,
    ratio_label,
    require,
    run_figure,
    save_figure,
    unique,
)

COST_RATIO = 2.1
RATIOS = ("0:1", "1:8", "1:4", "1:1")


def relative_cost(ratio: str, cost_ratio: float = COST_RATIO) -> float:
    fast, slow = (Fraction(x) for x in ratio.split(":"))
    return float((fast + slow / Fraction(cost_ratio)) / (fast + slow))


def performance(rows: list[dict], model: str, ratio: str) -> float:
    """t(all fast) / t at `ratio`; all slow comes from the all-slow baseline."""
    row = one(rows, model=model, ratio=ratio, strategy="sync")
    if ratio == "0:1":
        row = row or one(rows, model=model, strategy="sync")
        return number(row["all_fast_s"]) / number(row["all_slow_s"]) if row else math.nan
    return number(row["all_fast_s"]) / number(row["predicted_s"]) if row else math.nan


def make(results: Path = RESULTS, figures: Path = FIGURES) -> list[Path]:
    rows = require(results, "host_conventional.json",
                   "run `python experiments/run_experiments.py host` first")
    models = unique(rows, "model")
    fig, ax = new_figure(8.5, 5.0)
    labels = ["all slow\n(0:1)"] + [ratio_label(r) for r in RATIOS[1:]]
    grouped_bars(ax, labels, {m: [performance(rows, m, r) for r in RATIOS] for m in models},
                 values="{:.3f}")
    ax.set_ylabel("performance relative to all fast")
    ax.set_ylim(0, 1.2)
    twin = ax.twinx()
    twin.plot(range(len(RATIOS)), [relative_cost(r) for r in RATIOS], linestyle="",
              marker="$\\$$", markersize=14, color="black", label="memory cost")
    twin.set_ylabel(f"memory cost relative to all fast (fast = {COST_RATIO}x slow per GB)")
    twin.set_ylim(0, 1.2)
    handles, names = ax.get_legend_handles_labels()
    h2, n2 = twin.get_legend_handles_labels()
    ax.legend(handles + h2, names + n2, fontsize="small", loc="upper center",
              bbox_to_anchor=(0.5, -0.2), ncol=5)
    ax.set_xlabel("fast:slow capacity")
    ax.set_title("Fig. 9: performance and memory cost (AutoTM sync, host mode, predicted)")
    return save_figure(fig, figures, "fig09_cost")


if __name__ == "__main__":
    run_figure(make, __doc__)
