"""`autotm report` (figures, summary and trace of one plan) and `autotm bench` (sweeps)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from autotm_py import api
from autotm_py.bench import BenchSpec, key_of, run_bench, sweep_layout
from autotm_py.cli import cli, status
from autotm_py.cli.common import (
    ModelArgs,
    RunModeArgs,
    budget_parts,
    check_writable,
    gpu_option,
    headroom_option,
    json_option,
    load_model_from_cli,
    model_options,
    print_json,
    require,
    run_mode_options,
    warn,
)
from autotm_py.config import (
    DEFAULT_READ_PRICING,
    DEFAULT_SOLVER,
    DEFAULT_STRATEGY,
    DEFAULT_WRITE_PRICING,
    READ_PRICINGS,
    RECOMPUTE_MODES,
    WRITE_PRICINGS,
)
from autotm_py.errors import ConfigError
from autotm_py.plan import Plan, costs_drift
from autotm_py.report import load_measured, make_report, plot_values, values_lines
from autotm_py.units import format_bytes


def read_json(path: str, what: str) -> Any:
    """A JSON file, or a ConfigError that names it."""
    try:
        return json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{what} {path} is not valid JSON ({exc}); was it truncated?") from None


def _simulation_from_model(plan: Any, model: ModelArgs, device: str | None,
                           profiles: str | None) -> tuple[Any, dict[str, Any]]:
    graph = load_model_from_cli(model, plan=plan)
    dev = device or plan.header.device
    # priced as the plan was: the same GPU's profiles (`optimize --gpu`)
    gpu = plan.header.gpu if dev == plan.header.device else None
    costs = api.load_costs(graph, device=dev, profiles_dir=profiles, gpu=gpu)
    return graph, api.simulate(graph, plan, costs=costs, strict=False).to_dict()


@cli.command("report")
@click.argument("plan_path", metavar="PLAN", required=False)
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False), default="report",
              show_default=True, help="Folder for the figures, summary.md and report.json.")
@click.option("--timeline", type=click.Path(dir_okay=False), default=None,
              help="A saved simulation (`autotm simulate ... -o timeline.json`): time axis in "
                   "seconds. Without it (or --model, --simulate) the report shows plan order.")
@click.option("--simulate", "simulate_plan", is_flag=True,
              help="Simulate the plan on the model it records (a time axis in seconds), as "
                   "--model does with a model you name.")
@model_options(argument=False)
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default=None,
              help="With --model: whose kernel profiles to use (default: the plan's).")
@click.option("--profiles", type=click.Path(file_okay=False), default=None,
              help="With --model: profile folder (default: shipped and cached profiles).")
@click.option("--measured", type=click.Path(dir_okay=False), default=None,
              help="A measured run (`autotm run ... -o run.json`) to show beside the prediction.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None,
              help="Also write a Chrome/Perfetto trace (open in ui.perfetto.dev).")
@click.option("--format", "formats", default="png,svg", show_default=True,
              help="Figure formats, comma-separated (any matplotlib can write).")
@click.option("--max-tensors", type=click.IntRange(min=1), default=300, show_default=True,
              help="Rows of the residency heatmap (moved tensors first, then the largest).")
@click.option("--values", "values_path", type=click.Path(dir_okay=False), default=None,
              metavar="FILE", help="Instead of a plan: show a value profile (`autotm profile "
              "MODEL --values FILE`) as a table and a figure (values.png in -o).")
@json_option
def report_cmd(plan_path: str | None, out_dir: str, timeline: str | None,
               simulate_plan: bool, model: ModelArgs,
               device: str | None, profiles: str | None, measured: str | None,
               trace_path: str | None, formats: str, max_tensors: int,
               values_path: str | None, as_json: bool) -> None:
    """Figures (memory per tier with the budget, tensor x kernel residency, bytes moved), a
    Markdown summary and optionally a trace of PLAN.

    \b
    Examples:
      autotm report plan.json -o report/
      autotm report plan.json --simulate -o report/ --trace trace.json
      autotm report plan.json --timeline timeline.json --measured run.json -o report/
      autotm report --values values.json -o report/   (a value profile, docs/values.md)
    """

    if values_path:
        _values_report(values_path, out_dir, formats, as_json)
        return
    if plan_path is None:
        raise ConfigError("give a PLAN (or --values FILE)")
    if sum((bool(timeline), bool(model.model), simulate_plan)) > 1:
        raise ConfigError("give one of --timeline, --model and --simulate")
    check_writable(out_dir, "-o", directory=True)
    check_writable(trace_path, "--trace")
    plan = Plan.load(plan_path).check_complete()
    graph, simulation = None, None
    with status.busy("simulating the plan", as_json) as control:
        if model.model or simulate_plan:
            graph, simulation = _simulation_from_model(plan, model, device, profiles)
        elif timeline:
            simulation = read_json(timeline, "timeline")
        drift = _drift(plan, simulation)
        run = load_measured(read_json(measured, "measured run"), origin=measured) \
            if measured else None
        fmts = tuple(f.strip() for f in formats.split(",") if f.strip())
        control.report(stage="drawing the figures")
        result = make_report(plan, out_dir, graph=graph, simulation=simulation, measured=run,
                             trace_path=trace_path, formats=fmts, max_tensors=max_tensors,
                             origin={"timeline": timeline or "simulation",
                                     "measured": measured})
    if as_json:
        print_json({"files": [str(p) for p in result.files], "overview": result.overview,
                    "metrics": result.metrics, "costs_warning": drift})
    else:
        _print_report(result)
    if drift:
        warn(drift)


def _values_report(path: str, out_dir: str, formats: str, as_json: bool) -> None:
    """`report --values`: the value profile's table, and its figure in `out_dir`."""
    check_writable(out_dir, "-o", directory=True)
    doc = api.load_values(path)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    files = plot_values(doc, out_dir, tuple(f.strip() for f in formats.split(",") if f.strip()))
    if as_json:
        print_json({"files": [str(f) for f in files], "totals": doc.get("totals", {}),
                    "note": doc.get("note")})
        return
    for line in [*values_lines(doc), *(f"wrote {f}" for f in files)]:
        click.echo(line)


