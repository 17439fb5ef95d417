"""Fig. 11: prediction error on the GPU, 100 * (predicted - measured) / measured, per model,
budget and strategy (baselines too where they were executed).

Reads results/gpu_*.json: `autotm bench --device cuda --execute` on a GPU machine
(`run_experiments.py gpu`).
"""

from __future__ import annotations

import math
from pathlib import Path

from figlib import (
    FIGURES,
    RESULTS,
    executed,
    grouped_bars,
    model_label,
    new_figure,
    number,
    ratio_key,
    require,
    run_figure,
    save_figure,
    unique,
)

STRATEGIES = ("static", "sync", "async")
BASELINES = ("all_fast", "all_slow", "first_touch", "lru", "offload")


def groups(rows: list[dict]) -> list[tuple[str, str, str]]:
    """(model, batch, ratio) of every executed configuration, in a stable order."""
    keys = {(r["model"], str(r.get("batch")), r["ratio"]) for r in rows
            if any(k.startswith("measured_") and k.endswith("_s") and not math.isnan(number(v))
                   for k, v in r.items())}
    return sorted(keys, key=lambda k: (k[0], int(k[1]) if k[1].isdigit() else 0,
                                       ratio_key(k[2])))


def errors(rows: list[dict]) -> tuple[list[str], dict[str, list[float]]]:
    keys = groups(rows)
    labels = [f"{model_label({'model': m, 'batch': b})}\n{r}" for m, b, r in keys]
    out: dict[str, list[float]] = {}
    for name in STRATEGIES + BASELINES:
        values = []
        for m, b, r in keys:
            values.append(_error(rows, name, m, b, r))
        if not all(math.isnan(v) for v in values):
            out[name] = values
    return labels, out


def _error(rows: list[dict], name: str, model: str, batch: str, ratio: str) -> float:
    match = [x for x in rows if x["model"] == model and str(x.get("batch")) == batch
             and x["ratio"] == ratio]
    if name in STRATEGIES:
        match = [x for x in match if x["strategy"] == name]
        pred, meas = "predicted_s", "measured_s"
    else:
        pred, meas = f"{name}_s", f"measured_{name}_s"
    if not match:
        return math.nan
    row = match[-1]
    p, m = number(row.get(pred)), number(row.get(meas))
    return 100.0 * (p - m) / m if m > 0 else math.nan


def make(results: Path = RESULTS, figures: Path = FIGURES) -> list[Path]:
    rows = executed(require(results, "gpu_*.json", "run `python experiments/run_experiments.py "
                                                   "gpu` on a GPU machine first"))
    labels, series = errors(rows)
    fig, ax = new_figure(max(7.0, 1.6 * len(labels)), 4.5)
    grouped_bars(ax, labels, series)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_ylabel("prediction error (%)\n(predicted − measured) / measured")
    devices = ", ".join(str(d) for d in unique(rows, "device_name"))
    ax.set_title(f"Fig. 11: predicted vs measured iteration time ({devices})")
    ax.legend(fontsize="small")
    return save_figure(fig, figures, "fig11_error")


if __name__ == "__main__":
    run_figure(make, __doc__)
