"""`autotm inspect MODEL`: what a model costs in memory before any planning.

Prints the kernels (total, unique signatures), tensors and bytes by role, the peak live
footprint and the kernel where it occurs, the largest kernel working set and its kernel, and
the useful budget interval [largest working set, peak]; `--csv FILE` writes every kernel's
working set beside the live footprint at that kernel, `--json` prints everything.
"""

from __future__ import annotations

import csv
import io
from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import click

from autotm_py import api
from autotm_py.cli import cli, status
from autotm_py.cli.common import (
    ModelArgs,
    RunModeArgs,
    check_writable,
    gpu_option,
    headroom_option,
    json_option,
    load_model_from_cli,
    model_options,
    priced,
    print_json,
    reserve_option,
    run_mode_options,
)
from autotm_py.config import DEFAULT_MEMORY, PlanConfig, default_memory
from autotm_py.errors import ConfigError
from autotm_py.fileio import atomic_write_text
from autotm_py.ir import TensorGraph, chunkable_logits_bytes
from autotm_py.machine import working_sets
from autotm_py.memory import MemorySystem, load_memory_system
from autotm_py.report import kernel_csv, kernel_report, render_kernel_report
from autotm_py.units import format_bytes, parse_bytes

if TYPE_CHECKING:
    from autotm_py.costs import KernelCosts
    from autotm_py.planning import Smallest

TOP_KERNELS = 8
CSV_FIELDS = ("id", "name", "op", "working_set_bytes", "live_bytes")


def _kernel_ref(graph: TensorGraph, kid: int) -> dict[str, Any]:
    k = graph.kernels[kid]
    return {"id": kid, "name": k.name, "op": k.op_type}


def inspect_report(graph: TensorGraph, memory: MemorySystem | None = None,
                   costs: KernelCosts | None = None,
                   budgets: tuple[Smallest, int] | None = None) -> dict[str, Any]:
    """Everything `autotm inspect` shows, as plain data (the `--json` document). Budgets are
    the user's, for `memory` (default: the GPU preset): its runtime reserve comes on top of
    the tensors' interval. With `costs` (the device's profiles), working sets count the
    measured kernel workspaces and aligned sizes, as the planner does. `budgets`
    (`api.useful_budgets`): the planner's smallest feasible budget for the run mode, with its
    parts, and the tensors' peak, so that the useful budgets are the ones `optimize` names."""
    memory = memory or load_memory_system(DEFAULT_MEMORY["cuda"])
    reserve = int(memory.runtime_reserve_bytes)
    ws = graph.working_set_bytes if costs is None else working_sets(graph, costs)
    live = graph.live_bytes
    ws_kernel = int(ws.argmax()) if graph.kernels else -1
    ws_bytes = int(ws[ws_kernel]) if graph.kernels else 0
    roles = {}
    counts = Counter(t.role for t in graph.tensors)
    for role, nbytes in sorted(graph.bytes_by_role().items(), key=lambda kv: kv[0].value):
        roles[role.value] = {"tensors": counts[role], "bytes": nbytes}
    kernels = [{**_kernel_ref(graph, k.id), "working_set_bytes": int(ws[k.id]),
                "live_bytes": int(live[k.id])} for k in graph.kernels]
    return {
        "model": graph.name,
        "source": graph.meta.get("source"),
        "training": "training" in graph.meta,
        "dropped_output": (graph.meta.get("training") or {}).get("dropped_output"),
        "head": _head(graph),  # the loss's language-model head and its chunks, or None
        "dims": graph.meta.get("dims", {}),
        "batch": graph.meta.get("batch"),
        "kernels": len(graph.kernels),
        "unique_kernels": graph.unique_signatures,
        "fused": graph.meta.get("fusion"),  # {"attention": n, ...}; None: --no-fuse
        "ops": dict(Counter(k.op_type for k in graph.kernels).most_common()),
        "tensors": len(graph.tensors),
        "roles": roles,
        "precision": graph.meta.get("precision", "fp32"),  # --precision (`ir.precision`)
        "dtypes": {dtype: {"tensors": n, "bytes": nbytes} for dtype, (n, nbytes)
                   in sorted(graph.bytes_by_dtype().items())},
        "peak_live_bytes": graph.peak_live_bytes,
        "peak_kernel": _kernel_ref(graph, graph.peak_kernel) if graph.kernels else None,
        "max_working_set_bytes": ws_bytes,
        "max_working_set_kernel": _kernel_ref(graph, ws_kernel) if graph.kernels else None,
        # the plain loss's logits where they set the largest working set (--loss-chunks)
        "max_working_set_logits_bytes": chunkable_logits_bytes(graph, ws_kernel)
        if graph.kernels else None,
        "memory_system": memory.name,
        "runtime_reserve_bytes": reserve,
        **_intervals(budgets, ws_bytes, graph.peak_live_bytes, reserve),
        "model_hash": graph.model_hash,
        "per_kernel": kernels,
    }


