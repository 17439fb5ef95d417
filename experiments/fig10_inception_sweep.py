"""Fig. 10a-c: Inception-v4 ratio sweep (host mode, predicted), against the fast budget.

a) slowdown over all fast, t(plan) / t(all fast), static and sync (async when present);
b) share of kernel input bytes and of output bytes read from / written to fast memory;
c) bytes moved by AutoTM sync, slow -> fast and fast -> slow.
The dotted line marks the unconstrained peak footprint (above it nothing needs to move).
Reads results/host_inception_sweep.json (`run_experiments.py sweep`).
"""

from __future__ import annotations

from pathlib import Path

from figlib import (
    COLOURS,
    FIGURES,
    LABELS,
    RESULTS,
    new_figure,
    number,
    require,
    run_figure,
    save_figure,
    select,
)

GB = 1e9
STRATEGIES = ("static", "sync", "async")


def series(rows: list[dict], strategy: str, key: str) -> tuple[list[float], list[float]]:
    """(budget GB, value) sorted by budget, for one strategy."""
    pts = sorted((number(r["budget_bytes"]) / GB, r) for r in
                 select(rows, strategy=strategy) if r.get("status") in ("optimal", "feasible"))
    return [b for b, _ in pts], [number(r[key]) if key in r else float("nan") for _, r in pts]


def _peak(ax: object, rows: list[dict]) -> None:
    ax.axvline(number(rows[0]["peak_bytes"]) / GB, color="black", linestyle=":",
               label="peak footprint")


def make(results: Path = RESULTS, figures: Path = FIGURES) -> list[Path]:
    rows = require(results, "host_inception_sweep.json",
                   "run `python experiments/run_experiments.py sweep` first")
    for r in rows:
        r["slowdown"] = number(r["predicted_s"]) / number(r["all_fast_s"])
    fig, (a, b, c) = new_figure(6.5, 10.0, nrows=3, sharex=True)
    present = [s for s in STRATEGIES if select(rows, strategy=s)]
    for s in present:
        a.plot(*series(rows, s, "slowdown"), marker="o", color=COLOURS[s], label=LABELS[s])
        for key, style in (("input_fast_fraction", "-"), ("output_fast_fraction", "--")):
            side = "inputs" if key.startswith("input") else "outputs"
            b.plot(*series(rows, s, key), linestyle=style, marker=".", color=COLOURS[s],
                   label=f"{LABELS[s]}, {side}")
    for key, colour, label in (("bytes_to_fast", "#009E73", "slow → fast"),
                               ("bytes_to_slow", "#D55E00", "fast → slow")):
        x, y = series(rows, "sync", key)
        c.plot(x, [v / GB for v in y], marker="o", color=colour, label=f"sync: {label}")
    for ax in (a, b, c):
        _peak(ax, rows)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    a.set_ylabel("slowdown over all fast")
    b.set_ylabel("share of kernel IO bytes in fast")
    b.set_ylim(0, 1.05)
    c.set_ylabel("GB moved")
    c.set_xlabel("fast-tier budget (GB)")
    model = rows[0]["model"]
    a.set_title(f"Fig. 10: {model} (batch {rows[0].get('batch')}) budget sweep, predicted")
    return save_figure(fig, figures, "fig10_inception_sweep")


if __name__ == "__main__":
    run_figure(make, __doc__)