def _drift(plan: Any, simulation: Any) -> str | None:
    """The costs warning of a simulation (from --model, or a saved --timeline) of this plan."""
    if not isinstance(simulation, dict):
        return None
    total = simulation.get("total_s")
    return costs_drift(plan.header, str(simulation.get("costs_digest") or ""),
                       float(total) if isinstance(total, int | float) else None)


def _print_report(result: Any) -> None:

    o, m = result.overview, result.metrics
    budget = o["budget_bytes"]
    click.echo(f"{o['model']}: {o['strategy']} plan, budget "
               f"{'unlimited' if budget is None else format_bytes(budget)}, timeline "
               f"{o['timeline']}")
    if budget is not None and (o["reserve_bytes"] or o["headroom_bytes"]):
        tensors = budget - o["reserve_bytes"] - o["headroom_bytes"]
        click.echo("  budget = " + budget_parts(budget, o["reserve_bytes"], tensors))
    click.echo(f"  moved slow->fast {format_bytes(m['bytes_to_fast'])} "
               f"({m['moves_to_fast']} copies), fast->slow {format_bytes(m['bytes_to_slow'])} "
               f"({m['moves_to_slow']} copies)")
    click.echo(f"  kernel IO in fast memory: inputs {100 * m['input_fast_fraction']:.1f}%, "
               f"outputs {100 * m['output_fast_fraction']:.1f}%")
    if "prediction_error" in o:
        click.echo(f"  measured {o['measured_median_s'] * 1e3:.3f} ms, prediction error "
                   f"{100 * o['prediction_error']:+.1f}%")
    for path in result.files:
        click.echo(f"  wrote {path}")


def _split(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


@cli.command("bench")
@model_options(argument=False)
@click.option("--models", required=True,
              help="Comma-separated ONNX files or zoo names, e.g. resnet50,vgg19.")
@click.option("--ratios", required=True,
              help="Comma-separated fast:slow ratios, e.g. 1:8,1:4,1:1 (1:4 = fast tier holds "
                   "1/5 of the peak; the paper's PMM:DRAM 4:1).")
@click.option("--strategies", default=DEFAULT_STRATEGY, show_default=True,
              help="Comma-separated strategies, as `optimize --strategy`: static, sync, async "
                   "with --recompute (auto: on with --device cuda), or plan names that fix it: "
                   "sync+recompute, async+recompute, recompute-only. Rows are named by the plan "
                   "(async on cuda: async+recompute; move-only plans: --recompute off).")
@click.option("--recompute", type=click.Choice(RECOMPUTE_MODES), default="auto",
              show_default=True,
              help="As `optimize --recompute`, for the strategies that do not fix it.")
@click.option("--solvers", default=DEFAULT_SOLVER, show_default=True,
              help="Comma-separated: highs, cbc.")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True,
              help="cuda: GPU mode; cpu: host mode (DRAM + slow tier).")
@click.option("--memory", default=None,
              help="Memory-system preset or file (default: optane for cpu; for cuda the --gpu's "
                   "link where one is shipped, else h100-pcie5).")
