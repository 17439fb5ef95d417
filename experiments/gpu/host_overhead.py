"""Where an eager iteration's host time goes: our executor against our kernels under torch
autograd, on this GPU host (issue 15 item 4: "the executor is never slower than our own kernels
under torch autograd"; on hosts whose CPU is slow the CNNs are host-bound).

    python3 experiments/gpu/host_overhead.py $OUT/host.json --models resnet200,densenet264

Per model, all-fast, one process; --rounds rounds, each starting with another of the three
below (each the median of --iterations after 2 warm-ups of: the iteration by CUDA events, the
host's wall time to enqueue it, and the CPU time the process spent enqueueing it, which other
tenants of a shared host do not inflate). The results give every round, the medians over
rounds, and the medians of the rounds' executor/autograd ratios (time, host CPU time):
- ``executor``: the executor's eager iteration of the all-fast plan (as `autotm run`);
- ``autograd``: our kernels under torch autograd, as `eager.measure_autograd` runs them (torch's
  engine runs backward, a foreach SGD step);
- ``loop``: the plain Python loop over the training graph's kernels (`reference.run_graph`,
  no plan records, no events): what running our kernels from Python costs at least;
Then, once:
- ``interpreter``: the executor with every kernel stubbed out (no GPU work): the interpreter of
  plan records alone on this host's CPU;
- ``profile``: cProfile of one executor and one autograd iteration (top functions by own time).
The executor's host time minus ``loop`` is the interpreter's share; ``loop`` minus autograd's is
what calling backward kernels from Python costs beside torch's C++ engine. ``--plan FILE``
(repeatable) adds a saved plan's eager iteration under its cap (uncapped if it runs out of
memory there, and said) with its profile. The script runs any checkout of the code given on
PYTHONPATH (`PYTHONPATH=old-checkout:$PYTHONPATH`, ahead of this one), so an older version
can be measured beside the new one in the same call.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/
sys.path.insert(0, str(Path(__file__).resolve().parent))  # native_compare, with --native
from executor_host_time import stubbed_kernels

from autotm_py import api, pipeline
from autotm_py.errors import ExecutionError
from autotm_py.runtime import eager
from autotm_py.runtime.device import device_name, time_region
from autotm_py.runtime.reference import init_values, run_graph

try:  # this checkout's API (`runtime.execute`, run options in `autotm_py.options`)
    from autotm_py.runtime.execute import new_executor as _new_executor

    UNCAPPED = {"capped": False}
except ImportError:  # an older checkout on PYTHONPATH (module docstring)
    from autotm_py.runtime.executor import new_executor as _new_executor

    UNCAPPED = {"enforce_budget": False}

DEV = "cuda"
BATCH = {"resnet200": 32, "densenet264": 32, "inception_v4": 64, "bert_base": 16,
         "gpt2_small": 8, "vgg19": 64}


def measure(prepare, body, iterations: int) -> dict:
    """Medians over `iterations` after 2 warm-ups: the iteration (CUDA events), how long the
    host took to enqueue it, and the CPU time the process spent doing so, which unlike the
    host's wall time does not grow when other processes take the host's cores. (The process's,
    not the thread's: torch runs autograd's backward on a thread of its own.)"""
    samples, cpu = [], []

    def timed_body() -> None:
        begin = time.process_time()
        body()
        cpu.append(time.process_time() - begin)

    for i in range(iterations + 2):
        prepare()
        sample = time_region(torch.device(DEV), timed_body)
        if i >= 2:
            samples.append(sample)
    return {"median_s": statistics.median(s.seconds for s in samples),
            "host_median_s": statistics.median(s.host_seconds for s in samples),
            "host_cpu_median_s": statistics.median(cpu[2:])}


def _nothing() -> None:
    """Nothing to place before an iteration (autograd and the loop hold their inputs)."""


def new_executor(graph, plan, device: str, seed: int):
    """The checked device and an eager executor on it (whichever checkout runs)."""
    made = _new_executor(graph, plan, device, seed)
    return made[0], made[1]


def runners(graph, plan) -> dict:
    """(prepare, iteration) per way of running the all-fast iteration."""
    _, ex = new_executor(graph, plan, DEV, 0)
    values = init_values(graph, 0, DEV)
    return {"executor": (ex.prepare, ex.run),
            "autograd": (_nothing, autograd_step(graph)),
            "loop": (_nothing, lambda: run_graph(graph, values))}


def profile_top(step, rows: int = 14) -> dict:
    step()
    _sync()
    prof = cProfile.Profile()
    prof.enable()
    step()
    prof.disable()
    _sync()
    own: dict[str, list] = {}
    for (file, line, fn), (_, calls, tottime, _, _) in pstats.Stats(prof).stats.items():
        name = fn if file == "~" else f"{Path(file).name}:{line}:{fn}"
        own.setdefault(name, [0, 0.0])
        own[name][0] += calls
        own[name][1] += tottime
    python = sum(t for n, (_, t) in own.items() if not n.startswith("<"))
    top = sorted(own.items(), key=lambda kv: -kv[1][1])[:rows]
    return {"python_own_s": python, "total_s": sum(t for _, t in own.values()),
            "top": [[n, c, round(t * 1e3, 3)] for n, (c, t) in top]}


def measure_interpreter(graph, plan, iterations: int) -> dict:
    """The executor with kernels replaced by cached one-element outputs (no GPU work)."""
    with stubbed_kernels(DEV):
        _, ex = new_executor(graph, plan, DEV, 0)
        times = measure(ex.prepare, ex.run, iterations)
    return {**times, "per_record_us": times["host_cpu_median_s"] / len(plan.records) * 1e6}


def executor_step(graph, plan):
    """One eager iteration of the all-fast plan (its inputs placed first, as `execute` does)."""
    _, ex = new_executor(graph, plan, DEV, 0)

    def step():
        ex.prepare()
        ex.run()

    return step


def autograd_step(graph):
    """One torch.autograd iteration as `eager.measure_autograd` runs it."""
    meta = graph.meta["training"]
    values = init_values(graph, 0, DEV)
    params = {w: values[w].clone().requires_grad_(True) for w, _ in meta["weight_grads"]}
    opt = torch.optim.SGD(list(params.values()), lr=float(meta["learning_rate"]), foreach=True)
    parts = eager.forward_segments(graph, meta["forward_kernels"], 1, keep=(meta["loss"],))

    def step():
        env = {**values, **params}
        eager._forward(graph, parts, env)
        loss = env[meta["loss"]]
        del env
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def native_reference(name: str, batch: int, dims: dict, iterations: int,
                     budget: int | None = None) -> dict:
    """What a PyTorch user runs for the same model (`native_compare`, torchvision / HF built
    from config): eager, and with a budget also checkpointing at the fewest segments that fit
    under the same cap."""
    import native_compare

    out = {"eager": native_compare.measure_native(name, batch, dims, iterations)}
    if budget is not None:
        out["checkpointing"] = native_compare.measure_native(name, batch, dims, iterations,
                                                             budget)
    return out


def measure_model(name: str, batch: int, iterations: int, rounds: int,
                  native: bool = False) -> dict:
    graph = api.load_model(name, batch=batch, training=True)
    plan = pipeline.all_fast_plan(graph)
    ways = runners(graph, plan)
    out: dict = {"batch": batch, "records": len(plan.records), "kernels": len(graph.kernels),
                 "rounds": []}
    names = list(ways)
    for r in range(rounds):
        # each round starts with another of them: a host that drifts favours none
        order = names[r % len(names):] + names[:r % len(names)]
        out["rounds"].append({what: measure(*ways[what], iterations) for what in order})
    del ways
    for what in names:
        out[what] = {key: _median([row[what][key] for row in out["rounds"]])
                     for key in ("median_s", "host_median_s", "host_cpu_median_s")}
    for key in ("median_s", "host_cpu_median_s"):
        out[f"executor_over_autograd_{key}"] = _median([
            row["executor"][key] / row["autograd"][key] for row in out["rounds"]
            if row["executor"][key] and row["autograd"][key]])
    out["interpreter"] = measure_interpreter(graph, plan, iterations)
    out["profile_executor"] = profile_top(executor_step(graph, plan))
    out["profile_autograd"] = profile_top(autograd_step(graph))
    torch.cuda.empty_cache()
    if native:
        import native_compare

        out["native"] = native_reference(name, batch, native_compare.SHAPES[name][1], iterations)
    return out


def measure_plan(path: Path, iterations: int, native: bool = False) -> dict:
    """A saved plan's eager iteration under its cap, and where its host time goes."""
    from collections import Counter

    from autotm_py.plan import Plan

    plan = Plan.load(path)
    model = plan.header.model
    graph = api.load_model(plan.header.model_name.split("/")[0], batch=model.batch,
                           dims=model.dims or None, training=model.training, fuse=model.fuse)
    capped = True
    try:
        run = api.execute(graph, plan, device=DEV, iterations=iterations, warmup=2)
    except ExecutionError:  # its headroom-0 plan needs more room on the caching allocator
        capped = False
        run = api.execute(graph, plan, device=DEV, iterations=iterations, warmup=2,
                          **UNCAPPED)
    _, ex = new_executor(graph, plan, DEV, 0)
    uncapped = measure(ex.prepare, ex.run, iterations)  # host CPU time: the cap changes none
    del ex
    kinds = Counter(type(r).__name__ for r in plan.records)
    out = {"plan": path.name, "records": dict(kinds), "predicted_s": plan.header.predicted_time_s,
           "capped": capped, "median_s": run.median_s, "host_median_s": run.host_median_s,
           "peak_bytes": run.peak_fast_bytes, "alloc_retries": run.alloc_retries,
           "uncapped": uncapped,
           "profile_executor": profile_top(executor_step(graph, plan), rows=24)}
    torch.cuda.empty_cache()
    if native:
        out["native"] = native_reference(plan.header.model_name.split("/")[0], model.batch,
                                         {k: v for k, v in model.dims.items() if k != "batch"},
                                         iterations, plan.header.budget_bytes)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="results file (JSON)")
    parser.add_argument("--models", default="resnet200,densenet264",
                        help="comma-separated zoo models; empty: none")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3,
                        help="executor and autograd alternated this many times")
    parser.add_argument("--device", default="cuda", help="cpu: a check of the script only")
    parser.add_argument("--plan", type=Path, action="append", default=[],
                        help="also a saved plan's eager iteration and its profile")
    parser.add_argument("--native", action="store_true",
                        help="also native PyTorch per model (eager) and per plan (eager, and "
                             "checkpointing under the plan's cap)")
    parser.add_argument("--batch", type=int, help="instead of each model's GPU batch")
    args = parser.parse_args()
    global DEV
    DEV = args.device
    results: dict = {"device": api_device_name(), "torch": torch.__version__,
                     "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                     "cpu": _cpu_name(), "commit": os.environ.get("AUTOTM_COMMIT"),
                     "models": {}}
    for name in filter(None, args.models.split(",")):
        results["models"][name] = measure_model(name, args.batch or BATCH[name],
                                                args.iterations, args.rounds, args.native)
        print(f"{name}: " + "; ".join(
            f"{what} {_ms(r.get('median_s'))} (host {_ms(r.get('host_median_s'))})"
            for what, r in results["models"][name].items() if isinstance(r, dict)
            and "host_median_s" in r) + "; executor/autograd: time "
            f"{_ratio(results['models'][name]['executor_over_autograd_median_s'])}, host CPU "
            f"{_ratio(results['models'][name]['executor_over_autograd_host_cpu_median_s'])} "
            "(medians of the rounds' ratios)", flush=True)
        _print_native(results["models"][name])
        _write(args.out, results)
    for path in args.plan:
        row = results.setdefault("plans", {})[path.name] = measure_plan(path, args.iterations,
                                                                         args.native)
        print(f"{path.name}: {_ms(row['median_s'])} (host {_ms(row['host_median_s'])}; "
              f"uncapped {_ms(row['uncapped']['median_s'])}, host CPU "
              f"{_ms(row['uncapped']['host_cpu_median_s'])}), "
              f"predicted {_ms(row['predicted_s'])}, records {row['records']}", flush=True)
        _print_native(row)
        _write(args.out, results)
    return 0


def _print_native(row: dict) -> None:
    for what, native in row.get("native", {}).items():
        extra = f", {native['segments']} segments" if native.get("segments") else ""
        oom = f", out of memory at {native['out_of_memory_at']}" \
            if native.get("out_of_memory_at") else ""
        print(f"  native {what}: {_ms(native.get('median_s'))}{extra}{oom}", flush=True)


def _write(path: Path, results: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1))


def api_device_name() -> str:
    return device_name(DEV)


def _median(values: list[float | None]) -> float | None:
    """The median of the values measured (a version of the code that did not report host
    times gives None)."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f} ms"


def _sync() -> None:
    if DEV.startswith("cuda"):
        torch.cuda.synchronize()


def _cpu_name() -> str:
    try:
        return subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo"],
                              capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return "unknown"


if __name__ == "__main__":
    raise SystemExit(main())
