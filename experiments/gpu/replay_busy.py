"""Issue 14 item 4 on the benchmark's plans: is a replayed iteration as long as the GPU's own
work in it, or does the GPU wait?

For every plan given (files of `autotm bench --arena --replay --plans DIR`, whose names say the
model, batch, dims, ratio and strategy) and once per model for its all-fast iteration, one
process of its own runs it as `autotm bench --arena --replay --execute` does (`bench/child.py`:
the placed allocator, the plan's cap, CUDA-graph replay; all-fast uncapped with static inputs)
and profiles one more replay (`execute(device_busy=True)`, `runtime.device_trace`): median
iteration time over the device's busy time in the profiled replay (any kernel, copy or memset
on any stream). The baselines are not run (the benchmark's rows have them); the all-fast
reference is rerun here, in the same call.

    python3 experiments/gpu/replay_busy.py OUT.json PLAN.json.gz [PLAN...] [--iterations 5]
    python3 experiments/gpu/replay_busy.py OUT.json --all-fast vgg19/64 bert_base/16/seq=512

(`--all-fast MODEL/BATCH[/DIM=VALUE...]`: a model's all-fast replay alone, training.)

Prints one line per run and writes the rows to OUT.json (after every run: a call cut short
keeps what it measured).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from autotm_py import api  # noqa: E402
from autotm_py.bench import child  # noqa: E402
from autotm_py.config import PlanConfig  # noqa: E402
from autotm_py.errors import AutoTMError  # noqa: E402
from autotm_py.fileio import atomic_write_text  # noqa: E402
from autotm_py.options import RunMode  # noqa: E402
from autotm_py.plan import Plan  # noqa: E402

# model_batch[_dims]_training_device_memory_ratio_strategy_solver_options.json.gz
NAME = re.compile(r"^(?P<model>.+?)_(?P<batch>\d+)_(?:(?P<dims>[a-z]+-\d+(?:_[a-z]+-\d+)*)_)?"
                  r"(?P<training>True|False)_cuda_[^_]+_(?P<ratio>\d+-\d+)_(?P<strategy>.+?)_"
                  r"(?P<solver>highs|cbc)_(?P<options>.+)\.json\.gz$")


def cell_of(path: Path) -> dict:
    """What a benchmark plan file's name says about its cell."""
    found = NAME.match(path.name)
    if found is None:
        raise SystemExit(f"error: {path.name} is not named as `autotm bench --plans` names "
                         "plans (MODEL_BATCH_..._RATIO_STRATEGY_SOLVER_OPTIONS.json.gz)")
    dims = {}
    for part in filter(None, (found["dims"] or "").split("_")):
        name, value = part.rsplit("-", 1)
        dims[name] = int(value)
    return {"model": found["model"], "batch": int(found["batch"]), "dims": dims,
            "training": found["training"] == "True", "ratio": found["ratio"].replace("-", ":"),
            "strategy": found["strategy"], "options": found["options"]}


def all_fast_cell(text: str) -> dict:
    """MODEL/BATCH[/DIM=VALUE...] -> a cell whose only run is the model's all-fast replay."""
    model, batch, *dims = text.split("/")
    return {"model": model, "batch": int(batch), "training": True, "ratio": None,
            "strategy": "all-fast", "options": None,
            "dims": {k: int(v) for k, v in (d.split("=") for d in dims)}}


def request_for(cell: dict, iterations: int, *, plan_run: bool) -> child.RunRequest:
    options = {"batch": cell["batch"], "dims": cell["dims"], "training": cell["training"]}
    mode = RunMode(arena=plan_run, placed=plan_run, replay=True)
    return child.RunRequest(model=cell["model"], options=options, mode=mode.to_dict(),
                            device="cuda:0", iterations=iterations, warmup=2, capped=plan_run,
                            device_busy=True)


def all_fast_plan(cell: dict) -> Plan:
    graph = api.load_model(cell["model"], batch=cell["batch"], dims=cell["dims"],
                           training=cell["training"])
    config = PlanConfig(strategy="async", ratio="1:1", device="cuda", run=RunMode(replay=True))
    return api.baselines(graph, config, names=("all-fast",))["all-fast"].plan


def measured(cell: dict, label: str, run) -> dict:
    row = {**cell, "run": label}
    for key in ("median_s", "device_busy_s", "device_span_s", "device_kernel_s",
                "predicted_time_s", "reserved_peak_bytes", "budget_bytes", "alloc_retries",
                "graph", "placed_outputs", "copied_outputs", "device_name", "notes"):
        # "graph": whether the timed iterations were replays (the result's `replayed`)
        row[key] = getattr(run, "replayed" if key == "graph" else key, None)
    if row["median_s"] and row["device_busy_s"]:
        row["iteration_over_busy"] = row["median_s"] / row["device_busy_s"]
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("plans", nargs="*", type=Path)
    parser.add_argument("--all-fast", nargs="*", default=[], metavar="MODEL/BATCH[/DIM=V]")
    parser.add_argument("--iterations", type=int, default=5)
    args = parser.parse_args()
    cells = [(path, cell_of(path)) for path in args.plans] + \
        [(None, all_fast_cell(text)) for text in args.all_fast]
    rows: list[dict] = []
    done_models: set[str] = set()
    for path, cell in cells:
        jobs = []
        if cell["model"] not in done_models:  # the model's all-fast replay, once
            done_models.add(cell["model"])
            jobs.append(("all-fast", lambda c=cell: all_fast_plan(c), False))
        if path is not None:
            jobs.append((path.name, lambda p=path: Plan.load(p), True))
        for label, plan_of, plan_run in jobs:
            started = time.time()
            try:
                run = child.run_isolated(request_for(cell, args.iterations, plan_run=plan_run),
                                         plan_of())
                row = measured(cell if plan_run else {**cell, "ratio": None,
                                                      "strategy": "all-fast"}, label, run)
            except AutoTMError as exc:
                row = {**cell, "run": label, "error": str(exc)}
            row["wall_s"] = round(time.time() - started, 1)
            rows.append(row)
            print(json.dumps({k: row.get(k) for k in (
                "model", "ratio", "strategy", "median_s", "device_busy_s",
                "iteration_over_busy", "predicted_time_s", "alloc_retries", "graph", "error",
                "wall_s")}), flush=True)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(args.out, json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