@click.option("--time-limit", type=float, default=None,
              help="Solver time limit per plan, seconds (the best plan found is kept).")
@click.option("--gap", type=float, default=0.01, show_default=True, help="Relative MIP gap.")
@click.option("--pin-weights", is_flag=True, help="Keep weights in fast memory (the paper's rule).")
@click.option("--profiles", type=click.Path(file_okay=False), default=None,
              help="Profile folder (default: shipped and cached profiles).")
@click.option("--execute", is_flag=True,
              help="Also run every plan and baseline for real (GPU) and record measured times.")
@click.option("--iterations", type=click.IntRange(min=1), default=5, show_default=True,
              help="With --execute: timed iterations per plan.")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True,
              help="With --execute: untimed iterations before them.")
@headroom_option
@click.option("--fit", is_flag=True,
              help="With --execute: AutoTM's defragmentation loop. A plan (or capped baseline) "
                   "that runs out of memory under its cap, or makes the allocator retry, is "
                   "solved again with 5% more --headroom (up to 25%); the row records the "
                   "headroom that fit, or the fastest run when every headroom retried.")
@run_mode_options(scratch=True)
@click.option("--read-pricing", type=click.Choice(READ_PRICINGS),
              default=DEFAULT_READ_PRICING, show_default=True,
              help="How plans price the reads of moved tensors (`optimize --read-pricing`).")
@click.option("--write-pricing", type=click.Choice(WRITE_PRICINGS),
              default=DEFAULT_WRITE_PRICING, show_default=True,
              help="How plans price the writes of moved tensors (`optimize --write-pricing`).")
@click.option("--split-conv-grads", is_flag=True,
              help="Split every fused convolution backward kernel into its filter and data "
                   "parts, and every recurrent kernel into chunks, before "
                   "planning and running (`optimize --split-conv-grads on`); the "
                   "ratios divide the split graph's peak; rows are named +split.")
@gpu_option
@click.option("--plans", "plans_dir", type=click.Path(file_okay=False), default=None,
              help="Keep each solved plan in this folder (gzip-compressed JSON) and reuse "
                   "plans found there (solve on one machine, --execute on another).")
@click.option("-o", "--output", default="bench.csv", show_default=True,
              help="CSV to write; a JSON document with the same stem is written beside it. "
                   "Rows already there are skipped (the sweep resumes).")
@click.option("--engine", type=click.Choice(["local", "ray"]), default="local",
              show_default=True,
              help="local: worker processes on this machine; ray: tasks on a Ray cluster "
                   "(needs the ray extra).")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="local: worker processes (default: one per CPU, or one per GPU with "
                   "--execute on cuda; 1 runs in this process); ray: most cells in flight.")
