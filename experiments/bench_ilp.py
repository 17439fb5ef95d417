"""ILP scaling: size, build and solve time, gap and predicted slowdown of the placement ILP.

For every zoo model at its default dims (the paper's batch sizes), as a training iteration, at
fast:slow 1:8, 1:4 and 1:1 (the paper's PMM:DRAM 8:1, 4:1, 1:1) and strategies static, sync
and async, plan with `autotm_py.optimize` (decode and verification included) and record:
variables, constraints, build s, solve s, gap, status, predicted time and slowdown vs all-fast.
Targets on this 2-core machine at a 1% gap: sync build + solve under 60 s, async (and the
joint keep/move/recompute ILP) under 180 s.

Strategies are plan names (`PlanConfig.plan_name`): ``sync``/``async`` are move-only whatever
the device, ``sync+recompute``/``async+recompute`` the joint ILP, ``recompute-only``.

    python experiments/bench_ilp.py                          # host mode (optane), this CPU
    python experiments/bench_ilp.py --device cuda --strategies sync,async \\
        --batch vgg19=64,inception_v4=64,*=32 -o experiments/results/ilp_gpu
    python experiments/bench_ilp.py --models densenet264 --ratios 1:4 --dry-run
    # the GPU benchmark cells (experiments/gpu/configs.sh) with recomputation:
    python experiments/bench_ilp.py --device cuda --gpu-cells \\
        --strategies async,recompute-only,async+recompute --time-limit 180 \\
        -o experiments/results/ilp_gpu_recompute

Writes OUT.csv and OUT.json after every row (atomically) and skips rows already there, so an
interrupted sweep resumes. Kernel costs come from the shipped profiles (`load_costs`).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from autotm_py import api  # noqa: E402
from autotm_py.config import PlanConfig  # noqa: E402
from autotm_py.fileio import atomic_write_text  # noqa: E402
from autotm_py.units import parse_ratio  # noqa: E402

MODELS = ("vgg19", "vgg416", "resnet50", "resnet200", "inception_v4", "densenet264",
          "transformer", "dlrm", "bert_base", "gpt2_small")
TARGET_S = {"sync": 60.0, "async": 180.0, "sync+recompute": 180.0, "async+recompute": 180.0,
            "recompute-only": 180.0}
# The GPU benchmark cells (experiments/gpu/configs.sh): model -> (batch, dims, ratios)
GPU_CELLS = {
    "inception_v4": (64, {}, "1:1,1:2,1:3"), "resnet200": (32, {}, "1:1,1:2,1:3"),
    "densenet264": (32, {}, "1:1,1:2,1:3"), "vgg19": (64, {}, "4:1,3:1,2:1,1:1,1:2,1:3"),
    "bert_base": (16, {"seq": 512}, "1:1,1:2,1:3"), "gpt2_small": (8, {"seq": 1024}, "1:1,1:2,1:3"),
}
COLUMNS = ("model", "batch", "device", "memory", "ratio", "paper_ratio", "strategy", "solver",
           "kernels", "tensors", "peak_bytes", "budget_bytes", "status", "variables",
           "constraints", "build_s", "solve_s", "plan_s", "gap", "hit_time_limit",
           "predicted_s", "all_fast_s", "slowdown", "target_s", "met_target", "moved_bytes",
           "recomputes", "recompute_s", "recomputed_bytes", "fast_peak_bytes",
           "first_touch_s", "all_slow_s", "notes", "machine", "date", "load_avg_1min")


def paper_ratio(ratio: str) -> str:
    fast, slow = ratio.split(":")
    return f"{slow}:{fast}"


def run_one(graph: Any, costs: Any, args: argparse.Namespace, ratio: str,
            strategy: str) -> dict[str, Any]:
    config = PlanConfig.for_plan_name(strategy, ratio=parse_ratio(ratio), device=args.device,
                                      memory=args.memory, solver=args.solver, gap=args.gap,
                                      time_limit_s=args.time_limit)
    started = time.perf_counter()
    result = api.optimize(graph, config, costs=costs)
    wall = time.perf_counter() - started
    base = {}
    if args.baselines and result.plan is not None:
        from autotm_py.pipeline import machine_for, run_baselines

        machine = machine_for(graph, config, costs)
        base = run_baselines(machine, ("first-touch", "all-slow"))
    st = result.stats
    counts = result.plan.header.counts if result.plan else {}
    target = TARGET_S.get(strategy)
    spent = st.build_s + st.solve_s
    return {
        "status": result.status, "variables": st.variables, "constraints": st.constraints,
        "build_s": round(st.build_s, 3), "solve_s": round(st.solve_s, 3),
        "plan_s": round(wall, 3), "gap": st.gap, "hit_time_limit": st.hit_time_limit,
        "budget_bytes": result.budget_bytes, "predicted_s": result.predicted_time_s,
        "all_fast_s": result.all_fast_time_s, "slowdown": result.slowdown,
        "target_s": target, "met_target": None if target is None else spent <= target,
        "moved_bytes": sum(v for k, v in counts.items() if k.startswith("bytes_")),
        "recomputes": counts.get("recomputes", 0), "recompute_s": counts.get("recompute_s", 0.0),
        "recomputed_bytes": counts.get("recomputed_bytes", 0),
        "fast_peak_bytes": result.fast_peak_bytes,
        "first_touch_s": base["first-touch"].time_s if base else None,
        "all_slow_s": base["all-slow"].time_s if base else None,
        "notes": " | ".join(result.plan.header.notes) if result.plan else result.message,
    }


def _load() -> float | None:
    """The 1-minute load average when a row starts (a shared machine slows solves down)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def batch_for(spec: str | None, model: str) -> int | None:
    """`--batch` value for one model: "32", or "vgg19=64,*=32" (None: the model's default)."""
    if not spec:
        return None
    table = dict(item.split("=") if "=" in item else ("*", item) for item in spec.split(","))
    value = table.get(model, table.get("*"))
    return int(value) if value else None


