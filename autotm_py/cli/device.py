"""`autotm profile` and `autotm calibrate`: measurements on a real device.

(`autotm run`, which executes a plan on the GPU, belongs in this module too.)
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import click

from autotm_py import api
from autotm_py.cli import cli
from autotm_py.cli.common import (
    ModelArgs,
    check_writable,
    json_option,
    load_model_from_cli,
    model_options,
    print_json,
    require,
)
from autotm_py.errors import ConfigError
from autotm_py.fileio import atomic_write_text
from autotm_py.profiling import MiB
from autotm_py.report import values_lines
from autotm_py.units import parse_bytes

DEVICES = click.Choice(["cpu", "cuda"])


@cli.command("profile")
@model_options
@click.option("--device", type=DEVICES, default="cpu", show_default=True,
              help="Where to measure: this CPU, or the CUDA GPU of this machine.")
@click.option("--profiles", "profiles_dir", type=click.Path(file_okay=False), default=None,
              help="Profile cache directory [default: $AUTOTM_PROFILES, else "
                   "~/.cache/autotm/profiles]. Shipped profiles/ are always read too.")
@click.option("--repeats", type=click.IntRange(min=1), default=10, show_default=True,
              help="Timed runs per kernel (fewer for a kernel slower than its time budget).")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True,
              help="Untimed runs per kernel before timing.")
@click.option("--max-seconds", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Stop measuring after this long; run again to resume.")
@click.option("--fresh", is_flag=True, help="Re-measure kernels that are already cached.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="torch's CPU thread count while measuring [default: torch's own].")
@click.option("--in-context", is_flag=True,
              help="CUDA: after isolated timing, time every kernel inside whole all-fast "
                   "iterations (the graph must fit on the GPU) and keep those times.")
@click.option("--split-conv-grads", is_flag=True,
              help="Also measure the graph with its fused convolution backward kernels split "
                   "into their filter and data parts and its recurrent kernels in each "
                   "power-of-two count of chunks (`optimize --split-conv-grads`), so "
                   "plans that split them are priced with their own times.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option("--values", "values_out", type=click.Path(dir_okay=False), default=None,
              metavar="FILE", help="Instead of timing kernels: run all-fast iterations and "
              "write each tensor's value classes (zero, constant, low-entropy, unchanged) "
              "here (JSON; docs/values.md).")
@click.option("--iterations", type=click.IntRange(min=1), default=3, show_default=True,
              help="With --values: iterations to observe.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="With --values: seed of the random inputs and weights (as `autotm run`).")
@json_option
def profile_cmd(model: ModelArgs, device: str, profiles_dir: str | None, repeats: int,
                warmup: int, max_seconds: float | None, fresh: bool, threads: int | None,
                in_context: bool, split_conv_grads: bool, no_progress: bool,
                values_out: str | None, iterations: int, seed: int, as_json: bool) -> None:
    """Measure the kernels of MODEL on a device and cache their times.

    Identical kernels (repeated blocks) are measured once; kernels already cached for this
    device are not measured again, so an interrupted run resumes where it stopped.
    With --values FILE, profile the tensors' values instead (docs/values.md).
    """
    require("torch", "autotm profile")
    graph = load_model_from_cli(model, device=device)  # in the device's precision by default
    if values_out:
        _profile_values(graph, device, iterations, seed, values_out, as_json)
        return
    # the split graphs' costs (their parts, their recurrent kernels in each count of batch
    # chunks the planner may choose) after the graph's own
    for g in [graph, *(api.split_variants(graph) if split_conv_grads else [])]:
        costs = api.profile(g, device=device, profiles_dir=profiles_dir, repeats=repeats,
                            warmup=warmup, max_seconds=max_seconds, resume=not fresh,
                            threads=threads, progress=not (no_progress or as_json))
        if in_context:
            summary = costs.summary
            costs = api.profile_in_context(g, device=device, profiles_dir=profiles_dir)
            costs = replace(costs, summary={**costs.summary, **{k: summary[k] for k in
                                            ("measured_now", "seconds", "cache_file")
                                            if k in summary}, "in_context": True})
    if as_json:
        print_json(_profile_json(graph.name, costs))
        return
    for line in profile_lines(costs.summary, costs.total_s):
        click.echo(line)


def _profile_values(graph: Any, device: str, iterations: int, seed: int, output: str,
                    as_json: bool) -> None:
    """`profile --values`: the value profile of `graph`, written to `output`, shown."""
    check_writable(output, "--values")
    doc = api.profile_values(graph, device=device, iterations=iterations, seed=seed)
    atomic_write_text(output, json.dumps(doc, indent=1) + "\n")
    if as_json:
        print_json(doc)
        return
    for line in [*values_lines(doc), f"wrote {output}"]:
        click.echo(line)


def profile_lines(summary: dict[str, Any] | Any, total_s: float) -> list[str]:
    """The human summary of a profiling run."""
    s = dict(summary)
    measured_now = int(s.get("measured_now", 0))
    lines = [f"{s['kernels']} kernels, {s['unique']} unique, {measured_now} measured now, "
             "rest from cache"]
    detail = f"kernel times: {s['exact']} measured"
    if s.get("scaled"):
        detail += f", {s['scaled']} scaled from another batch"
    if s.get("estimated"):
        detail += f", {s['estimated']} estimated (roofline)"
    lines.append(f"{detail}; one iteration sums to {total_s * 1e3:.3f} ms")
    failed = s.get("failed") or ()
    if failed:
        lines.append(f"warning: {len(failed)} kernels could not be profiled (see -v): "
                     f"{', '.join(list(failed)[:5])}{' ...' if len(failed) > 5 else ''}")
    if s.get("cache_file"):
        lines.append(f"cache: {s['cache_file']} ({s.get('seconds', 0):.1f} s)")
    return lines


def _profile_json(name: str, costs: Any) -> dict[str, Any]:
    return {"model": name, "device": costs.device, "source": costs.source,
            "summary": dict(costs.summary), "total_s": costs.total_s,
            "times_s": list(costs.times_s), "p10_s": list(costs.p10_s),
            "p90_s": list(costs.p90_s), "estimated": list(costs.estimated),
            "scaled": list(costs.scaled)}


@cli.command("calibrate")
@click.option("--device", type=DEVICES, default="cuda", show_default=True,
              help="The GPU whose host<->device link to measure (cuda only).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default="memory.json",
              show_default=True, help="Memory-system JSON to write (use with --memory).")
@click.option("--repeats", type=click.IntRange(min=1), default=5, show_default=True,
              help="Timed copies per size and kind.")
@click.option("--max-size", type=str, default="1GiB", show_default=True,
              help="Largest copy; sizes go from 1 MiB up by factors of 4.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@json_option
def calibrate_cmd(device: str, output: str, repeats: int, max_size: str, no_progress: bool,
                  as_json: bool) -> None:
    """Measure pinned/pageable copy bandwidth, both directions at once, copies under compute
    and pinned-allocation cost; write a GPU-mode memory-system file."""
    require("torch", "autotm calibrate")
    sizes = _sizes_up_to(parse_bytes(max_size, flag="--max-size"))
    memory = api.calibrate(device=device, sizes=sizes, repeats=repeats,
                           progress=not (no_progress or as_json))
    atomic_write_text(output, json.dumps(memory.to_dict(), indent=1, default=str) + "\n")
    if as_json:
        print_json(memory.to_dict())
        return
    link = memory.link
    click.echo(f"{memory.measured.get('device', device)}: pinned H2D {link.read_bw / 1e9:.1f} "
               f"GB/s, D2H {link.write_bw / 1e9:.1f} GB/s, both ways "
               f"{(link.both_directions_bw or 0) / 1e9:.1f} GB/s; under compute H2D "
               f"{link.async_read_bw / 1e9:.1f}, D2H {link.async_write_bw / 1e9:.1f} GB/s")
    click.echo(f"wrote {output} (use it with --memory {output})")


def _sizes_up_to(max_bytes: int) -> tuple[int, ...]:

    if max_bytes < MiB:
        raise ConfigError(f"--max-size {max_bytes} bytes: must be at least 1MiB")
    sizes, size = [], MiB
    while size <= max_bytes:
        sizes.append(size)
        size *= 4
    return tuple(sizes)
