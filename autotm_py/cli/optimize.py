"""`autotm optimize` (solve the placement ILP, write a plan) and `autotm simulate` (predict and
verify a plan's timeline).

Exit codes: 0 success (also a plan found by the time limit or kept after Ctrl-C, marked as
such); 1 error (bad plan, solver failure); 2 bad option; 3 the budget is infeasible (below the
smallest feasible budget, which is printed with the kernel forcing it) or no plan was found
within --time-limit; 130 Ctrl-C before any plan was found; 143 SIGTERM (nothing written).
"""

from __future__ import annotations

from typing import Any

import click

from autotm_py import api
from autotm_py.cli import cli, status
from autotm_py.cli.common import (
    ModelArgs,
    RunModeArgs,
    budget_parts,
    check_writable,
    fast_peak_line,
    gpu_option,
    headroom_option,
    json_option,
    load_model_from_cli,
    load_priced,
    model_options,
    print_json,
    reserve_option,
    run_mode_options,
    warn,
)
from autotm_py.config import (
    DEFAULT_ASYNC_CANDIDATES,
    DEFAULT_ASYNC_WINDOW,
    DEFAULT_GAP,
    DEFAULT_READ_PRICING,
    DEFAULT_RECOMPUTE_DEPTH,
    DEFAULT_RECOMPUTE_EARLY,
    DEFAULT_RECOMPUTE_RATIO,
    DEFAULT_SOLVER,
    DEFAULT_STRATEGY,
    DEFAULT_TIME_LIMIT_S,
    DEFAULT_WRITE_PRICING,
    PLAN_NAMES,
    READ_PRICINGS,
    RECOMPUTE_MODES,
    SPLIT_MODES,
    UPDATE_ORDERS,
    WRITE_PRICINGS,
    PlanConfig,
)
from autotm_py.errors import ConfigError
from autotm_py.fileio import atomic_write_text
from autotm_py.ir import has_convolutions, is_channels_last
from autotm_py.machine import working_sets
from autotm_py.plan import Plan, costs_drift
from autotm_py.planning import SOLVERS, SolveControl, handle_signals
from autotm_py.units import format_bytes, parse_bytes, parse_ratio

EXIT_INFEASIBLE = 3
EXIT_INTERRUPTED = 130  # Ctrl-C before any plan was found (the shell's 128 + SIGINT)
# How `wrote FILE` marks a plan that is not proven within the gap (its header says so too)
WROTE_NOTE = {"interrupted": " (the best plan found before the stop)",
              "time_limit": " (the best plan found within the time limit)"}

RATIO_HELP = (
    "Fast:slow capacity, e.g. 1:4 = the fast tier holds 1/5 of the model's unconstrained peak "
    "footprint (the rest lives in the slow tier); 1:0 = all fast (no limit); 0:1 = all slow. "
    "The AutoTM paper writes ratios the other way round, as PMM:DRAM (its 4:1 is our 1:4).")


@cli.command("optimize")
@model_options
@click.option("--ratio", default=None, metavar="F:S", help=RATIO_HELP)
@click.option("--fast-mem", default=None, metavar="BYTES",
              help="Absolute fast-tier budget instead of --ratio, e.g. 16GiB or 512MB.")
@click.option("--strategy", type=click.Choice(PLAN_NAMES), default=DEFAULT_STRATEGY,
              show_default=True, metavar="NAME",
              help="static: one tier per tensor; sync: blocking copies around uses; async: "
                   "copies also overlap kernels. Recompute as --recompute says, or fixed by "
                   "sync+recompute, async+recompute, recompute-only.")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default="cuda",
              show_default=True, help="cuda: GPU mode (kernels need fast IO); cpu: host mode "
                                      "(kernels may touch the slow tier). Picks the profiles.")
@click.option("--memory", default=None, metavar="PRESET|FILE",
              help="Memory system: optane, cxl, h100-pcie5, h200-pcie5, or a JSON file "
                   "(autotm calibrate). Default: the --gpu's link where one is shipped, else "
                   "h100-pcie5 for cuda; optane for cpu.")
