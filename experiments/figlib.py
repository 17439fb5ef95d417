"""Shared helpers of the figure scripts: read bench results, group rows, label ratios, save.

Results are the JSON documents that `autotm bench` writes (see experiments/README.md for the
schema): ``{"format": "autotm-bench", "version": 1, "rows": [...]}``. Figures are drawn with
`autotm_py.report.plots` helpers (pyplot-free figures, PNG + SVG written atomically).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

from autotm_py.report.plots import new_figure, save_figure

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
FIGURES = HERE / "figures"
# One colour per series across all figures (Okabe-Ito palette, colour-blind safe).
COLOURS = {
    "first_touch": "#999999", "all_slow": "#000000", "lru": "#E69F00", "offload": "#56B4E9",
    "static": "#0072B2", "sync": "#009E73", "async": "#D55E00", "oracle": "#CC79A7",
    "all_fast": "#D00000",
}
LABELS = {
    "first_touch": "first-touch (NUMA)", "all_slow": "all slow", "lru": "LRU swap",
    "offload": "offload activations", "static": "AutoTM static", "sync": "AutoTM sync",
    "async": "AutoTM async", "oracle": "oracle (sum of kernel times)",
    "all_fast": "all fast (no limit)",
}


class MissingResults(Exception):
    """A figure's input results do not exist yet; the message says how to make them."""


Row = dict[str, Any]


def load_rows(paths: Iterable[Path], *, skip_others: bool = False) -> list[Row]:
    """Every row of every bench JSON document in `paths`. A document of another kind is an
    error, or with `skip_others` left out (a glob such as host_*.json may also match other
    experiments' documents, e.g. host_check.json)."""
    rows: list[Row] = []
    for path in paths:
        doc = json.loads(Path(path).read_text())
        if doc.get("format") != "autotm-bench":
            if skip_others:
                continue
            raise ValueError(f"{path}: not an `autotm bench` result (format {doc.get('format')})")
        rows += doc["rows"]
    return rows


def executed(rows: list[Row]) -> list[Row]:
    """Rows with a measured plan or a measured capped baseline: a results folder may also hold
    sweeps that only solved (gpu_plans.json), whose rows share the measured rows' keys."""
    keys = ("measured_s", "measured_first_touch_s", "measured_lru_s", "measured_offload_s")
    return [r for r in rows if any(not math.isnan(number(r.get(k))) for k in keys)]


def require(results: Path, pattern: str, how: str) -> list[Row]:
    """Rows of the files matching `pattern`, or MissingResults saying how to make them."""
    paths = sorted(Path(results).glob(pattern))
    if not paths:
        raise MissingResults(f"no {pattern} in {results}; {how}")
    return load_rows(paths)


def number(value: Any) -> float:
    """A CSV/JSON cell as float (NaN for empty or missing)."""
    if value is None or value == "":
        return math.nan
    return float(value)


def ratio_key(ratio: str) -> Fraction:
    """Sort key: the fast share of the peak (all slow first, all fast last)."""
    fast, slow = (Fraction(x) for x in str(ratio).split(":"))
    return fast / (fast + slow)


def paper_ratio(ratio: str) -> str:
    """Our fast:slow '1:4' as the paper's PMM:DRAM '4:1'."""
    fast, slow = str(ratio).split(":")
    return f"{slow}:{fast}"


def ratio_label(ratio: str) -> str:
    return f"{ratio}\n(PMM:DRAM {paper_ratio(ratio)})"


def model_label(row: Row) -> str:
    return f"{row['model']} ({row['batch']})" if row.get("batch") not in (None, "") \
        else str(row["model"])


def select(rows: Sequence[Row], **where: Any) -> list[Row]:
    return [r for r in rows if all(str(r.get(k)) == str(v) for k, v in where.items())]


def one(rows: Sequence[Row], **where: Any) -> Row | None:
    """The row matching `where` (the last one, when a sweep was repeated)."""
    found = select(rows, **where)
    return found[-1] if found else None


def unique(rows: Sequence[Row], key: str, sort: Callable[[Any], Any] | None = None) -> list[Any]:
    seen: list[Any] = []
    for r in rows:
        if r.get(key) not in seen:
            seen.append(r.get(key))
    return sorted(seen, key=sort) if sort else seen


def grouped_bars(ax: Any, groups: Sequence[str], series: dict[str, Sequence[float]],
                 *, width: float = 0.8, values: str | None = None) -> None:
    """One bar per series within each group; NaN bars are left out. `values`: a format
    (e.g. "{:.3f}") to print each bar's value on it."""
    n = max(len(series), 1)
    for i, (name, ys) in enumerate(series.items()):
        xs = [g + (i - (n - 1) / 2) * width / n for g in range(len(groups))]
        bars = ax.bar(xs, [0 if math.isnan(v) else v for v in ys], width / n,
                      color=COLOURS.get(name), label=LABELS.get(name, name),
                      edgecolor="black", linewidth=0.4)
        if values:
            ax.bar_label(bars, labels=["" if math.isnan(v) else values.format(v) for v in ys],
                         fontsize=7, rotation=90, padding=2)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups)
    ax.grid(axis="y", alpha=0.3)


def zoom_if_flat(ax: Any, series: dict[str, Sequence[float]], *, reference: float) -> bool:
    """When every bar is within 10% of `reference`, zoom the y axis so differences show (the
    title says so); return whether it zoomed."""
    values = [v for vs in series.values() for v in vs if not math.isnan(v)] + [reference]
    low, high = min(values), max(values)
    if high > 1.1 * reference or low < 0.9 * reference:
        return False
    span = max(high - low, 1e-3 * reference)
    ax.set_ylim(low - 0.5 * span, high + 1.5 * span)
    return True


def run_figure(make: Callable[..., list[Path]], doc: str | None,
               options: Sequence[tuple[str, dict[str, Any]]] = ()) -> None:
    """The command line of one figure script: --results, --figures and its own `options`
    (flag, argparse keywords), each passed to `make` by name."""
    import argparse

    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--figures", type=Path, default=FIGURES)
    for flag, keywords in options:
        parser.add_argument(flag, **keywords)
    for path in make(**vars(parser.parse_args())):
        print(f"wrote {path}")


__all__ = ["FIGURES", "RESULTS", "MissingResults", "new_figure", "save_figure"]

