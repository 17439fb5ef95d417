"""Planned addresses and CUDA-graph replay on the GPU, beside all-fast and native PyTorch
(issue 14 item 3), in one process and one device command of a few minutes.

For each model (ResNet-200 b32, BERT-base b16 s512, DenseNet-264 b32 by default):

- native eager: torchvision / HF model, fp32, SGD (as experiments/gpu/native_compare.py);
- all-fast on torch's caching allocator (our executor, uncapped), then all-fast at planned
  addresses, eager and replayed as a CUDA graph (its buffers packed into an arena, uncapped);
- this GPU's costs of the model: every kernel timed inside all-fast iterations
  (`profile_in_context`) and its device time under the torch profiler; the plans below are
  predicted again on them (they were solved on the CPU machine with the shipped profiles);
- every arena plan of the model in --plans (`MODEL_RATIO_arena.json.gz`, priced for eager runs,
  and `MODEL_RATIO_arena_graph.json.gz`, priced for CUDA-graph replay; solved with
  experiments/gpu/plan_arena.sh), each under its cap at planned addresses eagerly and replayed as
  a CUDA graph, and the eager-priced plan also on torch's caching allocator under the cap.

Each row: the measured median iteration time, allocated and reserved peaks against the budget
and the cap, allocator retries, the host's enqueue time, outputs copied into their slots,
whether a CUDA graph was replayed (or the note naming the kernel whose capture failed), and
three predictions: the one recorded when the plan was solved, the simulator on the shipped
profiles of this checkout, and the simulator on this GPU's costs (`predicted_gpu_s`), with the
errors of the last two. An eager-priced plan replayed as a graph is predicted as a graph.

Usage (GPU machine, repository root; PuLP is not needed):
  bash experiments/gpu/arena_check.sh OUT_DIR        # this script with the defaults below
  python3 experiments/gpu/arena_check.py OUT_DIR [--models resnet200,bert_base,densenet264]
      [--plans experiments/plans/arena] [--iterations 5] [--warmup 2] [--deadline 420]
      [--no-native] [--no-profile] [--device cuda] [--oom-snapshot]
Writes OUT_DIR/arena_check.json after every row (rows, and per model this GPU's kernel-time
sums), OUT_DIR/profiles/ (the in-context profile, for `autotm profile` caches or to ship) and
OUT_DIR/device_times.json (seconds by kernel id of the all-fast iteration, per model;
experiments/gpu/import_device_times.py reads one model's list). A run that would start after
--deadline seconds is recorded as skipped, so the command ends in time.

`--device cpu` is a smoke test of the script (no cap, no graphs, no native or profiles; the
graph rows record the ConfigError), e.g. with tiny plans:
  autotm optimize resnet50 --training --batch 2 --ratio 1:1 --strategy sync --arena \
      --no-baselines -o /tmp/plans/resnet50_1-1_arena.json.gz   (and ..._arena_graph with --replay)
  python3 experiments/gpu/arena_check.py /tmp/out --plans /tmp/plans --models resnet50 \
      --device cpu --iterations 1 --warmup 1
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

PLANS = ROOT / "experiments" / "plans" / "arena"
NAME = re.compile(r"^(?P<model>.+)_(?P<ratio>\d+-\d+)_arena(?P<graph>_graph)?\.json\.gz$")
# model -> (batch, dims) of experiments/gpu/configs.sh, for models without plans
SHAPES = {"resnet200": (32, {}), "densenet264": (32, {}), "bert_base": (16, {"seq": 512}),
          "gpt2_small": (8, {"seq": 1024}), "resnet50": (32, {})}
NATIVE = ("resnet200", "densenet264", "bert_base", "gpt2_small", "resnet50")  # native_compare's
DEFAULT_MODELS = "resnet200,bert_base,densenet264"


def run_mode(arena: bool = False, replay: bool = False):
    """The row's run mode: `api.execute` without the placed allocator (outputs copied into
    their slots, as this script has always run them)."""
    from autotm_py.options import RunMode

    return RunMode(arena=arena, placed=False, replay=replay)


class Check:
    """The rows so far, the deadline, and where they go."""

    def __init__(self, out: Path, args: argparse.Namespace) -> None:
        self.out, self.args = out, args
        self.started = time.perf_counter()
        self.rows: list[dict] = []
        self.models: dict[str, dict] = {}
        self.device_times: dict[str, list[float]] = {}

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def late(self) -> bool:
        return self.elapsed > self.args.deadline

    def add(self, row: dict) -> None:
        row["elapsed_s"] = round(self.elapsed, 1)
        if self.args.oom_snapshot:
            row["stacks_recorded"] = True  # its host times include recording them
        self.rows.append(row)
        print(line(row), flush=True)
        self.save()

    def save(self) -> None:
        (self.out / "arena_check.json").write_text(json.dumps(
            {"rows": self.rows, "models": self.models, "argv": sys.argv[1:]}, indent=1))
        if self.device_times:
            (self.out / "device_times.json").write_text(json.dumps(self.device_times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="directory for arena_check.json, profiles/, device_times")
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--plans", default=str(PLANS))
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--deadline", type=float, default=420.0,
                        help="seconds after which no new run starts (rows say skipped)")
    parser.add_argument("--no-native", action="store_true")
    parser.add_argument("--no-profile", action="store_true",
                        help="no in-context profile: predict on the shipped profiles only")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke test of the script")
    parser.add_argument("--oom-snapshot", action="store_true",
                        help="record allocation stacks and summarize the allocator's state at "
                             "every out-of-memory in OUT/oom/ (experiments/gpu/capture_memory.py; "
                             "slows the host: rows say so)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.oom_snapshot and args.device.startswith("cuda"):
        import capture_memory
        capture_memory.attach(out / "oom")
    check = Check(out, args)
    plans = Path(args.plans)
    for model in [m for m in args.models.split(",") if m]:
        try:
            check_model(check, model, plans)
        except Exception as exc:  # keep the other models' rows
            check.add({"model": model, "run": "load", "error": f"{type(exc).__name__}: {exc}",
                       "traceback": traceback.format_exc(limit=8)})
    print(f"wrote {out / 'arena_check.json'} ({len(check.rows)} rows, "
          f"{check.elapsed:.0f} s)")


def plan_files(plans: Path, model: str) -> list[tuple[str, bool, Path]]:
    """(ratio, graph-priced, path) of the model's arena plans, 1:1 before 1:3, eager first."""
    found = []
    for path in sorted(plans.glob(f"{model}_*_arena*.json.gz")) if plans.is_dir() else []:
        m = NAME.match(path.name)
        if m and m["model"] == model:
            found.append((m["ratio"], bool(m["graph"]), path))
    return sorted(found, key=lambda f: (int(f[0].split("-")[1]), f[1]))