@click.option("--solver", type=click.Choice(SOLVERS), default=DEFAULT_SOLVER,
              show_default=True,
              help="MILP solver: highs (HiGHS, in-process); cbc (ships with PuLP, much slower "
                   "on async plans); gurobi or cplex where installed and licensed.")
@click.option("--gap", type=float, default=DEFAULT_GAP, show_default=True,
              help="Relative MIP gap at which the solver stops (0.01 = 1%).")
@click.option("--time-limit", default=f"{DEFAULT_TIME_LIMIT_S:g}", show_default=True,
              metavar="SECONDS|none", callback=lambda _c, _p, v: parse_time_limit(v),
              help="Wall seconds for the whole search; then the best plan found is returned, "
                   "marked as such. 0 or none: no limit (a search that may recompute keeps "
                   "180 s). Ctrl-C also stops the search and "
                   "keeps the best plan found so far.")
@click.option("--async-window", type=click.IntRange(min=0), default=DEFAULT_ASYNC_WINDOW,
              show_default=True, help="Kernels around each use where async copies may run.")
@click.option("--async-candidates", default=str(DEFAULT_ASYNC_CANDIDATES), show_default=True,
              metavar="N|all", callback=lambda _c, _p, v: _candidates(v),
              help="Async: how many kernels of each window may host a copy (the longest "
                   "ones); 'all' makes every kernel of the window a decision point (a larger "
                   "ILP, slightly better plans).")
@click.option("--recompute", type=click.Choice(RECOMPUTE_MODES), default="auto",
              show_default=True,
              help="Whether a tensor may be dropped and regenerated by re-running its forward "
                   "kernel before a backward use. on: keep, move or recompute, one ILP (plan "
                   "'<strategy>+recompute'); off: keep or move (AutoTM's plans, 'move-only'); "
                   "only: keep or recompute, nothing is copied ('recompute-only'); auto: on "
                   "with --device cuda, off with --device cpu or --strategy static.")
@click.option("--recompute-depth", type=click.IntRange(min=1), default=DEFAULT_RECOMPUTE_DEPTH,
              show_default=True,
              help="Longest chain of regenerations for one use (2: a regenerated tensor's input "
                   "may itself be regenerated first). Deeper chains: a larger ILP.")
@click.option("--recompute-ratio", type=click.FloatRange(min=0, min_open=True),
              default=DEFAULT_RECOMPUTE_RATIO, show_default=True,
              help="A forward kernel may be re-run when its time is at most this times the "
                   "time to copy its outputs out and back (smaller: fewer candidates, a "
                   "smaller ILP; recompute-only plans take every reproducible forward kernel).")
@click.option("--recompute-early", type=click.IntRange(min=0), default=DEFAULT_RECOMPUTE_EARLY,
              show_default=True,
              help="Also let a tensor be regenerated within this many backward kernels "
                   "before its first backward use (at most 8 points, on a grid beyond 8), so "
                   "that a chain is re-run link by link and each link kept until its use, as "
                   "checkpointing re-runs a segment. The search starts them from a "
                   "checkpoint-style plan and keeps them only where that plan is 5%% faster "
                   "than the one without (the plan's notes say which). 0: regenerate only "
                   "right before a use. Larger: a larger ILP.")
@click.option("--read-pricing", type=click.Choice(READ_PRICINGS), default=DEFAULT_READ_PRICING,
              show_default=True,
              help="How the ILP prices an overlapped read: step: against the kernel it is "
                   "issued beside (AutoTM's model, whose objective bounds the predicted time "
                   "from above); spread: over the kernels from that one to the tensor's next "
                   "use, where the executor waits for it (an estimate, not a bound; a larger "
                   "ILP).")
@click.option("--write-pricing", type=click.Choice(WRITE_PRICINGS),
              default=DEFAULT_WRITE_PRICING, show_default=True,
              help="How the ILP prices an overlapped write: step: against the kernel it is "
                   "issued beside, its source freed after that kernel; spread: over the "
                   "kernels after it until their time covers the copy, its source kept in "
                   "fast memory as long (docs/planning.md).")
