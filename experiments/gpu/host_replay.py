"""Does a host timeline explain why the simulator overstates host-bound plans (DenseNet-264)?

The simulator sums each step as max(kernel, its copies), with kernel times measured in context
(they include the gaps where the GPU waited for Python to enqueue the next kernel). While the
GPU waits for a copy, the host keeps enqueuing, so some of those gaps might vanish. This replays
each measured plan of a bench document on two clocks: the host starts enqueuing kernel k after
the in-context times of kernels 0..k-1 (an upper bound on dispatch), and the GPU runs kernel k no
earlier than that, for its isolated time (the profile entry without a context), or for as long
as its overlapped copies take; sync moves run on the GPU clock. It prints the measured time,
the simulator's prediction (recomputed with the shipped profiles) and the replay's.

The isolated times of launch-bound kernels still hold their launch gaps; `--device-times FILE`
(kernel device times measured by `gpu_busy.py` for one model's graph) replaces them.

Runs on the CPU from committed files:
  python experiments/gpu/host_replay.py experiments/results/gpu_h100.json [MODEL...]
      [--device-times experiments/results/validation/device_times_densenet264_b32.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

PROFILE = Path(__file__).resolve().parents[2] / "profiles" / "h100-80gb-hbm3.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("document")
    parser.add_argument("models", nargs="*")
    parser.add_argument("--device-times", type=Path, default=None)
    args = parser.parse_args()
    device_times = json.loads(args.device_times.read_text()) if args.device_times else None
    for row in json.loads(Path(args.document).read_text())["rows"]:
        if row.get("measured_s") and (not args.models or row["model"] in args.models):
            print(replay_row(row, device_times))


def replay_row(row: dict, device_times: list[float] | None = None) -> str:
    from diagnose import _plan_path

    from autotm_py import api
    from autotm_py.plan import Plan

    dims = {k: int(v) for k, v in (d.split("=") for d in (row.get("dims") or "").split(",") if d)}
    graph = api.load_model(row["model"], batch=row["batch"], dims=dims or None, training=True)
    costs = api.load_costs(graph, device="cuda")
    plan = Plan.load(_plan_path(row["model"], row["batch"], dims, row["ratio"], row["strategy"],
                                row.get("headroom") or 0.0))
    sim = api.simulate(graph, plan, costs=costs, strict=False)
    gpu_times = device_times or isolated_times(graph, costs.times_s)
    if len(gpu_times) != len(graph.kernels):
        raise SystemExit(f"--device-times has {len(gpu_times)} kernels, {graph.name} has "
                         f"{len(graph.kernels)}: measure them on this model's graph")
    replayed = two_clocks(plan, sim, costs.times_s, gpu_times)
    measured = row["measured_s"]
    return (f"{row['model']:12s} {row['ratio']} {row['strategy']:5s} measured "
            f"{measured * 1e3:6.1f} ms  simulator {sim.total_s * 1e3:6.1f} "
            f"({_error(sim.total_s, measured)})  host replay {replayed * 1e3:6.1f} "
            f"({_error(replayed, measured)})")


def isolated_times(graph, in_context: tuple[float, ...]) -> list[float]:
    """Each kernel's time measured alone (no dispatch gaps), capped by its in-context time."""
    from autotm_py.profiling.cache import read_profile_file
    from autotm_py.profiling.sources import all_fast

    (profile,) = read_profile_file(PROFILE, shipped=True).values()
    times = []
    for kernel, context_s in zip(graph.kernels, in_context, strict=True):
        entry = profile.get(kernel.signature, all_fast(kernel))
        times.append(min(entry.median_s, context_s) if entry else context_s)
    return times


def two_clocks(plan, sim, in_context: tuple[float, ...], isolated: list[float]) -> float:
    from autotm_py.plan import Compute, Move

    spans = {span.kernel: span for span in sim.kernels}
    moves = {move.record: move for move in sim.moves}
    host = gpu = 0.0
    for index, record in enumerate(plan.records):
        if isinstance(record, Move) and record.mode == "sync":
            move = moves[index]
            gpu = max(gpu, host) + (move.end_s - move.start_s)
        elif isinstance(record, Compute):
            span, k = spans[record.kernel], record.kernel
            enqueued = host
            host += in_context[k]
            copies = span.step_end_s - span.start_s if span.step_end_s > span.end_s else 0.0
            gpu = max(gpu, enqueued) + max(isolated[k], copies)
    return gpu


def _error(predicted: float, measured: float) -> str:
    return f"{(predicted - measured) / measured * 100:+5.1f}%"


if __name__ == "__main__":
    main()
