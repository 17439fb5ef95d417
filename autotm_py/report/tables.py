"""`kernel_report`: per-kernel working set vs live footprint, repeated signatures, sweep bounds.

- A kernel's *working set* is what must sit in fast memory for it to run on a GPU: its distinct
  inputs and outputs plus its workspace. Its *live footprint* is every tensor alive at it.
- The largest working set is the smallest budget at which any GPU plan can exist; the peak
  footprint is the budget above which nothing needs to move. Budgets worth sweeping lie in
  [largest working set, peak footprint].
- Kernels with one signature (repeated blocks) share one profile; the table says how much of
  the iteration's time each signature takes, so a user sees where time and profiling go.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autotm_py.machine import working_sets
from autotm_py.units import format_bytes

if TYPE_CHECKING:
    from autotm_py.costs import KernelCosts
    from autotm_py.ir.graph import TensorGraph

KERNEL_COLUMNS = ("id", "name", "op", "working_set_bytes", "live_bytes", "working_share",
                  "time_s", "estimated")


def kernel_report(graph: TensorGraph, costs: KernelCosts | None = None, *,
                  top: int = 10, reserve_bytes: int = 0,
                  sweep_bytes: tuple[int, int] | None = None) -> dict[str, Any]:
    """Per-kernel rows, the `top` signatures by time (or count without costs), the bounds
    (budgets: with the runtime's `reserve_bytes` on top of the tensors; `sweep_bytes`, the
    planner's useful budgets where the caller has them: `api.useful_budgets`)."""
    ws = graph.working_set_bytes if costs is None else working_sets(graph, costs)
    live = graph.live_bytes
    rows = []
    for k in graph.kernels:
        rows.append({
            "id": k.id, "name": k.name, "op": k.op_type,
            "working_set_bytes": int(ws[k.id]), "live_bytes": int(live[k.id]),
            "working_share": float(ws[k.id] / live[k.id]) if live[k.id] else 1.0,
            "time_s": None if costs is None else costs.times_s[k.id],
            "estimated": None if costs is None else bool(costs.estimated[k.id]),
        })
    ws_kernel = int(ws.argmax()) if graph.kernels else -1
    ws_bytes = int(ws[ws_kernel]) if graph.kernels else 0
    return {
        "model": graph.name,
        "kernels": len(graph.kernels),
        "unique_signatures": graph.unique_signatures,
        "peak_footprint_bytes": graph.peak_live_bytes,
        "peak_kernel": graph.peak_kernel,
        "max_working_set_bytes": ws_bytes,
        "max_working_set_kernel": ws_kernel,
        "runtime_reserve_bytes": reserve_bytes,
        "sweep_bytes": list(sweep_bytes) if sweep_bytes is not None else
        [ws_bytes + reserve_bytes, graph.peak_live_bytes + reserve_bytes],
        "total_time_s": None if costs is None else costs.total_s,
        "estimated_kernels": None if costs is None else costs.n_estimated,
        "signatures": _signatures(graph, costs, top),
        "per_kernel": rows,
    }


def _signatures(graph: TensorGraph, costs: KernelCosts | None, top: int) -> list[dict[str, Any]]:
    groups: dict[str, list[int]] = {}
    for k in graph.kernels:
        groups.setdefault(k.signature, []).append(k.id)
    total = costs.total_s if costs is not None else 0.0
    out = []
    for sig, ids in groups.items():
        time_s = sum(costs.times_s[i] for i in ids) if costs is not None else None
        out.append({
            "signature": describe_signature(sig), "op": graph.kernels[ids[0]].op_type,
            "count": len(ids), "first_kernel": graph.kernels[ids[0]].name,
            "time_s": time_s,
            "time_share": (time_s / total) if time_s is not None and total > 0 else None,
        })
    out.sort(key=lambda r: (-(r["time_s"] or 0.0), -r["count"], r["signature"]))
    return out[:top]


def describe_signature(signature: str) -> str:
    """'Conv 32x64x56x56, 64x64x3x3 -> 32x64x56x56' from a kernel signature (JSON text)."""
    try:
        body = json.loads(signature)
        return f"{body['op']} {_shapes(body['in'])} -> {_shapes(body['out'])}"
    except (ValueError, KeyError, TypeError):
        return signature[:80]


def _shapes(slots: list[Any]) -> str:
    return ", ".join("x".join(str(d) for d in shape) or "scalar" for shape, _dtype in slots)


def render_kernel_report(report: Mapping[str, Any], *, limit: int = 20) -> str:
    """Plain text: the bounds, the top signatures, the kernels with the largest working sets."""
    lo, hi = report["sweep_bytes"]
    reserve, peak = report.get("runtime_reserve_bytes", 0), report["peak_footprint_bytes"]
    plus = f" + the {format_bytes(reserve)} runtime reserve" if reserve else ""
    bound = f"no GPU plan below this{plus}"
    if lo != report["max_working_set_bytes"] + reserve:  # the planner's, with more beside it
        bound = f"with the reserve and the arena's scratch, no GPU plan below {format_bytes(lo)}"
    lines = [
        f"{report['model']}: {report['kernels']} kernels, {report['unique_signatures']} unique "
        "signatures",
        f"peak footprint      {format_bytes(peak)} (at kernel #{report['peak_kernel']})",
        f"largest working set {format_bytes(report['max_working_set_bytes'])} "
        f"(kernel #{report['max_working_set_kernel']}): {bound}",
        f"useful budget sweep [{format_bytes(lo)}, {format_bytes(hi)}]"
        + (f" (with the reserve; budgets of {100 * lo / peak:.0f}% to "
           f"{100 * hi / peak:.0f}% of the peak)" if reserve and peak else
           f" (fast tier {100 * lo / hi:.0f}% to 100% of the peak)" if hi else ""),
        "", "most repeated signatures" + (" by time" if report["total_time_s"] else ""),
    ]
    for s in report["signatures"]:
        share = "" if s["time_share"] is None else f"  {100 * s['time_share']:5.1f}% of time"
        lines.append(f"  {s['count']:5d} x  {s['signature'][:70]}{share}")
    lines += ["", f"kernels with the largest working sets (top {limit})",
              f"  {'id':>5}  {'op':<18} {'working set':>12} {'live':>12} {'share':>6}  name"]
    biggest = sorted(report["per_kernel"], key=lambda r: (-r["working_set_bytes"], r["id"]))
    for r in biggest[:limit]:
        ws, live = format_bytes(r["working_set_bytes"]), format_bytes(r["live_bytes"])
        lines.append(f"  {r['id']:>5}  {r['op'][:18]:<18} {ws:>12} {live:>12} "
                     f"{100 * r['working_share']:5.1f}%  {r['name']}")
    return "\n".join(lines) + "\n"


def kernel_csv(report: Mapping[str, Any]) -> str:
    """One CSV row per kernel, columns `KERNEL_COLUMNS`."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=KERNEL_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in report["per_kernel"]:
        writer.writerow(row)
    return buf.getvalue()
