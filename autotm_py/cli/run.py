"""`autotm run`: execute a plan for real with torch and measure it (GPU), or check its results
on the CPU."""

from __future__ import annotations

from dataclasses import replace

import click

from autotm_py import api, pipeline
from autotm_py.cli import cli
from autotm_py.cli.common import (
    ModelArgs,
    RunModeArgs,
    check_writable,
    json_option,
    load_model_from_cli,
    model_options,
    print_json,
    require,
    run_mode_options,
    warn,
)
from autotm_py.fileio import atomic_write_text
from autotm_py.ir import offloaded_updates
from autotm_py.options import SOURCE_META_KEY, Measure, check_run
from autotm_py.plan import Plan, costs_drift
from autotm_py.units import format_bytes


@cli.command("run")
@model_options(optional=True)
@click.option("--plan", "plan_path", required=True, type=click.Path(dir_okay=False),
              help="The plan to execute (from `autotm optimize -o`).")
@click.option("--device", default="cuda", show_default=True,
              help="cuda (or cuda:N) to measure on a GPU; cpu to check results on the CPU.")
@click.option("--iterations", type=click.IntRange(min=1), default=5, show_default=True,
              help="Timed iterations (the median is reported).")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True,
              help="Untimed iterations first.")
@click.option("--kernel-times", is_flag=True, help="Also time every kernel (CUDA events).")
@click.option("--no-cap", is_flag=True,
              help="Do not cap GPU memory at the plan's budget (for the all-fast reference).")
@run_mode_options(scratch=False, of_plan=True)
@click.option("--device-busy", is_flag=True,
              help="CUDA: profile one more iteration (torch profiler) and report how long the "
                   "GPU worked in it (kernels, copies, memsets on any stream): the iteration "
                   "time over it shows how long the GPU waited for the host.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the random values of the inputs, and of the weights a file has no "
                   "data for.")
@click.option("--random-weights", is_flag=True,
              help="Seeded random weights even where the ONNX file has its own (times and "
                   "memory do not depend on the values).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write the measurements here (JSON; `autotm report --measured` reads it).")
@json_option
def run_cmd(model: ModelArgs, plan_path: str, device: str, iterations: int, warmup: int,
            kernel_times: bool, no_cap: bool, mode: RunModeArgs, device_busy: bool, seed: int,
            random_weights: bool, output: str | None, as_json: bool) -> int:
    """Run PLAN on MODEL (default: the model the plan records; the same model options as
    `optimize`, default the plan's) and report measured times.

    The plan runs as it was made to (its header's run mode: on a GPU by default at planned
    addresses in an arena and replayed as a CUDA graph; on the CPU without the replay);
    --no-arena, --no-replay and the like override it. On a GPU the plan's fast budget is
    enforced as a cap on torch's allocator; the measured peak (max_memory_allocated) and
    reserved peak are printed beside the modelled one, with the host's enqueue time and the
    allocator's retries at the cap (if it retried or ran out of memory on torch's allocator,
    run it in an arena, or re-plan with `--headroom`)."""
    import json

    require("torch", "autotm run")
    check_writable(output, "-o")
    plan = Plan.load(plan_path)
    # before the costs' lookup first uses CUDA (what could not be set, the run's notes say)
    measure = Measure(iterations=iterations, warmup=warmup, seed=seed, capped=not no_cap,
                      kernel_times=kernel_times, device_busy=device_busy)
    # the plan's run mode as this device can run it (eagerly with per-kernel events, which
    # split the iteration), the flags given over it; where scratch lies is the plan's arena's
    recorded = replace(plan.header.run.on(device), scratch="auto")
    mode = mode.over(replace(recorded, replay=False) if kernel_times else recorded)
    check_run(device, mode, measure)
    api.prepare_cuda_process(plan, device, mode, capped=not no_cap)
    graph = load_model_from_cli(model, plan=plan)
    costs = api.load_costs(graph, device=plan.header.device)
    now = api.simulate(graph, plan, costs=costs, strict=False)
    drift = costs_drift(plan.header, costs.digest, now.total_s, gpu_now=costs.target)
    masters, weights = (None, f"seeded random values (--seed {seed}, --random-weights)") \
        if random_weights else pipeline.initial_values(graph, graph.meta[SOURCE_META_KEY], seed)
    result = api.execute(graph, plan, device=device, mode=mode, measure=measure, costs=costs,
                         masters=masters)
    notes = {"estimated_kernels": _estimated(plan, costs), "kernels": len(graph.kernels),
             "weights": weights, "costs_warning": drift,
             "tiers": pipeline.run_tier_note(plan, device),
             "host_updates": _host_note(graph, now)}
    if output:
        atomic_write_text(output, json.dumps(result.to_dict(), indent=1))
    if as_json:
        print_json({**result.to_dict(), **notes})
    else:
        _print_summary(result, notes)
    if drift:
        warn(drift)
    return 0