@click.option("--split-conv-grads", type=click.Choice(SPLIT_MODES), default="auto",
              show_default=True,
              help="Split a fused convolution backward kernel (ConvGrad: dY, X, W -> dX, dW) "
                   "into ConvGradFilter then ConvGradData, which never hold X and dX together "
                   "(about one launch more on a GPU), and a recurrent layer or its gradient "
                   "kernel (LSTM, LSTMGrad, GRU, GRUGrad) into chunks of its sequence run in "
                   "turn, and a convolution or those parts whose measured workspace is too "
                   "large into chunks of the batch. auto: the ones whose working set the "
                   "budget cannot hold, with the fewest chunks that fit, where that makes an "
                   "infeasible budget feasible; on: "
                   "every one; off: none. The plan's notes say so; run and simulate rebuild "
                   "the split from the plan.")
@click.option("--update-order", type=click.Choice(UPDATE_ORDERS), default="auto",
              show_default=True,
              help="Where a training graph's optimizer updates run. end: after the whole "
                   "backward pass, as torch.optim's step() runs them; early: in groups as soon "
                   "as their gradients are final, so gradients and optimizer state need not "
                   "all be in fast memory at the end; auto: early under a budget below the "
                   "peak. run and simulate rebuild the order from the plan (docs/planning.md).")
@click.option("--pin-weights", is_flag=True,
              help="The paper's rule: inputs, weights and optimizer state stay in fast "
                   "memory, outside the budget.")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="Solver threads.")
@headroom_option
@reserve_option
@run_mode_options(scratch=True)
@gpu_option
@click.option("--profiles", "profiles_dir", type=click.Path(file_okay=False), default=None,
              help="Profile cache directory (default: $AUTOTM_PROFILES or ~/.cache/autotm).")
@click.option("--no-baselines", is_flag=True, help="Skip planning the baselines.")
@click.option("--values", "values_path", type=click.Path(dir_okay=False), default=None,
              metavar="FILE", help="A value profile (`autotm profile MODEL --values FILE`): "
              "GPU mode drops its zero and constant tensors for free and fills them again "
              "before a use instead of copying them (docs/values.md).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write the plan here (JSON).")
@json_option
def optimize_cmd(model: ModelArgs, ratio: str | None, fast_mem: str | None, strategy: str,
                 device: str, memory: str | None, solver: str, gap: float,
                 time_limit: float | None, async_window: int,
                 async_candidates: int | None, recompute: str, recompute_depth: int,
                 recompute_ratio: float, recompute_early: int, read_pricing: str,
                 write_pricing: str, split_conv_grads: str, update_order: str,
                 pin_weights: bool,
                 threads: int | None, headroom: float, reserve: str | None, mode: RunModeArgs,
                 gpu: str | None, profiles_dir: str | None, no_baselines: bool,
                 values_path: str | None, output: str | None, as_json: bool) -> int:
    """Plan where every tensor of MODEL lives and when it moves, within a fast-memory budget.

    MODEL is an ONNX file or a zoo name. Prints the predicted time against all-fast and the
    baselines, bytes moved, the fast-tier peak and the solver's statistics. Ctrl-C keeps (and
    writes) the best plan found so far; a second Ctrl-C stops at once. Exit code 3: the
    budget is infeasible (the smallest feasible budget is printed).

    On a GPU the defaults give the fastest plans (async, recompute, arena, CUDA-graph
    replay, channels-last where profiled), which `autotm run` runs so; --strategy sync,
    --no-arena and --no-replay give portable ones.
    """

    check_writable(output, "-o")
    config = PlanConfig(
        strategy=strategy, ratio=parse_ratio(ratio) if ratio else None,
        fast_mem_bytes=parse_bytes(fast_mem) if fast_mem else None, device=device,
        memory=memory, solver=solver, gap=gap, time_limit_s=time_limit,
        async_window=async_window, async_candidates=async_candidates,
        pin_weights=pin_weights, threads=threads, headroom=headroom, recompute=recompute,
        recompute_depth=recompute_depth, recompute_ratio=recompute_ratio,
        recompute_early=recompute_early, read_pricing=read_pricing,
        write_pricing=write_pricing,
        reserve_bytes=parse_bytes(reserve, flag="--reserve") if reserve is not None else None,
        run=mode.for_device(device), gpu=gpu, split_conv_grads=split_conv_grads,
        update_order=update_order,
        fills=api.value_fills(api.load_values(values_path)) if values_path else ())
    config = api.for_this_gpu(config)  # the link of the GPU here, if any
    control = SolveControl(time_limit_s=time_limit)
    with status.StatusLine(control, status.wanted(as_json)):
        control.report(stage="loading the model")
        graph, costs = load_priced(model, device, gpu=gpu, profiles_dir=profiles_dir)
        with handle_signals(control):
            result = api.optimize(graph, config, costs=costs, baselines=not no_baselines,
                                  control=control)
    if result.plan is not None and output:
        result.plan.save(output)
    if as_json:
        print_json({**result.to_dict(), "plan_file": output if result.plan else None,
                    "notes": list(result.plan.header.notes) if result.plan else []})
    else:
        for line in summary_lines(graph, result, config, costs,
                                  asked="channels_last" in model.given):
            click.echo(line)
        if result.plan is not None and output:
            click.echo(f"wrote {output}{WROTE_NOTE.get(result.status, '')}")
        elif result.status == "interrupted":
            click.echo("interrupted before any plan was found: nothing written", err=True)
    if result.plan is not None:
        return 0
    return EXIT_INTERRUPTED if result.status == "interrupted" else EXIT_INFEASIBLE


