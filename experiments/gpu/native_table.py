"""Markdown tables from native_compare.py results: whole iterations, then per aten op.

    python3 experiments/gpu/native_table.py experiments/results/native/*.json [--top 8]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

MIB = 2**20


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.1f}"


def mib(value: int | None) -> str:
    return "-" if value is None else f"{value / MIB:.0f}"


def iteration_table(rows: list[dict]) -> list[str]:
    out = ["| model | native eager ms (MiB) | ours all-fast ms (MiB) | ours host ms | "
           "ours/native | ours, CUDA graph ms (MiB) | graph/native | graph in an arena ms | "
           "our kernels under autograd ms (MiB) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        n, o = r["native_eager"], r["ours"]
        out.append(f"| {r['model']} b{r['batch']}{_dims(r)} | {ms(n.get('median_s'))} "
                   f"({_native_memory(n)}) | {ms(o['executor_all_fast_s'])} "
                   f"({mib(o['executor_peak_bytes'])}) | {ms(o['executor_host_s'])} | "
                   f"{_ratio(o['executor_all_fast_s'], n.get('median_s'))} | "
                   f"{ms(o.get('graph_s'))} ({_graph_memory(o)}) | "
                   f"{_ratio(o.get('graph_s'), n.get('median_s'))} | "
                   f"{ms(o.get('graph_arena_s'))} | {ms(o['autograd_s'])} "
                   f"({mib(o['autograd_peak_bytes'])}) |")
    return out


def _graph_memory(ours: dict) -> str:
    """A replay allocates nothing, so its allocated peak says little: the memory reserved
    while it replays where it was recorded (results from before: the allocated peak)."""
    reserved = ours.get("graph_reserved_bytes")
    return f"{mib(reserved)} reserved" if reserved else f"{mib(ours.get('graph_peak_bytes'))} alloc"


def _native_memory(native: dict) -> str:
    """Allocated peak, and reserved where recorded (results from before: allocated only), to
    set beside the replay's reserved memory."""
    reserved = native.get("reserved_peak_bytes")
    allocated = mib(native.get("peak_bytes"))
    return f"{allocated}, {mib(reserved)} reserved" if reserved else allocated


def _ratio(ours: float | None, native: float | None) -> str:
    """`-` where either run is missing (results from before the graph column: no graph run)."""
    return "-" if not ours or not native else f"{ours / native:.2f}x"


def checkpoint_table(rows: list[dict]) -> list[str]:
    out = ["| model | budget | native checkpointing ms (segments) | our graph checkpointed ms "
           "(segments) |", "|---|---|---|---|"]
    for r in rows:
        for share, budget in r["budgets"].items():
            n = r["native_checkpoint"].get(share) or {}
            o = (r["ours"]["checkpoint"] or {}).get(share) or {}
            out.append(f"| {r['model']} | {float(share):.0%} ({mib(budget)} MiB) | "
                       f"{_fit(n)} | {_fit(o)} |")
    return out


def _fit(run: dict) -> str:
    if not run or run.get("median_s") is None:
        return "does not fit"
    return f"{ms(run['median_s'])} ({run.get('segments')})"


def _dims(r: dict) -> str:
    return "".join(f" {k}={v}" for k, v in r["dims"].items())


def op_table(row: dict, top: int) -> list[str]:
    ops = row.get("ops") or {}
    native = sum(v["native_s"] for v in ops.values())
    ours = sum(v["ours_s"] for v in ops.values())
    out = [f"{row['model']}: GPU time of one iteration, native {ms(native)} ms, ours "
           f"{ms(ours)} ms", "", "| aten op | native ms | ours ms |", "|---|---|---|"]
    for name, v in list(ops.items())[:top]:
        out.append(f"| {name} | {ms(v['native_s'])} | {ms(v['ours_s'])} |")
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args()
    rows = [r for f in args.files for r in json.loads(f.read_text())]
    print("\n".join(iteration_table(rows)), "\n")
    print("\n".join(checkpoint_table(rows)), "\n")
    for r in rows:
        if r.get("ops"):  # runs with --no-ops have none
            print("\n".join(op_table(r, args.top)), "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