def _host_note(graph, predicted) -> str | None:
    """What a run of a plan whose optimizer updates are the host's (`ir.host_updates`) does
    not measure: this runs the GPU's part only (the Trainer runs the updates)."""
    if not predicted.host_update_s:
        return None
    return (f"{len(offloaded_updates(graph))} optimizer updates are the host's: this run times "
            "the GPU's part of the iteration only (the Trainer runs them); the prediction "
            f"includes their {predicted.host_update_s * 1e3:.3f} ms of work, the last ending at "
            f"{predicted.host_end_s * 1e3:.3f} ms")


def _estimated(plan: Plan, costs) -> int:
    """Kernel times of the plan's prediction that were roofline estimates, not measurements."""
    return plan.header.costs.estimated if plan.header.costs is not None else costs.n_estimated


def _print_summary(result, notes) -> None:

    def size(n: int | None) -> str:
        return "-" if n is None else format_bytes(n)

    predicted = "-" if result.predicted_time_s is None else \
        f"{result.predicted_time_s * 1e3:.3f} ms"
    if notes["estimated_kernels"] and result.predicted_time_s is not None:
        predicted += (f" ({notes['estimated_kernels']} of {notes['kernels']} kernel times in it "
                      "are roofline estimates, not measurements)")
    click.echo(f"model {result.model_name}, plan {result.strategy}, {result.device_name}")
    click.echo(f"iteration: median {result.median_s * 1e3:.3f} ms over {result.iterations} "
               f"(warm-up {result.warmup}); predicted {predicted}")
    click.echo(f"fast memory: measured peak {size(result.peak_fast_bytes)} allocated, "
               f"{size(result.reserved_peak_bytes)} reserved; modelled "
               f"{size(result.modelled_peak_fast_bytes)}, budget {size(result.budget_bytes)}, "
               f"cap {size(result.cap_bytes)}; pinned pool {size(result.slow_pool_bytes)}")
    if result.arena_bytes is not None:
        allocated = "" if result.placed_outputs is None else \
            f", {result.placed_outputs} allocated there by their kernels"
        click.echo(f"arena: {size(result.arena_bytes)} of tensors at planned offsets; "
                   f"{result.copied_outputs} outputs per iteration copied into their slots"
                   + allocated + ("; CUDA graph replayed" if result.replayed else ""))
    elif result.replayed:
        click.echo("CUDA graph replayed with static inputs (no arena): outputs where torch put "
                   f"them; {result.copied_outputs} carried values per iteration copied back "
                   "into the inputs' buffers")
    for note in result.notes:
        if note.startswith(("no CUDA graph", "no arena", "outputs copied", "the plan was made",
                            "scratch beyond its window", "requests beyond the cap")):
            click.echo(f"note: {note}")
    if result.alloc_retries is not None:  # CUDA: on the CPU the host does the work itself
        click.echo(f"host: enqueueing an iteration took {result.host_median_s * 1e3:.3f} ms "
                   f"(median); allocator retries at the cap: {result.alloc_retries}")
    if result.device_busy_s:
        click.echo(f"device: busy {result.device_busy_s * 1e3:.3f} ms of a profiled "
                   f"iteration's {result.device_span_s * 1e3:.3f} ms span (kernels "
                   f"{result.device_kernel_s * 1e3:.3f} ms summed); median iteration / busy = "
                   f"{result.median_s / result.device_busy_s:.3f}x")
    _print_notes(result, notes)


def _print_notes(result, notes) -> None:
    """The run's notes and hints, after its figures."""
    click.echo(f"weights: {notes['weights']}")
    for key in ("tiers", "host_updates"):
        if notes.get(key):
            click.echo(f"note: {notes[key]}")
    if result.alloc_retries and result.placed_outputs is not None:
        click.echo("hint: under the placed allocator a retry is a request its region (the cap) "
                   "could not serve, taken from outside the budget: a kernel allocated more "
                   "than the plan's scratch region holds; re-plan with --no-placed")
    elif result.alloc_retries:
        click.echo("hint: each retry frees the allocator's cache and synchronizes the GPU; "
                   "re-plan with --headroom 0.05 or 0.1 to leave room for fragmentation")