def _intervals(budgets: tuple[Smallest, int] | None, ws_bytes: int, peak: int,
               reserve: int) -> dict[str, Any]:
    """The tensors' useful interval and the budgets it means (with `budgets`, the planner's:
    its smallest feasible budget, whose parts `smallest_budget` keeps)."""
    if budgets is None:
        return {"tensor_interval_bytes": [ws_bytes, peak],
                "budget_interval_bytes": [ws_bytes + reserve, peak + reserve],
                "smallest_budget": None}
    least, peak = budgets
    return {"tensor_interval_bytes": [least.plan_bytes, peak],
            "budget_interval_bytes": [least.budget_bytes, least.budget_for(peak)],
            "smallest_budget": least.to_dict()}


def _dtypes(report: dict[str, Any]) -> str:
    """The precision and the bytes in each dtype, largest first: `bf16 (bfloat16 1.2 GiB in
    310 tensors, float32 ...)`."""
    rows = sorted(report["dtypes"].items(), key=lambda kv: -kv[1]["bytes"])
    parts = [f"{d} {format_bytes(r['bytes'])} in {r['tensors']} "
             f"tensor{'s' if r['tensors'] != 1 else ''}" for d, r in rows]
    return f"{report['precision']} ({', '.join(parts)})"


def _text(report: dict[str, Any]) -> str:
    peak, wsk = report["peak_kernel"], report["max_working_set_kernel"]
    lines = [
        f"model        {report['model']}" + (" (training iteration)" if report["training"]
                                             else " (forward)"),
        f"dims         {_dims(report['dims'], report['batch'])}",
        f"kernels      {report['kernels']} ({report['unique_kernels']} unique signatures)",
        f"fused        {_fused(report['fused'])}",
        f"tensors      {report['tensors']}",
        f"precision    {_dtypes(report)}",
        *([f"loss         on the logits: the final {d['op']} {d['name']!r} dropped"]
          if (d := report.get("dropped_output")) else []),
        *_head_line(report.get("head")),
        "",
        f"  {'role':<16} {'tensors':>8} {'bytes':>12}",
    ]
    for role, row in report["roles"].items():
        lines.append(f"  {role:<16} {row['tensors']:>8} {format_bytes(row['bytes']):>12}")
    lines += [
        "",
        f"peak live    {format_bytes(report['peak_live_bytes'])} at kernel #{peak['id']} "
        f"{_short(peak['name'])} ({peak['op']})",
        f"largest WS   {format_bytes(report['max_working_set_bytes'])} at kernel #{wsk['id']} "
        f"{_short(wsk['name'])} ({wsk['op']})",
        *_logits_line(report.get("max_working_set_logits_bytes")),
        *_budget_lines(report),
        "",
        *_top_kernels(report),
    ]
    return "\n".join(lines)


def _head(graph: TensorGraph) -> dict[str, Any] | None:
    """The head a training graph's loss reads where `--loss-chunks` applies to it
    (`ir/heads.py`), with the number of blocks its loss is computed in (1: the plain loss)."""
    meta = graph.meta.get("training") or {}
    head = meta.get("head")
    return None if head is None else {**head, "chunks": int(meta.get("loss_chunks", 1))}


def _head_line(head: dict[str, Any] | None) -> list[str]:
    """With --loss-chunks: which head the chunked loss replaced (--json has it either way)."""
    if head is None or head["chunks"] < 2:
        return []
    return [f"head         {head['text']}, chunked in {head['chunks']}"]


def _logits_line(logits: int | None) -> list[str]:
    if logits is None:
        return []
    return [f"             set by the loss's logits ({format_bytes(logits)}): --loss-chunks 16 "
            "lowers it (docs/training.md)"]


