"""The value profile as a value profiler shows it (`autotm report --values`, docs/values.md):
totals per class, the largest redundant tensors, and one figure. Reads the JSON document of
`autotm profile --values` only (matplotlib inside `plot_values`)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from autotm_py.report.plots import byte_scale, new_figure, save_figure
from autotm_py.units import format_bytes

CLASS_ORDER = ("zero", "constant", "low-entropy", "varied", "unchanged")
REDUNDANT = ("zero", "constant", "low-entropy")
# one colour per class (Okabe-Ito), as the other report figures use it
CLASS_COLOURS = {"zero": "#0072B2", "constant": "#009E73", "low-entropy": "#E69F00",
                 "varied": "#999999", "unchanged": "#CC79A7"}


def redundant_rows(doc: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Tensors whose values are redundant (zero, constant, low-entropy), largest first."""
    rows = [r for r in doc.get("tensors", ()) if r.get("class") in REDUNDANT]
    return sorted(rows, key=lambda r: (-int(r["bytes"]), str(r["name"])))


def values_lines(doc: Mapping[str, Any], top: int = 15) -> list[str]:
    """The human table: what was run, totals per class, the `top` largest redundant tensors."""
    everything = sum(int(r["bytes"]) for r in doc.get("tensors", ()))
    lines = [f"values     {doc.get('model')}: {len(doc.get('tensors', ()))} tensors, "
             f"{format_bytes(everything)}, {doc.get('iterations')} iterations on "
             f"{doc.get('device')}; copy times at the link of {doc.get('memory')} (out + back)",
             f"weights    {doc.get('weights') or '-'}",
             f"note       {doc.get('note', '')}", "",
             f"{'class':<12} {'tensors':>7} {'bytes':>11} {'share':>6} {'copy out+back':>14}"]
    totals = doc.get("totals", {})
    for cls in CLASS_ORDER:
        t = totals.get(cls, {"tensors": 0, "bytes": 0, "copy_s": 0.0})
        share = t["bytes"] / everything if everything else 0.0
        lines.append(f"{cls:<12} {t['tensors']:>7} {format_bytes(t['bytes']):>11} "
                     f"{share:>6.1%} {t['copy_s'] * 1e3:>11.3f} ms")
    rows = redundant_rows(doc)
    lines += ["", f"largest redundant tensors ({min(top, len(rows))} of {len(rows)}):"]
    if not rows:
        lines.append("  none: every tensor held many distinct values")
    for r in rows[:top]:
        value = "" if r.get("value") is None else f" = {r['value']:g}"
        detail = value or f", {r.get('distinct')} distinct"
        lines.append(f"  {r['name']:<40} {r['role']:<15} {format_bytes(int(r['bytes'])):>11} "
                     f"{r['class']}{detail}{', unchanged' if r.get('unchanged') else ''}")
    fills = sum(1 for r in rows if r["class"] in ("zero", "constant"))
    if fills:
        lines += ["", f"{fills} zero or constant tensors: `autotm optimize ... --values FILE` "
                      "fills them instead of copying them (GPU mode)"]
    return lines


def plot_values(doc: Mapping[str, Any], out_dir: str | os.PathLike[str],
                formats: Sequence[str] = ("png", "svg"), top: int = 15) -> list[Path]:
    """`values.<fmt>`: bytes per class (left) and the largest redundant tensors (right)."""
    totals = doc.get("totals", {})
    fig, (left, right) = new_figure(11, 4.5, ncols=2, width_ratios=(1, 2))
    sizes = [float(totals.get(c, {}).get("bytes", 0)) for c in CLASS_ORDER]
    # log scale: a few KiB of masks beside hundreds of MiB of weights stay visible
    bars = left.bar(range(len(CLASS_ORDER)), [max(s, 1.0) for s in sizes],
                    color=[CLASS_COLOURS[c] for c in CLASS_ORDER])
    left.set_yscale("log")
    left.bar_label(bars, [format_bytes(s) for s in sizes], fontsize=7)
    left.set_xticks(range(len(CLASS_ORDER)), CLASS_ORDER, rotation=30)
    left.set_ylabel("bytes (log scale)")
    left.set_title("bytes per value class")
    rows = redundant_rows(doc)[:top][::-1]
    if rows:
        scale, unit = byte_scale(max(float(r["bytes"]) for r in rows))
        right.barh(range(len(rows)), [float(r["bytes"]) / scale for r in rows],
                   color=[CLASS_COLOURS[r["class"]] for r in rows])
        right.set_yticks(range(len(rows)), [str(r["name"])[-40:] for r in rows], fontsize=7)
        right.set_xlabel(f"bytes ({unit})")
    else:
        right.text(0.5, 0.5, "no redundant tensors", ha="center", va="center")
    right.set_title("largest redundant tensors (colour: class)")
    fig.suptitle(f"value profile of {doc.get('model')} ({doc.get('iterations')} iterations; "
                 "random weights unless the model file has its own)", fontsize=9)
    return save_figure(fig, out_dir, "values", formats)