def parse_time_limit(value: str | float | None) -> float | None:
    """--time-limit: positive seconds; 0 or 'none' for no limit."""
    if value is None or str(value).strip().lower() in ("none", "0", "0.0", "inf"):
        return None
    try:
        seconds = float(value)
    except ValueError:
        raise ConfigError(f"--time-limit {value!r}: seconds, e.g. 300, or none for no "
                          "limit") from None
    if seconds < 0:
        raise ConfigError(f"--time-limit {value!r}: must be >= 0 seconds (0 or none: no "
                          "limit)")
    return seconds or None


def _candidates(value: str) -> int | None:
    if value == "all":
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"--async-candidates {value!r}: a positive number or 'all'") from None


def summary_lines(graph: Any, result: Any, config: Any, costs: Any,
                  asked: bool = False) -> list[str]:
    """The human summary of `autotm optimize` (`asked`: the layout was given by flag)."""

    s = graph.summary()
    lines = [f"model      {s['name']}: {s['kernels']} kernels, {s['tensors']} tensors, peak "
             f"{format_bytes(s['peak_live_bytes'])}, largest working set "
             f"{format_bytes(int(working_sets(graph, costs).max(initial=0)))}"]
    if costs.n_estimated:
        lines.append(f"costs      {costs.n_estimated} of {len(costs.times_s)} kernel times "
                     "are roofline estimates (no profile)")
    if costs.n_precision_scaled:
        lines.append(f"costs      {costs.n_precision_scaled} of {len(costs.times_s)} kernel "
                     "times are bf16 kernels priced from fp32 profiles (roofline ratio)")
    lines += _layout_lines(graph, config, asked)
    budget = "none (all fast)" if result.budget_bytes is None else \
        format_bytes(result.budget_bytes)
    how = f" (ratio {config.ratio})" if config.ratio is not None else ""
    lines.append(f"budget     {budget}{how}, plan {config.plan_name} (strategy "
                 f"{config.strategy}, recompute {config.recompute_mode}), memory "
                 f"{config.memory_name}")
    if result.budget_bytes is not None:
        lines.append("           = " + budget_parts(result.budget_bytes, result.reserve_bytes,
                                                     result.plannable_bytes,
                                                     result.scratch_bytes))
    if result.plan is None:
        lines.append(f"result     {result.message}")
        borrowed = costs.borrowed_note()  # a plan's notes say it; without a plan, this line
        return lines + ([f"note       {borrowed}"] if borrowed else [])
    lines += _plan_lines(result)
    lines += _run_lines(result.plan, config)
    lines += _baseline_lines(result)
    return lines