@click.option("--address", default=None,
              help="With --engine ray: the cluster's head (HOST:PORT, or auto); without it a "
                   "Ray instance is started on this machine.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="Solver threads per plan; each cell takes this many CPUs (default 1).")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@json_option
def bench_cmd(model: ModelArgs, models: str, ratios: str, strategies: str, recompute: str,
              solvers: str, device: str, memory: str | None, time_limit: float | None,
              gap: float, pin_weights: bool, profiles: str | None, execute: bool,
              iterations: int, warmup: int, headroom: float, fit: bool, mode: RunModeArgs,
              read_pricing: str, write_pricing: str, split_conv_grads: bool,
              gpu: str | None, plans_dir: str | None,
              output: str, engine: str, workers: int | None,
              address: str | None, threads: int | None,
              no_progress: bool, as_json: bool) -> int:
    """Sweep models x ratios x strategies x solvers; one row per plan (CSV + JSON).

    \b
    Example:
      autotm bench --models resnet50,vgg19 --ratios 1:8,1:4,1:1 --strategies static,sync \\
          --device cpu --training --batch 16 -o results/bench.csv
      autotm bench ... --engine ray --address auto     (on the head of a Ray cluster)
    """

    if execute:
        require("torch", "autotm bench --execute")
    check_writable(output, "-o")
    check_writable(plans_dir, "--plans", directory=True)
    if model.model is not None:
        raise ConfigError("bench takes its models from --models (comma-separated), not --model")
    if execute and model.options.host_updates:
        raise ConfigError("--optimizer-on host with --execute: a bench run times the GPU's part "
                          "only, not the host's updates; bench without --execute, or train "
                          "through autotm_py.Trainer(..., optimizer_on='host')")
    spec = BenchSpec(models=_split(models), ratios=_split(ratios),
                     strategies=_split(strategies), recompute=recompute,
                     solvers=_split(solvers), device=device, memory=memory,
                     model=model.options.on(device),
                     time_limit_s=time_limit, gap=gap, pin_weights=pin_weights,
                     profiles_dir=profiles, execute=execute, iterations=iterations,
                     warmup=warmup, headroom=headroom, fit=fit, plans_dir=plans_dir,
                     threads=threads, run=mode.for_device(device), read_pricing=read_pricing,
                     write_pricing=write_pricing, gpu=gpu, split_conv_grads=split_conv_grads)
    if "channels_last" not in model.given:  # optimize's layout, for the whole sweep
        spec = replace(spec, model=sweep_layout(spec.models, spec.model, device=device, gpu=gpu,
                                                profiles_dir=profiles))
    where = {"engine": engine, "workers": workers, "address": address}
    if no_progress or as_json:
        result = run_bench(spec, output, **where)
    else:
        result = _bench_with_progress(spec, output, where)
    keys = {spec.row_key(*cell) for cell in spec.cells()}
    rows = [r for r in result.rows if key_of(r) in keys]  # this sweep's, not older ones
    if as_json:
        print_json({"ran": result.ran, "skipped": result.skipped, "failed": result.failed,
                    "files": [str(p) for p in result.paths], "rows": rows})
    else:
        for line in bench_table(rows):
            click.echo(line)
        click.echo(f"{result.ran} rows run, {result.skipped} already there, {result.failed} "
                   f"failed; wrote {result.paths[0]} and {result.paths[1]}")
    return _bench_exit(result.ran, result.failed)


EXIT_EVERY_ROW_FAILED = 1


def _bench_exit(ran: int, failed: int) -> int:
    """Non-zero when every row this sweep ran failed (a bad model name, a missing extra): a
    script must not take the sweep for a result. Some failed rows leave it 0 (their errors are
    in the rows)."""
    if ran and failed == ran:
        click.echo(f"error: every row failed ({failed} of {ran}); the error column says why",
                   err=True)
        return EXIT_EVERY_ROW_FAILED
    return 0


BENCH_BASELINES = (("first-touch", "first_touch_s"), ("lru", "lru_s"), ("offload", "offload_s"),
                   ("all-slow", "all_slow_s"), ("2lm", "2lm_s"))


def bench_table(rows: list[dict[str, Any]]) -> list[str]:
    """One line per row: the plan's predicted time against all-fast and the best baseline that
    fits (the CSV and JSON hold every column)."""
    wide = max([8, *(len(str(r.get("strategy"))) for r in rows)])  # async+recompute: 15
    head = (f"{'model':<14} {'ratio':>6} {'strategy':<{wide}} {'solver':<6} {'status':<10} "
            f"{'predicted':>13} {'vs all-fast':>11}  best baseline")
    lines = [head]
    for r in rows:
        ms = _ms(r.get("predicted_s"))
        slowdown = r.get("slowdown")
        fits = [(r[col], name) for name, col in BENCH_BASELINES
                if isinstance(r.get(col), int | float)]
        best = "-" if not fits else f"{min(fits)[1]} {_ms(min(fits)[0]).strip()}"
        if fits and isinstance(r.get("predicted_s"), int | float) and r["predicted_s"] > 0:
            best += f" ({min(fits)[0] / r['predicted_s']:.3f}x this plan)"
        status = str(r.get("status") or "-") if not r.get("error") else "error"
        lines.append(f"{str(r.get('model'))[:14]:<14} {r.get('ratio')!s:>6} "
                     f"{r.get('strategy')!s:<{wide}} {r.get('solver')!s:<6} {status:<10} "
                     f"{ms:>13} {_times(slowdown):>11}  "
                     + _last_cell(r, best))
    return lines


def _last_cell(row: dict[str, Any], best: str) -> str:
    """The best baseline; for an infeasible row the budget it needs and what forces it (the
    notes column has the whole message); for a failed row its error."""
    if row.get("error"):
        return str(row["error"])[:60]
    if row.get("status") == "infeasible" and row.get("min_feasible_budget_bytes"):
        return (f"needs {format_bytes(row['min_feasible_budget_bytes'])}: "
                f"{row.get('forced_by') or 'see notes'}")
    return best


def _ms(seconds: Any) -> str:
    return f"{seconds * 1e3:.3f} ms" if isinstance(seconds, int | float) else "-"


def _times(x: Any) -> str:
    return f"{x:.3f}x" if isinstance(x, int | float) else "-"


def _bench_with_progress(spec: Any, output: str, where: dict[str, Any]) -> Any:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    columns = (TextColumn("bench"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.description}"))
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task("", total=None)

        def update(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, description=label)

        return run_bench(spec, output, progress=update, **where)
