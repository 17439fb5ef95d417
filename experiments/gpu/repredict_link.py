"""What-if: measured runs predicted again with their copies crossing another link.

Every plan records the memory system it was priced with (header `memory_system`); until
2026-11-29 plans priced for the H200 (`--gpu h200`) crossed the H100's link (`h100-pcie5`),
because the H200's had not been calibrated. This finds the plan of every run under the given
folders or files (`autotm run -o` files, named as `replay_plans.sh` names them, and the rows of
`autotm bench --execute` documents; plans read from `--plans`), simulates it on the profiles of
the GPU that priced it (`load_costs(gpu=)`) with the header's link and with `--memory`'s, and
prints both predictions beside the measurement with the median errors. The plans themselves are
not solved again: what the ILP would choose on the other link needs `--gpu` solves and runs.

`--replay-factors TO_FAST,TO_SLOW` prices replayed copies with the factors the runs were
priced with (`costs.REPLAY_TO_FAST_SLOWDOWN` / `REPLAY_TO_SLOW_SLOWDOWN`; 1.04,1.13 until
2026-11-29, 1.0,1.0 since replays run with one work queue).

Runs on the CPU from committed files:
  B=experiments/results/bench_arena/2026-11-28g
  python experiments/gpu/repredict_link.py --memory h200-pcie5 --replay-factors 1.04,1.13 \\
      $B/calld $B/callb $B/callc $B/fi/*gpu-h200.json $B/fd/*gpu-h200.json
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def runs_under(folder: Path) -> list[tuple[str, float]]:
    """(plan stem, measured s) of every measured plan there: run files by their file name,
    bench rows by the name their sweep gave the plan."""
    from autotm_py.bench.spec import ROW_KEY, cell_text, plan_stem

    out = []
    for path in [folder] if folder.is_file() else sorted(folder.rglob("*.json")):
        doc = json.loads(path.read_text())
        if isinstance(doc, dict) and "median_s" in doc:  # `autotm run -o`
            out.append((path.stem, doc["median_s"]))
        elif isinstance(doc, dict) and "rows" in doc:  # `autotm bench`
            for row in doc["rows"]:
                if row.get("measured_s") and row.get("predicted_s") and not row.get("headroom"):
                    key = tuple(cell_text(row[k]) for k in ROW_KEY)
                    out.append((plan_stem(key), row["measured_s"]))
    return out


def plan_index(plans_dir: Path) -> dict[str, Path]:
    """Plan files by stem, and by the stem `replay_plans.sh` gives its runs ('+' -> '_')."""
    index = {}
    for path in plans_dir.glob("*.json.gz"):
        stem = path.name[:-len(".json.gz")]
        index[stem] = index[stem.replace("+", "_")] = path
    return index


@functools.cache
def graph_and_costs(model: str, batch: int, dims: tuple, training: bool, optimizer: str,
                    fuse: bool, loss: str, loss_chunks: int, gpu: str | None):
    from autotm_py import api

    graph = api.load_model(model, batch=batch, dims=dict(dims) or None, training=training,
                           optimizer=optimizer or "sgd", fuse=fuse, loss=loss or "auto",
                           loss_chunks=loss_chunks)
    return graph, api.load_costs(graph, device="cuda", gpu=gpu)


def predictions(path: Path, memory_name: str) -> tuple[float, float]:
    """The plan simulated with the link it records, and with `memory_name`'s (same budget)."""
    from autotm_py import api
    from autotm_py.memory.tiers import load_memory_system
    from autotm_py.plan import Plan

    plan = Plan.load(path)
    m = plan.header.model
    graph, costs = graph_and_costs(plan.header.model_name.split("/")[0], m.batch,
                                   tuple(sorted(dict(m.dims).items())), m.training,
                                   m.optimizer, m.fuse, m.loss, m.loss_chunks, plan.header.gpu)
    recorded = dict(plan.header.memory_system)
    other = load_memory_system(memory_name).with_budget(recorded.get("budget_bytes")).to_dict()
    other["runtime_reserve_bytes"] = recorded.get("runtime_reserve_bytes",
                                                  other["runtime_reserve_bytes"])
    moved = replace(plan, header=replace(plan.header, memory_system=other))
    return (api.simulate(graph, plan, costs=costs, strict=False).total_s,
            api.simulate(graph, moved, costs=costs, strict=False).total_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path, metavar="FOLDER|FILE")
    parser.add_argument("--memory", required=True, help="preset or memory-system file")
    parser.add_argument("--plans", type=Path, default=ROOT / "experiments/plans/bench_arena")
    parser.add_argument("--replay-factors", metavar="TO_FAST,TO_SLOW",
                        help="replayed copies' factors the runs were priced with (module "
                             "docstring; default: today's)")
    args = parser.parse_args()
    if args.replay_factors:
        from autotm_py import machine

        machine.REPLAY_TO_FAST_SLOWDOWN, machine.REPLAY_TO_SLOW_SLOWDOWN = (
            float(x) for x in args.replay_factors.split(","))
    index = plan_index(args.plans)
    runs = [r for f in args.folders for r in runs_under(f)]
    missing = [stem for stem, _ in runs if stem not in index]
    if missing or not runs:
        raise SystemExit(f"error: no plan in {args.plans} for {missing[0] if missing else ''}"
                         if missing else "error: no measured runs under the given paths")
    print(f"{'plan':<100} {'measured':>9} {'recorded':>9} {'error':>7} {args.memory:>10} "
          f"{'error':>7}")
    before, after = [], []
    for stem, measured in runs:
        then, now = predictions(index[stem], args.memory)
        before.append(abs(then - measured) / measured)
        after.append(abs(now - measured) / measured)
        print(f"{stem[:100]:<100} {measured * 1e3:7.1f}ms {then * 1e3:7.1f}ms "
              f"{(then - measured) / measured:+7.1%} {now * 1e3:8.1f}ms "
              f"{(now - measured) / measured:+7.1%}", flush=True)
    print(f"median |predicted - measured| / measured over {len(runs)} runs: recorded link "
          f"{statistics.median(before):.1%} (largest {max(before):.1%}), {args.memory} "
          f"{statistics.median(after):.1%} (largest {max(after):.1%})")


if __name__ == "__main__":
    main()