def _run_lines(plan: Any, config: Any) -> list[str]:
    """GPU mode: how the plan runs, which is how it was priced and how `autotm run` runs it
    (its header's `run`)."""
    if config.device != "cuda":
        return []
    mode = plan.header.run
    arena = mode.arena and plan.arena is not None
    parts = [("arena at planned addresses", arena),
             ("placed outputs", arena and mode.places_outputs),
             ("scratch windows", arena and mode.windows),
             ("CUDA-graph replay", mode.replay)]
    words = ", ".join(w for w, on in parts if on) or "eager, on torch's caching allocator"
    return [f"run        {words} (how `autotm run` runs it)"]


def _layout_lines(graph: Any, config: Any, asked: bool) -> list[str]:
    """GPU mode, a CNN: which layout its convolutions run in, and why: the flag given
    (`asked`), else whether the profiles have its channels-last kernels (`api.default_layout`;
    without them the line names the layout that is faster on a GPU once profiled)."""
    if config.device != "cuda" or not has_convolutions(graph):
        return []
    last = is_channels_last(graph)
    if asked:
        return [f"layout     convolution images stored {'N, H, W, C' if last else 'N, C, H, W'} "
                f"(--{'' if last else 'no-'}channels-last)"]
    if last:
        return ["layout     convolution images stored N, H, W, C, as the profiles have them "
                "(--no-channels-last for N, C, H, W)"]
    return ["layout     convolution images stored N, C, H, W; --channels-last is faster on a "
            "GPU once profiled (docs/layout.md)"]


def _plan_lines(result: Any) -> list[str]:

    st = result.stats
    counts = result.plan.header.counts
    fast, slow = _moved(counts, "fast"), _moved(counts, "slow")
    lines = [f"predicted  {result.predicted_time_s * 1e3:.3f} ms per iteration, "
             f"{result.slowdown:.3f}x all-fast ({result.all_fast_time_s * 1e3:.3f} ms)"]
    lines.append(f"moved      to fast {format_bytes(sum(fast))} (sync {format_bytes(fast[0])}, "
                 f"async {format_bytes(fast[1])}); to slow {format_bytes(sum(slow))} (sync "
                 f"{format_bytes(slow[0])}, async {format_bytes(slow[1])})")
    lines.append(f"recomputed {float(counts.get('recompute_s', 0.0)) * 1e3:.3f} ms: "
                 f"{int(counts.get('recomputes', 0))} kernel re-runs regenerating "
                 f"{format_bytes(int(counts.get('recomputed_bytes', 0)))}")
    if counts.get("fills"):
        lines.append(f"filled     {int(counts['fills'])} fills of zero or constant tensors "
                     f"writing {format_bytes(int(counts.get('filled_bytes', 0)))} (no copies; "
                     "--values)")
    lines.append(fast_peak_line(result.fast_peak_bytes or 0, result.budget_bytes,
                                result.reserve_bytes, result.plannable_bytes))
    if st.solver != "none":
        gap = "-" if st.gap is None else f"{st.gap * 100:.2f}%"
        # the objective is the status line's last figure: the ILP's estimate, not `predicted`
        objective = "" if st.objective_s is None else f"objective {st.objective_s * 1e3:.3f} ms, "
        lines.append(f"solver     {st.solver}: {st.status}, {objective}gap {gap}, "
                     f"{st.variables} variables, {st.constraints} constraints, build "
                     f"{st.build_s:.2f} s, solve {st.solve_s:.2f} s")
    lines += [f"note       {n}" for n in result.plan.header.notes]
    return lines


def _moved(counts: Any, tier: str) -> tuple[int, int]:
    return (int(counts.get(f"bytes_to_{tier}_sync", 0)),
            int(counts.get(f"bytes_to_{tier}_async", 0)))


def _baseline_lines(result: Any) -> list[str]:

    if not result.baselines:
        return []
    plan_s, fast_s = result.predicted_time_s, result.all_fast_time_s
    lines = ["", f"{'plan':<12} {'time (ms)':>10} {'vs all-fast':>12} {'plan speedup':>13}  "
                 "tensors' fast peak"]
    lines.append(f"{'this plan':<12} {plan_s * 1e3:>10.3f} {plan_s / fast_s:>11.3f}x "
                 f"{1.0:>12.3f}x")
    for name, b in result.baselines.items():
        if b.time_s is None:
            lines.append(f"{name:<12} {'-':>10} {'-':>12} {'-':>13}  {b.message}")
            continue
        status = "" if b.feasible else "  over budget"
        lines.append(f"{name:<12} {b.time_s * 1e3:>10.3f} {b.time_s / fast_s:>11.3f}x "
                     f"{b.time_s / plan_s:>12.3f}x  {format_bytes(b.fast_peak_bytes or 0)}"
                     f"{status}")
    return lines


