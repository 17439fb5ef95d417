"""Predict plans again on the profiles of the GPU that ran them, beside their measured runs.

A plan's header keeps the prediction of the machine it was solved for (the shipped H100
profiles here); `autotm run` prints that one. When the runs were made on another GPU whose
profiles are shipped too (`profiles/h200.json`, measured with `autotm profile ... --in-context
--profiles profiles` on that GPU), this script simulates each plan on that GPU's costs
(`--device-name`, as `autotm simulate --gpu` does; its kernels first, the closest profiles
for any it lacks) and prints the
prediction next to the measured median of its run (`autotm run -o RUN.json`, e.g. from
`experiments/gpu/replay_plans.sh`), and the median error.

Runs on the CPU from committed files:
  python experiments/gpu/repredict_runs.py --device-name "NVIDIA H200" \
      resnet200:32:RUN.json:PLAN.json.gz ...
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def main() -> None:
    from autotm_py import api
    from autotm_py.plan import Plan

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device-name", required=True, help='e.g. "NVIDIA H200"')
    parser.add_argument("runs", nargs="+", metavar="MODEL:BATCH:RUN.json:PLAN")
    args = parser.parse_args()
    errors = []
    graphs: dict[tuple[str, int], tuple[object, object]] = {}  # each model loaded and priced once
    print(f"{'plan':<72} {'H100-priced':>11} {'repriced':>9} {'measured':>9} {'error':>7}")
    for item in args.runs:
        model, batch, run_path, plan_path = item.split(":", 3)
        run = json.loads(Path(run_path).read_text())
        plan = Plan.load(plan_path)
        key = (model, int(batch))
        if key not in graphs:
            graph = api.load_model(model, batch=key[1], training=True)
            graphs[key] = (graph, api.load_costs(graph, device="cuda", gpu=args.device_name))
        graph, costs = graphs[key]
        # not strict: this GPU's cuDNN may pick engines with other workspaces than the plan's
        predicted = api.simulate(graph, plan, costs=costs, strict=False).total_s
        measured = float(run["median_s"])
        error = (predicted - measured) / measured
        errors.append(abs(error))
        print(f"{Path(plan_path).name[:72]:<72} {plan.header.predicted_time_s * 1e3:>9.1f}ms "
              f"{predicted * 1e3:>7.1f}ms {measured * 1e3:>7.1f}ms {error:>+7.1%}")
    print(f"median |predicted - measured| / measured: {statistics.median(errors):.1%} over "
          f"{len(errors)} runs (largest {max(errors):.1%})")


if __name__ == "__main__":
    main()
