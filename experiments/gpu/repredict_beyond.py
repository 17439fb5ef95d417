"""Predict a beyond_card.py run's plan again on the CPU, with today's simulator: the Trainer's
graph of the decoder rebuilt as `Trainer` builds it (no GPU, no pinned memory, the module's
values never copied), the plan taken from the run's plan cache, priced with the run's kernel
profiles (the cache the call carried: `XDG_CACHE_HOME`), and simulated; prints the step time,
the host's work and when its updates and the GPU's part end. With `--solve`, plans the same
graph here instead (the run's budget and time limit) and predicts that plan.

    XDG_CACHE_HOME=DIR/xdg python experiments/gpu/repredict_beyond.py --plans DIR/plans \
        [--size 3b] [--batch 4] [--cap 24GiB] [--optimizer-on host] [--solve] [--gpu NAME]

Issue 49: the run's measured step beside the prediction of its own plan is the check of the
host's pricing (docs/training-loop.md, "How the host's work is priced").
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "experiments" / "gpu")]

from beyond_card import SIZES, adamw, build  # noqa: E402
from trainer_bench import lm_loss  # noqa: E402

from autotm_py import pipeline  # noqa: E402
from autotm_py.config import PlanConfig  # noqa: E402
from autotm_py.errors import PlanError  # noqa: E402
from autotm_py.ir.host_updates import offload_updates  # noqa: E402
from autotm_py.ir.training import derive_training  # noqa: E402
from autotm_py.plan import Plan  # noqa: E402
from autotm_py.trainer.core import capture_training  # noqa: E402
from autotm_py.trainer.loop import GPU_MODE  # noqa: E402
from autotm_py.trainer.spec import split_example  # noqa: E402
from autotm_py.units import parse_bytes  # noqa: E402


def training_graph(size: dict[str, int], batch: int, chunks: int):
    """The Trainer's training graph of the decoder (bf16, AdamW, `chunks` loss blocks)."""
    net, data = build(size, batch, 1)
    forward, rule, spec, _ = capture_training(net, adamw(net.parameters()), lm_loss,
                                              split_example(data[0]), "bf16")
    return derive_training(forward, optimizer=spec, loss=rule, loss_chunks=chunks)


def cached_plan(graph, folder: Path) -> Plan | None:
    """The plan of the folder that fits `graph` (the run's plan cache: one file per key)."""
    for path in sorted(folder.glob("*.json.gz")):
        plan = Plan.load(path)
        try:
            plan.validate(graph)
        except (PlanError, ValueError):
            continue
        print(f"{path.name}: the run's plan of this graph")
        return plan
    return None


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--plans", type=Path, help="the run's plan cache folder")
    p.add_argument("--size", choices=tuple(SIZES), default="3b")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--cap", default="24GiB")
    p.add_argument("--optimizer-on", choices=("gpu", "host", "split"), default="host")
    p.add_argument("--host-share", type=float, default=None)
    p.add_argument("--loss-chunks", type=int, default=16)
    p.add_argument("--solve", action="store_true", help="plan here instead of the cache")
    p.add_argument("--time-limit", type=float, default=30.0)
    p.add_argument("--gpu", default="NVIDIA H100 80GB HBM3")
    args = p.parse_args(argv)
    started = time.perf_counter()
    full = training_graph(SIZES[args.size], args.batch, args.loss_chunks)
    graph = full if args.optimizer_on == "gpu" else offload_updates(
        full, args.host_share if args.optimizer_on == "split" else None)
    print(f"graph {len(graph.kernels)} kernels in {time.perf_counter() - started:.0f} s")
    costs = pipeline.device_costs(graph, "cuda", args.gpu)
    if args.solve:
        config = PlanConfig(fast_mem_bytes=parse_bytes(args.cap), device="cuda", gpu=args.gpu,
                            run=GPU_MODE, time_limit_s=args.time_limit)
        result = pipeline.optimize(graph, config, costs=costs)
        print(result.message)
        plan = result.plan
    else:
        plan = cached_plan(graph, args.plans) if args.plans else None
    if plan is None:
        print("no plan of this graph (another exporter's graph, or infeasible)")
        return 1
    res = pipeline.simulate(graph, plan, costs=costs)
    print(f"predicted {res.total_s * 1e3:.1f} ms (the plan's header: "
          f"{(plan.header.predicted_time_s or 0) * 1e3:.1f} ms); {res.host_note()}")
    return 0


if __name__ == "__main__":
    torch.set_num_threads(2)
    sys.exit(main(sys.argv[1:]))