def load(out: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rows, the specs of the runs that wrote them) of an earlier sweep into `out`."""
    path = out.with_suffix(".json")
    if not path.exists():
        return [], []
    doc = json.loads(path.read_text())
    specs = doc.get("specs") or ([doc["spec"]] if doc.get("spec") else [])
    return doc["rows"], specs


def this_machine() -> str:
    """The CPU model, its logical CPUs and the OS: solve times are this machine's."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}; {os.cpu_count()} CPUs; {platform.system()}"


def save(out: Path, rows: list[dict[str, Any]], specs: list[dict[str, Any]]) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(out.with_suffix(".csv"), buf.getvalue())
    doc = {"format": "autotm-bench-ilp", "version": 1, "columns": list(COLUMNS),
           "spec": specs[-1], "specs": specs, "rows": rows}
    atomic_write_text(out.with_suffix(".json"), json.dumps(doc, indent=1) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--ratios", default="1:8,1:4,1:1", help="fast:slow (ours)")
    parser.add_argument("--strategies", default="static,sync,async")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--memory", default=None, help="preset or file (default by device)")
    parser.add_argument("--batch", default=None,
                        help="N, or per model: vgg19=64,*=32 (default: the paper's batch)")
    parser.add_argument("--solver", default="highs")
    parser.add_argument("--gap", type=float, default=0.01)
    parser.add_argument("--time-limit", type=float, default=600.0)
    parser.add_argument("-o", "--out", type=Path, default=HERE / "results" / "ilp_host")
    parser.add_argument("--baselines", action="store_true",
                        help="also simulate first-touch and all-slow at each budget")
    parser.add_argument("--gpu-cells", action="store_true",
                        help="the models, batches, dims and ratios of experiments/gpu/configs.sh "
                             "(overrides --models, --batch and --ratios)")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    if args.gpu_cells:
        args.models = ",".join(GPU_CELLS)
    spec = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    rows, specs = load(args.out)
    spec["started"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    specs.append(spec)
    done = {(r["model"], r["ratio"], r["strategy"], r["solver"]) for r in rows}
    machine = this_machine()
    for name in args.models.split(","):
        ratios = GPU_CELLS[name][2] if args.gpu_cells else args.ratios
        todo = [(r, s) for r in ratios.split(",") for s in args.strategies.split(",")
                if (name, r, s, args.solver) not in done]
        if not todo:
            continue
        if args.dry_run:
            print(name, todo)
            continue
        batch, dims = (GPU_CELLS[name][0], GPU_CELLS[name][1]) if args.gpu_cells else \
            (batch_for(args.batch, name), {})
        graph = api.load_model(name, batch=batch, dims=dims, training=True)
        costs = api.load_costs(graph, device=args.device)
        for ratio, strategy in todo:
            row = {"model": name, "batch": graph.meta.get("dims", {}).get("batch", batch),
                   "device": args.device, "memory": args.memory or "default", "ratio": ratio,
                   "paper_ratio": paper_ratio(ratio), "strategy": strategy,
                   "solver": args.solver, "kernels": len(graph.kernels),
                   "tensors": len(graph.tensors), "peak_bytes": graph.peak_live_bytes,
                   "machine": machine, "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
                   "load_avg_1min": _load()}
            row.update(run_one(graph, costs, args, ratio, strategy))
            rows.append(row)
            save(args.out, rows, specs)
            print(f"{name} {ratio} {strategy}: {row['status']} {row['variables']} vars, "
                  f"build {row['build_s']} s, solve {row['solve_s']} s, slowdown "
                  f"{row['slowdown']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