@cli.command("simulate")
@model_options(optional=True)
@click.option("--plan", "plan_path", required=True, type=click.Path(dir_okay=False),
              help="A plan written by `autotm optimize -o`.")
@click.option("--profiles", "profiles_dir", type=click.Path(file_okay=False), default=None,
              help="Profile cache directory (default: $AUTOTM_PROFILES or ~/.cache/autotm).")
@click.option("--no-strict", is_flag=True,
              help="Report every rule the plan breaks instead of stopping at the first.")
@click.option("--gpu", default=None, metavar="NAME",
              help="Price the plan with this GPU's profiles (h100, h200) to predict it on that "
                   "GPU [default: the GPU the plan was priced for, `gpu` in its header].")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write the timeline (per-kernel and per-move times, memory curve) as JSON.")
@json_option
def simulate_cmd(model: ModelArgs, plan_path: str, profiles_dir: str | None, no_strict: bool,
                 gpu: str | None, output: str | None, as_json: bool) -> int:
    """Predict a plan's timeline on MODEL and verify it (residency, budget, order, steady
    state). Exits 1 naming the first record that breaks a rule. MODEL may be left out: the
    plan records the model it was made for."""
    import json

    check_writable(output, "-o")
    plan = Plan.load(plan_path)
    with status.busy("loading the model", as_json) as control:
        graph = load_model_from_cli(model, plan=plan)
        control.report(stage="pricing the kernels")
        costs = api.load_costs(graph, device=plan.header.device, profiles_dir=profiles_dir,
                               gpu=gpu or plan.header.gpu)
        control.report(stage="simulating the plan")
        sim = api.simulate(graph, plan, costs=costs, strict=not no_strict)
    # priced on purpose for another GPU than the plan's: its costs differ, that is no drift
    drift = None if gpu and costs.target != plan.header.gpu else \
        costs_drift(plan.header, sim.costs_digest, sim.total_s)
    if output:
        atomic_write_text(output, json.dumps(sim.to_dict()) + "\n")
    if as_json:
        print_json({**sim.to_dict(), "costs_warning": drift})
    else:
        for line in simulation_lines(sim):
            click.echo(line)
        if output:
            click.echo(f"wrote {output}")
    if drift:
        warn(drift)
    return 0 if sim.ok else 1


def simulation_lines(sim: Any) -> list[str]:
    """The human summary of `autotm simulate`."""

    moved = sum(sim.bytes_moved.values())
    peak = fast_peak_line(sim.fast_peak_bytes, sim.budget_bytes, sim.reserve_bytes,
                          sim.plannable_bytes).removeprefix("fast peak  ")
    lines = [f"plan       {sim.model_name}, strategy {sim.strategy}, {sim.mode} mode",
             f"predicted  {sim.total_s * 1e3:.3f} ms per iteration, {sim.slowdown:.3f}x "
             f"all-fast ({sim.all_fast_s * 1e3:.3f} ms)",
             f"memory     fast peak {peak}",
             f"           slow peak {format_bytes(sim.slow_peak_bytes)}; pinned "
             f"{format_bytes(sim.pinned_bytes)}",
             f"moves      {len(sim.moves)} moves, {format_bytes(moved)}",
             f"recomputed {sim.recompute_s * 1e3:.3f} ms: {len(sim.recomputes)} kernel "
             f"re-runs regenerating {format_bytes(sum(r.bytes for r in sim.recomputes))}"]
    if sim.ok:
        lines.append("verified   every record obeys residency, budget, order and steady state")
    else:
        lines.append(f"violations {len(sim.violations)}:")
        lines += [f"  {v}" for v in sim.violations[:20]]
    return lines