def check_model(check: Check, model: str, plans: Path) -> None:
    from autotm_py import api
    from autotm_py.pipeline import all_fast_plan
    from autotm_py.plan import Plan

    args = check.args
    files = plan_files(plans, model)
    loaded = [(ratio, graph, Plan.load(path), path.name) for ratio, graph, path in files]
    options = loaded[0][2].header.model if loaded else None
    if options is not None:
        batch, dims = options.batch, dict(options.dims)
        graph = api.load_model(model, batch=batch, dims=dims or None, training=options.training,
                               optimizer=options.optimizer or "sgd", fuse=options.fuse,
                               loss=options.loss or "auto")
    else:
        batch, dims = SHAPES[model]
        graph = api.load_model(model, batch=batch, dims=dims or None, training=True)
    shipped = api.load_costs(graph, device="cuda")
    info = check.models[model] = {
        "batch": batch, "dims": dims, "kernels": len(graph.kernels),
        "peak_live_bytes": int(graph.peak_live_bytes),
        "shipped_sum_s": shipped.total_s, "shipped_estimated": shipped.n_estimated,
        "shipped_scaled": shipped.n_scaled, "plans": [name for *_, name in loaded]}
    reference = all_fast_plan(graph)
    costs = {"shipped": shipped, "gpu": None}
    base = {"model": model, "ratio": "-", "plan": "all-fast", "priced": "eager"}

    # all-fast on the caching allocator first: the reference the other rows are read against
    check.add(measure(check, graph, costs, reference, {**base, "run": "caching allocator"},
                      capped=False))
    if not args.no_native and model in NATIVE and args.device.startswith("cuda"):
        check.add(native(check, model, batch, dims, base))
    if not args.no_profile and args.device.startswith("cuda") and not check.late():
        costs["gpu"] = gpu_costs(check, graph, reference, model, info)
    for run, mode in (("arena", run_mode(arena=True)),
                      ("arena graph", run_mode(arena=True, replay=True)),
                      ("graph", run_mode(replay=True))):  # static inputs, no slots
        check.add(measure(check, graph, costs, reference, {**base, "run": run}, mode,
                          capped=False))
    for ratio, graph_priced, plan, name in loaded:
        row = {"model": model, "ratio": ratio, "plan": name,
               "priced": "graph" if graph_priced else "eager"}
        runs = [("arena", run_mode(arena=True)), ("arena graph", run_mode(arena=True, replay=True))]
        if graph_priced:
            runs.reverse()  # what it was priced for first
        else:
            runs.append(("caching allocator", run_mode()))
        for run, mode in runs:
            check.add(measure(check, graph, costs, plan, {**row, "run": run}, mode))