def _budget_lines(report: dict[str, Any]) -> list[str]:
    """The useful budgets (with the reserve and, in an arena run, the scratch region, saying
    so), the kernel that sets the smallest, and the ratios they mean."""
    lo, hi = report["budget_interval_bytes"]
    reserve, peak = report["runtime_reserve_bytes"], report["peak_live_bytes"]
    least = report.get("smallest_budget") or {}
    extra = _overheads(reserve, least)
    run = _run_words(report.get("run"))
    lines = [f"budget       [{format_bytes(lo)}, {format_bytes(hi)}]: useful fast-memory budgets "
             f"on {report['memory_system']}" + ("" if run else ", with its" if extra else "")]
    if run:
        lines.append(f"             {run}" + (", with its" if extra else ""))
    if extra:
        t_lo, t_hi = report["tensor_interval_bytes"]
        lines += [*(f"             {text}" for text in extra),
                  f"             on top of the tensors' [{format_bytes(t_lo)}, "
                  f"{format_bytes(t_hi)}]:"]
    below = "below the largest working set no plan exists" if not least else \
        "every budget has a plan (kernels may use the slow tier)" if not lo else \
        f"below the lower end (kernel #{least['kernel']}) no plan exists"
    lines.append(f"             {below}, at the peak everything fits")
    share = lo / peak if peak else 0.0
    if share >= 1:
        lines += [f"ratios       none but 1:0: --ratio F:S gives F/(F+S) of the peak "
                  f"{format_bytes(peak)}, below the lower end;",
                  "             give --fast-mem" + (" or a smaller --reserve" if reserve else "")]
    elif extra:
        lines.append(f"ratios       --ratio F:S gives F/(F+S) of the peak {format_bytes(peak)}: "
                     f"below 1:{(1 - share) / share:.3g} ({100 * share:.0f}%) no plan exists")
    return lines


def _overheads(reserve: int, least: dict[str, Any]) -> list[str]:
    """What every budget gives up before the tensors: the runtime reserve and an arena run's
    scratch region."""
    out = [f"{format_bytes(reserve)} runtime reserve (the runtime's own memory, out of every "
           "budget; --reserve)"] if reserve else []
    if least.get("scratch_bytes"):
        out.append(f"{'and ' if out else ''}{format_bytes(least['scratch_bytes'])} scratch "
                   f"region of the arena (kernel #{least['scratch_kernel']}'s scratch; --scratch "
                   "windows)")
    return out


def _run_words(run: dict[str, Any] | None) -> str:
    """For which run mode the budgets are (an arena run keeps scratch beside the tensors)."""
    if not run:
        return ""
    if not run.get("arena"):
        return "for plans without an arena (--arena)"
    scratch = "scratch windows" if run.get("windows") else "a scratch region"
    return f"for arena plans with {scratch} (--no-arena, --scratch)"


def _top_kernels(report: dict[str, Any]) -> list[str]:
    """The kernels with the largest working sets, beside the live footprint there."""
    lines = [f"largest working sets (of {report['kernels']} kernels; all of them with --csv):",
             f"  {'#':>5} {'kernel':<40} {'op':<18} {'working set':>12} {'live':>12}"]
    top = sorted(report["per_kernel"], key=lambda r: -r["working_set_bytes"])[:TOP_KERNELS]
    for row in top:
        lines.append(f"  {row['id']:>5} {_short(row['name'], 40):<40} {row['op'][:18]:<18} "
                     f"{format_bytes(row['working_set_bytes']):>12} "
                     f"{format_bytes(row['live_bytes']):>12}")
    return lines


def _fused(counts: dict[str, int] | None) -> str:
    if counts is None:
        return "off (--no-fuse, or a graph not imported from ONNX)"
    return ", ".join(f"{n} {kind}" for kind, n in counts.items())


def _dims(dims: dict[str, int], batch: int | None) -> str:
    text = " ".join(f"{k}={v}" for k, v in dims.items())
    if batch is not None and batch not in dims.values():
        text += f" (--batch {batch}: first dim of every input)"
    return text.strip() or "(all fixed in the file)"


def _short(name: str, width: int = 48) -> str:
    return name if len(name) <= width else "..." + name[-(width - 3):]