def measure(check: Check, graph, costs: dict, plan, row: dict, mode=None,
            capped: bool = True) -> dict:
    """One `api.execute` of `plan` (the row's run) with its predictions; errors are rows."""
    import gc

    import torch

    from autotm_py import api
    from autotm_py.errors import AutoTMError

    args = check.args
    mode = mode or run_mode()
    if check.late():
        return {**row, "skipped": f"deadline ({args.deadline:.0f} s) passed"}
    if mode.arena and plan.arena is None:  # packed as `api.execute` will pack it,
        plan = api.with_arena(graph, plan, costs["shipped"])  # so copies into slots are priced
    row = {**row, **predictions(graph, costs, plan, mode.replay)}
    gc.collect()  # the previous run's arena, graph pool and pinned pool
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        if hasattr(torch._C, "_host_emptyCache"):  # pinned pools of other sizes, cached
            torch._C._host_emptyCache()
    started = time.perf_counter()
    try:
        run = api.execute(graph, plan, device=args.device, iterations=args.iterations,
                          warmup=args.warmup, costs=costs["shipped"], mode=mode, capped=capped)
    except AutoTMError as exc:
        return {**row, "error": str(exc), "wall_s": time.perf_counter() - started}
    except Exception as exc:  # keep the other rows: report and go on
        return {**row, "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(limit=8),
                "wall_s": time.perf_counter() - started}
    times = list(run.iteration_times_s)
    row.update(median_s=run.median_s, times_s=times,
               spread=(max(times) - min(times)) / statistics.median(times),
               host_median_s=run.host_median_s, peak_bytes=run.peak_fast_bytes,
               reserved_peak_bytes=run.reserved_peak_bytes, cap_bytes=run.cap_bytes,
               alloc_retries=run.alloc_retries, copied_outputs=run.copied_outputs,
               arena_run_bytes=run.arena_bytes, replayed=run.replayed, notes=list(run.notes),
               device_name=run.device_name, wall_s=time.perf_counter() - started)
    for key in ("shipped", "gpu"):
        if row.get(f"predicted_{key}_s"):
            row[f"error_{key}_pct"] = 100 * (row[f"predicted_{key}_s"] / run.median_s - 1)
    return row


def predictions(graph, costs: dict, plan, replayed: bool) -> dict:
    """The plan's prediction when solved and on each of `costs` (a replayed run predicted as
    replayed), with the first violations where the simulator found any."""
    from autotm_py import api

    priced = plan.with_header(run=replace(plan.header.run, replay=replayed))
    out = {"predicted_at_solve_s": plan.header.predicted_time_s,
           "budget_bytes": plan.header.budget_bytes,
           "arena_bytes": plan.arena.nbytes if plan.arena else None}
    for key, kernel_costs in (("shipped", costs["shipped"]), ("gpu", costs["gpu"])):
        if kernel_costs is None:
            continue
        try:
            sim = api.simulate(graph, priced, costs=kernel_costs, strict=False)
            out[f"predicted_{key}_s"] = sim.total_s
            if sim.violations:  # e.g. a kernel's measured scratch beyond the region
                out[f"violations_{key}"] = list(sim.violations[:3])
        except Exception as exc:
            out[f"predicted_{key}_error"] = f"{type(exc).__name__}: {exc}"
    return out


def native(check: Check, model: str, batch: int, dims: dict, base: dict) -> dict:
    """Native eager (uncapped): median time, allocated and reserved peaks, retries."""
    import torch

    row = {**base, "run": "native eager", "plan": "native"}
    if check.late():
        return {**row, "skipped": "deadline passed"}
    import gc

    gc.collect()
    torch.cuda.empty_cache()  # the reserved peak below is the native model's alone
    started = time.perf_counter()
    try:
        import native_compare as nc

        net, make, loss = nc.native_model(model, batch, dims)
        net = net.to(nc.DEV).train()
        step = nc.native_step(model, net, make, loss, None)
        row.update(nc.measure_step(step, check.args.iterations, check.args.warmup),
                   device_name=torch.cuda.get_device_name())
        del net, step
    except Exception as exc:
        row.update(error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc(limit=6))
    row["wall_s"] = time.perf_counter() - started
    torch.cuda.empty_cache()
    return row


def gpu_costs(check: Check, graph, reference, model: str, info: dict):
    """This GPU's costs of the graph: in-context kernel times (cached under OUT/profiles) with
    each kernel's device time from one profiled all-fast iteration. None if it fails."""
    from autotm_py import pipeline
    from autotm_py.profiling.in_context import per_signature_median

    started = time.perf_counter()
    try:
        costs = pipeline.profile_in_context(graph, device=check.args.device,
                                            profiles_dir=check.out / "profiles",
                                            iterations=check.args.iterations,
                                            warmup=check.args.warmup)
        per_kernel = device_times(graph, reference, check.args.device)
        check.device_times[model] = per_kernel
        by_signature = per_signature_median(graph, per_kernel)
        device = tuple(by_signature.get(k.signature, 0.0) for k in graph.kernels)
        costs = replace(costs, device_s=device)
        info.update(gpu_sum_s=costs.total_s, gpu_device_sum_s=sum(per_kernel),
                    gpu_estimated=costs.n_estimated,
                    in_context_median_s=costs.summary.get("iteration_median_s"),
                    profile_s=time.perf_counter() - started)
        print(f"{model}: this GPU's costs: in-context sum {costs.total_s * 1e3:.1f} ms, "
              f"device sum {sum(per_kernel) * 1e3:.1f} ms ({info['profile_s']:.0f} s)",
              flush=True)
        return costs
    except Exception as exc:
        info.update(gpu_costs_error=f"{type(exc).__name__}: {exc}",
                    gpu_costs_traceback=traceback.format_exc(limit=8))
        print(f"{model}: no GPU costs: {exc}", flush=True)
        return None


def device_times(graph, plan, device: str) -> list[float]:
    """Seconds of device work of every kernel in one all-fast iteration (each kernel in a
    profiler range, after two warm-up iterations), by kernel id (gpu_busy.py's method)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from autotm_py.profiling.in_context import kernel_device_times
    from autotm_py.runtime.execute import new_executor

    _, executor, _ = new_executor(graph, plan, device, seed=0)
    for _ in range(2):
        executor.prepare()
        executor.run()
    executor.kernel_ranges = True
    executor.prepare()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        executor.run()
        torch.cuda.synchronize()
    return kernel_device_times(prof.events(), len(graph.kernels))


def line(row: dict) -> str:
    def mib(key: str) -> str:
        value = row.get(key)
        return "-" if value is None else f"{value / 2**20:.0f}"

    def ms(key: str) -> str:
        value = row.get(key)
        return "-" if value is None else f"{value * 1e3:.1f}"

    head = f"{row['model']:11s} {row.get('ratio', '-'):4s} {row.get('priced', '-'):5s} " \
        f"{row['run']:17s}"
    if "skipped" in row:
        return f"{head} skipped: {row['skipped']}"
    if "error" in row:
        return f"{head} failed: {row['error'][:300]}"
    errors = "  ".join(f"{key} {row[f'error_{key}_pct']:+.1f}%" for key in ("shipped", "gpu")
                       if f"error_{key}_pct" in row)
    notes = [n for n in row.get("notes", ()) if n.startswith(("no CUDA graph", "no arena"))]
    return (f"{head} {ms('median_s')} ms  predicted {ms('predicted_shipped_s')} / "
            f"{ms('predicted_gpu_s')} (shipped / this GPU: {errors or '-'})  host "
            f"{ms('host_median_s')} ms  peak {mib('peak_bytes')} reserved "
            f"{mib('reserved_peak_bytes')} budget {mib('budget_bytes')} MiB  retries "
            f"{row.get('alloc_retries')}  copied {row.get('copied_outputs')}  graph "
            f"{row.get('replayed')}" + (f"  NOTE {notes[0]}" if notes else ""))


if __name__ == "__main__":
    main()