def write_csv(path: str, report: dict[str, Any]) -> None:
    """One row per kernel: id, name, op, working set bytes, live bytes (written atomically)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for row in report["per_kernel"]:
        writer.writerow({k: row[k] for k in CSV_FIELDS})
    try:
        atomic_write_text(path, buffer.getvalue())
    except OSError as exc:
        raise ConfigError(f"--csv {path}: cannot write it ({exc.strerror or exc}); give a "
                          "path in a writable folder") from None


def print_kernel_report(graph: TensorGraph, device: str, csv_path: str | None,
                        as_json: bool, reserve_bytes: int = 0, gpu: str | None = None,
                        config: PlanConfig | None = None) -> None:
    """`autotm inspect MODEL --kernels [DEVICE]`: print the report (and write the CSV). With
    `config`, its useful budgets are the planner's for it, as the summary's are."""
    costs = api.load_costs(graph, device=device, gpu=gpu)
    sweep = None
    if config is not None:
        least, peak = api.useful_budgets(graph, config, costs=costs)
        sweep = (least.budget_bytes, least.budget_for(peak))
    report = kernel_report(graph, costs, reserve_bytes=reserve_bytes, sweep_bytes=sweep)
    if csv_path:
        atomic_write_text(csv_path, kernel_csv(report))
    if as_json:
        print_json(report)
        return
    click.echo(render_kernel_report(report), nl=False)
    if report["estimated_kernels"]:
        click.echo(f"({report['estimated_kernels']} kernels have no {device} profile: their "
                   "times are roofline estimates)")
    if csv_path:
        click.echo(f"per-kernel table written to {csv_path}")


def _budget_config(system: MemorySystem, mode: RunModeArgs, headroom: float, memory: str | None,
                   gpu: str | None) -> PlanConfig:
    """The planning options the useful budgets are for: `optimize`'s with the same flags."""
    device = "cuda" if system.mode == "gpu" else "cpu"
    return PlanConfig(memory=memory, gpu=gpu, run=mode.for_device(device), headroom=headroom,
                      device=device, reserve_bytes=system.runtime_reserve_bytes)


def _report_for(graph: TensorGraph, system: MemorySystem, costs: KernelCosts,
                config: PlanConfig) -> dict[str, Any]:
    """`inspect_report` with the planner's useful budgets for `config` (`optimize`'s)."""
    report = inspect_report(graph, system, costs, api.useful_budgets(graph, config, costs=costs))
    if system.mode == "gpu":
        report["run"] = {**config.run.to_dict(), "windows": config.run.windows}
    return report


@cli.command("inspect")
@model_options
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), default=None,
              help="Write per-kernel working set and live bytes to this CSV file.")
@click.option("--kernels", "kernels_device", type=click.Choice(["cuda", "cpu"]), default=None,
              is_flag=False, flag_value="cuda", metavar="[cuda|cpu]",
              help="Kernel report instead: working set vs live bytes per kernel, the most "
                   "repeated signatures and their share of the device's profiled time "
                   "(default cuda).")
@click.option("--memory", default=None, metavar="PRESET|FILE",
              help="Memory system whose runtime reserve the useful budgets include [default: "
                   "the --gpu's link, else h100-pcie5; optane with --kernels cpu] (host-mode "
                   "presets keep none).")
@reserve_option
@headroom_option
@run_mode_options(scratch=True)
@gpu_option
@json_option
def inspect_command(model: ModelArgs, csv_path: str | None, as_json: bool, mode: RunModeArgs,
                    kernels_device: str | None = None, memory: str | None = None,
                    reserve: str | None = None, gpu: str | None = None,
                    headroom: float = 0.0) -> None:
    """Kernels, tensors by role, peak footprint and working sets of MODEL.

    MODEL is an ONNX file or a zoo name. The peak live footprint is the memory one iteration
    needs with no limit; the largest working set (a kernel's inputs + outputs + workspace),
    with the runtime reserve (and an arena run's scratch), is the smallest fast-memory budget
    any plan can meet: the figure `optimize` names for a smaller budget with the same options.
    """
    check_writable(csv_path, "--csv")
    system = load_memory_system(memory or default_memory(kernels_device or "cuda", gpu))
    if reserve is not None:
        system = replace(system, runtime_reserve_bytes=parse_bytes(reserve, flag="--reserve"))
    with status.busy("loading the model", as_json) as control:
        device = kernels_device or ("cuda" if system.mode == "gpu" else "cpu")
        graph = load_model_from_cli(model, device=device)  # its precision: the device's
        if not kernels_device:
            control.report(stage="pricing the kernels")
            graph, costs = priced(model, graph, device, gpu=gpu)  # optimize's layout
            control.report(stage="working sets and budgets")
            report = _report_for(graph, system, costs,
                                 _budget_config(system, mode, headroom, memory, gpu))
    if kernels_device:  # the kernel table of autotm_py/report/tables.py
        return print_kernel_report(graph, kernels_device, csv_path, as_json,
                                   system.runtime_reserve_bytes, gpu,
                                   _budget_config(system, mode, headroom, memory, gpu)
                                   if kernels_device == "cuda" else None)
    if csv_path:
        write_csv(csv_path, report)
    if as_json:
        print_json(report)
    else:
        click.echo(_text(report))
        if csv_path:
            click.echo(f"\nper-kernel table written to {csv_path}")


__all__ = ["inspect_command", "inspect_report", "write_csv"]
